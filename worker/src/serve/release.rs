//! Giving the GPU back. At a slice's end the vGPU's work must be done on
//! the device before another vGPU gets it (a GPU cannot be preempted), and
//! work that overran the slice is charged in full. The worker marks every
//! session's work and gives the grant back once the device has passed the
//! marks; meanwhile it keeps serving what needs no device (allocations,
//! queries, replies), and starts no new device work.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::handoff::Handoff;
use super::requests::deferred_frees;
use super::sessions::SessionId;
use super::shared::Slice;
use super::Worker;
use crate::executor::Marker;
use crate::session::Period;
use crate::Error;

/// A grant being given back.
pub(super) struct Releasing {
    /// Each session's mark, and the busy period it ends.
    marks: Vec<(SessionId, Option<Marker>, Option<Period>)>,
    /// Whether the vGPU stays runnable (see `Worker::serve`).
    still_active: bool,
    /// When the release began (the drain's start).
    since: Instant,
}

impl Worker {
    /// Marks every session's work and stops issuing device work until the
    /// grant is back (see [`Worker::poll_release`]).
    pub(super) fn begin_release(&mut self, still_active: bool) -> Result<(), Error> {
        // A wait for a late guest ends with the grant it was waited in.
        self.late_guest_came();
        let mut marks = Vec::new();
        for (&id, e) in self.sessions.iter_mut() {
            let s = &mut e.s;
            let period = if Slice::period_ending(s, None) {
                s.period.take()
            } else {
                None
            };
            match s.ctx.mark(None) {
                Ok(m) => marks.push((id, Some(m), period)),
                Err(err) => {
                    // The work failed: the next call reports it; nothing
                    // more to charge.
                    s.defer(err);
                    marks.push((id, None, None));
                }
            }
        }
        // The vGPU first in line is told now, while this work finishes.
        if let Some(g) = self.sh.slice.gate.as_mut() {
            g.draining()?;
        }
        self.sh.slice.releasing = true;
        self.releasing = Some(Releasing {
            marks,
            still_active,
            since: Instant::now(),
        });
        self.poll_release().map(drop)
    }

    /// Whether the device passed every mark of the release under way; if
    /// so, charges what ran and gives the grant back.
    pub(super) fn poll_release(&mut self) -> Result<bool, Error> {
        let Some(mut rel) = self.releasing.take() else {
            return Ok(true);
        };
        let mut pending = Vec::new();
        for (id, mark, period) in rel.marks.drain(..) {
            let Some(e) = self.sessions.get_mut(id) else {
                continue; // the session ended meanwhile
            };
            let s = &mut e.s;
            let done = match mark {
                None => Ok(true),
                Some(m) => s.ctx.reached(m),
            };
            if mark.is_some() && !matches!(done, Ok(false)) {
                // The passed mark synchronized the context, where the driver
                // writes its kernel printf text: this process's, though
                // another channel's pass is being served.
                self.sh.port.collect_output(Some(id));
            }
            match done {
                Ok(false) => pending.push((id, mark, period)),
                Ok(true) => {
                    if let Some(p) = period {
                        self.sh.slice.charge_period(s, p);
                    }
                    Slice::collect_timings(s);
                    deferred_frees(&mut self.sh, s);
                }
                Err(err) => s.defer(err),
            }
        }
        if !pending.is_empty() {
            rel.marks = pending;
            self.releasing = Some(rel);
            return Ok(false);
        }
        self.sh.slice.releasing = false;
        self.sh.slice.issued_ns = 0;
        let used = std::mem::take(&mut self.sh.slice.charged_ns);
        self.sh.slice.bursts = 0;
        self.sh.slice.late_free_ns = 0;
        self.sh
            .port
            .stats
            .charged_ns
            .fetch_add(used, Ordering::Relaxed);
        self.sh.slice.worked = false;
        let pending = rel.still_active
            || self.chans.iter().any(|c| {
                c.host.req.pending().unwrap_or(0) > 0
                    || c.transfer.is_some()
                    || c.sliced.is_some()
                    || c.waiting()
            });
        if let Some(g) = self.sh.slice.gate.as_mut() {
            let h = &self.sh.port.stats.handoff;
            if g.holding() {
                Handoff::add(&h.grants, 1);
                Handoff::add(&h.held_ns, g.held_ns());
                Handoff::add(&h.slice_ns, g.slice_ns());
                Handoff::add(&h.drain_ns, crate::nanos(rel.since.elapsed()));
            }
            g.release(used, pending)?;
        }
        Ok(true)
    }

    /// Gives the grant back now, waiting for the device (an idle vGPU, a
    /// migration, the worker stopping).
    pub(super) fn release_grant(&mut self, still_active: bool) -> Result<(), Error> {
        if self.releasing.is_none() {
            self.begin_release(still_active)?;
        }
        while !self.poll_release()? {
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }
}
