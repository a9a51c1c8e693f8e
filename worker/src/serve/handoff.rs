//! Where a vGPU's grants go at their edges: how many it took and gave back
//! idle, how long it held them, how long its last work took to drain at
//! each release, and how long after each grant its first device work went
//! out. The device idles between one holder's last kernel and the next
//! holder's first: these figures (with the grant service's own, its time
//! from a release to the next grant: `crate::grant::VgpuLive`) say where.
//! The clock is read only at hand-offs.

use std::sync::atomic::{AtomicU64, Ordering};

/// A worker's hand-off counters (in [`super::Stats`]).
#[derive(Debug, Default)]
pub struct Handoff {
    /// Grants held and given back.
    pub grants: AtomicU64,
    /// Of those, given back because nothing was left to run (after the
    /// worker's idle spin), not because the slice ended.
    pub idle_releases: AtomicU64,
    /// Time the grants were held, from receiving to giving back (ns).
    pub held_ns: AtomicU64,
    /// The grants' slices, each with the extensions it got (ns): a late
    /// guest's waits are free up to an eighth of it.
    pub slice_ns: AtomicU64,
    /// Time from deciding to give a grant back (the device work marked) to
    /// giving it back (the marks passed), ns: the work still queued, and
    /// how late the worker saw it done.
    pub drain_ns: AtomicU64,
    /// Sleeps of the serving loop while a release waited for the device
    /// (each at least `WAITING_POLL`, plus the kernel's timer slack).
    pub drain_sleeps: AtomicU64,
    /// Grants with device work under them, and the total time from
    /// receiving each to its first device operation (ns).
    pub first_submits: AtomicU64,
    /// See `first_submits`.
    pub first_submit_ns: AtomicU64,
    /// Replies that had to wake a sleeping guest (its doorbell rung).
    pub guest_bells: AtomicU64,
    /// Times a holder with nothing to run kept the grant because a guest
    /// had not yet taken its reply (it had not run since: on a busy host,
    /// waiting for a CPU), and the time it so waited (ns).
    pub late_guests: AtomicU64,
    /// See `late_guests`.
    pub late_guest_ns: AtomicU64,
    /// Of `late_guest_ns`, what the late guests' vCPU threads spent
    /// waiting for a CPU (never charged), ns.
    pub late_guest_cpu_ns: AtomicU64,
}

impl Handoff {
    /// The counters now.
    pub fn figures(&self) -> Figures {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Figures {
            grants: l(&self.grants),
            idle_releases: l(&self.idle_releases),
            held_ns: l(&self.held_ns),
            slice_ns: l(&self.slice_ns),
            drain_ns: l(&self.drain_ns),
            drain_sleeps: l(&self.drain_sleeps),
            first_submits: l(&self.first_submits),
            first_submit_ns: l(&self.first_submit_ns),
            guest_bells: l(&self.guest_bells),
            late_guests: l(&self.late_guests),
            late_guest_ns: l(&self.late_guest_ns),
            late_guest_cpu_ns: l(&self.late_guest_cpu_ns),
        }
    }

    /// Adds `d` to `counter` (a hand-off's figure).
    pub(super) fn add(counter: &AtomicU64, d: u64) {
        counter.fetch_add(d, Ordering::Relaxed);
    }
}

/// A snapshot of [`Handoff`], with the means the benches print.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // each field is [`Handoff`]'s of the same name
pub struct Figures {
    pub grants: u64,
    pub idle_releases: u64,
    pub held_ns: u64,
    pub slice_ns: u64,
    pub drain_ns: u64,
    pub drain_sleeps: u64,
    pub first_submits: u64,
    pub first_submit_ns: u64,
    pub guest_bells: u64,
    pub late_guests: u64,
    pub late_guest_ns: u64,
    pub late_guest_cpu_ns: u64,
}

fn mean_us(ns: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        ns as f64 / n as f64 / 1e3
    }
}

