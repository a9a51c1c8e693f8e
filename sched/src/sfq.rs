//! Start-tag fair queuing over vGPUs (FairGV 3.2).
//!
//! Each vGPU i has weight w_i, start tag S_i and finish tag F_i. After it
//! used the GPU for L ns: F_i = S_i + L / w_i, then S_i = F_i. Runnable vGPUs
//! sit in a red-black tree keyed by (S_i, id); the next to run is the
//! leftmost. Virtual time is the smallest start tag among runnable vGPUs
//! (never decreasing); a vGPU that wakes gets S_i = max(S_i, virtual time),
//! so it cannot claim the time it spent idle ([`StartTagQueue::wake`]). One
//! back after an absence too short to count as idle keeps its tag, within a
//! bounded distance of virtual time ([`StartTagQueue::wake_with_credit`]).
//!
//! Tags are fixed-point (`TAG_SCALE` units per ns at weight 1) in u128, so
//! ordering is exact and a tag cannot overflow in any realistic run.

use std::collections::HashMap;

/// `units` of tag, rounded, saturating as Rust's `as` does (negative and NaN
/// give 0); from ns and a checked weight, it is far below `u128::MAX`.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // saturates, as said
fn tag_of(units: f64) -> u128 {
    units.round() as u128
}

use rbtree::RBTree;

use crate::SchedError;

/// A vGPU's id.
pub type VgpuId = u32;

/// Tag units per nanosecond of GPU time at weight 1.
pub const TAG_SCALE: f64 = (1u64 << 20) as f64;

#[derive(Debug, Clone, Copy)]
struct Entry {
    weight: f64,
    start: u128,
    finish: u128,
    runnable: bool,
}

/// The run queue of one GPU.
pub struct StartTagQueue {
    run: RBTree<(u128, VgpuId), ()>,
    vgpus: HashMap<VgpuId, Entry>,
    vtime: u128,
}

impl std::fmt::Debug for StartTagQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartTagQueue")
            .field("vgpus", &self.vgpus.len())
            .field("runnable", &self.run.len())
            .field("vtime", &self.vtime)
            .finish()
    }
}

impl Default for StartTagQueue {
    fn default() -> Self {
        Self::new()
    }
}

fn check_weight(w: f64) -> Result<(), SchedError> {
    if w.is_finite() && w > 0.0 {
        Ok(())
    } else {
        Err(SchedError::BadWeight(w))
    }
}

impl StartTagQueue {
    /// An empty queue.
    pub fn new() -> Self {
        StartTagQueue {
            run: RBTree::new(),
            vgpus: HashMap::new(),
            vtime: 0,
        }
    }

    /// Adds a vGPU, not yet runnable; its tags start at the virtual time.
    pub fn add(&mut self, id: VgpuId, weight: f64) -> Result<(), SchedError> {
        check_weight(weight)?;
        if self.vgpus.contains_key(&id) {
            return Err(SchedError::Duplicate(id));
        }
        let e = Entry {
            weight,
            start: self.vtime,
            finish: self.vtime,
            runnable: false,
        };
        self.vgpus.insert(id, e);
        Ok(())
    }

    /// Removes a vGPU.
    pub fn remove(&mut self, id: VgpuId) -> Result<(), SchedError> {
        let e = self.vgpus.remove(&id).ok_or(SchedError::NoSuchVgpu(id))?;
        if e.runnable {
            self.run.remove(&(e.start, id));
            self.advance_vtime();
        }
        Ok(())
    }

    /// Changes a weight; it applies from the next charge (within one slice).
    pub fn set_weight(&mut self, id: VgpuId, weight: f64) -> Result<(), SchedError> {
        check_weight(weight)?;
        self.entry(id)?.weight = weight;
        Ok(())
    }

    /// How far a vGPU's start tag is ahead of virtual time (tag units): the
    /// service it received beyond its share. What it takes along when it
    /// moves to another GPU ([`StartTagQueue::set_lag`] there), so that it
    /// neither gains nor loses share by moving.
    pub fn lag(&self, id: VgpuId) -> Option<u128> {
        self.vgpus
            .get(&id)
            .map(|e| e.start.saturating_sub(self.vtime))
    }

    /// Places a vGPU `lag` ahead of virtual time (a vGPU arriving from
    /// another GPU).
    pub fn set_lag(&mut self, id: VgpuId, lag: u128) -> Result<(), SchedError> {
        let vtime = self.vtime;
        let e = *self.vgpus.get(&id).ok_or(SchedError::NoSuchVgpu(id))?;
        if e.runnable {
            self.run.remove(&(e.start, id));
        }
        let start = vtime.saturating_add(lag);
        let entry = self.entry(id)?;
        entry.start = start;
        if e.runnable {
            self.run.insert((start, id), ());
        }
        self.advance_vtime();
        Ok(())
    }

    /// The weight of a vGPU.
    pub fn weight(&self, id: VgpuId) -> Option<f64> {
        self.vgpus.get(&id).map(|e| e.weight)
    }

