//! A deterministic discrete-event simulator of GPU sharing between VMs.
//!
//! Modeled: physical cores running vCPUs under a CFS-like fair CPU scheduler
//! (vruntime, a 6 ms latency target, 0.75 ms minimum granularity, wake-up
//! preemption); one vCPU per VM running its [`Workload`] loop: host code,
//! asynchronous launches and synchronous calls, each call costing the guest
//! CPU time and a ring crossing; a guest waiting on a reply spins (using its
//! vCPU) and, under hybrid spinning, blocks after a budget and is woken by an
//! interrupt; one host worker per vGPU; one non-preemptive GPU executing
//! operations in submission order. A [`Policy`] decides which worker may
//! submit. Everything is integer nanoseconds and the event queue breaks ties
//! by insertion order, so a run is a pure function of its inputs.
//!
//! The policies: [`Policy::None`] (every worker submits at once: the
//! driver's first come first served), the credit baselines with polling or
//! hybrid spinning, strict CPU-GPU coscheduling (Pegasus: a vGPU may use the
//! GPU only while its vCPU runs, with the credit check), and fairvgpu's
//! [`GpuScheduler`] with collaborative accounting, work conservation and
//! GPU-centric coscheduling (with an ablation without work conservation).

pub mod scenario;
pub mod workload;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use sched::{DevicePolicy, GpuScheduler};

use crate::credit::{self, CreditScheduler};
use crate::SimError;
pub use workload::{Step, Workload};

/// GPU scheduling policies the simulator can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// No scheduler: first come first served on the GPU queue.
    None,
    /// Credit scheduler; guests poll for replies and the holder polls its
    /// ring for its whole slice.
    CreditPoll,
    /// Credit scheduler with hybrid spinning on both sides.
    CreditHs,
    /// Strict coscheduling (Pegasus): only a vGPU whose vCPU is running may
    /// hold the GPU; credit check; hybrid spinning.
    Strict,
    /// fairvgpu: start-tag fair queuing, 6 ms slices charged by measured GPU
    /// time, work-conserving hybrid spinning, GPU-centric coscheduling.
    FairGv,
    /// fairvgpu without work conservation: an idle holder keeps its slice.
    FairGvNoWc,
    /// fairvgpu charging only the GPU time of the work (not the holder's
    /// own gaps while it holds the GPU): an ablation of the charge.
    FairGvGpuCharge,
    /// fairvgpu's machinery with Strings' least-attained-service order
    /// ([`sched::DevicePolicy::Las`]) instead of start tags.
    FairGvLas,
    /// fairvgpu's machinery with Strings' true-fair-share order
    /// ([`sched::DevicePolicy::Tfs`]).
    FairGvTfs,
}

impl Policy {
    /// Name used in tables.
    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::CreditPoll => "credit-poll",
            Policy::CreditHs => "credit-hs",
            Policy::Strict => "strict-cosched",
            Policy::FairGv => "fairvgpu",
            Policy::FairGvNoWc => "fairvgpu-no-wc",
            Policy::FairGvGpuCharge => "fairvgpu-gpu-charge",
            Policy::FairGvLas => "fairvgpu-las",
            Policy::FairGvTfs => "fairvgpu-tfs",
        }
    }

    /// Guests wait by polling (no budget) rather than spin-then-block.
    /// (Strict coscheduling needs it: a vCPU blocked on its reply would
    /// never run again to let its vGPU be scheduled.)
    fn guest_polls(self) -> bool {
        matches!(self, Policy::CreditPoll | Policy::Strict)
    }

    /// An idle holder gives the GPU back after a short spin.
    fn work_conserving(self) -> bool {
        !matches!(self, Policy::CreditPoll | Policy::FairGvNoWc)
    }

    fn fairgv(self) -> bool {
        matches!(
            self,
            Policy::FairGv
                | Policy::FairGvNoWc
                | Policy::FairGvGpuCharge
                | Policy::FairGvLas
                | Policy::FairGvTfs
        )
    }

    /// The device-level order of the fairvgpu policies.
    fn device_policy(self) -> DevicePolicy {
        match self {
            Policy::FairGvLas => DevicePolicy::Las,
            Policy::FairGvTfs => DevicePolicy::Tfs,
            _ => DevicePolicy::FairQueue,
        }
    }
}

