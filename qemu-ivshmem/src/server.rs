//! The ivshmem-server protocol, as QEMU's `ivshmem-doorbell` device speaks it
//! (QEMU `docs/specs/ivshmem-spec.rst`), served by the host process itself.
//!
//! Every message is one little-endian `i64`, optionally with one fd passed
//! with SCM_RIGHTS. To a new peer the server sends: the protocol version (0),
//! the peer's id, then `-1` with the shared-memory fd; then for every peer
//! already present (the host is peer 0) its id once per vector, each with
//! that vector's eventfd; then the new peer's own id once per vector with
//! its own eventfds. Existing peers learn of the new one the same way, and
//! of a departed one by its id with no fd.
//!
//! One server (one unix socket) serves one VM's region: every peer on it is
//! the same tenant, so handing peers each other's eventfds crosses nobody.

use std::collections::BTreeMap;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::channel::Region;
use crate::error::{Error, Result};
use crate::wait::{Bell, EventFdBell};

/// The protocol version QEMU expects.
pub const PROTOCOL_VERSION: i64 = 0;
/// The host's own peer id.
pub const HOST_PEER: u16 = 0;

/// Sends one protocol message.
pub fn send_msg(sock: &impl AsRawFd, value: i64, fd: Option<RawFd>) -> Result<()> {
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
    let n = sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(|e| Error::io("sendmsg on ivshmem socket", e))?;
    if n != bytes.len() {
        return Err(Error::Protocol(format!("short send of {n} bytes")));
    }
    Ok(())
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
    /// A peer went away; the host should reclaim its channels.
    Gone(u16),
}

struct Peer {
    stream: UnixStream,
    bells: Vec<Arc<EventFdBell>>,
}

/// The bells of connected peers, shared between the server thread and the host worker.
pub type PeerBells = Arc<Mutex<BTreeMap<u16, Vec<Arc<EventFdBell>>>>>;

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    /// The host's own doorbells (peer 0): guests ring these to wake the host.
    pub host_bells: Vec<Arc<EventFdBell>>,
    /// Doorbells of the connected peers, by peer id and vector.
    pub peers: PeerBells,
    /// Peer arrivals and departures.
    pub events: Receiver<PeerEvent>,
    stop: Arc<AtomicBool>,
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
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Starts serving `shm` on a unix socket at `path` (replacing a stale socket file).
pub fn serve(path: &Path, shm: OwnedFd, vectors: u32) -> Result<ServerHandle> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(|e| Error::io("binding ivshmem socket", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("nonblocking listener", e))?;
    let host_bells: Vec<Arc<EventFdBell>> = (0..vectors)
        .map(|_| EventFdBell::new().map(Arc::new))
        .collect::<Result<_>>()?;
    let peers: PeerBells = Arc::default();
    let (tx, rx) = channel();
    let stop = Arc::new(AtomicBool::new(false));
    let state = ServerLoop {
        listener,
        shm,
        vectors,
        host_bells: host_bells.clone(),
        peers: BTreeMap::new(),
        shared: peers.clone(),
        next_id: HOST_PEER + 1,
        events: tx,
        stop: stop.clone(),
    };
    let thread = std::thread::Builder::new()
        .name("ivshmem-server".into())
        .spawn(move || state.run())
        .map_err(|e| Error::io("spawning server thread", e))?;
    Ok(ServerHandle {
        host_bells,
        peers,
        events: rx,
        stop,
        thread: Some(thread),
        path: path.to_owned(),
    })
}

struct ServerLoop {
    listener: UnixListener,
    shm: OwnedFd,
    vectors: u32,
    host_bells: Vec<Arc<EventFdBell>>,
    peers: BTreeMap<u16, Peer>,
    shared: PeerBells,
    next_id: u16,
    events: Sender<PeerEvent>,
    stop: Arc<AtomicBool>,
}

