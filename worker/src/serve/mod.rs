//! The vGPU worker: serves one VM's region. It owns the region, the
//! ivshmem-server socket QEMU (or a native guest) attaches to, and one
//! executor. A single thread polls every claimed channel, validates each
//! request and runs it; when every channel is idle for a bounded spin it
//! announces that it sleeps and blocks on its doorbells.
//!
//! A guest process is a session (one executor context) reached through
//! one channel per thread that uses the GPU (`sessions`); a request that
//! waits for the device is parked while the worker serves everyone else
//! (`wait`). A guest can only hurt its own channel: a corrupt ring or
//! descriptor ends that channel (its process's context is freed with its
//! last channel, and the channel reclaimed); a bad request gets an error;
//! a guest that stops reading its replies stalls only its own channel.
//!
//! | file | what |
//! | --- | --- |
//! | `channel.rs` | a channel: claims, request order, replies, teardown |
//! | `requests.rs` | what each request does |
//! | `transfer.rs` | data in chunks both ways, sliced launches |
//! | `wait.rs` | requests parked until the device is there |
//! | `sessions.rs` | guest processes and their channels |
//! | `contexts.rs` | contexts of ended processes reused; new ones rationed |
//! | `release.rs` | giving the GPU back at a slice's end, without blocking |
//! | `shared.rs` | state of all channels; grants, busy periods, launch runs |
//! | `status.rs` | `VgpuStatus`: memory, share and processes for a monitor |

mod channel;
mod contexts;
mod handoff;
mod image_cache;
mod output;
mod pinned;
mod release;
mod requests;
mod sessions;
mod shared;
mod status;
mod transfer;
mod wait;

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use protocol::DeviceInfo;
use transport::layout::Direction;
use transport::server::serve;
use transport::{ClaimState, LayoutParams, Region, SpinPolicy};

use crate::executor::Executor;
use crate::fed::{Fed, FeedStart, PeerLink};
use crate::Error;
use channel::{retire, service, wake_owner, Chan};
use sessions::Sessions;
use shared::{Shared, REPORT_EVERY};

pub use contexts::SPARES;
pub use handoff::{Figures as HandoffFigures, Handoff};
pub use output::{capture_output, log_writer, LogWriter};
pub use shared::SAMPLE_EVERY;

/// Where a worker maps its VM's pinned pool (and its guests map it too when
/// that address is free in their processes), so that a pinned pointer is
/// the same value in the guest, on the host and on the device: an address
/// far from where programs, their heaps and their libraries usually lie.
const PINNED_ADDR: usize = 0x3f00_0000_0000;

/// How often a worker whose guests wait on the device (and that has
/// nothing else to do) looks whether it is there.
const WAITING_POLL: Duration = Duration::from_micros(20);
/// How often a holder whose predicted work fills its slice looks whether
/// the device has in fact run it all (see [`Worker::recheck_budget`]).
const BUDGET_CHECK: Duration = Duration::from_micros(50);

/// Settings of one worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// VM name (for logs and the memfd name).
    pub name: String,
    /// Where the ivshmem-server socket is created.
    pub socket: PathBuf,
    /// Region layout.
    pub layout: LayoutParams,
    /// Device memory this vGPU may allocate, over all its guest processes.
    pub mem_limit: u64,
    /// Idle spinning before blocking.
    pub spin: SpinPolicy,
    /// CPU to pin the worker's serving thread to (next to the VM's vCPUs).
    pub cpu: Option<usize>,
    /// The GPU's grant service and this vGPU's (id, weight); `None`: no
    /// scheduler (the driver's own time-slicing decides).
    pub grant: Option<(PathBuf, u32, f64)>,
    /// Under the scheduler, one busy period in this many is timed on the
    /// device with CUDA events (the others are charged their host time less
    /// the learnt latency); 1 times every period.
    pub sample_every: u64,
    /// Also time every launch with events (the costly way, for comparison).
    pub time_launches: bool,
    /// Where the daemon keeps the VM's vCPU thread ids (coscheduling boost);
    /// None for guests that are not VMs.
    pub vcpus_file: Option<PathBuf>,
    /// Kernel slicing threshold in blocks (0: off); only under the scheduler.
    pub slice_blocks: u64,
    /// Bytes of module images kept by content for the vGPU's processes
    /// (see `image_cache.rs`; 0: none).
    pub image_cache: u64,
    /// The daemon's image store, shared with the other VMs' workers.
    pub image_store: Option<PathBuf>,
    /// Contexts to make ahead, before the worker is confined (an MPS
    /// client cannot make one after); if any, they are all the guest
    /// processes can use at once (see `contexts.rs`). 0: made as needed.
    pub prefill_contexts: usize,
    /// The vGPU's UUID as its guest sees it (see `identity.rs`): from the
    /// host's id and the VM's name under a daemon; from the socket's path
    /// and the name for a worker outside one.
    pub uuid: [u8; 16],
    /// The serving thread's nice value (the host CPU options' priority
    /// lift, see `hostcpu`); None leaves it as started.
    pub lift_nice: Option<i32>,
}

