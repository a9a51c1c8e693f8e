//! The `Context` trait on the model: each call is the inherent method of
//! the same name, in the file of its family (`memory`, `module`, `launch`,
//! `stream`, `migrate`, `context`), or a `sim_`-named one (`graphs`,
//! `arrays`) or `vmm`'s: `SimContext::name` resolves to the inherent
//! method first, and rustc's `unconditional_recursion` lint would flag one
//! that went missing.

use protocol::stream_attr::StreamAttr;
use protocol::{Dim3, ImageKind, Param, Status};
use vm_memory::VolatileSlice;

use super::context::SimContext;
use crate::executor::{Context, Handle, Launch, Moved, SharedMem};

impl Context for SimContext {
    fn array_op(&mut self, op: crate::executor::ArrayOp) -> Result<u64, Status> {
        self.sim_array_op(op)
    }

    fn share_mem(&mut self, base: u64, size: u64) -> Result<SharedMem, Status> {
        SimContext::share_mem(self, base, size)
    }

    fn import_mem(&mut self, base: u64, size: u64, mem: &SharedMem) -> Result<(), Status> {
        SimContext::import_mem(self, base, size, mem)
    }

    fn close_mem(&mut self, base: u64) {
        SimContext::close_mem(self, base)
    }

    fn share_event(&mut self, event: Handle) -> Result<SharedMem, Status> {
        SimContext::share_event(self, event)
    }

    fn import_event(&mut self, shared: &SharedMem) -> Result<Handle, Status> {
        SimContext::import_event(self, shared)
    }

    fn recycle(&mut self) -> Result<(), Status> {
        SimContext::recycle(self)
    }

    fn alloc(&mut self, size: u64) -> Result<u64, Status> {
        SimContext::alloc(self, size)
    }

    fn free(&mut self, ptr: u64) -> Result<(), Status> {
        SimContext::free(self, ptr)
    }

    fn htod(&mut self, dst: u64, src: &VolatileSlice<'_>, stream: Handle) -> Result<(), Status> {
        SimContext::htod(self, dst, src, stream)
    }

    fn dtoh(&mut self, dst: &VolatileSlice<'_>, src: u64, stream: Handle) -> Result<(), Status> {
        SimContext::dtoh(self, dst, src, stream)
    }

    fn dtoh_async(
        &mut self,
        dst: &VolatileSlice<'_>,
        src: u64,
        stream: Handle,
    ) -> Result<(), Status> {
        SimContext::dtoh_async(self, dst, src, stream)
    }

