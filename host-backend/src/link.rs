//! How a worker reaches its VM's peers, and how a VM's region outlives its
//! worker.
//!
//! Under `fairvgpu serve` the daemon owns each VM's region (a memfd) and its
//! ivshmem-server socket ([`VmHost`]); QEMU stays connected to the daemon
//! whatever happens to the worker. A worker is handed the region and the
//! doorbells over a socket pair (its *feed*): the region's fd, the host's
//! own eventfds, then the eventfds of every connected peer, and afterwards
//! every peer that comes or goes. When a worker dies (a crash, a poisoned
//! GPU context), the daemon starts another, feeds it the same region, and
//! the new worker adopts it ([`qemu_ivshmem::Region::adopt`]): channels
//! whose GPU state died become LOST, their guests get an error they recover
//! from by claiming a new channel, and nobody has to re-plug a device.
//!
//! A worker started by hand (or by a test) instead serves its own region
//! and socket ([`PeerLink::Local`]).
//!
//! Feed messages reuse the ivshmem-server framing (one `i64`, optionally one
//! fd): kind in bits 40..48, peer in bits 16..32, vector in bits 0..16.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qemu_ivshmem::server::{recv_msg, send_msg, serve, PeerBells, PeerEvent, ServerHandle};
use qemu_ivshmem::{Bell, EventFdBell, LayoutParams, Region};

use crate::Error;

const REGION: i64 = 1;
const HOST_BELL: i64 = 2;
const PEER_BELL: i64 = 3;
const PEER_GONE: i64 = 4;
const SYNCED: i64 = 5;
/// The vGPU's device-memory limit changed: the low 40 bits are MiB.
const LIMIT: i64 = 6;
const LIMIT_MASK: i64 = (1 << 40) - 1;
/// Daemon -> worker: move to GPU (low 16 bits), with the socket of that
/// GPU's grant service when the scheduler runs.
const MIGRATE: i64 = 7;
/// Worker -> daemon, after a migration: its pause in microseconds, then the
/// KiB it copied (low 40 bits each), then MIGRATED with the GPU it is on
/// (low 16 bits) and bit 16 set if it moved.
const MIGRATION_PAUSE_US: i64 = 8;
const MIGRATION_KIB: i64 = 9;
const MIGRATED: i64 = 10;

/// What a worker reported of a migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrationReport {
    /// The GPU the vGPU is on now.
    pub gpu: u32,
    /// Whether it moved (false: it stayed where it was).
    pub moved: bool,
    /// From the last work on the source to being ready on the target, µs.
    pub pause_us: u64,
    /// Device memory copied, KiB.
    pub kib: u64,
}

fn encode(kind: i64, peer: u16, vector: u16) -> i64 {
    (kind << 40) | (i64::from(peer) << 16) | i64::from(vector)
}

fn decode(v: i64) -> (i64, u16, u16) {
    ((v >> 40) & 0xff, (v >> 16) as u16, v as u16)
}

