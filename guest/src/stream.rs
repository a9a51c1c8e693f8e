//! Launches, streams, events, host functions, and the context-wide calls
//! (synchronize, limits).

use protocol::{Dim3, Request, Status};

use crate::numbering::Waited;
use crate::{Function, Gpu, GuestError, Result};

impl Gpu {
    /// cuLaunchKernel: marshals `params` (one byte slice per parameter) by the
    /// kernel's real parameter sizes and enqueues the launch.
    pub fn launch(
        &mut self,
        f: &Function,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: u64,
        params: &[&[u8]],
    ) -> Result<()> {
        if params.len() != f.param_sizes.len() {
            return Err(GuestError::Cuda(Status::InvalidValue));
        }
        let mut packed = Vec::with_capacity(64);
        for (p, &size) in params.iter().zip(&f.param_sizes) {
            if p.len() != size as usize {
                return Err(GuestError::Cuda(Status::InvalidValue));
            }
            packed.extend_from_slice(p);
        }
        self.send(
            &Request::Launch {
                func: f.handle,
                grid,
                block,
                shared_mem,
                stream,
                cluster: Dim3::default(),
                flags: 0,
            },
            &packed,
        )
        .map(drop)
    }

    /// Launch with raw packed parameters, unchecked here (the host checks).
    pub fn launch_raw(
        &mut self,
        func: u64,
        grid: Dim3,
        block: Dim3,
        stream: u64,
        packed: &[u8],
    ) -> Result<()> {
        self.launch_packed(func, grid, block, 0, stream, packed)
    }

    /// Launch with raw packed parameters and `shared_mem` bytes of dynamic
    /// shared memory, unchecked here (the host checks).
    pub fn launch_packed(
        &mut self,
        func: u64,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: u64,
        packed: &[u8],
    ) -> Result<()> {
        let none = Dim3::default();
        self.launch_ex(func, grid, block, shared_mem, stream, none, 0, packed)
    }

