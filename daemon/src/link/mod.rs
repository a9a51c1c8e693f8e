//! How a worker reaches its VM's peers, and how a VM's region outlives its
//! workers.
//!
//! Under `fairvgpu serve` the daemon owns each VM's region (a memfd) and its
//! ivshmem-server socket ([`VmHost`]); QEMU stays connected to the daemon
//! whatever happens to the workers. Each process slot's worker is handed
//! the region and the doorbells over a socket pair (its *feed*, a lane of
//! the VM's): the region's fd, the host's own eventfds, then the eventfds
//! of every connected peer, and afterwards every peer that comes or goes.
//! When a slot's worker ends (with its process, a crash, a poisoned GPU
//! context), the slot's next process gets a new worker, fed the same
//! region, which takes over the slot's channels
//! ([`transport::Region::take_over_channels`]): those whose GPU state died
//! become LOST, and nobody has to re-plug a device.
//!
//! A worker started by hand (or by a test) instead serves its own region
//! and socket (`PeerLink::Local`).
//!
//! Feed messages reuse the ivshmem-server framing (one `i64`, optionally one
//! fd): kind in bits 40..48, peer in bits 16..32, vector in bits 0..16.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use transport::server::{
    recv_msg, send_msg, serve_to, PeerBells, PeerEvent, ServerHandle, MAX_PEERS,
};
use transport::{Bell, EventFdBell, LayoutParams, Region};

use crate::Error;

mod slots;
pub use slots::{SlotClaim, SlotWatch};
pub use wire::feed::MigrationReport;
use wire::feed::*;

/// How long the daemon waits for a worker to take a feed message before it
/// counts the worker as stuck and closes its feed (the worker then exits
/// and is restarted): a stuck worker holds up nobody but its own VM.
const FEED_SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// What the VM's feed thread is asked to pass on.
enum FeedMsg {
    Peer(PeerEvent),
    /// A new worker's feed, for lane (process slot) `.1`: the snapshot
    /// goes first, then what follows.
    NewFeed(UnixStream, u32),
    Limit(u64),
    /// Lane `.0`'s worker moves to GPU `.1`, over `.2`.
    Migrate(u32, u16, Option<OwnedFd>),
    /// Lane `.0`'s worker ended (a process slot's, with its process).
    CloseLane(u32),
    /// Lane `.0`'s worker holds and writes its checkpoint into memfd `.1`.
    Checkpoint(u32, OwnedFd, bool),
    /// Lane `.0`'s worker goes on serving.
    Resume(u32),
    /// Hands lane `.0`'s worker the fd of an export it opens
    /// (`ipc_relay.rs`).
    IpcFd(u32, u16, u32),
    /// The VM is going: the feed thread closes the feeds and ends.
    Stop,
}

/// The daemon's side of one VM: its region, its ivshmem-server socket, and
/// the feeds of its process slots' workers (a lane each), and its memory
/// ledger (`worker::ledger`), which the VM's workers share (made with it,
/// kept for the VM's life).
///
/// Only the VM's own feed thread ever writes to its worker's feed; the
/// supervisor and the control API hand it messages and never wait, so no
/// VM's slow or stuck worker, nor its peers, can hold up the daemon's work
/// for another VM.
#[derive(Debug)]
pub struct VmHost {
    region: Region,
    server: ServerHandle,
    /// The VM's name.
    name: String,
    /// Its memory ledger (`worker::ledger`), which its workers share.
    ledger: OwnedFd,
    /// The region's memfd (a handover copies it whole).
    region_fd: OwnedFd,
    tx: Mutex<Sender<FeedMsg>>,
    /// The lanes whose worker's feed is open now.
    live: Arc<Mutex<std::collections::BTreeSet<u32>>>,
    /// Migration reports from the current workers, oldest first, by lane.
    reports: Reports,
    /// Checkpoint notes from the current workers, oldest first, by lane.
    notes: Notes,
    /// The watch over the process slots without a worker, where the
    /// VM's workers are bound on demand ([`VmHost::watch_slots`]).
    watch: std::sync::OnceLock<SlotWatch>,
    /// A worker said its GPU contexts are poisoned.
    poisoned: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for FeedMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FeedMsg::Peer(_) => "Peer",
            FeedMsg::NewFeed(..) => "NewFeed",
            FeedMsg::Limit(_) => "Limit",
            FeedMsg::Migrate(..) => "Migrate",
            FeedMsg::CloseLane(_) => "CloseLane",
            FeedMsg::Checkpoint(..) => "Checkpoint",
            FeedMsg::Resume(_) => "Resume",
            FeedMsg::IpcFd(..) => "IpcFd",
            FeedMsg::Stop => "Stop",
        })
    }
}