/// The daemon's side of one VM: its region, its ivshmem-server socket, and
/// the feed of whichever worker serves it now.
#[derive(Debug)]
pub struct VmHost {
    region: Region,
    fd: OwnedFd,
    server: ServerHandle,
    feed: Arc<Mutex<Option<UnixStream>>>,
    /// The limit last set while running (MiB), passed on to new workers too.
    limit_mib: Mutex<Option<u64>>,
    /// Migration reports from the current worker, oldest first.
    reports: Arc<Mutex<Vec<MigrationReport>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl VmHost {
    /// Creates the region and starts serving `socket`.
    pub fn start(name: &str, socket: &Path, layout: LayoutParams) -> Result<VmHost, Error> {
        let (region, fd) = Region::create(&format!("fairvgpu-{name}"), layout)?;
        let server_fd = fd.try_clone().map_err(|source| Error::Io {
            what: "dup of region fd",
            source,
        })?;
        let mut server = serve(socket, server_fd, layout.vectors)?;
        let events = std::mem::replace(&mut server.events, std::sync::mpsc::channel().1);
        let feed: Arc<Mutex<Option<UnixStream>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (region, peers, host_bell, feed, stop) = (
                region.clone(),
                server.peers.clone(),
                server.host_bells.first().cloned(),
                feed.clone(),
                stop.clone(),
            );
            std::thread::Builder::new()
                .name(format!("feed-{name}"))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match events.recv_timeout(Duration::from_millis(100)) {
                            Ok(ev) => forward(&region, &peers, host_bell.as_deref(), &feed, ev),
                            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                            Err(_) => return,
                        }
                    }
                })
                .map_err(|source| Error::Io {
                    what: "spawning feed thread",
                    source,
                })?
        };
        Ok(VmHost {
            region,
            fd,
            server,
            feed,
            limit_mib: Mutex::new(None),
            reports: Arc::default(),
            stop,
            thread: Some(thread),
        })
    }

    /// A feed for a new worker: returns the worker's end, which has already
    /// been sent the region, the host's doorbells and the current peers.
    /// The previous worker's feed (if any) is closed.
    pub fn feed(&self) -> Result<OwnedFd, Error> {
        let (ours, theirs) = UnixStream::pair().map_err(|source| Error::Io {
            what: "feed socket pair",
            source,
        })?;
        let mut slot = self.feed.lock().unwrap_or_else(|e| e.into_inner());
        send_msg(&ours, encode(REGION, 0, 0), Some(self.fd.as_raw_fd()))?;
        for (v, b) in self.server.host_bells.iter().enumerate() {
            send_msg(
                &ours,
                encode(HOST_BELL, 0, v as u16),
                Some(b.fd().as_raw_fd()),
            )?;
        }
        let peers = self
            .server
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (id, bells) in &peers {
            send_bells(&ours, *id, bells)?;
        }
        if let Some(mib) = *self.limit_mib.lock().unwrap_or_else(|e| e.into_inner()) {
            send_msg(&ours, (LIMIT << 40) | (mib as i64 & LIMIT_MASK), None)?;
        }
        send_msg(&ours, encode(SYNCED, 0, 0), None)?;
        // What the worker says back (migration reports) until it goes.
        let back = ours.try_clone().map_err(|source| Error::Io {
            what: "feed clone",
            source,
        })?;
        let reports = self.reports.clone();
        std::thread::Builder::new()
            .name("feed-back".into())
            .spawn(move || {
                let (mut pause_us, mut kib) = (0, 0);
                while let Ok(Some((v, _))) = recv_msg(&back) {
                    match v >> 40 {
                        MIGRATION_PAUSE_US => pause_us = (v & LIMIT_MASK) as u64,
                        MIGRATION_KIB => kib = (v & LIMIT_MASK) as u64,
                        MIGRATED => reports.lock().unwrap_or_else(|e| e.into_inner()).push(
                            MigrationReport {
                                gpu: (v & 0xffff) as u32,
                                moved: v & (1 << 16) != 0,
                                pause_us,
                                kib,
                            },
                        ),
                        _ => {}
                    }
                }
            })
            .map_err(|source| Error::Io {
                what: "spawning feed thread",
                source,
            })?;
        // The previous worker's feed ends here, for it and for the thread
        // reading its answers (which holds a clone).
        if let Some(old) = slot.replace(ours) {
            let _ = old.shutdown(std::net::Shutdown::Both);
        }
        Ok(theirs.into())
    }

    /// Changes the vGPU's device-memory limit now: the worker refuses
    /// allocations beyond it from its next one on (what is allocated stays).
    pub fn set_memory_limit(&self, mib: u64) -> Result<(), Error> {
        let mib = mib.min(LIMIT_MASK as u64);
        *self.limit_mib.lock().unwrap_or_else(|e| e.into_inner()) = Some(mib);
        let slot = self.feed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sock) = slot.as_ref() {
            // A dead worker's successor gets it with its snapshot.
            let _ = send_msg(sock, (LIMIT << 40) | mib as i64, None);
        }
        Ok(())
    }

    /// Asks the current worker to move the vGPU to GPU `gpu`, registering
    /// there over `grant` (a connection to that GPU's grant service).
    /// Its answer comes in [`VmHost::take_reports`].
    pub fn migrate(&self, gpu: u32, grant: Option<&UnixStream>) -> Result<(), Error> {
        let slot = self.feed.lock().unwrap_or_else(|e| e.into_inner());
        let sock = slot
            .as_ref()
            .ok_or_else(|| Error::Config("no worker serves this VM now".into()))?;
        send_msg(
            sock,
            (MIGRATE << 40) | i64::from(gpu as u16),
            grant.map(|g| g.as_raw_fd()),
        )?;
        Ok(())
    }

    /// Migration reports received since the last call.
    pub fn take_reports(&self) -> Vec<MigrationReport> {
        std::mem::take(&mut *self.reports.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The region (the daemon marks the channels of departed peers).
    pub fn region(&self) -> &Region {
        &self.region
    }
}

impl Drop for VmHost {
    fn drop(&mut self) {
        if let Some(s) = self.feed.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn send_bells(sock: &UnixStream, id: u16, bells: &[Arc<EventFdBell>]) -> Result<(), Error> {
    for (v, b) in bells.iter().enumerate() {
        send_msg(
            sock,
            encode(PEER_BELL, id, v as u16),
            Some(b.fd().as_raw_fd()),
        )?;
    }
    Ok(())
}

/// Passes one peer event on to the current worker. A departed peer's
/// channels are marked abandoned here, so that this happens even while no
/// worker runs; the worker is rung to reclaim them.
fn forward(
    region: &Region,
    peers: &PeerBells,
    host_bell: Option<&EventFdBell>,
    feed: &Mutex<Option<UnixStream>>,
    ev: PeerEvent,
) {
    let slot = feed.lock().unwrap_or_else(|e| e.into_inner());
    match ev {
        PeerEvent::Connected(id) => {
            let bells = peers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&id)
                .cloned();
            if let (Some(sock), Some(bells)) = (slot.as_ref(), bells) {
                // A dead worker's feed fails; its successor gets a snapshot.
                let _ = send_bells(sock, id, &bells);
            }
        }
        PeerEvent::Gone(id) => {
            for ch in 0..region.channels() {
                if region.owner_peer(ch).ok() == Some(u32::from(id)) {
                    let _ = region.mark_abandoned(ch);
                }
            }
            if let Some(sock) = slot.as_ref() {
                let _ = send_msg(sock, encode(PEER_GONE, id, 0), None);
            }
            if let Some(b) = host_bell {
                let _ = b.ring();
            }
        }
    }
}

/// A migration the daemon asked for: the target GPU and a connection to its
/// grant service.
type MigrationAsk = Arc<Mutex<Option<(u32, Option<OwnedFd>)>>>;

/// A worker's view of the peers, fed by the daemon.
#[derive(Debug)]
pub struct Fed {
    host_bells: Vec<Arc<EventFdBell>>,
    peers: PeerBells,
    closed: Arc<AtomicBool>,
    /// Bytes; 0 while the daemon set none (the config's applies).
    limit: Arc<AtomicU64>,
    /// A migration the daemon asked for: (GPU, grant socket).
    migration: MigrationAsk,
    migration_asked: Arc<AtomicBool>,
    /// Our end of the feed, for answers.
    back: UnixStream,
}

/// Takes over the feed fd the daemon passed (by number, on the command line).
pub fn feed_from_fd(fd: RawFd) -> Result<OwnedFd, Error> {
    let bad = |what: &'static str| Error::Io {
        what,
        source: std::io::Error::from_raw_os_error(libc::EBADF),
    };
    if fd < 3 {
        return Err(bad("feed fd must not be a standard stream"));
    }
    nix::fcntl::fcntl(
        // SAFETY: borrowed only for this call; F_GETFD just checks it is open.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        nix::fcntl::FcntlArg::F_GETFD,
    )
    .map_err(|_| bad("feed fd is not open"))?;
    // SAFETY: the daemon opened this fd for this process alone and named it
    // on the command line; nothing else in the process owns it, and it was
    // just checked to be open.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::fcntl::fcntl(
        &owned,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|_| bad("feed fd flags"))?;
    Ok(owned)
}

