//! Scheduling policy for one physical GPU, with no I/O: the host daemon feeds
//! it events (a vGPU has work, blocked, used the GPU for so long) and acts on
//! its decisions (grant the GPU to this vGPU for this slice, kick this vCPU).
//!
//! Follows FairGV (section 3.2-3.3): start-tag fair queuing over vGPUs kept
//! in a red-black tree ([`sfq`]), interactivity classification for
//! GPU-centric coscheduling ([`classify`]), collaborative scheduling of a
//! non-preemptive GPU with sampled accounting ([`accounting`]), and kernel
//! slicing ([`slicing`]). [`GpuScheduler`] ties them together.
//!
//! Sharing in space (issue 20): [`policy`] holds the per-GPU device-level
//! policies (fair queue, Strings' LAS and TFS, phase selection), and
//! [`corun`] decides which vGPUs may hold the GPU at the same time and what
//! each is charged. [`placement`] places vGPUs on a host's GPUs (DCUDA) and
//! [`tenants`] splits a tenant's weight among its vGPUs.
//!
//! The simulators that run these policies on modeled GPUs and workloads
//! (and the Xen-style credit baseline they compare against) are the
//! `sched-sim` crate.

#![warn(missing_docs)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

pub mod accounting;
pub mod classify;
pub mod corun;
pub mod placement;
pub mod policy;
pub mod sfq;
pub mod slicing;
pub mod tenants;

use std::collections::HashMap;

/// `ns` rounded to whole nanoseconds, saturating as Rust's `as` does:
/// negative and NaN give 0, anything past `u64::MAX` gives `u64::MAX`.
/// For durations computed in f64 from durations in u64.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // saturates, as said
pub(crate) fn round_ns(ns: f64) -> u64 {
    ns.round() as u64
}

pub use corun::{CorunConfig, Demand};
pub use policy::{DevicePolicy, Sharing};
pub use sfq::{StartTagQueue, VgpuId};

/// Errors of the scheduler.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchedError {
    /// A weight must be a positive, finite number.
    #[error("weight {0} is not a positive finite number")]
    BadWeight(f64),
    /// The vGPU is not known to this scheduler.
    #[error("no vGPU {0}")]
    NoSuchVgpu(VgpuId),
    /// The vGPU was added twice.
    #[error("vGPU {0} already exists")]
    Duplicate(VgpuId),
    /// A device policy name that is not `fair`, `las`, `tfs` or `phase`.
    #[error("unknown device policy {0:?} (fair, las, tfs or phase)")]
    UnknownPolicy(String),
}

/// Min-Max Ratio of `x` (min over max; 0 if every value is 0): FairGV's
/// fairness figure, where x_i is what vGPU i got over what it should get.
pub fn mmr(x: &[f64]) -> f64 {
    let max = x.iter().cloned().fold(0.0, f64::max);
    let min = x.iter().cloned().fold(f64::INFINITY, f64::min);
    if max > 0.0 {
        min / max
    } else {
        0.0
    }
}

/// MMR of amounts `used` (GPU time, say) against `weights`: x_i = the
/// share of the total used by i over its share of the weights.
pub fn weighted_mmr(used: &[f64], weights: &[f64]) -> f64 {
    let total: f64 = used.iter().sum();
    let wsum: f64 = weights.iter().sum();
    let x: Vec<f64> = used
        .iter()
        .zip(weights)
        .map(|(u, w)| (u / total) / (w / wsum))
        .collect();
    mmr(&x)
}

