//! The `Context` trait on a GPU: each call is the inherent method of the
//! same name, in the file of its family (`memory`, `module`, `launch`,
//! `timing`, `stream`, `stream_attrs`, `vmm`, `graph`, `conditional`,
//! `migrate`, `context`): `CudaContext::name` resolves to the inherent
//! method first, and rustc's `unconditional_recursion` lint would flag one
//! that went missing.

use protocol::stream_attr::StreamAttr;
use protocol::{Dim3, ImageKind, Param, Status};
use vm_memory::VolatileSlice;

use super::context::CudaContext;
use crate::executor::{Context, Handle, Moved, Queued};

impl Context for CudaContext {
    fn recycle(&mut self) -> Result<(), Status> {
        CudaContext::recycle(self)
    }

    fn array_op(&mut self, op: crate::executor::ArrayOp) -> Result<u64, Status> {
        self.cuda_array_op(op)
    }

    fn alloc(&mut self, size: u64) -> Result<u64, Status> {
        CudaContext::alloc(self, size)
    }

    fn footprint(&self, size: u64) -> u64 {
        CudaContext::footprint(self, size)
    }

    fn free(&mut self, ptr: u64) -> Result<(), Status> {
        CudaContext::free(self, ptr)
    }

    fn htod(&mut self, dst: u64, src: &VolatileSlice<'_>, s: Handle) -> Result<(), Status> {
        let dst = self.globals.addr(dst);
        CudaContext::htod(self, dst, src, s)
    }

    fn dtoh(&mut self, dst: &VolatileSlice<'_>, src: u64, s: Handle) -> Result<(), Status> {
        let src = self.globals.addr(src);
        CudaContext::dtoh(self, dst, src, s)
    }

    fn dtoh_async(&mut self, dst: &VolatileSlice<'_>, src: u64, s: Handle) -> Result<(), Status> {
        let src = self.globals.addr(src);
        CudaContext::dtoh_async(self, dst, src, s)
    }

