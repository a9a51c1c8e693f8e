//! The native peer: a guest process on the host itself (or a test, or a
//! bench) connecting to a server as QEMU would, and following its vGPU to
//! another server (`Client::reach`, `Client::follow_to`).

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{recv_msg, HOST_PEER, PROTOCOL_VERSION};
use crate::channel::Region;
use crate::error::{Error, Result};
use crate::wait::EventFdBell;

/// A native (non-VM) peer: what a guest process on the host itself uses, and
/// what tests and benches use in place of QEMU.
#[derive(Debug)]
pub struct Client {
    /// Our peer id.
    pub id: u16,
    /// The mapped region.
    pub region: Region,
    /// Our doorbells (the host rings these; we wait on them).
    pub own_bells: Vec<Arc<EventFdBell>>,
    /// The host's doorbells (we ring these).
    pub host_bells: Vec<Arc<EventFdBell>>,
    _stream: Arc<UnixStream>,
    /// The process that connected (a forked child shares the socket).
    pid: u32,
}

impl Client {
    /// Connects, maps the region and collects the doorbells.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Client> {
        let h = Handshake::run(path, timeout)?;
        Ok(Client {
            id: h.id,
            region: h.region,
            own_bells: h.own,
            host_bells: h.host,
            _stream: h.stream,
            pid: std::process::id(),
        })
    }

    /// Follows the vGPU to the server at `path`: [`Client::reach`], then
    /// [`Client::follow_to`]. Returns the new peer id.
    ///
    /// # Safety
    /// As [`Client::follow_to`].
    pub unsafe fn follow(
        &mut self,
        path: &Path,
        timeout: Duration,
        moved: impl FnOnce(u16) -> Result<()>,
    ) -> Result<u16> {
        let there = self.reach(path, timeout)?;
        // SAFETY: per this function's contract.
        unsafe { self.follow_to(there, moved) }
    }

    /// Connects to the server at `path`, another host's for the same VM,
    /// and checks that this connection can follow there (the region's
    /// layout, the doorbells), changing nothing here: a process with
    /// several connections reaches with each before any follows, so that
    /// it moves whole or not at all. Dropped, the connection leaves.
    pub fn reach(&self, path: &Path, timeout: Duration) -> Result<Arrival> {
        let h = Handshake::run(path, timeout)?;
        if h.own.len() != self.own_bells.len() || h.host.len() != self.host_bells.len() {
            return Err(Error::Protocol(format!(
                "{} doorbells there, {} here",
                h.own.len(),
                self.own_bells.len()
            )));
        }
        self.region.same_layout(&h.region)?;
        Ok(Arrival(Some(h)))
    }

    /// Follows the vGPU to the server `there` reached, whose region holds
    /// what this one did: every mapping of this region in the process
    /// becomes that region's memory at the same address and the doorbells
    /// that host's (on the same descriptors); then `moved` runs with the
    /// new peer id (the caller records it as its channels' owner), and this
    /// connection leaves this server. Returns the new peer id.
    ///
    /// # Safety
    /// No thread of the process uses the region or waits on these doorbells
    /// meanwhile (the caller holds every call), and the other region holds
    /// what the guest should read from now on.
    pub unsafe fn follow_to(
        &mut self,
        there: Arrival,
        moved: impl FnOnce(u16) -> Result<()>,
    ) -> Result<u16> {
        let mut there = there;
        let h = there.0.take().ok_or(Error::Disconnected)?;
        // SAFETY: per this function's contract.
        unsafe { self.region.follow(&h.region)? };
        let pairs = self.own_bells.iter().zip(&h.own);
        for (old, new) in pairs.chain(self.host_bells.iter().zip(&h.host)) {
            // SAFETY: the bells are this connection's own, and no thread
            // waits on them (this function's contract).
            unsafe { crate::shm::dup_onto(new.fd(), old.fd())? };
        }
        // Owners first: leaving marks the channels this peer owns abandoned.
        let moved = moved(h.id);
        let _ = self._stream.shutdown(std::net::Shutdown::Both);
        self._stream = h.stream;
        self.id = h.id;
        moved.map(|()| h.id)
    }
}

/// A connection to another server that a [`Client`] can follow to (see
/// [`Client::reach`]); dropped unused, it leaves that server.
#[derive(Debug)]
pub struct Arrival(Option<Handshake>);

impl Drop for Arrival {
    fn drop(&mut self) {
        // As a client's: the drain thread holds a clone of the stream.
        if let Some(h) = &self.0 {
            let _ = h.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// What a server tells a new peer, read and mapped.
#[derive(Debug)]
struct Handshake {
    id: u16,
    region: Region,
    own: Vec<Arc<EventFdBell>>,
    host: Vec<Arc<EventFdBell>>,
    stream: Arc<UnixStream>,
}

impl Handshake {
    /// Connects to the server at `path` and reads its greeting; a thread
    /// drains its later notices.
    fn run(path: &Path, timeout: Duration) -> Result<Handshake> {
        let stream =
            UnixStream::connect(path).map_err(|e| Error::io("connecting to ivshmem socket", e))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| Error::io("socket timeout", e))?;
        let deadline = Instant::now() + timeout;
        let next = || -> Result<(i64, Option<OwnedFd>)> {
            if Instant::now() > deadline {
                return Err(Error::Timeout);
            }
            recv_msg(&stream)?.ok_or(Error::Disconnected)
        };
        let (version, _) = next()?;
        if version != PROTOCOL_VERSION {
            return Err(Error::Protocol(format!("server speaks version {version}")));
        }
        let (id, _) = next()?;
        let id = u16::try_from(id).map_err(|_| Error::Protocol(format!("bad peer id {id}")))?;
        let (minus_one, shm) = next()?;
        let shm = match (minus_one, shm) {
            (-1, Some(fd)) => fd,
            _ => return Err(Error::Protocol("expected the shared memory fd".into())),
        };
        let region = Region::open(shm)?;
        let vectors = region.layout().params.vectors as usize;
        let (mut own, mut host) = (Vec::new(), Vec::new());
        while own.len() < vectors || host.len() < vectors {
            match next()? {
                (p, Some(fd)) if p == i64::from(id) => own.push(Arc::new(EventFdBell::from_fd(fd))),
                (p, Some(fd)) if p == i64::from(HOST_PEER) => {
                    host.push(Arc::new(EventFdBell::from_fd(fd)))
                }
                _ => {} // other peers: we never ring them
            }
        }
        let stream = Arc::new(stream);
        // Keep draining later notices so the server never blocks on us.
        let s2 = stream.clone();
        let _ = s2.set_read_timeout(None);
        std::thread::Builder::new()
            .name("ivshmem-drain".into())
            .spawn(move || while let Ok(Some(_)) = recv_msg(&*s2) {})
            .map_err(|e| Error::io("spawning drain thread", e))?;
        Ok(Handshake {
            id,
            region,
            own,
            host,
            stream,
        })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // The drain thread holds a clone of the stream; shutting it down ends
        // that thread and tells the server we are gone. Not from a forked
        // child: the socket is its parent's too, and the parent stays.
        if std::process::id() == self.pid {
            let _ = self._stream.shutdown(std::net::Shutdown::Both);
        }
    }
}
