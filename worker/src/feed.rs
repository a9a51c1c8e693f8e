//! The worker's side of its feed: the region and doorbells the daemon
//! passes ([`Feed`]), and how the worker reaches its peers, fed or on its
//! own ([`PeerLink`]).

use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use transport::server::{recv_msg, send_msg, PeerBells, PeerEvent, ServerHandle};
use transport::{Bell, EventFdBell};

use crate::Error;
use wire::feed::{
    decode, MigrationReport, CHECKPOINT, HOST_BELL, LIMIT, MIGRATE, MIGRATION_KIB,
    MIGRATION_PAUSE_US, PEER_BELL, PEER_GONE, POISONED, REGION, RESUME, SYNCED,
};

/// What the daemon's feed did that it should not have.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The first message did not carry the region's fd.
    #[error("config: the feed did not start with the region")]
    NoRegion,
    /// The daemon closed the feed before the snapshot was complete.
    #[error("config: the daemon closed the feed")]
    Closed,
    /// A peer's doorbell vector came before the ones below it.
    #[error("config: feed: vector {0} out of order")]
    VectorOutOfOrder(usize),
    /// A message of a kind the feed does not send here, or without (or with)
    /// the fd its kind carries.
    #[error("config: unexpected feed message kind {0}")]
    UnexpectedKind(i64),
}

/// A migration the daemon asked for: the target GPU and a connection to its
/// grant service.
type MigrationAsk = Arc<Mutex<Option<(u32, Option<OwnedFd>)>>>;

/// A checkpoint order of the daemon (`wire::feed::CHECKPOINT`, `RESUME`).
#[derive(Debug)]
pub enum CheckpointAsk {
    /// Hold, take the checkpoint and write its stream into this memfd;
    /// keep the memfd mapped for a handover into it where true
    /// ([`wire::feed::CHECKPOINT_KEEP_MAPPED`]).
    Take(OwnedFd, bool),
    /// Go on serving.
    Resume,
}

/// Checkpoint orders not yet taken by the serving loop, and whether any is.
type CheckpointAsks = (
    Arc<Mutex<std::collections::VecDeque<CheckpointAsk>>>,
    Arc<AtomicBool>,
);

/// A worker's view of the peers, fed by the daemon.
#[derive(Debug)]
pub struct Feed {
    host_bells: Vec<Arc<EventFdBell>>,
    peers: PeerBells,
    closed: Arc<AtomicBool>,
    /// Bytes; 0 while the daemon set none (the config's applies).
    limit: Arc<AtomicU64>,
    /// A migration the daemon asked for: (GPU, grant socket).
    migration: MigrationAsk,
    migration_asked: Arc<AtomicBool>,
    /// Checkpoint orders.
    checkpoints: CheckpointAsks,
    /// Our end of the feed, for answers.
    back: UnixStream,
    /// IPC across the VM's workers: its export table and the fds the
    /// daemon hands over (`exports.rs`).
    ipc: (Option<OwnedFd>, Arc<crate::exports::Mailbox>),
}

/// Takes over an fd the daemon passed (by number, on the command line):
/// the feed, or a VM's memory ledger.
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

