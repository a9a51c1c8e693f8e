//! DCUDA's placement experiment on simulated GPUs (pure, deterministic).
//!
//! The experiment as DCUDA (SoCC 2019) describes it: twenty applications
//! of about 30 s each, arriving one every 5 s, in 50 random orders, on a
//! server of four GPUs; a core-intensive and a memory-intensive mix; the
//! baseline is least-loaded static placement; the metrics are the GPUs'
//! *overloaded time* and the applications' *execution time*. What the
//! paper leaves open is chosen here and named in each constant's comment.
//!
//! The model, per 100 ms step (DCUDA's monitor and balancer interval):
//! - an application's core demand is the fraction of a GPU's cores it keeps
//!   busy: after a 2 s start-up (reading input, copying it in: few cores,
//!   busy copy engines, memory growing to its peak) it alternates a heavy
//!   phase and a light one (30% of the heavy demand);
//! - where the core demand on a GPU exceeds 100%, or its copy demand does,
//!   every application there slows down in proportion (time slicing; with
//!   [`Setup::occupancy`] below 1, already where the time its applications
//!   hold the GPU exceeds 100%);
//!   where the memory held exceeds the GPU's memory (unified memory
//!   oversubscribed), they slow down further by [`Setup::thrash`] per 100%
//!   over;
//! - a GPU is *overloaded* while its core demand exceeds 100% or its memory
//!   its capacity (DCUDA's two resources); overloaded time is summed over
//!   GPUs (GPU-seconds); execution time is finish minus arrival, waiting
//!   for memory included;
//! - a migration pauses its application for [`MIGRATION_PAUSE_S`] plus its
//!   memory over [`PEER_GBPS`].

use sched::placement::{Demand, Feedback, Params, Placer};

const GIB: u64 = 1 << 30;

/// GPUs in the server (DCUDA's testbed: four GPUs).
pub const GPUS: usize = 4;
/// Memory of each GPU. The paper's GPU model was not available to check
/// here; 11 GiB (a GTX 1080 Ti-class card of 2019) is our choice.
pub const GPU_MEMORY: u64 = 11 * GIB;
/// Applications per run (DCUDA: 20).
pub const APPS: usize = 20;
/// Seconds between arrivals (DCUDA: 5 s).
pub const ARRIVAL_S: f64 = 5.0;
/// Simulation step = balancing interval, s (100 ms, docs/design.md, "Placement and migration").
pub const DT: f64 = 0.1;
/// Start-up of an application, s (our choice).
pub const STARTUP_S: f64 = 2.0;
/// Light phase as a fraction of the heavy one (our choice).
pub const LIGHT: f64 = 0.3;
/// Default slow-down per 100% of memory oversubscription (unified memory
/// thrashing; our choice: 10% over the GPU's memory doubles run time).
pub const THRASH: f64 = 10.0;
/// Fixed pause of a migration, s (DCUDA: migrations take < 100 ms; ours
/// measured 7-9 ms per GiB on two H200s; we charge 20 ms + the copy).
pub const MIGRATION_PAUSE_S: f64 = 0.020;
/// Peer copy bandwidth of a migration, GB/s (PCIe 3 x16 class, our choice).
pub const PEER_GBPS: f64 = 10.0;

/// The two application mixes DCUDA evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// Core-intensive: heavy phases of 25-65% of a GPU, 0.5-2.5 GiB.
    Core,
    /// Memory-intensive: 15-45% of a GPU, 3-6.5 GiB (two or three fill a
    /// GPU's memory).
    Memory,
}

/// One application of the experiment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct App {
    /// Core demand in its heavy phase (fraction of a GPU).
    pub cores: f64,
    /// Copy-engine demand outside its start-up (fraction of the time).
    pub transfer: f64,
    /// Peak device memory, bytes (reached at the end of start-up).
    pub memory: u64,
    /// Seconds it runs alone on an idle GPU (DCUDA: about 30 s).
    pub work_s: f64,
    /// Length of each heavy or light phase, s.
    pub phase_s: f64,
}