/// Migration reports, each with the lane (process slot) of its worker.
type Reports = Arc<Mutex<Vec<(u32, MigrationReport)>>>;

/// What a worker said of a checkpoint (`wire::feed::CHECKPOINTED`,
/// `CHECKPOINT_FAILED`, `RESTORED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointNote {
    /// Its checkpoint is in the memfd, this many bytes.
    Taken(u64),
    /// None taken, or none served on from: why is in the memfd, this many
    /// bytes.
    Failed(u64),
    /// It serves on from the checkpoint it was started with, this many of
    /// its modules loaded ahead by a spare.
    Restored(u64),
}

/// Checkpoint notes, each with its worker's lane.
type Notes = Arc<Mutex<Vec<(u32, CheckpointNote)>>>;

/// The state of one VM's feed thread.
struct Feeder {
    name: String,
    fd: OwnedFd,
    peers: PeerBells,
    host_bells: Vec<Arc<EventFdBell>>,
    /// The serving workers' feeds, by lane (process slot).
    lanes: std::collections::BTreeMap<u32, UnixStream>,
    /// The keys of `lanes`, for the daemon to read.
    live: Arc<Mutex<std::collections::BTreeSet<u32>>>,
    /// The limit last set while running (MiB), passed on to new workers too.
    limit_mib: Option<u64>,
    reports: Reports,
    notes: Notes,
    poisoned: Arc<AtomicBool>,
    /// IPC between the VM's workers: its export table and the fds kept.
    ipc: Arc<crate::ipc_relay::IpcRelay>,
    /// The feed thread's own queue (IPC answers come back through it).
    tx: Sender<FeedMsg>,
}

impl VmHost {
    /// Creates the region and starts serving `socket`.
    pub fn start(name: &str, socket: &Path, layout: LayoutParams) -> Result<VmHost, Error> {
        let (region, fd) = Region::create(&format!("fairvgpu-{name}"), layout)?;
        let dup = || {
            fd.try_clone().map_err(|source| Error::Io {
                what: "dup of region fd",
                source,
            })
        };
        let (server_fd, region_fd) = (dup()?, dup()?);
        let (tx, rx) = std::sync::mpsc::channel();
        let peer_tx = tx.clone();
        let server = serve_to(socket, server_fd, &region, MAX_PEERS, move |ev| {
            let _ = peer_tx.send(FeedMsg::Peer(ev));
        })?;
        let live: Arc<Mutex<std::collections::BTreeSet<u32>>> = Arc::default();
        let reports: Reports = Arc::default();
        let notes: Notes = Arc::default();
        let poisoned = Arc::new(AtomicBool::new(false));
        let mut feeder = Feeder {
            name: name.to_owned(),
            fd,
            peers: server.peers.clone(),
            host_bells: server.host_bells.clone(),
            lanes: Default::default(),
            live: live.clone(),
            limit_mib: None,
            reports: reports.clone(),
            notes: notes.clone(),
            poisoned: poisoned.clone(),
            ipc: Arc::new(crate::ipc_relay::IpcRelay::new(name)?),
            tx: tx.clone(),
        };
        // It sleeps until a message comes: an idle VM costs no wake-ups.
        let thread = std::thread::Builder::new()
            .name(format!("feed-{name}"))
            .spawn(move || {
                while let Ok(m) = rx.recv() {
                    if matches!(m, FeedMsg::Stop) {
                        break;
                    }
                    feeder.handle(m);
                }
                feeder.close();
            })
            .map_err(|source| Error::Io {
                what: "spawning feed thread",
                source,
            })?;
        Ok(VmHost {
            region,
            server,
            name: name.to_owned(),
            ledger: worker::ledger::Ledger::create(&format!("fairvgpu-{name}-ledger"))?,
            region_fd,
            tx: Mutex::new(tx),
            live,
            reports,
            notes,
            watch: std::sync::OnceLock::new(),
            poisoned,
            thread: Some(thread),
        })
    }