/// The modeled machine's constants.
#[derive(Debug, Clone, Copy)]
pub struct Machine {
    /// Guest CPU time to issue one call (marshal, write the descriptor).
    pub call_cpu_ns: u64,
    /// Guest to host ring crossing.
    pub ring_ns: u64,
    /// Host to guest reply crossing.
    pub reply_ns: u64,
    /// Interrupt + wake-up of a blocked vCPU.
    pub wake_ns: u64,
    /// Guest spin budget before blocking (hybrid spinning).
    pub guest_spin_ns: u64,
    /// Host worker spin budget before an idle holder yields.
    pub host_spin_ns: u64,
    /// CFS latency target.
    pub cfs_latency_ns: u64,
    /// CFS minimum granularity.
    pub cfs_min_gran_ns: u64,
    /// CFS wake-up preemption granularity.
    pub cfs_wakeup_gran_ns: u64,
    /// fairvgpu's slice on a non-preemptive GPU.
    pub fairgv_slice_ns: u64,
    /// The credit baselines' slice.
    pub credit_slice_ns: u64,
}

impl Default for Machine {
    fn default() -> Self {
        Machine {
            call_cpu_ns: 1_000,
            ring_ns: 1_000,
            reply_ns: 1_000,
            wake_ns: 5_000,
            guest_spin_ns: 50_000,
            host_spin_ns: 50_000,
            cfs_latency_ns: 6_000_000,
            cfs_min_gran_ns: 750_000,
            cfs_wakeup_gran_ns: 1_000_000,
            fairgv_slice_ns: 6_000_000,
            credit_slice_ns: credit::PERIOD_NS,
        }
    }
}

/// One VM of a scenario.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// What its guest runs.
    pub workload: Workload,
    /// Its GPU weight.
    pub weight: f64,
    /// The physical core its vCPU is pinned to.
    pub core: usize,
}

/// What happened in one run, counted after a warm-up of a tenth of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStats {
    /// Length of the measured window.
    pub window_ns: u64,
    /// Loop iterations completed per VM.
    pub iters: Vec<u64>,
    /// GPU time used per VM.
    pub gpu_ns: Vec<u64>,
    /// Time each VM's guest slept (periodic workloads).
    pub sleep_ns: Vec<u64>,
    /// Synchronous calls made per VM.
    pub sync_calls: Vec<u64>,
    /// Asynchronous calls made per VM.
    pub async_calls: Vec<u64>,
    /// Grants handed out (scheduled policies).
    pub grants: u64,
    /// Events processed (a cost figure for the simulator itself).
    pub events: u64,
}

impl RunStats {
    /// Fraction of the window the GPU was busy.
    pub fn gpu_util(&self) -> f64 {
        self.gpu_ns.iter().sum::<u64>() as f64 / self.window_ns as f64
    }
}

// ---------------------------------------------------------------------------
// Engine

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GpuOp {
    ns: u64,
    sync: bool,
}

#[derive(Debug, Clone, Copy)]
enum Inst {
    Cpu(u64),
    Send(GpuOp),
    Wait,
    SleepUntil(u64),
}

