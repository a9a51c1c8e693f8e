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
//! | `setup.rs` | set-up: the device prepared; a worker alone, or taking over its slot |
//! | `serving.rs` | the serving loop: channels polled, the grant, sleeping on doorbells |
//! | `migration.rs` | every context moved to another GPU between two requests |
//! | `report.rs` | the counters, and the live figures reported to the grant service |
//! | `channel.rs` | a channel: claims, request order, replies, teardown |
//! | `requests/` | what each request does, one file per driver-API family |
//! | `transfer.rs` | data in chunks both ways, sliced launches |
//! | `wait.rs` | requests parked until the device is there |
//! | `sessions.rs` | guest processes and their channels |
//! | `contexts.rs` | contexts of ended processes reused; new ones rationed |
//! | `release.rs` | giving the GPU back at a slice's end, without blocking |
//! | `shared.rs` | the state of all channels, by what it holds: device, memory, grant and busy periods, export tables, figures |
//! | `status.rs` | `VgpuStatus`: memory, share and processes for a monitor |

mod channel;
mod checkpoint;
mod contexts;
mod handoff;
mod image_cache;
mod migration;
mod output;
mod pinned;
mod release;
mod report;
mod requests;
mod serving;
mod sessions;
mod setup;
mod shared;
mod stage;
mod status;
mod transfer;
mod wait;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use transport::{LayoutParams, SpinPolicy};

use crate::executor::Executor;
use crate::Error;
use channel::ChannelState;
use sessions::Sessions;
use shared::Shared;

pub use checkpoint::{fits, CheckpointError, Handover, Order, Orders};
pub use contexts::SPARES;
pub use handoff::{Figures as HandoffFigures, Handoff};
pub use output::{capture_output, log_writer, LogWriter};
pub use report::Stats;
pub use serving::TIMER_SLACK_NS;
pub use setup::Warm;
pub use shared::SAMPLE_EVERY;

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
    /// Where the daemon keeps the VM's vCPU thread ids (coscheduling boost,
    /// and whether a late guest waits for a CPU); None for guests that are
    /// not VMs.
    pub vcpus_file: Option<PathBuf>,
    /// Whether the worker kicks (briefly boosts) the vCPU thread of a
    /// sleeping interactive guest it wakes; off, the vCPU threads are only
    /// read (the daemon turns it off where its vCPU lift owns the threads'
    /// nice values).
    pub vcpu_kick: bool,
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
    /// Contexts to make at the start for its first processes, without
    /// limiting later ones (a process slot's worker's, for the slot's next
    /// process; see `contexts.rs`); unused where `prefill_contexts` is
    /// set.
    pub warm_contexts: usize,
    /// The vGPU's UUID as its guest sees it (see `identity.rs`): from the
    /// host's id and the VM's name under a daemon; from the socket's path
    /// and the name for a worker outside one.
    pub uuid: [u8; 16],
    /// The serving thread's nice value (the host CPU options' priority
    /// lift, see `hostcpu`); None leaves it as started.
    pub lift_nice: Option<i32>,
    /// The real-time lift (`[daemon] realtime`): the serving thread in
    /// `SCHED_FIFO` while it holds a grant another vGPU waits for.
    pub realtime: bool,
    /// Set when this worker is one of several serving its vGPU (a worker
    /// per guest process): the memfd of the vGPU's memory ledger they all
    /// count in (`ledger.rs`); its gate then registers as a member of the
    /// vGPU, which shares one place in the GPU's queue
    /// (`wire::grant::MEMBER`). None: the vGPU's one worker.
    pub shared_vgpu: Option<Arc<std::os::fd::OwnedFd>>,
    /// The process slot this worker serves where the region's channels are
    /// split into them (`LayoutParams::partitions`): its channels alone,
    /// one guest process at a time, its own doorbell vector and host-sleeping
    /// word; the pinned pool's chunks it holds are marked with it in the
    /// VM's ledger. None: every channel.
    pub slot: Option<u32>,
    /// A process slot's worker that ends with its process: once no
    /// session is open and its slot's channels are all free it marks its
    /// host end asleep, looks once more, and returns from `run` (the
    /// daemon binds a new worker when a process claims the slot again).
    pub ends_with_process: bool,
}