impl WorkerConfig {
    /// A worker of VM `name` serving `socket` with `layout` and `mem_limit`
    /// bytes of device memory; the rest as a worker outside the daemon has
    /// it: the default spin, no pinning, no scheduler, one busy period in
    /// [`SAMPLE_EVERY`] timed, no vCPUs to boost, no kernel slicing, a
    /// 64 MiB image cache of its own, contexts made as needed, a UUID from
    /// the socket's path and the name.
    pub fn new(name: &str, socket: PathBuf, layout: LayoutParams, mem_limit: u64) -> Self {
        use std::os::unix::ffi::OsStrExt as _;
        WorkerConfig {
            uuid: wire::identity::vgpu_uuid(socket.as_os_str().as_bytes(), name),
            name: name.to_owned(),
            socket,
            layout,
            mem_limit,
            spin: SpinPolicy::default(),
            cpu: None,
            grant: None,
            sample_every: SAMPLE_EVERY,
            time_launches: false,
            vcpus_file: None,
            slice_blocks: 0,
            image_cache: 64 << 20,
            image_store: None,
            prefill_contexts: 0,
            lift_nice: None,
        }
    }
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> Result<(), Error> {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|e| Error::Io {
        what: "cpu number",
        source: e.into(),
    })?;
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(|e| Error::Io {
        what: "sched_setaffinity",
        source: e.into(),
    })
}

/// Counters readable while the worker runs.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests served.
    pub requests: AtomicU64,
    /// Requests refused (bad input of any kind).
    pub refused: AtomicU64,
    /// Channels torn down because their rings were corrupt.
    pub broken_channels: AtomicU64,
    /// Channels reclaimed (any reason).
    pub reclaimed: AtomicU64,
    /// Device bytes allocated right now.
    pub mem_used: AtomicU64,
    /// GPU time charged to the scheduler so far (ns).
    pub charged_ns: AtomicU64,
    /// Busy periods charged, and their charges (ns), by how the charge was
    /// found: [first of a grant (events), other timed (events), host clock].
    pub periods: [AtomicU64; 3],
    /// See `periods`.
    pub period_charges: [AtomicU64; 3],
    /// Host time the worker spent in device-to-host copies into the
    /// response arenas (ns), and their bytes.
    pub dtoh_ns: AtomicU64,
    /// See `dtoh_ns`.
    pub dtoh_bytes: AtomicU64,
    /// Kernel launches run.
    pub launches: AtomicU64,
    /// Launches whose GPU time was measured with events.
    pub timed_launches: AtomicU64,
    /// Synchronous calls served (those that wait for the device).
    pub sync_calls: AtomicU64,
    /// Migrations to another GPU done.
    pub migrations: AtomicU64,
    /// Launches run as sub-grids (kernel slicing).
    pub sliced_launches: AtomicU64,
    /// Launches submitted in runs of two or more (queued in the ring
    /// behind one another; see [`crate::session::LaunchRun`]).
    pub batched_launches: AtomicU64,
    /// The GPU the vGPU runs on now.
    pub device: AtomicU64,
    /// Bytes of the pinned pool its guests hold.
    pub pinned_used: AtomicU64,
    /// Bytes copied between host and device (both ways, staged or pinned).
    pub copy_bytes: AtomicU64,
    /// Contexts made new for guest processes (see `contexts.rs`).
    pub contexts_created: AtomicU64,
    /// Guest processes that got an ended process's context, made clean.
    pub contexts_reused: AtomicU64,
    /// Times a new process's `Hello` waited for the context-creation rate.
    pub contexts_deferred: AtomicU64,
    /// Grants, releases and what each hand-off cost (see `handoff.rs`).
    pub handoff: Handoff,
}

impl Stats {
    fn count_contexts(&self, c: &contexts::PoolCounts) {
        self.contexts_created.store(c.created, Ordering::Relaxed);
        self.contexts_reused.store(c.reused, Ordering::Relaxed);
        self.contexts_deferred.store(c.deferred, Ordering::Relaxed);
    }
}

/// What one copy engine moves between host and device per second (PCIe 4/5
/// order of magnitude): a copy's device time, for the copy share reported
/// for phase selection (`sched::corun`).
const COPY_BYTES_PER_S: f64 = 25e9;

/// A migration being prepared on a helper thread.
struct Moving {
    gpu: u32,
    grant: Option<std::os::fd::OwnedFd>,
    rx: std::sync::mpsc::Receiver<Vec<(u64, crate::executor::Prepared)>>,
    asked: Instant,
}

