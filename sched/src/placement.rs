//! Placing vGPUs on the GPUs of a host and moving running ones (DCUDA).
//!
//! Each vGPU has a *core demand* (the fraction of a GPU's cores it keeps
//! busy: measured GPU time times the occupancy of its launches, see the
//! monitor in the host) and a *memory demand* (its allocations). A GPU's
//! *load* is the sum of its vGPUs' core demands; above 1.0 they slow each
//! other down.
//!
//! - [`Placer::place`]: memory-aware least-loaded placement of a new vGPU:
//!   the least-loaded GPU on which its memory stays under the watermark
//!   (90% of the GPU's memory); none if no GPU has room.
//! - CASE's rule, explicit: nothing is placed or moved where it could run
//!   out of memory. A vGPU's *reservation* is the most it may ever hold
//!   (its memory limit, [`Placer::set_memory_limit`], or the memory it was
//!   placed with), and every memory check (placement, balancing moves,
//!   compaction) counts the larger of reservation and current use, so a
//!   vGPU that holds little now cannot be packed where it would not fit
//!   once it grows to its limit.
//! - [`Placer::place_feedback`]: Strings' feedback-based device selection:
//!   the GPU whose *measured* utilization plus data-transfer (copy engine)
//!   utilization over the last window is lowest, under the same memory
//!   rule. It places at arrival only and never moves anything.
//! - [`Placer::balance`] runs every interval (100 ms):
//!   1. hysteresis load balancing (DCUDA Algorithm 1): while a GPU is
//!      overloaded (load > `over`, 100%) and another is underloaded (load <
//!      `under`, 90%), move from the most loaded to the least loaded GPU the
//!      vGPU of highest priority that fits there: it must not push the
//!      target over `over` nor its memory over the watermark. Priority
//!      (DCUDA's table, in order): first vGPUs whose move ends the source's
//!      overload, then the heaviest core demand, then the least memory to
//!      copy;
//!   2. energy compaction (DCUDA Algorithm 2): if the two least-loaded GPUs
//!      in use together fit in one (load <= `under`, memory under the
//!      watermark), the lighter one's vGPUs all move to the other, which
//!      leaves a GPU idle. "Fit" counts each vGPU's *peak* core demand
//!      since it was placed, not its current one: packing programs in a
//!      light phase would overload the GPU at their next heavy phase and
//!      the balancer would move them straight back.
//!
//!   No ping-pong: a vGPU moved is not moved again for `cooldown_ns`, and
//!   the gap between the two thresholds keeps a move from overloading its
//!   target.

use std::collections::HashMap;

/// A vGPU as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Fraction of one GPU's cores it keeps busy (0..; 1.0 = a whole GPU).
    pub cores: f64,
    /// Device memory it holds, bytes.
    pub memory: u64,
}

/// A planned move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// Which vGPU.
    pub vgpu: u32,
    /// From which GPU.
    pub from: usize,
    /// To which GPU.
    pub to: usize,
}

/// Thresholds and timing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// A GPU above this load is overloaded (DCUDA Thresh_over, 1.0).
    pub over: f64,
    /// A GPU below this load can take more (DCUDA Thresh_under, 0.9).
    pub under: f64,
    /// Memory a GPU may hold, as a fraction of its memory (0.9).
    pub watermark: f64,
    /// A moved vGPU stays put at least this long, ns.
    pub cooldown_ns: u64,
    /// Whether to compact light loads onto fewer GPUs.
    pub compaction: bool,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            over: 1.0,
            under: 0.9,
            watermark: 0.9,
            cooldown_ns: 5_000_000_000,
            compaction: true,
        }
    }
}

/// The placement state of one host.
#[derive(Debug, Clone)]
pub struct Placer {
    params: Params,
    /// Memory of each GPU, bytes.
    gpu_memory: Vec<u64>,
    /// vGPU -> (GPU, demand, last moved at); in vGPU order, so that a
    /// GPU's load sums the same way every time (a hash order made its
    /// last digits differ from run to run).
    vgpus: std::collections::BTreeMap<u32, (usize, Demand, Option<u64>)>,
    /// vGPUs that must not move.
    pinned: std::collections::HashSet<u32>,
    /// vGPU -> the most memory it may hold (CASE's reservation), bytes.
    limits: HashMap<u32, u64>,
    /// vGPU -> highest core demand seen since it was placed.
    peaks: HashMap<u32, f64>,
}