impl Fed {
    /// Reads the feed up to its first synchronization point: returns the
    /// region's fd and the link; a thread keeps the peers up to date after.
    pub fn receive(feed: OwnedFd) -> Result<(OwnedFd, Fed), Error> {
        let sock = UnixStream::from(feed);
        let mut region = None;
        let mut host_bells: BTreeMap<u16, Arc<EventFdBell>> = BTreeMap::new();
        let peers: PeerBells = Arc::default();
        let limit = Arc::new(AtomicU64::new(0));
        loop {
            let Some((v, fd)) = recv_msg(&sock)? else {
                return Err(Error::Config("the daemon closed the feed".into()));
            };
            let (kind, peer, vector) = decode(v);
            match (kind, fd) {
                (REGION, Some(fd)) => region = Some(fd),
                (HOST_BELL, Some(fd)) => {
                    host_bells.insert(vector, Arc::new(EventFdBell::from_fd(fd)));
                }
                (SYNCED, None) => break,
                (LIMIT, None) => set_limit(&limit, v),
                (_, fd) => apply(&peers, kind, peer, vector, fd)?,
            }
        }
        let region = region.ok_or_else(|| Error::Config("feed without a region".into()))?;
        let host_bells: Vec<_> = host_bells.into_values().collect();
        let closed = Arc::new(AtomicBool::new(false));
        let migration: MigrationAsk = Arc::default();
        let migration_asked = Arc::new(AtomicBool::new(false));
        let back = sock.try_clone().map_err(|source| Error::Io {
            what: "feed clone",
            source,
        })?;
        {
            let (peers, closed, limit) = (peers.clone(), closed.clone(), limit.clone());
            let (migration, asked) = (migration.clone(), migration_asked.clone());
            std::thread::Builder::new()
                .name("feed".into())
                .spawn(move || loop {
                    match recv_msg(&sock) {
                        Ok(Some((v, fd))) => {
                            let (kind, peer, vector) = decode(v);
                            if kind == LIMIT {
                                set_limit(&limit, v);
                            } else if kind == MIGRATE {
                                *migration.lock().unwrap_or_else(|e| e.into_inner()) =
                                    Some(((v & 0xffff) as u32, fd));
                                asked.store(true, Ordering::Release);
                            } else if apply(&peers, kind, peer, vector, fd).is_err() {
                                tracing::warn!("unexpected feed message {v:#x}");
                            }
                        }
                        _ => {
                            closed.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                })
                .map_err(|source| Error::Io {
                    what: "spawning feed thread",
                    source,
                })?;
        }
        Ok((
            region,
            Fed {
                host_bells,
                peers,
                closed,
                limit,
                migration,
                migration_asked,
                back,
            },
        ))
    }
}

fn set_limit(limit: &AtomicU64, v: i64) {
    let mib = (v & LIMIT_MASK) as u64;
    limit.store(mib.saturating_mul(1 << 20).max(1), Ordering::Relaxed);
}

fn apply(
    peers: &PeerBells,
    kind: i64,
    peer: u16,
    vector: u16,
    fd: Option<OwnedFd>,
) -> Result<(), Error> {
    let mut map = peers.lock().unwrap_or_else(|e| e.into_inner());
    match (kind, fd) {
        (PEER_BELL, Some(fd)) => {
            // Vectors arrive in order; a peer sent again (a snapshot
            // overlapping an event) replaces its bells one by one.
            let bells = map.entry(peer).or_default();
            let bell = Arc::new(EventFdBell::from_fd(fd));
            match usize::from(vector) {
                v if v < bells.len() => bells[v] = bell,
                v if v == bells.len() => bells.push(bell),
                v => return Err(Error::Config(format!("feed: vector {v} out of order"))),
            }
            Ok(())
        }
        (PEER_GONE, None) => {
            map.remove(&peer);
            Ok(())
        }
        _ => Err(Error::Config(format!(
            "unexpected feed message kind {kind}"
        ))),
    }
}

/// How the worker reaches its peers.
#[derive(Debug)]
pub enum PeerLink {
    /// The worker serves its own socket (started by hand, tests, benches).
    Local(ServerHandle),
    /// The daemon serves the socket and feeds the worker.
    Fed(Fed),
}

impl PeerLink {
    /// The host's own doorbells (guests ring these).
    pub fn host_bells(&self) -> &[Arc<EventFdBell>] {
        match self {
            PeerLink::Local(s) => &s.host_bells,
            PeerLink::Fed(f) => &f.host_bells,
        }
    }

    /// Rings vector `vector` of peer `peer`, if it is connected.
    pub fn ring_peer(&self, peer: u16, vector: u32) -> Result<(), Error> {
        match self {
            PeerLink::Local(s) => Ok(s.ring_peer(peer, vector)?),
            PeerLink::Fed(f) => {
                let bell = f
                    .peers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&peer)
                    .and_then(|b| b.get(vector as usize).cloned());
                match bell {
                    Some(b) => Ok(b.ring()?),
                    None => Ok(()),
                }
            }
        }
    }

    /// Peers that left since the last call (a local server only: under the
    /// daemon, the daemon marks their channels).
    pub fn departed(&self) -> Vec<u16> {
        match self {
            PeerLink::Local(s) => s
                .events
                .try_iter()
                .filter_map(|ev| match ev {
                    PeerEvent::Gone(p) => Some(p),
                    PeerEvent::Connected(_) => None,
                })
                .collect(),
            PeerLink::Fed(_) => Vec::new(),
        }
    }

    /// The device-memory limit the daemon set while running, if any.
    pub fn memory_limit(&self) -> Option<u64> {
        match self {
            PeerLink::Local(_) => None,
            PeerLink::Fed(f) => Some(f.limit.load(Ordering::Relaxed)).filter(|&b| b > 0),
        }
    }

    /// A migration the daemon asked for since the last call: the target GPU
    /// and, when the scheduler runs, a connection to its grant service.
    /// Cheap when there is none (one atomic load).
    pub fn take_migration(&self) -> Option<(u32, Option<OwnedFd>)> {
        match self {
            PeerLink::Local(_) => None,
            PeerLink::Fed(f) => {
                if !f.migration_asked.swap(false, Ordering::Acquire) {
                    return None;
                }
                f.migration.lock().unwrap_or_else(|e| e.into_inner()).take()
            }
        }
    }

    /// Tells the daemon how a migration went.
    pub fn report_migration(&self, r: &MigrationReport) {
        if let PeerLink::Fed(f) = self {
            let _ = send_msg(
                &f.back,
                (MIGRATION_PAUSE_US << 40) | (r.pause_us as i64 & LIMIT_MASK),
                None,
            );
            let _ = send_msg(
                &f.back,
                (MIGRATION_KIB << 40) | (r.kib as i64 & LIMIT_MASK),
                None,
            );
            let moved = if r.moved { 1 << 16 } else { 0 };
            let _ = send_msg(
                &f.back,
                (MIGRATED << 40) | moved | i64::from(r.gpu as u16),
                None,
            );
        }
    }

    /// Whether the daemon went away (its end of the feed closed).
    pub fn orphaned(&self) -> bool {
        match self {
            PeerLink::Local(_) => false,
            PeerLink::Fed(f) => f.closed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qemu_ivshmem::server::Client;
    use qemu_ivshmem::ClaimState;

    fn layout() -> LayoutParams {
        LayoutParams {
            channels: 2,
            ring_entries: 8,
            arena_size: 8192,
            vectors: 2,
            pinned_size: 0,
        }
    }

    #[test]
    fn feed_carries_region_bells_and_peer_changes_to_successive_workers() {
        let dir = std::env::temp_dir().join(format!("fvg-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("vm.sock");
        let host = VmHost::start("link-test", &sock, layout()).unwrap();
        let client = Client::connect(&sock, Duration::from_secs(5)).unwrap();

        let (fd, fed) = Fed::receive(host.feed().unwrap()).unwrap();
        let region = Region::adopt(fd, layout()).unwrap();
        let link = PeerLink::Fed(fed);
        assert_eq!(link.host_bells().len(), 2);
        // The worker can ring the peer that was there before it started...
        link.ring_peer(client.id, 1).unwrap();
        assert!(wait_readable(&client.own_bells[1]));
        // ...and the guest rings the worker's bell.
        client.host_bells[0].ring().unwrap();
        assert!(wait_readable(&link.host_bells()[0]));

        // A guest claims a channel; the worker dies; a second worker adopts.
        let g = client.region.claim(u32::from(client.id), 1, 0).unwrap();
        region
            .host_channel(g.index())
            .unwrap()
            .mark_serving()
            .unwrap();
        drop(link);
        let (fd2, fed2) = Fed::receive(host.feed().unwrap()).unwrap();
        let region2 = Region::adopt(fd2, layout()).unwrap();
        assert_eq!(region2.claim_state(g.index()).unwrap(), ClaimState::Lost);
        let link2 = PeerLink::Fed(fed2);
        link2.ring_peer(client.id, 0).unwrap();
        assert!(wait_readable(&client.own_bells[0]));

        // A peer that leaves: the daemon marks its channels abandoned.
        let idx = g.index();
        std::mem::forget(g);
        drop(client);
        let t = std::time::Instant::now();
        while !region2.claim_state(idx).unwrap().needs_reclaim() {
            assert!(t.elapsed() < Duration::from_secs(5), "not abandoned");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!link2.orphaned());
        // A limit set while running reaches the worker, and its successors.
        assert_eq!(link2.memory_limit(), None);
        host.set_memory_limit(300).unwrap();
        let t = std::time::Instant::now();
        while link2.memory_limit() != Some(300 << 20) {
            assert!(t.elapsed() < Duration::from_secs(5), "limit not fed");
            std::thread::sleep(Duration::from_millis(5));
        }
        let (_fd3, fed3) = Fed::receive(host.feed().unwrap()).unwrap();
        assert_eq!(PeerLink::Fed(fed3).memory_limit(), Some(300 << 20));
        drop(region);
        drop(host);
        let t = std::time::Instant::now();
        while !link2.orphaned() {
            assert!(t.elapsed() < Duration::from_secs(5), "feed not closed");
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn wait_readable(b: &EventFdBell) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let mut fds = [PollFd::new(b.fd().as_fd(), PollFlags::POLLIN)];
        let ok = poll(&mut fds, PollTimeout::from(2000u16)).unwrap_or(0) == 1;
        let mut buf = [0u8; 8];
        let _ = nix::unistd::read(b.fd().as_fd(), &mut buf);
        ok
    }

    #[test]
    fn feed_messages_round_trip() {
        for (k, p, v) in [(REGION, 0, 0), (PEER_BELL, 65535, 31), (PEER_GONE, 7, 0)] {
            assert_eq!(decode(encode(k, p, v)), (k, p, v));
        }
    }
}
