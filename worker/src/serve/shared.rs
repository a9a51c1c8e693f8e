//! State shared by all channels of a worker, and the scheduler's side of
//! running work: the grant, busy periods and their charges, queued launch
//! runs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use protocol::Status;
use transport::Region;

use super::Stats;
use crate::executor::{Executor, Handle, Launch};
use crate::feed::PeerLink;
use crate::session::{Period, Session};

/// State shared by all channels of the worker, by what it holds: each
/// request's handler is given the pieces it uses (see `requests/`).
pub(super) struct Shared {
    // Declared first so it is dropped first: it may hold DMA registrations
    // of the region's memory.
    pub gpu: Gpu,
    /// What the VM's processes exported to each other.
    pub tables: Tables,
    pub port: Port,
    pub mem: Memory,
    pub slice: Slice,
    pub figures: Figures,
}

/// The device side: the executor and what is registered with it or made
/// on it for the vGPU's processes.
pub(super) struct Gpu {
    pub exec: Box<dyn Executor>,
    /// The pinned pool mapped where the device knows it (after `exec`,
    /// which registered it, so that it is unmapped after the executor let
    /// go of it).
    pub pinned_map: Option<transport::shm::FixedMapping>,
    /// Who holds which block of the pool.
    pub pinned: super::pinned::PinnedPool,
    /// Module images by content (see `image_cache.rs`).
    pub images: super::image_cache::ImageCache,
    /// Contexts of ended processes, for the next ones (see `contexts.rs`).
    pub contexts: super::contexts::ContextPool,
    /// Multiprocessors of the GPU.
    pub sm_count: u32,
}

/// What the VM's processes exported to each other, by token.
#[derive(Default)]
pub(super) struct Tables {
    /// Memory exported through IPC handles.
    pub ipc: crate::session::ipc::Exports,
    /// Events exported through IPC handles.
    pub ipc_events: crate::session::ipc::Exports,
    /// Shareable handles (VMM memory, pools; `requests/share.rs`).
    pub shares: super::requests::share::WorkerShares,
    /// The VM's export table, where each of its processes has a worker
    /// of its own (`exports.rs`): what the others exported.
    pub vm: Option<Arc<crate::exports::VmExports>>,
}

/// The worker's side toward its guests: the region and its peers, what
/// replies ring and count, what the guests are told of the device, what
/// their requests may make the worker log, and their kernels' output.
pub(super) struct Port {
    pub region: Region,
    pub link: PeerLink,
    /// The device as `Hello` answers it.
    pub info_bytes: Vec<u8>,
    /// Bytes of one message's data (a quarter of an arena).
    pub chunk: usize,
    pub stats: Arc<Stats>,
    /// The VM's vCPU threads, kicked when a blocked guest is woken.
    pub booster: std::cell::RefCell<crate::priority::VcpuBooster>,
    /// What the VM's guests can make the worker log goes through here
    /// (see `transport::ratelimit`): one VM's worker, one limit.
    pub log: std::cell::RefCell<transport::LogLimiter>,
    /// What the processes' kernels printed, for them to take (see
    /// `output.rs`).
    pub output: std::cell::RefCell<super::output::Output>,
    /// A sticky CUDA error: every context of this process is unusable.
    pub poisoned: std::cell::Cell<Option<Status>>,
    /// The process slot served (see `WorkerConfig::slot`): one process at
    /// a time; its host-sleeping word and doorbell vector.
    pub slot: Option<u32>,
    /// Held for a checkpoint (`checkpoint.rs`): no request is started,
    /// those under way finish.
    pub held: std::cell::Cell<bool>,
}

/// The vGPU's device memory: its limit and what its processes hold.
pub(super) struct Memory {
    /// The config's limit (never more than the device has).
    pub mem_limit: u64,
    /// The device's own memory.
    pub device_mem: u64,
    /// What this worker's processes hold.
    pub used: u64,
    /// Where the vGPU is served by several workers (a worker per guest
    /// process), what it holds over all of them (see `ledger.rs`): what
    /// the limit is checked against. None: `used` is the vGPU's.
    pub ledger: Option<crate::ledger::Ledger>,
    /// The process slot whose entry in the ledger says what this worker
    /// holds (`Ledger::hold`).
    pub slot: Option<u32>,
    pub stats: Arc<Stats>,
}

