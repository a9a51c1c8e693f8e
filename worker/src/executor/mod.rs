//! Executors run validated calls on a device. The worker has already checked
//! every handle and every device-pointer range against the caller's own
//! tables, so an executor only does the work.

use std::sync::Arc;

use protocol::stream_attr::StreamAttr;
use protocol::{DeviceInfo, Dim3, ImageKind, Param, Status};
use vm_memory::VolatileSlice;

pub mod cuda;

pub use wire::Keeper;
pub mod sim;

/// Handle of a stream, event, module or function inside an executor.
pub type Handle = u64;

/// Hashes handles with one multiply instead of SipHash: they are looked up
/// on every launch, and the keys stored are numbers this process assigned
/// (a guest can look up any number, but cannot choose what is inserted).
#[derive(Debug, Default, Clone, Copy)]
pub struct HandleHasher(u64);

impl std::hash::Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// A map keyed by handles.
pub type HandleMap<V> =
    std::collections::HashMap<Handle, V, std::hash::BuildHasherDefault<HandleHasher>>;
/// A set of handles.
pub type HandleSet = std::collections::HashSet<Handle, std::hash::BuildHasherDefault<HandleHasher>>;

/// One device, shared by all contexts of a worker.
pub trait Executor: Send {
    /// The device as guests see it (before the vGPU's memory limit is applied).
    fn info(&self) -> DeviceInfo;
    /// A fresh context (one per guest process).
    fn open(&mut self) -> Result<Box<dyn Context>, Status>;
    /// Where the executor can make contexts on another thread: what makes
    /// one there, as [`Executor::open`] would (a worker then makes the
    /// contexts it makes ahead while it already serves; see
    /// `serve/contexts.rs`). None: only `open`, on the worker's thread.
    fn opener(&self) -> Option<Opener> {
        None
    }
    /// Makes `ranges` of the shared region (the response arenas, alive as
    /// long as the executor) direct DMA targets of device-to-host copies,
    /// where the device can.
    fn register_host_memory(&mut self, _ranges: &[VolatileSlice<'_>]) -> Result<(), Status> {
        Ok(())
    }
    /// Makes the region's pinned pool (alive as long as the executor)
    /// page-locked and reachable by the device; returns the device address
    /// of its first byte.
    fn register_pinned(&mut self, pool: &VolatileSlice<'_>) -> Result<u64, Status> {
        Ok(pool.ptr_guard().as_ptr() as u64)
    }
    /// GPUs this executor can run on (migration targets).
    fn devices(&self) -> u32 {
        1
    }
    /// The GPU new contexts open on.
    fn device(&self) -> u32 {
        0
    }
    /// Opens new contexts on `device` from now on (after a migration).
    fn set_device(&mut self, device: u32) -> Result<(), Status> {
        if device == self.device() {
            Ok(())
        } else {
            Err(Status::NotSupported)
        }
    }
}

/// Makes one context, on whatever thread calls it ([`Executor::opener`]).
pub type Opener = Box<dyn FnMut() -> Result<Box<dyn Context>, Status> + Send>;

/// What a context's migration prepared ahead (on another thread).
pub type Prepared = Box<dyn std::any::Any + Send>;

/// Preparation of a migration, run on a helper thread while the guest goes on.
pub type PrepareJob = Box<dyn FnOnce() -> Result<Prepared, Status> + Send>;

/// What one context's migration did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// Device bytes copied to the target.
    pub bytes: u64,
    /// Allocations remapped at their old addresses.
    pub allocations: u64,
}

/// A point in a context's work (see [`Context::mark`]).
pub type Marker = u64;

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

/// Launches `launches` one by one with [`Context::launch`]; a failure does
/// not stop the others, the first is returned.
pub fn launch_each<C: Context + ?Sized>(
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

/// What one context hands another of the same worker so that it reaches
/// memory of the first (IPC between processes of one VM, see
/// `session/ipc.rs`): nothing on a GPU, where every context of a process
/// reaches every device address; the bytes themselves in the sim model.
#[derive(Clone, Default)]
pub struct SharedMem(pub Option<Arc<dyn std::any::Any + Send + Sync>>);

impl std::fmt::Debug for SharedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "SharedMem(bytes)"
        } else {
            "SharedMem"
        })
    }
}

