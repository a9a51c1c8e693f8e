//! One guest process's state on the host, and the checks that stand between
//! its requests and the executor: every device pointer must lie inside one of
//! *its own* allocations, every handle must be one *it* was given, and its
//! allocations count against the vGPU's memory limit.

use std::collections::{BTreeMap, HashMap};

use protocol::Status;

use crate::executor::{Context, Handle, HandleMap, HandleSet, Launch, Queued};

pub mod arrays;
pub mod cond;
pub mod ipc;
mod restore;
pub mod share;
pub mod vmm;

/// Launches accepted from the ring but not yet submitted: a run on one
/// stream, submitted together (possibly as one graph launch, see
/// [`crate::executor::Launches::launch_many`]) before anything else of the session runs and
/// before the worker leaves the channel's queued requests.
#[derive(Debug, Default)]
pub struct LaunchRun {
    /// The stream of all of them.
    pub stream: Handle,
    /// The launches, in order.
    pub launches: Vec<Queued>,
    /// Their packed parameters, one after another.
    pub params: Vec<u8>,
    /// The longest this run may grow (see [`LaunchRun::grow`]).
    cap: usize,
}

impl LaunchRun {
    /// Longest run: the worker submits it when it grows to this (it takes
    /// at most as many requests from a channel in one pass).
    pub const MAX: usize = 64;

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.launches.is_empty()
    }

    /// Whether a launch on `stream` can join (else the run goes first).
    pub fn takes(&self, stream: Handle) -> bool {
        self.is_empty() || (self.stream == stream && self.launches.len() < self.cap.max(1))
    }

    /// After a run was submitted: the next may be twice as long, up to
    /// [`LaunchRun::MAX`].
    pub fn grow(&mut self) {
        self.cap = (self.cap * 2).clamp(1, Self::MAX);
    }

    /// When the device may have run out of the session's work (a busy
    /// period begins): the next launch goes alone, so that the device
    /// starts on it while the worker gathers the ones behind it.
    pub fn restart(&mut self) {
        self.cap = 1;
    }

    /// Queues a launch (after [`LaunchRun::takes`] said yes).
    pub fn push(&mut self, stream: Handle, launch: Launch, params: &[u8]) {
        debug_assert!(self.takes(stream));
        self.stream = stream;
        let at = self.params.len();
        self.params.extend_from_slice(params);
        self.launches.push(Queued {
            launch,
            params: at..self.params.len(),
        });
    }

    /// Empties it, keeping its buffers.
    pub fn clear(&mut self) {
        self.launches.clear();
        self.params.clear();
    }
}

