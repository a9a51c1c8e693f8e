//! The requests: one variant per CUDA call, its opcode, and what it
//! expects back (`encode.rs` writes them, `decode.rs` reads and checks them).

use crate::array::{ArrayCopy, ArrayDesc};
use crate::{op, Dim3, ImageKind};

pub(crate) mod decode;
mod encode;
#[cfg(test)]
mod golden;
#[cfg(test)]
mod samples;

/// A CUDA call from the guest. Handles (`module`, `func`, `stream`, `event`)
/// and device pointers are opaque numbers the host issued; the host checks
/// each against the caller's own tables. Stream 0 is the default stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// First call on a process's first channel: opens the process's
    /// session. The reply's data is the device description, its values the
    /// session's token (two words); its tag starts the process's request
    /// numbering (each request's tag is the next number, across all the
    /// process's channels, and the host runs them in that order).
    Hello {
        /// The guest's protocol version.
        version: u32,
    },
    /// First call on a further channel of a process (another thread's):
    /// joins the session whose token it gives. Its tag is 0 (it is not one
    /// of the process's numbered requests).
    Join {
        /// The session's token, from `Hello`'s reply.
        token: [u64; 2],
    },
    /// Wait for all work of this channel.
    CtxSynchronize,
    /// Allocate device memory.
    MemAlloc {
        /// Bytes.
        size: u64,
    },
    /// Free device memory.
    MemFree {
        /// Pointer returned by `MemAlloc`.
        ptr: u64,
    },
    /// Free device memory once the work submitted so far to `stream` is
    /// done (stream-ordered; no reply).
    MemFreeAsync {
        /// Pointer returned by `MemAlloc`.
        ptr: u64,
        /// Stream.
        stream: u64,
    },
    /// Free and total memory of this vGPU (its limit, not the GPU's).
    MemGetInfo,
    /// Page-locked host memory from the region's pinned pool (reply: its
    /// offset in the pool).
    PinnedAlloc {
        /// Bytes.
        size: u64,
    },
    /// Gives pinned memory back.
    PinnedFree {
        /// Offset `PinnedAlloc` returned.
        offset: u64,
    },
    /// Copy from pinned memory to the device, asynchronously (DMA from the
    /// pool when the stream gets there; no reply).
    MemcpyHtoDPinned {
        /// Destination.
        dst: u64,
        /// Source: an offset in the pinned pool.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Stream.
        stream: u64,
    },
    /// Copy from the device to pinned memory, asynchronously (no reply).
    MemcpyDtoHPinned {
        /// Source.
        src: u64,
        /// Destination: an offset in the pinned pool.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Stream.
        stream: u64,
    },
    /// Copy host to device; `len` bytes follow in data chunks.
    MemcpyHtoD {
        /// Destination.
        dst: u64,
        /// Total bytes.
        len: u64,
        /// Stream.
        stream: u64,
    },
    /// Copy device to host; the reply's data carries the bytes (chunked).
    MemcpyDtoH {
        /// Source.
        src: u64,
        /// Bytes.
        len: u64,
        /// Stream.
        stream: u64,
    },
    /// Copy device to device.
    MemcpyDtoD {
        /// Destination.
        dst: u64,
        /// Source.
        src: u64,
        /// Bytes.
        len: u64,
        /// Stream.
        stream: u64,
    },
    /// Fill memory with a value of `width` bytes (1, 2 or 4).
    Memset {
        /// Destination.
        dst: u64,
        /// Value (low `width` bytes used).
        value: u32,
        /// 1, 2 or 4.
        width: u32,
        /// Number of elements.
        count: u64,
        /// Stream.
        stream: u64,
    },
    /// Load a module; the image follows in data chunks.
    ModuleLoad {
        /// Image kind.
        kind: ImageKind,
        /// Image length.
        len: u64,
    },
    /// Unload a module.
    ModuleUnload {
        /// Module handle.
        module: u64,
    },
    /// Look a kernel up by name (name in data); reply: handle, and each
    /// parameter's size and offset ([`Param::encode_all`](crate::Param::encode_all)) in data.
    ModuleGetFunction {
        /// Module handle.
        module: u64,
    },
    /// A kernel attribute (`CUfunction_attribute` 0..=9; reply: the value as i32).
    FuncGetAttribute {
        /// Function handle.
        func: u64,
        /// The attribute.
        attr: u32,
    },
    /// Resident blocks per multiprocessor for a block size (reply: i32).
    Occupancy {
        /// Function handle.
        func: u64,
        /// Threads per block.
        block_size: u32,
        /// Dynamic shared memory per block.
        shared_mem: u32,
    },
    /// The most dynamic shared memory a block may use with `num_blocks`
    /// blocks of `block_size` threads resident per multiprocessor (reply: bytes).
    OccupancySmem {
        /// Function handle.
        func: u64,
        /// Blocks per multiprocessor.
        num_blocks: u32,
        /// Threads per block.
        block_size: u32,
    },
    /// Thread block clusters of a launch shape: the most that can be
    /// resident at once (`potential` false, cuOccupancyMaxActiveClusters;
    /// `cluster` all zero means the kernel's own cluster dimensions), or the
    /// largest cluster size the shape can use (`potential` true,
    /// cuOccupancyMaxPotentialClusterSize). Reply: i32.
    OccupancyClusters {
        /// Function handle.
        func: u64,
        /// Grid.
        grid: Dim3,
        /// Block.
        block: Dim3,
        /// Dynamic shared memory per block.
        shared_mem: u32,
        /// Cluster dimensions (all zero: none given).
        cluster: Dim3,
        /// Which question.
        potential: bool,
    },
    /// A tensor-map descriptor encoded by the host's driver: the data is a
    /// [`tensor_map::TensorMapParams`](crate::tensor_map::TensorMapParams), the reply's data the 128 bytes.
    TensorMapEncode,
    /// Load a module image the host may hold already: by its
    /// [`image_hash`](crate::image_hash). Reply: the module handle, or `NotFound` (then the
    /// guest sends the image with `ModuleLoad`).
    ModuleLoadCached {
        /// PTX or cubin.
        kind: ImageKind,
        /// The image's length.
        len: u64,
        /// Its SHA-256.
        hash: [u8; 32],
    },
    /// The names of a module's kernels (cuModuleEnumerateFunctions), from
    /// the `first`th on in a stable order. Reply: how many the module has;
    /// data: as many of the names from `first` on as fit in one message,
    /// each NUL-terminated (none when `first` is past the end).
    ModuleFunctions {
        /// Module handle.
        module: u64,
        /// Index of the first name wanted.
        first: u32,
    },
    /// Build and instantiate a graph on the host: `len` bytes of
    /// [`graph`](crate::graph) data follow. Reply: the executable's handle.
    GraphInstantiate {
        /// Bytes of graph data.
        len: u32,
    },
    /// Launch an executable graph into a stream (asynchronous).
    GraphLaunch {
        /// The executable's handle.
        exec: u64,
        /// Stream handle (0 = default).
        stream: u64,
    },
    /// Destroy an executable graph.
    GraphDestroy {
        /// The executable's handle.
        exec: u64,
    },
    /// Make a conditional scope: the host's twin of a guest graph that
    /// holds conditional handles (on a GPU, an empty CUDA graph the handles
    /// are made in). Reply: the scope's handle.
    CondScopeCreate,
    /// Make a conditional handle in a scope (cuGraphConditionalHandleCreate).
    /// Reply: the handle's value, which kernels take as a parameter.
    CondHandleCreate {
        /// The scope's handle.
        scope: u64,
        /// The value it takes at the start of each launch (with `flags` 1).
        default_value: u32,
        /// 0, or `CU_GRAPH_COND_ASSIGN_DEFAULT` (1).
        flags: u32,
    },
    /// Destroy a scope (its executables stay valid).
    CondScopeDestroy {
        /// The scope's handle.
        scope: u64,
    },
    /// Build and instantiate a graph in a scope: its conditional nodes use
    /// the scope's handles. `len` bytes of [`graph`](crate::graph) data
    /// follow. Reply: the executable's handle (launched and destroyed as
    /// `GraphInstantiate`'s).
    GraphInstantiateIn {
        /// The scope's handle.
        scope: u64,
        /// Bytes of graph data.
        len: u32,
    },
    /// Address and size of a module's global variable (name in data).
    ModuleGetGlobal {
        /// Module handle.
        module: u64,
    },
    /// Link images into one (cuLink*): `len` bytes of records follow, each
    /// `[input type u32][length u32][bytes]`; the reply's data is the linked image.
    Link {
        /// Total bytes of records.
        len: u64,
    },
    /// Launch a kernel; the parameter bytes, packed in order, are the data.
    Launch {
        /// Function handle.
        func: u64,
        /// Grid.
        grid: Dim3,
        /// Block.
        block: Dim3,
        /// Dynamic shared memory.
        shared_mem: u32,
        /// Stream.
        stream: u64,
        /// Thread block cluster dimensions (all zero: none).
        cluster: Dim3,
        /// [`launch_flags`](crate::launch_flags).
        flags: u32,
    },
    /// Run guest host function `id` in `stream`'s order: once the work
    /// submitted to the stream before it is done, the host hands `id` to
    /// the process's `WaitHostFn`, and runs none of the process's later
    /// requests until `HostFnDone`. No reply.
    HostFn {
        /// Stream.
        stream: u64,
        /// The guest's number for the function.
        id: u64,
    },
    /// Waits (up to about a second) for a host function to run; reply:
    /// its id (0: none yet) and, in the status, the error of the work
    /// before it if any. Not numbered (tag 0): a process's callback
    /// thread sends it on a channel of its own.
    WaitHostFn,
    /// Takes the process's kernel output the host holds (what its
    /// kernels printed, and the driver's assert messages), a message's
    /// worth; reply: value 0 its stream (1: standard output, 2: standard
    /// error, 0: nothing held) and the bytes as data. Sent when a reply
    /// carries [`REPLY_OUTPUT`](crate::REPLY_OUTPUT).
    TakeOutput,
    /// The host function handed out has run: the process's later requests
    /// go on. Not numbered (tag 0); no reply.
    HostFnDone {
        /// Its id.
        id: u64,
    },
    /// Create a stream.
    StreamCreate {
        /// CU_STREAM_* flags.
        flags: u32,
        /// Priority (lower is higher; the driver clamps it to its range).
        priority: i32,
    },
    /// Make a stream's later work wait for an event's last record.
    StreamWaitEvent {
        /// The stream that waits.
        stream: u64,
        /// The event.
        event: u64,
        /// CU_EVENT_WAIT_* flags.
        flags: u32,
    },
    /// Set a kernel attribute (`CUfunction_attribute`: the dynamic shared
    /// memory limit, the carveout, cluster requirements).
    FuncSetAttribute {
        /// Function handle.
        func: u64,
        /// The attribute.
        attr: u32,
        /// Its value.
        value: i32,
    },
    /// A limit of the context (`CUlimit` 0..=MAX_LIMIT; reply: the value).
    CtxGetLimit {
        /// The limit.
        limit: u32,
    },
    /// Sets a limit of the context.
    CtxSetLimit {
        /// The limit.
        limit: u32,
        /// Its value.
        value: u64,
    },
    /// Sets an attribute of a stream (`cuStreamSetAttribute`): the host's
    /// stream takes it, and so every kernel launched into it.
    StreamSetAttribute {
        /// Stream handle (0: the default stream).
        stream: u64,
        /// The attribute and its value, checked.
        attr: crate::stream_attr::StreamAttr,
    },
    /// An attribute of a stream as the host's stream has it (reply: the
    /// value's [`crate::stream_attr::RAW_LEN`] bytes in `vals`, little-endian).
    StreamGetAttribute {
        /// Stream handle (0: the default stream).
        stream: u64,
        /// One of [`crate::stream_attr::id::ALL`].
        attr: u32,
    },
    /// Destroy a stream.
    StreamDestroy {
        /// Stream handle.
        stream: u64,
    },
    /// Wait for a stream.
    StreamSynchronize {
        /// Stream handle.
        stream: u64,
    },
    /// Whether a stream is idle (`NotReady` if not).
    StreamQuery {
        /// Stream handle.
        stream: u64,
    },
    /// Create an event.
    EventCreate {
        /// CU_EVENT_* flags.
        flags: u32,
    },
    /// Destroy an event.
    EventDestroy {
        /// Event handle.
        event: u64,
    },
    /// Record an event on a stream.
    EventRecord {
        /// Event.
        event: u64,
        /// Stream.
        stream: u64,
    },
    /// Wait for an event.
    EventSynchronize {
        /// Event.
        event: u64,
    },
    /// Whether an event completed.
    EventQuery {
        /// Event.
        event: u64,
    },
    /// Milliseconds between two recorded events (reply value: f32 bits).
    EventElapsedTime {
        /// Start event.
        start: u64,
        /// End event.
        end: u64,
    },
    /// Reserves device address space for the process's own mappings
    /// (cuMemAddressReserve; reply: its address).
    VmmReserve {
        /// Bytes (a multiple of [`VMM_GRANULARITY`](crate::VMM_GRANULARITY)).
        size: u64,
        /// Alignment: 0 (the default) or a power of two.
        align: u64,
        /// The address asked for: 0 for any, else a multiple of the
        /// granularity; a hint the host's driver may not take.
        addr: u64,
    },
    /// Gives back a whole reservation with nothing mapped in it.
    VmmAddressFree {
        /// Its address.
        ptr: u64,
        /// Its size.
        size: u64,
    },
    /// Physical device memory (cuMemCreate; reply: its handle, and the
    /// compression type the driver gave it, read back from the driver),
    /// counted against the vGPU's memory limit.
    VmmCreate {
        /// Bytes (a multiple of [`VMM_GRANULARITY`](crate::VMM_GRANULARITY)).
        size: u64,
        /// `CUmemAllocationCompType` asked for: 0 (none) or
        /// [`VMM_COMPRESSION_GENERIC`](crate::VMM_COMPRESSION_GENERIC).
        compression: u8,
    },
    /// Lets go of a handle; the memory goes once nothing maps it either.
    VmmRelease {
        /// The handle.
        handle: u64,
    },
    /// Maps `size` bytes of a handle from `offset` at `ptr`, in one of the
    /// process's reservations, over nothing mapped; readable and writable
    /// from the device.
    VmmMap {
        /// Where.
        ptr: u64,
        /// Bytes.
        size: u64,
        /// Offset in the handle's memory.
        offset: u64,
        /// The handle.
        handle: u64,
    },
    /// Unmaps whole mappings that cover `[ptr, ptr + size)` exactly.
    VmmUnmap {
        /// Start.
        ptr: u64,
        /// Bytes.
        size: u64,
    },
    /// Sets the device's access to mapped memory (1: read, 3: read-write).
    VmmSetAccess {
        /// Start.
        ptr: u64,
        /// Bytes.
        size: u64,
        /// `CUmemAccess_flags`.
        flags: u32,
    },
    /// The handle of the memory mapped at `ptr`, retained once more
    /// (reply: the handle, its size and its compression type).
    VmmRetain {
        /// An address inside a mapping.
        ptr: u64,
    },
    /// Exports the allocation (or VMM mapping) holding `ptr` to the other
    /// processes of the VM (`cuIpcGetMemHandle`); reply: a token naming
    /// it, its start and its size. The same memory gets the same token.
    IpcExport {
        /// An address inside the caller's allocation.
        ptr: u64,
    },
    /// Opens memory another process of the VM exported
    /// (`cuIpcOpenMemHandle`); reply: its start and size, at which the
    /// caller reaches it until it closes it or the exporter lets it go.
    IpcOpen {
        /// The exporter's token.
        token: u64,
    },
    /// The vGPU as a monitor sees it (NVML in the guest): asked on a
    /// channel that has not said `Hello` (no session, no context). Reply:
    /// the memory limit, the memory the vGPU's processes hold, its share
    /// of the GPU over the last interval (parts per million) and how many
    /// processes it serves; data: a [`crate::VgpuStatus`] with the device
    /// and, from the `first`th on, as many processes as fit.
    VgpuStatus {
        /// Index of the first process wanted (at most [`crate::MAX_STATUS_PROCESSES`]).
        first: u32,
    },
    /// Closes memory opened with `IpcOpen` (`cuIpcCloseMemHandle`).
    IpcClose {
        /// The start `IpcOpen` answered.
        ptr: u64,
    },
    /// Exports one of the caller's events to the other processes of the
    /// VM (`cuIpcGetEventHandle`); reply: a token naming it.
    IpcExportEvent {
        /// The event.
        event: u64,
    },
    /// Opens an event another process of the VM exported
    /// (`cuIpcOpenEventHandle`); reply: an event handle of the caller's,
    /// which `EventDestroy` lets go of.
    IpcOpenEvent {
        /// The exporter's token.
        token: u64,
    },
    /// Exports physical memory the caller holds a handle of
    /// (`cuMemExportToShareableHandle`, a POSIX file descriptor in the
    /// guest that carries the token); reply: a token naming it and its
    /// size. The same memory gets the same token while it is exported.
    VmmExport {
        /// The caller's handle.
        handle: u64,
    },
    /// Imports physical memory another process of the VM exported
    /// (`cuMemImportFromShareableHandle`); reply: a handle of the
    /// caller's for it (released with `VmmRelease`) and its size. The
    /// memory stays counted to its exporter.
    VmmImport {
        /// The exporter's token (never 0).
        token: u64,
    },
    /// Exports one of the caller's memory pools (made with a POSIX file
    /// descriptor handle type; `cuMemPoolExportToShareableHandle`); reply:
    /// a token naming it.
    PoolExport {
        /// The guest's pool handle (never 0).
        pool: u64,
    },
    /// Imports a pool another process of the VM exported
    /// (`cuMemPoolImportFromShareableHandle`): pointers exported from it
    /// may be imported through it from then on.
    PoolImport {
        /// The exporter's pool token (never 0).
        token: u64,
    },
    /// Exports an allocation of one of the caller's exported pools
    /// (`cuMemPoolExportPointer`); reply: a token naming it, its start
    /// and size (the allocation is opened as `IpcOpen` opens, and closed
    /// with `IpcClose`).
    PoolExportPointer {
        /// The pool's token (from `PoolExport`, never 0).
        pool: u64,
        /// An address inside the allocation.
        ptr: u64,
    },
    /// Imports an allocation exported from a pool the caller imported
    /// (`cuMemPoolImportPointer`); reply: its start and size.
    PoolImportPointer {
        /// The pool's token (from `PoolImport`, never 0).
        pool: u64,
        /// The allocation's token (from `PoolExportPointer`, never 0).
        token: u64,
    },
    /// A CUDA array (`cuArray3DCreate`), counted against the vGPU's memory
    /// limit; reply: its handle and the bytes counted.
    ArrayCreate {
        /// What it is.
        desc: ArrayDesc,
    },
    /// Destroys one of the caller's arrays.
    ArrayDestroy {
        /// Its handle.
        array: u64,
    },
    /// A box copy with an array at one end or both, in `stream`'s order.
    ArrayCopy {
        /// The box and its ends.
        copy: ArrayCopy,
        /// Stream.
        stream: u64,
    },
    /// A texture object (`cuTexObjectCreate`): the data is a
    /// [`array::TexParams`](crate::array::TexParams). Reply: the host
    /// driver's object value, which kernels take as a parameter.
    TexCreate,
    /// Destroys one of the caller's texture objects.
    TexDestroy {
        /// The value `TexCreate` answered.
        obj: u64,
    },
    /// A surface object over one of the caller's arrays
    /// (`cuSurfObjectCreate`; the driver makes one over an array without
    /// `SURFACE_LDST` too, measured on an H100); reply: the object value.
    SurfCreate {
        /// The array.
        array: u64,
    },
    /// Destroys one of the caller's surface objects.
    SurfDestroy {
        /// The value `SurfCreate` answered.
        obj: u64,
    },
}