/// The grant and what is accounted under it: busy periods and their
/// charges, the work issued against the slice, queued launch runs.
pub(super) struct Slice {
    pub gate: Option<crate::gate::Gate>,
    /// This vGPU's id and weight at the grant services (to register at
    /// another GPU's after a migration).
    pub grant_id: Option<(u32, f64)>,
    /// Kernel slicing threshold (0: off).
    pub slice_blocks: u64,
    pub time_launches: bool,
    /// GPU time measured under the current grant (busy periods).
    pub charged_ns: u64,
    /// Stretches of device work in `charged_ns` (busy periods, chunks of
    /// copies out): how heavy the vGPU is (see the daemon's `share.rs`).
    pub bursts: u64,
    /// The wait for a late guest under way (see `Worker::late_guest`).
    pub late: Option<LateWait>,
    /// Time the current grant was kept, uncharged, for late guests.
    pub late_free_ns: u64,
    /// GPU time issued under the current grant, by the kernels' estimates:
    /// what says whether more work fits in the slice.
    pub issued_ns: u64,
    /// Times busy periods (see `sched::accounting::PeriodMeter`).
    pub meter: sched::accounting::PeriodMeter,
    /// A launch's parameter bytes (reused).
    pub params: Vec<u8>,
    /// The grant under which the last period opened.
    pub period_grant: u64,
    /// Whether any request ran under the current grant.
    pub worked: bool,
    /// The sub-grids issued under the current grant fill its slice: give
    /// the GPU back once they are done, whatever the clock says.
    pub budget_spent: bool,
    /// The grant is being given back: no new device work until it is.
    pub releasing: bool,
    pub stats: Arc<Stats>,
}

/// A holder's wait for a guest that has not taken its reply (see
/// `Worker::late_guest`).
pub(super) struct LateWait {
    /// When the holder, with nothing to run, first saw the reply unread.
    pub since: std::time::Instant,
    /// The last look that still saw it unread. The guest took it between
    /// this look and the next, which comes late where the worker itself
    /// waited for a CPU: the wait is measured to this look, what the
    /// worker knows the guest was late.
    pub seen: std::time::Instant,
    /// How long each of the VM's vCPU threads had waited for a CPU when
    /// the wait began (see `Worker::late_guest_came`).
    pub run_delays: Option<Vec<(u32, u64)>>,
}

/// Figures kept between reports to the grant service and answers to a
/// monitor.
#[derive(Default)]
pub(super) struct Figures {
    /// Since the last report: sum of (occupied fraction x kernel time) and
    /// of kernel time, over launches.
    pub occupancy: (f64, f64),
    /// Mean occupied fraction over the last report's launches (kept while
    /// there are none).
    pub last_occupancy: f64,
    /// The bytes copied when the copy share was last reported.
    pub copy_mark: u64,
    /// The vGPU's share of its GPU, as `VgpuStatus` answers it.
    pub util: super::status::UtilMeter,
}

/// How often a worker reports its live figures to the grant service.
pub(super) const REPORT_EVERY: Duration = Duration::from_millis(200);

/// By default, one busy period in this many is timed on the device.
pub const SAMPLE_EVERY: u64 = 8;

impl Port {
    /// Whether a channel this worker serves has an owner that let go of it
    /// (or went away) and waits for its teardown, which frees what that
    /// process held (its memory, its context) when the pass reaches it.
    /// Read after a request was: a process that exited before another one's
    /// request was written is seen here.
    pub fn departed(&self) -> bool {
        let served = match self.slot {
            Some(k) => self.region.layout().partition_channels(k),
            None => 0..self.region.channels(),
        };
        served
            .into_iter()
            .any(|ch| self.region.claim_state(ch).is_ok_and(|s| s.needs_reclaim()))
    }

    /// A sticky CUDA error (a kernel fault) poisons every context of the
    /// worker process: it restarts once its processes have their replies.
    pub fn note_fault(&self, s: Status, channel: u32) {
        if s.is_sticky() && self.poisoned.get().is_none() {
            tracing::error!(
                channel,
                "CUDA error {s:?} poisoned this worker's GPU contexts; it ends once its processes have their errors"
            );
            self.poisoned.set(Some(s));
        }
    }

    /// Gives the kernel output written since the last call to the process
    /// `owner` whose calls ran meanwhile (see [`super::output::Output::collect`]).
    pub fn collect_output(&self, owner: Option<super::sessions::SessionId>) {
        let faulted = self.poisoned.get().is_some();
        self.output.borrow_mut().collect(owner, faulted);
    }
}

impl Memory {
    /// The device memory this vGPU may hold now: the daemon's live setting
    /// (asked of `link`) if it made one, else the config's (never more than
    /// the device has).
    pub fn limit(&self, link: &PeerLink) -> u64 {
        link.memory_limit()
            .map_or(self.mem_limit, |l| l.min(self.device_mem))
    }

    /// Counts `charge` more bytes held if the vGPU's limit leaves room
    /// (over all its workers), and says so to the counters; false, nothing
    /// counted, if not. Reserved before the allocation, given back with
    /// [`Memory::sub`] if it fails.
    pub fn reserve(&mut self, charge: u64, link: &PeerLink) -> bool {
        let limit = self.limit(link);
        let fits = match &self.ledger {
            Some(l) => l.reserve(charge, limit),
            None => self.used.saturating_add(charge) <= limit,
        };
        if !fits {
            return false;
        }
        self.used += charge;
        self.held();
        true
    }

    /// Counts `charge` bytes fewer held, and says so to the counters.
    pub fn sub(&mut self, charge: u64) {
        self.used -= charge;
        if let Some(l) = &self.ledger {
            l.release(charge);
        }
        self.held();
    }

    /// Says what this worker holds to the counters and its slot's entry.
    fn held(&self) {
        self.stats.mem_used.store(self.used, Ordering::Relaxed);
        if let (Some(l), Some(k)) = (&self.ledger, self.slot) {
            l.hold(k, self.used);
        }
    }

