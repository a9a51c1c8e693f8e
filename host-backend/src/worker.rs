//! The vGPU worker: serves one VM's region. It owns the region, the
//! ivshmem-server socket QEMU (or a native guest) attaches to, and one
//! executor. A single thread polls every claimed channel, validates each
//! request and runs it; when every channel is idle for a bounded spin it
//! announces that it sleeps and blocks on its doorbells.
//!
//! A guest can only hurt its own channel: a corrupt ring or descriptor ends
//! that channel (its context is freed and the channel reclaimed); a bad
//! request gets an error; a guest that stops reading its replies stalls only
//! its own channel.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use protocol::{op, DeviceInfo, ImageKind, Reply, Request, Status, INLINE};
use qemu_ivshmem::layout::Direction;
use qemu_ivshmem::server::serve;
use qemu_ivshmem::{
    ClaimState, Descriptor, HostChannel, LayoutParams, Region, SpinPolicy, FLAG_MORE,
};

use crate::executor::{Executor, Handle, Launch};
use crate::link::{Fed, PeerLink};
use crate::session::Session;
use crate::Error;

/// Requests served per channel before moving to the next (fairness between channels).
const BATCH: usize = 64;
/// Largest chunk of a device-to-host copy streamed through the arena.
const DTOH_CHUNK: usize = 1 << 20;
/// Longest kernel name accepted.
const MAX_NAME: u32 = 4096;

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
}

enum Inbound {
    Htod {
        dst: u64,
        stream: u64,
        ok: bool,
    },
    Module {
        kind: ImageKind,
        buf: Vec<u8>,
        tag: u64,
    },
    Link {
        buf: Vec<u8>,
        tag: u64,
    },
}

struct Transfer {
    inbound: Inbound,
    remaining: u64,
    offset: u64,
}

struct Outbound {
    tag: u64,
    src: u64,
    len: u64,
    off: u64,
    stream: u64,
}

/// A sliced launch with sub-grids still to issue.
struct Sliced {
    func: u64,
    block: protocol::Dim3,
    y: u32,
    z: u32,
    smem: u32,
    stream: u64,
    params: Vec<u8>,
    grid_x: u32,
    rest: std::collections::VecDeque<scheduler::slicing::SubGrid>,
}

struct Chan {
    host: HostChannel,
    session: Option<Session>,
    /// A launch being issued sub-grid by sub-grid (kernel slicing); the
    /// channel's next requests wait for it, to keep their order.
    sliced: Option<Sliced>,
    transfer: Option<Transfer>,
    outbound: Option<Outbound>,
    outbox: Option<(Descriptor, Vec<u8>)>,
    log_budget: u32,
}

/// State shared by all channels of the worker.
struct Shared {
    // Declared first so it is dropped first: it may hold DMA registrations
    // of the region's memory.
    exec: Box<dyn Executor>,
    region: Region,
    link: PeerLink,
    info_bytes: Vec<u8>,
    mem_limit: u64,
    /// The device's own memory.
    device_mem: u64,
    mem_used: u64,
    stats: Arc<Stats>,
    chunk: usize,
    gate: Option<crate::grant::Gate>,
    /// GPU time measured under the current grant (busy periods).
    charged_ns: u64,
    /// GPU time issued under the current grant, by the kernels' estimates:
    /// what says whether more work fits in the slice.
    issued_ns: u64,
    /// Times busy periods (see `scheduler::accounting::PeriodMeter`).
    meter: scheduler::accounting::PeriodMeter,
    /// A launch's parameter bytes (reused).
    params: Vec<u8>,
    /// The grant under which the last period opened.
    period_grant: u64,
    time_launches: bool,
    /// Whether any request ran under the current grant.
    worked: bool,
    /// The VM's vCPU threads, kicked when a blocked guest is woken.
    booster: std::cell::RefCell<crate::cosched::VcpuBooster>,
    /// A sticky CUDA error: every context of this process is unusable.
    poisoned: std::cell::Cell<Option<Status>>,
    /// This vGPU's id and weight at the grant services (to register at
    /// another GPU's after a migration).
    grant_id: Option<(u32, f64)>,
    /// Multiprocessors of the GPU.
    sm_count: u32,
    /// Kernel slicing threshold (0: off).
    slice_blocks: u64,
    /// The sub-grids issued under the current grant fill its slice: give
    /// the GPU back once they are done, whatever the clock says.
    budget_spent: bool,
    /// Since the last report: sum of (occupied fraction x kernel time) and
    /// of kernel time, over launches.
    occupancy: (f64, f64),
    /// Mean occupied fraction over the last report's launches (kept while
    /// there are none).
    last_occupancy: f64,
}

/// How often a worker reports its live figures to the grant service.
const REPORT_EVERY: Duration = Duration::from_millis(200);

/// By default, one busy period in this many is timed on the device.
pub const SAMPLE_EVERY: u64 = 8;

impl Shared {
    /// The device memory this vGPU may hold now: the daemon's live setting
    /// if it made one, else the config's (never more than the device has).
    fn limit(&self) -> u64 {
        self.link
            .memory_limit()
            .map_or(self.mem_limit, |l| l.min(self.device_mem))
    }

    /// Collects the measured times of timed launches: each becomes its
    /// function's estimate (the charge comes from the busy periods).
    fn collect_timings(s: &mut Session) {
        for (f, ns) in s.ctx.take_timings() {
            s.kernel_ns.insert(f, ns);
        }
    }

    /// Submits a device operation on `stream` (`op`; a launch of `func`, or
    /// another operation) inside a busy period: opens one if none is open
    /// (under the scheduler), and times the gap between the period's start
    /// mark and the operation's submission.
    fn in_period<T>(
        &mut self,
        s: &mut Session,
        stream: Handle,
        func: Option<Handle>,
        op: impl FnOnce(&mut dyn crate::executor::Context) -> T,
    ) -> T {
        if self.gate.is_none() {
            return op(&mut *s.ctx);
        }
        self.period_add(s, stream, func);
        let r = op(&mut *s.ctx);
        if let Some(p) = s.period.as_mut() {
            p.submitted();
        }
        r
    }

    /// Counts an operation on `stream` (a launch of `func`, or another
    /// operation) into the busy period, opening one (and marking its start
    /// on the device) if none is open. The caller submits the operation and
    /// then calls [`crate::session::Period::submitted`].
    fn period_add(&mut self, s: &mut Session, stream: Handle, func: Option<Handle>) {
        if self.gate.is_none() {
            return;
        }
        let p = s.period.get_or_insert_with(|| {
            let grant = self.gate.as_ref().map_or(0, |g| g.grants());
            let first = grant != self.period_grant;
            self.period_grant = grant;
            let timed = self.meter.open(first) && s.ctx.period_begin().is_ok();
            crate::session::Period::new(stream, timed, first)
        });
        p.add(stream, func);
    }