impl App {
    /// Core demand, copy demand and memory held `since` s after it started.
    pub fn demand_at(&self, since: f64) -> (f64, f64, u64) {
        if since < STARTUP_S {
            let grown = (since / STARTUP_S).clamp(0.0, 1.0);
            return (0.05, 0.6, (self.memory as f64 * grown) as u64);
        }
        let heavy = (((since - STARTUP_S) / self.phase_s) as u64).is_multiple_of(2);
        let c = if heavy {
            self.cores
        } else {
            LIGHT * self.cores
        };
        (c, self.transfer, self.memory)
    }
}

/// Small deterministic generator (no dependency).
#[derive(Debug, Clone)]
pub struct Lcg(pub u64);

impl Lcg {
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

/// The twenty applications of one mix. `scale` multiplies every core
/// demand (1.0 = the mix as described; the sweep varies it).
pub fn workload(mix: Mix, seed: u64, scale: f64) -> Vec<App> {
    let mut r = Lcg(seed ^ 0x5bd1_e995);
    (0..APPS)
        .map(|_| {
            let (cores, mem_gib, transfer) = match mix {
                Mix::Core => (r.range(0.4, 0.9), r.range(0.5, 2.5), r.range(0.05, 0.2)),
                Mix::Memory => (r.range(0.25, 0.6), r.range(3.0, 6.5), r.range(0.1, 0.4)),
            };
            App {
                cores: (cores * scale).min(1.0),
                transfer,
                memory: (mem_gib * GIB as f64) as u64,
                work_s: r.range(25.0, 35.0),
                phase_s: r.range(4.0, 10.0),
            }
        })
        .collect()
}

/// `count` random arrival orders of `n` applications (Fisher-Yates).
pub fn orders(n: usize, count: usize, seed: u64) -> Vec<Vec<usize>> {
    let mut r = Lcg(seed ^ 0x9e37_79b9_7f4a_7c15);
    (0..count)
        .map(|_| {
            let mut o: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                let j = ((r.unit() * (i + 1) as f64) as usize).min(i);
                o.swap(i, j);
            }
            o
        })
        .collect()
}

/// The policies compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// DCUDA's baseline: at arrival, the GPU of least measured core load;
    /// memory not known before the application runs; never moved.
    Static,
    /// The same with CASE's rule (the application's peak memory reserved;
    /// it waits if no GPU has room); never moved.
    StaticCase,
    /// Strings: at arrival, the GPU of least measured utilization plus
    /// data transfer over the last second, CASE's rule; never moved.
    Strings,
    /// CASE's placement, then DCUDA's hysteresis balancing every 100 ms.
    Balance,
    /// That plus energy compaction (fairvgpu's default, DCUDA).
    Dcuda,
}

impl Policy {
    /// All policies, in table order.
    pub const ALL: [Policy; 5] = [
        Policy::Static,
        Policy::StaticCase,
        Policy::Strings,
        Policy::Balance,
        Policy::Dcuda,
    ];

    /// Row label.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Static => "least-loaded static",
            Policy::StaticCase => "static + CASE memory rule",
            Policy::Strings => "Strings feedback (util+xfer)",
            Policy::Balance => "balancing, no compaction",
            Policy::Dcuda => "fairvgpu (DCUDA)",
        }
    }
}

/// Knobs of one run besides the workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setup {
    /// Placement thresholds and cooldown.
    pub params: Params,
    /// Slow-down per 100% of memory oversubscription ([`THRASH`]).
    pub thrash: f64,
    /// Fraction of a GPU's cores a kernel fills while it runs (1.0, the
    /// default: core demand is all time). Below 1.0, an application with
    /// core demand c holds the GPU c / occupancy of the time, and contexts
    /// of different processes time-slice (no MPS): a GPU slows its
    /// applications once the *time* they hold it sums over 100%, before
    /// their core demand does.
    pub occupancy: f64,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            params: Params {
                // DCUDA moves an application at most once per few seconds;
                // ours: 2 s (our choice, see the sweep in the results).
                cooldown_ns: 2_000_000_000,
                ..Params::default()
            },
            thrash: THRASH,
            occupancy: 1.0,
        }
    }
}

