//! A discrete-event simulator of one GPU shared in space as well as time.
//!
//! The [`crate::time`] executor models one non-preemptive GPU running
//! operations one at a time in submission order, with the guests' CPUs in
//! detail; it cannot express two tenants' kernels running at once. This
//! one models the GPU's resources instead, and leaves the CPUs out:
//!
//! - the GPU has [`Gpu::sms`] SMs (132 on an H100) and
//!   [`Gpu::copy_engines`] copy engines;
//! - a guest runs its loop of [`Op`]s on one stream, one at a time and back
//!   to back while it holds the GPU (asynchronous launches: no CPU gap
//!   unless the loop has an [`Op::Cpu`]); throughput is loop iterations;
//! - a kernel occupies `sms` SMs (its grid over its occupancy, at most the
//!   whole GPU) for its duration; it starts when that many SMs are free,
//!   kernels waiting for SMs start in arrival order (the first that does not
//!   fit holds back those behind it);
//! - a copy occupies one copy engine for its duration.
//!
//! Sharing ([`Sharing`]):
//! - **time-sliced** (FairGV, today): one holder at a time for a slice
//!   ([`Gpu::slice_ns`], collaborative: no operation is started that is
//!   predicted to end past the slice), charged its held time; handing the
//!   GPU to another context costs [`Gpu::switch_ns`] (drain and context
//!   switch) during which nothing runs;
//! - **co-running** (MPS): holders are admitted by [`sched::corun::plan`]
//!   in the policy's order and charged by [`sched::corun::charge_ns`]; the
//!   tenants that opted in are clients of one MPS server, so handing the
//!   GPU between them costs no context switch (a tenant that did not opt in
//!   has its own context and pays it). Each holder keeps the GPU for one
//!   slice from its own grant.
//!
//! What MPS does and costs, as assumed here: kernels of different clients
//! run side by side on disjoint SMs, with no per-kernel cost and no
//! slowdown from sharing memory bandwidth or caches (the admission rule
//! keeps summed bandwidth under the capacity, and we do not model what is
//! left of interference); SMs are whole units (blocks of two clients on one
//! SM are not modeled); there is no context switch between clients. The
//! measured H100 figure (four 8-block kernel loops finish together under
//! MPS in the time one takes alone) is what this reproduces for small
//! kernels; faults and their recovery are not simulated.

pub mod report;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use sched::corun::{self, CorunConfig, Demand};
use sched::{DevicePolicy, GpuScheduler};

use crate::SimError;

/// The simulated GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpu {
    /// Streaming multiprocessors (H100 SXM: 132).
    pub sms: u32,
    /// Copy engines usable at once.
    pub copy_engines: u32,
    /// Cost of handing the GPU to another context (drain + switch).
    pub switch_ns: u64,
    /// Slice a holder keeps the GPU for.
    pub slice_ns: u64,
}

impl Default for Gpu {
    fn default() -> Self {
        Gpu {
            sms: 132,
            copy_engines: 2,
            switch_ns: 100_000,
            slice_ns: 6_000_000,
        }
    }
}

/// One step of a guest's loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    /// A kernel occupying `sms` SMs for `ns`, using a `mem_bw` fraction of
    /// the memory bandwidth.
    Kernel {
        /// SMs its grid occupies.
        sms: u32,
        /// Its duration.
        ns: u64,
        /// Fraction of the GPU's memory bandwidth it uses.
        mem_bw: f64,
    },
    /// A copy on one copy engine for `ns`.
    Copy {
        /// Its duration.
        ns: u64,
    },
    /// Host code between GPU operations (the guest holds the GPU but
    /// submits nothing).
    Cpu {
        /// Its duration.
        ns: u64,
    },
}

impl Op {
    fn ns(&self) -> u64 {
        match *self {
            Op::Kernel { ns, .. } | Op::Copy { ns } | Op::Cpu { ns } => ns,
        }
    }
}