    fn entry(&mut self, id: VgpuId) -> Result<&mut Entry, SchedError> {
        self.vgpus.get_mut(&id).ok_or(SchedError::NoSuchVgpu(id))
    }

    /// The vGPU has work: it joins the run queue, no earlier than virtual time.
    pub fn wake(&mut self, id: VgpuId) -> Result<(), SchedError> {
        self.wake_with_credit(id, 0)
    }

    /// The vGPU has work again after an absence too short to count as idle
    /// (see [`crate::GpuScheduler::request`]): it keeps its start tag, but
    /// no more than `credit_ns` of its own GPU time behind virtual time, so
    /// the lead it can bring back is bounded.
    pub fn wake_with_credit(&mut self, id: VgpuId, credit_ns: u64) -> Result<(), SchedError> {
        let vtime = self.vtime;
        let e = self.entry(id)?;
        if e.runnable {
            return Ok(());
        }
        let credit = tag_of(credit_ns as f64 * TAG_SCALE / e.weight);
        e.start = e.start.max(vtime.saturating_sub(credit));
        e.runnable = true;
        let key = (e.start, id);
        self.run.insert(key, ());
        self.advance_vtime();
        Ok(())
    }

    /// The vGPU has no work: it leaves the run queue.
    pub fn block(&mut self, id: VgpuId) -> Result<(), SchedError> {
        let e = self.entry(id)?;
        if !e.runnable {
            return Ok(());
        }
        e.runnable = false;
        let key = (e.start, id);
        self.run.remove(&key);
        self.advance_vtime();
        Ok(())
    }

    /// The runnable vGPU with the smallest start tag.
    pub fn pick(&self) -> Option<VgpuId> {
        self.run.get_first().map(|(&(_, id), _)| id)
    }

    /// Charges `used_ns` of GPU time: F = S + L / w, S = F.
    pub fn charge(&mut self, id: VgpuId, used_ns: u64) -> Result<(), SchedError> {
        let e = *self.vgpus.get(&id).ok_or(SchedError::NoSuchVgpu(id))?;
        if e.runnable {
            self.run.remove(&(e.start, id));
        }
        let inc = tag_of(used_ns as f64 * TAG_SCALE / e.weight);
        // Saturating: a tiny weight and a huge charge must not wrap the tag
        // to a small one (first in line) or panic.
        let finish = e.start.saturating_add(inc);
        let entry = self.entry(id)?;
        entry.finish = finish;
        entry.start = finish;
        if e.runnable {
            self.run.insert((finish, id), ());
        }
        self.advance_vtime();
        Ok(())
    }

    /// Virtual time: the smallest start tag among runnable vGPUs, never decreasing.
    fn advance_vtime(&mut self) {
        if let Some((&(s, _), _)) = self.run.get_first() {
            self.vtime = self.vtime.max(s);
        }
    }

    /// Current virtual time (tag units).
    pub fn virtual_time(&self) -> u128 {
        self.vtime
    }

    /// A vGPU's start tag (tag units).
    pub fn start_tag(&self, id: VgpuId) -> Option<u128> {
        self.vgpus.get(&id).map(|e| e.start)
    }

    /// Whether `id` is runnable.
    pub fn is_runnable(&self, id: VgpuId) -> bool {
        self.vgpus.get(&id).is_some_and(|e| e.runnable)
    }