impl WorkerConfig {
    /// The channels this worker serves: its process slot's, or all.
    pub fn served(&self) -> Result<std::ops::Range<u32>, Error> {
        let layout = transport::layout::Layout::new(self.layout)?;
        Ok(match self.slot {
            Some(k) if k < self.layout.partitions => layout.partition_channels(k),
            Some(k) => return Err(Error::NoSuchSlot(k, self.layout.partitions)),
            None => 0..self.layout.channels,
        })
    }

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
            vcpu_kick: true,
            slice_blocks: 0,
            image_cache: 64 << 20,
            image_store: None,
            prefill_contexts: 0,
            warm_contexts: 0,
            lift_nice: None,
            realtime: false,
            shared_vgpu: None,
            slot: None,
            ends_with_process: false,
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

/// A running worker.
pub struct Worker {
    sh: Shared,
    chans: Vec<ChannelState>,
    sessions: Sessions,
    /// The grant being given back: the marks its work must pass first.
    releasing: Option<release::Releasing>,
    spin: SpinPolicy,
    cpu: Option<usize>,
    lift_nice: Option<i32>,
    stop: Arc<AtomicBool>,
    moving: Option<migration::Moving>,
    /// When [`Worker::recheck_budget`] last asked the device.
    budget_checked: Instant,
    /// Since when a lone holder has had nothing to run (see
    /// [`Worker::keep_alone`]), or, with no scheduler, the worker (see
    /// [`Worker::light_sleep`]).
    lone_idle_since: Option<Instant>,
    /// When the serving loop last found a call to serve (see
    /// `Worker::late_guest`).
    last_call: Option<Instant>,
    /// Since when the worker's sleeps have all ended by their timeout
    /// (see [`Worker::block`]).
    quiet_since: Option<Instant>,
    /// The serving thread alone is confined yet: the others are, once the
    /// contexts made ahead are all made (see [`Worker::confine`]).
    confine_when_filled: bool,
    /// See [`WorkerConfig::ends_with_process`].
    ends_with_process: bool,
    /// Checkpoint orders (`checkpoint.rs`).
    orders: Arc<checkpoint::Orders>,
    /// The checkpoint being taken, once every channel is between requests.
    taking: Option<checkpoint::Taking>,
    /// The memfd a checkpoint sent ahead was written into, mapped for the
    /// handover's (dropped once stale, `periodic`).
    kept_map: Option<crate::checkpoint::KeptMap>,
    /// Where the region goes once the loop ends, to the worker that serves
    /// on from the checkpoint (its channels are not retired).
    handing_over: Option<std::sync::mpsc::Sender<checkpoint::Handover>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("channels", &self.chans.len())
            .finish()
    }
}

impl Worker {
    /// A flag that stops [`Worker::run`] when set.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// The doorbells the worker sleeps on: ringing one wakes it (after
    /// setting the stop flag, for one).
    pub fn wake_bells(&self) -> Vec<Arc<transport::EventFdBell>> {
        self.sh.port.link.host_bells().to_vec()
    }

    /// The worker's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.sh.port.stats.clone()
    }
}

/// A worker running on a thread of this process: its stop flag, counters,
/// thread, and where its checkpoint orders go.
#[derive(Debug)]
pub struct Running {
    /// Set to stop the worker.
    pub stop: Arc<AtomicBool>,
    /// Its counters.
    pub stats: Arc<Stats>,
    /// The thread.
    pub thread: std::thread::JoinHandle<Result<(), Error>>,
    orders: Arc<Orders>,
    /// Rung after an order, so that a sleeping worker takes it at once.
    wake: Vec<Arc<transport::EventFdBell>>,
}

impl Running {
    /// Stops the worker and waits for it.
    pub fn shutdown(self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(Ok(()))
    }

    fn order(&self, o: Order) {
        use transport::Bell as _;
        self.orders.send(o);
        for b in &self.wake {
            let _ = b.ring();
        }
    }

    /// Holds the vGPU and takes its checkpoint, waiting up to `wait` for
    /// the requests under way; the worker stays held until
    /// [`Running::resume`] or [`Running::hand_over`].
    pub fn checkpoint(
        &self,
        wait: Duration,
    ) -> Result<crate::checkpoint::VgpuImage, CheckpointError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.order(Order::Checkpoint(wait, tx));
        rx.recv().unwrap_or(Err(CheckpointError::HandingOver))
    }

    /// Goes on serving after a checkpoint that is not used.
    pub fn resume(&self) {
        self.order(Order::Resume);
    }

    /// Ends the worker without retiring its channels; the region and link
    /// for the worker that serves on ([`spawn_over`]).
    pub fn hand_over(self) -> Result<Handover, Error> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.order(Order::HandOver(tx));
        let handover = rx.recv();
        // Everything else of the worker (its pinned pool's mapping among
        // it) is gone once its thread is.
        self.thread.join().unwrap_or(Ok(()))?;
        handover.map_err(|_| CheckpointError::HandingOver.into())
    }
}

/// Runs `w` on its own thread.
fn run_on_thread(name: &str, w: Worker) -> Result<Running, Error> {
    let (stop, stats, orders, wake) = (w.stop_flag(), w.stats(), w.orders(), w.wake_bells());
    let thread = std::thread::Builder::new()
        .name(format!("worker-{name}"))
        .spawn(move || w.run())
        .map_err(|e| Error::Io {
            what: "spawning worker thread",
            source: e,
        })?;
    Ok(Running {
        stop,
        stats,
        thread,
        orders,
        wake,
    })
}

/// Runs a worker on its own thread (tests, benches).
pub fn spawn(cfg: &WorkerConfig, exec: Box<dyn Executor>) -> Result<Running, Error> {
    run_on_thread(&cfg.name, Worker::new(cfg, exec)?)
}

/// Runs a worker on its own thread that serves on from `image` over the
/// region `handover` (see [`Worker::take_over`]).
pub fn spawn_over(
    cfg: &WorkerConfig,
    exec: Box<dyn Executor>,
    handover: Handover,
    image: &crate::checkpoint::VgpuImage,
) -> Result<Running, Error> {
    run_on_thread(&cfg.name, Worker::take_over(cfg, exec, handover, image)?)
}

/// Default region layout for workers.
pub fn default_layout() -> LayoutParams {
    LayoutParams::default()
}

/// How long to wait for a worker's socket to appear.
pub const SOCKET_WAIT: Duration = Duration::from_secs(10);
