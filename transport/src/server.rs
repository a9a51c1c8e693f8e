//! The ivshmem-server protocol, as QEMU's `ivshmem-doorbell` device speaks it
//! (QEMU `docs/specs/ivshmem-spec.rst`), served by the host process itself.
//!
//! Every message is one little-endian `i64`, optionally with one fd passed
//! with SCM_RIGHTS. To a new peer the server sends: the protocol version (0),
//! the peer's id, then `-1` with the shared-memory fd; then for every peer
//! already present (the host first) its id once per vector, each with
//! that vector's eventfd; then the new peer's own id once per vector with
//! its own eventfds. Existing peers learn of the new one the same way, and
//! of a departed one by its id with no fd.
//!
//! One server (one unix socket) serves one VM's region: every peer on it is
//! the same tenant, so handing peers each other's eventfds crosses nobody.
//!
//! Peer ids. The host is [`HOST_PEER`] (1). A new peer gets 0 whenever 0 is
//! free: a QEMU whose device is `master=on` (the one whose region QEMU
//! migrates) refuses to start with any other id. Other peers get ids in
//! rotation from 2 on, so that an id is not soon given again (QEMU keeps a
//! departed peer's entry). Before a departure is announced, the server
//! marks the departed peer's channels abandoned, so that a peer given its
//! id next never finds its own claims taken for the departed one's.

use std::collections::{BTreeMap, VecDeque};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::channel::Region;
use crate::error::{Error, Result};
use crate::ratelimit::LogLimiter;
use crate::wait::{Bell, EventFdBell};

/// The protocol version QEMU expects.
pub const PROTOCOL_VERSION: i64 = 0;
/// The host's own peer id: not 0, which a VM's QEMU takes (see the
/// module's doc). Guests ring the host here (`kmod-shim`'s
/// `FVGPU_HOST_PEER`, the guest library's `device.rs`).
pub const HOST_PEER: u16 = 1;
/// The id a new peer gets while it is free: a `master=on` QEMU's.
pub const FIRST_PEER: u16 = 0;

/// Sends one protocol message (waiting for room if the socket blocks).
pub fn send_msg(sock: &impl AsRawFd, value: i64, fd: Option<RawFd>) -> Result<()> {
    match send_with(sock, value, fd, MsgFlags::MSG_NOSIGNAL)? {
        true => Ok(()),
        false => Err(Error::io(
            "sendmsg on ivshmem socket",
            std::io::Error::from(std::io::ErrorKind::WouldBlock),
        )),
    }
}

/// Sends one protocol message without waiting: `Ok(false)` if the socket's
/// buffer is full (nothing was sent).
pub fn try_send_msg(sock: &impl AsRawFd, value: i64, fd: Option<RawFd>) -> Result<bool> {
    send_with(
        sock,
        value,
        fd,
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
    )
}

fn send_with(sock: &impl AsRawFd, value: i64, fd: Option<RawFd>, flags: MsgFlags) -> Result<bool> {
    let bytes = value.to_le_bytes();
    let iov = [IoSlice::new(&bytes)];
    let fds;
    let cmsgs: &[ControlMessage<'_>] = match fd {
        Some(f) => {
            fds = [f];
            &[ControlMessage::ScmRights(&fds)]
        }
        None => &[],
    };
    let n = match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, flags, None) {
        Ok(n) => n,
        Err(nix::errno::Errno::EAGAIN) => return Ok(false),
        Err(e) => return Err(Error::io("sendmsg on ivshmem socket", e)),
    };
    if n != bytes.len() {
        // Eight bytes go in one piece on a unix stream socket, or not at all.
        return Err(Error::Protocol(format!("short send of {n} bytes")));
    }
    Ok(true)
}