/// What one run of one policy gave.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Outcome {
    /// GPU-seconds during which a GPU was overloaded (cores or memory).
    pub overloaded_s: f64,
    /// Mean of (finish - arrival), s.
    pub exec_s: f64,
    /// Mean over time of the busy fraction of the GPUs that had work.
    pub utilization: f64,
    /// Mean number of GPUs with work, while any had.
    pub gpus_in_use: f64,
    /// Migrations per application.
    pub migrations_per_app: f64,
    /// Highest memory held on any GPU, as a fraction of its memory.
    pub peak_memory: f64,
}

/// Simulates one arrival order under one policy.
pub fn simulate(apps: &[App], order: &[usize], policy: Policy, setup: Setup) -> Outcome {
    let mut run = Run::new(apps, order, policy, setup);
    let mut step = 0u64;
    while run.finish.iter().any(Option::is_none) && step < 1_000_000 {
        run.step();
        step += 1;
    }
    run.outcome()
}

/// One run of [`simulate`], advanced [`DT`] at a time.
struct Run<'a> {
    apps: &'a [App],
    order: &'a [usize],
    policy: Policy,
    setup: Setup,
    placer: Placer,
    /// Per application: when it arrives, starts (is placed) and finishes,
    /// the work it has left (s at full speed) and the migration pause it
    /// still owes.
    arrival: Vec<f64>,
    started: Vec<Option<f64>>,
    finish: Vec<Option<f64>>,
    left: Vec<f64>,
    pause: Vec<f64>,
    /// Arrived and not placed yet (no GPU had room), in arrival order.
    waiting: Vec<usize>,
    /// The next arrival's index in `order`.
    next: usize,
    /// Strings' measured utilization per GPU.
    feedback: Vec<Feedback>,
    /// The figures, summed over the steps so far.
    overloaded: f64,
    util_sum: f64,
    in_use_sum: f64,
    samples: usize,
    peak_memory: f64,
    migrations: usize,
    t: f64,
}

impl<'a> Run<'a> {
    fn new(apps: &'a [App], order: &'a [usize], policy: Policy, setup: Setup) -> Self {
        let params = Params {
            compaction: policy == Policy::Dcuda,
            ..setup.params
        };
        let n = apps.len();
        let mut arrival = vec![0.0; n];
        for (k, &i) in order.iter().enumerate() {
            arrival[i] = k as f64 * ARRIVAL_S;
        }
        Run {
            apps,
            order,
            policy,
            setup,
            placer: Placer::new(params, vec![GPU_MEMORY; GPUS]),
            arrival,
            started: vec![None; n],
            finish: vec![None; n],
            left: apps.iter().map(|a| a.work_s).collect(),
            pause: vec![0.0f64; n],
            waiting: Vec::new(),
            next: 0,
            feedback: vec![Feedback::default(); GPUS],
            overloaded: 0.0,
            util_sum: 0.0,
            in_use_sum: 0.0,
            samples: 0,
            peak_memory: 0.0f64,
            migrations: 0,
            t: 0.0,
        }
    }

    /// Application `i`'s demand now: (cores, copy, memory).
    fn demand(&self, i: usize) -> (f64, f64, u64) {
        let t = self.t;
        self.apps[i].demand_at(t - self.started[i].unwrap_or(t))
    }