/// A running worker.
pub struct Worker {
    sh: Shared,
    chans: Vec<Chan>,
    sessions: Sessions,
    /// The grant being given back: the marks its work must pass first.
    releasing: Option<release::Releasing>,
    spin: SpinPolicy,
    cpu: Option<usize>,
    lift_nice: Option<i32>,
    stop: Arc<AtomicBool>,
    moving: Option<Moving>,
    /// When [`Worker::recheck_budget`] last asked the device.
    budget_checked: Instant,
    /// The serving thread alone is confined yet: the others are, once the
    /// contexts made ahead are all made (see [`Worker::confine`]).
    confine_when_filled: bool,
    /// Confined already (a standby worker is, before it is promoted).
    confined: bool,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("channels", &self.chans.len())
            .finish()
    }
}

/// What a worker makes on the device before it serves: the region
/// registered with it (response arenas, pinned pool) and the contexts made
/// ahead. A standby worker makes it while another worker still serves.
struct Device {
    exec: Box<dyn Executor>,
    region: Region,
    pinned_map: Option<transport::shm::FixedMapping>,
    info: DeviceInfo,
    /// The device's whole memory (`info.total_mem` is the vGPU's limit).
    device_mem: u64,
    contexts: contexts::ContextPool,
    /// Connected to the daemon's image store here: a standby worker is
    /// confined (no `connect`) before it serves.
    images: image_cache::ImageCache,
}

impl Device {
    fn prepare(
        cfg: &WorkerConfig,
        exec: Box<dyn Executor>,
        region: Region,
    ) -> Result<Device, Error> {
        let mut exec = exec;
        let arenas = (0..region.channels())
            .map(|i| region.arena(i, Direction::ToGuest))
            .collect::<Result<Vec<_>, _>>()?;
        if let Err(s) = exec.register_host_memory(&arenas) {
            tracing::warn!(
                "response arenas not registered for DMA ({s:?}); copies stay correct, only slower"
            );
        }
        drop(arenas);
        let mut info: DeviceInfo = exec.info();
        info.uuid = Some(cfg.uuid);
        let pinned_size = cfg.layout.pinned_size;
        let pinned_map = if pinned_size > 0 {
            let m = region.map_pinned_at(PINNED_ADDR)?;
            info.pinned_size = pinned_size;
            info.pinned_base = match exec.register_pinned(&m.slice()) {
                Ok(base) => base,
                Err(s) => {
                    tracing::warn!(
                        "pinned pool not registered with the device ({s:?}): copies stay correct, kernels cannot reach it"
                    );
                    m.addr() as u64
                }
            };
            Some(m)
        } else {
            None
        };
        let device_mem = info.total_mem;
        let mut contexts = contexts::ContextPool::default();
        if cfg.prefill_contexts > 0 {
            contexts
                .prefill(exec.as_mut(), cfg.prefill_contexts)
                .map_err(|s| Error::Config(format!("making GPU contexts ahead: {s:?}")))?;
        }
        let images = image_cache::ImageCache::new(
            cfg.image_cache,
            cfg.image_store.as_deref().and_then(|p| {
                crate::image_client::StoreClient::connect(p)
                    .inspect_err(|e| tracing::warn!("images not shared: {e}"))
                    .ok()
            }),
        );
        Ok(Device {
            exec,
            region,
            pinned_map,
            info,
            device_mem,
            contexts,
            images,
        })
    }
}

/// The worker's connection to its GPU's grant service, if the scheduler runs.
fn connect_gate(cfg: &WorkerConfig) -> Result<Option<crate::gate::Gate>, Error> {
    match &cfg.grant {
        Some((path, id, weight)) => Ok(Some(crate::gate::Gate::connect(path, *id, *weight)?)),
        None => Ok(None),
    }
}

impl Worker {
    /// Creates the region, starts serving the socket (a worker on its own).
    pub fn new(cfg: &WorkerConfig, exec: Box<dyn Executor>) -> Result<Worker, Error> {
        let (region, fd) = Region::create(&format!("fairvgpu-{}", cfg.name), cfg.layout)?;
        let server = serve(&cfg.socket, fd, cfg.layout.vectors)?;
        let dev = Device::prepare(cfg, exec, region)?;
        Self::build(cfg, dev, PeerLink::Local(server), connect_gate(cfg)?)
    }

    /// Adopts the region the daemon feeds (see the daemon's `link`): channels
    /// whose owners' GPU state died with a previous worker become LOST, and
    /// their owners are woken to find out.
    pub fn adopt(
        cfg: &WorkerConfig,
        exec: Box<dyn Executor>,
        feed: std::os::fd::OwnedFd,
    ) -> Result<Worker, Error> {
        let (fd, fed) = Fed::receive(feed)?;
        let region = Region::adopt(fd, cfg.layout)?;
        let dev = Device::prepare(cfg, exec, region)?;
        let w = Self::build(cfg, dev, PeerLink::Fed(fed), connect_gate(cfg)?)?;
        w.wake_lost()?;
        Ok(w)
    }

