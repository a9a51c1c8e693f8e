//! The Xen-style credit scheduler, as a baseline for the GPU (GPUvm's and
//! Pegasus's choice): every accounting period each vGPU gets credit in
//! proportion to its weight, capped at one period's worth; at every tick the
//! vGPU that holds the GPU is debited a whole tick, whatever it ran (sampled
//! accounting by wall time); vGPUs with credit left (UNDER) run before those
//! without (OVER), round robin within a class.

use std::collections::{HashMap, VecDeque};

use sched::{SchedError, VgpuId};

/// Xen's constants: 10 ms ticks, 30 ms accounting periods and time slices.
pub const TICK_NS: u64 = 10_000_000;
/// Accounting period.
pub const PERIOD_NS: u64 = 30_000_000;

/// Credit state of the vGPUs of one GPU.
#[derive(Debug, Default)]
pub struct CreditScheduler {
    weight: HashMap<VgpuId, f64>,
    credit: HashMap<VgpuId, i64>,
    order: VecDeque<VgpuId>,
}

impl CreditScheduler {
    /// No vGPUs yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a vGPU with its weight and one period's credit.
    pub fn add(&mut self, id: VgpuId, weight: f64) -> Result<(), SchedError> {
        if !(weight.is_finite() && weight > 0.0) {
            return Err(SchedError::BadWeight(weight));
        }
        if self.weight.insert(id, weight).is_some() {
            return Err(SchedError::Duplicate(id));
        }
        self.order.push_back(id);
        self.credit.insert(id, 0);
        self.period();
        Ok(())
    }

    /// The vGPU's credit in ns (negative: OVER).
    pub fn credit(&self, id: VgpuId) -> Option<i64> {
        self.credit.get(&id).copied()
    }

    fn cap(&self, id: VgpuId) -> i64 {
        let total: f64 = self.weight.values().sum();
        (PERIOD_NS as f64 * self.weight[&id] / total) as i64
    }

    /// An accounting period passed: hand out credit by weight.
    pub fn period(&mut self) {
        let ids: Vec<VgpuId> = self.order.iter().copied().collect();
        for id in ids {
            let cap = self.cap(id);
            let c = self.credit.entry(id).or_insert(0);
            *c = (*c + cap).min(cap);
        }
    }

    /// A tick passed while `holder` held the GPU: it pays the whole tick.
    pub fn tick(&mut self, holder: VgpuId) {
        if let Some(c) = self.credit.get_mut(&holder) {
            *c -= TICK_NS as i64;
        }
    }

    /// The next vGPU among those `eligible`: UNDER first, round robin.
    pub fn pick(&self, eligible: impl Fn(VgpuId) -> bool) -> Option<VgpuId> {
        let under = self
            .order
            .iter()
            .copied()
            .find(|&id| eligible(id) && self.credit[&id] > 0);
        under.or_else(|| self.order.iter().copied().find(|&id| eligible(id)))
    }

    /// The vGPU ran: it goes to the back of the round robin.
    pub fn rotate(&mut self, id: VgpuId) {
        if let Some(pos) = self.order.iter().position(|&x| x == id) {
            self.order.remove(pos);
            self.order.push_back(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_runs_before_over_and_credit_follows_weight() {
        let mut c = CreditScheduler::new();
        c.add(1, 1.0).unwrap();
        c.add(2, 2.0).unwrap();
        assert_eq!(c.credit(1), Some(10_000_000));
        assert_eq!(c.credit(2), Some(20_000_000));
        assert_eq!(c.pick(|_| true), Some(1));
        c.tick(1);
        c.rotate(1);
        // 1 has no credit left: 2 first, and 2 again after rotating (1 is OVER).
        assert_eq!(c.pick(|_| true), Some(2));
        c.rotate(2);
        assert_eq!(c.pick(|_| true), Some(2));
        assert_eq!(c.pick(|id| id == 1), Some(1), "OVER still runs when alone");
        c.period();
        assert_eq!(c.credit(1), Some(10_000_000), "capped at one period");
        assert!(c.add(1, 1.0).is_err());
        assert!(c.add(3, -1.0).is_err());
    }
}
