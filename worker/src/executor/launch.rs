//! The `Launches` family of [`super::Context`]: kernel launches: single, queued runs, timed,
//! extended (clusters, cooperative) and sliced sub-grids.

use protocol::{Dim3, Status};

use super::Handle;

/// What a kernel launch runs, and on how many threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// The kernel.
    pub func: Handle,
    /// Grid size in blocks.
    pub grid: Dim3,
    /// Block size in threads.
    pub block: Dim3,
    /// Dynamic shared memory, bytes.
    pub shared_mem: u32,
}

/// One launch of a run the worker queued on one stream: its parameters are
/// `params` of the run's shared parameter buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// What it runs.
    pub launch: Launch,
    /// Its packed parameters: a range of the run's buffer.
    pub params: std::ops::Range<usize>,
}

/// Launches `launches` one by one with [`Launches::launch`]; a failure does
/// not stop the others, the first is returned.
pub fn launch_each<C: Launches + ?Sized>(
    ctx: &mut C,
    stream: Handle,
    launches: &[Queued],
    params: &[u8],
) -> Result<(), Status> {
    launches
        .iter()
        .map(|q| {
            let (l, p) = (q.launch, params.get(q.params.clone()));
            p.ok_or(Status::InvalidValue)
                .and_then(|p| ctx.launch(l.func, l.grid, l.block, l.shared_mem, stream, p))
        })
        // Every launch runs; the first error stays.
        .fold(Ok(()), Result::and)
}

/// Kernel launches: single, queued runs, timed, extended (clusters, cooperative) and sliced sub-
/// grids.
pub trait Launches {
    /// Enqueues a launch; `params` is packed by the parameter sizes.
    fn launch(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: Handle,
        params: &[u8],
    ) -> Result<(), Status>;
    /// A launch with thread block clusters (`cluster` all zero: none) or
    /// cooperative (every block resident at once).
    #[allow(clippy::too_many_arguments)]
    fn launch_ex(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: Handle,
        params: &[u8],
        cluster: Dim3,
        cooperative: bool,
    ) -> Result<(), Status>;
    /// Enqueues `launches` on `stream` in order, as if each were launched on
    /// its own (a device may submit them together). A failed launch does not
    /// stop the others; the first failure is returned.
    fn launch_many(
        &mut self,
        stream: Handle,
        launches: &[Queued],
        params: &[u8],
    ) -> Result<(), Status> {
        launch_each(self, stream, launches, params)
    }
    /// A launch whose GPU time the device measures (events around it); the
    /// time is read later with `Timing::take_timings`.
    fn launch_timed(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        self.launch(func, grid, block, shared_mem, stream, params)
    }
    /// Whether `func` can run as sub-grids (kernel slicing).
    fn can_slice(&mut self, _func: Handle) -> bool {
        false
    }
    /// Runs x blocks [x_offset, x_offset + grid.x) of a launch `grid_x`
    /// blocks wide, as that part of the whole launch would run them.
    #[allow(clippy::too_many_arguments)]
    fn launch_slice(
        &mut self,
        _func: Handle,
        _grid: Dim3,
        _block: Dim3,
        _shared_mem: u32,
        _stream: Handle,
        _params: &[u8],
        _x_offset: u32,
        _grid_x: u32,
    ) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
}