    /// A standby worker (see the daemon's `mps`): maps the region the daemon
    /// feeds without touching it, registers it with the device and makes
    /// every context ahead while another worker still serves it, is
    /// confined (`confine`), tells the daemon it is ready, and waits. Once
    /// the daemon promotes it (having ended the serving worker) it adopts
    /// the region as [`Worker::adopt`] does and serves at once.
    pub fn standby(
        cfg: &WorkerConfig,
        exec: Box<dyn Executor>,
        feed: std::os::fd::OwnedFd,
        confine: bool,
    ) -> Result<Worker, Error> {
        let (fd, start) = FeedStart::receive_region(feed)?;
        let region = Region::map_existing(fd, cfg.layout)?;
        let mut dev = Device::prepare(cfg, exec, region)?;
        while !dev.contexts.filled() {
            std::thread::sleep(Duration::from_millis(5));
        }
        if confine {
            crate::sandbox::confine()?;
        }
        start.ready()?;
        tracing::info!(vm = cfg.name, "standby worker ready");
        let mut fed = start.finish()?;
        dev.region.take_over()?;
        let gate = match (&cfg.grant, fed.take_grant()) {
            (Some((_, id, weight)), Some(s)) => Some(crate::gate::Gate::over(
                std::os::unix::net::UnixStream::from(s),
                *id,
                *weight,
            )?),
            (Some(_), None) => {
                return Err(Error::Config(
                    "promoted without a connection to the grant service".into(),
                ))
            }
            (None, _) => None,
        };
        let mut w = Self::build(cfg, dev, PeerLink::Fed(fed), gate)?;
        w.confined = confine;
        w.wake_lost()?;
        Ok(w)
    }

    /// Wakes the owners of the channels whose GPU state died with the
    /// previous worker, to find out.
    fn wake_lost(&self) -> Result<(), Error> {
        let w = self;
        for ch in 0..w.sh.port.region.channels() {
            if w.sh.port.region.claim_state(ch)? == ClaimState::Lost {
                tracing::warn!(
                    channel = ch,
                    "its GPU state died with the previous worker; its guest must claim again"
                );
                wake_owner(&w.sh.port, ch);
            }
        }
        Ok(())
    }

    fn build(
        cfg: &WorkerConfig,
        dev: Device,
        link: PeerLink,
        gate: Option<crate::gate::Gate>,
    ) -> Result<Worker, Error> {
        let Device {
            exec,
            region,
            pinned_map,
            info,
            device_mem,
            contexts,
            images,
        } = dev;
        let mut info = info;
        let pinned_size = cfg.layout.pinned_size;
        let mem_limit = cfg.mem_limit.min(device_mem);
        info.total_mem = mem_limit;
        let chans = (0..region.channels())
            .map(|i| Ok(Chan::new(region.host_channel(i)?)))
            .collect::<Result<Vec<_>, transport::Error>>()?;
        let chunk = (cfg.layout.arena_size as usize / 4).max(4096);
        let stats: Arc<Stats> = Arc::default();
        stats
            .device
            .store(u64::from(exec.device()), Ordering::Relaxed);
        let worker = Worker {
            sh: Shared {
                gpu: shared::Gpu {
                    exec,
                    pinned_map,
                    pinned: {
                        let mut p = pinned::PinnedPool::new(pinned_size);
                        p.set_device_base(info.pinned_base);
                        p
                    },
                    images,
                    contexts,
                    sm_count: info.sm_count.max(1),
                },
                tables: shared::Tables::default(),
                port: shared::Port {
                    region,
                    link,
                    info_bytes: info.to_bytes(),
                    chunk,
                    stats: stats.clone(),
                    booster: std::cell::RefCell::new(crate::cosched::VcpuBooster::new(
                        cfg.vcpus_file.clone(),
                    )),
                    log: std::cell::RefCell::new(transport::LogLimiter::default()),
                    output: std::cell::RefCell::new(output::Output::new()),
                    poisoned: std::cell::Cell::new(None),
                },
                mem: shared::Memory {
                    mem_limit,
                    device_mem,
                    used: 0,
                    stats: stats.clone(),
                },
                slice: shared::Slice {
                    gate,
                    grant_id: cfg.grant.as_ref().map(|g| (g.1, g.2)),
                    slice_blocks: cfg.slice_blocks,
                    time_launches: cfg.time_launches,
                    charged_ns: 0,
                    issued_ns: 0,
                    meter: sched::accounting::PeriodMeter::new(cfg.sample_every),
                    params: Vec::new(),
                    period_grant: 0,
                    worked: false,
                    budget_spent: false,
                    releasing: false,
                    stats,
                },
                figures: shared::Figures::default(),
            },
            chans,
            sessions: Sessions::default(),
            releasing: None,
            spin: cfg.spin,
            cpu: cfg.cpu,
            lift_nice: cfg.lift_nice,
            stop: Arc::default(),
            moving: None,
            budget_checked: Instant::now(),
            confine_when_filled: false,
            confined: false,
        };
        let counts = worker.sh.gpu.contexts.counts;
        worker.sh.port.stats.count_contexts(&counts);
        Ok(worker)
    }