/// What the host keeps for one claimed channel.
pub struct Session {
    /// Unique in the process: tells a session from a later one on the same channel.
    pub id: u64,
    /// The executor context (dropping it frees everything on the device).
    pub ctx: Box<dyn Context>,
    /// base -> length of each live allocation.
    allocs: BTreeMap<u64, u64>,
    /// base -> length of module globals: addressable, not freeable, not
    /// counted against the memory limit.
    globals: BTreeMap<u64, u64>,
    /// base -> device memory the allocation takes (its size rounded up to
    /// the allocator's granularity), counted against the memory limit.
    charges: HashMap<u64, u64>,
    /// Device memory held, bytes (what the allocations take).
    pub mem_used: u64,
    modules: HandleSet,
    /// function -> parameter sizes.
    functions: HandleMap<Vec<u32>>,
    streams: HandleSet,
    events: HandleSet,
    /// Executable graphs built on the host.
    graphs: HandleSet,
    /// Conditional scopes and their handles.
    pub conds: cond::CondScopes,
    /// The first error of an asynchronous call, reported at the next synchronous one.
    pub pending_error: Option<Status>,
    /// Estimated GPU time of one launch of each function, learnt from busy
    /// periods that ran only that function (or from timed launches).
    pub kernel_ns: HandleMap<u64>,
    /// Each kernel's device time per launch from its timed busy periods,
    /// which charges its untimed ones (see `sched::accounting::LaunchTime`).
    pub launch_times: HandleMap<sched::accounting::LaunchTime>,
    /// Functions with a timed launch on its way (one at a time: timing
    /// every launch of a kernel not yet known would keep the device waiting
    /// on events between them).
    pub timing: HandleSet,
    /// The busy period open on the device, if any.
    pub period: Option<Period>,
    /// Blocks per multiprocessor of each (function, threads per block,
    /// shared memory): the occupancy API's answer, asked once per
    /// configuration.
    pub occupancy: HashMap<(Handle, u32, u32), u32>,
    /// Launches accepted and not yet submitted.
    pub run: LaunchRun,
    /// The guest host function the session waits on (see
    /// `Request::HostFn`): its later requests run only once it has run.
    pub host_fn: Option<HostFnWait>,
    /// Stream-ordered frees: each allocation is freed once the device
    /// passes its mark (what it takes stays counted until then).
    pub deferred_frees: Vec<(crate::executor::Marker, u64, u64)>,
    /// Reservations, physical memory and mappings of the VMM API.
    pub vmm: vmm::Vmm,
    /// Its memory exported to the VM's other processes (IPC).
    pub exported: ipc::Exported,
    /// Other processes' memory it opened (IPC).
    pub imports: ipc::Imports,
    /// Its allocations it freed while others had them open (IPC).
    pub orphans: ipc::Orphans,
    /// Its events exported to the VM's other processes (IPC), by handle.
    pub exported_events: ipc::Exported,
    /// Other processes' events it opened (IPC): its handle -> the export.
    pub imported_events: ipc::OpenedEvents,
    /// Its events it destroyed while others had them open (IPC): each is
    /// destroyed once they let go of them.
    pub event_orphans: ipc::Orphans,
    /// Its shareable handles (VMM memory and pools) exported and imported.
    pub shares: share::Shares,
    /// Its CUDA arrays, texture and surface objects.
    pub arrays: arrays::Arrays,
}

/// A guest host function between its stream reaching it and the guest
/// saying it ran.
#[derive(Debug)]
pub struct HostFnWait {
    /// The guest's number for it.
    pub id: u64,
    /// Its point in the stream, until the device passes it.
    pub mark: Option<crate::executor::Marker>,
    /// What the work before it came to (once the device passed the mark).
    pub ready: Option<Result<(), Status>>,
    /// Handed to the guest's callback thread.
    pub delivered: bool,
}

impl HostFnWait {
    /// Whether the device has passed its point (looking again if not).
    pub fn poll(&mut self, ctx: &mut dyn Context) -> Option<Result<(), Status>> {
        if self.ready.is_none() {
            let m = self.mark?;
            match ctx.reached(m) {
                Ok(false) => return None,
                Ok(true) => self.ready = Some(Ok(())),
                Err(e) => self.ready = Some(Err(e)),
            }
            self.mark = None;
        }
        self.ready
    }
}

/// A busy period: from the first device operation after the session's work
/// was drained to the next drain (see [`sched::accounting::PeriodMeter`]).
#[derive(Debug)]
pub struct Period {
    /// Host time just before its first operation was submitted.
    pub since: std::time::Instant,
    /// Whether the device timestamps its ends (events).
    pub timed: bool,
    /// The first period of its grant.
    pub first: bool,
    /// When the device's start mark was submitted (until the first
    /// operation's submission has been timed from it).
    pub mark_at: Option<std::time::Instant>,
    /// Host time from the start mark's submission to the first operation's:
    /// the device idled for it only because of the mark.
    pub gap_ns: u64,
    /// Streams it put work on.
    pub streams: Vec<Handle>,
    /// Launches in it.
    pub launches: u32,
    /// The function of its launches while all are of one function and
    /// nothing else ran (its time then tells that function's).
    pub only: Option<Handle>,
    /// Something other than launches of `only` ran.
    pub mixed: bool,
}

impl Period {
    /// A period whose first operation goes to `stream`.
    pub fn new(stream: Handle, timed: bool, first: bool) -> Period {
        let since = std::time::Instant::now();
        Period {
            since,
            timed,
            first,
            mark_at: timed.then_some(since),
            gap_ns: 0,
            streams: vec![stream],
            launches: 0,
            only: None,
            mixed: false,
        }
    }