/// A call of the CUDA array family (see [`Context::array_op`]), every
/// handle and range in it checked by the worker against the session
/// (`session/arrays.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayOp {
    /// Makes an array; the answer is its handle.
    Create(protocol::array::ArrayDesc),
    /// Destroys an array.
    Destroy(Handle),
    /// A box copy with an array at one end or both, in a stream's order.
    Copy(protocol::array::ArrayCopy, Handle),
    /// Makes a texture object; the answer is the device's object value.
    TexCreate(protocol::array::TexParams),
    /// Destroys a texture object.
    TexDestroy(u64),
    /// Makes a surface object over an array; the answer is its value.
    SurfCreate(Handle),
    /// Destroys a surface object.
    SurfDestroy(u64),
}

/// The per-guest-process context. Dropping it frees everything it holds.
pub trait Context: Send {
    /// Runs a call of the CUDA array family: arrays, copies to and from
    /// them, texture and surface objects (the answer: a handle or object
    /// value, 0 for the others). A context holding arrays or objects stays
    /// on its GPU.
    fn array_op(&mut self, op: ArrayOp) -> Result<u64, Status> {
        let _ = op;
        Err(Status::NotSupported)
    }

    /// What another context of this worker needs to reach `[base, base +
    /// size)`, the start of an allocation or a mapping of this one (the
    /// worker checked that it is).
    fn share_mem(&mut self, base: u64, size: u64) -> Result<SharedMem, Status> {
        let _ = (base, size);
        Ok(SharedMem::default())
    }

    /// Makes `size` bytes at `base` that another context shared
    /// ([`Context::share_mem`]) reachable from this one.
    fn import_mem(&mut self, base: u64, size: u64, mem: &SharedMem) -> Result<(), Status> {
        let _ = (base, size, mem);
        Ok(())
    }

    /// Forgets memory imported at `base`.
    fn close_mem(&mut self, base: u64) {
        let _ = base;
    }

    /// What another context of this worker needs to use `event` of this
    /// one (an IPC event handle).
    fn share_event(&mut self, event: Handle) -> Result<SharedMem, Status>;

    /// An event of another context (shared by [`Context::share_event`])
    /// as a handle of this one: waited on, queried, synchronized and
    /// recorded as its own; [`Context::event_destroy`] forgets it (the
    /// owner destroys it).
    fn import_event(&mut self, shared: &SharedMem) -> Result<Handle, Status>;