    fn step(&mut self) {
        self.arrive();
        self.place_waiting();
        self.update_demands();
        if matches!(self.policy, Policy::Balance | Policy::Dcuda) {
            self.balance();
        }
        let (mut busy, mut util) = (0usize, 0.0);
        for g in 0..GPUS {
            if let Some(u) = self.run_gpu(g) {
                busy += 1;
                util += u;
            }
        }
        if busy > 0 {
            self.util_sum += util / busy as f64;
            self.in_use_sum += busy as f64;
            self.samples += 1;
        }
        self.t += DT;
    }

    /// Those whose time has come join the waiting line.
    fn arrive(&mut self) {
        let n = self.apps.len();
        while self.next < n && self.arrival[self.order[self.next]] <= self.t + 1e-9 {
            self.waiting.push(self.order[self.next]);
            self.next += 1;
        }
    }

    /// Placement, in arrival order; those that find no room wait.
    fn place_waiting(&mut self) {
        let mut waiting = std::mem::take(&mut self.waiting);
        waiting.retain(|&i| {
            let placed = self.place(i);
            if placed {
                self.started[i] = Some(self.t);
            }
            !placed
        });
        self.waiting = waiting;
    }

    /// Places application `i` by the policy; false if no GPU has room.
    fn place(&mut self, i: usize) -> bool {
        let (c, _, _) = self.apps[i].demand_at(0.0);
        let d = Demand {
            cores: c,
            memory: self.apps[i].memory,
        };
        let placer = &mut self.placer;
        match self.policy {
            Policy::Static => {
                let g = (0..GPUS)
                    .min_by(|&a, &b| placer.load(a).total_cmp(&placer.load(b)).then(a.cmp(&b)))
                    .unwrap_or(0);
                placer.pin(
                    i as u32,
                    g,
                    Demand {
                        cores: c,
                        memory: 0,
                    },
                );
                true
            }
            Policy::Strings => placer.place_feedback(i as u32, d, &self.feedback).is_some(),
            _ => placer.place(i as u32, d).is_some(),
        }
    }

    /// Tells placement what each running application demands now.
    fn update_demands(&mut self) {
        for i in 0..self.apps.len() {
            if self.started[i].is_some() && self.finish[i].is_none() {
                let (c, _, m) = self.demand(i);
                self.placer.update(
                    i as u32,
                    Demand {
                        cores: c,
                        memory: m,
                    },
                );
            }
        }
    }

    /// DCUDA's balancer; a moved application pauses while its memory moves.
    fn balance(&mut self) {
        for m in self.placer.balance((self.t * 1e9) as u64) {
            let i = m.vgpu as usize;
            let (_, _, mem) = self.demand(i);
            self.pause[i] += MIGRATION_PAUSE_S + mem as f64 / (PEER_GBPS * 1e9);
            self.migrations += 1;
        }
    }

    /// One step of GPU `g`: Strings' feedback, its overload, and its
    /// applications' progress at the rate sharing leaves them. The busy
    /// fraction of its cores, or None if it has no applications.
    fn run_gpu(&mut self, g: usize) -> Option<f64> {
        let on = self.placer.on(g);
        let cores = self.placer.load(g);
        let copy: f64 = on.iter().map(|&v| self.demand(v as usize).1).sum();
        let mem = self.placer.memory(g) as f64 / GPU_MEMORY as f64;
        self.peak_memory = self.peak_memory.max(mem);
        // Strings' feedback: measured, so capped at 100%, averaged over
        // about the last second.
        let a = DT / 1.0;
        let fb = &mut self.feedback[g];
        fb.utilization += a * (cores.min(1.0) - fb.utilization);
        fb.transfer += a * (copy.min(1.0) - fb.transfer);
        if on.is_empty() {
            return None;
        }
        if cores > 1.0 + 1e-9 || mem > 1.0 + 1e-9 {
            self.overloaded += DT;
        }
        let held: f64 = on
            .iter()
            .map(|&v| (self.demand(v as usize).0 / self.setup.occupancy.max(1e-3)).min(1.0))
            .sum();
        let mut rate = 1.0 / cores.max(held).max(copy).max(1.0);
        if mem > 1.0 {
            rate /= 1.0 + self.setup.thrash * (mem - 1.0);
        }
        for v in on {
            let i = v as usize;
            let mut dt = DT;
            let p = self.pause[i].min(dt);
            self.pause[i] -= p;
            dt -= p;
            self.left[i] -= dt * rate;
            if self.left[i] <= 0.0 {
                self.finish[i] = Some(self.t + DT);
                self.placer.remove(v);
            }
        }
        Some(cores.min(1.0))
    }