fn compile(w: &Workload, m: &Machine) -> Vec<Inst> {
    let mut out = Vec::new();
    for s in &w.steps {
        match *s {
            Step::Cpu(ns) => out.push(Inst::Cpu(ns)),
            Step::Launch(ns) => {
                out.push(Inst::Cpu(m.call_cpu_ns.max(1)));
                out.push(Inst::Send(GpuOp { ns, sync: false }));
            }
            Step::Sync(ns) => {
                out.push(Inst::Cpu(m.call_cpu_ns.max(1)));
                out.push(Inst::Send(GpuOp { ns, sync: true }));
                out.push(Inst::Wait);
            }
            Step::SleepUntilPeriod(p) => out.push(Inst::SleepUntil(p.max(1))),
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VState {
    Running,
    Runnable,
    Blocked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Must interpret its next instruction.
    Ready,
    Compute(u64),
    /// Spinning on a reply; budget left (None: forever).
    Spin(Option<u64>),
    /// Blocked on a reply.
    Waiting,
    /// Blocked in a periodic sleep.
    Sleeping,
}

#[derive(Debug)]
struct Vm {
    prog: Vec<Inst>,
    pc: usize,
    core: usize,
    vstate: VState,
    act: Act,
    vruntime: u64,
    reply_ready: bool,
    wake_gen: u64,
    /// The end of the current period of a periodic workload (0: not started).
    period_end: u64,
    // Host worker.
    block_gen: u64,
    pending: VecDeque<GpuOp>,
    outstanding: u32,
    // Stats.
    iters: u64,
    gpu_ns: u64,
    sleep_ns: u64,
    sync_calls: u64,
    async_calls: u64,
}

#[derive(Debug, Default)]
struct Core {
    cur: Option<usize>,
    runq: Vec<usize>,
    gen: u64,
    slice_end: u64,
    last: u64,
    min_vruntime: u64,
}

#[derive(Debug, Clone, Copy)]
struct Holder {
    vm: usize,
    gen: u64,
    start: u64,
    submitted_ns: u64,
    releasing: bool,
    idle: bool,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Core { core: usize, gen: u64 },
    Wake { vm: usize, gen: u64 },
    Kick { vm: usize },
    Request { vm: usize, op: GpuOp },
    Reply { vm: usize },
    GpuDone,
    HostIdle { gen: u64 },
    SfqBlock { vm: usize, gen: u64 },
    SliceEnd { gen: u64 },
    CreditTick,
    CreditPeriod,
}

struct Engine {
    m: Machine,
    policy: Policy,
    now: u64,
    warm: u64,
    end: u64,
    seq: u64,
    events: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    evs: Vec<Option<Ev>>,
    free: Vec<usize>,
    vms: Vec<Vm>,
    cores: Vec<Core>,
    gpu: VecDeque<(usize, GpuOp)>,
    /// When the GPU's queue drains.
    gpu_tail: u64,
    holder: Option<Holder>,
    holder_gen: u64,
    grants: u64,
    sfq: GpuScheduler,
    credit: CreditScheduler,
    pump_needed: bool,
}

/// Runs `vms` on `cores` cores under `policy` for `duration_ns` of
/// simulated time.
pub fn run(
    vms: &[VmSpec],
    cores: usize,
    policy: Policy,
    m: &Machine,
    duration_ns: u64,
) -> Result<RunStats, SimError> {
    if vms.is_empty() {
        return Err(SimError::NoVms);
    }
    for (i, v) in vms.iter().enumerate() {
        if v.core >= cores {
            return Err(SimError::NoSuchCore {
                vm: i,
                core: v.core,
                cores,
            });
        }
        if !v.workload.is_well_formed() {
            return Err(SimError::EmptyLoop(v.workload.name.clone()));
        }
        if !(v.weight.is_finite() && v.weight > 0.0) {
            return Err(SimError::BadWeight(i));
        }
    }
    let mut e = Engine {
        m: *m,
        policy,
        now: 0,
        warm: duration_ns / 10,
        end: duration_ns,
        seq: 0,
        events: 0,
        queue: BinaryHeap::new(),
        evs: Vec::new(),
        free: Vec::new(),
        vms: vms
            .iter()
            .map(|s| Vm {
                prog: compile(&s.workload, m),
                pc: 0,
                core: s.core,
                vstate: VState::Runnable,
                act: Act::Ready,
                vruntime: 0,
                reply_ready: false,
                wake_gen: 0,
                period_end: 0,
                block_gen: 0,
                pending: VecDeque::new(),
                outstanding: 0,
                iters: 0,
                gpu_ns: 0,
                sleep_ns: 0,
                sync_calls: 0,
                async_calls: 0,
            })
            .collect(),
        cores: (0..cores).map(|_| Core::default()).collect(),
        gpu: VecDeque::new(),
        gpu_tail: 0,
        holder: None,
        holder_gen: 0,
        grants: 0,
        sfq: GpuScheduler::with_policy(m.fairgv_slice_ns, policy.device_policy()),
        credit: CreditScheduler::new(),
        pump_needed: false,
    };
    for (i, v) in vms.iter().enumerate() {
        // Validated above, so adding cannot fail.
        let _ = e.sfq.add(i as u32, v.weight);
        let _ = e.credit.add(i as u32, v.weight);
        e.cores[v.core].runq.push(i);
    }
    if matches!(
        policy,
        Policy::CreditPoll | Policy::CreditHs | Policy::Strict
    ) {
        e.at(credit::TICK_NS, Ev::CreditTick);
        e.at(credit::PERIOD_NS, Ev::CreditPeriod);
    }
    for c in 0..cores {
        e.dispatch(c);
        e.arm(c);
    }
    e.run_loop();
    Ok(e.stats())
}

impl Engine {
    fn at(&mut self, t: u64, ev: Ev) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.evs[s] = Some(ev);
                s
            }
            None => {
                self.evs.push(Some(ev));
                self.evs.len() - 1
            }
        };
        self.seq += 1;
        self.queue.push(Reverse((t, self.seq, slot)));
    }

    fn run_loop(&mut self) {
        while let Some(Reverse((t, _, slot))) = self.queue.pop() {
            if t > self.end {
                break;
            }
            let Some(ev) = self.evs[slot].take() else {
                continue;
            };
            self.free.push(slot);
            self.now = t;
            self.events += 1;
            self.handle(ev);
            if self.pump_needed {
                self.pump_needed = false;
                self.pump();
            }
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Core { core, gen } => {
                if self.cores[core].gen == gen {
                    self.core_event(core);
                }
            }
            Ev::Wake { vm, gen } => {
                if self.vms[vm].wake_gen == gen {
                    self.wake(vm, false);
                }
            }
            Ev::Kick { vm } => self.wake(vm, true),
            Ev::Request { vm, op } => {
                self.vms[vm].pending.push_back(op);
                self.vms[vm].block_gen += 1;
                if self.policy.fairgv() {
                    let waiter = op.sync.then_some(vm as u32);
                    let _ = self.sfq.request(vm as u32, self.now, waiter);
                }
                self.pump_needed = true;
            }
            Ev::Reply { vm } => self.reply(vm),
            Ev::GpuDone => self.gpu_done(),
            Ev::HostIdle { gen } => {
                if let Some(h) = self.holder.as_mut() {
                    if h.gen == gen && h.idle {
                        h.releasing = true;
                        self.pump_needed = true;
                    }
                }
            }
            Ev::SfqBlock { vm, gen } => {
                let holding = self.holder.is_some_and(|h| h.vm == vm);
                if self.vms[vm].block_gen == gen && self.vms[vm].pending.is_empty() && !holding {
                    let _ = self.sfq.idle(vm as u32, self.now);
                }
            }
            Ev::SliceEnd { gen } => {
                if let Some(h) = self.holder.as_mut() {
                    if h.gen == gen {
                        h.releasing = true;
                        self.pump_needed = true;
                    }
                }
            }
            Ev::CreditTick => {
                if let Some(h) = self.holder {
                    self.credit.tick(h.vm as u32);
                }
                self.at(self.now + credit::TICK_NS, Ev::CreditTick);
            }
            Ev::CreditPeriod => {
                self.credit.period();
                self.at(self.now + credit::PERIOD_NS, Ev::CreditPeriod);
            }
        }
    }

    // --- CPU side --------------------------------------------------------

    /// Brings the running vCPU of `c` up to now: vruntime and progress.
    fn settle(&mut self, c: usize) {
        let now = self.now;
        let core = &mut self.cores[c];
        let dt = now - core.last;
        core.last = now;
        if let Some(v) = core.cur {
            let vm = &mut self.vms[v];
            vm.vruntime += dt;
            match &mut vm.act {
                Act::Compute(left) => *left -= dt.min(*left),
                Act::Spin(Some(left)) => *left -= dt.min(*left),
                _ => {}
            }
            let cur_vr = vm.vruntime;
            let min_rq = core.runq.iter().map(|&r| self.vms[r].vruntime).min();
            let lowest = min_rq.map_or(cur_vr, |r| r.min(cur_vr));
            core.min_vruntime = core.min_vruntime.max(lowest);
        }
    }

    /// Arms the next event of core `c`: its running vCPU's work or spin
    /// budget running out, or its slice ending while others wait.
    fn arm(&mut self, c: usize) {
        let core = &mut self.cores[c];
        core.gen += 1;
        let Some(v) = core.cur else { return };
        let mut t = if core.runq.is_empty() {
            u64::MAX
        } else {
            core.slice_end
        };
        match self.vms[v].act {
            Act::Compute(left) => t = t.min(self.now + left),
            Act::Spin(Some(left)) => t = t.min(self.now + left),
            _ => {}
        }
        if t != u64::MAX {
            let gen = core.gen;
            self.at(t.max(self.now), Ev::Core { core: c, gen });
        }
    }

    /// Puts the lowest-vruntime runnable vCPU on the idle core `c` (and the
    /// next one if that one blocks at once).
    fn dispatch(&mut self, c: usize) {
        while self.cores[c].cur.is_none() {
            let core = &self.cores[c];
            let Some(&v) = core.runq.iter().min_by_key(|&&r| (self.vms[r].vruntime, r)) else {
                return;
            };
            self.run_on(c, v);
        }
    }

    /// Runs runnable vCPU `v` on the idle core `c`.
    fn run_on(&mut self, c: usize, v: usize) {
        let core = &mut self.cores[c];
        debug_assert!(core.cur.is_none());
        let nr = core.runq.len() as u64;
        core.runq.retain(|&r| r != v);
        let slice = (self.m.cfs_latency_ns / nr.max(1)).max(self.m.cfs_min_gran_ns);
        core.cur = Some(v);
        core.last = self.now;
        core.slice_end = self.now + slice;
        self.pump_needed |= self.policy == Policy::Strict;
        let vm = &mut self.vms[v];
        vm.vstate = VState::Running;
        if matches!(vm.act, Act::Spin(_)) && vm.reply_ready {
            vm.act = Act::Ready;
        }
        if vm.act == Act::Ready {
            self.proceed(v);
        }
    }

    /// Takes the running vCPU off core `c` (it stays runnable).
    fn preempt(&mut self, c: usize) {
        if let Some(v) = self.cores[c].cur.take() {
            self.vms[v].vstate = VState::Runnable;
            self.cores[c].runq.push(v);
            self.pump_needed |= self.policy == Policy::Strict;
        }
    }

    fn core_event(&mut self, c: usize) {
        self.settle(c);
        if let Some(v) = self.cores[c].cur {
            match self.vms[v].act {
                Act::Compute(0) => {
                    self.vms[v].pc += 1;
                    self.vms[v].act = Act::Ready;
                    self.proceed(v);
                }
                Act::Spin(Some(0)) => self.block(v, Act::Waiting),
                _ => {}
            }
        }
        let core = &self.cores[c];
        if core.cur.is_some() && self.now >= core.slice_end && !core.runq.is_empty() {
            self.preempt(c);
        }
        if self.cores[c].cur.is_none() {
            self.dispatch(c);
        }
        self.arm(c);
    }

    /// The running vCPU `v` stops running until woken.
    fn block(&mut self, v: usize, act: Act) {
        let c = self.vms[v].core;
        debug_assert_eq!(self.cores[c].cur, Some(v));
        self.cores[c].cur = None;
        self.vms[v].vstate = VState::Blocked;
        self.vms[v].act = act;
        self.pump_needed |= self.policy == Policy::Strict;
    }

    /// Wakes a blocked vCPU (CFS wake-up placement and preemption); with
    /// `kick`, it runs at once whatever the CPU scheduler would choose.
    fn wake(&mut self, v: usize, kick: bool) {
        let c = self.vms[v].core;
        match self.vms[v].vstate {
            VState::Running => return,
            VState::Blocked => {
                if self.vms[v].act == Act::Sleeping && kick {
                    return; // a kick never cuts a sleep short
                }
                self.vms[v].wake_gen += 1;
                let floor = self.cores[c]
                    .min_vruntime
                    .saturating_sub(self.m.cfs_latency_ns / 2);
                let budget = self.spin_budget();
                let vm = &mut self.vms[v];
                vm.vruntime = vm.vruntime.max(floor);
                vm.vstate = VState::Runnable;
                vm.act = if vm.reply_ready || vm.act == Act::Sleeping {
                    Act::Ready
                } else {
                    // Kicked before its reply: spin for it again.
                    Act::Spin(budget)
                };
                self.cores[c].runq.push(v);
            }
            VState::Runnable => {
                if !kick {
                    return;
                }
            }
        }
        self.settle(c);
        let preempt = match self.cores[c].cur {
            None => true,
            Some(cur) => {
                kick || self.vms[cur].vruntime > self.vms[v].vruntime + self.m.cfs_wakeup_gran_ns
            }
        };
        if preempt {
            self.preempt(c);
            if kick {
                // Run exactly this vCPU: GPU-centric coscheduling.
                self.run_on(c, v);
            }
            self.dispatch(c);
        }
        self.arm(c);
    }

    fn spin_budget(&self) -> Option<u64> {
        if self.policy.guest_polls() {
            None
        } else {
            Some(self.m.guest_spin_ns)
        }
    }

    /// Interprets `v`'s program from its pc until something takes time.
    fn proceed(&mut self, v: usize) {
        loop {
            let vm = &mut self.vms[v];
            if vm.pc == vm.prog.len() {
                vm.pc = 0;
                if self.now >= self.warm {
                    vm.iters += 1;
                }
            }
            match vm.prog[vm.pc] {
                Inst::Cpu(0) => vm.pc += 1,
                Inst::Cpu(ns) => {
                    vm.act = Act::Compute(ns);
                    return;
                }
                Inst::Send(op) => {
                    vm.pc += 1;
                    if self.now >= self.warm {
                        if op.sync {
                            vm.sync_calls += 1;
                        } else {
                            vm.async_calls += 1;
                        }
                    }
                    self.at(self.now + self.m.ring_ns, Ev::Request { vm: v, op });
                }
                Inst::Wait => {
                    if vm.reply_ready {
                        vm.reply_ready = false;
                        vm.pc += 1;
                        continue;
                    }
                    let budget = self.spin_budget();
                    if budget == Some(0) {
                        self.block(v, Act::Waiting);
                    } else {
                        self.vms[v].act = Act::Spin(budget);
                    }
                    return;
                }
                Inst::SleepUntil(p) => {
                    vm.pc += 1;
                    // Frame pacing: sleep until the end of this period; a
                    // late frame starts the next one at once, and one more
                    // than a period late drops the backlog.
                    if vm.period_end == 0 || self.now >= vm.period_end + p {
                        vm.period_end = (self.now / p + 1) * p;
                    }
                    let wake = vm.period_end;
                    vm.period_end += p;
                    if wake <= self.now {
                        continue;
                    }
                    let from = self.now.max(self.warm);
                    if wake > from {
                        vm.sleep_ns += wake.min(self.end) - from.min(self.end);
                    }
                    vm.wake_gen += 1;
                    let gen = vm.wake_gen;
                    self.block(v, Act::Sleeping);
                    self.at(wake, Ev::Wake { vm: v, gen });
                    return;
                }
            }
        }
    }

    /// A reply reached guest `v`.
    fn reply(&mut self, v: usize) {
        self.vms[v].reply_ready = true;
        let coscheduled = self.policy.fairgv()
            && self.policy != Policy::FairGvNoWc
            && self.holder.is_some_and(|h| h.vm == v)
            && self.sfq.is_interactive(v as u32, self.now);
        match (self.vms[v].vstate, self.vms[v].act) {
            (VState::Running, Act::Spin(_)) => {
                let c = self.vms[v].core;
                self.settle(c);
                self.vms[v].act = Act::Ready;
                self.proceed(v);
                if self.cores[c].cur.is_none() {
                    self.dispatch(c);
                }
                self.arm(c);
            }
            (VState::Blocked, Act::Waiting) => {
                let gen = self.vms[v].wake_gen + 1;
                self.vms[v].wake_gen = gen;
                let ev = if coscheduled {
                    Ev::Kick { vm: v }
                } else {
                    Ev::Wake { vm: v, gen }
                };
                self.at(self.now + self.m.wake_ns, ev);
            }
            (VState::Runnable, _) if coscheduled => {
                self.at(self.now + self.m.wake_ns, Ev::Kick { vm: v });
            }
            _ => {}
        }
    }

    // --- Host and GPU side ----------------------------------------------

    fn submit(&mut self, v: usize, op: GpuOp) {
        self.vms[v].outstanding += 1;
        self.gpu_tail = self.gpu_tail.max(self.now) + op.ns;
        self.gpu.push_back((v, op));
        if self.gpu.len() == 1 {
            self.at(self.now + op.ns, Ev::GpuDone);
        }
    }

    fn gpu_done(&mut self) {
        let Some((v, op)) = self.gpu.pop_front() else {
            return;
        };
        if self.now >= self.warm {
            self.vms[v].gpu_ns += op.ns;
        }
        self.vms[v].outstanding -= 1;
        if op.sync {
            self.at(self.now + self.m.reply_ns, Ev::Reply { vm: v });
        }
        if let Some(&(_, next)) = self.gpu.front() {
            self.at(self.now + next.ns, Ev::GpuDone);
        }
        self.pump_needed = true;
    }

    /// Lets workers submit what the policy allows; hands the GPU on.
    fn pump(&mut self) {
        if self.policy == Policy::None {
            for v in 0..self.vms.len() {
                while let Some(op) = self.vms[v].pending.pop_front() {
                    self.submit(v, op);
                }
            }
            return;
        }
        loop {
            let Some(mut h) = self.holder else {
                if !self.grant_next() {
                    return;
                }
                continue;
            };
            let v = h.vm;
            if self.policy == Policy::Strict && self.vms[v].vstate != VState::Running {
                h.releasing = true;
            }
            while !h.releasing {
                let Some(&op) = self.vms[v].pending.front() else {
                    break;
                };
                // Collaborative slicing: submit only what is predicted to
                // finish within the slice (at least one request per grant).
                let finish = self.gpu_tail.max(self.now) + op.ns;
                if self.policy.fairgv()
                    && h.submitted_ns > 0
                    && finish > h.start + self.m.fairgv_slice_ns
                {
                    h.releasing = true;
                    break;
                }
                self.vms[v].pending.pop_front();
                h.submitted_ns += op.ns;
                self.submit(v, op);
            }
            let empty = self.vms[v].pending.is_empty() && self.vms[v].outstanding == 0;
            if h.releasing && self.vms[v].outstanding == 0 {
                self.holder = None;
                self.release(h);
                continue;
            }
            if !h.releasing && empty {
                if !h.idle {
                    h.idle = true;
                    if self.policy.work_conserving() {
                        let gen = h.gen;
                        self.at(self.now + self.m.host_spin_ns, Ev::HostIdle { gen });
                    }
                }
            } else {
                h.idle = false;
            }
            self.holder = Some(h);
            return;
        }
    }

    fn release(&mut self, h: Holder) {
        let id = h.vm as u32;
        if self.policy.fairgv() {
            // Charged the time the GPU was reserved for it, from the grant
            // until its last work completed: its GPU time plus its own gaps
            // (which nobody else could fill), overruns included.
            let charge = if self.policy == Policy::FairGvGpuCharge {
                h.submitted_ns
            } else {
                self.now - h.start
            };
            let _ = self.sfq.release(id, charge);
            if self.vms[h.vm].pending.is_empty() {
                if h.submitted_ns == 0 || !self.policy.work_conserving() {
                    let _ = self.sfq.idle(id, self.now);
                } else {
                    // Hybrid spinning on the host: it stays in the run queue
                    // (keeping its place) for one spin budget, so a vGPU
                    // between two synchronous calls is not taken for idle.
                    let gen = self.vms[h.vm].block_gen;
                    let t = self.now + self.m.host_spin_ns;
                    self.at(t, Ev::SfqBlock { vm: h.vm, gen });
                }
            }
        } else {
            self.credit.rotate(id);
        }
    }

    /// Grants the GPU to the next vGPU; false if nobody wants it.
    fn grant_next(&mut self) -> bool {
        let (vm, kick) = if self.policy.fairgv() {
            let Some(g) = self.sfq.grant(self.now) else {
                return false;
            };
            (g.vgpu as usize, g.kick_vcpu.map(|k| k as usize))
        } else {
            let strict = self.policy == Policy::Strict;
            let vms = &self.vms;
            let pick = self.credit.pick(|id| {
                let vm = &vms[id as usize];
                !vm.pending.is_empty() && (!strict || vm.vstate == VState::Running)
            });
            let Some(id) = pick else { return false };
            (id as usize, None)
        };
        self.holder_gen += 1;
        self.grants += 1;
        let gen = self.holder_gen;
        self.holder = Some(Holder {
            vm,
            gen,
            start: self.now,
            submitted_ns: 0,
            releasing: false,
            idle: false,
        });
        let slice = match self.policy {
            Policy::FairGv | Policy::FairGvGpuCharge | Policy::FairGvLas | Policy::FairGvTfs => {
                None // by prediction, or idleness
            }
            Policy::FairGvNoWc => Some(self.m.fairgv_slice_ns),
            _ => Some(self.m.credit_slice_ns),
        };
        if let Some(s) = slice {
            self.at(self.now + s, Ev::SliceEnd { gen });
        }
        if let Some(k) = kick {
            if self.policy.fairgv() && self.vms[k].vstate != VState::Running {
                self.at(self.now + self.m.wake_ns, Ev::Kick { vm: k });
            }
        }
        true
    }

    fn stats(&self) -> RunStats {
        RunStats {
            window_ns: self.end - self.warm,
            iters: self.vms.iter().map(|v| v.iters).collect(),
            gpu_ns: self.vms.iter().map(|v| v.gpu_ns).collect(),
            sleep_ns: self.vms.iter().map(|v| v.sleep_ns).collect(),
            sync_calls: self.vms.iter().map(|v| v.sync_calls).collect(),
            async_calls: self.vms.iter().map(|v| v.async_calls).collect(),
            grants: self.grants,
            events: self.events,
        }
    }
}
