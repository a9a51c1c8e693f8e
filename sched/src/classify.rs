//! CPU-GPU interactivity (FairGV 3.3): a vGPU that makes more than
//! `threshold` synchronous calls in any `window_ns` is interactive, and its
//! waiting vCPU is coscheduled when it gets the GPU. Continuously updated.

use std::collections::VecDeque;

/// FairGV's threshold as an average rate (more than 10 synchronous calls per
/// 10 ms), for figures that only have call counts over a longer interval.
pub const INTERACTIVE_SYNC_PER_SECOND: f64 = 10.0 / 0.010;

/// Sliding-window classifier of one vGPU.
#[derive(Debug, Clone)]
pub struct Interactivity {
    window_ns: u64,
    threshold: usize,
    /// Times of the most recent synchronous calls (at most threshold + 1 kept).
    recent: VecDeque<u64>,
}

impl Default for Interactivity {
    /// FairGV's constants: more than 10 synchronous calls per 10 ms.
    fn default() -> Self {
        Interactivity::new(10_000_000, 10)
    }
}

impl Interactivity {
    /// A classifier with its window and threshold.
    pub fn new(window_ns: u64, threshold: usize) -> Self {
        Interactivity {
            window_ns,
            threshold,
            recent: VecDeque::with_capacity(threshold + 1),
        }
    }

    /// A synchronous call was made at `now_ns`.
    pub fn record_sync(&mut self, now_ns: u64) {
        self.recent.push_back(now_ns);
        // Only whether more than `threshold` fall in the window matters.
        while self.recent.len() > self.threshold + 1 {
            self.recent.pop_front();
        }
    }

    /// Whether the vGPU is interactive at `now_ns`.
    pub fn is_interactive(&mut self, now_ns: u64) -> bool {
        while self
            .recent
            .front()
            .is_some_and(|&t| now_ns.saturating_sub(t) > self.window_ns)
        {
            self.recent.pop_front();
        }
        self.recent.len() > self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_than_ten_per_ten_ms_is_interactive_and_it_decays() {
        let mut c = Interactivity::default();
        for i in 0..10 {
            c.record_sync(i * 900_000);
        }
        assert!(
            !c.is_interactive(9_000_000),
            "exactly 10 is not more than 10"
        );
        c.record_sync(9_100_000);
        assert!(c.is_interactive(9_200_000));
        // No calls for a while: no longer interactive.
        assert!(!c.is_interactive(25_000_000));
        // A slow steady caller (SRD-like 644 per 10 ms is fast; 26 per 10 ms as BS too).
        let mut slow = Interactivity::default();
        for i in 0..1000u64 {
            slow.record_sync(i * 2_000_000); // 5 per 10 ms
            assert!(!slow.is_interactive(i * 2_000_000));
        }
    }
}