    fn outcome(&self) -> Outcome {
        let n = self.apps.len();
        let exec = (0..n)
            .map(|i| self.finish[i].unwrap_or(self.t) - self.arrival[i])
            .sum::<f64>()
            / n as f64;
        Outcome {
            overloaded_s: self.overloaded,
            exec_s: exec,
            utilization: self.util_sum / self.samples.max(1) as f64,
            gpus_in_use: self.in_use_sum / self.samples.max(1) as f64,
            migrations_per_app: self.migrations as f64 / n as f64,
            peak_memory: self.peak_memory,
        }
    }
}

/// Mean of several outcomes (`peak_memory`: the highest).
pub fn mean(v: &[Outcome]) -> Outcome {
    let k = v.len().max(1) as f64;
    let s = |f: fn(&Outcome) -> f64| v.iter().map(f).sum::<f64>() / k;
    Outcome {
        overloaded_s: s(|o| o.overloaded_s),
        exec_s: s(|o| o.exec_s),
        utilization: s(|o| o.utilization),
        gpus_in_use: s(|o| o.gpus_in_use),
        migrations_per_app: s(|o| o.migrations_per_app),
        peak_memory: v.iter().map(|o| o.peak_memory).fold(0.0, f64::max),
    }
}

/// Runs `count` random orders of one mix; the mean outcome per policy, in
/// the order of [`Policy::ALL`].
pub fn measure(mix: Mix, count: usize, seed: u64, scale: f64, setup: Setup) -> Vec<Outcome> {
    let apps = workload(mix, seed, scale);
    let orders = orders(APPS, count, seed);
    Policy::ALL
        .iter()
        .map(|&p| {
            let runs: Vec<Outcome> = orders
                .iter()
                .map(|o| simulate(&apps, o, p, setup))
                .collect();
            mean(&runs)
        })
        .collect()
}

