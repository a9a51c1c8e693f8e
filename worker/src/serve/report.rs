//! Reporting: the counters readable while the worker runs, and the live
//! figures it reports to its GPU's grant service.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::handoff::Handoff;
use super::shared::REPORT_EVERY;
use super::{contexts, Worker};
use crate::Error;

/// Counters readable while the worker runs.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests served.
    pub requests: AtomicU64,
    /// Requests refused (bad input of any kind).
    pub refused: AtomicU64,
    /// Channels torn down because their rings were corrupt.
    pub broken_channels: AtomicU64,
    /// Channels reclaimed (any reason).
    pub reclaimed: AtomicU64,
    /// Device bytes allocated right now.
    pub mem_used: AtomicU64,
    /// GPU time charged to the scheduler so far (ns).
    pub charged_ns: AtomicU64,
    /// Busy periods charged, and their charges (ns), by how the charge was
    /// found: [first of a grant (events), other timed (events), host clock,
    /// the kernel's timed mean (`sched::accounting::LaunchTime`)].
    pub periods: [AtomicU64; 4],
    /// See `periods`.
    pub period_charges: [AtomicU64; 4],
    /// Host time the worker spent in device-to-host copies into the
    /// response arenas (ns), and their bytes.
    pub dtoh_ns: AtomicU64,
    /// See `dtoh_ns`.
    pub dtoh_bytes: AtomicU64,
    /// Kernel launches run.
    pub launches: AtomicU64,
    /// Launches whose GPU time was measured with events.
    pub timed_launches: AtomicU64,
    /// Synchronous calls served (those that wait for the device).
    pub sync_calls: AtomicU64,
    /// Migrations to another GPU done.
    pub migrations: AtomicU64,
    /// Launches run as sub-grids (kernel slicing).
    pub sliced_launches: AtomicU64,
    /// Launches submitted in runs of two or more (queued in the ring
    /// behind one another; see [`crate::session::LaunchRun`]).
    pub batched_launches: AtomicU64,
    /// The GPU the vGPU runs on now.
    pub device: AtomicU64,
    /// Bytes of the pinned pool its guests hold.
    pub pinned_used: AtomicU64,
    /// Bytes copied between host and device (both ways, staged or pinned).
    pub copy_bytes: AtomicU64,
    /// Contexts made new for guest processes (see `contexts.rs`).
    pub contexts_created: AtomicU64,
    /// Guest processes that got an ended process's context, made clean.
    pub contexts_reused: AtomicU64,
    /// Times a new process's `Hello` waited for the context-creation rate.
    pub contexts_deferred: AtomicU64,
    /// Grants, releases and what each hand-off cost (see `handoff.rs`).
    pub handoff: Handoff,
}

impl Stats {
    pub(super) fn count_contexts(&self, c: &contexts::PoolCounts) {
        self.contexts_created.store(c.created, Ordering::Relaxed);
        self.contexts_reused.store(c.reused, Ordering::Relaxed);
        self.contexts_deferred.store(c.deferred, Ordering::Relaxed);
    }
}

/// What one copy engine moves between host and device per second (PCIe 4/5
/// order of magnitude): a copy's device time, for the copy share reported
/// for phase selection (`sched::corun`).
const COPY_BYTES_PER_S: f64 = 25e9;

impl Worker {
    /// Reports if [`REPORT_EVERY`] has passed since `last` (and there is a
    /// scheduler to report to).
    pub(super) fn maybe_report(&mut self, last: &mut Instant) -> Result<(), Error> {
        if self.sh.slice.gate.is_none() || last.elapsed() < REPORT_EVERY {
            return Ok(());
        }
        *last = Instant::now();
        self.report()
    }

    /// Tells the grant service the live figures the operator sees.
    fn report(&mut self) -> Result<(), Error> {
        let queued: u64 = self
            .chans
            .iter()
            .map(|c| u64::from(c.host.req.pending().unwrap_or(0)))
            .sum();
        let (rss_bytes, open_fds) = crate::procfs::own_usage();
        let (num, den) = std::mem::take(&mut self.sh.figures.occupancy);
        if den > 0.0 {
            self.sh.figures.last_occupancy = num / den;
        }
        // The share of its device work since the last report that was
        // copies: their time at a copy engine's rate against that and its
        // kernels' estimated time (`den`, ns). A guest that only copies is
        // at 1 however fast its copies go through the rings.
        let bytes = self.sh.port.stats.copy_bytes.load(Ordering::Relaxed);
        let b0 = std::mem::replace(&mut self.sh.figures.copy_mark, bytes);
        let copy_ns = bytes.saturating_sub(b0) as f64 / COPY_BYTES_PER_S * 1e9;
        let copy_share = if copy_ns > 0.0 {
            copy_ns / (copy_ns + den)
        } else {
            0.0
        };
        let st = &self.sh.port.stats;
        let r = wire::grant::Report {
            mem_used: st.mem_used.load(Ordering::Relaxed),
            sync_calls: st.sync_calls.load(Ordering::Relaxed),
            queued,
            launches: st.launches.load(Ordering::Relaxed),
            requests: st.requests.load(Ordering::Relaxed),
            refused: st.refused.load(Ordering::Relaxed),
            rss_bytes,
            open_fds,
            occupancy_ppm: crate::sat_u64((self.sh.figures.last_occupancy * 1e6).round()),
            sliced_launches: st.sliced_launches.load(Ordering::Relaxed),
            log_suppressed: self.sh.port.log.borrow().suppressed(),
            contexts_created: st.contexts_created.load(Ordering::Relaxed),
            contexts_reused: st.contexts_reused.load(Ordering::Relaxed),
            copy_ppm: crate::sat_u64((copy_share * 1e6).round()),
        };
        if let Some(g) = self.sh.slice.gate.as_mut() {
            g.report(&r)?;
        }
        Ok(())
    }
}