/// Receives one protocol message; `Ok(None)` when the peer closed.
pub fn recv_msg(sock: &impl AsRawFd) -> Result<Option<(i64, Option<OwnedFd>)>> {
    let mut buf = [0u8; 8];
    let mut got = 0;
    let mut fd = None;
    while got < 8 {
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let mut space = nix::cmsg_space!(RawFd);
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| Error::io("recvmsg on ivshmem socket", e))?;
        for c in msg.cmsgs().map_err(|e| Error::io("control message", e))? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for f in fds {
                    // SAFETY: the kernel just installed `f` in our table for us;
                    // nothing else owns it.
                    let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(f) };
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
        }
        if msg.bytes == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(Error::Protocol("truncated message".into()))
            };
        }
        got += msg.bytes;
    }
    Ok(Some((i64::from_le_bytes(buf), fd)))
}

/// What happened to the peers of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerEvent {
    /// A peer (a QEMU process or a native guest) connected.
    Connected(u16),
    /// A peer went away; its channels are already marked abandoned, for
    /// the host to reclaim.
    Gone(u16),
}

/// Peers a server takes at once; connections beyond are closed at once.
/// (A VM is one peer, QEMU; native guest processes are one each.)
pub const MAX_PEERS: usize = 64;

/// New peers a VM's socket takes per second, after a burst of
/// [`ACCEPT_BURST`]; connections past that wait in the listen queue. Each
/// new peer is sent descriptors (the region, every peer's doorbells), and
/// descriptors in flight to sockets that never read are the kernel's to
/// collect, for every process on the host: a VM that connects and drops in
/// a loop must not put thousands a second in flight.
pub const ACCEPT_PER_SECOND: f64 = 50.0;
/// See [`ACCEPT_PER_SECOND`].
pub const ACCEPT_BURST: f64 = 64.0;

/// A file descriptor a queued message carries.
enum OutFd {
    Shm,
    Bell(Arc<EventFdBell>),
}

struct Peer {
    stream: UnixStream,
    bells: Vec<Arc<EventFdBell>>,
    /// Messages not sent yet: the socket is never waited on, so a peer that
    /// does not read holds up nobody; one that falls this far behind
    /// ([`ServerLoop::outbox_limit`]) is dropped.
    outbox: VecDeque<(i64, Option<OutFd>)>,
}

/// The bells of connected peers, shared between the server thread and the host worker.
pub type PeerBells = Arc<Mutex<BTreeMap<u16, Vec<Arc<EventFdBell>>>>>;

/// The process id of each connected peer, as the kernel gave it at its
/// connection (`SO_PEERCRED`): QEMU's for a VM, the guest process's own for
/// a native peer. The host's CPU lifts use it (what a peer says of itself
/// is never asked).
pub type PeerPids = Arc<Mutex<BTreeMap<u16, u32>>>;

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    /// The host's own doorbells (peer 0): guests ring these to wake the host.
    pub host_bells: Vec<Arc<EventFdBell>>,
    /// Doorbells of the connected peers, by peer id and vector.
    pub peers: PeerBells,
    /// Process ids of the connected peers, by peer id.
    pub peer_pids: PeerPids,
    /// Peer arrivals and departures ([`serve`]; with [`serve_to`] they go
    /// to its sink and this one stays empty).
    pub events: Receiver<PeerEvent>,
    log_suppressed: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<AtomicBool>,
    /// Rung with the stop flag set: the server's thread sleeps on it.
    wake: Arc<EventFdBell>,
    thread: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
}

