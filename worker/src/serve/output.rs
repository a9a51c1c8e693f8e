//! What the guests' kernels print reaches their own processes, never the
//! host's log.
//!
//! The driver writes a context's `printf` text straight to file
//! descriptor 1, and its device-side assert messages to 2, when that
//! context synchronizes (`cuCtxSynchronize`, `cuStreamSynchronize`,
//! `cuEventSynchronize` even of a finished event), unloads a module or is
//! destroyed; another context's synchronize never writes it (measured on
//! an H200: `results/2026-11-26-h200-mixed-precision.md`). A worker
//! process serves every process of its VM with a context each, from one
//! thread, so the text that appears on its descriptors while it serves a
//! channel belongs to that channel's process.
//!
//! [`Capture`] points descriptors 1 and 2 of the worker process at pipes
//! (the worker's own log goes to a copy of the old standard error, see
//! [`log_writer`]). A reader thread empties the pipes as they fill, so
//! that a driver writing a large FIFO never blocks the serving thread;
//! [`Output::collect`] takes what arrived, after a channel's pass or
//! before its reply, for that channel's process. The process takes it with
//! `TakeOutput`, asked for by [`protocol::REPLY_OUTPUT`] on its replies,
//! and writes it to its own standard output and error. A process holds at
//! most [`protocol::MAX_HELD_OUTPUT`] bytes; more is dropped and counted.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
#[cfg(test)]
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::sessions::SessionId;

/// Bytes the reader thread keeps for the serving thread at most (beyond
/// them, text is dropped and counted).
const STASH: usize = 16 << 20;

/// Where the worker's own log goes once descriptor 2 is captured.
static LOG: OnceLock<File> = OnceLock::new();

/// The worker process's capture, once [`capture_output`] made it.
static CAPTURE: OnceLock<Capture> = OnceLock::new();

/// Captures descriptors 1 and 2 of this process for the guests (see
/// `Capture::start`): for a worker process of the daemon, which alone
/// owns its descriptors. Workers inside tests and benches share theirs and
/// do not call it: their guests' kernel output goes where it would.
pub fn capture_output() -> std::io::Result<()> {
    if CAPTURE.get().is_none() {
        let _ = CAPTURE.set(Capture::start()?);
    }
    Ok(())
}

/// The worker's log writer (for `tracing_subscriber`): standard error, or
/// the copy of it kept before `Capture::start` took descriptor 2.
pub fn log_writer() -> LogWriter {
    LogWriter
}

/// See [`log_writer`].
#[derive(Debug, Clone, Copy)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match LOG.get() {
            Some(mut f) => f.write(buf),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match LOG.get() {
            Some(mut f) => f.flush(),
            None => std::io::stderr().flush(),
        }
    }
}

/// Text read from the pipes and not yet given to a process: per stream
/// (index 0: standard output, 1: standard error).
#[derive(Debug, Default)]
struct Stash {
    text: [Vec<u8>; 2],
    dropped: u64,
}

/// How much a read from a pipe takes at a time.
const READ_CHUNK: usize = 64 << 10;

impl Stash {
    /// Reads what each pipe holds now, without waiting, through `buf`.
    fn fill(&mut self, pipes: &[File; 2], buf: &mut [u8]) {
        for (i, mut p) in pipes.iter().enumerate() {
            loop {
                match p.read(buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let room = STASH.saturating_sub(self.text[i].len());
                        let keep = n.min(room);
                        self.text[i].extend_from_slice(&buf[..keep]);
                        self.dropped += (n - keep) as u64;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break, // WouldBlock: empty for now.
                }
            }
        }
    }
}

/// The stash and the buffer it is filled through, by whichever thread
/// holds the lock (made once: zeroing 64 KiB at each synchronize cost
/// more than the rest of the look at the pipes).
#[derive(Debug)]
struct Inbox {
    stash: Stash,
    buf: Vec<u8>,
}

/// Descriptors 1 and 2 of the worker process, captured.
#[derive(Debug)]
struct Capture {
    pipes: Arc<[File; 2]>,
    inbox: Arc<Mutex<Inbox>>,
}