    /// Submits the session's queued launches (one run on one stream; see
    /// [`crate::session::LaunchRun`]). A failed launch is reported at the
    /// session's next synchronous call, as any asynchronous failure.
    fn flush_launches(&mut self, s: &mut Session) {
        if s.run.is_empty() {
            return;
        }
        let mut run = std::mem::take(&mut s.run);
        let r = s.ctx.launch_many(run.stream, &run.launches, &run.params);
        if run.launches.len() > 1 {
            self.stats
                .batched_launches
                .fetch_add(run.launches.len() as u64, Ordering::Relaxed);
        }
        if let Some(p) = s.period.as_mut() {
            p.submitted();
        }
        if let Err(e) = r {
            s.defer(e);
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
        }
        run.clear();
        s.run = run;
    }

    /// Queues a validated launch in the session's run, submitting the run
    /// first if the launch cannot join it.
    fn queue_launch(&mut self, s: &mut Session, stream: Handle, launch: Launch, params: &[u8]) {
        if !s.run.takes(stream) {
            self.flush_launches(s);
        }
        self.period_add(s, stream, Some(launch.func));
        s.run.push(stream, launch, params);
    }

    /// Whether the work issued under the grant, by the kernels' estimates,
    /// fills the slice: launches are asynchronous, so the clock alone
    /// cannot tell.
    fn slice_filled(&self) -> bool {
        self.gate
            .as_ref()
            .is_some_and(|g| g.holding() && self.issued_ns >= g.slice_ns())
    }

    /// Before a call that drains `stream` (`None`: all of them): whether it
    /// ends the open period; if so, marks the end on the device.
    fn period_ending(s: &mut Session, stream: Option<Handle>) -> bool {
        let Some(p) = s.period.as_mut() else {
            return false;
        };
        if !p.drained_by(stream) {
            return false;
        }
        if p.timed && s.ctx.period_end(&p.streams).is_err() {
            p.timed = false;
        }
        true
    }

    /// Drains `stream` (`None`: every stream) with `sync`, marking the end of
    /// the busy period the drain ends. Returns the drain's result and whether
    /// it ended a period, to be charged with [`Shared::period_close`] (after
    /// the reply). A failed drain drops the period: its work failed, there is
    /// nothing more to charge.
    fn drain(
        s: &mut Session,
        stream: Option<Handle>,
        sync: impl FnOnce(&mut dyn crate::executor::Context) -> Result<(), Status>,
    ) -> (Result<(), Status>, bool) {
        let ending = Self::period_ending(s, stream);
        let r = sync(&mut *s.ctx);
        if ending && r.is_err() {
            s.period = None;
        }
        let ended = ending && r.is_ok();
        (r, ended)
    }

    /// After the drain: charges the ended period, and learns the time of
    /// its function if it ran only one.
    fn period_close(&mut self, s: &mut Session) {
        let Some(p) = s.period.take() else {
            return;
        };
        let host = p.since.elapsed().as_nanos() as u64;
        // The device idled between the start mark and the first operation
        // only because the mark was submitted first: not the vGPU's time.
        // Not so in the first period of a grant: there the device switches
        // from the previous holder's context first and reaches the mark
        // only when that is done, by when the operation is usually there
        // (subtracting the gap undercharged each grant by 10-16 us on an
        // H100; results/2026-11-22-h100-launch-batch.md).
        let gap = if p.first { 0 } else { p.gap_ns };
        let device = if p.timed {
            s.ctx.period_ns().map(|d| d.saturating_sub(gap))
        } else {
            None
        };
        let (ns, kind) = match device {
            Some(d) => (self.meter.timed(host, d, !p.first), usize::from(!p.first)),
            None => (self.meter.untimed(host), 2),
        };
        self.charged_ns += ns;
        self.stats.periods[kind].fetch_add(1, Ordering::Relaxed);
        self.stats.period_charges[kind].fetch_add(ns, Ordering::Relaxed);
        if let Some((f, n)) = p.single_function() {
            s.kernel_ns.insert(f, ns / u64::from(n.max(1)));
        }
    }
}

/// A migration being prepared on a helper thread.
struct Moving {
    gpu: u32,
    grant: Option<std::os::fd::OwnedFd>,
    rx: std::sync::mpsc::Receiver<Vec<(usize, u64, crate::executor::Prepared)>>,
    asked: Instant,
}

/// A running worker.
pub struct Worker {
    sh: Shared,
    chans: Vec<Chan>,
    spin: SpinPolicy,
    cpu: Option<usize>,
    stop: Arc<AtomicBool>,
    moving: Option<Moving>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("channels", &self.chans.len())
            .finish()
    }
}

impl Worker {
    /// Creates the region, starts serving the socket (a worker on its own).
    pub fn new(cfg: &WorkerConfig, exec: Box<dyn Executor>) -> Result<Worker, Error> {
        let (region, fd) = Region::create(&format!("fairvgpu-{}", cfg.name), cfg.layout)?;
        let server = serve(&cfg.socket, fd, cfg.layout.vectors)?;
        Self::build(cfg, exec, region, PeerLink::Local(server))
    }

    /// Adopts the region the daemon feeds (see [`crate::link`]): channels
    /// whose owners' GPU state died with a previous worker become LOST, and
    /// their owners are woken to find out.
    pub fn adopt(
        cfg: &WorkerConfig,
        exec: Box<dyn Executor>,
        feed: std::os::fd::OwnedFd,
    ) -> Result<Worker, Error> {
        let (fd, fed) = Fed::receive(feed)?;
        let region = Region::adopt(fd, cfg.layout)?;
        let w = Self::build(cfg, exec, region, PeerLink::Fed(fed))?;
        for ch in 0..w.sh.region.channels() {
            if w.sh.region.claim_state(ch)? == ClaimState::Lost {
                tracing::warn!(
                    channel = ch,
                    "its GPU state died with the previous worker; its guest must claim again"
                );
                wake_owner(&w.sh, ch);
            }
        }
        Ok(w)
    }

    fn build(
        cfg: &WorkerConfig,
        exec: Box<dyn Executor>,
        region: Region,
        link: PeerLink,
    ) -> Result<Worker, Error> {
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
        let device_mem = info.total_mem;
        let mem_limit = cfg.mem_limit.min(device_mem);
        info.total_mem = mem_limit;
        let chans = (0..region.channels())
            .map(|i| {
                Ok(Chan {
                    host: region.host_channel(i)?,
                    session: None,
                    sliced: None,
                    transfer: None,
                    outbound: None,
                    outbox: None,
                    log_budget: 20,
                })
            })
            .collect::<Result<Vec<_>, qemu_ivshmem::Error>>()?;
        let chunk = (cfg.layout.arena_size as usize / 4).max(4096);
        let stats: Arc<Stats> = Arc::default();
        stats
            .device
            .store(u64::from(exec.device()), Ordering::Relaxed);
        Ok(Worker {
            sh: Shared {
                region,
                link,
                exec,
                sm_count: info.sm_count.max(1),
                slice_blocks: cfg.slice_blocks,
                budget_spent: false,
                occupancy: (0.0, 0.0),
                last_occupancy: 0.0,
                info_bytes: info.to_bytes(),
                mem_limit,
                device_mem,
                mem_used: 0,
                stats,
                chunk,
                gate: match &cfg.grant {
                    Some((path, id, weight)) => {
                        Some(crate::grant::Gate::connect(path, *id, *weight)?)
                    }
                    None => None,
                },
                grant_id: cfg.grant.as_ref().map(|g| (g.1, g.2)),
                charged_ns: 0,
                issued_ns: 0,
                meter: scheduler::accounting::PeriodMeter::new(cfg.sample_every),
                params: Vec::new(),
                period_grant: 0,
                time_launches: cfg.time_launches,
                booster: std::cell::RefCell::new(crate::cosched::VcpuBooster::new(
                    cfg.vcpus_file.clone(),
                )),
                worked: false,
                poisoned: std::cell::Cell::new(None),
            },
            chans,
            spin: cfg.spin,
            cpu: cfg.cpu,
            stop: Arc::default(),
            moving: None,
        })
    }