impl Request {
    /// The opcode of this request.
    pub fn opcode(&self) -> u32 {
        use Request::*;
        match self {
            Hello { .. } => op::HELLO,
            Join { .. } => op::JOIN,
            CtxSynchronize => op::CTX_SYNCHRONIZE,
            MemAlloc { .. } => op::MEM_ALLOC,
            MemFree { .. } => op::MEM_FREE,
            MemGetInfo => op::MEM_GET_INFO,
            MemFreeAsync { .. } => op::MEM_FREE_ASYNC,
            PinnedAlloc { .. } => op::PINNED_ALLOC,
            PinnedFree { .. } => op::PINNED_FREE,
            MemcpyHtoDPinned { .. } => op::MEMCPY_HTOD_PINNED,
            MemcpyDtoHPinned { .. } => op::MEMCPY_DTOH_PINNED,
            MemcpyHtoD { .. } => op::MEMCPY_HTOD,
            MemcpyDtoH { .. } => op::MEMCPY_DTOH,
            MemcpyDtoD { .. } => op::MEMCPY_DTOD,
            Memset { .. } => op::MEMSET,
            ModuleLoad { .. } => op::MODULE_LOAD,
            ModuleUnload { .. } => op::MODULE_UNLOAD,
            ModuleGetFunction { .. } => op::MODULE_GET_FUNCTION,
            FuncGetAttribute { .. } => op::FUNC_GET_ATTRIBUTE,
            Occupancy { .. } => op::OCCUPANCY,
            ModuleGetGlobal { .. } => op::MODULE_GET_GLOBAL,
            OccupancySmem { .. } => op::OCCUPANCY_SMEM,
            OccupancyClusters { .. } => op::OCCUPANCY_CLUSTERS,
            TensorMapEncode => op::TENSOR_MAP_ENCODE,
            ModuleLoadCached { .. } => op::MODULE_LOAD_CACHED,
            ModuleFunctions { .. } => op::MODULE_FUNCTIONS,
            GraphInstantiate { .. } => op::GRAPH_INSTANTIATE,
            GraphLaunch { .. } => op::GRAPH_LAUNCH,
            GraphDestroy { .. } => op::GRAPH_DESTROY,
            CondScopeCreate => op::COND_SCOPE_CREATE,
            CondHandleCreate { .. } => op::COND_HANDLE_CREATE,
            CondScopeDestroy { .. } => op::COND_SCOPE_DESTROY,
            GraphInstantiateIn { .. } => op::GRAPH_INSTANTIATE_IN,
            Link { .. } => op::LINK,
            Launch { .. } => op::LAUNCH,
            StreamCreate { .. } => op::STREAM_CREATE,
            StreamSetAttribute { .. } => op::STREAM_SET_ATTRIBUTE,
            StreamGetAttribute { .. } => op::STREAM_GET_ATTRIBUTE,
            StreamDestroy { .. } => op::STREAM_DESTROY,
            StreamSynchronize { .. } => op::STREAM_SYNCHRONIZE,
            StreamQuery { .. } => op::STREAM_QUERY,
            StreamWaitEvent { .. } => op::STREAM_WAIT_EVENT,
            HostFn { .. } => op::HOST_FN,
            WaitHostFn => op::WAIT_HOST_FN,
            HostFnDone { .. } => op::HOST_FN_DONE,
            TakeOutput => op::TAKE_OUTPUT,
            FuncSetAttribute { .. } => op::FUNC_SET_ATTRIBUTE,
            CtxGetLimit { .. } => op::CTX_GET_LIMIT,
            CtxSetLimit { .. } => op::CTX_SET_LIMIT,
            EventCreate { .. } => op::EVENT_CREATE,
            EventDestroy { .. } => op::EVENT_DESTROY,
            EventRecord { .. } => op::EVENT_RECORD,
            EventSynchronize { .. } => op::EVENT_SYNCHRONIZE,
            EventQuery { .. } => op::EVENT_QUERY,
            EventElapsedTime { .. } => op::EVENT_ELAPSED_TIME,
            VmmReserve { .. } => op::VMM_RESERVE,
            VmmAddressFree { .. } => op::VMM_ADDRESS_FREE,
            VmmCreate { .. } => op::VMM_CREATE,
            VmmRelease { .. } => op::VMM_RELEASE,
            VmmMap { .. } => op::VMM_MAP,
            VmmUnmap { .. } => op::VMM_UNMAP,
            VmmSetAccess { .. } => op::VMM_SET_ACCESS,
            VmmRetain { .. } => op::VMM_RETAIN,
            IpcExport { .. } => op::IPC_EXPORT,
            IpcOpen { .. } => op::IPC_OPEN,
            IpcClose { .. } => op::IPC_CLOSE,
            IpcExportEvent { .. } => op::IPC_EXPORT_EVENT,
            IpcOpenEvent { .. } => op::IPC_OPEN_EVENT,
            VmmExport { .. } => op::VMM_EXPORT,
            VmmImport { .. } => op::VMM_IMPORT,
            PoolExport { .. } => op::POOL_EXPORT,
            PoolImport { .. } => op::POOL_IMPORT,
            PoolExportPointer { .. } => op::POOL_EXPORT_POINTER,
            PoolImportPointer { .. } => op::POOL_IMPORT_POINTER,
            ArrayCreate { .. } => op::ARRAY_CREATE,
            ArrayDestroy { .. } => op::ARRAY_DESTROY,
            ArrayCopy { .. } => op::ARRAY_COPY,
            TexCreate => op::TEX_CREATE,
            TexDestroy { .. } => op::TEX_DESTROY,
            SurfCreate { .. } => op::SURF_CREATE,
            SurfDestroy { .. } => op::SURF_DESTROY,
            VgpuStatus { .. } => op::VGPU_STATUS,
        }
    }