/// One guest (vGPU) of a scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Guest {
    /// Name for tables.
    pub name: String,
    /// Its loop.
    pub ops: Vec<Op>,
    /// Its weight.
    pub weight: f64,
    /// Its tenant opted in to co-running.
    pub corun_ok: bool,
}

impl Guest {
    /// A guest that opted in to co-running.
    pub fn new(name: &str, ops: Vec<Op>, weight: f64) -> Self {
        Guest {
            name: name.to_string(),
            ops,
            weight,
            corun_ok: true,
        }
    }

    /// What the worker would measure of its loop: the largest SM and
    /// bandwidth fractions of its kernels, and the share of its GPU time
    /// that is copies.
    pub fn demand(&self, gpu: &Gpu) -> Demand {
        let (mut sm, mut bw, mut copy, mut kern) = (0.0f64, 0.0f64, 0u64, 0u64);
        for op in &self.ops {
            match *op {
                Op::Kernel { sms, ns, mem_bw } => {
                    sm = sm.max(f64::from(sms.min(gpu.sms)) / f64::from(gpu.sms));
                    bw = bw.max(mem_bw);
                    kern += ns;
                }
                Op::Copy { ns } => copy += ns,
                Op::Cpu { .. } => {}
            }
        }
        Demand {
            sm_fraction: sm,
            mem_bw_fraction: bw,
            copy_fraction: copy as f64 / (copy + kern).max(1) as f64,
            corun_ok: self.corun_ok,
        }
    }
}

/// How the GPU is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sharing {
    /// One holder at a time (FairGV's slices).
    TimeSliced,
    /// Co-running holders admitted by [`sched::corun::plan`] (MPS).
    CoRun,
}

/// One configuration to run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setup {
    /// The device-level policy (order; phase selection).
    pub policy: DevicePolicy,
    /// Time slices or co-running.
    pub sharing: Sharing,
    /// Ablation: charge co-holders their held time instead of SM-time.
    pub charge_held_time: bool,
}

impl Setup {
    /// `policy` with `sharing`, charged as [`sched::corun`] says.
    pub fn new(policy: DevicePolicy, sharing: Sharing) -> Self {
        Setup {
            policy,
            sharing,
            charge_held_time: false,
        }
    }
}

/// What one run measured, after a warm-up of a tenth of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Length of the measured window.
    pub window_ns: u64,
    /// Loop iterations per guest.
    pub iters: Vec<u64>,
    /// SM-time per guest (ns × SMs occupied / all SMs).
    pub sm_ns: Vec<f64>,
    /// What the scheduler charged per guest.
    pub charged_ns: Vec<u64>,
    /// Most guests that held the GPU at once.
    pub max_holders: usize,
    /// Context switches paid.
    pub switches: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A kernel of guest `g` on `sms` SMs ended.
    Kernel { g: usize, sms: u32 },
    /// A copy of guest `g` ended.
    Copy { g: usize },
    /// Host code of guest `g` ended.
    Cpu { g: usize },
    /// A context switch ended.
    Switched,
}

#[derive(Debug, Clone, Copy)]
struct Hold {
    start: u64,
    /// Its slice ([`GpuScheduler::slice_for`] when it joined).
    slice_ns: u64,
    alone_ns: u64,
    shared_ns: u64,
    issued: bool,
}

struct Engine<'a> {
    gpu: Gpu,
    setup: Setup,
    cfg: CorunConfig,
    guests: &'a [Guest],
    demand: Vec<Demand>,
    now: u64,
    warm: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    sched: GpuScheduler,
    pc: Vec<usize>,
    busy: Vec<bool>,
    holds: Vec<Option<Hold>>,
    holders: Vec<usize>,
    /// When the holder set last changed (for alone/shared accounting).
    accrued_at: u64,
    free_sms: u32,
    free_ce: u32,
    kernels: VecDeque<(usize, u32, u64)>,
    copies: VecDeque<(usize, u64)>,
    /// The context the GPU last ran (None: none yet); MPS clients share one.
    ctx: Option<usize>,
    switching: bool,
    stats: Stats,
}