    /// Another operation on `stream`: a launch of `func`, or not a launch.
    pub fn add(&mut self, stream: Handle, func: Option<Handle>) {
        if !self.streams.contains(&stream) {
            self.streams.push(stream);
        }
        match func {
            Some(f) => {
                self.launches += 1;
                match self.only {
                    None if !self.mixed && self.launches == 1 => self.only = Some(f),
                    Some(g) if g == f => {}
                    _ => self.mixed = true,
                }
            }
            None => self.mixed = true,
        }
    }

    /// The operation that opened the period has been submitted: the time
    /// since the start mark is the mark's own gap.
    pub fn submitted(&mut self) {
        if let Some(t) = self.mark_at.take() {
            self.gap_ns = crate::nanos(t.elapsed());
        }
    }

    /// Whether draining `stream` (`None`: every stream) drains the period.
    pub fn drained_by(&self, stream: Option<Handle>) -> bool {
        stream.is_none_or(|s| self.streams.iter().all(|&x| x == s))
    }

    /// The one function this period ran and how many launches, if that is all it ran.
    pub fn single_function(&self) -> Option<(Handle, u32)> {
        match (self.mixed, self.only) {
            (false, Some(f)) => Some((f, self.launches)),
            _ => None,
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("allocs", &self.allocs.len())
            .field("mem_used", &self.mem_used)
            .finish()
    }
}

impl Session {
    /// A session over a fresh context.
    pub fn new(ctx: Box<dyn Context>) -> Session {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Session {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ctx,
            allocs: BTreeMap::new(),
            globals: BTreeMap::new(),
            charges: HashMap::new(),
            mem_used: 0,
            modules: HandleSet::default(),
            functions: HandleMap::default(),
            streams: HandleSet::default(),
            events: HandleSet::default(),
            graphs: HandleSet::default(),
            conds: Default::default(),
            pending_error: None,
            kernel_ns: HandleMap::default(),
            launch_times: HandleMap::default(),
            timing: HandleSet::default(),
            period: None,
            occupancy: HashMap::new(),
            run: LaunchRun::default(),
            deferred_frees: Vec::new(),
            host_fn: None,
            vmm: vmm::Vmm::default(),
            exported: ipc::Exported::default(),
            imports: ipc::Imports::default(),
            orphans: ipc::Orphans::default(),
            exported_events: ipc::Exported::default(),
            imported_events: ipc::OpenedEvents::default(),
            event_orphans: ipc::Orphans::default(),
            shares: share::Shares::default(),
            arrays: arrays::Arrays::default(),
        }
    }

    /// Checks that [ptr, ptr+len) lies inside one of this session's
    /// allocations or module globals, in memory it mapped, or in memory of
    /// another process it opened (IPC) that is still exported.
    pub fn check_range(&self, ptr: u64, len: u64) -> Result<(), Status> {
        let end = ptr.checked_add(len).ok_or(Status::InvalidValue)?;
        let inside = |m: &BTreeMap<u64, u64>| {
            m.range(..=ptr)
                .next_back()
                .is_some_and(|(&base, &size)| end <= base + size)
        };
        if inside(&self.allocs)
            || inside(&self.globals)
            || self.vmm.covers(ptr, len)
            || self.imports.covers(ptr, end)
        {
            Ok(())
        } else {
            Err(Status::InvalidValue)
        }
    }

    /// The allocation or VMM mapping holding `ptr`, as IPC exports it:
    /// its start and size.
    pub fn exportable(&self, ptr: u64) -> Option<(u64, u64)> {
        let alloc = self
            .allocs
            .range(..=ptr)
            .next_back()
            .filter(|(&b, &n)| ptr - b < n.max(1))
            .map(|(&b, &n)| (b, n));
        alloc.or_else(|| self.vmm.mapping_of(ptr))
    }

    /// Records a module global's range.
    pub fn add_global(&mut self, base: u64, size: u64) {
        self.globals.insert(base, size);
    }

    /// Records a new allocation of `size` bytes that takes `charge` bytes
    /// of device memory.
    pub fn add_alloc(&mut self, base: u64, size: u64, charge: u64) {
        self.allocs.insert(base, size);
        self.charges.insert(base, charge);
        self.mem_used += charge;
    }