    /// Whether the guest waits for a reply. Asynchronous calls (launches,
    /// host-to-device copies, memsets, event records, frees) are
    /// fire-and-forget; their errors surface at the next synchronizing call.
    pub fn expects_reply(&self) -> bool {
        !matches!(
            self,
            Request::Launch { .. }
                | Request::MemcpyHtoD { .. }
                | Request::MemcpyDtoD { .. }
                | Request::Memset { .. }
                | Request::EventRecord { .. }
                | Request::StreamWaitEvent { .. }
                | Request::MemFreeAsync { .. }
                | Request::HostFn { .. }
                | Request::HostFnDone { .. }
                | Request::MemcpyHtoDPinned { .. }
                | Request::MemcpyDtoHPinned { .. }
                | Request::GraphLaunch { .. }
        )
    }

    /// Whether the request is outside the process's numbering (its tag is
    /// 0): a channel's first `Join`, and the callback thread's requests.
    pub fn unnumbered(&self) -> bool {
        matches!(
            self,
            Request::Join { .. } | Request::WaitHostFn | Request::HostFnDone { .. }
        )
    }

    /// Bytes of data that follow this request (in its own and continuation descriptors).
    pub fn data_len(&self) -> Option<u64> {
        match self {
            Request::MemcpyHtoD { len, .. }
            | Request::ModuleLoad { len, .. }
            | Request::Link { len } => Some(*len),
            Request::GraphInstantiate { len } | Request::GraphInstantiateIn { len, .. } => {
                Some(u64::from(*len))
            }
            _ => None,
        }
    }
}