impl Capture {
    /// Points descriptors 1 and 2 at pipes read here, and the worker's log
    /// at a copy of the old descriptor 2. Once per process, before the
    /// driver is loaded and before the worker is confined (the reader is a
    /// thread of its own).
    fn start() -> std::io::Result<Capture> {
        let log = std::io::stderr().as_fd().try_clone_to_owned()?;
        let _ = LOG.set(File::from(log));
        let mut reads = Vec::new();
        for target in [1, 2] {
            let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
            fcntl(&r, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
            // A driver's FIFO is flushed in one go: a larger pipe takes it
            // without a wait for the reader (the limit is the system's).
            let _ = fcntl(&w, FcntlArg::F_SETPIPE_SZ(1 << 20));
            if target == 1 {
                nix::unistd::dup2_stdout(&w)?;
            } else {
                nix::unistd::dup2_stderr(&w)?;
            }
            reads.push(File::from(r));
        }
        let err = reads.pop().expect("two pipes");
        let out = reads.pop().expect("two pipes");
        Capture::reading([out, err])
    }

    /// The capture of the read ends of standard output's and standard
    /// error's pipes, with its reader thread started.
    fn reading(pipes: [File; 2]) -> std::io::Result<Capture> {
        let pipes = Arc::new(pipes);
        let inbox = Arc::new(Mutex::new(Inbox {
            stash: Stash::default(),
            buf: vec![0; READ_CHUNK],
        }));
        let (p, s) = (pipes.clone(), inbox.clone());
        std::thread::Builder::new()
            .name("kernel-output".into())
            .spawn(move || read_forever(&p, &s))?;
        Ok(Capture { pipes, inbox })
    }

    /// Everything written so far: what the reader took and what the pipes
    /// still hold. Text written before the call returned is all there.
    /// Asked at every synchronize: one look (a poll) at both pipes, read
    /// only if one holds text.
    fn take(&self) -> Stash {
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        if any_readable(&self.pipes) {
            inbox.fill(&self.pipes);
        }
        std::mem::take(&mut inbox.stash)
    }
}

impl Inbox {
    /// Moves what the pipes hold now into the stash.
    fn fill(&mut self, pipes: &[File; 2]) {
        let Inbox { stash, buf } = self;
        stash.fill(pipes, buf);
    }
}

/// Both pipes, to be polled for text.
fn poll_fds(pipes: &[File; 2]) -> [PollFd<'_>; 2] {
    [
        PollFd::new(pipes[0].as_fd(), PollFlags::POLLIN),
        PollFd::new(pipes[1].as_fd(), PollFlags::POLLIN),
    ]
}

/// Whether either pipe holds text (or reports an error or hang-up, which
/// a read then meets), without waiting.
fn any_readable(pipes: &[File; 2]) -> bool {
    let mut fds = poll_fds(pipes);
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) => false,
        Ok(_) => true,
        // Interrupted or failed: read, as before this look existed.
        Err(_) => true,
    }
}

/// The reader thread: waits for text and moves it to the stash, under the
/// stash's lock (so that the serving thread, reading under the same lock,
/// never misses bytes in flight).
fn read_forever(pipes: &[File; 2], inbox: &Mutex<Inbox>) {
    loop {
        let mut fds = poll_fds(pipes);
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
        let hung_up = fds.iter().all(|f| {
            f.revents()
                .is_some_and(|r| r.contains(PollFlags::POLLHUP) && !r.contains(PollFlags::POLLIN))
        });
        if hung_up {
            return;
        }
        inbox.lock().unwrap_or_else(|e| e.into_inner()).fill(pipes);
    }
}

/// One process's text waiting for it: (stream: 1 or 2, bytes), oldest
/// first.
#[derive(Debug, Default)]
struct Held {
    chunks: VecDeque<(u8, Vec<u8>)>,
    bytes: usize,
}