/// What Strings' feedback says of one GPU over the last window.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Feedback {
    /// Measured fraction of time its cores were busy (0..=1).
    pub utilization: f64,
    /// Measured fraction of time its copy engines were busy (0..=1).
    pub transfer: f64,
}

impl Placer {
    /// A host whose GPUs have these memory sizes.
    pub fn new(params: Params, gpu_memory: Vec<u64>) -> Self {
        Placer {
            params,
            gpu_memory,
            vgpus: std::collections::BTreeMap::new(),
            pinned: Default::default(),
            limits: HashMap::new(),
            peaks: HashMap::new(),
        }
    }

    /// Number of GPUs.
    pub fn gpus(&self) -> usize {
        self.gpu_memory.len()
    }

    /// Sum of core demands on `gpu`.
    pub fn load(&self, gpu: usize) -> f64 {
        self.vgpus
            .values()
            .filter(|(g, _, _)| *g == gpu)
            .map(|(_, d, _)| d.cores)
            .sum()
    }

    /// Memory held on `gpu`.
    pub fn memory(&self, gpu: usize) -> u64 {
        self.vgpus
            .values()
            .filter(|(g, _, _)| *g == gpu)
            .map(|(_, d, _)| d.memory)
            .sum()
    }

    /// Where a vGPU is.
    pub fn gpu_of(&self, vgpu: u32) -> Option<usize> {
        self.vgpus.get(&vgpu).map(|v| v.0)
    }