impl ServerHandle {
    /// Rings vector `vector` of peer `peer`, if it is connected.
    pub fn ring_peer(&self, peer: u16, vector: u32) -> Result<()> {
        let bell = {
            let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            peers
                .get(&peer)
                .and_then(|b| b.get(vector as usize).cloned())
        };
        match bell {
            Some(b) => b.ring(),
            None => Ok(()),
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Log lines about this server's peers suppressed so far (see
    /// [`crate::ratelimit`]).
    pub fn log_suppressed(&self) -> u64 {
        self.log_suppressed.load(Ordering::Relaxed)
    }

    /// The count behind [`ServerHandle::log_suppressed`], to read elsewhere.
    pub fn log_counter(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.log_suppressed.clone()
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.wake.ring();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Starts serving `shm` on a unix socket at `path` (replacing a stale socket
/// file); peer arrivals and departures come on [`ServerHandle::events`].
/// `shm` is `region`'s memory.
pub fn serve(path: &Path, shm: OwnedFd, region: &Region) -> Result<ServerHandle> {
    let (tx, rx) = channel();
    let mut h = serve_to(path, shm, region, MAX_PEERS, move |ev| {
        let _ = tx.send(ev);
    })?;
    h.events = rx;
    Ok(h)
}

/// Binds a listening socket at `path` that appears there only once it
/// listens (and has file mode `mode`, if given): bound under a short
/// temporary name in the same folder, then renamed (atomically) over
/// `path`. Bound at `path` itself, the file would exist a moment before
/// `listen`, and a client that found it then would be refused (seen once in
/// CI, on a loaded machine).
pub fn bind_listening(path: &Path, mode: Option<u32>) -> Result<UnixListener> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_file_name(format!(".{:x}-{n:x}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(|e| Error::io("binding a socket", e))?;
    let placed = match mode {
        Some(m) => {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(m))
                .map_err(|e| Error::io("socket permissions", e))
        }
        None => Ok(()),
    }
    .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io("placing a socket", e)));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// [`serve`], handing peer arrivals and departures to `sink` (called on the
/// server's thread: it must not block), with at most `max_peers` peers.
pub fn serve_to(
    path: &Path,
    shm: OwnedFd,
    region: &Region,
    max_peers: usize,
    sink: impl FnMut(PeerEvent) + Send + 'static,
) -> Result<ServerHandle> {
    let vectors = region.layout().params.vectors;
    let listener = bind_listening(path, None)?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("nonblocking listener", e))?;
    let host_bells: Vec<Arc<EventFdBell>> = (0..vectors)
        .map(|_| EventFdBell::new().map(Arc::new))
        .collect::<Result<_>>()?;
    let peers: PeerBells = Arc::default();
    let peer_pids: PeerPids = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let wake = Arc::new(EventFdBell::new()?);
    let log = LogLimiter::default();
    let log_suppressed = log.counter();
    let state = ServerLoop {
        listener,
        shm,
        region: region.clone(),
        vectors,
        max_peers,
        host_bells: host_bells.clone(),
        peers: BTreeMap::new(),
        shared: peers.clone(),
        pids: peer_pids.clone(),
        next_id: HOST_PEER + 1,
        sink: Box::new(sink),
        stop: stop.clone(),
        wake: wake.clone(),
        log,
        tokens: ACCEPT_BURST,
        refilled: std::time::Instant::now(),
    };
    let thread = std::thread::Builder::new()
        .name("ivshmem-server".into())
        .spawn(move || state.run())
        .map_err(|e| Error::io("spawning server thread", e))?;
    Ok(ServerHandle {
        host_bells,
        peers,
        peer_pids,
        events: channel().1,
        log_suppressed,
        stop,
        wake,
        thread: Some(thread),
        path: path.to_owned(),
    })
}

struct ServerLoop {
    listener: UnixListener,
    shm: OwnedFd,
    /// `shm` mapped: a departed peer's channels are marked here.
    region: Region,
    vectors: u32,
    max_peers: usize,
    host_bells: Vec<Arc<EventFdBell>>,
    peers: BTreeMap<u16, Peer>,
    shared: PeerBells,
    pids: PeerPids,
    next_id: u16,
    sink: Box<dyn FnMut(PeerEvent) + Send>,
    stop: Arc<AtomicBool>,
    wake: Arc<EventFdBell>,
    /// Everything here is triggered by the VM's peers: rate-limited.
    log: LogLimiter,
    /// New peers it may take now (see [`ACCEPT_PER_SECOND`]).
    tokens: f64,
    refilled: std::time::Instant,
}

impl ServerLoop {
    fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            let ids: Vec<u16> = self.peers.keys().copied().collect();
            let mut gone = Vec::new();
            let mut writable = Vec::new();
            let mut accept = false;
            let now = std::time::Instant::now();
            self.tokens = (self.tokens
                + now.duration_since(self.refilled).as_secs_f64() * ACCEPT_PER_SECOND)
                .min(ACCEPT_BURST);
            self.refilled = now;
            // Out of tokens: the listener is left out of the poll, for the
            // time one token takes.
            let listening = self.tokens >= 1.0;
            // Listening, it sleeps until a peer or the stop comes (an idle
            // VM's server wakes for nothing).
            let wait = if listening {
                PollTimeout::NONE
            } else {
                // 20 ms for the 50 a second above (`as` saturates at 255).
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let ms = (1000.0 / ACCEPT_PER_SECOND).ceil() as u8;
                PollTimeout::from(ms)
            };
            {
                let mut fds = vec![PollFd::new(
                    self.listener.as_fd(),
                    if listening {
                        PollFlags::POLLIN
                    } else {
                        PollFlags::empty()
                    },
                )];
                for id in &ids {
                    let p = &self.peers[id];
                    let mut ev = PollFlags::POLLIN;
                    if !p.outbox.is_empty() {
                        ev |= PollFlags::POLLOUT;
                    }
                    fds.push(PollFd::new(p.stream.as_fd(), ev));
                }
                fds.push(PollFd::new(self.wake.fd().as_fd(), PollFlags::POLLIN));
                match poll(&mut fds, wait) {
                    Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!("ivshmem server poll failed: {e}");
                        return;
                    }
                }
                if listening && fds[0].any().unwrap_or(false) {
                    accept = true;
                }
                for (i, id) in ids.iter().enumerate() {
                    let r = fds[i + 1].revents().unwrap_or(PollFlags::empty());
                    // Peers never send anything: readable means closed (or misbehaving).
                    if r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                        gone.push(*id);
                    } else if r.contains(PollFlags::POLLOUT) {
                        writable.push(*id);
                    }
                }
            }
            for id in gone {
                self.remove_peer(id);
            }
            for id in writable {
                self.flush(id);
            }
            if accept {
                self.accept_all();
            }
        }
    }

    /// Takes every connection waiting (each peer's messages are queued, not
    /// waited for).
    fn accept_all(&mut self) {
        while self.tokens >= 1.0 {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    self.tokens -= 1.0;
                    if self.peers.len() >= self.max_peers {
                        crate::rate_limited!(
                            self.log,
                            warn,
                            max = self.max_peers,
                            "ivshmem peer refused: too many peers"
                        );
                        continue;
                    }
                    if let Err(e) = self.add_peer(stream) {
                        crate::rate_limited!(self.log, warn, "ivshmem peer setup failed: {e}");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // Out of fds, say: the connection stays queued; look
                    // again at the next turn rather than spin.
                    crate::rate_limited!(self.log, warn, "ivshmem accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            }
        }
    }

    /// Queued messages a peer may have before it counts as not reading:
    /// four times what a peer is sent on arrival with the most peers there.
    fn outbox_limit(&self) -> usize {
        4 * (3 + self.vectors as usize * (self.max_peers + 2))
    }

    /// The id for a new peer (see the module's doc): [`FIRST_PEER`] while
    /// free, else the next free one in rotation, never [`HOST_PEER`].
    fn free_id(&mut self) -> Option<u16> {
        if !self.peers.contains_key(&FIRST_PEER) {
            return Some(FIRST_PEER);
        }
        let first = HOST_PEER + 1;
        let id = (self.next_id.max(first)..=u16::MAX)
            .chain(first..self.next_id)
            .find(|i| !self.peers.contains_key(i))?;
        self.next_id = id.checked_add(1).unwrap_or(first);
        Some(id)
    }

    fn add_peer(&mut self, stream: UnixStream) -> Result<()> {
        stream
            .set_nonblocking(true)
            .map_err(|e| Error::io("nonblocking peer socket", e))?;
        let Some(id) = self.free_id() else {
            return Err(Error::Protocol("out of peer ids".into()));
        };
        let bells: Vec<Arc<EventFdBell>> = (0..self.vectors)
            .map(|_| EventFdBell::new().map(Arc::new))
            .collect::<Result<_>>()?;
        let mut out: VecDeque<(i64, Option<OutFd>)> = VecDeque::new();
        out.push_back((PROTOCOL_VERSION, None));
        out.push_back((i64::from(id), None));
        out.push_back((-1, Some(OutFd::Shm)));
        // The host first, then the other peers.
        for b in &self.host_bells {
            out.push_back((i64::from(HOST_PEER), Some(OutFd::Bell(b.clone()))));
        }
        let others: Vec<u16> = self.peers.keys().copied().collect();
        for other in &others {
            if let Some(p) = self.peers.get_mut(other) {
                for b in &p.bells {
                    out.push_back((i64::from(*other), Some(OutFd::Bell(b.clone()))));
                }
                for b in &bells {
                    p.outbox
                        .push_back((i64::from(id), Some(OutFd::Bell(b.clone()))));
                }
            }
        }
        for b in &bells {
            out.push_back((i64::from(id), Some(OutFd::Bell(b.clone()))));
        }
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, bells.clone());
        if let Some(pid) =
            nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
                .ok()
                .and_then(|cred| u32::try_from(cred.pid()).ok())
        {
            self.pids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, pid);
        }
        self.peers.insert(
            id,
            Peer {
                stream,
                bells,
                outbox: out,
            },
        );
        crate::rate_limited!(self.log, info, peer = id, "ivshmem peer connected");
        (self.sink)(PeerEvent::Connected(id));
        for p in std::iter::once(id).chain(others) {
            self.flush(p);
        }
        Ok(())
    }

    /// Sends what the socket takes of peer `id`'s queue; drops the peer if
    /// its socket failed or it fell too far behind.
    fn flush(&mut self, id: u16) {
        let limit = self.outbox_limit();
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let mut failed = None;
        let mut left = false;
        while let Some((v, fd)) = p.outbox.front() {
            let raw = match fd {
                None => None,
                Some(OutFd::Shm) => Some(self.shm.as_raw_fd()),
                Some(OutFd::Bell(b)) => Some(b.as_raw_fd()),
            };
            match try_send_msg(&p.stream, *v, raw) {
                Ok(true) => {
                    p.outbox.pop_front();
                }
                Ok(false) => break,
                Err(Error::Io { source, .. })
                    if matches!(
                        source.kind(),
                        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                    ) =>
                {
                    // It went away before reading everything: a departure.
                    left = true;
                    break;
                }
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        if failed.is_none() && p.outbox.len() > limit {
            failed = Some(format!("{} messages unread", p.outbox.len()));
        }
        if let Some(why) = &failed {
            crate::rate_limited!(self.log, warn, peer = id, "ivshmem peer dropped: {why}");
        }
        if left || failed.is_some() {
            self.remove_peer(id);
        }
    }

    fn remove_peer(&mut self, id: u16) {
        if self.peers.remove(&id).is_none() {
            return;
        }
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        self.pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        // Its channels, before anyone learns it left and before the next
        // peer (which may get its id) is taken.
        for ch in 0..self.region.channels() {
            if self.region.owner_peer(ch).ok() == Some(u32::from(id)) {
                let _ = self.region.mark_abandoned(ch);
            }
        }
        let others: Vec<u16> = self.peers.keys().copied().collect();
        for p in self.peers.values_mut() {
            p.outbox.push_back((i64::from(id), None));
        }
        crate::rate_limited!(self.log, info, peer = id, "ivshmem peer disconnected");
        (self.sink)(PeerEvent::Gone(id));
        for p in others {
            self.flush(p);
        }
    }
}

mod client;
pub use client::{Arrival, Client};

#[cfg(all(test, not(miri)))]
mod tests;