    fn send(&self, m: FeedMsg) -> Result<(), Error> {
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(m)
            .map_err(|_| Error::FeedStopped)
    }

    /// A feed for a new worker of process slot `slot`: returns the
    /// worker's end; the VM's feed thread sends it the region, the host's
    /// doorbells and the current peers, then every change. The slot's
    /// previous worker's feed (if any) is closed. Never waits for the
    /// worker.
    pub fn feed_slot(&self, slot: u32) -> Result<OwnedFd, Error> {
        let (ours, theirs) = feed_pair()?;
        self.send(FeedMsg::NewFeed(ours, slot))?;
        Ok(theirs.into())
    }

    /// The VM's memory ledger (a dup, for one of its workers).
    pub fn ledger(&self) -> Result<OwnedFd, Error> {
        self.ledger.try_clone().map_err(|source| Error::Io {
            what: "dup of the memory ledger",
            source,
        })
    }

    /// Changes the vGPU's device-memory limit now: the worker refuses
    /// allocations beyond it from its next one on (what is allocated stays).
    pub fn set_memory_limit(&self, mib: u64) -> Result<(), Error> {
        self.send(FeedMsg::Limit(mib.min(LIMIT_MASK as u64)))
    }

    /// Asks lane (process slot) `lane`'s worker to move to GPU `gpu`,
    /// registering there over `grant` (a connection to that GPU's grant
    /// service; each of a VM's workers moves over one of its own). Its
    /// answer comes in [`VmHost::take_reports`].
    pub fn migrate_lane(
        &self,
        lane: u32,
        gpu: u32,
        grant: Option<&UnixStream>,
    ) -> Result<(), Error> {
        if !self.lanes().contains(&lane) {
            return Err(Error::NoWorker);
        }
        // The feed's MIGRATE carries 16 bits of GPU.
        let gpu = u16::try_from(gpu).map_err(|_| Error::GpuPastFeed(gpu))?;
        let grant = match grant {
            Some(g) => Some(OwnedFd::from(g.try_clone().map_err(|source| {
                Error::Io {
                    what: "grant socket clone",
                    source,
                }
            })?)),
            None => None,
        };
        self.send(FeedMsg::Migrate(lane, gpu, grant))
    }

    /// Asks lane `lane`'s worker to hold and write its checkpoint into
    /// `memfd`, and to keep it mapped for a handover's where `ahead`; its
    /// answer comes in [`VmHost::take_checkpoint_notes`].
    pub fn checkpoint_lane(&self, lane: u32, memfd: OwnedFd, ahead: bool) -> Result<(), Error> {
        if !self.lanes().contains(&lane) {
            return Err(Error::NoWorker);
        }
        self.send(FeedMsg::Checkpoint(lane, memfd, ahead))
    }

    /// Tells lane `lane`'s worker to go on serving (a checkpoint not used).
    pub fn resume_lane(&self, lane: u32) -> Result<(), Error> {
        self.send(FeedMsg::Resume(lane))
    }