    /// Confines the worker (`crate::sandbox`) from the thread that will
    /// run it. While contexts are still being made ahead on a thread of
    /// their own (an MPS client must connect to its server for each), only
    /// this thread is confined now, and every thread once they are all
    /// made (the serving loop looks when it reads the clock).
    pub fn confine(&mut self) -> Result<(), Error> {
        if self.confined {
            return Ok(()); // a standby, before it was promoted
        }
        if self.sh.gpu.contexts.filled() {
            return crate::sandbox::confine();
        }
        crate::sandbox::confine_thread()?;
        self.confine_when_filled = true;
        Ok(())
    }

    /// A flag that stops [`Worker::run`] when set.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// The worker's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.sh.port.stats.clone()
    }

    /// Serves until the stop flag is set. Everything guests held is freed on return.
    pub fn run(mut self) -> Result<(), Error> {
        let served = self.serve();
        // However serving ended (stopped, orphaned, poisoned, or an error
        // such as the grant service gone with the daemon), guests still
        // holding channels lose their GPU state: their channels become LOST
        // (not FREE, which would let another guest claim rings the owner may
        // still write), and their owners are woken to see it.
        for c in &mut self.chans {
            retire(&mut self.sh, c, &mut self.sessions);
        }
        match self.sh.port.poisoned.get() {
            Some(status) => Err(Error::Poisoned(status)),
            None => served,
        }
    }

    /// The serving loop of [`Worker::run`].
    fn serve(&mut self) -> Result<(), Error> {
        if let Some(cpu) = self.cpu {
            pin_current_thread(cpu)?;
        }
        if let Some(nice) = self.lift_nice {
            // Refused (no CAP_SYS_NICE): it serves as it was started.
            if let Err(e) = crate::cosched::lift_current_thread(nice) {
                tracing::warn!("worker: priority lift refused: {e}");
            }
        }
        let mut idle: u32 = 0;
        let mut last_report = Instant::now();
        let mut turns: u32 = 0;
        let mut poisoned_at = None::<Instant>;
        while !self.stop.load(Ordering::Relaxed) && !self.sh.port.link.orphaned() {
            if self.sh.port.poisoned.get().is_some() {
                // The fault's process may still take what its kernels
                // printed (the failed assert's message): a moment for it,
                // no more (every other request now fails).
                let since = *poisoned_at.get_or_insert_with(Instant::now);
                if !self.sh.port.output.borrow().any_held() || since.elapsed() > POISON_GRACE {
                    self.sh.port.link.report_poisoned();
                    break;
                }
            }
            if let Some((gpu, grant)) = self.sh.port.link.take_migration() {
                self.start_migration(gpu, grant)?;
            }
            if let Some(p) = self.moving.as_ref() {
                if let Ok(prepared) = p.rx.try_recv() {
                    let p = self.moving.take().expect("checked above");
                    tracing::debug!(
                        prepare_ms = p.asked.elapsed().as_secs_f64() * 1e3,
                        "migration prepared"
                    );
                    self.migrate(p.gpu, p.grant, prepared)?;
                }
            }
            self.peer_events();
            // Reading the clock on every turn of the polling loop would cost
            // more than the reports themselves: look every 256 turns (and
            // after blocking, below).
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(256) {
                self.periodic(&mut last_report)?;
            }
            let mut busy = false;
            for c in &mut self.chans {
                busy |= service(&mut self.sh, c, &mut self.sessions);
            }
            self.recheck_budget();
            if self.releasing.is_some() {
                if self.poll_release()? {
                    idle = 0;
                    continue;
                }
            } else if self.sh.slice.slice_ended() {
                self.sh.slice.budget_spent = false;
                // A vGPU whose slice ran out while it was running work stays
                // runnable even if its ring is momentarily empty (its guest is
                // between a reply and its next call): reporting it idle would
                // reset its start tag and forfeit the credit it has.
                let active = self.sh.slice.worked;
                self.begin_release(active)?;
                idle = 0;
                continue;
            }
            if busy {
                idle = 0;
                continue;
            }
            // A grant can arrive while there is nothing to run (the vGPU was
            // still queued): take it, so that the idle spin above returns it.
            if let Some(g) = self.sh.slice.gate.as_mut() {
                if !g.holding() && g.wanted() && idle.is_multiple_of(64) {
                    g.acquire(Duration::ZERO)?;
                }
            }
            idle += 1;
            if idle < self.spin.spins / 16 {
                std::hint::spin_loop();
                continue;
            }
            if self.releasing.is_some()
                || self.sh.slice.budget_spent
                || self.chans.iter().any(Chan::waiting)
                || self.sessions.host_fn_pending()
            {
                // A guest waits for the device, which still runs its work:
                // the vGPU keeps the GPU, and the worker looks again soon
                // (without spinning the core through a long kernel).
                if self.releasing.is_some() {
                    Handoff::add(&self.sh.port.stats.handoff.drain_sleeps, 1);
                }
                std::thread::sleep(WAITING_POLL);
                if idle.is_multiple_of(256) {
                    self.periodic(&mut last_report)?;
                }
                continue;
            }
            if self.sh.slice.gate.as_ref().is_some_and(|g| g.holding()) {
                // Work-conserving: a holder with nothing to run yields after its spin.
                Handoff::add(&self.sh.port.stats.handoff.idle_releases, 1);
                self.release_grant(false)?;
                idle = 0;
                continue;
            }
            self.block()?;
            self.periodic(&mut last_report)?;
            idle = 0;
        }
        if self.sh.slice.gate.as_ref().is_some_and(|g| g.holding()) {
            self.release_grant(false)?;
        }
        Ok(())
    }

    /// What the serving loop does when it looks at the clock: report, and
    /// let the coscheduling booster undo boosts and re-read its vCPU file.
    fn periodic(&mut self, last_report: &mut Instant) -> Result<(), Error> {
        if self.confine_when_filled && self.sh.gpu.contexts.filled() {
            crate::sandbox::confine()?;
            self.confine_when_filled = false;
            tracing::info!("contexts made ahead; every thread confined");
        }
        self.maybe_report(last_report)?;
        let sync = self.sh.port.stats.sync_calls.load(Ordering::Relaxed);
        self.sh.port.booster.borrow_mut().tick(sync);
        Ok(())
    }

    /// Reports if [`REPORT_EVERY`] has passed since `last` (and there is a
    /// scheduler to report to).
    fn maybe_report(&mut self, last: &mut Instant) -> Result<(), Error> {
        if self.sh.slice.gate.is_none() || last.elapsed() < REPORT_EVERY {
            return Ok(());
        }
        *last = Instant::now();
        self.report()
    }

    /// Tells the grant service the live figures the operator sees.
    fn report(&mut self) -> Result<(), Error> {
        let queued: u64 = self
            .chans
            .iter()
            .map(|c| u64::from(c.host.req.pending().unwrap_or(0)))
            .sum();
        let (rss_bytes, open_fds) = crate::procfs::own_usage();
        let (num, den) = std::mem::take(&mut self.sh.figures.occupancy);
        if den > 0.0 {
            self.sh.figures.last_occupancy = num / den;
        }
        // The share of its device work since the last report that was
        // copies: their time at a copy engine's rate against that and its
        // kernels' estimated time (`den`, ns). A guest that only copies is
        // at 1 however fast its copies go through the rings.
        let bytes = self.sh.port.stats.copy_bytes.load(Ordering::Relaxed);
        let b0 = std::mem::replace(&mut self.sh.figures.copy_mark, bytes);
        let copy_ns = bytes.saturating_sub(b0) as f64 / COPY_BYTES_PER_S * 1e9;
        let copy_share = if copy_ns > 0.0 {
            copy_ns / (copy_ns + den)
        } else {
            0.0
        };
        let st = &self.sh.port.stats;
        let r = wire::grant::Report {
            mem_used: st.mem_used.load(Ordering::Relaxed),
            sync_calls: st.sync_calls.load(Ordering::Relaxed),
            queued,
            launches: st.launches.load(Ordering::Relaxed),
            requests: st.requests.load(Ordering::Relaxed),
            refused: st.refused.load(Ordering::Relaxed),
            rss_bytes,
            open_fds,
            occupancy_ppm: (self.sh.figures.last_occupancy * 1e6).round() as u64,
            sliced_launches: st.sliced_launches.load(Ordering::Relaxed),
            log_suppressed: self.sh.port.log.borrow().suppressed(),
            contexts_created: st.contexts_created.load(Ordering::Relaxed),
            contexts_reused: st.contexts_reused.load(Ordering::Relaxed),
            copy_ppm: (copy_share * 1e6).round() as u64,
        };
        if let Some(g) = self.sh.slice.gate.as_mut() {
            g.report(&r)?;
        }
        Ok(())
    }

    /// Starts a move to GPU `gpu`: what can be done ahead (the target's
    /// contexts and modules) is done on a helper thread while the guests go
    /// on here; [`Worker::migrate`] follows when it is ready.
    fn start_migration(
        &mut self,
        gpu: u32,
        grant: Option<std::os::fd::OwnedFd>,
    ) -> Result<(), Error> {
        if self.moving.is_some() {
            tracing::warn!(to = gpu, "a migration is under way already; ignored");
            return Ok(());
        }
        // A vGPU that cannot move is refused at once (`migrate` says why).
        let kept = self
            .sessions
            .iter_mut()
            .any(|(_, e)| e.s.migration_keeper_to(gpu).is_some());
        let jobs: Vec<(u64, crate::executor::PrepareJob)> = if kept {
            Vec::new()
        } else {
            self.sessions
                .iter_mut()
                .filter_map(|(_, e)| Some((e.s.id, e.s.ctx.prepare_migration(gpu)?)))
                .collect()
        };
        if jobs.is_empty() {
            return self.migrate(gpu, grant, Vec::new());
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("migration-prepare".into())
            .spawn(move || {
                let done: Vec<_> = jobs
                    .into_iter()
                    .filter_map(|(id, job)| job().ok().map(|p| (id, p)))
                    .collect();
                let _ = tx.send(done);
            })
            .map_err(|source| Error::Io {
                what: "spawning migration helper",
                source,
            })?;
        self.moving = Some(Moving {
            gpu,
            grant,
            rx,
            asked: Instant::now(),
        });
        Ok(())
    }

    /// Moves every context to GPU `gpu` between two requests (a kernel
    /// boundary: what was submitted finishes on the source, what waits in
    /// the rings runs on the target), registers at the target's grant
    /// service over `grant`, and tells the daemon how it went. If a context
    /// cannot move, those already moved go back and the vGPU stays.
    fn migrate(
        &mut self,
        gpu: u32,
        grant: Option<std::os::fd::OwnedFd>,
        prepared: Vec<(u64, crate::executor::Prepared)>,
    ) -> Result<(), Error> {
        let mut prepared: std::collections::HashMap<u64, crate::executor::Prepared> =
            prepared.into_iter().collect();
        let t0 = Instant::now();
        let from = self.sh.gpu.exec.device();
        // An object no GPU but this one can hold keeps the vGPU here,
        // refused before anything moves.
        let kept_by = self
            .sessions
            .iter_mut()
            .find_map(|(_, e)| e.s.migration_keeper_to(gpu));
        if kept_by.is_none() {
            // Events are made anew wherever the contexts end up: the
            // handles other processes opened name the old ones.
            self.sh.tables.ipc_events.revoke_all();
        }
        if self.sh.slice.gate.as_ref().is_some_and(|g| g.holding()) {
            self.release_grant(true)?;
        }
        // Waits on the source are over now that its work is drained.
        for c in &mut self.chans {
            if let Some(e) = c.session.and_then(|id| self.sessions.get_mut(id)) {
                wait::poll(&mut self.sh, c, &mut e.s)?;
            }
        }
        let mut moved: Vec<u64> = Vec::new();
        let mut bytes = 0u64;
        let mut failed = None;
        if let Some(k) = kept_by {
            failed = Some(protocol::Status::NotSupported);
            tracing::warn!(
                to = gpu,
                "migration to GPU {gpu} refused: a guest process holds {k}, which cannot \
                 move; the vGPU stays on GPU {from}"
            );
        }
        for (_, e) in self.sessions.iter_mut() {
            if failed.is_some() {
                break;
            }
            let s = &mut e.s;
            // What was prepared for this very session (not for an earlier
            // one with the same channels).
            let ahead = prepared.remove(&s.id);
            match s.ctx.migrate(gpu, ahead) {
                Ok(m) => {
                    bytes += m.bytes;
                    moved.push(s.id);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let ok = failed.is_none() && self.sh.gpu.exec.set_device(gpu).is_ok();
        if !ok {
            for (_, e) in self.sessions.iter_mut() {
                let s = &mut e.s;
                if moved.contains(&s.id) {
                    if let Err(err) = s.ctx.migrate(from, None) {
                        s.defer(err);
                    }
                }
            }
            if kept_by.is_none() {
                tracing::warn!(
                    to = gpu,
                    "migration to GPU {gpu} failed ({}); the vGPU stays on GPU {from}",
                    failed.map_or_else(|| "the target refused".to_owned(), |e| format!("{e:?}"))
                );
            }
        }
        if ok {
            if let (Some(fd), Some((id, weight))) = (grant, self.sh.slice.grant_id) {
                // The source's service forgets the vGPU when this closes.
                self.sh.slice.gate = Some(crate::gate::Gate::over(
                    std::os::unix::net::UnixStream::from(fd),
                    id,
                    weight,
                )?);
            }
            // Spare contexts are on the GPU the vGPU left.
            self.sh.gpu.contexts.clear();
            self.sh
                .port
                .stats
                .migrations
                .fetch_add(1, Ordering::Relaxed);
            self.sh
                .port
                .stats
                .device
                .store(u64::from(gpu), Ordering::Relaxed);
        }
        let report = wire::feed::MigrationReport {
            gpu: if ok { gpu } else { from },
            moved: ok,
            pause_us: t0.elapsed().as_micros() as u64,
            kib: bytes.div_ceil(1024),
            kept_by: if ok { None } else { kept_by },
            failed: if ok || kept_by.is_some() {
                None
            } else {
                Some(failed.unwrap_or(protocol::Status::NotSupported))
            },
        };
        tracing::info!(
            from,
            to = gpu,
            ok,
            pause_us = report.pause_us,
            kib = report.kib,
            "migration"
        );
        self.sh.port.link.report_migration(&report);
        Ok(())
    }

    fn peer_events(&mut self) {
        for peer in self.sh.port.link.departed() {
            // A native guest process (or a whole VM) went away: its channels are orphans.
            for ch in 0..self.sh.port.region.channels() {
                if self.sh.port.region.owner_peer(ch).ok() == Some(u32::from(peer)) {
                    let _ = self.sh.port.region.mark_abandoned(ch);
                }
            }
        }
    }

    /// What the holder issued is predicted from its kernels' estimated
    /// times (`Shared::slice_filled`), and an estimate can run ahead of the
    /// device (matrixMul's did on an H100: its 300 launches waited for an
    /// extension while the device idled, 0.71 of native). Once the device
    /// has run everything while the prediction says the slice is full,
    /// nothing is queued ahead, so the slice's budget is what the clock
    /// leaves: a lone holder issues on instead of its device idling until
    /// the extension. (A contended holder gives the GPU back in the turn
    /// its prediction fills the slice, so this rarely reaches it.)
    fn recheck_budget(&mut self) {
        if !self.sh.slice.budget_spent || self.budget_checked.elapsed() < BUDGET_CHECK {
            return;
        }
        self.budget_checked = Instant::now();
        let Some(held) = self
            .sh
            .slice
            .gate
            .as_ref()
            .filter(|g| g.holding())
            .map(|g| g.held_ns())
        else {
            return;
        };
        if self.sessions.device_idle() {
            self.sh.slice.issued_ns = held;
            self.sh.slice.budget_spent = false;
        }
    }

    fn block(&mut self) -> Result<(), Error> {
        let region = self.sh.port.region.clone();
        let flag = region.host_sleeping()?;
        flag.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let mut busy = false;
        for c in &mut self.chans {
            busy |= service(&mut self.sh, c, &mut self.sessions);
        }
        if !busy {
            let bells = self.sh.port.link.host_bells();
            let mut fds: Vec<PollFd<'_>> = bells
                .iter()
                .map(|b| PollFd::new(b.fd().as_fd(), PollFlags::POLLIN))
                .collect();
            // A grant arriving wakes the worker too.
            if let Some(g) = self.sh.slice.gate.as_ref().filter(|g| g.wanted()) {
                fds.push(PollFd::new(g.fd(), PollFlags::POLLIN));
            }
            let ms = (self.spin.max_block_us / 1000).clamp(1, 1000) as u16;
            let _ = poll(&mut fds, PollTimeout::from(ms));
            for b in bells {
                let mut buf = [0u8; 8];
                let _ = nix::unistd::read(b.fd().as_fd(), &mut buf);
            }
        }
        flag.store(0, Ordering::Relaxed);
        Ok(())
    }
}

/// A worker running on a thread of this process: its stop flag, counters and thread.
#[derive(Debug)]
pub struct Running {
    /// Set to stop the worker.
    pub stop: Arc<AtomicBool>,
    /// Its counters.
    pub stats: Arc<Stats>,
    /// The thread.
    pub thread: std::thread::JoinHandle<Result<(), Error>>,
}

impl Running {
    /// Stops the worker and waits for it.
    pub fn shutdown(self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(Ok(()))
    }
}

/// Runs a worker on its own thread (tests, benches).
pub fn spawn(cfg: &WorkerConfig, exec: Box<dyn Executor>) -> Result<Running, Error> {
    let w = Worker::new(cfg, exec)?;
    let (stop, stats) = (w.stop_flag(), w.stats());
    let thread = std::thread::Builder::new()
        .name(format!("worker-{}", cfg.name))
        .spawn(move || w.run())
        .map_err(|e| Error::Io {
            what: "spawning worker thread",
            source: e,
        })?;
    Ok(Running {
        stop,
        stats,
        thread,
    })
}

/// Default region layout for workers.
pub fn default_layout() -> LayoutParams {
    LayoutParams::default()
}

/// How long to wait for a worker's socket to appear.
pub const SOCKET_WAIT: Duration = Duration::from_secs(10);

/// How long a poisoned worker goes on serving so that its processes can
/// take the kernel output they are owed (see `output.rs`).
const POISON_GRACE: Duration = Duration::from_millis(200);