/// Runs `guests` on `gpu` under `setup` for `duration_ns` of simulated time.
pub fn run(guests: &[Guest], gpu: &Gpu, setup: Setup, duration_ns: u64) -> Result<Stats, SimError> {
    if guests.is_empty() {
        return Err(SimError::NoVms);
    }
    let mut sched = GpuScheduler::with_policy(gpu.slice_ns, setup.policy);
    for (i, g) in guests.iter().enumerate() {
        if g.ops.iter().all(|o| o.ns() == 0) {
            return Err(SimError::EmptyLoop(g.name.clone()));
        }
        sched
            .add(i as u32, g.weight)
            .map_err(|_| SimError::BadWeight(i))?;
        let _ = sched.request(i as u32, 0, None);
    }
    let n = guests.len();
    let mut e = Engine {
        gpu: *gpu,
        setup,
        cfg: sched.corun_config(),
        guests,
        demand: guests.iter().map(|g| g.demand(gpu)).collect(),
        now: 0,
        warm: duration_ns / 10,
        seq: 0,
        events: BinaryHeap::new(),
        sched,
        pc: vec![0; n],
        busy: vec![false; n],
        holds: vec![None; n],
        holders: Vec::new(),
        accrued_at: 0,
        free_sms: gpu.sms,
        free_ce: gpu.copy_engines.max(1),
        kernels: VecDeque::new(),
        copies: VecDeque::new(),
        ctx: None,
        switching: false,
        stats: Stats {
            window_ns: duration_ns - duration_ns / 10,
            iters: vec![0; n],
            sm_ns: vec![0.0; n],
            charged_ns: vec![0; n],
            max_holders: 0,
            switches: 0,
        },
    };
    e.pump();
    while let Some(Reverse((t, _, ev))) = e.events.pop() {
        if t > duration_ns {
            break;
        }
        e.now = t;
        e.handle(ev);
        e.pump();
    }
    Ok(e.stats)
}