    /// Checkpoint notes received since the last call, each with its
    /// worker's lane.
    pub fn take_checkpoint_notes(&self) -> Vec<(u32, CheckpointNote)> {
        std::mem::take(&mut *self.notes.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The lanes (process slots; 0 for a VM's one worker) whose worker's
    /// feed is open now.
    pub fn lanes(&self) -> Vec<u32> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect()
    }

    /// Migration reports received since the last call, each with its
    /// worker's lane.
    pub fn take_reports(&self) -> Vec<(u32, MigrationReport)> {
        std::mem::take(&mut *self.reports.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether the current worker said, since the last call, that a CUDA
    /// error poisoned its GPU contexts (it exits next).
    pub fn take_poisoned(&self) -> bool {
        self.poisoned.swap(false, Ordering::Relaxed)
    }

    /// The region's memfd (a dup) and its length: what a handover to
    /// another host copies, and a restore writes.
    pub fn region_memfd(&self) -> Result<(OwnedFd, u64), Error> {
        let fd = self.region_fd.try_clone().map_err(|source| Error::Io {
            what: "dup of region fd",
            source,
        })?;
        Ok((fd, self.region.layout().region_size as u64))
    }

    /// The region (the daemon marks the channels of departed peers).
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The process id of each connected peer (see `hostcpu::lift`).
    pub fn peer_pids(&self) -> transport::server::PeerPids {
        self.server.peer_pids.clone()
    }

    /// Log lines about the VM's peers that the daemon suppressed so far.
    pub fn log_suppressed(&self) -> u64 {
        self.server.log_suppressed()
    }

    /// The count behind [`VmHost::log_suppressed`], to read elsewhere.
    pub fn log_counter(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.server.log_counter()
    }

    /// Watches the VM's process slots that have no worker (see
    /// `slots.rs`): a process claiming one is sent to `claims`. Once.
    pub fn watch_slots<T: From<SlotClaim> + Send + 'static>(
        &self,
        claims: Sender<T>,
    ) -> Result<(), Error> {
        if self.watch.get().is_none() {
            let w = SlotWatch::start(
                &self.name,
                self.region.clone(),
                self.server.host_bells.clone(),
                claims,
            )?;
            let _ = self.watch.set(w);
        }
        Ok(())
    }

    /// Slot `slot` has a worker now, started other than on the watch's
    /// asking: the watch leaves its doorbell to it.
    pub fn slot_taken(&self, slot: u32) {
        if let Some(w) = self.watch.get() {
            w.take(slot);
        }
    }

    /// Slot `slot` got no worker after all (none could be started): the
    /// watch looks at it again.
    pub fn slot_unserved(&self, slot: u32) {
        if let Some(w) = self.watch.get() {
            w.release(slot);
        }
    }

    /// Slot `slot`'s worker is gone (`crashed`: without retiring its
    /// channels, a crash or a kill): its lane is closed; what it held is
    /// given back to the VM's ledger and its process no longer shown; a
    /// crashed one's served claims become LOST and their guests are woken
    /// to see it (a worker that exited did both itself); the slot's host
    /// end shows asleep; and the watch looks at the slot at once, so that
    /// a process that came as the worker left gets a new one (where
    /// `release`; else the caller does it later, [`VmHost::slot_unserved`]).
    pub fn slot_worker_gone(&self, slot: u32, crashed: bool, release: bool) {
        let _ = self.send(FeedMsg::CloseLane(slot));
        let ledger = self.ledger.try_clone().ok();
        if let Some(l) = ledger.and_then(|fd| worker::ledger::Ledger::shared(fd).ok()) {
            l.forget(slot);
        }
        let chans = self.region.layout().partition_channels(slot);
        if crashed {
            let _ = self.region.take_over_channels(chans.clone());
            self.wake_lost(chans);
        }
        if let Ok(w) = self.region.slot_sleeping(slot) {
            w.store(1, Ordering::SeqCst);
        }
        if release {
            self.slot_unserved(slot);
        }
    }

    /// Rings the guests whose channels among `chans` are LOST, to see it.
    fn wake_lost(&self, chans: std::ops::Range<u32>) {
        let peers = self
            .server
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for ch in chans {
            if self.region.claim_state(ch).ok() != Some(transport::ClaimState::Lost) {
                continue;
            }
            let (Ok(peer), Ok(v)) = (self.region.owner_peer(ch), self.region.guest_vector(ch))
            else {
                continue;
            };
            let bell = u16::try_from(peer)
                .ok()
                .and_then(|p| peers.get(&p))
                .and_then(|b| b.get(v as usize));
            if let Some(b) = bell {
                let _ = b.ring();
            }
        }
    }
}

/// A feed's socket pair: ours with the send timeout, the worker's.
fn feed_pair() -> Result<(UnixStream, UnixStream), Error> {
    let (ours, theirs) = UnixStream::pair().map_err(|source| Error::Io {
        what: "feed socket pair",
        source,
    })?;
    ours.set_write_timeout(Some(FEED_SEND_TIMEOUT))
        .map_err(|source| Error::Io {
            what: "feed timeout",
            source,
        })?;
    Ok((ours, theirs))
}

impl Drop for VmHost {
    fn drop(&mut self) {
        let _ = self.send(FeedMsg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Feeder {
    fn handle(&mut self, m: FeedMsg) {
        match m {
            FeedMsg::Peer(PeerEvent::Connected(id)) => {
                let bells = self
                    .peers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&id)
                    .cloned();
                if let Some(bells) = bells {
                    // A dead worker's feed fails; its successor gets a snapshot.
                    self.write(|s| send_bells(s, id, &bells));
                }
            }
            FeedMsg::Peer(PeerEvent::Gone(id)) => {
                // Its channels are marked abandoned already (by the
                // server, before the next peer could take its id).
                self.write(|s| send_msg(s, encode(PEER_GONE, id, 0), None));
                // Every worker looks (each process slot's waits on its own
                // vector).
                for b in &self.host_bells {
                    let _ = b.ring();
                }
            }
            FeedMsg::NewFeed(ours, lane) => self.start_feed(ours, lane),
            FeedMsg::Limit(mib) => {
                self.limit_mib = Some(mib);
                // A dead worker's successor gets it with its snapshot.
                self.write(|s| send_msg(s, encode_value(LIMIT, mib), None));
            }
            FeedMsg::Migrate(lane, gpu, grant) => {
                // That lane's worker alone, over its own connection.
                let fd = grant.as_ref().map(|g| g.as_raw_fd());
                self.say(lane, ((MIGRATE << 40) | i64::from(gpu), fd));
            }
            FeedMsg::CloseLane(lane) => self.close_lane(lane),
            FeedMsg::Checkpoint(lane, memfd, ahead) => {
                let keep = if ahead { CHECKPOINT_KEEP_MAPPED } else { 0 };
                let v = encode_value(CHECKPOINT, keep);
                self.say(lane, (v, Some(memfd.as_raw_fd())));
            }
            FeedMsg::Resume(lane) => self.say(lane, (RESUME << 40, None)),
            FeedMsg::IpcFd(lane, index, gen) => {
                let sent = self
                    .lanes
                    .get(&lane)
                    .map(|s| self.ipc.hand_down(s, index, gen));
                if let Some(Err(e)) = sent {
                    tracing::warn!(vm = self.name, lane, "worker feed closed: {e}");
                    self.close_lane(lane);
                }
            }
            FeedMsg::Stop => {}
        }
    }

    /// Says `msg` to lane `lane`'s worker alone; one whose feed broke
    /// loses it.
    fn say(&mut self, lane: u32, (v, fd): (i64, Option<std::os::fd::RawFd>)) {
        let failed = self.lanes.get(&lane).is_some_and(|s| {
            send_msg(s, v, fd)
                .inspect_err(|e| tracing::warn!(vm = self.name, lane, "worker feed closed: {e}"))
                .is_err()
        });
        if failed {
            self.close_lane(lane);
        }
    }

    /// Writes to every serving worker's feed; a worker that does not take
    /// it within [`FEED_SEND_TIMEOUT`] (or whose feed broke) loses its feed.
    fn write(&mut self, f: impl Fn(&UnixStream) -> Result<(), transport::Error>) {
        let failed: Vec<(u32, transport::Error)> = self
            .lanes
            .iter()
            .filter_map(|(&lane, s)| f(s).err().map(|e| (lane, e)))
            .collect();
        for (lane, e) in failed {
            // A process slot's worker ends with its process.
            tracing::debug!(vm = self.name, lane, "worker feed closed: {e}");
            self.close_lane(lane);
        }
    }

    /// Closes every worker's feed.
    fn close(&mut self) {
        let lanes: Vec<u32> = self.lanes.keys().copied().collect();
        for lane in lanes {
            self.close_lane(lane);
        }
    }

    fn close_lane(&mut self, lane: u32) {
        if let Some(old) = self.lanes.remove(&lane) {
            // For the worker, and for the thread reading its answers (which
            // holds a clone).
            let _ = old.shutdown(std::net::Shutdown::Both);
        }
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&lane);
    }

    fn start_feed(&mut self, ours: UnixStream, lane: u32) {
        self.retire_lane(lane);
        let sent = self.send_region(&ours).and_then(|()| self.send_rest(&ours));
        if let Err(e) = sent {
            tracing::warn!(vm = self.name, "worker feed failed: {e}");
            let _ = ours.shutdown(std::net::Shutdown::Both);
            return;
        }
        if self.listen_back(&ours, lane) {
            self.make_current(ours, lane);
        }
    }

    /// Reads what the worker says back on its feed until it goes: migration
    /// reports, poisoned contexts, IPC. False (the feed shut) if no thread
    /// could be started.
    fn listen_back(&self, ours: &UnixStream, lane: u32) -> bool {
        let Ok(back) = ours.try_clone() else {
            let _ = ours.shutdown(std::net::Shutdown::Both);
            return false;
        };
        let reports = self.reports.clone();
        let notes = self.notes.clone();
        let poisoned = self.poisoned.clone();
        let (ipc, tx) = (self.ipc.clone(), self.tx.clone());
        let spawned = std::thread::Builder::new()
            .name("feed-back".into())
            .spawn(move || {
                let (mut pause_us, mut kib) = (0, 0);
                while let Ok(Some((v, fd))) = recv_msg(&back) {
                    match v >> 40 {
                        k if is_ipc(k) => {
                            for (l, i, g) in ipc.heard(lane, v, fd) {
                                let _ = tx.send(FeedMsg::IpcFd(l, i, g));
                            }
                        }
                        MIGRATION_PAUSE_US => pause_us = decode_value(v),
                        MIGRATION_KIB => kib = decode_value(v),
                        MIGRATED => reports
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((lane, MigrationReport::decode(v, pause_us, kib))),
                        POISONED => poisoned.store(true, Ordering::Relaxed),
                        k @ (CHECKPOINTED | CHECKPOINT_FAILED | RESTORED) => {
                            let n = decode_value(v);
                            let note = match k {
                                CHECKPOINTED => CheckpointNote::Taken(n),
                                CHECKPOINT_FAILED => CheckpointNote::Failed(n),
                                _ => CheckpointNote::Restored(n),
                            };
                            notes
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push((lane, note));
                        }
                        _ => {}
                    }
                }
                for (l, i, g) in ipc.lane_ended(lane) {
                    let _ = tx.send(FeedMsg::IpcFd(l, i, g));
                }
            });
        if spawned.is_err() {
            let _ = ours.shutdown(std::net::Shutdown::Both);
            return false;
        }
        true
    }

    /// The snapshot's first message: the region.
    fn send_region(&self, s: &UnixStream) -> Result<(), transport::Error> {
        send_msg(s, encode(REGION, 0, 0), Some(self.fd.as_raw_fd()))
    }

    /// The rest of the snapshot: the host's doorbells, the peers, the
    /// limit, the VM's export table, then `SYNCED`.
    fn send_rest(&self, s: &UnixStream) -> Result<(), transport::Error> {
        // At most a layout's 64 vectors; the zip would stop at 16 bits.
        for (v, b) in (0..=u16::MAX).zip(&self.host_bells) {
            send_msg(s, encode(HOST_BELL, 0, v), Some(b.fd().as_raw_fd()))?;
        }
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (id, bells) in &peers {
            send_bells(s, *id, bells)?;
        }
        if let Some(mib) = self.limit_mib {
            send_msg(s, encode_value(LIMIT, mib), None)?;
        }
        send_msg(s, encode(IPC_TABLE, 0, 0), Some(self.ipc.table_fd()))?;
        send_msg(s, encode(SYNCED, 0, 0), None)
    }

    /// Lane `lane`'s worker is being replaced: its feed is closed and what
    /// it said of poisoned contexts forgotten, before its successor's
    /// snapshot ends (after that, the successor may say it too).
    fn retire_lane(&mut self, lane: u32) {
        self.close_lane(lane);
        self.poisoned.store(false, Ordering::Relaxed);
    }

    /// Makes `ours`, fed its snapshot, lane `lane`'s worker's feed (its
    /// predecessor retired already).
    fn make_current(&mut self, ours: UnixStream, lane: u32) {
        self.lanes.insert(lane, ours);
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lane);
    }
}

fn send_bells(
    sock: &UnixStream,
    id: u16,
    bells: &[Arc<EventFdBell>],
) -> Result<(), transport::Error> {
    // At most a layout's 64 vectors; the zip would stop at 16 bits.
    for (v, b) in (0..=u16::MAX).zip(bells) {
        send_msg(sock, encode(PEER_BELL, id, v), Some(b.fd().as_raw_fd()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
