//! A vGPU's connection at the service: one worker's socket, or the group
//! of its members' (`group.rs`), seen by the service alike: messages to
//! send it, and what it says, as one worker would.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use wire::grant::{decode, encode};

use super::group::{Group, Up};

/// What a vGPU said, or that it is gone.
pub(super) enum Heard {
    Said(Up),
    Gone,
}

/// A vGPU's connection.
pub(super) enum Conn {
    /// Its one worker.
    Worker(UnixStream),
    /// Its workers, one per guest process.
    Group(Box<Group>),
}

impl Conn {
    /// Sends the vGPU a message (`GRANT`, `EXTEND`, `CONTENDED`); false if
    /// it could not take it.
    pub fn send(&mut self, vgpu: u32, kind: u32, a: u64, b: u64) -> bool {
        match self {
            Conn::Worker(s) => s.write_all(&encode(kind, vgpu, a, b)).is_ok(),
            Conn::Group(g) => g.on_service(kind, a, b, Instant::now()),
        }
    }

    /// Its sockets (to poll), numbered as [`Conn::read`] takes them.
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        match self {
            Conn::Worker(s) => vec![s.as_fd()],
            Conn::Group(g) => g.fds().collect(),
        }
    }

    /// Reads one message from its socket `i` (readable).
    pub fn read(&mut self, i: usize) -> Vec<Heard> {
        match self {
            Conn::Worker(s) => {
                let mut m = [0u8; 24];
                match s.read_exact(&mut m) {
                    Ok(()) => {
                        let (kind, _, a, b) = decode(&m);
                        vec![Heard::Said((kind, a, b))]
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Vec::new(),
                    Err(_) => vec![Heard::Gone],
                }
            }
            Conn::Group(g) => {
                let up = g.read(i, Instant::now());
                Self::group_heard(g, up)
            }
        }
    }

    /// What time alone makes it say (a group's members gone or overdue).
    pub fn tick(&mut self) -> Vec<Heard> {
        match self {
            Conn::Worker(_) => Vec::new(),
            Conn::Group(g) => {
                let up = g.tick(Instant::now());
                Self::group_heard(g, up)
            }
        }
    }

    fn group_heard(g: &Group, up: Vec<Up>) -> Vec<Heard> {
        let mut heard: Vec<Heard> = up.into_iter().map(Heard::Said).collect();
        if g.is_empty() {
            heard.push(Heard::Gone);
        }
        heard
    }
}