impl Feed {
    /// Reads the feed up to its first synchronization point: returns the
    /// region's fd and the link; a thread keeps the peers up to date after.
    pub fn receive(feed: OwnedFd) -> Result<(OwnedFd, Feed), Error> {
        let sock = UnixStream::from(feed);
        let region = match recv_msg(&sock)? {
            Some((v, Some(fd))) if decode(v).0 == REGION => fd,
            Some(_) => return Err(FeedError::NoRegion.into()),
            None => return Err(FeedError::Closed.into()),
        };
        let mut ipc_table = None;
        let mailbox: Arc<crate::exports::Mailbox> = Arc::default();
        let mut host_bells: BTreeMap<u16, Arc<EventFdBell>> = BTreeMap::new();
        let peers: PeerBells = Arc::default();
        let limit = Arc::new(AtomicU64::new(0));
        loop {
            let Some((v, fd)) = recv_msg(&sock)? else {
                return Err(FeedError::Closed.into());
            };
            let (kind, peer, vector) = decode(v);
            match (kind, fd) {
                (wire::feed::IPC_TABLE, Some(fd)) => ipc_table = Some(fd),
                (HOST_BELL, Some(fd)) => {
                    host_bells.insert(vector, Arc::new(EventFdBell::from_fd(fd)));
                }
                (SYNCED, None) => break,
                (LIMIT, None) => set_limit(&limit, v),
                (_, fd) => apply(&peers, kind, peer, vector, fd)?,
            }
        }
        let host_bells: Vec<_> = host_bells.into_values().collect();
        let closed = Arc::new(AtomicBool::new(false));
        let migration: MigrationAsk = Arc::default();
        let migration_asked = Arc::new(AtomicBool::new(false));
        let checkpoints: CheckpointAsks = Default::default();
        let back = sock.try_clone().map_err(|source| Error::Io {
            what: "feed clone",
            source,
        })?;
        {
            let (peers, closed, limit) = (peers.clone(), closed.clone(), limit.clone());
            let (migration, asked) = (migration.clone(), migration_asked.clone());
            let mailbox = mailbox.clone();
            let asks = checkpoints.clone();
            // What the feed brings, the serving thread must see even while
            // it sleeps: every message rings its bells.
            let wake = host_bells.clone();
            let ring = move || {
                for b in &wake {
                    let _ = b.ring();
                }
            };
            std::thread::Builder::new()
                .name("feed".into())
                .spawn(move || loop {
                    let msg = recv_msg(&sock);
                    if !matches!(msg, Ok(Some(_))) {
                        closed.store(true, Ordering::Relaxed);
                        ring();
                        return;
                    }
                    match msg {
                        Ok(Some((v, fd))) => {
                            let (kind, peer, vector) = decode(v);
                            if kind == LIMIT {
                                set_limit(&limit, v);
                            } else if kind == MIGRATE {
                                *migration.lock().unwrap_or_else(|e| e.into_inner()) =
                                    Some((u32::from(vector), fd));
                                asked.store(true, Ordering::Release);
                            } else if kind == CHECKPOINT || kind == RESUME {
                                let ask = match fd {
                                    Some(fd) if kind == CHECKPOINT => CheckpointAsk::Take(
                                        fd,
                                        wire::feed::decode_value(v)
                                            & wire::feed::CHECKPOINT_KEEP_MAPPED
                                            != 0,
                                    ),
                                    None if kind == RESUME => CheckpointAsk::Resume,
                                    _ => {
                                        tracing::warn!("unexpected feed message {v:#x}");
                                        continue;
                                    }
                                };
                                asks.0
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push_back(ask);
                                asks.1.store(true, Ordering::Release);
                            } else if kind == wire::feed::IPC_FD {
                                let (index, gen) = wire::feed::decode_entry(v);
                                mailbox.put(index, gen, fd);
                            } else if apply(&peers, kind, peer, vector, fd).is_err() {
                                tracing::warn!("unexpected feed message {v:#x}");
                            }
                            ring();
                        }
                        _ => return,
                    }
                })
                .map_err(|source| Error::Io {
                    what: "spawning feed thread",
                    source,
                })?;
        }
        Ok((
            region,
            Feed {
                host_bells,
                peers,
                closed,
                limit,
                migration,
                migration_asked,
                checkpoints,
                back,
                ipc: (ipc_table, mailbox),
            },
        ))
    }
}

fn set_limit(limit: &AtomicU64, v: i64) {
    let mib = wire::feed::decode_value(v);
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
                v => return Err(FeedError::VectorOutOfOrder(v).into()),
            }
            Ok(())
        }
        (PEER_GONE, None) => {
            map.remove(&peer);
            Ok(())
        }
        _ => Err(FeedError::UnexpectedKind(kind).into()),
    }
}

/// How the worker reaches its peers.
#[derive(Debug)]
pub enum PeerLink {
    /// The worker serves its own socket (started by hand, tests, benches).
    Local(ServerHandle),
    /// The daemon serves the socket and feeds the worker.
    Feed(Feed),
}

impl PeerLink {
    /// The host's own doorbells (guests ring these).
    /// Whether the daemon's feed rings the worker's bells when it brings
    /// something (a migration, a peer gone, its end): the worker may then
    /// sleep long while idle.
    pub fn wakes_on_feed(&self) -> bool {
        matches!(self, PeerLink::Feed(_))
    }

    /// The bells the worker sleeps on.
    pub fn host_bells(&self) -> &[Arc<EventFdBell>] {
        match self {
            PeerLink::Local(s) => &s.host_bells,
            PeerLink::Feed(f) => &f.host_bells,
        }
    }