    /// The runnable vGPUs, smallest start tag first (ties by id): the
    /// order in which the fair queue would hand out the GPU.
    pub fn runnable_ids(&self) -> impl Iterator<Item = VgpuId> + '_ {
        self.run.keys().map(|&(_, id)| id)
    }

    /// Number of runnable vGPUs.
    pub fn runnable(&self) -> usize {
        self.run.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_moved_vgpu_keeps_its_lag_on_the_new_queue() {
        // On A, vGPU 0 has just run a long kernel: it is ahead of vtime.
        let mut a = StartTagQueue::new();
        a.add(0, 1.0).unwrap();
        a.add(1, 1.0).unwrap();
        a.wake(0).unwrap();
        a.wake(1).unwrap();
        a.charge(0, 6_000_000).unwrap();
        let lag = a.lag(0).unwrap();
        assert!(lag > 0);
        // B has run a while; vGPU 0 arrives with its lag.
        let mut b = StartTagQueue::new();
        b.add(5, 1.0).unwrap();
        b.wake(5).unwrap();
        for _ in 0..10 {
            b.charge(5, 1_000_000).unwrap();
        }
        b.add(0, 1.0).unwrap();
        b.set_lag(0, lag).unwrap();
        b.wake(0).unwrap();
        assert_eq!(b.lag(0), Some(lag), "neither forgiven nor charged again");
        // vGPU 5 runs first until it has had the same 6 ms extra.
        assert_eq!(b.pick(), Some(5));
    }

    /// Runs always-busy vGPUs with the given weights and kernel sizes until
    /// `total_ns` of GPU time was handed out; returns each one's GPU time.
    fn run(q: &mut StartTagQueue, kernels: &[u64], total_ns: u64, used: &mut [u64]) {
        let mut t = 0;
        while t < total_ns {
            let id = q.pick().expect("someone is runnable");
            let k = kernels[id as usize];
            q.charge(id, k).unwrap();
            used[id as usize] += k;
            t += k;
        }
    }

    fn mmr(used: &[u64], weights: &[f64]) -> f64 {
        let used: Vec<f64> = used.iter().map(|&u| u as f64).collect();
        crate::weighted_mmr(&used, weights)
    }

    proptest! {
        #[test]
        fn shares_converge_to_weights(
            weights in proptest::collection::vec(0.5f64..8.0, 2..6),
            kernels in proptest::collection::vec(20_000u64..2_000_000, 6),
        ) {
            let mut q = StartTagQueue::new();
            for (i, &w) in weights.iter().enumerate() {
                let id = u32::try_from(i).unwrap();
                q.add(id, w).unwrap();
                q.wake(id).unwrap();
            }
            let mut used = vec![0u64; weights.len()];
            // Long enough that one kernel is a small part of everyone's share.
            let max_k = *kernels.iter().max().unwrap();
            run(&mut q, &kernels, max_k * 4000, &mut used);
            let r = mmr(&used, &weights);
            prop_assert!(r >= 0.98, "MMR {r} for weights {weights:?} kernels {kernels:?} used {used:?}");
        }

        #[test]
        fn a_vgpu_that_slept_cannot_starve_the_others(
            w in proptest::collection::vec(0.5f64..4.0, 2),
            sleep_ns in 1_000_000u64..10_000_000_000,
        ) {
            let mut q = StartTagQueue::new();
            q.add(0, w[0]).unwrap();
            q.add(1, w[1]).unwrap();
            q.wake(0).unwrap();
            // vGPU 0 runs alone for a long time while 1 sleeps.
            let k = 100_000;
            let mut used = vec![0u64; 2];
            run(&mut q, &[k, k], sleep_ns, &mut used);
            q.wake(1).unwrap();
            // From the wake-up on, 0 keeps (about) its share: 1 gets no credit for sleeping.
            let mut after = vec![0u64; 2];
            run(&mut q, &[k, k], 200 * k, &mut after);
            let share0 = after[0] as f64 / (after[0] + after[1]) as f64;
            let fair0 = w[0] / (w[0] + w[1]);
            prop_assert!((share0 - fair0).abs() < 0.03, "share {share0} vs fair {fair0}");
        }
    }

    #[test]
    fn weight_change_applies_from_the_next_slice() {
        let mut q = StartTagQueue::new();
        for i in 0..2 {
            q.add(i, 1.0).unwrap();
            q.wake(i).unwrap();
        }
        let k = 6_000_000; // one 6 ms slice per grant
        let mut used = vec![0u64; 2];
        run(&mut q, &[k, k], 100 * k, &mut used);
        q.set_weight(1, 3.0).unwrap();
        let mut after = vec![0u64; 2];
        run(&mut q, &[k, k], 400 * k, &mut after);
        let share1 = after[1] as f64 / (after[0] + after[1]) as f64;
        assert!((share1 - 0.75).abs() < 0.01, "share {share1}");
    }

    #[test]
    fn a_huge_charge_at_a_tiny_weight_saturates_its_tag() {
        let mut q = StartTagQueue::new();
        q.add(1, 1e-300).unwrap();
        q.add(2, 1.0).unwrap();
        for id in [1, 2] {
            q.wake(id).unwrap();
        }
        q.charge(1, u64::MAX).unwrap();
        q.charge(1, u64::MAX).unwrap();
        assert_eq!(q.start_tag(1), Some(u128::MAX));
        assert_eq!(q.pick(), Some(2), "the tag did not wrap to a small one");
    }

    #[test]
    fn bad_input_is_refused() {
        let mut q = StartTagQueue::new();
        for w in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(q.add(1, w), Err(SchedError::BadWeight(_))));
        }
        q.add(1, 1.0).unwrap();
        assert_eq!(q.add(1, 1.0), Err(SchedError::Duplicate(1)));
        assert_eq!(q.wake(9), Err(SchedError::NoSuchVgpu(9)));
        assert_eq!(q.charge(9, 1), Err(SchedError::NoSuchVgpu(9)));
        assert!(q.pick().is_none());
        q.wake(1).unwrap();
        q.remove(1).unwrap();
        assert!(q.pick().is_none());
        assert_eq!(q.runnable(), 0);
    }

    #[test]
    fn virtual_time_never_decreases_and_ties_break_by_id() {
        let mut q = StartTagQueue::new();
        for i in [3, 1, 2] {
            q.add(i, 1.0).unwrap();
            q.wake(i).unwrap();
        }
        assert_eq!(q.pick(), Some(1));
        let mut last = q.virtual_time();
        for _ in 0..100 {
            let id = q.pick().unwrap();
            q.charge(id, 1000 * u64::from(id)).unwrap();
            if id == 2 {
                q.block(2).unwrap();
                q.wake(2).unwrap();
            }
            assert!(q.virtual_time() >= last);
            last = q.virtual_time();
        }
    }
}
