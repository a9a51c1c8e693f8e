//! Kernel launches on the model: computed at submission, their modeled
//! time put on the device's queue; sliced sub-grids, and the timings and
//! busy periods the worker charges.

use std::time::Instant;

use protocol::{Dim3, Status};

use super::context::SimContext;
use crate::executor::{Handle, Launches, Timing};

impl SimContext {
    /// Runs a kernel (results now, time on the queue); returns its modeled time.
    pub(super) fn run_kernel(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        stream: Handle,
        params: &[u8],
    ) -> Result<u64, Status> {
        let ns = self.compute(func, grid, block, params)?;
        self.submit(ns, stream);
        Ok(ns)
    }

    /// Computes a kernel's results now; returns its modeled time. A fault
    /// poisons the device's contexts.
    pub(super) fn compute(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        params: &[u8],
    ) -> Result<u64, Status> {
        self.alive()?;
        let (k, _) = *self.functions.get(&func).ok_or(Status::InvalidHandle)?;
        k(self, grid, block, params).inspect_err(|s| {
            if s.is_sticky() {
                let _ = self.poisoned.compare_exchange(
                    0,
                    s.code(),
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        })
    }
}

impl Launches for SimContext {
    fn launch(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        _smem: u32,
        stream: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        self.run_kernel(func, grid, block, stream, params).map(drop)
    }

    #[allow(clippy::too_many_arguments)] // the `Context` method's arguments
    fn launch_ex(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: Handle,
        params: &[u8],
        _cluster: Dim3,
        _cooperative: bool,
    ) -> Result<(), Status> {
        // The model runs every block at once in any case.
        self.launch(func, grid, block, shared_mem, stream, params)
    }

    fn launch_timed(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        _smem: u32,
        stream: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        let ns = self.run_kernel(func, grid, block, stream, params)?;
        // The model knows the kernel's time exactly.
        self.timings.push((func, ns));
        Ok(())
    }

    fn can_slice(&mut self, func: Handle) -> bool {
        self.functions.contains_key(&func)
    }

    #[allow(clippy::too_many_arguments)] // the `Context` method's arguments
    fn launch_slice(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        _smem: u32,
        stream: Handle,
        params: &[u8],
        x_offset: u32,
        grid_x: u32,
    ) -> Result<(), Status> {
        // The model computes a kernel's results all at once: the first
        // sub-grid runs the whole grid's work; every sub-grid takes its
        // share of the kernel's time on the queue.
        self.alive()?;
        if grid_x == 0 || x_offset.saturating_add(grid.x) > grid_x {
            return Err(Status::InvalidValue);
        }
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        if x_offset == 0 {
            let ns = self.compute(func, Dim3 { x: grid_x, ..grid }, block, params)?;
            self.slice_ns.insert(func, ns);
        }
        let ns = self.slice_ns.get(&func).copied().unwrap_or(0);
        let part = crate::sat_u64(ns as f64 * f64::from(grid.x) / f64::from(grid_x));
        self.submit(part, stream);
        Ok(())
    }
}

impl Timing for SimContext {
    fn take_timings(&mut self) -> Vec<(Handle, u64)> {
        std::mem::take(&mut self.timings)
    }

    fn period_begin(&mut self) -> Result<(), Status> {
        self.period = None;
        let t = self.queue_mark(0);
        self.period = Some((t, None));
        self.period_others = 0;
        Ok(())
    }

    fn period_end(&mut self, streams: &[Handle]) -> Result<(), Status> {
        let mut end = None::<Instant>;
        for &s in streams {
            let t = self.stream_done(s)?;
            end = Some(end.map_or(t, |e| e.max(t)));
        }
        match self.period.as_mut() {
            Some((_, e)) => {
                *e = end;
                Ok(())
            }
            None => Err(Status::NotReady),
        }
    }

    /// The period's time on the device less the other contexts' work that
    /// ran between its operations (the in-order queue interleaves them):
    /// its own time, its own gaps included, as a GPU's events time a
    /// context that had the engine to itself.
    fn period_ns(&mut self) -> Option<u64> {
        let (a, b) = self.period.take()?;
        let b = b?;
        let others = std::mem::take(&mut self.period_others);
        (Instant::now() >= b)
            .then(|| crate::nanos(b.saturating_duration_since(a)).saturating_sub(others))
    }
}
