//! The simulator's engine: the state of the modeled machine, the event
//! queue and the loop that hands each event to its side, the CPU side
//! ([`cpu`]: vCPUs on cores, guests' programs, replies) or the host and GPU
//! side ([`gpu`]: workers submitting under the policy, the GPU's queue,
//! grants and releases).

mod cpu;
mod gpu;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use sched::GpuScheduler;

use super::{Machine, Policy, RunStats, Step, VmSpec, Workload};
use crate::credit::{self, CreditScheduler};

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

/// Runs `vms`, already validated (see [`super::run`]), to the end.
pub(super) fn run(
    vms: &[VmSpec],
    cores: usize,
    policy: Policy,
    m: &Machine,
    duration_ns: u64,
) -> RunStats {
    let mut e = Engine::new(vms, cores, policy, m, duration_ns);
    e.start(vms);
    e.run_loop();
    e.stats()
}

impl Engine {
    /// The machine at time 0: every vCPU runnable, nothing queued.
    fn new(vms: &[VmSpec], cores: usize, policy: Policy, m: &Machine, duration_ns: u64) -> Self {
        Engine {
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
        }
    }

    /// Registers the vGPUs with the schedulers, queues the vCPUs on their
    /// cores, arms the credit timers and puts a vCPU on every core.
    fn start(&mut self, vms: &[VmSpec]) {
        for (i, v) in vms.iter().enumerate() {
            // Validated by the caller, so adding cannot fail.
            let _ = self.sfq.add(i as u32, v.weight);
            let _ = self.credit.add(i as u32, v.weight);
            self.cores[v.core].runq.push(i);
        }
        if matches!(
            self.policy,
            Policy::CreditPoll | Policy::CreditHs | Policy::Strict
        ) {
            self.at(credit::TICK_NS, Ev::CreditTick);
            self.at(credit::PERIOD_NS, Ev::CreditPeriod);
        }
        for c in 0..self.cores.len() {
            self.dispatch(c);
            self.arm(c);
        }
    }

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