/// Time slices of FairGV (configurable): the base slice of a GPU depends on
/// whether it can preempt a running kernel. A GPU that cannot is handed
/// over between kernels, and a short slice bounds how long the others wait;
/// one that can (Pascal and later; the driver reports it as
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED`) saves and restores
/// a context at each hand-off, which a longer slice amortizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slices {
    /// Slice on a non-preemptive GPU (FairGV: 6 ms).
    pub non_preemptive_ns: u64,
    /// Slice on a preemptive GPU (FairGV: 30 ms).
    pub preemptive_ns: u64,
}

impl Slices {
    /// The base slice of a GPU that can (`true`) or cannot preempt.
    pub fn for_gpu(&self, preemptive: bool) -> u64 {
        if preemptive {
            self.preemptive_ns
        } else {
            self.non_preemptive_ns
        }
    }
}

impl Default for Slices {
    fn default() -> Self {
        Slices {
            non_preemptive_ns: 6_000_000,
            preemptive_ns: 30_000_000,
        }
    }
}

/// The most base slices one grant may hold: a vGPU's slice grows with its
/// weight (see [`GpuScheduler::slice_for`]) up to this many.
pub const MAX_SLICE_FACTOR: f64 = 4.0;

/// What the scheduler decided when the GPU became free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Who gets the GPU.
    pub vgpu: VgpuId,
    /// For how long (then it must give the GPU back).
    pub slice_ns: u64,
    /// The vCPU to kick: set when the vGPU is CPU-GPU interactive and one of
    /// its vCPUs waits on a synchronous call (GPU-centric coscheduling).
    pub kick_vcpu: Option<u32>,
}

/// The policy for one GPU: fair queue, classification, coscheduling decisions.
///
/// The start-tag queue is kept up to date under every [`DevicePolicy`] (it
/// holds the weights and who is runnable); under LAS and TFS the order of
/// [`GpuScheduler::grant`] and [`GpuScheduler::candidates`] comes from the
/// attained service instead of the start tags.
#[derive(Debug)]
pub struct GpuScheduler {
    queue: StartTagQueue,
    policy: DevicePolicy,
    attained: Option<policy::Attained>,
    classes: HashMap<VgpuId, classify::Interactivity>,
    waiting_vcpu: HashMap<VgpuId, u32>,
    /// When each idle vGPU left the run queue.
    left: HashMap<VgpuId, u64>,
    slice_ns: u64,
}

impl GpuScheduler {
    /// A scheduler handing out slices of `slice_ns`, start-tag fair queuing
    /// (FairGV): the same as `with_policy(slice_ns, DevicePolicy::FairQueue)`.
    pub fn new(slice_ns: u64) -> Self {
        Self::with_policy(slice_ns, DevicePolicy::FairQueue)
    }

    /// A scheduler handing out slices of `slice_ns` in the order of `policy`.
    pub fn with_policy(slice_ns: u64, policy: DevicePolicy) -> Self {
        GpuScheduler {
            queue: StartTagQueue::new(),
            policy,
            attained: policy::Attained::for_policy(policy, slice_ns),
            classes: HashMap::new(),
            waiting_vcpu: HashMap::new(),
            left: HashMap::new(),
            slice_ns,
        }
    }

    /// The device-level policy.
    pub fn policy(&self) -> DevicePolicy {
        self.policy
    }

    /// What co-running decisions on this GPU use: [`CorunConfig::default`],
    /// with phase selection under [`DevicePolicy::PhaseSelection`].
    pub fn corun_config(&self) -> CorunConfig {
        CorunConfig {
            phase_selection: self.policy.phase_selection(),
            ..CorunConfig::default()
        }
    }

    /// The runnable vGPUs not in `holding`, in the order the policy would
    /// grant them: the candidates to pass to [`corun::plan`].
    pub fn candidates(&mut self, now_ns: u64, holding: &[VgpuId]) -> Vec<VgpuId> {
        let order = match self.attained.as_mut() {
            Some(a) => {
                a.advance(now_ns);
                a.order(&self.queue)
            }
            None => self.queue.runnable_ids().collect(),
        };
        order
            .into_iter()
            .filter(|id| !holding.contains(id))
            .collect()
    }

    /// The fair queue (for inspection and weight changes).
    pub fn queue(&mut self) -> &mut StartTagQueue {
        &mut self.queue
    }

    /// Adds a vGPU (not yet runnable).
    pub fn add(&mut self, id: VgpuId, weight: f64) -> Result<(), SchedError> {
        self.queue.add(id, weight)?;
        self.classes.insert(id, classify::Interactivity::default());
        Ok(())
    }

    /// Removes a vGPU.
    pub fn remove(&mut self, id: VgpuId) -> Result<(), SchedError> {
        self.queue.remove(id)?;
        if let Some(a) = self.attained.as_mut() {
            a.remove(id);
        }
        self.classes.remove(&id);
        self.waiting_vcpu.remove(&id);
        self.left.remove(&id);
        Ok(())
    }

    /// The vGPU has requests: it becomes runnable. `sync_vcpu` is the vCPU
    /// waiting on it when the request is synchronous.
    ///
    /// A vGPU back within one slice of going idle was not idle in any sense
    /// its tenant would recognise: its guest was between a reply and its
    /// next call, and a host CPU busy elsewhere made that gap longer than the
    /// worker's spin. It keeps its start tag, up to one slice of its own GPU
    /// time behind virtual time, instead of joining at virtual time:
    /// otherwise every such gap would hand its place to the others and a
    /// CPU-starved guest would get less than its weight, while the GPU was
    /// not kept idle for it. The bound keeps what it can bring back to one
    /// slice. After a longer absence it joins at virtual time (FairGV).
    pub fn request(
        &mut self,
        id: VgpuId,
        now_ns: u64,
        sync_vcpu: Option<u32>,
    ) -> Result<(), SchedError> {
        if let Some(a) = self.attained.as_mut() {
            a.advance(now_ns);
        }
        match self.left.remove(&id) {
            Some(at) if now_ns.saturating_sub(at) <= self.slice_ns => {
                self.queue.wake_with_credit(id, self.slice_ns)?
            }
            _ => self.queue.wake(id)?,
        }
        if let Some(v) = sync_vcpu {
            self.classes.entry(id).or_default().record_sync(now_ns);
            self.waiting_vcpu.insert(id, v);
        }
        Ok(())
    }

    /// The vGPU has nothing left to run (after its bounded spin).
    pub fn idle(&mut self, id: VgpuId, now_ns: u64) -> Result<(), SchedError> {
        self.waiting_vcpu.remove(&id);
        if let Some(a) = self.attained.as_mut() {
            a.advance(now_ns);
        }
        self.queue.block(id)?;
        self.left.insert(id, now_ns);
        Ok(())
    }

    /// Picks who runs next (the first of the policy's order).
    pub fn grant(&mut self, now_ns: u64) -> Option<Grant> {
        let vgpu = match self.attained.as_mut() {
            Some(a) => {
                a.advance(now_ns);
                *a.order(&self.queue).first()?
            }
            None => self.queue.pick()?,
        };
        let interactive = self
            .classes
            .get_mut(&vgpu)
            .is_some_and(|c| c.is_interactive(now_ns));
        let kick_vcpu = if interactive {
            self.waiting_vcpu.get(&vgpu).copied()
        } else {
            None
        };
        Some(Grant {
            vgpu,
            slice_ns: self.slice_for(vgpu),
            kick_vcpu,
        })
    }

    /// The slice `id` is granted: the base slice times its weight over the
    /// smallest weight among the vGPUs that want the GPU (itself included),
    /// at most [`MAX_SLICE_FACTOR`] base slices.
    ///
    /// Start tags then advance by the same amount at every grant, so the
    /// vGPUs take turns once per round (deficit round robin's quantum in
    /// proportion to weight) instead of the heavier ones coming back several
    /// times a round for one base slice each. The GPU changes hands once per
    /// vGPU and round, and each hand-off costs a context switch; the
    /// lightest vGPU waits as long as with equal slices (the others' turns
    /// add up to the same time), the heavier ones wait longer, and each one's
    /// share is its weight's either way (every grant is charged what it used).
    pub fn slice_for(&self, id: VgpuId) -> u64 {
        let Some(w) = self.queue.weight(id) else {
            return self.slice_ns;
        };
        let lightest = self
            .queue
            .runnable_ids()
            .filter_map(|v| self.queue.weight(v))
            .fold(w, f64::min);
        let factor = (w / lightest).clamp(1.0, MAX_SLICE_FACTOR);
        round_ns(self.slice_ns as f64 * factor)
    }

    /// Whether the vGPU is CPU-GPU interactive now.
    pub fn is_interactive(&mut self, id: VgpuId, now_ns: u64) -> bool {
        self.classes
            .get_mut(&id)
            .is_some_and(|c| c.is_interactive(now_ns))
    }

    /// The vGPU gave the GPU back after using it for `used_ns` (measured,
    /// overruns included). When it co-ran, pass its SM-time instead
    /// ([`corun::charge_ns`]), so that weights hold in shares of the GPU.
    pub fn release(&mut self, id: VgpuId, used_ns: u64) -> Result<(), SchedError> {
        self.queue.charge(id, used_ns)?;
        if let Some(a) = self.attained.as_mut() {
            a.charge(id, used_ns);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three vGPUs of weights 1:2:3 running `kernel_ns` kernels back to back;
    /// vGPU 3 is away for `away_ns` after each of its kernels (its guest
    /// between a reply and its next call), so it is never runnable when the
    /// GPU is handed on right after it. Returns each one's GPU time.
    fn three_with_one_away(kernel_ns: u64, away_ns: u64, total_ns: u64) -> [u64; 3] {
        let mut s = GpuScheduler::new(6_000_000);
        for id in 1..=3 {
            s.add(id, f64::from(id)).unwrap();
            s.request(id, 0, None).unwrap();
        }
        let mut used = [0u64; 3];
        let mut now = 0;
        let mut back_at = None;
        while now < total_ns {
            if back_at.is_some_and(|t| t <= now) {
                s.request(3, back_at.take().unwrap(), None).unwrap();
            }
            let g = s.grant(now).expect("someone is runnable");
            now += kernel_ns;
            used[g.vgpu as usize - 1] += kernel_ns;
            s.release(g.vgpu, kernel_ns).unwrap();
            if g.vgpu == 3 {
                s.idle(3, now).unwrap();
                back_at = Some(now + away_ns);
            }
        }
        used
    }

    #[test]
    fn a_slice_grows_with_weight_over_the_lightest_that_waits() {
        let mut s = GpuScheduler::new(6_000_000);
        for (id, w) in [(1, 1.0), (2, 2.0), (3, 3.0), (4, 10.0)] {
            s.add(id, w).unwrap();
        }
        // Alone, even the heaviest gets the base slice.
        s.request(4, 0, None).unwrap();
        assert_eq!(s.slice_for(4), 6_000_000);
        for id in 1..=3 {
            s.request(id, 0, None).unwrap();
        }
        let slices: Vec<u64> = (1..=4).map(|id| s.slice_for(id)).collect();
        assert_eq!(slices, [6_000_000, 12_000_000, 18_000_000, 24_000_000]);
        // The lightest is measured among those that want the GPU.
        s.idle(1, 0).unwrap();
        assert_eq!(s.slice_for(3), 9_000_000);
        assert_eq!(s.slice_for(1), 6_000_000, "a vGPU not waiting: base");
        assert_eq!(s.grant(0).unwrap().slice_ns, s.slice_for(2));
    }

    #[test]
    fn weighted_slices_hand_the_gpu_on_once_per_vgpu_and_round() {
        let mut s = GpuScheduler::new(6_000_000);
        for id in 1..=3 {
            s.add(id, f64::from(id)).unwrap();
            s.request(id, 0, None).unwrap();
        }
        let (mut used, mut handoffs, mut last) = ([0u64; 3], 0, None);
        let mut now = 0;
        // Twenty rounds of 36 ms, each holder using its whole slice.
        while now < 20 * 36_000_000 {
            let g = s.grant(now).unwrap();
            handoffs += usize::from(last.is_some_and(|l| l != g.vgpu));
            last = Some(g.vgpu);
            used[g.vgpu as usize - 1] += g.slice_ns;
            now += g.slice_ns;
            s.release(g.vgpu, g.slice_ns).unwrap();
        }
        assert_eq!(used, [120_000_000, 240_000_000, 360_000_000]);
        // 3 a round less the first grant; equal 6 ms slices take 5 a round.
        assert_eq!(handoffs, 20 * 3 - 1);
    }

    fn shares(used: [u64; 3]) -> [f64; 3] {
        let t: u64 = used.iter().sum();
        used.map(|u| u as f64 / t as f64)
    }

    #[test]
    fn a_vgpu_back_within_a_slice_keeps_its_place_and_its_share() {
        // Away 0.1 ms after each 2 ms kernel: it misses every hand-on.
        let s = shares(three_with_one_away(2_000_000, 100_000, 20_000_000_000));
        for (got, want) in s.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
            assert!((got - want).abs() < 0.01, "shares {s:?}");
        }
    }

    /// vGPUs 1 and 2 of weight 1 on a scheduler of 6 ms slices: 1 runs a
    /// 1 ms kernel and goes idle at 1 ms, then 2 runs `kernels` 2 ms ones.
    fn one_away_while_two_runs(kernels: usize) -> GpuScheduler {
        let mut s = GpuScheduler::new(6_000_000);
        for id in 1..=2 {
            s.add(id, 1.0).unwrap();
            s.request(id, 0, None).unwrap();
        }
        assert_eq!(s.grant(0).unwrap().vgpu, 1);
        s.release(1, 1_000_000).unwrap();
        s.idle(1, 1_000_000).unwrap();
        for _ in 0..kernels {
            assert_eq!(s.grant(0).unwrap().vgpu, 2);
            s.release(2, 2_000_000).unwrap();
        }
        s
    }

    #[test]
    fn a_vgpu_back_after_a_slice_joins_at_virtual_time() {
        let mut s = one_away_while_two_runs(5);
        let before = s.queue().start_tag(1).unwrap();
        // Back 10 ms later (more than a slice): no credit for the absence.
        s.request(1, 11_000_000, None).unwrap();
        let vt = s.queue().virtual_time();
        assert!(vt > before, "2 ran ahead while 1 was away");
        assert_eq!(s.queue().start_tag(1), Some(vt), "joins at virtual time");
        // The same absence within a slice keeps the tag it left with.
        let mut s = one_away_while_two_runs(1);
        let left_with = s.queue().start_tag(1).unwrap();
        s.request(1, 3_000_000, None).unwrap();
        assert_eq!(s.queue().start_tag(1), Some(left_with));
        assert_eq!(s.grant(0).unwrap().vgpu, 1, "its place: before 2");
    }

    #[test]
    fn the_lead_a_vgpu_brings_back_is_at_most_one_slice() {
        // 1 runs 0.1 ms and is away 5 ms (within a slice), again and again,
        // while 2 runs 2 ms kernels: 1 falls ever further behind in tags.
        let mut s = GpuScheduler::new(6_000_000);
        s.add(1, 1.0).unwrap();
        s.add(2, 1.0).unwrap();
        s.request(2, 0, None).unwrap();
        let mut now = 0;
        for _ in 0..200 {
            s.request(1, now, None).unwrap();
            assert_eq!(s.grant(now).unwrap().vgpu, 1);
            now += 100_000;
            s.release(1, 100_000).unwrap();
            s.idle(1, now).unwrap();
            let back = now + 5_000_000;
            while now < back {
                assert_eq!(s.grant(now).unwrap().vgpu, 2);
                now += 2_000_000;
                s.release(2, 2_000_000).unwrap();
            }
        }
        // Now 1 stays busy: it runs ahead of 2 for at most about one slice.
        s.request(1, now, None).unwrap();
        let mut ahead = 0;
        while s.grant(now).unwrap().vgpu == 1 {
            s.release(1, 100_000).unwrap();
            ahead += 100_000;
        }
        assert!(ahead <= 6_100_000, "1 ran {ahead} ns before 2 got a turn");
        assert!(ahead >= 5_000_000, "but it did keep a lead: {ahead} ns");
    }

    /// vGPU 1 runs alone for `alone_ns` in 1 ms grants, then vGPU 2 (same
    /// weight) arrives; returns how long 2 then runs before 1 gets a turn.
    fn newcomer_lead(policy: DevicePolicy, alone_ns: u64) -> u64 {
        let mut s = GpuScheduler::with_policy(6_000_000, policy);
        s.add(1, 1.0).unwrap();
        s.add(2, 1.0).unwrap();
        s.request(1, 0, None).unwrap();
        let mut now = 0;
        while now < alone_ns {
            assert_eq!(s.grant(now).unwrap().vgpu, 1);
            now += 1_000_000;
            s.release(1, 1_000_000).unwrap();
        }
        s.request(2, now, None).unwrap();
        let mut lead = 0;
        while s.grant(now).unwrap().vgpu == 2 {
            now += 1_000_000;
            lead += 1_000_000;
            s.release(2, 1_000_000).unwrap();
            assert!(lead < 10 * alone_ns, "2 never let go");
        }
        lead
    }

    #[test]
    fn las_never_forgets_tfs_forgets_and_the_fair_queue_joins_at_virtual_time() {
        let alone = 1_000_000_000; // 1 s
        assert!(newcomer_lead(DevicePolicy::FairQueue, alone) <= 1_000_000);
        assert!(newcomer_lead(DevicePolicy::PhaseSelection, alone) <= 1_000_000);
        let las = newcomer_lead(DevicePolicy::Las, alone);
        assert!(las >= alone, "LAS: 2 catches up the whole second: {las}");
        // TFS: 1's past decays (half-life 384 ms), so 2 leads for less
        // than its whole absence but far more than a slice.
        let tfs = newcomer_lead(DevicePolicy::Tfs, alone);
        assert!((50_000_000..alone / 2).contains(&tfs), "TFS lead {tfs}");
    }

    #[test]
    fn las_and_tfs_keep_weighted_shares_of_busy_vgpus() {
        for policy in [DevicePolicy::Las, DevicePolicy::Tfs] {
            let mut s = GpuScheduler::with_policy(6_000_000, policy);
            let mut used = [0u64; 3];
            for id in 1..=3 {
                s.add(id, f64::from(id)).unwrap();
                s.request(id, 0, None).unwrap();
            }
            let mut now = 0;
            while now < 3_000_000_000 {
                let g = s.grant(now).unwrap();
                let k = 300_000 * u64::from(g.vgpu); // unequal kernels
                now += k;
                used[g.vgpu as usize - 1] += k;
                s.release(g.vgpu, k).unwrap();
            }
            let used: Vec<f64> = used.iter().map(|&u| u as f64).collect();
            let m = weighted_mmr(&used, &[1.0, 2.0, 3.0]);
            assert!(m > 0.98, "{}: MMR {m} {used:?}", policy.name());
            assert_eq!(s.candidates(now, &[]).len(), 3);
            assert!(!s.candidates(now, &[2]).contains(&2));
        }
    }

    #[test]
    fn only_interactive_vgpus_get_their_vcpu_kicked() {
        let mut s = GpuScheduler::new(6_000_000);
        s.add(1, 1.0).unwrap();
        s.add(2, 1.0).unwrap();
        // vGPU 1: many synchronous calls per 10 ms; vGPU 2: one.
        for i in 0..20 {
            s.request(1, i * 400_000, Some(3)).unwrap();
        }
        s.request(2, 0, Some(5)).unwrap();
        let now = 8_000_000;
        let g = s.grant(now).unwrap();
        assert_eq!(g.vgpu, 1, "equal tags: lowest id first");
        assert_eq!(g.kick_vcpu, Some(3));
        s.release(1, 1_000_000).unwrap();
        let g = s.grant(now).unwrap();
        assert_eq!(g.vgpu, 2);
        assert_eq!(g.kick_vcpu, None, "not interactive, not coscheduled");
    }
}