    /// Takes an allocation out of the table (no longer addressable by the
    /// guest) without uncounting it: a stream-ordered free, done later.
    pub fn detach_alloc(&mut self, base: u64) -> Result<u64, Status> {
        let size = self.allocs.remove(&base).ok_or(Status::InvalidValue)?;
        self.exported.revoke(base, base.saturating_add(size.max(1)));
        Ok(self.charges.remove(&base).unwrap_or(0))
    }

    /// Takes allocation `base` out of the table if another process has it
    /// open (IPC): it stays on the device, counted, until they close it
    /// ([`ipc::Orphans`]). False if nobody has it open.
    pub fn orphan_if_opened(&mut self, base: u64) -> bool {
        if !self.allocs.contains_key(&base) {
            return false;
        }
        let Some(e) = self.exported.take_opened(base) else {
            return false;
        };
        self.allocs.remove(&base);
        let charge = self.charges.remove(&base).unwrap_or(0);
        e.withdraw();
        self.orphans.push(base, charge, e);
        true
    }

    /// Takes its event `e` out of its table if another process has it open
    /// (IPC): it stays until they let go of it ([`ipc::Orphans`]). False if
    /// nobody has it open.
    pub fn orphan_event_if_opened(&mut self, e: Handle) -> bool {
        if !self.events.contains(&e) {
            return false;
        }
        let Some(x) = self.exported_events.take_opened(e) else {
            return false;
        };
        self.events.remove(&e);
        x.withdraw();
        self.event_orphans.push(e, 0, x);
        true
    }

    /// What keeps the session's context on its GPU, if anything: an
    /// object of the executor's, or memory shared through a shareable
    /// handle (its other holder could not follow).
    pub fn migration_keeper_to(&self, gpu: u32) -> Option<crate::executor::Keeper> {
        self.ctx.migration_keeper_to(gpu).or_else(|| {
            if self.ipc_across() {
                return Some(crate::executor::Keeper::IpcAcrossWorkers);
            }
            self.shares
                .any()
                .then_some(crate::executor::Keeper::SharedHandle)
        })
    }

    /// Whether it holds IPC memory or events open across the VM's workers
    /// (opened from another worker's process, or its own opened by one):
    /// the other worker holds the driver's handles on this GPU, so the
    /// vGPU stays while they are open (see `requests/ipc_across.rs`).
    pub fn ipc_across(&self) -> bool {
        !self.imports.remote().is_empty()
            || self.imported_events.any_remote()
            || self.exported.any_opened_across()
            || self.exported_events.any_opened_across()
            || self.orphans.any_opened_across()
    }

    /// Uncounts what a detached allocation took, once freed.
    pub fn uncount(&mut self, charge: u64) {
        self.mem_used -= charge;
    }

    /// Removes an allocation by its exact base; returns what it took.
    pub fn remove_alloc(&mut self, base: u64) -> Result<u64, Status> {
        let size = self.allocs.remove(&base).ok_or(Status::InvalidValue)?;
        self.exported.revoke(base, base.saturating_add(size.max(1)));
        let charge = self.charges.remove(&base).unwrap_or(0);
        self.mem_used -= charge;
        Ok(charge)
    }

    /// Checks a stream handle (0 is the default stream).
    pub fn check_stream(&self, s: Handle) -> Result<(), Status> {
        if s == 0 || self.streams.contains(&s) {
            Ok(())
        } else {
            Err(Status::InvalidHandle)
        }
    }

    /// Checks an event handle: one of its own, or another process's it
    /// opened that is still exported.
    pub fn check_event(&self, e: Handle) -> Result<(), Status> {
        (self.events.contains(&e) || self.imported_events.alive(e))
            .then_some(())
            .ok_or(Status::InvalidHandle)
    }

    /// Checks that `e` is an event the session made itself.
    pub fn check_own_event(&self, e: Handle) -> Result<(), Status> {
        self.events
            .contains(&e)
            .then_some(())
            .ok_or(Status::InvalidHandle)
    }

    /// Checks an executable graph's handle.
    pub fn check_graph(&self, g: Handle) -> Result<(), Status> {
        self.graphs
            .contains(&g)
            .then_some(())
            .ok_or(Status::InvalidHandle)
    }