/// The kernel output of the worker's processes.
#[derive(Debug, Default)]
pub(super) struct Output {
    capture: Option<&'static Capture>,
    held: HashMap<SessionId, Held>,
    /// Bytes dropped: over a process's bound, with no process to give
    /// them to, or past the reader's stash.
    pub dropped: u64,
    /// When each process last had a call served (see [`Output::others_active`]).
    active: HashMap<SessionId, std::time::Instant>,
}

impl Output {
    /// The process's output as [`capture_output`] captured it, if it did.
    pub fn new() -> Output {
        Output::with(CAPTURE.get())
    }

    /// Output read from `capture` (`None`: nothing is taken).
    fn with(capture: Option<&'static Capture>) -> Output {
        Output {
            capture,
            ..Output::default()
        }
    }

    /// Gives what the worker's descriptors received since the last call
    /// to process `owner`, the one whose calls ran meanwhile (`None`:
    /// nobody's, e.g. a context destroyed for a process that has gone; the
    /// text is dropped). The driver writes a context's printf text
    /// (standard output) when that context synchronizes, but a fault's
    /// message (standard error) from a thread of its own, at no particular
    /// call (measured on an H200: an assert's message came in three writes,
    /// two of them while a neighbour process was served, before any call
    /// had seen the fault). So standard error's text, and once a fault
    /// poisoned the worker (`faulted`) any text, goes to `owner` only if
    /// no other process made a call in the last second; otherwise it is
    /// dropped, never given to a neighbour.
    pub fn collect(&mut self, owner: Option<SessionId>, faulted: bool) {
        let Some(c) = self.capture.as_ref() else {
            return;
        };
        let st = c.take();
        self.dropped += st.dropped;
        if st.text.iter().all(Vec::is_empty) {
            return;
        }
        let alone = if self.others_active(owner) {
            None
        } else {
            owner
        };
        let owners = [if faulted { alone } else { owner }, alone];
        // Stream 1 is stdout, 2 stderr.
        for ((text, owner), stream) in st.text.into_iter().zip(owners).zip([1, 2]) {
            if !text.is_empty() {
                self.give(owner, stream, text);
            }
        }
    }

    /// Adds `text` of `stream` to what `owner` holds, within its bound.
    pub fn give(&mut self, owner: Option<SessionId>, stream: u8, mut text: Vec<u8>) {
        let Some(id) = owner else {
            self.dropped += text.len() as u64;
            return;
        };
        let h = self.held.entry(id).or_default();
        let room = protocol::MAX_HELD_OUTPUT.saturating_sub(h.bytes);
        if text.len() > room {
            self.dropped += (text.len() - room) as u64;
            text.truncate(room);
        }
        if text.is_empty() {
            return;
        }
        h.bytes += text.len();
        match h.chunks.back_mut() {
            Some((s, t)) if *s == stream => t.extend_from_slice(&text),
            _ => h.chunks.push_back((stream, text)),
        }
    }

    /// Process `id` had a call served just now.
    pub fn touch(&mut self, id: SessionId) {
        self.active.insert(id, std::time::Instant::now());
    }

    /// Whether a process other than `id` had a call served within the
    /// last second (a process that has gone makes none).
    pub fn others_active(&mut self, id: Option<SessionId>) -> bool {
        let now = std::time::Instant::now();
        self.active
            .retain(|_, t| now.duration_since(*t) < std::time::Duration::from_secs(1));
        self.active.keys().any(|k| Some(*k) != id)
    }