    /// The vGPUs on `gpu`.
    pub fn on(&self, gpu: usize) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .vgpus
            .iter()
            .filter(|(_, (g, _, _))| *g == gpu)
            .map(|(id, _)| *id)
            .collect();
        v.sort_unstable();
        v
    }

    /// Memory a vGPU counts for in placement decisions: the larger of its
    /// reservation and what it holds now.
    pub fn reserved(&self, vgpu: u32) -> u64 {
        let now = self.vgpus.get(&vgpu).map_or(0, |v| v.1.memory);
        now.max(self.limits.get(&vgpu).copied().unwrap_or(0))
    }

    /// Memory reserved on `gpu` (CASE): the sum of its vGPUs' reservations.
    pub fn reserved_memory(&self, gpu: usize) -> u64 {
        self.vgpus
            .iter()
            .filter(|(_, (g, _, _))| *g == gpu)
            .map(|(id, _)| self.reserved(*id))
            .sum()
    }

    /// Records the most memory a vGPU may hold (its VM's memory limit): from
    /// now on it is never placed or moved where that would not fit.
    pub fn set_memory_limit(&mut self, vgpu: u32, bytes: u64) {
        self.limits.insert(vgpu, bytes);
    }

    /// CASE's rule: `extra` more bytes on `gpu` keep every reservation
    /// there under the watermark.
    pub fn fits_memory(&self, gpu: usize, extra: u64) -> bool {
        (self.reserved_memory(gpu) + extra) as f64
            <= self.params.watermark * self.gpu_memory[gpu] as f64
    }

    /// Memory-aware least-loaded placement; records the vGPU there, with
    /// `demand.memory` as its reservation (the most it may hold) unless a
    /// larger limit was set. `None` if it fits under the watermark of no GPU.
    pub fn place(&mut self, vgpu: u32, demand: Demand) -> Option<usize> {
        let need = demand
            .memory
            .max(self.limits.get(&vgpu).copied().unwrap_or(0));
        let gpu = (0..self.gpus())
            .filter(|&g| self.fits_memory(g, need))
            .min_by(|&a, &b| self.load(a).total_cmp(&self.load(b)).then(a.cmp(&b)))?;
        self.limits.insert(vgpu, need);
        self.peaks.insert(vgpu, demand.cores);
        self.vgpus.insert(vgpu, (gpu, demand, None));
        Some(gpu)
    }

    /// Strings' feedback-based placement: among the GPUs where the vGPU's
    /// memory fits (CASE's rule, as in [`Placer::place`]), the one whose
    /// measured utilization plus data-transfer utilization (`feedback`, one
    /// per GPU) is lowest; ties go to the lower index. Records it there.
    pub fn place_feedback(
        &mut self,
        vgpu: u32,
        demand: Demand,
        feedback: &[Feedback],
    ) -> Option<usize> {
        let need = demand
            .memory
            .max(self.limits.get(&vgpu).copied().unwrap_or(0));
        let score = |g: usize| {
            feedback.get(g).map_or(0.0, |f| {
                f.utilization.clamp(0.0, 1.0) + f.transfer.clamp(0.0, 1.0)
            })
        };
        let gpu = (0..self.gpus())
            .filter(|&g| self.fits_memory(g, need))
            .min_by(|&a, &b| score(a).total_cmp(&score(b)).then(a.cmp(&b)))?;
        self.limits.insert(vgpu, need);
        self.peaks.insert(vgpu, demand.cores);
        self.vgpus.insert(vgpu, (gpu, demand, None));
        Some(gpu)
    }

    /// Records a vGPU where it already is (a daemon that starts with
    /// running VMs, or a static placement).
    pub fn pin(&mut self, vgpu: u32, gpu: usize, demand: Demand) {
        let peak = self.peaks.get(&vgpu).copied().unwrap_or(0.0);
        self.peaks.insert(vgpu, peak.max(demand.cores));
        self.vgpus.insert(vgpu, (gpu, demand, None));
    }

    /// Forgets a vGPU (its VM went away).
    pub fn remove(&mut self, vgpu: u32) {
        self.vgpus.remove(&vgpu);
        self.limits.remove(&vgpu);
        self.peaks.remove(&vgpu);
    }

    /// Updates what a vGPU needs (from the monitor).
    pub fn update(&mut self, vgpu: u32, demand: Demand) {
        if let Some(v) = self.vgpus.get_mut(&vgpu) {
            v.1 = demand;
            let peak = self.peaks.entry(vgpu).or_insert(0.0);
            *peak = peak.max(demand.cores);
        }
    }

    /// Sum of the peak core demands (since placement) of the vGPUs on `gpu`.
    pub fn peak_load(&self, gpu: usize) -> f64 {
        self.on(gpu)
            .iter()
            .map(|v| self.peaks.get(v).copied().unwrap_or(0.0))
            .sum()
    }

    /// Keeps a vGPU where it is until `until_ns` (an operator forbade moving it).
    pub fn hold(&mut self, vgpu: u32, until_ns: u64) {
        if let Some(v) = self.vgpus.get_mut(&vgpu) {
            v.2 = Some(until_ns.saturating_sub(self.params.cooldown_ns));
        }
    }

    /// Forbids (or allows again) moving a vGPU.
    pub fn set_pinned(&mut self, vgpu: u32, pinned: bool) {
        if pinned {
            self.pinned.insert(vgpu);
        } else {
            self.pinned.remove(&vgpu);
        }
    }

    /// The vGPUs placement knows.
    pub fn vgpus(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.vgpus.keys().copied().collect();
        v.sort_unstable();
        v
    }

    fn movable(&self, vgpu: u32, now_ns: u64) -> bool {
        !self.pinned.contains(&vgpu)
            && self.vgpus.get(&vgpu).is_some_and(|(_, _, moved)| {
                moved.is_none_or(|t| now_ns >= t.saturating_add(self.params.cooldown_ns))
            })
    }

    fn apply(&mut self, m: Move, now_ns: u64) {
        if let Some(v) = self.vgpus.get_mut(&m.vgpu) {
            v.0 = m.to;
            v.2 = Some(now_ns);
        }
    }

    /// One balancing round at `now_ns`: the moves to make, already applied
    /// to this state (the caller carries them out, or calls
    /// [`Placer::pin`] to undo one that failed).
    pub fn balance(&mut self, now_ns: u64) -> Vec<Move> {
        let mut moves = Vec::new();
        let p = self.params;
        // 1. Hysteresis balancing.
        loop {
            let n = self.gpus();
            let Some(src) = (0..n)
                .filter(|&g| self.load(g) > p.over)
                .max_by(|&a, &b| self.load(a).total_cmp(&self.load(b)))
            else {
                break;
            };
            let mut targets: Vec<usize> = (0..n)
                .filter(|&g| g != src && self.load(g) < p.under)
                .collect();
            targets.sort_by(|&a, &b| self.load(a).total_cmp(&self.load(b)).then(a.cmp(&b)));
            let src_load = self.load(src);
            let mut done = false;
            for dst in targets {
                let dst_load = self.load(dst);
                let mut cands: Vec<(u32, Demand)> = self
                    .on(src)
                    .into_iter()
                    .filter(|&v| self.movable(v, now_ns))
                    .map(|v| (v, self.vgpus[&v].1))
                    .filter(|&(v, d)| {
                        d.cores > 0.0
                            && dst_load + d.cores <= p.over
                            && self.fits_memory(dst, self.reserved(v))
                    })
                    .collect();
                // DCUDA's priority: ends the overload, then heaviest, then
                // least memory to copy, then id.
                cands.sort_by(|(ia, a), (ib, b)| {
                    let ends_a = src_load - a.cores <= p.over;
                    let ends_b = src_load - b.cores <= p.over;
                    ends_b
                        .cmp(&ends_a)
                        .then(b.cores.total_cmp(&a.cores))
                        .then(a.memory.cmp(&b.memory))
                        .then(ia.cmp(ib))
                });
                if let Some(&(v, _)) = cands.first() {
                    let m = Move {
                        vgpu: v,
                        from: src,
                        to: dst,
                    };
                    self.apply(m, now_ns);
                    moves.push(m);
                    done = true;
                    break;
                }
            }
            if !done {
                break;
            }
        }
        // 2. Energy compaction of the two least-loaded GPUs in use.
        if p.compaction && moves.is_empty() {
            let mut used: Vec<usize> = (0..self.gpus())
                .filter(|&g| !self.on(g).is_empty())
                .collect();
            used.sort_by(|&a, &b| self.load(a).total_cmp(&self.load(b)).then(a.cmp(&b)));
            if let [light, heavy, ..] = used[..] {
                let vs = self.on(light);
                let fits = self.peak_load(light) + self.peak_load(heavy) <= p.under
                    && self.fits_memory(heavy, self.reserved_memory(light))
                    && vs.iter().all(|&v| self.movable(v, now_ns));
                if fits {
                    for v in vs {
                        let m = Move {
                            vgpu: v,
                            from: light,
                            to: heavy,
                        };
                        self.apply(m, now_ns);
                        moves.push(m);
                    }
                }
            }
        }
        moves
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn d(cores: f64, gib: u64) -> Demand {
        Demand {
            cores,
            memory: gib * GIB,
        }
    }

    #[test]
    fn placement_is_least_loaded_under_the_memory_watermark() {
        let mut p = Placer::new(Params::default(), vec![10 * GIB, 10 * GIB]);
        assert_eq!(p.place(1, d(0.5, 1)), Some(0));
        assert_eq!(p.place(2, d(0.2, 1)), Some(1));
        assert_eq!(p.place(3, d(0.1, 1)), Some(1), "least loaded");
        // 8 GiB fits on neither GPU 1 (2 + 8 > 9) nor... GPU 0 has 1 GiB: 9 <= 9.
        assert_eq!(p.place(4, d(0.1, 8)), Some(0));
        assert_eq!(p.place(5, d(0.1, 9)), None, "no GPU has room under 90%");
    }

    #[test]
    fn overload_moves_the_right_vgpu_to_the_least_loaded_gpu() {
        let mut p = Placer::new(Params::default(), vec![16 * GIB; 3]);
        p.pin(1, 0, d(0.6, 4));
        p.pin(2, 0, d(0.3, 1));
        p.pin(3, 0, d(0.3, 8));
        p.pin(4, 1, d(0.5, 1));
        p.pin(5, 2, d(0.2, 1));
        // GPU 0 at 1.2: any single move ends the overload; the heaviest
        // that fits goes (DCUDA: heaviest feasible first), to GPU 2, the
        // least loaded.
        let moves = p.balance(0);
        assert_eq!(
            moves,
            vec![Move {
                vgpu: 1,
                from: 0,
                to: 2
            }]
        );
        assert!(p.load(0) <= 1.0 + 1e-9);
        // Balanced now: nothing more, and no compaction (no pair fits in 0.9).
        assert!(p.balance(1).is_empty());
    }

    #[test]
    fn among_equal_loads_the_one_with_less_memory_moves() {
        let mut p = Placer::new(Params::default(), vec![16 * GIB; 2]);
        p.pin(1, 0, d(0.6, 8));
        p.pin(2, 0, d(0.6, 2));
        assert_eq!(
            p.balance(0),
            vec![Move {
                vgpu: 2,
                from: 0,
                to: 1
            }]
        );
    }

    #[test]
    fn moves_never_overload_the_target_and_respect_memory() {
        let mut p = Placer::new(Params::default(), vec![16 * GIB, 16 * GIB]);
        p.pin(1, 0, d(0.9, 1));
        p.pin(2, 0, d(0.5, 1));
        p.pin(3, 1, d(0.6, 14));
        // GPU 1 (0.6) could take 0.4 but not 0.5 or 0.9: stays overloaded.
        assert!(p.balance(0).is_empty());
        let mut q = Placer::new(Params::default(), vec![16 * GIB, 16 * GIB]);
        q.pin(1, 0, d(0.7, 4));
        q.pin(2, 0, d(0.5, 4));
        q.pin(3, 1, d(0.1, 12));
        // 0.5 fits in cores but 12 + 4 GiB > 14.4: no move.
        assert!(q.balance(0).is_empty());
    }

    #[test]
    fn light_loads_are_compacted_and_moved_vgpus_cool_down() {
        let mut p = Placer::new(Params::default(), vec![16 * GIB; 3]);
        p.pin(1, 0, d(0.3, 1));
        p.pin(2, 1, d(0.2, 1));
        p.pin(3, 2, d(0.8, 1));
        let moves = p.balance(0);
        assert_eq!(
            moves,
            vec![Move {
                vgpu: 2,
                from: 1,
                to: 0
            }]
        );
        assert!(p.on(1).is_empty());
        // vGPU 2 grows at once and overloads GPU 0: it may not move on
        // within the cooldown (vGPU 1 is held where it is by the operator).
        p.hold(1, u64::MAX);
        p.update(2, d(0.8, 1));
        let again = p.balance(1_000_000);
        assert!(again.iter().all(|m| m.vgpu != 2), "{again:?}");
        assert!(
            !p.balance(10_000_000_000).is_empty(),
            "after the cooldown it may"
        );
    }

    #[test]
    fn balancing_terminates_and_never_creates_an_overload() {
        let mut seed = 42u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as f64 / (1u64 << 31) as f64
        };
        for round in 0..300 {
            let mut p = Placer::new(Params::default(), vec![16 * GIB; 4]);
            for v in 0..12 {
                // rnd() is in [0, 1): small and non-negative products.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let (g, cores, gib) = (
                    (rnd() * 4.0) as usize % 4,
                    rnd() * 0.6,
                    (rnd() * 4.0) as u64,
                );
                p.pin(v, g, d(cores, gib));
            }
            let before: Vec<f64> = (0..4).map(|g| p.load(g)).collect();
            let moves = p.balance(round);
            assert!(moves.len() <= 12, "one move per vGPU at most per round");
            for m in &moves {
                let after = p.load(m.to);
                let was_over = before[m.to] > 1.0;
                assert!(after <= 1.0 + 1e-9 || was_over, "{m:?} overloaded {after}");
            }
            let over_before = before.iter().filter(|&&l| l > 1.0).count();
            let over_after = (0..4).filter(|&g| p.load(g) > 1.0).count();
            assert!(over_after <= over_before);
        }
    }

    #[test]
    fn case_rule_counts_reservations_not_current_use() {
        // Two GPUs of 10 GiB (watermark 9 GiB). vGPU 1 was placed with a
        // 6 GiB need and holds only 1 GiB now: GPU 0 still counts 6.
        let mut p = Placer::new(Params::default(), vec![10 * GIB; 2]);
        assert_eq!(p.place(1, d(0.1, 6)), Some(0));
        p.update(1, d(0.1, 1));
        assert_eq!(p.reserved_memory(0), 6 * GIB);
        // A 4 GiB vGPU would fit by current use (1 + 4) but not by
        // reservation (6 + 4 > 9): it goes to GPU 1 though GPU 0 is idler.
        p.update(1, d(0.0, 1));
        assert_eq!(p.place(2, d(0.5, 4)), Some(1));
        // A limit set after placement raises the reservation too.
        p.set_memory_limit(2, 8 * GIB);
        assert_eq!(p.reserved_memory(1), 8 * GIB);
        assert_eq!(p.place(3, d(0.0, 4)), None, "6+4 and 8+4 exceed 9 GiB");
        p.remove(1);
        assert_eq!(p.reserved_memory(0), 0, "removal frees the reservation");
        assert_eq!(p.place(3, d(0.0, 4)), Some(0));
    }

    #[test]
    fn balancing_never_moves_a_vgpu_where_its_limit_would_not_fit() {
        let mut p = Placer::new(Params::default(), vec![16 * GIB; 2]);
        p.pin(1, 0, d(0.7, 1));
        p.pin(2, 0, d(0.6, 1));
        p.pin(3, 1, d(0.1, 4));
        // Both could move by current memory (1 GiB each); both have limits
        // that do not fit next to vGPU 3's 4 GiB under 14.4 GiB.
        p.set_memory_limit(1, 12 * GIB);
        p.set_memory_limit(2, 11 * GIB);
        assert!(p.balance(0).is_empty());
        // Lower one limit: that one moves.
        p.set_memory_limit(2, 10 * GIB);
        let m = p.balance(1);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].vgpu, 2);
        assert!(p.reserved_memory(1) as f64 <= 0.9 * (16 * GIB) as f64);
    }

    #[test]
    fn feedback_placement_picks_least_utilization_plus_transfer() {
        let mut p = Placer::new(Params::default(), vec![16 * GIB; 3]);
        let fb = [
            Feedback {
                utilization: 0.2,
                transfer: 0.6,
            },
            Feedback {
                utilization: 0.5,
                transfer: 0.0,
            },
            Feedback {
                utilization: 0.1,
                transfer: 0.5,
            },
        ];
        // Scores 0.8, 0.5, 0.6: GPU 1, though GPU 2 has the lowest
        // utilization (data transfer feedback counts).
        assert_eq!(p.place_feedback(1, d(0.3, 2), &fb), Some(1));
        // Feedback is what was measured, not what placement recorded: the
        // same feedback picks GPU 1 again, until memory rules it out.
        assert_eq!(p.place_feedback(2, d(0.3, 12), &fb), Some(1));
        assert_eq!(p.place_feedback(3, d(0.3, 2), &fb), Some(2), "GPU 1 full");
        assert_eq!(p.place_feedback(4, d(0.3, 15), &fb), None);
    }

    #[test]
    fn compaction_counts_peak_demand_not_a_light_phase() {
        let mut p = Placer::new(Params::default(), vec![16 * GIB; 3]);
        p.pin(1, 0, d(0.6, 1));
        p.pin(2, 1, d(0.5, 1));
        p.pin(3, 2, d(0.9, 1));
        // Both drop to a light phase: 0.18 + 0.15 would fit in 0.9, but
        // their peaks (0.6 + 0.5) would overload one GPU at the next heavy
        // phase: no compaction.
        p.update(1, d(0.18, 1));
        p.update(2, d(0.15, 1));
        assert!(p.balance(0).is_empty());
        assert!((p.peak_load(0) - 0.6).abs() < 1e-12);
        // A newcomer whose peak is low is compacted.
        p.remove(2);
        p.pin(4, 1, d(0.2, 1));
        let m = p.balance(1);
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(p.peak_load(m[0].to) <= 0.9 + 1e-12);
    }
}