    /// A launch with thread block clusters (`cluster` all zero: none)
    /// and `protocol::launch_flags`, with raw packed parameters.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_ex(
        &mut self,
        func: u64,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: u64,
        cluster: Dim3,
        flags: u32,
        packed: &[u8],
    ) -> Result<()> {
        self.send(
            &Request::Launch {
                func,
                grid,
                block,
                shared_mem,
                stream,
                cluster,
                flags,
            },
            packed,
        )
        .map(drop)
    }

    /// cuStreamWaitEvent (asynchronous).
    pub fn stream_wait_event(&mut self, stream: u64, event: u64, flags: u32) -> Result<()> {
        self.send(
            &Request::StreamWaitEvent {
                stream,
                event,
                flags,
            },
            &[],
        )
        .map(drop)
    }

    /// Queues guest host function `id` in `stream` (see
    /// `protocol::Request::HostFn`).
    pub fn host_fn(&mut self, stream: u64, id: u64) -> Result<()> {
        self.send(&Request::HostFn { stream, id }, &[]).map(drop)
    }

    /// Waits (about a second at most) for a host function whose stream is
    /// there: its id (0: none yet) and the error code of the work before it.
    pub fn wait_host_fn(&mut self) -> Result<(u64, u32)> {
        let r = self.call(&Request::WaitHostFn)?;
        Ok((r.vals[0], r.vals[1] as u32))
    }

    /// Host function `id` has run.
    pub fn host_fn_done(&mut self, id: u64) -> Result<()> {
        self.send(&Request::HostFnDone { id }, &[]).map(drop)
    }

    /// cuCtxGetLimit.
    pub fn limit(&mut self, limit: u32) -> Result<u64> {
        Ok(self.call(&Request::CtxGetLimit { limit })?.vals[0])
    }

    /// cuCtxSetLimit.
    pub fn set_limit(&mut self, limit: u32, value: u64) -> Result<()> {
        self.call(&Request::CtxSetLimit { limit, value }).map(drop)
    }

    /// cuCtxSynchronize.
    pub fn synchronize(&mut self) -> Result<()> {
        self.wait_for(&Request::CtxSynchronize, Waited::Context)
    }

    /// cuStreamCreateWithPriority.
    pub fn stream_create(&mut self, flags: u32, priority: i32) -> Result<u64> {
        Ok(self.call(&Request::StreamCreate { flags, priority })?.vals[0])
    }

    /// cuStreamSetAttribute: the host's stream takes it.
    pub fn stream_set_attribute(
        &mut self,
        stream: u64,
        attr: protocol::stream_attr::StreamAttr,
    ) -> Result<()> {
        self.call(&Request::StreamSetAttribute { stream, attr })
            .map(drop)
    }

    /// cuStreamGetAttribute: attribute `id` as the host's stream has it.
    pub fn stream_attribute(
        &mut self,
        stream: u64,
        id: u32,
    ) -> Result<protocol::stream_attr::StreamAttr> {
        use protocol::stream_attr::{StreamAttr, RAW_LEN};
        let r = self.call(&Request::StreamGetAttribute { stream, attr: id })?;
        let mut raw = [0u8; RAW_LEN];
        for (b, v) in raw.chunks_exact_mut(8).zip(r.vals) {
            b.copy_from_slice(&v.to_le_bytes());
        }
        StreamAttr::from_raw(id, &raw).map_err(|_| GuestError::Cuda(Status::Unknown))
    }

    /// cuStreamDestroy.
    pub fn stream_destroy(&mut self, stream: u64) -> Result<()> {
        self.call(&Request::StreamDestroy { stream }).map(drop)
    }

    /// cuStreamSynchronize.
    pub fn stream_synchronize(&mut self, stream: u64) -> Result<()> {
        self.wait_for(
            &Request::StreamSynchronize { stream },
            Waited::Stream(stream),
        )
    }

    /// cuStreamQuery: Ok(true) when idle.
    pub fn stream_query(&mut self, stream: u64) -> Result<bool> {
        if self.seq.idle(Waited::Stream(stream)) {
            return Ok(true);
        }
        self.query(&Request::StreamQuery { stream })
    }

    /// A synchronize (`req`) of what `what` names: answered here when the
    /// numbering proves it idle (see `numbering.rs`), else by the host,
    /// whose answer without error is a proof for the next.
    fn wait_for(&mut self, req: &Request, what: Waited) -> Result<()> {
        if self.seq.idle(what) {
            return Ok(());
        }
        let tag = self.send(req, &[])?;
        let d = self.recv(tag)?;
        Self::status(&d)?;
        self.seq.waited(tag, what);
        Ok(())
    }

    /// cuEventCreate.
    pub fn event_create(&mut self, flags: u32) -> Result<u64> {
        Ok(self.call(&Request::EventCreate { flags })?.vals[0])
    }

    /// cuEventDestroy.
    pub fn event_destroy(&mut self, event: u64) -> Result<()> {
        self.call(&Request::EventDestroy { event }).map(drop)
    }

    /// Builds and instantiates a graph on the host (its nodes encoded by
    /// [`protocol::graph::encode_graph`]); returns the executable's handle.
    pub fn graph_instantiate(&mut self, graph: &[u8]) -> Result<u64> {
        let len = u32::try_from(graph.len()).map_err(|_| GuestError::Cuda(Status::InvalidValue))?;
        let (r, _) = self.call_data(&Request::GraphInstantiate { len }, graph)?;
        Ok(r.vals[0])
    }

    /// Launches a host-built executable graph into `stream` (asynchronous).
    pub fn graph_launch(&mut self, exec: u64, stream: u64) -> Result<()> {
        self.send(&Request::GraphLaunch { exec, stream }, &[])
            .map(drop)
    }

    /// Destroys a host-built executable graph.
    pub fn graph_destroy(&mut self, exec: u64) -> Result<()> {
        self.call(&Request::GraphDestroy { exec }).map(drop)
    }

    /// Makes a conditional scope on the host (the twin of a graph that
    /// holds conditional handles); returns its handle.
    pub fn cond_scope_create(&mut self) -> Result<u64> {
        Ok(self.call(&Request::CondScopeCreate)?.vals[0])
    }

    /// Makes a conditional handle in `scope`; returns its value.
    pub fn cond_handle_create(
        &mut self,
        scope: u64,
        default_value: u32,
        flags: u32,
    ) -> Result<u64> {
        let r = self.call(&Request::CondHandleCreate {
            scope,
            default_value,
            flags,
        })?;
        Ok(r.vals[0])
    }

    /// Destroys a conditional scope.
    pub fn cond_scope_destroy(&mut self, scope: u64) -> Result<()> {
        self.call(&Request::CondScopeDestroy { scope }).map(drop)
    }

    /// Builds and instantiates a graph (with conditional nodes naming
    /// `scope`'s handles) on the host; returns the executable's handle,
    /// launched and destroyed as [`Gpu::graph_instantiate`]'s.
    pub fn graph_instantiate_in(&mut self, scope: u64, graph: &[u8]) -> Result<u64> {
        let len = u32::try_from(graph.len()).map_err(|_| GuestError::Cuda(Status::InvalidValue))?;
        let (r, _) = self.call_data(&Request::GraphInstantiateIn { scope, len }, graph)?;
        Ok(r.vals[0])
    }

    /// cuEventRecord (asynchronous).
    pub fn event_record(&mut self, event: u64, stream: u64) -> Result<()> {
        self.send(&Request::EventRecord { event, stream }, &[])
            .map(drop)
    }

    /// cuEventSynchronize.
    pub fn event_synchronize(&mut self, event: u64) -> Result<()> {
        self.call(&Request::EventSynchronize { event }).map(drop)
    }

    /// cuEventQuery: Ok(true) when complete.
    pub fn event_query(&mut self, event: u64) -> Result<bool> {
        self.query(&Request::EventQuery { event })
    }

    /// cuEventElapsedTime, in milliseconds.
    pub fn event_elapsed_ms(&mut self, start: u64, end: u64) -> Result<f32> {
        let r = self.call(&Request::EventElapsedTime { start, end })?;
        Ok(f32::from_bits(r.vals[0] as u32))
    }
}