    /// Whether any process has text waiting.
    pub fn any_held(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether `id` has text waiting.
    pub fn has(&self, id: SessionId) -> bool {
        self.held.get(&id).is_some_and(|h| h.bytes > 0)
    }

    /// Up to `max` bytes of `id`'s oldest text, with its stream.
    pub fn take(&mut self, id: SessionId, max: usize) -> Option<(u8, Vec<u8>)> {
        let h = self.held.get_mut(&id)?;
        let (stream, text) = h.chunks.front_mut()?;
        let stream = *stream;
        let part = if text.len() <= max {
            h.chunks.pop_front().map(|(_, t)| t).unwrap_or_default()
        } else {
            let rest = text.split_off(max);
            std::mem::replace(text, rest)
        };
        h.bytes -= part.len();
        if h.bytes == 0 {
            self.held.remove(&id);
        }
        Some((stream, part))
    }

    /// The process has gone: its text with it.
    pub fn forget(&mut self, id: SessionId) {
        self.active.remove(&id);
        if let Some(h) = self.held.remove(&id) {
            self.dropped += h.bytes as u64;
        }
    }
}

/// A pipe pair for tests: what `Capture` reads, written by the test.
#[cfg(test)]
fn test_capture() -> (&'static Capture, [OwnedFd; 2]) {
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    for _ in 0..2 {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        fcntl(&r, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        reads.push(File::from(r));
        writes.push(w);
    }
    let err = reads.pop().unwrap();
    let out = reads.pop().unwrap();
    let capture = Capture::reading([out, err]).unwrap();
    let w2 = writes.pop().unwrap();
    let w1 = writes.pop().unwrap();
    (Box::leak(Box::new(capture)), [w1, w2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(fd: &OwnedFd, text: &[u8]) {
        File::from(fd.try_clone().unwrap()).write_all(text).unwrap();
    }

    #[test]
    fn text_goes_to_the_process_whose_pass_it_appeared_in() {
        let (cap, [out, err]) = test_capture();
        let mut o = Output::with(Some(cap));
        write(&out, b"kernel 1 thread 0\n");
        write(&err, b"Assertion `p` failed.\n");
        o.collect(Some(7), false);
        write(&out, b"kernel 2 thread 0\n");
        o.collect(Some(8), false);
        assert!(o.has(7) && o.has(8));
        assert_eq!(
            o.take(7, 1 << 20),
            Some((1, b"kernel 1 thread 0\n".to_vec()))
        );
        assert_eq!(
            o.take(7, 1 << 20),
            Some((2, b"Assertion `p` failed.\n".to_vec()))
        );
        assert_eq!(o.take(7, 1 << 20), None);
        assert!(!o.has(7));
        assert_eq!(o.take(8, 7), Some((1, b"kernel ".to_vec())));
        assert_eq!(o.take(8, 1 << 20), Some((1, b"2 thread 0\n".to_vec())));
        // Text with no process to take it is dropped, not kept for the
        // next one.
        write(&out, b"orphan\n");
        o.collect(None, false);
        o.collect(Some(9), false);
        assert!(!o.has(9));
        assert_eq!(o.dropped, 7);
    }

    #[test]
    fn a_large_flush_never_blocks_the_writer_and_is_bounded() {
        let (cap, [out, _err]) = test_capture();
        let mut o = Output::with(Some(cap));
        // More than a pipe holds: the reader thread drains as it comes.
        let big = vec![b'x'; 4 << 20];
        write(&out, &big);
        o.collect(Some(1), false);
        let mut got = 0;
        while let Some((s, t)) = o.take(1, 1 << 20) {
            assert_eq!(s, 1);
            got += t.len();
        }
        assert_eq!(got, 4 << 20);
        // A process holds at most MAX_HELD_OUTPUT; the rest is counted.
        o.give(Some(2), 1, vec![b'y'; protocol::MAX_HELD_OUTPUT + 5]);
        assert_eq!(o.dropped, 5);
        o.forget(2);
        assert!(!o.has(2));
        assert_eq!(o.dropped, 5 + protocol::MAX_HELD_OUTPUT as u64);
    }

    #[test]
    fn a_process_is_active_for_a_second_after_its_last_call() {
        let mut o = Output::with(None);
        assert!(!o.others_active(Some(1)));
        o.touch(1);
        assert!(!o.others_active(Some(1)));
        assert!(o.others_active(Some(2)));
        assert!(o.others_active(None));
        o.forget(1);
        assert!(!o.others_active(Some(2)));
    }

    #[test]
    fn without_a_capture_nothing_is_taken_from_the_process() {
        let mut o = Output::with(None);
        o.collect(Some(1), false);
        assert!(!o.has(1));
    }
}
