//! Timing with pooled CUDA events: sampled launches and the busy periods
//! the worker charges.

use std::ptr::null_mut;

use cudarc::driver::sys::{self, CUresult};
use protocol::Status;

use super::check;
use super::context::CudaContext;
use crate::executor::{Handle, Timing};

impl CudaContext {
    /// An idle event from the pool, or a new one (timing enabled).
    pub(super) fn pooled_event(&mut self) -> Result<sys::CUevent, Status> {
        if let Some(e) = self.event_pool.pop() {
            return Ok(e);
        }
        let mut n: sys::CUevent = null_mut();
        // SAFETY: out-parameter on our stack; timing events (flags 0).
        check(unsafe { sys::cuEventCreate(&mut n, 0) })?;
        Ok(n)
    }

    /// Nanoseconds between two recorded events, if `b` has completed.
    pub(super) fn elapsed_ns(a: sys::CUevent, b: sys::CUevent) -> Option<u64> {
        // SAFETY: our own event.
        if unsafe { sys::cuEventQuery(b) } != CUresult::CUDA_SUCCESS {
            return None;
        }
        let mut ms = 0f32;
        // SAFETY: both events recorded by us; out-parameter on our stack.
        (unsafe { sys::cuEventElapsedTime_v2(&mut ms, a, b) } == CUresult::CUDA_SUCCESS)
            .then(|| crate::sat_u64(f64::from(ms).max(0.0) * 1e6))
    }
}

impl Timing for CudaContext {
    fn take_timings(&mut self) -> Vec<(Handle, u64)> {
        if self.bind().is_err() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut still = Vec::new();
        for (f, a, b) in std::mem::take(&mut self.timed) {
            match Self::elapsed_ns(a, b) {
                Some(ns) => {
                    out.push((f, ns));
                    self.event_pool.extend([a, b]);
                }
                None => still.push((f, a, b)),
            }
        }
        self.timed = still;
        out
    }

    fn period_begin(&mut self) -> Result<(), Status> {
        self.bind()?;
        if let Some((a, ends)) = self.period.take() {
            self.event_pool.push(a);
            self.event_pool.extend(ends);
        }
        let a = self.pooled_event()?;
        // The context is drained: an event on the legacy default stream
        // completes as soon as the device reaches it, before any later work.
        // SAFETY: our own event; the null stream of our current context.
        check(unsafe { sys::cuEventRecord(a, null_mut()) })?;
        self.period = Some((a, Vec::new()));
        Ok(())
    }

    fn period_end(&mut self, streams: &[Handle]) -> Result<(), Status> {
        self.bind()?;
        let raw = streams
            .iter()
            .map(|&h| self.stream(h))
            .collect::<Result<Vec<_>, _>>()?;
        let mut ends = Vec::with_capacity(raw.len());
        for st in raw {
            let e = self.pooled_event()?;
            // SAFETY: our own event and a stream of this context.
            check(unsafe { sys::cuEventRecord(e, st) })?;
            ends.push(e);
        }
        match self.period.as_mut() {
            Some((_, old)) => {
                let old = std::mem::replace(old, ends);
                self.event_pool.extend(old);
                Ok(())
            }
            None => {
                self.event_pool.extend(ends);
                Err(Status::NotReady)
            }
        }
    }

    fn period_ns(&mut self) -> Option<u64> {
        self.bind().ok()?;
        let (a, ends) = self.period.take()?;
        // The last stream to finish ends it; unknown while any has not.
        let worst = ends
            .iter()
            .try_fold(0, |w: u64, &e| Some(w.max(Self::elapsed_ns(a, e)?)))
            .filter(|_| !ends.is_empty());
        self.event_pool.push(a);
        self.event_pool.extend(ends);
        worst
    }
}