    /// Records an executable graph.
    pub fn add_graph(&mut self, g: Handle) {
        self.graphs.insert(g);
    }

    /// Forgets an executable graph.
    pub fn remove_graph(&mut self, g: Handle) {
        self.graphs.remove(&g);
    }

    /// Checks a graph's nodes against what the session holds: every
    /// kernel's function is its own and gets the parameter bytes its
    /// parameters take, every range lies in its own memory, every event is
    /// its own, at any depth of conditional bodies; every conditional node
    /// names a handle of `scope` (a scope of its own).
    pub fn check_graph_nodes(
        &self,
        scope: Option<Handle>,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<(), Status> {
        use protocol::graph::GraphOp;
        self.conds.check_nodes(scope, nodes)?;
        protocol::graph::visit(nodes, &mut |n| {
            match &n.op {
                GraphOp::Kernel { func, params, .. } => {
                    let want: u64 = self.function(*func)?.iter().map(|&x| u64::from(x)).sum();
                    if want != params.len() as u64 {
                        return Err(Status::InvalidValue);
                    }
                }
                GraphOp::EventRecord { event } | GraphOp::EventWait { event } => {
                    self.check_event(*event)?
                }
                op => {
                    for (a, l) in op.ranges() {
                        self.check_range(a, l)?;
                    }
                }
            }
            Ok(())
        })
    }

    /// Checks a module handle.
    pub fn check_module(&self, m: Handle) -> Result<(), Status> {
        self.modules
            .contains(&m)
            .then_some(())
            .ok_or(Status::InvalidHandle)
    }

    /// Parameter sizes of a function handle.
    pub fn function(&self, f: Handle) -> Result<&[u32], Status> {
        self.functions
            .get(&f)
            .map(Vec::as_slice)
            .ok_or(Status::InvalidHandle)
    }

    /// Table updates after successful executor calls.
    pub fn add_module(&mut self, m: Handle) {
        self.modules.insert(m);
    }
    /// Forgets a module.
    pub fn remove_module(&mut self, m: Handle) {
        self.modules.remove(&m);
    }
    /// Records a function.
    pub fn add_function(&mut self, f: Handle, sizes: Vec<u32>) {
        self.functions.insert(f, sizes);
    }
    /// Records a stream.
    pub fn add_stream(&mut self, s: Handle) {
        self.streams.insert(s);
    }
    /// Forgets a stream.
    pub fn remove_stream(&mut self, s: Handle) {
        self.streams.remove(&s);
    }
    /// Records an event.
    pub fn add_event(&mut self, e: Handle) {
        self.events.insert(e);
    }
    /// Forgets an event.
    pub fn remove_event(&mut self, e: Handle) {
        self.events.remove(&e);
        self.exported_events.revoke(e, e.saturating_add(1));
    }

    /// Records the first asynchronous error.
    pub fn defer(&mut self, s: Status) {
        self.pending_error.get_or_insert(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::sim::{SimExecutor, SimParams};
    use crate::executor::Executor;

    #[test]
    fn ranges_must_lie_in_own_allocations() {
        let mut s = Session::new(SimExecutor::new(SimParams::default()).open().unwrap());
        s.add_alloc(0x1000, 0x100, 0x100);
        s.add_alloc(0x3000, 0x100, 0x100);
        assert!(s.check_range(0x1000, 0x100).is_ok());
        assert!(s.check_range(0x10ff, 1).is_ok());
        assert!(s.check_range(0x10ff, 2).is_err(), "crosses the end");
        assert!(s.check_range(0x2000, 1).is_err(), "between allocations");
        assert!(s.check_range(0xfff, 1).is_err(), "before the first");
        assert!(s.check_range(0x3000, u64::MAX).is_err(), "overflow");
        assert_eq!(s.remove_alloc(0x1000), Ok(0x100));
        assert!(s.check_range(0x1000, 1).is_err(), "use after free");
        assert!(s.remove_alloc(0x1000).is_err(), "double free");
        assert_eq!(s.mem_used, 0x100);
        assert!(s.check_stream(0).is_ok());
        assert!(s.check_stream(5).is_err());
    }
}