    fn dtod(&mut self, dst: u64, src: u64, len: u64, stream: Handle) -> Result<(), Status> {
        SimContext::dtod(self, dst, src, len, stream)
    }

    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        width: u32,
        count: u64,
        stream: Handle,
    ) -> Result<(), Status> {
        SimContext::memset(self, dst, value, width, count, stream)
    }

    fn load_module(&mut self, kind: ImageKind, image: &[u8]) -> Result<Handle, Status> {
        SimContext::load_module(self, kind, image)
    }

    fn unload_module(&mut self, module: Handle) -> Result<(), Status> {
        SimContext::unload_module(self, module)
    }

    fn function(&mut self, module: Handle, name: &str) -> Result<(Handle, Vec<Param>), Status> {
        SimContext::function(self, module, name)
    }

    fn function_names(&mut self, module: Handle) -> Result<Vec<String>, Status> {
        SimContext::function_names(self, module)
    }

    fn func_attribute(&mut self, func: Handle, attr: u32) -> Result<i32, Status> {
        SimContext::func_attribute(self, func, attr)
    }

    fn occupancy(&mut self, func: Handle, block_size: u32, shared_mem: u32) -> Result<i32, Status> {
        SimContext::occupancy(self, func, block_size, shared_mem)
    }

    fn available_smem(
        &mut self,
        func: Handle,
        num_blocks: u32,
        block_size: u32,
    ) -> Result<u64, Status> {
        SimContext::available_smem(self, func, num_blocks, block_size)
    }

    fn tensor_map(
        &mut self,
        p: &protocol::tensor_map::TensorMapParams,
    ) -> Result<[u8; protocol::tensor_map::TENSOR_MAP_BYTES], Status> {
        SimContext::tensor_map(self, p)
    }

    fn occupancy_clusters(
        &mut self,
        shape: Launch,
        cluster: Dim3,
        potential: bool,
    ) -> Result<i32, Status> {
        SimContext::occupancy_clusters(self, shape, cluster, potential)
    }

    fn module_global(&mut self, module: Handle, name: &str) -> Result<(u64, u64), Status> {
        SimContext::module_global(self, module, name)
    }

    fn link(&mut self, inputs: &[(u32, &[u8])]) -> Result<Vec<u8>, Status> {
        SimContext::link(self, inputs)
    }

    fn launch(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        smem: u32,
        stream: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        SimContext::launch(self, func, grid, block, smem, stream, params)
    }

    fn launch_timed(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        smem: u32,
        stream: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        SimContext::launch_timed(self, func, grid, block, smem, stream, params)
    }

    fn can_slice(&mut self, func: Handle) -> bool {
        SimContext::can_slice(self, func)
    }

    fn launch_slice(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        smem: u32,
        stream: Handle,
        params: &[u8],
        x_offset: u32,
        grid_x: u32,
    ) -> Result<(), Status> {
        SimContext::launch_slice(
            self, func, grid, block, smem, stream, params, x_offset, grid_x,
        )
    }

    fn take_timings(&mut self) -> Vec<(Handle, u64)> {
        SimContext::take_timings(self)
    }

    fn period_begin(&mut self) -> Result<(), Status> {
        SimContext::period_begin(self)
    }

    fn period_end(&mut self, streams: &[Handle]) -> Result<(), Status> {
        SimContext::period_end(self, streams)
    }

    fn period_ns(&mut self) -> Option<u64> {
        SimContext::period_ns(self)
    }

    fn stream_create(&mut self, flags: u32, priority: i32) -> Result<Handle, Status> {
        SimContext::stream_create(self, flags, priority)
    }

    fn stream_set_attribute(&mut self, stream: Handle, attr: StreamAttr) -> Result<(), Status> {
        SimContext::stream_set_attribute(self, stream, attr)
    }

    fn stream_attribute(&mut self, stream: Handle, id: u32) -> Result<StreamAttr, Status> {
        SimContext::stream_attribute(self, stream, id)
    }

    fn stream_wait_event(
        &mut self,
        stream: Handle,
        event: Handle,
        flags: u32,
    ) -> Result<(), Status> {
        SimContext::stream_wait_event(self, stream, event, flags)
    }

    fn func_set_attribute(&mut self, func: Handle, attr: u32, value: i32) -> Result<(), Status> {
        SimContext::func_set_attribute(self, func, attr, value)
    }

    fn limit(&mut self, limit: u32) -> Result<u64, Status> {
        SimContext::limit(self, limit)
    }

    fn set_limit(&mut self, limit: u32, value: u64) -> Result<(), Status> {
        SimContext::set_limit(self, limit, value)
    }

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
    ) -> Result<(), Status> {
        SimContext::launch_ex(
            self,
            func,
            grid,
            block,
            shared_mem,
            stream,
            params,
            cluster,
            cooperative,
        )
    }

    fn stream_destroy(&mut self, stream: Handle) -> Result<(), Status> {
        SimContext::stream_destroy(self, stream)
    }

    fn stream_synchronize(&mut self, stream: Handle) -> Result<(), Status> {
        SimContext::stream_synchronize(self, stream)
    }

    fn stream_query(&mut self, stream: Handle) -> Result<bool, Status> {
        SimContext::stream_query(self, stream)
    }

    fn event_create(&mut self, flags: u32) -> Result<Handle, Status> {
        SimContext::event_create(self, flags)
    }

    fn event_destroy(&mut self, event: Handle) -> Result<(), Status> {
        SimContext::event_destroy(self, event)
    }

    fn event_record(&mut self, event: Handle, stream: Handle) -> Result<(), Status> {
        SimContext::event_record(self, event, stream)
    }

    fn event_synchronize(&mut self, event: Handle) -> Result<(), Status> {
        SimContext::event_synchronize(self, event)
    }

    fn event_query(&mut self, event: Handle) -> Result<bool, Status> {
        SimContext::event_query(self, event)
    }

    fn event_elapsed(&mut self, start: Handle, end: Handle) -> Result<f32, Status> {
        SimContext::event_elapsed(self, start, end)
    }

    fn synchronize(&mut self) -> Result<(), Status> {
        SimContext::synchronize(self)
    }

    /// The nodes are kept; a launch runs them (`graphs.rs`).
    fn graph_instantiate(
        &mut self,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        self.sim_graph_instantiate(None, nodes)
    }

    fn graph_launch(&mut self, exec: Handle, stream: Handle) -> Result<(), Status> {
        self.sim_graph_launch(exec, stream)
    }

    fn graph_destroy(&mut self, exec: Handle) -> Result<(), Status> {
        self.sim_graph_destroy(exec)
    }

    fn cond_scope_create(&mut self) -> Result<Handle, Status> {
        self.sim_scope_create()
    }

    fn cond_handle_create(
        &mut self,
        scope: Handle,
        default_value: u32,
        flags: u32,
    ) -> Result<u64, Status> {
        self.sim_handle_create(scope, default_value, flags)
    }

    fn cond_scope_destroy(&mut self, scope: Handle) -> Result<(), Status> {
        self.sim_scope_destroy(scope)
    }

    fn graph_instantiate_in(
        &mut self,
        scope: Handle,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        self.sim_graph_instantiate(Some(scope), nodes)
    }

    fn mark(&mut self, stream: Option<Handle>) -> Result<crate::executor::Marker, Status> {
        SimContext::mark(self, stream)
    }

    fn reached(&mut self, m: crate::executor::Marker) -> Result<bool, Status> {
        SimContext::reached(self, m)
    }

    fn forget(&mut self, m: crate::executor::Marker) {
        SimContext::forget(self, m)
    }

    fn vmm_reserve(&mut self, size: u64, align: u64, addr: u64) -> Result<u64, Status> {
        SimContext::vmm_reserve(self, size, align, addr)
    }

    fn vmm_address_free(&mut self, _ptr: u64, _size: u64) -> Result<(), Status> {
        // Addresses are never handed out again in the model.
        Ok(())
    }

    fn vmm_create(&mut self, size: u64, compression: u8) -> Result<Handle, Status> {
        SimContext::vmm_create(self, size, compression)
    }

    fn vmm_compression(&self, handle: Handle) -> Result<u8, Status> {
        SimContext::vmm_compression(self, handle)
    }

    fn vmm_release(&mut self, handle: Handle) -> Result<(), Status> {
        SimContext::vmm_release(self, handle)
    }

    fn vmm_map(&mut self, ptr: u64, size: u64, offset: u64, handle: Handle) -> Result<(), Status> {
        SimContext::vmm_map(self, ptr, size, offset, handle)
    }

    fn vmm_unmap(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        SimContext::vmm_unmap(self, ptr, size)
    }

    fn share_phys(&mut self, handle: Handle) -> Result<crate::executor::SharedMem, Status> {
        SimContext::share_phys(self, handle)
    }

    fn import_phys(
        &mut self,
        mem: &crate::executor::SharedMem,
        size: u64,
    ) -> Result<Handle, Status> {
        SimContext::import_phys(self, mem, size)
    }

    fn migration_keeper(&self) -> Option<crate::executor::Keeper> {
        self.arrays_keeper()
    }

    fn migration_keeper_to(&self, target: u32) -> Option<crate::executor::Keeper> {
        self.arrays_keeper()
            .or_else(|| self.compression_keeper(target))
    }

    fn migrate(
        &mut self,
        device: u32,
        prepared: Option<crate::executor::Prepared>,
    ) -> Result<Moved, Status> {
        SimContext::migrate(self, device, prepared)
    }
}
