//! Rate-limited logging for what a guest can trigger.
//!
//! Everything a guest does wrong (a corrupt ring, a refused request, a
//! socket dropped mid-setup) is worth a line in the host's log, but a
//! hostile guest can do it thousands of times a second: unlimited, it would
//! fill the host's disk and bury every other tenant's real warnings. Each VM
//! gets its own [`LogLimiter`] (its ivshmem server, its worker process):
//! at most `burst` lines per `period`; the rest are counted, the count is
//! logged with the next line that gets through, and kept in total for the
//! operator (`fairvgpu status`, `/metrics`). One VM's flood never takes
//! another VM's lines. As Firecracker's `rate_limited.rs` does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Lines a VM may log per [`DEFAULT_PERIOD`] before the rest are counted only.
pub const DEFAULT_BURST: u32 = 5;
/// See [`DEFAULT_BURST`].
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(60);

/// A limit other limiters share (the workers of one VM, each a process of
/// its own): asked after a limiter's own, whether one more line may go.
pub type SharedLimit = Arc<dyn Fn() -> bool + Send + Sync>;

/// A fixed-window limit on log lines.
#[derive(Debug)]
pub struct LogLimiter {
    burst: u32,
    period: Duration,
    window: Option<Instant>,
    used: u32,
    /// Suppressed since the last line that got through.
    pending: u64,
    /// Suppressed in all.
    total: Arc<AtomicU64>,
    /// Asked too, where set.
    shared: Option<Shared>,
}

/// A [`SharedLimit`], which has no `Debug` of its own.
struct Shared(SharedLimit);

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedLimit")
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(DEFAULT_BURST, DEFAULT_PERIOD)
    }
}

impl LogLimiter {
    /// At most `burst` lines per `period`.
    pub fn new(burst: u32, period: Duration) -> LogLimiter {
        LogLimiter {
            burst,
            period,
            window: None,
            used: 0,
            pending: 0,
            total: Arc::default(),
            shared: None,
        }
    }

    /// The same, a line going only if `shared` lets it too (a limit of the
    /// VM's, whatever the number of its workers).
    pub fn with_shared(mut self, shared: SharedLimit) -> LogLimiter {
        self.shared = Some(Shared(shared));
        self
    }

    /// Whether a line may be logged now. `Some(n)`: yes, and `n` lines were
    /// suppressed since the last one that was (log the count with it);
    /// `None`: no, the line is counted as suppressed.
    pub fn allow(&mut self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&mut self, now: Instant) -> Option<u64> {
        if self
            .window
            .is_none_or(|w| now.saturating_duration_since(w) >= self.period)
        {
            self.window = Some(now);
            self.used = 0;
        }
        if self.used < self.burst && self.shared.as_ref().is_none_or(|s| (s.0)()) {
            self.used += 1;
            Some(std::mem::take(&mut self.pending))
        } else {
            self.pending += 1;
            self.total.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// Lines suppressed so far.
    pub fn suppressed(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The count of lines suppressed so far, readable from other threads.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.total.clone()
    }
}

/// Logs at `level` (a `tracing` macro name: `warn`, `info`, ...) through a
/// [`LogLimiter`], adding `suppressed = n` when lines were dropped before it:
/// `rate_limited!(limiter, warn, channel = 3, "channel ended: {e}")`.
#[macro_export]
macro_rules! rate_limited {
    ($limiter:expr, $level:ident, $($arg:tt)+) => {
        if let Some(n) = $limiter.allow() {
            if n > 0 {
                tracing::$level!(suppressed = n, $($arg)+);
            } else {
                tracing::$level!($($arg)+);
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared limit that says no stops a line the limiter's own allows.
    #[test]
    fn a_shared_limit_is_asked_too() {
        let left = Arc::new(AtomicU64::new(2));
        let l = left.clone();
        let mut a = LogLimiter::new(5, DEFAULT_PERIOD).with_shared(Arc::new(move || {
            l.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        }));
        assert_eq!(a.allow(), Some(0));
        assert_eq!(a.allow(), Some(0));
        assert_eq!(a.allow(), None, "the shared limit is spent");
        assert_eq!(a.suppressed(), 1);
        assert_eq!(left.load(Ordering::Acquire), 0);
    }

    #[test]
    fn lets_a_burst_through_per_period_and_counts_the_rest() {
        let mut l = LogLimiter::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        let got: Vec<Option<u64>> = (0..5).map(|_| l.allow_at(t0)).collect();
        assert_eq!(got, [Some(0), Some(0), Some(0), None, None]);
        assert_eq!(l.suppressed(), 2);
        // Still the same window.
        assert_eq!(l.allow_at(t0 + Duration::from_secs(9)), None);
        // A new window: the first line carries the count of those dropped.
        assert_eq!(l.allow_at(t0 + Duration::from_secs(10)), Some(3));
        assert_eq!(l.allow_at(t0 + Duration::from_secs(10)), Some(0));
        assert_eq!(l.suppressed(), 3);
        let c = l.counter();
        assert_eq!(c.load(Ordering::Relaxed), 3);
    }
}