    /// Rings vector `vector` of peer `peer`, if it is connected.
    pub fn ring_peer(&self, peer: u16, vector: u32) -> Result<(), Error> {
        match self {
            PeerLink::Local(s) => Ok(s.ring_peer(peer, vector)?),
            PeerLink::Feed(f) => {
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

    /// Peers that left since the last call (a local server only); the
    /// server marked their channels abandoned before it said so.
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
            PeerLink::Feed(_) => Vec::new(),
        }
    }

    /// The device-memory limit the daemon set while running, if any.
    pub fn memory_limit(&self) -> Option<u64> {
        match self {
            PeerLink::Local(_) => None,
            PeerLink::Feed(f) => Some(f.limit.load(Ordering::Relaxed)).filter(|&b| b > 0),
        }
    }

    /// A migration the daemon asked for since the last call: the target GPU
    /// and, when the scheduler runs, a connection to its grant service.
    /// Cheap when there is none (one atomic load).
    pub fn take_migration(&self) -> Option<(u32, Option<OwnedFd>)> {
        match self {
            PeerLink::Local(_) => None,
            PeerLink::Feed(f) => {
                if !f.migration_asked.swap(false, Ordering::Acquire) {
                    return None;
                }
                f.migration.lock().unwrap_or_else(|e| e.into_inner()).take()
            }
        }
    }

    /// The daemon's next checkpoint order, if any. Cheap when there is
    /// none (one atomic load).
    pub fn take_checkpoint_ask(&self) -> Option<CheckpointAsk> {
        match self {
            PeerLink::Local(_) => None,
            PeerLink::Feed(f) => {
                if !f.checkpoints.1.load(Ordering::Acquire) {
                    return None;
                }
                let mut q = f.checkpoints.0.lock().unwrap_or_else(|e| e.into_inner());
                let ask = q.pop_front();
                f.checkpoints.1.store(!q.is_empty(), Ordering::Release);
                ask
            }
        }
    }

    /// A second handle on the feed's end for answers, for a thread that
    /// answers the daemon (a checkpoint's writer); None without a daemon.
    pub fn answers(&self) -> Option<UnixStream> {
        match self {
            PeerLink::Local(_) => None,
            PeerLink::Feed(f) => f.back.try_clone().ok(),
        }
    }

    /// Tells the daemon how a migration went.
    pub fn report_migration(&self, r: &MigrationReport) {
        if let PeerLink::Feed(f) = self {
            let _ = send_msg(
                &f.back,
                wire::feed::encode_value(MIGRATION_PAUSE_US, r.pause_us),
                None,
            );
            let _ = send_msg(
                &f.back,
                wire::feed::encode_value(MIGRATION_KIB, r.kib),
                None,
            );
            let _ = send_msg(&f.back, r.encode(), None);
        }
    }

    /// Tells the daemon that a CUDA error poisoned this worker's GPU
    /// contexts (it exits next).
    pub fn report_poisoned(&self) {
        if let PeerLink::Feed(f) = self {
            let _ = send_msg(&f.back, POISONED << 40, None);
        }
    }

    /// The VM's export table the daemon fed (a process slot's worker), once.
    pub fn take_ipc_table(&mut self) -> Option<OwnedFd> {
        match self {
            PeerLink::Local(_) => None,
            PeerLink::Feed(f) => f.ipc.0.take(),
        }
    }

    /// Says an IPC message (`wire::feed`'s `IPC_*`) to the daemon; false
    /// if there is no daemon or it did not take it.
    pub fn say_ipc(&self, v: i64, fd: Option<RawFd>) -> bool {
        match self {
            PeerLink::Local(_) => false,
            PeerLink::Feed(f) => send_msg(&f.back, v, fd).is_ok(),
        }
    }

    /// The daemon's answer to an `IPC_WANT` of entry (`index`, `gen`), if
    /// it came.
    pub fn ipc_answer(&self, index: u16, gen: u32) -> Option<Option<OwnedFd>> {
        match self {
            PeerLink::Local(_) => None,
            PeerLink::Feed(f) => f.ipc.1.take(index, gen),
        }
    }

    /// Whether the daemon went away (its end of the feed closed).
    pub fn orphaned(&self) -> bool {
        match self {
            PeerLink::Local(_) => false,
            PeerLink::Feed(f) => f.closed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bell_fd() -> OwnedFd {
        EventFdBell::new().unwrap().fd().try_clone().unwrap()
    }

    #[test]
    fn a_vector_out_of_order_or_a_kind_without_its_fd_is_refused_by_kind() {
        let peers = PeerBells::default();
        apply(&peers, PEER_BELL, 7, 0, Some(bell_fd())).unwrap();
        let e = apply(&peers, PEER_BELL, 7, 2, Some(bell_fd())).unwrap_err();
        assert!(
            matches!(e, Error::Feed(FeedError::VectorOutOfOrder(2))),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "config: feed: vector 2 out of order");
        let e = apply(&peers, PEER_BELL, 7, 1, None).unwrap_err();
        assert!(
            matches!(e, Error::Feed(FeedError::UnexpectedKind(k)) if k == PEER_BELL),
            "{e:?}"
        );
        // The one bell that came in order is kept.
        let map = peers.lock().unwrap();
        assert_eq!(map.get(&7).map(Vec::len), Some(1));
    }
}