impl Figures {
    /// Mean time a grant was held, µs.
    pub fn held_us(&self) -> f64 {
        mean_us(self.held_ns, self.grants)
    }

    /// Mean drain at a release (a grant's end), µs.
    pub fn drain_us(&self) -> f64 {
        mean_us(self.drain_ns, self.grants)
    }

    /// Mean time from a grant to its first device operation, µs.
    pub fn first_submit_us(&self) -> f64 {
        mean_us(self.first_submit_ns, self.first_submits)
    }

    /// The sum of several workers' figures.
    pub fn sum<'a>(all: impl IntoIterator<Item = &'a Figures>) -> Figures {
        all.into_iter().fold(Figures::default(), |a, f| Figures {
            grants: a.grants + f.grants,
            idle_releases: a.idle_releases + f.idle_releases,
            held_ns: a.held_ns + f.held_ns,
            slice_ns: a.slice_ns + f.slice_ns,
            drain_ns: a.drain_ns + f.drain_ns,
            drain_sleeps: a.drain_sleeps + f.drain_sleeps,
            first_submits: a.first_submits + f.first_submits,
            first_submit_ns: a.first_submit_ns + f.first_submit_ns,
            guest_bells: a.guest_bells + f.guest_bells,
            late_guests: a.late_guests + f.late_guests,
            late_guest_ns: a.late_guest_ns + f.late_guest_ns,
            late_guest_cpu_ns: a.late_guest_cpu_ns + f.late_guest_cpu_ns,
        })
    }

    /// One line: grants (idle releases), mean hold, drain and grant to
    /// first submission, drain sleeps, guest wakes, waits for late guests.
    pub fn line(&self) -> String {
        format!(
            "grants {} (idle {}) held {:.0} us drain {:.1} us grant->submit {:.1} us drain_sleeps {} guest_bells {} late_guests {} ({:.1} us each) waiting_for_cpu {:.1} us each",
            self.grants,
            self.idle_releases,
            self.held_us(),
            self.drain_us(),
            self.first_submit_us(),
            self.drain_sleeps,
            self.guest_bells,
            self.late_guests,
            mean_us(self.late_guest_ns, self.late_guests),
            mean_us(self.late_guest_cpu_ns, self.late_guests)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_are_per_release_and_per_first_submission() {
        let h = Handoff::default();
        Handoff::add(&h.grants, 2);
        Handoff::add(&h.held_ns, 12_000_000);
        Handoff::add(&h.drain_ns, 100_000);
        Handoff::add(&h.first_submits, 4);
        Handoff::add(&h.first_submit_ns, 40_000);
        let f = h.figures();
        assert_eq!(f.held_us(), 6000.0);
        assert_eq!(f.drain_us(), 50.0);
        assert_eq!(f.first_submit_us(), 10.0);
        assert!(f
            .line()
            .starts_with("grants 2 (idle 0) held 6000 us drain 50.0 us"));
        // Nothing measured: means of nothing are 0, not NaN.
        assert_eq!(Figures::default().drain_us(), 0.0);
    }

    #[test]
    fn sums_add_every_field() {
        let a = Figures {
            grants: 1,
            idle_releases: 3,
            held_ns: 4,
            slice_ns: 13,
            drain_ns: 5,
            drain_sleeps: 6,
            first_submits: 7,
            first_submit_ns: 8,
            guest_bells: 9,
            late_guests: 10,
            late_guest_ns: 11,
            late_guest_cpu_ns: 12,
        };
        let s = Figures::sum([&a, &a]);
        assert_eq!(s.grants, 2);
        assert_eq!(s.guest_bells, 18);
        assert_eq!(s.first_submit_ns, 16);
        assert_eq!(s.idle_releases, 6);
        assert_eq!(s.late_guests, 20);
        assert_eq!(s.late_guest_ns, 22);
        assert_eq!(s.late_guest_cpu_ns, 24);
        assert_eq!(s.slice_ns, 26);
    }
}