    /// What the vGPU holds, over all its workers.
    pub fn vgpu_used(&self) -> u64 {
        self.ledger
            .as_ref()
            .map_or(self.used, crate::ledger::Ledger::used)
    }
}

impl Slice {
    /// Collects the measured times of timed launches: each becomes its
    /// function's estimate (the charge comes from the busy periods).
    pub fn collect_timings(s: &mut Session) {
        for (f, ns) in s.ctx.take_timings() {
            s.kernel_ns.insert(f, ns);
            s.timing.remove(&f);
        }
    }

    /// Submits a device operation on `stream` (`op`; a launch of `func`, or
    /// another operation) inside a busy period: opens one if none is open
    /// (under the scheduler), and times the gap between the period's start
    /// mark and the operation's submission.
    pub fn in_period<T>(
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
    pub fn period_add(&mut self, s: &mut Session, stream: Handle, func: Option<Handle>) {
        if self.gate.is_none() {
            return;
        }
        if s.period.is_none() {
            s.run.restart();
        }
        let p = s.period.get_or_insert_with(|| {
            let grant = self.gate.as_ref().map_or(0, |g| g.grants());
            let first = grant != self.period_grant;
            self.period_grant = grant;
            if first {
                // The grant's first device work: how long after the grant.
                let h = &self.stats.handoff;
                let held = self.gate.as_ref().map_or(0, |g| g.held_ns());
                super::handoff::Handoff::add(&h.first_submits, 1);
                super::handoff::Handoff::add(&h.first_submit_ns, held);
            }
            let timed = self.meter.open(first) && s.ctx.period_begin().is_ok();
            crate::session::Period::new(stream, timed, first)
        });
        p.add(stream, func);
    }

    /// Submits the session's queued launches (one run on one stream; see
    /// [`crate::session::LaunchRun`]). A failed launch is reported at the
    /// session's next synchronous call, as any asynchronous failure.
    pub fn flush_launches(&mut self, s: &mut Session) {
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
        run.grow();
        s.run = run;
    }

    /// Queues a validated launch in the session's run, submitting the run
    /// first if the launch cannot join it.
    pub fn queue_launch(&mut self, s: &mut Session, stream: Handle, launch: Launch, params: &[u8]) {
        if !s.run.takes(stream) {
            self.flush_launches(s);
        }
        self.period_add(s, stream, Some(launch.func));
        s.run.push(stream, launch, params);
    }

    /// Whether the work issued under the grant, by the kernels' estimates,
    /// fills the slice: launches are asynchronous, so the clock alone
    /// cannot tell.
    pub fn slice_filled(&mut self) -> bool {
        let issued = self.issued_ns;
        self.gate
            .as_mut()
            .is_some_and(|g| g.holding() && issued >= g.slice_ns() && !g.extended())
    }

    /// Whether the grant must be given back now: its time is over, or the
    /// work issued fills it while another vGPU waits. A lone holder whose
    /// work fills its slice waits for the service's extension instead (see
    /// `grant.rs`), keeping its work queued on the device.
    pub fn slice_ended(&mut self) -> bool {
        let Some(g) = self.gate.as_mut() else {
            return std::mem::take(&mut self.budget_spent);
        };
        if g.slice_over() {
            return true;
        }
        if self.budget_spent && g.alone() {
            if g.extended() {
                self.budget_spent = false;
            }
            return false;
        }
        self.budget_spent
    }

    /// Before a call that drains `stream` (`None`: all of them): whether it
    /// ends the open period; if so, marks the end on the device.
    pub fn period_ending(s: &mut Session, stream: Option<Handle>) -> bool {
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

    /// Charges a drained busy period (see [`Slice::period_ending`]).
    pub fn charge_period(&mut self, s: &mut Session, p: Period) {
        let host = crate::nanos(p.since.elapsed());
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
        // The kernel's estimate is the period's own time: not what the
        // charge carries over from earlier periods (see `PeriodMeter`).
        let single = p.single_function();
        let (ns, own, kind) = match device {
            Some(d) => {
                if let (Some((f, n)), false) = (single, p.first) {
                    s.launch_times.entry(f).or_default().learn(d, n);
                }
                let ns = self.meter.timed(host, d, !p.first);
                (ns, ns, usize::from(!p.first))
            }
            None => match single.and_then(|(f, n)| s.launch_times.get(&f)?.estimate(n)) {
                // One kernel's launches: its timed periods' mean, which
                // the host's delays do not reach.
                Some(est) => {
                    let ns = self.meter.estimated(est);
                    (ns, ns, 3)
                }
                None => {
                    let own = host.saturating_sub(self.meter.bias_ns());
                    (self.meter.untimed(host), own, 2)
                }
            },
        };
        self.charged_ns += ns;
        self.bursts += 1;
        self.stats.periods[kind].fetch_add(1, Ordering::Relaxed);
        self.stats.period_charges[kind].fetch_add(ns, Ordering::Relaxed);
        if let Some((f, n)) = single {
            s.kernel_ns.insert(f, own / u64::from(n.max(1)));
        }
    }
}