    /// Makes the context as a new one is, for a later process of the same
    /// vGPU (see `serve/contexts.rs`): if none of its work is left, destroys
    /// every object it holds, gives every allocation back to the driver,
    /// and sets what the process may have changed (limits) back to a new
    /// context's values. An error: it cannot be made clean (work still
    /// running, a sticky error) and the caller drops it.
    fn recycle(&mut self) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// Allocates `size` bytes; returns the device address.
    fn alloc(&mut self, size: u64) -> Result<u64, Status>;
    /// Device memory an allocation of `size` bytes takes (the allocator's
    /// granularity included), counted against the vGPU's limit.
    fn footprint(&self, size: u64) -> u64 {
        size
    }
    /// Frees an allocation made by `alloc` (the worker checked it).
    fn free(&mut self, ptr: u64) -> Result<(), Status>;
    /// Copies `src` (in the request arena) to device address `dst`.
    fn htod(&mut self, dst: u64, src: &VolatileSlice<'_>, stream: Handle) -> Result<(), Status>;
    /// Copies device bytes into `dst` (in the response arena) now, and
    /// returns when they are there. The worker calls it once the work
    /// submitted to `stream` before the copy has completed (a [`Marker`]),
    /// and the copy must not wait for work submitted since.
    fn dtoh(&mut self, dst: &VolatileSlice<'_>, src: u64, stream: Handle) -> Result<(), Status>;
    /// Copies device bytes into `dst` (pinned memory) when `stream` gets
    /// there; returns at once.
    fn dtoh_async(
        &mut self,
        dst: &VolatileSlice<'_>,
        src: u64,
        stream: Handle,
    ) -> Result<(), Status>;
    /// Device-to-device copy.
    fn dtod(&mut self, dst: u64, src: u64, len: u64, stream: Handle) -> Result<(), Status>;
    /// Fills `count` elements of `width` bytes.
    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        width: u32,
        count: u64,
        stream: Handle,
    ) -> Result<(), Status>;
    /// Loads a module; returns its handle and its kernels with parameter sizes.
    fn load_module(&mut self, kind: ImageKind, image: &[u8]) -> Result<Handle, Status>;
    /// Unloads a module.
    fn unload_module(&mut self, module: Handle) -> Result<(), Status>;
    /// Looks a kernel up; returns its handle and its parameters' layout.
    fn function(&mut self, module: Handle, name: &str) -> Result<(Handle, Vec<Param>), Status>;
    /// The names of a module's kernels (those the guest's image has), in
    /// an order that stays the same while the module is loaded.
    fn function_names(&mut self, module: Handle) -> Result<Vec<String>, Status>;
    /// A kernel attribute (`CUfunction_attribute`, already range-checked).
    fn func_attribute(&mut self, func: Handle, attr: u32) -> Result<i32, Status>;
    /// Sets a kernel attribute (already range-checked).
    fn func_set_attribute(&mut self, func: Handle, attr: u32, value: i32) -> Result<(), Status>;
    /// A limit of the context (`CUlimit`, already range-checked).
    fn limit(&mut self, limit: u32) -> Result<u64, Status>;
    /// Sets a limit of the context.
    fn set_limit(&mut self, limit: u32, value: u64) -> Result<(), Status>;
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
    /// Resident blocks per multiprocessor (cuOccupancyMaxActiveBlocksPerMultiprocessor).
    fn occupancy(&mut self, func: Handle, block_size: u32, shared_mem: u32) -> Result<i32, Status>;
    /// The most dynamic shared memory per block with `num_blocks` blocks of
    /// `block_size` threads resident per multiprocessor.
    fn available_smem(
        &mut self,
        func: Handle,
        num_blocks: u32,
        block_size: u32,
    ) -> Result<u64, Status>;
    /// A tensor-map descriptor for `p` (checked by its decoding; its
    /// memory checked to be the caller's).
    fn tensor_map(
        &mut self,
        p: &protocol::tensor_map::TensorMapParams,
    ) -> Result<[u8; protocol::tensor_map::TENSOR_MAP_BYTES], Status>;
    /// Thread block clusters of a launch shape: the most resident at once
    /// (cuOccupancyMaxActiveClusters; `cluster` zero means the kernel's
    /// own), or with `potential` the largest usable cluster size
    /// (cuOccupancyMaxPotentialClusterSize).
    fn occupancy_clusters(
        &mut self,
        shape: Launch,
        cluster: Dim3,
        potential: bool,
    ) -> Result<i32, Status>;
    /// Address and size of a module's global variable.
    fn module_global(&mut self, module: Handle, name: &str) -> Result<(u64, u64), Status>;
    /// Links (type, image) inputs into one loadable image.
    fn link(&mut self, inputs: &[(u32, &[u8])]) -> Result<Vec<u8>, Status>;
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
    /// time is read later with [`Context::take_timings`].
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
    /// GPU times (function, ns) of timed launches that have completed.
    fn take_timings(&mut self) -> Vec<(Handle, u64)> {
        Vec::new()
    }
    /// Starts timing a busy period on the device. Called when the context's
    /// work is drained, before the period's first operation.
    fn period_begin(&mut self) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// Ends the period after the work submitted so far to `streams` (0: the
    /// default stream).
    fn period_end(&mut self, _streams: &[Handle]) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// The device time of the ended period, once its work has completed
    /// (taken once; `None` if it was not timed or is not complete).
    fn period_ns(&mut self) -> Option<u64> {
        None
    }
    /// Creates a stream with a priority (clamped to the device's range).
    fn stream_create(&mut self, flags: u32, priority: i32) -> Result<Handle, Status>;
    /// Makes `stream`'s later work wait for `event`'s last record.
    fn stream_wait_event(
        &mut self,
        stream: Handle,
        event: Handle,
        flags: u32,
    ) -> Result<(), Status>;
    /// Destroys a stream.
    fn stream_destroy(&mut self, stream: Handle) -> Result<(), Status>;
    /// Sets an attribute of a stream (0: the default stream); every kernel
    /// launched into it after runs with it, as natively.
    fn stream_set_attribute(&mut self, stream: Handle, attr: StreamAttr) -> Result<(), Status>;
    /// A stream's attribute `id` (one of `stream_attr::id::ALL`).
    fn stream_attribute(&mut self, stream: Handle, id: u32) -> Result<StreamAttr, Status>;
    /// Waits for a stream (0: the default stream).
    fn stream_synchronize(&mut self, stream: Handle) -> Result<(), Status>;
    /// Whether a stream is idle.
    fn stream_query(&mut self, stream: Handle) -> Result<bool, Status>;
    /// Creates an event.
    fn event_create(&mut self, flags: u32) -> Result<Handle, Status>;
    /// Destroys an event.
    fn event_destroy(&mut self, event: Handle) -> Result<(), Status>;
    /// Records an event.
    fn event_record(&mut self, event: Handle, stream: Handle) -> Result<(), Status>;
    /// Waits for an event.
    fn event_synchronize(&mut self, event: Handle) -> Result<(), Status>;
    /// Whether an event completed.
    fn event_query(&mut self, event: Handle) -> Result<bool, Status>;
    /// Milliseconds between two events.
    fn event_elapsed(&mut self, start: Handle, end: Handle) -> Result<f32, Status>;
    /// Waits for all work of this context.
    fn synchronize(&mut self) -> Result<(), Status>;
    /// Builds and instantiates a graph of `nodes` (the worker checked every
    /// handle and range in them against the session); returns its handle.
    /// By default the graph is kept as its nodes, and a launch runs them
    /// one after another in the stream ([`Context::graph_launch`]): a
    /// valid order of any graph, whose nodes come after their dependencies.
    fn graph_instantiate(
        &mut self,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        let _ = nodes;
        Err(Status::NotSupported)
    }
    /// Launches an executable graph into `stream`.
    fn graph_launch(&mut self, exec: Handle, stream: Handle) -> Result<(), Status> {
        let _ = (exec, stream);
        Err(Status::NotSupported)
    }
    /// Destroys an executable graph.
    fn graph_destroy(&mut self, exec: Handle) -> Result<(), Status> {
        let _ = exec;
        Err(Status::NotSupported)
    }
    /// Makes a conditional scope (the twin of a guest graph that holds
    /// conditional handles); returns its handle.
    fn cond_scope_create(&mut self) -> Result<Handle, Status> {
        Err(Status::NotSupported)
    }
    /// Makes a conditional handle in `scope` (the worker checked the scope
    /// is the session's); returns the value kernels take.
    fn cond_handle_create(
        &mut self,
        scope: Handle,
        default_value: u32,
        flags: u32,
    ) -> Result<u64, Status> {
        let _ = (scope, default_value, flags);
        Err(Status::NotSupported)
    }
    /// Destroys a scope; executables made in it stay valid.
    fn cond_scope_destroy(&mut self, scope: Handle) -> Result<(), Status> {
        let _ = scope;
        Err(Status::NotSupported)
    }
    /// Builds and instantiates a graph of `nodes` in `scope` (the worker
    /// checked every handle in them, conditional ones against the scope);
    /// launched and destroyed as [`Context::graph_instantiate`]'s.
    fn graph_instantiate_in(
        &mut self,
        scope: Handle,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        let _ = (scope, nodes);
        Err(Status::NotSupported)
    }
    /// Marks the point after the work submitted so far to `stream` (`None`:
    /// to every stream of the context), for [`Context::reached`]: how the
    /// worker waits for the device without blocking its other guests.
    fn mark(&mut self, stream: Option<Handle>) -> Result<Marker, Status>;
    /// Whether the device has passed mark `m` (an error: the work before it
    /// failed). A mark reached, or failed, is forgotten.
    fn reached(&mut self, m: Marker) -> Result<bool, Status>;
    /// Lets a mark go unreached.
    fn forget(&mut self, m: Marker);
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
    /// Moves the context to GPU `device` at a kernel boundary: waits for its
    /// work, copies its memory there, and maps it at the same device
    /// addresses (pointers the guest holds, and pointers stored in device
    /// memory, stay valid); its streams, events and modules move with it
    /// under the same handles. On failure it stays where it was.
    fn migrate(&mut self, _device: u32, _prepared: Option<Prepared>) -> Result<Moved, Status> {
        Err(Status::NotSupported)
    }
    /// Work of a migration to `device` that can be done ahead, on another
    /// thread, while the guest still runs here (on a real GPU: the target's
    /// context, modules, streams and events). Its result goes to
    /// [`Context::migrate`]; `None`: nothing to do ahead.
    fn prepare_migration(&self, _device: u32) -> Option<PrepareJob> {
        None
    }
    /// The object that keeps this context on its GPU, if one does: a
    /// migration is refused before anything moves, naming it.
    fn migration_keeper(&self) -> Option<Keeper> {
        None
    }
    /// The object that keeps this context from moving to GPU `target` in
    /// particular (memory with a property that GPU cannot give), or
    /// whatever keeps it on its GPU.
    fn migration_keeper_to(&self, _target: u32) -> Option<Keeper> {
        self.migration_keeper()
    }
    /// Reserves `size` bytes of device address space (`align`: 0 or a power
    /// of two; `addr`: 0, or the address asked for, which the device may
    /// not give) for the guest's own mappings (cuMemAddressReserve). The
    /// worker checks every VMM call against the session's table
    /// (`session::vmm`) first.
    fn vmm_reserve(&mut self, _size: u64, _align: u64, _addr: u64) -> Result<u64, Status> {
        Err(Status::NotSupported)
    }
    /// Frees a reservation with nothing mapped in it.
    fn vmm_address_free(&mut self, _ptr: u64, _size: u64) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// Makes `size` bytes of physical memory on the context's GPU,
    /// compressible if `compression` is `CU_MEM_ALLOCATION_COMP_GENERIC`
    /// (the device may not grant it: [`Context::vmm_compression`] says);
    /// returns a handle of this executor's.
    fn vmm_create(&mut self, _size: u64, _compression: u8) -> Result<Handle, Status> {
        Err(Status::NotSupported)
    }
    /// The compression type `handle`'s memory has, as the device reports
    /// it (not as it was asked for).
    fn vmm_compression(&self, _handle: Handle) -> Result<u8, Status> {
        Err(Status::NotSupported)
    }
    /// Frees physical memory that nothing maps.
    fn vmm_release(&mut self, _handle: Handle) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// Maps `size` bytes of `handle`'s memory from `offset` at `ptr` (in a
    /// reservation, over nothing mapped), readable and writable from the
    /// context's GPU.
    fn vmm_map(
        &mut self,
        _ptr: u64,
        _size: u64,
        _offset: u64,
        _handle: Handle,
    ) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// Unmaps one whole mapping.
    fn vmm_unmap(&mut self, _ptr: u64, _size: u64) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// What another context of this worker needs to hold the physical
    /// memory of `handle` (a shareable handle, `session/share.rs`): the
    /// memory itself, freed once its last holder lets go.
    fn share_phys(&mut self, _handle: Handle) -> Result<SharedMem, Status> {
        Err(Status::NotSupported)
    }
    /// A handle of this context for `size` bytes of physical memory another
    /// context shared ([`Context::share_phys`]): mapped, released and held
    /// as one made by [`Context::vmm_create`].
    fn import_phys(&mut self, _mem: &SharedMem, _size: u64) -> Result<Handle, Status> {
        Err(Status::NotSupported)
    }
}

/// Which executor runs the calls.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    Default,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// The CPU model of a non-preemptive GPU.
    #[default]
    Sim,
    /// A real GPU through the CUDA driver API.
    Cuda,
}

/// Which kernel launches the cuda executor submits as CUDA graph launches
/// (see `executor/cuda/batch.rs`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    Default,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum GraphLaunches {
    /// None: one `cuLaunchKernel` per launch, as the guest called it.
    Off,
    /// Runs of two or more launches the worker found queued behind one
    /// another: one graph launch per run instead of a driver call per launch;
    /// single launches go through `cuLaunchKernel`.
    Runs,
    /// Every launch, single ones as one-node graphs: they cost the host about
    /// half a `cuLaunchKernel` and start sooner, so synchronous round trips
    /// are shorter (results/2026-11-22-h100-wake-credit.md).
    #[default]
    All,
}