impl ServerLoop {
    fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            let ids: Vec<u16> = self.peers.keys().copied().collect();
            let mut gone = Vec::new();
            let mut accept = false;
            {
                let mut fds = vec![PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
                for id in &ids {
                    fds.push(PollFd::new(
                        self.peers[id].stream.as_fd(),
                        PollFlags::POLLIN,
                    ));
                }
                match poll(&mut fds, PollTimeout::from(100u8)) {
                    Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!("ivshmem server poll failed: {e}");
                        return;
                    }
                }
                if fds[0].any().unwrap_or(false) {
                    accept = true;
                }
                for (i, id) in ids.iter().enumerate() {
                    if fds[i + 1].any().unwrap_or(false) {
                        gone.push(*id);
                    }
                }
            }
            for id in gone {
                // Peers never send anything: readable means closed (or misbehaving).
                self.remove_peer(id);
            }
            if accept {
                while let Ok((stream, _)) = self.listener.accept() {
                    if let Err(e) = self.add_peer(stream) {
                        tracing::warn!("ivshmem peer setup failed: {e}");
                    }
                }
            }
        }
    }

    fn add_peer(&mut self, stream: UnixStream) -> Result<()> {
        stream
            .set_nonblocking(false)
            .map_err(|e| Error::io("blocking peer socket", e))?;
        let Some(id) = (self.next_id..=u16::MAX).find(|i| !self.peers.contains_key(i)) else {
            return Err(Error::Protocol("out of peer ids".into()));
        };
        self.next_id = id.wrapping_add(1).max(HOST_PEER + 1);
        let bells: Vec<Arc<EventFdBell>> = (0..self.vectors)
            .map(|_| EventFdBell::new().map(Arc::new))
            .collect::<Result<_>>()?;
        send_msg(&stream, PROTOCOL_VERSION, None)?;
        send_msg(&stream, i64::from(id), None)?;
        send_msg(&stream, -1, Some(self.shm.as_raw_fd()))?;
        // The host first, then the other peers.
        for b in &self.host_bells {
            send_msg(&stream, i64::from(HOST_PEER), Some(b.as_raw_fd()))?;
        }
        for (other, p) in &self.peers {
            for b in &p.bells {
                send_msg(&stream, i64::from(*other), Some(b.as_raw_fd()))?;
            }
            for b in &bells {
                // A failing old peer is noticed (and removed) by the poll loop.
                let _ = send_msg(&p.stream, i64::from(id), Some(b.as_raw_fd()));
            }
        }
        for b in &bells {
            send_msg(&stream, i64::from(id), Some(b.as_raw_fd()))?;
        }
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, bells.clone());
        self.peers.insert(id, Peer { stream, bells });
        tracing::info!(peer = id, "ivshmem peer connected");
        let _ = self.events.send(PeerEvent::Connected(id));
        Ok(())
    }

    fn remove_peer(&mut self, id: u16) {
        self.peers.remove(&id);
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        for p in self.peers.values() {
            let _ = send_msg(&p.stream, i64::from(id), None);
        }
        tracing::info!(peer = id, "ivshmem peer disconnected");
        let _ = self.events.send(PeerEvent::Gone(id));
    }
}

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
        Ok(Client {
            id,
            region,
            own_bells: own,
            host_bells: host,
            _stream: stream,
            pid: std::process::id(),
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

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use crate::layout::LayoutParams;
    use crate::ring::Descriptor;

    #[test]
    fn native_peers_get_region_and_bells_and_departures_are_reported() {
        let dir = std::env::temp_dir().join(format!("fvg-srv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s");
        let params = LayoutParams {
            channels: 2,
            ring_entries: 8,
            arena_size: 8192,
            vectors: 2,
            pinned_size: 0,
        };
        let (region, fd) = Region::create("t", params).unwrap();
        let server = serve(&sock, fd, 2).unwrap();
        let a = Client::connect(&sock, Duration::from_secs(5)).unwrap();
        let b = Client::connect(&sock, Duration::from_secs(5)).unwrap();
        assert_ne!(a.id, b.id);
        assert_eq!(a.own_bells.len(), 2);
        assert_eq!(
            server.events.recv_timeout(Duration::from_secs(5)).unwrap(),
            PeerEvent::Connected(a.id)
        );
        assert_eq!(
            server.events.recv_timeout(Duration::from_secs(5)).unwrap(),
            PeerEvent::Connected(b.id)
        );

        // Same memory on both sides.
        let mut g = a.region.claim(u32::from(a.id), 1, 1).unwrap();
        let mut h = region.host_channel(g.index()).unwrap();
        assert!(g.req.try_send(&Descriptor::new(3, 4), b"abc").unwrap());
        let mut buf = Vec::new();
        assert_eq!(h.req.try_recv(&mut buf).unwrap().unwrap().tag, 3);
        // The host's bell reaches the host; the host rings the guest's bell.
        a.host_bells[1].ring().unwrap();
        assert!(server.host_bells[1].wait(Duration::from_secs(5)).unwrap());
        server.ring_peer(a.id, 1).unwrap();
        assert!(a.own_bells[1].wait(Duration::from_secs(5)).unwrap());

        drop(g);
        h.reclaim().unwrap();
        let gone = a.id;
        drop(a);
        assert_eq!(
            server.events.recv_timeout(Duration::from_secs(5)).unwrap(),
            PeerEvent::Gone(gone)
        );
        drop(b);
        drop(server);
        assert!(!sock.exists());
    }
}