    /// A flag that stops [`Worker::run`] when set.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// The worker's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.sh.stats.clone()
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
            retire(&mut self.sh, c);
        }
        match self.sh.poisoned.get() {
            Some(status) => Err(Error::Poisoned(status)),
            None => served,
        }
    }

    /// The serving loop of [`Worker::run`].
    fn serve(&mut self) -> Result<(), Error> {
        if let Some(cpu) = self.cpu {
            pin_current_thread(cpu)?;
        }
        let mut idle: u32 = 0;
        let mut last_report = Instant::now();
        let mut turns: u32 = 0;
        while !self.stop.load(Ordering::Relaxed) && !self.sh.link.orphaned() {
            if self.sh.poisoned.get().is_some() {
                break;
            }
            if let Some((gpu, grant)) = self.sh.link.take_migration() {
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
            for i in 0..self.chans.len() {
                busy |= service(&mut self.sh, &mut self.chans[i]);
            }
            if self.sh.gate.as_ref().is_some_and(|g| g.slice_over()) || self.sh.budget_spent {
                self.sh.budget_spent = false;
                // A vGPU whose slice ran out while it was running work stays
                // runnable even if its ring is momentarily empty (its guest is
                // between a reply and its next call): reporting it idle would
                // reset its start tag and forfeit the credit it has.
                let active = self.sh.worked;
                self.release_grant(active)?;
                idle = 0;
                continue;
            }
            if busy {
                idle = 0;
                continue;
            }
            // A grant can arrive while there is nothing to run (the vGPU was
            // still queued): take it, so that the idle spin above returns it.
            if let Some(g) = self.sh.gate.as_mut() {
                if !g.holding() && g.wanted() && idle.is_multiple_of(64) {
                    g.acquire(Duration::ZERO)?;
                }
            }
            idle += 1;
            if idle < self.spin.spins / 16 {
                std::hint::spin_loop();
                continue;
            }
            if self.sh.gate.as_ref().is_some_and(|g| g.holding()) {
                // Work-conserving: a holder with nothing to run yields after its spin.
                self.release_grant(false)?;
                idle = 0;
                continue;
            }
            self.block()?;
            self.periodic(&mut last_report)?;
            idle = 0;
        }
        if self.sh.gate.as_ref().is_some_and(|g| g.holding()) {
            self.release_grant(false)?;
        }
        Ok(())
    }

    /// What the serving loop does when it looks at the clock: report, and
    /// let the coscheduling booster undo boosts and re-read its vCPU file.
    fn periodic(&mut self, last_report: &mut Instant) -> Result<(), Error> {
        self.maybe_report(last_report)?;
        let sync = self.sh.stats.sync_calls.load(Ordering::Relaxed);
        self.sh.booster.borrow_mut().tick(sync);
        Ok(())
    }

    /// Reports if [`REPORT_EVERY`] has passed since `last` (and there is a
    /// scheduler to report to).
    fn maybe_report(&mut self, last: &mut Instant) -> Result<(), Error> {
        if self.sh.gate.is_none() || last.elapsed() < REPORT_EVERY {
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
        let (num, den) = std::mem::take(&mut self.sh.occupancy);
        if den > 0.0 {
            self.sh.last_occupancy = num / den;
        }
        let st = &self.sh.stats;
        let r = crate::grant::Report {
            mem_used: st.mem_used.load(Ordering::Relaxed),
            sync_calls: st.sync_calls.load(Ordering::Relaxed),
            queued,
            launches: st.launches.load(Ordering::Relaxed),
            requests: st.requests.load(Ordering::Relaxed),
            refused: st.refused.load(Ordering::Relaxed),
            rss_bytes,
            open_fds,
            occupancy_ppm: (self.sh.last_occupancy * 1e6).round() as u64,
            sliced_launches: st.sliced_launches.load(Ordering::Relaxed),
        };
        if let Some(g) = self.sh.gate.as_mut() {
            g.report(&r)?;
        }
        Ok(())
    }

    /// Synchronizes every context (the GPU must really be free, and work that
    /// overran the slice is charged in full), then gives the grant back.
    fn release_grant(&mut self, still_active: bool) -> Result<(), Error> {
        for c in &mut self.chans {
            if let Some(s) = c.session.as_mut() {
                let (r, ended) = Shared::drain(s, None, |x| x.synchronize());
                if ended {
                    self.sh.period_close(s);
                }
                if let Err(e) = r {
                    s.defer(e);
                }
                Shared::collect_timings(s);
            }
        }
        self.sh.issued_ns = 0;
        let used = std::mem::take(&mut self.sh.charged_ns);
        self.sh.stats.charged_ns.fetch_add(used, Ordering::Relaxed);
        self.sh.worked = false;
        let pending = still_active
            || self.chans.iter().any(|c| {
                c.host.req.pending().unwrap_or(0) > 0 || c.transfer.is_some() || c.sliced.is_some()
            });
        if let Some(g) = self.sh.gate.as_mut() {
            g.release(used, pending)?;
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
        let jobs: Vec<(usize, u64, crate::executor::PrepareJob)> = self
            .chans
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let s = c.session.as_ref()?;
                Some((i, s.id, s.ctx.prepare_migration(gpu)?))
            })
            .collect();
        if jobs.is_empty() {
            return self.migrate(gpu, grant, Vec::new());
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("migration-prepare".into())
            .spawn(move || {
                let done: Vec<_> = jobs
                    .into_iter()
                    .filter_map(|(i, id, job)| job().ok().map(|p| (i, id, p)))
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
        prepared: Vec<(usize, u64, crate::executor::Prepared)>,
    ) -> Result<(), Error> {
        let mut prepared: std::collections::HashMap<(usize, u64), crate::executor::Prepared> =
            prepared
                .into_iter()
                .map(|(i, id, p)| ((i, id), p))
                .collect();
        let t0 = Instant::now();
        let from = self.sh.exec.device();
        if self.sh.gate.as_ref().is_some_and(|g| g.holding()) {
            self.release_grant(true)?;
        }
        let mut moved: Vec<usize> = Vec::new();
        let mut bytes = 0u64;
        let mut failed = None;
        for (i, c) in self.chans.iter_mut().enumerate() {
            let Some(s) = c.session.as_mut() else {
                continue;
            };
            // What was prepared for this very session (not for an earlier
            // owner of the channel).
            let ahead = prepared.remove(&(i, s.id));
            match s.ctx.migrate(gpu, ahead) {
                Ok(m) => {
                    bytes += m.bytes;
                    moved.push(i);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let ok = failed.is_none() && self.sh.exec.set_device(gpu).is_ok();
        if !ok {
            for i in moved {
                if let Some(s) = self.chans[i].session.as_mut() {
                    if let Err(e) = s.ctx.migrate(from, None) {
                        s.defer(e);
                    }
                }
            }
            tracing::warn!(
                to = gpu,
                "migration failed ({failed:?}); the vGPU stays on GPU {from}"
            );
        }
        if ok {
            if let (Some(fd), Some((id, weight))) = (grant, self.sh.grant_id) {
                // The source's service forgets the vGPU when this closes.
                self.sh.gate = Some(crate::grant::Gate::over(
                    std::os::unix::net::UnixStream::from(fd),
                    id,
                    weight,
                )?);
            }
            self.sh.stats.migrations.fetch_add(1, Ordering::Relaxed);
            self.sh
                .stats
                .device
                .store(u64::from(gpu), Ordering::Relaxed);
        }
        let report = crate::link::MigrationReport {
            gpu: if ok { gpu } else { from },
            moved: ok,
            pause_us: t0.elapsed().as_micros() as u64,
            kib: bytes.div_ceil(1024),
        };
        tracing::info!(
            from,
            to = gpu,
            ok,
            pause_us = report.pause_us,
            kib = report.kib,
            "migration"
        );
        self.sh.link.report_migration(&report);
        Ok(())
    }

    fn peer_events(&mut self) {
        for peer in self.sh.link.departed() {
            // A native guest process (or a whole VM) went away: its channels are orphans.
            for ch in 0..self.sh.region.channels() {
                if self.sh.region.owner_peer(ch).ok() == Some(u32::from(peer)) {
                    let _ = self.sh.region.mark_abandoned(ch);
                }
            }
        }
    }

    fn block(&mut self) -> Result<(), Error> {
        let region = self.sh.region.clone();
        let flag = region.host_sleeping()?;
        flag.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let mut busy = false;
        for i in 0..self.chans.len() {
            busy |= service(&mut self.sh, &mut self.chans[i]);
        }
        if !busy {
            let bells = self.sh.link.host_bells();
            let mut fds: Vec<PollFd<'_>> = bells
                .iter()
                .map(|b| PollFd::new(b.fd().as_fd(), PollFlags::POLLIN))
                .collect();
            // A grant arriving wakes the worker too.
            if let Some(g) = self.sh.gate.as_ref().filter(|g| g.wanted()) {
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

/// Frees everything the channel's owner held on the GPU.
fn drop_session(sh: &mut Shared, c: &mut Chan) {
    if let Some(s) = c.session.take() {
        sh.mem_used -= s.mem_used;
        sh.stats.mem_used.store(sh.mem_used, Ordering::Relaxed);
        drop(s); // the executor context frees its device memory
    }
    c.transfer = None;
    c.outbound = None;
    c.outbox = None;
    c.sliced = None;
}

/// Frees everything the channel's owner held and returns the channel to FREE.
fn teardown(sh: &mut Shared, c: &mut Chan) {
    drop_session(sh, c);
    c.log_budget = 20;
    if c.host.reclaim().is_ok() {
        sh.stats.reclaimed.fetch_add(1, Ordering::Relaxed);
    }
    // What the departed guest's buffers took stays with the allocator
    // otherwise (the sim executor keeps device memory in host RAM).
    crate::procfs::release_free_memory();
}

/// The worker is going away: frees what the channel's owner held; a
/// channel still claimed becomes LOST and its owner is woken, one that
/// needed reclaiming is reclaimed.
fn retire(sh: &mut Shared, c: &mut Chan) {
    match c.host.state() {
        Ok(ClaimState::Claimed) => {
            drop_session(sh, c);
            if c.host.mark_lost().unwrap_or(false) {
                wake_owner(sh, c.host.index());
            }
        }
        Ok(st) if st.needs_reclaim() => teardown(sh, c),
        _ => drop_session(sh, c),
    }
}

/// Rings the vector the owner of channel `ch` waits on, sleeping or not.
fn wake_owner(sh: &Shared, ch: u32) {
    let (Ok(peer), Ok(vector)) = (sh.region.owner_peer(ch), sh.region.guest_vector(ch)) else {
        return;
    };
    if let Ok(p) = u16::try_from(peer) {
        let _ = sh.link.ring_peer(p, vector);
    }
}

/// Polls one channel; true if it did any work.
fn service(sh: &mut Shared, c: &mut Chan) -> bool {
    let state = match c.host.state() {
        Ok(s) => s,
        Err(_) => return false,
    };
    if state.needs_reclaim() {
        teardown(sh, c);
        return true;
    }
    if state != ClaimState::Claimed {
        return false;
    }
    if c.session.is_none() {
        match sh.exec.open() {
            Ok(ctx) => {
                c.session = Some(Session::new(ctx));
                let _ = c.host.mark_serving();
            }
            Err(s) => {
                tracing::error!(channel = c.host.index(), "cannot create a context: {s:?}");
                let _ = sh.region.mark_abandoned(c.host.index());
                return true;
            }
        }
    }
    match serve_channel(sh, c) {
        Ok(did) => did,
        Err(e) => {
            // Corrupt rings: the guest broke its own channel. End it.
            if c.log_budget > 0 {
                tracing::warn!(channel = c.host.index(), "channel ended: {e}");
            }
            teardown(sh, c);
            // Counted once done, so that whoever reads it sees the channel freed.
            sh.stats.broken_channels.fetch_add(1, Ordering::Relaxed);
            true
        }
    }
}

fn serve_channel(sh: &mut Shared, c: &mut Chan) -> Result<bool, Error> {
    if let Some((d, data)) = c.outbox.take() {
        if !c.host.resp.try_send(&d, &data)? {
            c.outbox = Some((d, data));
            return Ok(false);
        }
        notify_guest(sh, c.host.index())?;
    }
    if c.outbound.is_some() {
        pump_outbound(sh, c)?;
        return Ok(true);
    }
    if c.sliced.is_some() {
        return pump_sliced(sh, c);
    }
    let mut did = false;
    for _ in 0..BATCH {
        if c.outbox.is_some() || c.outbound.is_some() || c.sliced.is_some() {
            break;
        }
        let Some(d) = c.host.req.peek()? else { break };
        if needs_device(d.opcode) {
            if sh.slice_filled() {
                sh.budget_spent = true;
                break;
            }
            if let Some(g) = sh.gate.as_mut() {
                if g.slice_over() || !g.acquire(Duration::from_millis(1))? {
                    break;
                }
            }
        }
        did = true;
        sh.stats.requests.fetch_add(1, Ordering::Relaxed);
        if sh.gate.as_ref().is_some_and(|g| g.holding()) {
            sh.worked = true;
        }
        if d.opcode != op::LAUNCH {
            // Launches queued before go first: the stream order is the guest's.
            if let Some(s) = c.session.as_mut() {
                sh.flush_launches(s);
            }
        }
        handle(sh, c, &d)?;
        if sh.gate.is_some() && drains_device(d.opcode) {
            sh.stats.sync_calls.fetch_add(1, Ordering::Relaxed);
            if let Some(s) = c.session.as_mut() {
                Shared::collect_timings(s);
            }
        }
        c.host.req.consume(&d)?;
    }
    // Nothing waits in the ring behind the queued launches (or the pass is
    // over): submit them now, still under the grant they were taken in.
    if let Some(s) = c.session.as_mut() {
        sh.flush_launches(s);
    }
    Ok(did)
}

/// Requests that put work on (or wait for) the device: they run only under the grant.
fn needs_device(opcode: u32) -> bool {
    matches!(
        opcode,
        op::LAUNCH
            | op::MEMCPY_HTOD
            | op::MEMCPY_DTOH
            | op::MEMCPY_DTOD
            | op::MEMSET
            | op::DATA
            | op::CTX_SYNCHRONIZE
            | op::STREAM_SYNCHRONIZE
            | op::EVENT_RECORD
            | op::EVENT_SYNCHRONIZE
            | op::STREAM_WAIT_EVENT
    )
}

/// Requests that return only when the device work before them is done.
fn drains_device(opcode: u32) -> bool {
    matches!(
        opcode,
        op::CTX_SYNCHRONIZE | op::STREAM_SYNCHRONIZE | op::EVENT_SYNCHRONIZE | op::MEMCPY_DTOH
    )
}

fn notify_guest(sh: &Shared, ch: u32) -> Result<(), Error> {
    let flag = sh.region.ring_sleeping(ch, Direction::ToGuest)?;
    fence(Ordering::SeqCst);
    if flag.load(Ordering::Relaxed) != 0 {
        let peer = sh.region.owner_peer(ch)?;
        if let Ok(p) = u16::try_from(peer) {
            // The guest's vector is that of the vCPU it waits on.
            let vector = sh.region.guest_vector(ch)?;
            sh.link.ring_peer(p, vector)?;
            sh.booster.borrow_mut().kick(vector);
        }
    }
    Ok(())
}

fn refuse(sh: &Shared, c: &mut Chan, what: &str) {
    sh.stats.refused.fetch_add(1, Ordering::Relaxed);
    if c.log_budget > 0 {
        c.log_budget -= 1;
        tracing::info!(channel = c.host.index(), "refused: {what}");
    }
}

fn reply(
    sh: &Shared,
    c: &mut Chan,
    tag: u64,
    opcode: u32,
    result: Result<Reply, Status>,
    data: &[u8],
) -> Result<(), Error> {
    let mut d = Descriptor::new(tag, opcode);
    let mut inline = [0u8; INLINE];
    match result {
        Ok(r) => r.encode(&mut inline),
        Err(s) => {
            d.status = s.code();
            if s.is_sticky() && sh.poisoned.get().is_none() {
                tracing::error!(
                    channel = c.host.index(),
                    "CUDA error {s:?} poisoned this worker's GPU contexts; the worker restarts"
                );
                sh.poisoned.set(Some(s));
            }
        }
    }
    d.inline = inline;
    let data = if d.status == 0 { data } else { &[] };
    if !c.host.resp.try_send(&d, data)? {
        // The guest is not reading its replies; keep this one and stop
        // serving the channel until there is room.
        c.outbox = Some((d, data.to_vec()));
        return Ok(());
    }
    notify_guest(sh, c.host.index())
}

fn handle(sh: &mut Shared, c: &mut Chan, d: &Descriptor) -> Result<(), Error> {
    if d.opcode == op::DATA {
        return continue_transfer(sh, c, d);
    }
    if c.transfer.is_some() {
        // A new request while data was still owed: the guest broke the stream.
        c.transfer = None;
        refuse(sh, c, "request before the previous one's data was complete");
        if let Some(s) = c.session.as_mut() {
            s.defer(Status::InvalidValue);
        }
    }
    let req = match Request::decode(d.opcode, &d.inline) {
        Ok(r) => r,
        Err(e) => {
            refuse(sh, c, &e.to_string());
            if d.flags & qemu_ivshmem::FLAG_NO_REPLY == 0 {
                return reply(sh, c, d.tag, d.opcode, Err(Status::InvalidValue), &[]);
            }
            if let Some(s) = c.session.as_mut() {
                s.defer(Status::InvalidValue);
            }
            return Ok(());
        }
    };
    let tag = d.tag;
    let opc = d.opcode;
    let Some(s) = c.session.as_mut() else {
        return Ok(());
    };
    // Synchronous calls first report an earlier asynchronous failure.
    if req.expects_reply() && !matches!(req, Request::Hello { .. }) {
        if let Some(err) = s.pending_error.take() {
            if let Request::ModuleLoad { len, kind } = req {
                // Still swallow the image that follows.
                start_module(c, tag, kind, len, d)?;
                c.transfer = None;
                skip_data(c, d, len);
            }
            return reply(sh, c, tag, opc, Err(err), &[]);
        }
    }
    let one = |r: Result<u64, Status>| r.map(Reply::one);
    let unit = |r: Result<(), Status>| r.map(|()| Reply::default());
    match req {
        Request::Hello { version } => {
            let r = if version == protocol::PROTOCOL_VERSION {
                Ok(Reply::default())
            } else {
                Err(Status::NotSupported)
            };
            let info = sh.info_bytes.clone();
            reply(sh, c, tag, opc, r, &info)
        }
        Request::CtxSynchronize => {
            let (r, ended) = Shared::drain(s, None, |x| x.synchronize());
            reply(sh, c, tag, opc, unit(r), &[])?;
            close_period(sh, c, ended);
            Ok(())
        }
        Request::MemAlloc { size } => {
            // What the allocation takes on the device counts, not what was
            // asked: tiny allocations rounded up to a large granularity
            // must not add up past the limit.
            let charge = s.ctx.footprint(size);
            let r = if sh.mem_used.saturating_add(charge) > sh.limit() {
                Err(Status::OutOfMemory)
            } else {
                s.ctx.alloc(size).inspect(|&p| s.add_alloc(p, size, charge))
            };
            if r.is_ok() {
                sh.mem_used += charge;
                sh.stats.mem_used.store(sh.mem_used, Ordering::Relaxed);
            }
            reply(sh, c, tag, opc, one(r), &[])
        }
        Request::MemFree { ptr } => {
            let r = s.remove_alloc(ptr).and_then(|size| {
                sh.mem_used -= size;
                sh.stats.mem_used.store(sh.mem_used, Ordering::Relaxed);
                s.ctx.free(ptr)
            });
            if r.is_err() {
                refuse(sh, c, "free of a pointer it does not own");
            }
            reply(sh, c, tag, opc, unit(r), &[])
        }
        Request::MemGetInfo => {
            let r = Reply {
                vals: [sh.limit().saturating_sub(sh.mem_used), sh.limit(), 0, 0],
            };
            reply(sh, c, tag, opc, Ok(r), &[])
        }
        Request::MemcpyHtoD { dst, len, stream } => {
            let ok = s
                .check_range(dst, len)
                .and_then(|()| s.check_stream(stream));
            match ok {
                // The copy itself follows with its data.
                Ok(()) => sh.in_period(s, stream, None, |_| ()),
                Err(e) => {
                    s.defer(e);
                    refuse(sh, c, "host-to-device copy outside its allocations");
                }
            }
            c.transfer = Some(Transfer {
                inbound: Inbound::Htod {
                    dst,
                    stream,
                    ok: ok.is_ok(),
                },
                remaining: len,
                offset: 0,
            });
            continue_transfer(sh, c, d)
        }
        Request::MemcpyDtoH { src, len, stream } => {
            let ok = s
                .check_range(src, len)
                .and_then(|()| s.check_stream(stream));
            match ok {
                Err(e) => {
                    refuse(sh, c, "device-to-host copy outside its allocations");
                    reply(sh, c, tag, opc, Err(e), &[])
                }
                Ok(()) => {
                    // Synchronous: its own time is the device's (its first
                    // chunk is copied right below).
                    sh.in_period(s, stream, None, |_| ());
                    c.outbound = Some(Outbound {
                        tag,
                        src,
                        len,
                        off: 0,
                        stream,
                    });
                    pump_outbound(sh, c)
                }
            }
        }
        Request::MemcpyDtoD {
            dst,
            src,
            len,
            stream,
        } => {
            let r = s
                .check_range(dst, len)
                .and(s.check_range(src, len))
                .and(s.check_stream(stream));
            let r =
                r.and_then(|()| sh.in_period(s, stream, None, |x| x.dtod(dst, src, len, stream)));
            if let Err(e) = r {
                s.defer(e);
                refuse(sh, c, "device-to-device copy outside its allocations");
            }
            Ok(())
        }
        Request::Memset {
            dst,
            value,
            width,
            count,
            stream,
        } => {
            let r = s
                .check_range(dst, count * u64::from(width))
                .and(s.check_stream(stream));
            let r = r.and_then(|()| {
                sh.in_period(s, stream, None, |x| {
                    x.memset(dst, value, width, count, stream)
                })
            });
            if let Err(e) = r {
                s.defer(e);
                refuse(sh, c, "memset outside its allocations");
            }
            Ok(())
        }
        Request::ModuleLoad { kind, len } => {
            start_module(c, tag, kind, len, d)?;
            continue_transfer(sh, c, d)
        }
        Request::ModuleUnload { module } => {
            let r = s
                .check_module(module)
                .and_then(|()| s.ctx.unload_module(module));
            if r.is_ok() {
                s.remove_module(module);
            }
            reply(sh, c, tag, opc, unit(r), &[])
        }
        Request::ModuleGetFunction { module } => {
            let mut name = vec![0u8; d.data_len.min(MAX_NAME) as usize];
            c.host.req.data(d)?.copy_to(&mut name[..]);
            let r = match (s.check_module(module), std::str::from_utf8(&name)) {
                (Err(e), _) => Err(e),
                (_, Err(_)) => Err(Status::InvalidValue),
                (Ok(()), Ok(n)) => s.ctx.function(module, n.trim_end_matches('\0')),
            };
            match r {
                Ok((h, params)) => {
                    let bytes = protocol::Param::encode_all(&params);
                    s.add_function(h, params.iter().map(|p| p.size).collect());
                    reply(sh, c, tag, opc, Ok(Reply::one(h)), &bytes)
                }
                Err(e) => reply(sh, c, tag, opc, Err(e), &[]),
            }
        }
        Request::Occupancy {
            func,
            block_size,
            shared_mem,
        } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.occupancy(func, block_size, shared_mem))
                .map(|v| Reply::one(u64::from(v as u32)));
            reply(sh, c, tag, opc, r, &[])
        }
        Request::ModuleGetGlobal { module } => {
            let mut name = vec![0u8; d.data_len.min(MAX_NAME) as usize];
            c.host.req.data(d)?.copy_to(&mut name[..]);
            let r = match (s.check_module(module), std::str::from_utf8(&name)) {
                (Err(e), _) => Err(e),
                (_, Err(_)) => Err(Status::InvalidValue),
                (Ok(()), Ok(n)) => s.ctx.module_global(module, n.trim_end_matches('\0')),
            };
            let r = r.map(|(p, size)| {
                s.add_global(p, size);
                Reply {
                    vals: [p, size, 0, 0],
                }
            });
            reply(sh, c, tag, opc, r, &[])
        }
        Request::Link { len } => {
            c.transfer = Some(Transfer {
                inbound: Inbound::Link {
                    buf: Vec::new(),
                    tag,
                },
                remaining: len,
                offset: 0,
            });
            continue_transfer(sh, c, d)
        }
        Request::FuncGetAttribute { func, attr } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.func_attribute(func, attr))
                .map(|v| Reply::one(u64::from(v as u32)));
            reply(sh, c, tag, opc, r, &[])
        }
        Request::Launch {
            func,
            grid,
            block,
            shared_mem,
            stream,
            cluster,
            flags,
        } if cluster != protocol::Dim3::default() || flags != 0 => {
            // Clusters and cooperative grids go one by one, never batched
            // nor sliced (a sliced cooperative grid could not sync).
            let r = s.function(func).and_then(|sizes| {
                let want: u64 = sizes.iter().map(|&x| u64::from(x)).sum();
                if want != u64::from(d.data_len) {
                    return Err(Status::InvalidValue);
                }
                Ok(())
            });
            let r = r.and(s.check_stream(stream)).and_then(|()| {
                let mut params = vec![0u8; d.data_len as usize];
                c.host
                    .req
                    .data(d)
                    .map_err(|_| Status::InvalidValue)?
                    .copy_to(&mut params[..]);
                sh.stats.launches.fetch_add(1, Ordering::Relaxed);
                let coop = flags & protocol::launch_flags::COOPERATIVE != 0;
                sh.in_period(s, stream, Some(func), |x| {
                    x.launch_ex(
                        func, grid, block, shared_mem, stream, &params, cluster, coop,
                    )
                })
            });
            if let Err(e) = r {
                s.defer(e);
                refuse(sh, c, "launch refused");
            }
            Ok(())
        }
        Request::Launch {
            func,
            grid,
            block,
            shared_mem,
            stream,
            ..
        } => {
            let shape = Launch {
                func,
                grid,
                block,
                shared_mem,
            };
            let r = s.function(func).and_then(|sizes| {
                let want: u64 = sizes.iter().map(|&x| u64::from(x)).sum();
                if want != u64::from(d.data_len) {
                    return Err(Status::InvalidValue);
                }
                Ok(())
            });
            let scheduled = sh.gate.is_some();
            let r = r.and(s.check_stream(stream)).and_then(|()| {
                // The buffer is reused from launch to launch (a sliced launch keeps it).
                let mut params = std::mem::take(&mut sh.params);
                params.clear();
                params.resize(d.data_len as usize, 0);
                c.host
                    .req
                    .data(d)
                    .map_err(|_| Status::InvalidValue)?
                    .copy_to(&mut params[..]);
                // Kernel slicing: a large grid runs as sub-grids, issued
                // while this vGPU holds the GPU (see `pump_sliced`).
                if scheduled
                    && sh.slice_blocks > 0
                    && grid.count() > sh.slice_blocks.max(scheduler::slicing::MIN_BLOCKS)
                    && s.ctx.can_slice(func)
                {
                    let parts =
                        scheduler::slicing::slice_grid(grid.x, grid.y, grid.z, sh.slice_blocks);
                    if parts.len() > 1 {
                        sh.flush_launches(s);
                        sh.stats.launches.fetch_add(1, Ordering::Relaxed);
                        sh.stats.sliced_launches.fetch_add(1, Ordering::Relaxed);
                        c.sliced = Some(Sliced {
                            func,
                            block,
                            y: grid.y,
                            z: grid.z,
                            smem: shared_mem,
                            stream,
                            params,
                            grid_x: grid.x,
                            rest: parts.into(),
                        });
                        return Ok(());
                    }
                }
                if !scheduled {
                    sh.stats.launches.fetch_add(1, Ordering::Relaxed);
                    sh.queue_launch(s, stream, shape, &params);
                    sh.params = params;
                    return Ok(());
                }
                // The monitor: how much of the GPU's cores this launch can
                // occupy, weighted by its estimated time.
                let bps = *s
                    .occupancy
                    .entry((
                        func,
                        block.count().min(u64::from(u32::MAX)) as u32,
                        shared_mem,
                    ))
                    .or_insert_with(|| {
                        s.ctx
                            .occupancy(func, block.count() as u32, shared_mem)
                            .map_or(0, |n| n.max(0) as u32)
                    });
                let resident = u64::from(bps).saturating_mul(u64::from(sh.sm_count)).max(1);
                let fraction = (grid.count() as f64 / resident as f64).min(1.0);
                let est = s.kernel_ns.get(&func).copied();
                let weight = est.unwrap_or(1_000) as f64;
                sh.occupancy.0 += fraction * weight;
                sh.occupancy.1 += weight;
                // The prediction of what fits in the slice; the charge
                // comes from the busy period.
                sh.issued_ns += est.unwrap_or(0);
                sh.stats.launches.fetch_add(1, Ordering::Relaxed);
                let r = if sh.time_launches || est.is_none() {
                    sh.stats.timed_launches.fetch_add(1, Ordering::Relaxed);
                    sh.flush_launches(s);
                    sh.in_period(s, stream, Some(func), |x| {
                        x.launch_timed(func, grid, block, shared_mem, stream, &params)
                    })
                } else {
                    sh.queue_launch(s, stream, shape, &params);
                    Ok(())
                };
                sh.params = params;
                r
            });
            if let Err(e) = r {
                s.defer(e);
                refuse(sh, c, "launch refused");
            }
            Ok(())
        }
        Request::StreamCreate { flags, priority } => {
            let r = s
                .ctx
                .stream_create(flags, priority)
                .inspect(|&h| s.add_stream(h));
            reply(sh, c, tag, opc, one(r), &[])
        }
        Request::StreamWaitEvent {
            stream,
            event,
            flags,
        } => {
            let r = s
                .check_stream(stream)
                .and(s.check_event(event))
                .and_then(|()| {
                    sh.in_period(s, stream, None, |x| {
                        x.stream_wait_event(stream, event, flags)
                    })
                });
            if let Err(e) = r {
                s.defer(e);
                refuse(sh, c, "wait on a stream or event it does not own");
            }
            Ok(())
        }
        Request::FuncSetAttribute { func, attr, value } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.func_set_attribute(func, attr, value));
            reply(sh, c, tag, opc, unit(r), &[])
        }
        Request::CtxGetLimit { limit } => {
            let r = s.ctx.limit(limit);
            reply(sh, c, tag, opc, one(r), &[])
        }
        Request::CtxSetLimit { limit, value } => {
            let r = s.ctx.set_limit(limit, value);
            reply(sh, c, tag, opc, unit(r), &[])
        }
        Request::StreamDestroy { stream } => {
            let r = if stream == 0 {
                Err(Status::InvalidHandle)
            } else {
                s.check_stream(stream)
            };
            let r = r
                .and_then(|()| s.ctx.stream_destroy(stream))
                .inspect(|()| s.remove_stream(stream));
            reply(sh, c, tag, opc, unit(r), &[])
        }
        Request::StreamSynchronize { stream } => {
            let (r, ended) = match s.check_stream(stream) {
                Ok(()) => Shared::drain(s, Some(stream), |x| x.stream_synchronize(stream)),
                Err(e) => (Err(e), false),
            };
            reply(sh, c, tag, opc, unit(r), &[])?;
            close_period(sh, c, ended);
            Ok(())
        }
        Request::StreamQuery { stream } => {
            let r = s
                .check_stream(stream)
                .and_then(|()| s.ctx.stream_query(stream));
            let r = r.and_then(ready);
            reply(sh, c, tag, opc, r, &[])
        }
        Request::EventCreate { flags } => {
            let r = s.ctx.event_create(flags).inspect(|&h| s.add_event(h));
            reply(sh, c, tag, opc, one(r), &[])
        }
        Request::EventDestroy { event } => {
            let r = s
                .check_event(event)
                .and_then(|()| s.ctx.event_destroy(event))
                .inspect(|()| s.remove_event(event));
            reply(sh, c, tag, opc, unit(r), &[])
        }
        Request::EventRecord { event, stream } => {
            let r = s
                .check_event(event)
                .and(s.check_stream(stream))
                .and_then(|()| sh.in_period(s, stream, None, |x| x.event_record(event, stream)));
            if let Err(e) = r {
                s.defer(e);
            }
            Ok(())
        }
        Request::EventSynchronize { event } => {
            let r = s
                .check_event(event)
                .and_then(|()| s.ctx.event_synchronize(event));
            reply(sh, c, tag, opc, unit(r), &[])
        }
        Request::EventQuery { event } => {
            let r = s.check_event(event).and_then(|()| s.ctx.event_query(event));
            let r = r.and_then(ready);
            reply(sh, c, tag, opc, r, &[])
        }
        Request::EventElapsedTime { start, end } => {
            let r = s
                .check_event(start)
                .and(s.check_event(end))
                .and_then(|()| s.ctx.event_elapsed(start, end));
            reply(
                sh,
                c,
                tag,
                opc,
                r.map(|ms| Reply::one(u64::from(ms.to_bits()))),
                &[],
            )
        }
    }
}

/// Charges the period a drain ended (after the reply went out, so that the
/// guest does not wait for the accounting).
fn close_period(sh: &mut Shared, c: &mut Chan, ending: bool) {
    if let (true, Some(s)) = (ending, c.session.as_mut()) {
        sh.period_close(s);
    }
}

/// A query's answer: success when done, `NotReady` otherwise (as CUDA reports it).
fn ready(done: bool) -> Result<Reply, Status> {
    if done {
        Ok(Reply::default())
    } else {
        Err(Status::NotReady)
    }
}

fn start_module(
    c: &mut Chan,
    tag: u64,
    kind: ImageKind,
    len: u64,
    _d: &Descriptor,
) -> Result<(), Error> {
    // The buffer grows as chunks arrive: a guest that announces 256 MiB and
    // sends nothing costs nothing.
    c.transfer = Some(Transfer {
        inbound: Inbound::Module {
            kind,
            buf: Vec::new(),
            tag,
        },
        remaining: len,
        offset: 0,
    });
    Ok(())
}

/// Drops `len` bytes of data owed by a refused request (they arrive as DATA chunks).
fn skip_data(c: &mut Chan, d: &Descriptor, len: u64) {
    let rest = len.saturating_sub(u64::from(d.data_len));
    if rest > 0 {
        c.transfer = Some(Transfer {
            inbound: Inbound::Htod {
                dst: 0,
                stream: 0,
                ok: false,
            },
            remaining: rest,
            offset: 0,
        });
    }
}

/// Applies the data of `d` to the transfer in progress.
fn continue_transfer(sh: &mut Shared, c: &mut Chan, d: &Descriptor) -> Result<(), Error> {
    let Some(mut t) = c.transfer.take() else {
        refuse(sh, c, "data chunk with no transfer in progress");
        if let Some(s) = c.session.as_mut() {
            s.defer(Status::InvalidValue);
        }
        return Ok(());
    };
    let n = u64::from(d.data_len);
    if n > t.remaining {
        refuse(sh, c, "more data than announced");
        if let Some(s) = c.session.as_mut() {
            s.defer(Status::InvalidValue);
        }
        return Ok(());
    }
    let Some(s) = c.session.as_mut() else {
        return Ok(());
    };
    let data = c.host.req.data(d)?;
    match &mut t.inbound {
        Inbound::Htod { dst, stream, ok } => {
            if *ok && n > 0 {
                if let Err(e) = s.ctx.htod(*dst + t.offset, &data, *stream) {
                    s.defer(e);
                    *ok = false;
                }
            }
        }
        Inbound::Module { buf, .. } | Inbound::Link { buf, .. } => {
            let start = buf.len();
            buf.resize(start + n as usize, 0);
            data.copy_to(&mut buf[start..]);
        }
    }
    t.offset += n;
    t.remaining -= n;
    if t.remaining > 0 {
        c.transfer = Some(t);
        return Ok(());
    }
    match t.inbound {
        Inbound::Module { kind, buf, tag } => {
            let r = s.ctx.load_module(kind, &buf).inspect(|&m| s.add_module(m));
            reply(sh, c, tag, op::MODULE_LOAD, r.map(Reply::one), &[])
        }
        Inbound::Link { buf, tag } => {
            let r = protocol::link_records(&buf)
                .map_err(|_| Status::InvalidValue)
                .and_then(|inputs| s.ctx.link(&inputs));
            match r {
                // The linked image goes back in one message.
                Ok(image) if image.len() > sh.chunk => {
                    refuse(sh, c, "linked image larger than one arena chunk");
                    reply(sh, c, tag, op::LINK, Err(Status::NotSupported), &[])
                }
                Ok(image) => reply(
                    sh,
                    c,
                    tag,
                    op::LINK,
                    Ok(Reply::one(image.len() as u64)),
                    &image,
                ),
                Err(e) => reply(sh, c, tag, op::LINK, Err(e), &[]),
            }
        }
        Inbound::Htod { .. } => Ok(()),
    }
}

/// Streams a device-to-host copy into the response ring, as far as it has room.
/// Issues the sub-grids of a sliced launch while the vGPU holds the GPU and
/// its slice lasts; what is left waits for the next grant (the run loop
/// releases the GPU between, so other vGPUs get their turn). Each sub-grid
/// is charged its share of the kernel's measured time; a kernel not
/// measured yet has its first sub-grid timed.
fn pump_sliced(sh: &mut Shared, c: &mut Chan) -> Result<bool, Error> {
    let mut did = false;
    while let Some(sl) = c.sliced.as_mut() {
        let Some(sub) = sl.rest.front().copied() else {
            c.sliced = None;
            break;
        };
        if let Some(g) = sh.gate.as_mut() {
            if g.slice_over() || !g.acquire(Duration::from_millis(1))? {
                break;
            }
            if sh.slice_filled() {
                sh.budget_spent = true;
                break;
            }
        }
        let Some(s) = c.session.as_mut() else {
            c.sliced = None;
            break;
        };
        let grid = protocol::Dim3 {
            x: sub.x_count,
            y: sl.y,
            z: sl.z,
        };
        let est = s.kernel_ns.get(&sl.func).copied();
        let mut t0 = Instant::now();
        let r = sh.in_period(s, sl.stream, Some(sl.func), |x| {
            t0 = Instant::now();
            x.launch_slice(
                sl.func,
                grid,
                sl.block,
                sl.smem,
                sl.stream,
                &sl.params,
                sub.x_offset,
                sl.grid_x,
            )
        });
        let share = f64::from(sub.x_count) / f64::from(sl.grid_x.max(1));
        match (r, est) {
            (Err(e), _) => {
                s.defer(e);
                c.sliced = None;
                break;
            }
            (Ok(()), Some(ns)) => sh.issued_ns += (ns as f64 * share) as u64,
            (Ok(()), None) => {
                // Measure this sub-grid: wait for it on the host clock.
                if let Err(e) = s.ctx.synchronize() {
                    s.defer(e);
                }
                let ns = t0.elapsed().as_nanos() as u64;
                sh.issued_ns += ns;
                s.kernel_ns
                    .insert(sl.func, (ns as f64 / share.max(1e-9)) as u64);
            }
        }
        sh.worked = true;
        did = true;
        if let Some(sl) = c.sliced.as_mut() {
            sl.rest.pop_front();
        }
    }
    Ok(did)
}

fn pump_outbound(sh: &mut Shared, c: &mut Chan) -> Result<(), Error> {
    let Some(mut ob) = c.outbound.take() else {
        return Ok(());
    };
    let ch = c.host.index();
    let Some(s) = c.session.as_mut() else {
        return Ok(());
    };
    let mut failed = false;
    loop {
        // Chunks of at most DTOH_CHUNK: the guest copies each out of the
        // arena while the device fills the next, and a chunk that small is
        // still in the host's cache when the guest reads it (a 64 MiB copy
        // out of 256 KiB-1 MiB chunks moved 11.6-12.5 GB/s on an H100 host,
        // out of 4 MiB ones 10.4; `scripts/gpu/copy_probe.c`).
        let n = (ob.len - ob.off).min(sh.chunk.min(DTOH_CHUNK) as u64);
        let mut d = Descriptor::new(ob.tag, op::MEMCPY_DTOH);
        if ob.off + n < ob.len {
            d.flags = FLAG_MORE;
        }
        let (src, stream) = (ob.src + ob.off, ob.stream);
        let ctx = &mut s.ctx;
        let st = &sh.stats;
        let sent = c.host.resp.try_send_with(&d, n as usize, |out, slice| {
            let t0 = Instant::now();
            if let Err(e) = ctx.dtoh(&slice, src, stream) {
                out.status = e.code();
                out.flags = 0;
                failed = true;
            }
            st.dtoh_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            st.dtoh_bytes.fetch_add(n, Ordering::Relaxed);
            Ok(())
        })?;
        if !sent {
            // The guest has not copied a chunk out yet. The loop comes back
            // at once (nothing rings when it does), but without hammering
            // the core a guest thread may share with this one.
            for _ in 0..8 {
                std::hint::spin_loop();
            }
            break;
        }
        notify_guest(sh, ch)?;
        ob.off += n;
        if failed || ob.off >= ob.len {
            return Ok(());
        }
    }
    c.outbound = Some(ob);
    Ok(())
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