    fn dtod(&mut self, dst: u64, src: u64, len: u64, s: Handle) -> Result<(), Status> {
        let (dst, src) = (self.globals.addr(dst), self.globals.addr(src));
        CudaContext::dtod(self, dst, src, len, s)
    }

    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        width: u32,
        count: u64,
        s: Handle,
    ) -> Result<(), Status> {
        let dst = self.globals.addr(dst);
        CudaContext::memset(self, dst, value, width, count, s)
    }

    fn load_module(&mut self, kind: ImageKind, image: &[u8]) -> Result<Handle, Status> {
        CudaContext::load_module(self, kind, image)
    }

    fn unload_module(&mut self, module: Handle) -> Result<(), Status> {
        CudaContext::unload_module(self, module)
    }

    fn function(&mut self, module: Handle, name: &str) -> Result<(Handle, Vec<Param>), Status> {
        CudaContext::function(self, module, name)
    }

    fn function_names(&mut self, module: Handle) -> Result<Vec<String>, Status> {
        CudaContext::function_names(self, module)
    }

    fn graph_instantiate(
        &mut self,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        CudaContext::graph_instantiate(self, nodes)
    }

    fn graph_launch(&mut self, exec: Handle, stream: Handle) -> Result<(), Status> {
        CudaContext::graph_launch(self, exec, stream)
    }

    fn graph_destroy(&mut self, exec: Handle) -> Result<(), Status> {
        CudaContext::graph_destroy(self, exec)
    }

    fn cond_scope_create(&mut self) -> Result<Handle, Status> {
        CudaContext::cond_scope_create(self)
    }

    fn cond_handle_create(
        &mut self,
        scope: Handle,
        default_value: u32,
        flags: u32,
    ) -> Result<u64, Status> {
        CudaContext::cond_handle_create(self, scope, default_value, flags)
    }

    fn cond_scope_destroy(&mut self, scope: Handle) -> Result<(), Status> {
        CudaContext::cond_scope_destroy(self, scope)
    }

    fn graph_instantiate_in(
        &mut self,
        scope: Handle,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        CudaContext::graph_instantiate_in(self, scope, nodes)
    }

    fn func_attribute(&mut self, func: Handle, attr: u32) -> Result<i32, Status> {
        CudaContext::func_attribute(self, func, attr)
    }

    fn occupancy(&mut self, func: Handle, block_size: u32, shared_mem: u32) -> Result<i32, Status> {
        CudaContext::occupancy(self, func, block_size, shared_mem)
    }

    fn available_smem(
        &mut self,
        func: Handle,
        num_blocks: u32,
        block_size: u32,
    ) -> Result<u64, Status> {
        CudaContext::available_smem(self, func, num_blocks, block_size)
    }

    fn tensor_map(
        &mut self,
        p: &protocol::tensor_map::TensorMapParams,
    ) -> Result<[u8; protocol::tensor_map::TENSOR_MAP_BYTES], Status> {
        CudaContext::tensor_map(self, p)
    }

    fn occupancy_clusters(
        &mut self,
        shape: crate::executor::Launch,
        cluster: Dim3,
        potential: bool,
    ) -> Result<i32, Status> {
        CudaContext::occupancy_clusters(self, shape, cluster, potential)
    }

    fn module_global(&mut self, module: Handle, name: &str) -> Result<(u64, u64), Status> {
        CudaContext::module_global(self, module, name)
    }

    fn link(&mut self, inputs: &[(u32, &[u8])]) -> Result<Vec<u8>, Status> {
        CudaContext::link(self, inputs)
    }

    fn launch(
        &mut self,
        func: Handle,
        g: Dim3,
        b: Dim3,
        smem: u32,
        s: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        let params = self.moved_params(func, params);
        CudaContext::launch(self, func, g, b, smem, s, &params)
    }

    fn launch_many(&mut self, s: Handle, launches: &[Queued], params: &[u8]) -> Result<(), Status> {
        let params = self.moved_run(launches, params);
        CudaContext::launch_many(self, s, launches, &params)
    }

    fn launch_timed(
        &mut self,
        func: Handle,
        g: Dim3,
        b: Dim3,
        smem: u32,
        s: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        let params = self.moved_params(func, params);
        CudaContext::launch_timed(self, func, g, b, smem, s, &params)
    }

    fn take_timings(&mut self) -> Vec<(Handle, u64)> {
        CudaContext::take_timings(self)
    }

    fn period_begin(&mut self) -> Result<(), Status> {
        CudaContext::period_begin(self)
    }

    fn period_end(&mut self, streams: &[Handle]) -> Result<(), Status> {
        CudaContext::period_end(self, streams)
    }

    fn period_ns(&mut self) -> Option<u64> {
        CudaContext::period_ns(self)
    }

    fn stream_create(&mut self, flags: u32, priority: i32) -> Result<Handle, Status> {
        CudaContext::stream_create(self, flags, priority)
    }

    fn stream_wait_event(&mut self, s: Handle, e: Handle, flags: u32) -> Result<(), Status> {
        CudaContext::stream_wait_event(self, s, e, flags)
    }

    fn func_set_attribute(&mut self, func: Handle, attr: u32, value: i32) -> Result<(), Status> {
        CudaContext::func_set_attribute(self, func, attr, value)
    }

    fn limit(&mut self, limit: u32) -> Result<u64, Status> {
        CudaContext::limit(self, limit)
    }

    fn set_limit(&mut self, limit: u32, value: u64) -> Result<(), Status> {
        CudaContext::set_limit(self, limit, value)
    }

    fn launch_ex(
        &mut self,
        func: Handle,
        g: Dim3,
        b: Dim3,
        smem: u32,
        s: Handle,
        params: &[u8],
        cluster: Dim3,
        cooperative: bool,
    ) -> Result<(), Status> {
        let params = self.moved_params(func, params);
        CudaContext::launch_ex(self, func, g, b, smem, s, &params, cluster, cooperative)
    }

    fn stream_destroy(&mut self, s: Handle) -> Result<(), Status> {
        CudaContext::stream_destroy(self, s)
    }

    fn stream_set_attribute(&mut self, s: Handle, attr: StreamAttr) -> Result<(), Status> {
        CudaContext::stream_set_attribute(self, s, attr)
    }

    fn stream_attribute(&mut self, s: Handle, attr: u32) -> Result<StreamAttr, Status> {
        CudaContext::stream_attribute(self, s, attr)
    }

    fn stream_synchronize(&mut self, s: Handle) -> Result<(), Status> {
        CudaContext::stream_synchronize(self, s)
    }

    fn stream_query(&mut self, s: Handle) -> Result<bool, Status> {
        CudaContext::stream_query(self, s)
    }

    fn event_create(&mut self, flags: u32) -> Result<Handle, Status> {
        CudaContext::event_create(self, flags)
    }

    fn event_destroy(&mut self, e: Handle) -> Result<(), Status> {
        CudaContext::event_destroy(self, e)
    }

    fn share_event(&mut self, e: Handle) -> Result<crate::executor::SharedMem, Status> {
        CudaContext::share_event(self, e)
    }

    fn import_event(&mut self, shared: &crate::executor::SharedMem) -> Result<Handle, Status> {
        CudaContext::import_event(self, shared)
    }

    fn event_record(&mut self, e: Handle, s: Handle) -> Result<(), Status> {
        CudaContext::event_record(self, e, s)
    }

    fn event_synchronize(&mut self, e: Handle) -> Result<(), Status> {
        CudaContext::event_synchronize(self, e)
    }

    fn event_query(&mut self, e: Handle) -> Result<bool, Status> {
        CudaContext::event_query(self, e)
    }

    fn event_elapsed(&mut self, start: Handle, end: Handle) -> Result<f32, Status> {
        CudaContext::event_elapsed(self, start, end)
    }

    fn synchronize(&mut self) -> Result<(), Status> {
        CudaContext::synchronize(self)
    }

    fn mark(&mut self, stream: Option<Handle>) -> Result<crate::executor::Marker, Status> {
        CudaContext::mark(self, stream)
    }

    fn reached(&mut self, m: crate::executor::Marker) -> Result<bool, Status> {
        CudaContext::reached(self, m)
    }

    fn forget(&mut self, m: crate::executor::Marker) {
        CudaContext::forget(self, m)
    }

    fn can_slice(&mut self, func: Handle) -> bool {
        CudaContext::can_slice(self, func)
    }

    fn launch_slice(
        &mut self,
        func: Handle,
        g: Dim3,
        b: Dim3,
        smem: u32,
        s: Handle,
        params: &[u8],
        x_offset: u32,
        grid_x: u32,
    ) -> Result<(), Status> {
        let params = self.moved_params(func, params);
        CudaContext::launch_slice(self, func, g, b, smem, s, &params, x_offset, grid_x)
    }

    fn vmm_reserve(&mut self, size: u64, align: u64, addr: u64) -> Result<u64, Status> {
        CudaContext::vmm_reserve(self, size, align, addr)
    }

    fn vmm_address_free(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        CudaContext::vmm_address_free(self, ptr, size)
    }

    fn vmm_create(&mut self, size: u64, compression: u8) -> Result<Handle, Status> {
        CudaContext::vmm_create(self, size, compression)
    }

    fn vmm_compression(&self, handle: Handle) -> Result<u8, Status> {
        CudaContext::vmm_compression(self, handle)
    }

    fn vmm_release(&mut self, handle: Handle) -> Result<(), Status> {
        CudaContext::vmm_release(self, handle)
    }

    fn vmm_map(&mut self, ptr: u64, size: u64, offset: u64, handle: Handle) -> Result<(), Status> {
        CudaContext::vmm_map(self, ptr, size, offset, handle)
    }

    fn vmm_unmap(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        CudaContext::vmm_unmap(self, ptr, size)
    }

    fn share_phys(&mut self, handle: Handle) -> Result<crate::executor::SharedMem, Status> {
        CudaContext::share_phys(self, handle)
    }

    fn import_phys(
        &mut self,
        mem: &crate::executor::SharedMem,
        size: u64,
    ) -> Result<Handle, Status> {
        CudaContext::import_phys(self, mem, size)
    }

    fn prepare_migration(&self, target: u32) -> Option<crate::executor::PrepareJob> {
        CudaContext::prepare_migration(self, target)
    }

    fn migration_keeper(&self) -> Option<crate::executor::Keeper> {
        CudaContext::migration_keeper(self)
    }

    fn migration_keeper_to(&self, target: u32) -> Option<crate::executor::Keeper> {
        CudaContext::migration_keeper_to(self, target)
    }

    fn migrate(
        &mut self,
        target: u32,
        prepared: Option<crate::executor::Prepared>,
    ) -> Result<Moved, Status> {
        CudaContext::migrate(self, target, prepared)
    }
}