impl Engine<'_> {
    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    fn measuring(&self) -> bool {
        self.now >= self.warm
    }

    fn handle(&mut self, ev: Ev) {
        let g = match ev {
            Ev::Kernel { g, sms } => {
                self.free_sms += sms;
                g
            }
            Ev::Copy { g } => {
                self.free_ce += 1;
                g
            }
            Ev::Cpu { g } => g,
            Ev::Switched => {
                self.switching = false;
                return;
            }
        };
        self.busy[g] = false;
        self.pc[g] += 1;
        if self.pc[g] == self.guests[g].ops.len() {
            self.pc[g] = 0;
            if self.measuring() {
                self.stats.iters[g] += 1;
            }
        }
    }

    /// Holders submit, those done give the GPU back, and new ones come in,
    /// until nothing changes.
    fn pump(&mut self) {
        loop {
            for g in self.holders.clone() {
                self.step(g);
            }
            if !self.admit() {
                break;
            }
        }
        self.dispatch();
    }

    /// Lets holder `g` submit its next operation, or gives the GPU back.
    fn step(&mut self, g: usize) {
        if self.busy[g] {
            return;
        }
        let Some(h) = self.holds[g] else { return };
        let op = self.guests[g].ops[self.pc[g]];
        let end = h.start + h.slice_ns;
        if self.now >= end || (h.issued && self.now + op.ns() > end) {
            self.release(g);
            return;
        }
        self.busy[g] = true;
        if let Some(h) = self.holds[g].as_mut() {
            h.issued = true;
        }
        match op {
            Op::Kernel { sms, ns, .. } => {
                let sms = sms.clamp(1, self.gpu.sms);
                self.kernels.push_back((g, sms, ns));
            }
            Op::Copy { ns } => self.copies.push_back((g, ns)),
            Op::Cpu { ns } => self.at(self.now + ns, Ev::Cpu { g }),
        }
    }

    /// Starts the waiting kernels and copies that find room, in order.
    fn dispatch(&mut self) {
        while let Some(&(g, sms, ns)) = self.kernels.front() {
            if sms > self.free_sms {
                break;
            }
            self.kernels.pop_front();
            self.free_sms -= sms;
            if self.measuring() {
                self.stats.sm_ns[g] += ns as f64 * f64::from(sms) / f64::from(self.gpu.sms);
            }
            self.at(self.now + ns, Ev::Kernel { g, sms });
        }
        while self.free_ce > 0 {
            let Some((g, ns)) = self.copies.pop_front() else {
                break;
            };
            self.free_ce -= 1;
            self.at(self.now + ns, Ev::Copy { g });
        }
    }

    /// Adds the time since the holder set last changed to each holder's
    /// alone or shared time.
    fn accrue(&mut self) {
        let dt = self.now - self.accrued_at;
        self.accrued_at = self.now;
        let shared = self.holders.len() > 1;
        for &g in &self.holders {
            if let Some(h) = self.holds[g].as_mut() {
                if shared {
                    h.shared_ns += dt;
                } else {
                    h.alone_ns += dt;
                }
            }
        }
    }

    fn release(&mut self, g: usize) {
        self.accrue();
        let Some(h) = self.holds[g].take() else {
            return;
        };
        self.holders.retain(|&x| x != g);
        let charge = if self.setup.charge_held_time {
            h.alone_ns + h.shared_ns
        } else {
            corun::charge_ns(h.alone_ns, h.shared_ns, &self.demand[g])
        };
        let _ = self.sched.release(g as u32, charge);
        if self.measuring() {
            self.stats.charged_ns[g] += charge;
        }
    }

    /// The context `g` runs in: MPS clients share one (`usize::MAX`).
    fn context(&self, g: usize) -> usize {
        if self.setup.sharing == Sharing::CoRun && self.demand[g].corun_ok {
            usize::MAX
        } else {
            g
        }
    }

    /// Grants the GPU to whoever the policy admits now; true if anyone came in.
    fn admit(&mut self) -> bool {
        if self.switching {
            return false;
        }
        let cands = self.sched.candidates(self.now, &holders_u32(&self.holders));
        let joiners: Vec<usize> = match self.setup.sharing {
            Sharing::TimeSliced if self.holders.is_empty() => {
                cands.first().map(|&g| vec![g as usize]).unwrap_or_default()
            }
            Sharing::TimeSliced => Vec::new(),
            Sharing::CoRun => {
                let holding: Vec<(u32, Demand)> = self
                    .holders
                    .iter()
                    .map(|&g| (g as u32, self.demand[g]))
                    .collect();
                let c: Vec<(u32, Demand)> = cands
                    .iter()
                    .map(|&g| (g, self.demand[g as usize]))
                    .collect();
                corun::plan(&holding, &c, &self.cfg)
                    .into_iter()
                    .map(|g| g as usize)
                    .collect()
            }
        };
        let Some(&first) = joiners.first() else {
            return false;
        };
        let ctx = self.context(first);
        if self.holders.is_empty() && self.ctx.is_some_and(|c| c != ctx) && self.gpu.switch_ns > 0 {
            // The GPU is idle and drained: switch contexts, then grant.
            self.ctx = Some(ctx);
            self.switching = true;
            self.stats.switches += 1;
            self.at(self.now + self.gpu.switch_ns, Ev::Switched);
            return false;
        }
        self.ctx = Some(ctx);
        self.accrue();
        for g in joiners {
            self.holders.push(g);
            self.holds[g] = Some(Hold {
                start: self.now,
                slice_ns: self.sched.slice_for(g as u32),
                alone_ns: 0,
                shared_ns: 0,
                issued: false,
            });
        }
        self.stats.max_holders = self.stats.max_holders.max(self.holders.len());
        true
    }
}

fn holders_u32(h: &[usize]) -> Vec<u32> {
    h.iter().map(|&g| g as u32).collect()
}