/// Percentage by which `b` is below `a`.
pub fn reduction(a: f64, b: f64) -> f64 {
    if a > 0.0 {
        (a - b) / a * 100.0
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(p: Policy) -> usize {
        Policy::ALL.iter().position(|&q| q == p).unwrap()
    }

    #[test]
    fn workload_is_dcudas_shape_and_deterministic() {
        for mix in [Mix::Core, Mix::Memory] {
            let w = workload(mix, 3, 1.0);
            assert_eq!(w.len(), APPS);
            assert_eq!(w, workload(mix, 3, 1.0), "same seed, same workload");
            assert_ne!(w, workload(mix, 4, 1.0));
            for a in &w {
                assert!((25.0..=35.0).contains(&a.work_s), "about 30 s: {a:?}");
                assert!(a.memory < GPU_MEMORY && a.cores > 0.0 && a.cores <= 1.0);
            }
            let mean_work = w.iter().map(|a| a.work_s).sum::<f64>() / APPS as f64;
            assert!((27.0..33.0).contains(&mean_work));
        }
        let core = workload(Mix::Core, 3, 1.0);
        let mem = workload(Mix::Memory, 3, 1.0);
        let avg = |w: &[App], f: fn(&App) -> f64| w.iter().map(f).sum::<f64>() / w.len() as f64;
        assert!(avg(&core, |a| a.cores) > avg(&mem, |a| a.cores));
        assert!(avg(&mem, |a| a.memory as f64) > 2.0 * avg(&core, |a| a.memory as f64));
        // Two memory-intensive applications together can exceed a GPU.
        let big = mem.iter().filter(|a| a.memory > GPU_MEMORY / 2).count();
        assert!(big >= 2);
    }

    #[test]
    fn orders_are_distinct_permutations() {
        let os = orders(APPS, 50, 1);
        assert_eq!(os.len(), 50);
        for o in &os {
            let mut s = o.clone();
            s.sort_unstable();
            assert_eq!(s, (0..APPS).collect::<Vec<_>>());
        }
        let distinct: std::collections::HashSet<_> = os.iter().collect();
        assert_eq!(distinct.len(), 50);
    }

    #[test]
    fn demand_has_startup_then_phases() {
        let a = workload(Mix::Core, 1, 1.0)[0];
        let (c0, x0, m0) = a.demand_at(0.0);
        assert!(c0 < a.cores && x0 > a.transfer && m0 == 0);
        let (c1, _, m1) = a.demand_at(STARTUP_S + 0.01);
        assert_eq!((c1, m1), (a.cores, a.memory));
        let (c2, _, _) = a.demand_at(STARTUP_S + a.phase_s + 0.01);
        assert!((c2 - LIGHT * a.cores).abs() < 1e-12);
    }

    #[test]
    fn an_application_alone_takes_its_work_time() {
        let apps = workload(Mix::Core, 1, 1.0)[..1].to_vec();
        for p in Policy::ALL {
            let o = simulate(&apps, &[0], p, Setup::default());
            assert!(
                (o.exec_s - apps[0].work_s).abs() <= DT + 1e-9,
                "{p:?} {o:?}"
            );
            assert_eq!(o.overloaded_s, 0.0);
            assert_eq!(o.migrations_per_app, 0.0);
        }
    }

    #[test]
    fn case_rule_never_oversubscribes_memory_and_blind_static_does() {
        let r = measure(Mix::Memory, 4, 11, 1.0, Setup::default());
        for p in [
            Policy::StaticCase,
            Policy::Strings,
            Policy::Balance,
            Policy::Dcuda,
        ] {
            assert!(r[idx(p)].peak_memory <= 0.9 + 1e-9, "{p:?} {:?}", r[idx(p)]);
        }
        assert!(r[idx(Policy::Static)].peak_memory > 1.0, "{:?}", r[0]);
    }

    #[test]
    fn balancing_cuts_overload_and_execution_time_on_both_mixes() {
        for mix in [Mix::Core, Mix::Memory] {
            let r = measure(mix, 4, 7, 1.0, Setup::default());
            let (st, ours) = (r[idx(Policy::Static)], r[idx(Policy::Dcuda)]);
            assert!(st.overloaded_s > 0.0, "{mix:?}: the scenario overloads");
            assert!(
                ours.overloaded_s < 0.5 * st.overloaded_s,
                "{mix:?} {st:?} {ours:?}"
            );
            assert!(ours.exec_s < st.exec_s, "{mix:?} {st:?} {ours:?}");
            let bal = r[idx(Policy::Balance)];
            assert!(bal.overloaded_s <= r[idx(Policy::StaticCase)].overloaded_s);
            assert!(ours.migrations_per_app > 0.0 && ours.migrations_per_app < 10.0);
            // Compaction runs the load on fewer GPUs.
            assert!(ours.gpus_in_use <= bal.gpus_in_use + 1e-9);
        }
    }

    #[test]
    fn partial_occupancy_only_slows_applications_down() {
        let apps = workload(Mix::Core, 5, 1.0);
        let o = &orders(APPS, 1, 5)[0];
        let full = simulate(&apps, o, Policy::Static, Setup::default());
        let half = simulate(
            &apps,
            o,
            Policy::Static,
            Setup {
                occupancy: 0.5,
                ..Setup::default()
            },
        );
        assert!(half.exec_s > full.exec_s, "{full:?} {half:?}");
        // Overloaded time is DCUDA's: core demand over 100%, not held time.
        assert!(half.overloaded_s >= full.overloaded_s);
    }
}
