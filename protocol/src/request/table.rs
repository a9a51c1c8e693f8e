//! The request table: one row per request, from which `macros.rs` makes
//! the [`Request`] enum, the opcodes ([`crate::op`]), `opcode`, `encode`,
//! the checked `decode`, `expects_reply`, `unnumbered`, `data_len`, and
//! the worker's `op::needs_device` and `op::drains_device`.
//!
//! A row is
//!
//! ```text
//! /// What the request does (the variant's documentation).
//! Variant (OPCODE_NAME = number) in Family [flags] data(field) {
//!     /// The field's documentation.
//!     field: Type = check(args),
//! };
//! ```
//!
//! - `in Family`: the API family ([`Family`]) whose handler in the worker
//!   (`worker/src/serve/requests/<family>.rs`) serves the request.
//! - Fields are in wire order: each is written and read by its type's
//!   [`Wire`] implementation (`wire.rs`), one after the other from the
//!   start of the 88-byte inline payload. A request without fields has no
//!   braces (a unit variant).
//! - `= check(args)` names a function of `checks.rs` that decoding runs on
//!   the field's raw value, after reading it and before reading the next:
//!   `check(name, &raw, args...)`. Arguments may name earlier fields (a
//!   launch's cluster must divide its `grid`), which is how a row checks
//!   one field against another.
//! - Flags: `reply` (the guest waits for a reply), `unnumbered` (tag 0,
//!   outside the process's request order), `device` (it puts work on the
//!   device: the worker runs it only under the grant), `drains` (it
//!   returns only once the device work before it is done).
//! - `data(field)`: the field that says how many bytes of data follow.

use super::checks::*;
use super::wire::Wire;
use crate::array::{ArrayCopy, ArrayDesc};
use crate::stream_attr::StreamAttr;
use crate::{Dim3, ImageKind, MAX_IMAGE, MAX_LEN, MAX_LIMIT, MAX_STATUS_PROCESSES};

/// The API families requests come in: the worker serves each family in
/// its own file (`worker/src/serve/requests/`), and a row names its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// A process's session: joining, its output, the vGPU's status.
    Session,
    /// Device and pinned memory, copies and memsets.
    Memory,
    /// Modules, kernels and their attributes, occupancy, linking.
    Module,
    /// Kernel launches and host functions.
    Launch,
    /// Streams, events, the context's synchronization and limits.
    Stream,
    /// Graphs and their conditional nodes.
    Graph,
    /// Virtual memory management.
    Vmm,
    /// IPC memory and event handles between processes of one VM.
    Ipc,
    /// Shareable physical memory and memory pools.
    Share,
    /// CUDA arrays, textures and surfaces.
    Arrays,
}

requests! {
    /// A CUDA call from the guest. Handles (`module`, `func`, `stream`, `event`)
    /// and device pointers are opaque numbers the host issued; the host checks
    /// each against the caller's own tables. Stream 0 is the default stream.
    pub enum Request {
        /// First call on a process's first channel: opens the process's
        /// session. The reply's data is the device description, its values the
        /// session's token (two words); its tag starts the process's request
        /// numbering (each request's tag is the next number, across all the
        /// process's channels, and the host runs them in that order).
        Hello (HELLO = 1) in Session [reply] {
            /// The guest's protocol version.
            version: u32,
        };
        /// First call on a further channel of a process (another thread's):
        /// joins the session whose token it gives. Its tag is 0 (it is not one
        /// of the process's numbered requests).
        Join (JOIN = 5) in Session [reply unnumbered] {
            /// The session's token, from `Hello`'s reply.
            token: [u64; 2],
        };
        /// Wait for all work of this channel.
        CtxSynchronize (CTX_SYNCHRONIZE = 2) in Stream [reply drains];
        /// Allocate device memory.
        MemAlloc (MEM_ALLOC = 10) in Memory [reply] {
            /// Bytes.
            size: u64 = some_at_most(MAX_LEN, "zero-byte allocation"),
        };
        /// Free device memory.
        MemFree (MEM_FREE = 11) in Memory [reply] {
            /// Pointer returned by `MemAlloc`.
            ptr: u64,
        };
        /// Free device memory once the work submitted so far to `stream` is
        /// done (stream-ordered; no reply).
        MemFreeAsync (MEM_FREE_ASYNC = 17) in Memory [device] {
            /// Pointer returned by `MemAlloc`.
            ptr: u64,
            /// Stream.
            stream: u64,
        };
        /// Free and total memory of this vGPU (its limit, not the GPU's).
        MemGetInfo (MEM_GET_INFO = 12) in Memory [reply];
        /// Page-locked host memory from the region's pinned pool (reply: its
        /// offset in the pool).
        PinnedAlloc (PINNED_ALLOC = 18) in Memory [reply] {
            /// Bytes.
            size: u64 = some_at_most(MAX_LEN, "zero-byte allocation"),
        };
        /// Gives pinned memory back.
        PinnedFree (PINNED_FREE = 19) in Memory [reply] {
            /// Offset `PinnedAlloc` returned.
            offset: u64,
        };
        /// Copy from pinned memory to the device, asynchronously (DMA from the
        /// pool when the stream gets there; no reply).
        MemcpyHtoDPinned (MEMCPY_HTOD_PINNED = 6) in Memory [device] {
            /// Destination.
            dst: u64,
            /// Source: an offset in the pinned pool.
            offset: u64,
            /// Bytes.
            len: u64 = at_most(MAX_LEN),
            /// Stream.
            stream: u64,
        };
        /// Copy from the device to pinned memory, asynchronously (no reply).
        MemcpyDtoHPinned (MEMCPY_DTOH_PINNED = 7) in Memory [device] {
            /// Source.
            src: u64,
            /// Destination: an offset in the pinned pool.
            offset: u64,
            /// Bytes.
            len: u64 = at_most(MAX_LEN),
            /// Stream.
            stream: u64,
        };
        /// Copy host to device; `len` bytes follow in data chunks.
        MemcpyHtoD (MEMCPY_HTOD = 13) in Memory [device] data(len) {
            /// Destination.
            dst: u64,
            /// Total bytes.
            len: u64 = at_most(MAX_LEN),
            /// Stream.
            stream: u64,
        };
        /// Copy device to host; the reply's data carries the bytes (chunked).
        MemcpyDtoH (MEMCPY_DTOH = 14) in Memory [reply device drains] {
            /// Source.
            src: u64,
            /// Bytes.
            len: u64 = at_most(MAX_LEN),
            /// Stream.
            stream: u64,
        };
        /// Copy device to device.
        MemcpyDtoD (MEMCPY_DTOD = 15) in Memory [device] {
            /// Destination.
            dst: u64,
            /// Source.
            src: u64,
            /// Bytes.
            len: u64 = at_most(MAX_LEN),
            /// Stream.
            stream: u64,
        };
        /// Fill memory with a value of `width` bytes (1, 2 or 4).
        Memset (MEMSET = 16) in Memory [device] {
            /// Destination.
            dst: u64,
            /// Value (low `width` bytes used).
            value: u32,
            /// 1, 2 or 4.
            width: u32 = elem_width,
            /// Number of elements.
            count: u64 = at_most(MAX_LEN / u64::from(width)),
            /// Stream.
            stream: u64,
        };
        /// Load a module; the image follows in data chunks.
        ModuleLoad (MODULE_LOAD = 20) in Module [reply] data(len) {
            /// Image kind.
            kind: ImageKind,
            /// Image length.
            len: u64 = some_at_most(MAX_IMAGE, "empty image"),
        };
        /// Unload a module.
        ModuleUnload (MODULE_UNLOAD = 21) in Module [reply] {
            /// Module handle.
            module: u64,
        };
        /// Look a kernel up by name (name in data); reply: handle, and each
        /// parameter's size and offset ([`Param::encode_all`](crate::Param::encode_all)) in data.
        ModuleGetFunction (MODULE_GET_FUNCTION = 22) in Module [reply] {
            /// Module handle.
            module: u64,
        };
        /// A kernel attribute (`CUfunction_attribute` 0..=9; reply: the value as i32).
        FuncGetAttribute (FUNC_GET_ATTRIBUTE = 23) in Module [reply] {
            /// Function handle.
            func: u64,
            /// The attribute.
            attr: u32 = known_func_attr,
        };
        /// Resident blocks per multiprocessor for a block size (reply: i32).
        Occupancy (OCCUPANCY = 24) in Module [reply] {
            /// Function handle.
            func: u64,
            /// Threads per block.
            block_size: u32 = threads,
            /// Dynamic shared memory per block.
            shared_mem: u32 = smem,
        };
        /// The most dynamic shared memory a block may use with `num_blocks`
        /// blocks of `block_size` threads resident per multiprocessor (reply: bytes).
        OccupancySmem (OCCUPANCY_SMEM = 28) in Module [reply] {
            /// Function handle.
            func: u64,
            /// Blocks per multiprocessor.
            num_blocks: u32 = blocks,
            /// Threads per block.
            block_size: u32 = threads,
        };
        /// Thread block clusters of a launch shape: the most that can be
        /// resident at once (`potential` false, cuOccupancyMaxActiveClusters;
        /// `cluster` all zero means the kernel's own cluster dimensions), or the
        /// largest cluster size the shape can use (`potential` true,
        /// cuOccupancyMaxPotentialClusterSize). Reply: i32.
        OccupancyClusters (OCCUPANCY_CLUSTERS = 29) in Module [reply] {
            /// Function handle.
            func: u64,
            /// Grid.
            grid: Dim3,
            /// Block.
            block: Dim3,
            /// Cluster dimensions (all zero: none given).
            cluster: Dim3,
            /// Dynamic shared memory per block.
            shared_mem: u32 = occupancy_shape(grid, block, cluster),
            /// Which question.
            potential: bool,
        };
        /// A tensor-map descriptor encoded by the host's driver: the data is a
        /// [`tensor_map::TensorMapParams`](crate::tensor_map::TensorMapParams), the reply's data the 128 bytes.
        TensorMapEncode (TENSOR_MAP_ENCODE = 90) in Module [reply];
        /// Load a module image the host may hold already: by its
        /// [`image_hash`](crate::image_hash). Reply: the module handle, or `NotFound` (then the
        /// guest sends the image with `ModuleLoad`).
        ModuleLoadCached (MODULE_LOAD_CACHED = 91) in Module [reply] {
            /// PTX or cubin.
            kind: ImageKind,
            /// The image's length.
            len: u64 = some_at_most(MAX_IMAGE, "empty image"),
            /// Its SHA-256.
            hash: [u8; 32],
        };
        /// The names of a module's kernels (cuModuleEnumerateFunctions), from
        /// the `first`th on in a stable order. Reply: how many the module has;
        /// data: as many of the names from `first` on as fit in one message,
        /// each NUL-terminated (none when `first` is past the end).
        ModuleFunctions (MODULE_FUNCTIONS = 92) in Module [reply] {
            /// Module handle.
            module: u64,
            /// Index of the first name wanted.
            first: u32,
        };
        /// Build and instantiate a graph on the host: `len` bytes of
        /// [`graph`](crate::graph) data follow. Reply: the executable's handle.
        GraphInstantiate (GRAPH_INSTANTIATE = 93) in Graph [reply] data(len) {
            /// Bytes of graph data.
            len: u32,
        };
        /// Launch an executable graph into a stream (asynchronous).
        GraphLaunch (GRAPH_LAUNCH = 94) in Graph [device] {
            /// The executable's handle.
            exec: u64,
            /// Stream handle (0 = default).
            stream: u64,
        };
        /// Destroy an executable graph.
        GraphDestroy (GRAPH_DESTROY = 95) in Graph [reply] {
            /// The executable's handle.
            exec: u64,
        };
        /// Make a conditional scope: the host's twin of a guest graph that
        /// holds conditional handles (on a GPU, an empty CUDA graph the handles
        /// are made in). Reply: the scope's handle.
        CondScopeCreate (COND_SCOPE_CREATE = 97) in Graph [reply];
        /// Make a conditional handle in a scope (cuGraphConditionalHandleCreate).
        /// Reply: the handle's value, which kernels take as a parameter.
        CondHandleCreate (COND_HANDLE_CREATE = 98) in Graph [reply] {
            /// The scope's handle.
            scope: u64,
            /// The value it takes at the start of each launch (with `flags` 1).
            default_value: u32,
            /// 0, or `CU_GRAPH_COND_ASSIGN_DEFAULT` (1).
            flags: u32 = cond_flags,
        };
        /// Destroy a scope (its executables stay valid).
        CondScopeDestroy (COND_SCOPE_DESTROY = 99) in Graph [reply] {
            /// The scope's handle.
            scope: u64,
        };
        /// Build and instantiate a graph in a scope: its conditional nodes use
        /// the scope's handles. `len` bytes of [`graph`](crate::graph) data
        /// follow. Reply: the executable's handle (launched and destroyed as
        /// `GraphInstantiate`'s).
        GraphInstantiateIn (GRAPH_INSTANTIATE_IN = 101) in Graph [reply] data(len) {
            /// The scope's handle.
            scope: u64,
            /// Bytes of graph data.
            len: u32,
        };
        /// Address and size of a module's global variable (name in data).
        ModuleGetGlobal (MODULE_GET_GLOBAL = 25) in Module [reply] {
            /// Module handle.
            module: u64,
        };
        /// Link images into one (cuLink*): `len` bytes of records follow, each
        /// `[input type u32][length u32][bytes]`; the reply's data is the linked image.
        Link (LINK = 26) in Module [reply] data(len) {
            /// Total bytes of records.
            len: u64 = some_at_most(MAX_IMAGE, "nothing to link"),
        };
        /// Launch a kernel; the parameter bytes, packed in order, are the data.
        Launch (LAUNCH = 30) in Launch [device] {
            /// Function handle.
            func: u64,
            /// Grid.
            grid: Dim3,
            /// Block.
            block: Dim3,
            /// Dynamic shared memory.
            shared_mem: u32 = shape(grid, block),
            /// Stream.
            stream: u64,
            /// Thread block cluster dimensions (all zero: none).
            cluster: Dim3 = divides(grid),
            /// [`launch_flags`](crate::launch_flags).
            flags: u32 = launch_flags,
        };
        /// Run guest host function `id` in `stream`'s order: once the work
        /// submitted to the stream before it is done, the host hands `id` to
        /// the process's `WaitHostFn`, and runs none of the process's later
        /// requests until `HostFnDone`. No reply.
        HostFn (HOST_FN = 45) in Launch [device] {
            /// Stream.
            stream: u64,
            /// The guest's number for the function.
            id: u64,
        };
        /// Waits (up to about a second) for a host function to run; reply:
        /// its id (0: none yet) and, in the status, the error of the work
        /// before it if any. Not numbered (tag 0): a process's callback
        /// thread sends it on a channel of its own.
        WaitHostFn (WAIT_HOST_FN = 46) in Launch [reply unnumbered];
        /// Takes the process's kernel output the host holds (what its
        /// kernels printed, and the driver's assert messages), a message's
        /// worth; reply: value 0 its stream (1: standard output, 2: standard
        /// error, 0: nothing held) and the bytes as data. Sent when a reply
        /// carries [`REPLY_OUTPUT`](crate::REPLY_OUTPUT).
        TakeOutput (TAKE_OUTPUT = 48) in Session [reply];
        /// The host function handed out has run: the process's later requests
        /// go on. Not numbered (tag 0); no reply.
        HostFnDone (HOST_FN_DONE = 47) in Launch [unnumbered] {
            /// Its id.
            id: u64,
        };
        /// Create a stream.
        StreamCreate (STREAM_CREATE = 40) in Stream [reply] {
            /// CU_STREAM_* flags.
            flags: u32 = stream_flags,
            /// Priority (lower is higher; the driver clamps it to its range).
            priority: i32 = stream_priority,
        };
        /// Make a stream's later work wait for an event's last record.
        StreamWaitEvent (STREAM_WAIT_EVENT = 44) in Stream [device] {
            /// The stream that waits.
            stream: u64,
            /// The event.
            event: u64,
            /// CU_EVENT_WAIT_* flags.
            flags: u32 = wait_flags,
        };
        /// Set a kernel attribute (`CUfunction_attribute`: the dynamic shared
        /// memory limit, the carveout, cluster requirements).
        FuncSetAttribute (FUNC_SET_ATTRIBUTE = 27) in Module [reply] {
            /// Function handle.
            func: u64,
            /// The attribute.
            attr: u32 = settable_func_attr,
            /// Its value.
            value: i32 = func_attr_value(attr),
        };
        /// A limit of the context (`CUlimit` 0..=MAX_LIMIT; reply: the value).
        CtxGetLimit (CTX_GET_LIMIT = 3) in Stream [reply] {
            /// The limit.
            limit: u32 = at_most(MAX_LIMIT),
        };
        /// Sets a limit of the context.
        CtxSetLimit (CTX_SET_LIMIT = 4) in Stream [reply] {
            /// The limit.
            limit: u32 = at_most(MAX_LIMIT),
            /// Its value.
            value: u64 = at_most(MAX_LEN),
        };
        /// Sets an attribute of a stream (`cuStreamSetAttribute`): the host's
        /// stream takes it, and so every kernel launched into it.
        StreamSetAttribute (STREAM_SET_ATTRIBUTE = 56) in Stream [reply] {
            /// Stream handle (0: the default stream).
            stream: u64,
            /// The attribute and its value, checked.
            attr: StreamAttr,
        };
        /// An attribute of a stream as the host's stream has it (reply: the
        /// value's [`crate::stream_attr::RAW_LEN`] bytes in `vals`, little-endian).
        StreamGetAttribute (STREAM_GET_ATTRIBUTE = 57) in Stream [reply] {
            /// Stream handle (0: the default stream).
            stream: u64,
            /// One of [`crate::stream_attr::id::ALL`].
            attr: u32 = stream_attr_id,
        };
        /// Destroy a stream.
        StreamDestroy (STREAM_DESTROY = 41) in Stream [reply] {
            /// Stream handle.
            stream: u64,
        };
        /// Wait for a stream.
        StreamSynchronize (STREAM_SYNCHRONIZE = 42) in Stream [reply drains] {
            /// Stream handle.
            stream: u64,
        };
        /// Whether a stream is idle (`NotReady` if not).
        StreamQuery (STREAM_QUERY = 43) in Stream [reply] {
            /// Stream handle.
            stream: u64,
        };
        /// Create an event.
        EventCreate (EVENT_CREATE = 50) in Stream [reply] {
            /// CU_EVENT_* flags.
            flags: u32,
        };
        /// Destroy an event.
        EventDestroy (EVENT_DESTROY = 51) in Stream [reply] {
            /// Event handle.
            event: u64,
        };
        /// Record an event on a stream.
        EventRecord (EVENT_RECORD = 52) in Stream [device] {
            /// Event.
            event: u64,
            /// Stream.
            stream: u64,
        };
        /// Wait for an event.
        EventSynchronize (EVENT_SYNCHRONIZE = 53) in Stream [reply drains] {
            /// Event.
            event: u64,
        };
        /// Whether an event completed.
        EventQuery (EVENT_QUERY = 54) in Stream [reply] {
            /// Event.
            event: u64,
        };
        /// Milliseconds between two recorded events (reply value: f32 bits).
        EventElapsedTime (EVENT_ELAPSED_TIME = 55) in Stream [reply] {
            /// Start event.
            start: u64,
            /// End event.
            end: u64,
        };
        /// Reserves device address space for the process's own mappings
        /// (cuMemAddressReserve; reply: its address).
        VmmReserve (VMM_RESERVE = 80) in Vmm [reply] {
            /// Bytes (a multiple of [`VMM_GRANULARITY`](crate::VMM_GRANULARITY)).
            size: u64 = vmm,
            /// Alignment: 0 (the default) or a power of two.
            align: u64 = vmm_align,
            /// The address asked for: 0 for any, else a multiple of the
            /// granularity; a hint the host's driver may not take.
            addr: u64 = vmm_hint(size),
        };
        /// Gives back a whole reservation with nothing mapped in it.
        VmmAddressFree (VMM_ADDRESS_FREE = 81) in Vmm [reply] {
            /// Its address.
            ptr: u64 = vmm,
            /// Its size.
            size: u64 = vmm,
        };
        /// Physical device memory (cuMemCreate; reply: its handle, and the
        /// compression type the driver gave it, read back from the driver),
        /// counted against the vGPU's memory limit.
        VmmCreate (VMM_CREATE = 82) in Vmm [reply] {
            /// Bytes (a multiple of [`VMM_GRANULARITY`](crate::VMM_GRANULARITY)).
            size: u64 = vmm,
            /// `CUmemAllocationCompType` asked for: 0 (none) or
            /// [`VMM_COMPRESSION_GENERIC`](crate::VMM_COMPRESSION_GENERIC).
            compression: u8 = comp_type,
        };
        /// Lets go of a handle; the memory goes once nothing maps it either.
        VmmRelease (VMM_RELEASE = 83) in Vmm [reply] {
            /// The handle.
            handle: u64,
        };
        /// Maps `size` bytes of a handle from `offset` at `ptr`, in one of the
        /// process's reservations, over nothing mapped; readable and writable
        /// from the device.
        VmmMap (VMM_MAP = 84) in Vmm [reply] {
            /// Where.
            ptr: u64 = vmm,
            /// Bytes.
            size: u64 = vmm,
            /// Offset in the handle's memory.
            offset: u64 = vmm_offset,
            /// The handle.
            handle: u64,
        };
        /// Unmaps whole mappings that cover `[ptr, ptr + size)` exactly.
        VmmUnmap (VMM_UNMAP = 85) in Vmm [reply] {
            /// Start.
            ptr: u64 = vmm,
            /// Bytes.
            size: u64 = vmm,
        };
        /// Sets the device's access to mapped memory (1: read, 3: read-write).
        VmmSetAccess (VMM_SET_ACCESS = 86) in Vmm [reply] {
            /// Start.
            ptr: u64 = vmm,
            /// Bytes.
            size: u64 = vmm,
            /// `CUmemAccess_flags`.
            flags: u32 = access_flags,
        };
        /// The handle of the memory mapped at `ptr`, retained once more
        /// (reply: the handle, its size and its compression type).
        VmmRetain (VMM_RETAIN = 87) in Vmm [reply] {
            /// An address inside a mapping.
            ptr: u64,
        };
        /// Exports the allocation (or VMM mapping) holding `ptr` to the other
        /// processes of the VM (`cuIpcGetMemHandle`); reply: a token naming
        /// it, its start and its size. The same memory gets the same token.
        IpcExport (IPC_EXPORT = 60) in Ipc [reply] {
            /// An address inside the caller's allocation.
            ptr: u64,
        };
        /// Opens memory another process of the VM exported
        /// (`cuIpcOpenMemHandle`); reply: its start and size, at which the
        /// caller reaches it until it closes it or the exporter lets it go.
        IpcOpen (IPC_OPEN = 61) in Ipc [reply] {
            /// The exporter's token.
            token: u64,
        };
        /// The vGPU as a monitor sees it (NVML in the guest): asked on a
        /// channel that has not said `Hello` (no session, no context). Reply:
        /// the memory limit, the memory the vGPU's processes hold, its share
        /// of the GPU over the last interval (parts per million) and how many
        /// processes it serves; data: a [`crate::VgpuStatus`] with the device
        /// and, from the `first`th on, as many processes as fit.
        VgpuStatus (VGPU_STATUS = 96) in Session [reply] {
            /// Index of the first process wanted (at most [`crate::MAX_STATUS_PROCESSES`]).
            first: u32 = at_most(MAX_STATUS_PROCESSES),
        };
        /// Closes memory opened with `IpcOpen` (`cuIpcCloseMemHandle`).
        IpcClose (IPC_CLOSE = 62) in Ipc [reply] {
            /// The start `IpcOpen` answered.
            ptr: u64,
        };
        /// Exports one of the caller's events to the other processes of the
        /// VM (`cuIpcGetEventHandle`); reply: a token naming it.
        IpcExportEvent (IPC_EXPORT_EVENT = 63) in Ipc [reply] {
            /// The event.
            event: u64,
        };
        /// Opens an event another process of the VM exported
        /// (`cuIpcOpenEventHandle`); reply: an event handle of the caller's,
        /// which `EventDestroy` lets go of.
        IpcOpenEvent (IPC_OPEN_EVENT = 64) in Ipc [reply] {
            /// The exporter's token.
            token: u64,
        };
        /// Exports physical memory the caller holds a handle of
        /// (`cuMemExportToShareableHandle`, a POSIX file descriptor in the
        /// guest that carries the token); reply: a token naming it and its
        /// size. The same memory gets the same token while it is exported.
        VmmExport (VMM_EXPORT = 88) in Share [reply] {
            /// The caller's handle.
            handle: u64,
        };
        /// Imports physical memory another process of the VM exported
        /// (`cuMemImportFromShareableHandle`); reply: a handle of the
        /// caller's for it (released with `VmmRelease`) and its size. The
        /// memory stays counted to its exporter.
        VmmImport (VMM_IMPORT = 89) in Share [reply] {
            /// The exporter's token (never 0).
            token: u64 = nonzero,
        };
        /// Exports one of the caller's memory pools (made with a POSIX file
        /// descriptor handle type; `cuMemPoolExportToShareableHandle`); reply:
        /// a token naming it.
        PoolExport (POOL_EXPORT = 65) in Share [reply] {
            /// The guest's pool handle (never 0).
            pool: u64 = nonzero,
        };
        /// Imports a pool another process of the VM exported
        /// (`cuMemPoolImportFromShareableHandle`): pointers exported from it
        /// may be imported through it from then on.
        PoolImport (POOL_IMPORT = 66) in Share [reply] {
            /// The exporter's pool token (never 0).
            token: u64 = nonzero,
        };
        /// Exports an allocation of one of the caller's exported pools
        /// (`cuMemPoolExportPointer`); reply: a token naming it, its start
        /// and size (the allocation is opened as `IpcOpen` opens, and closed
        /// with `IpcClose`).
        PoolExportPointer (POOL_EXPORT_POINTER = 67) in Share [reply] {
            /// The pool's token (from `PoolExport`, never 0).
            pool: u64 = nonzero,
            /// An address inside the allocation.
            ptr: u64,
        };
        /// Imports an allocation exported from a pool the caller imported
        /// (`cuMemPoolImportPointer`); reply: its start and size.
        PoolImportPointer (POOL_IMPORT_POINTER = 68) in Share [reply] {
            /// The pool's token (from `PoolImport`, never 0).
            pool: u64 = nonzero,
            /// The allocation's token (from `PoolExportPointer`, never 0).
            token: u64 = nonzero,
        };
        /// A CUDA array (`cuArray3DCreate`), counted against the vGPU's memory
        /// limit; reply: its handle and the bytes counted.
        ArrayCreate (ARRAY_CREATE = 70) in Arrays [reply] {
            /// What it is.
            desc: ArrayDesc,
        };
        /// Destroys one of the caller's arrays.
        ArrayDestroy (ARRAY_DESTROY = 71) in Arrays [reply] {
            /// Its handle.
            array: u64,
        };
        /// A box copy with an array at one end or both, in `stream`'s order.
        ArrayCopy (ARRAY_COPY = 72) in Arrays [reply device] {
            /// The box and its ends.
            copy: ArrayCopy,
            /// Stream.
            stream: u64,
        };
        /// A texture object (`cuTexObjectCreate`): the data is a
        /// [`array::TexParams`](crate::array::TexParams). Reply: the host
        /// driver's object value, which kernels take as a parameter.
        TexCreate (TEX_CREATE = 73) in Arrays [reply];
        /// Destroys one of the caller's texture objects.
        TexDestroy (TEX_DESTROY = 74) in Arrays [reply] {
            /// The value `TexCreate` answered.
            obj: u64,
        };
        /// A surface object over one of the caller's arrays
        /// (`cuSurfObjectCreate`; the driver makes one over an array without
        /// `SURFACE_LDST` too, measured on an H100); reply: the object value.
        SurfCreate (SURF_CREATE = 75) in Arrays [reply] {
            /// The array.
            array: u64,
        };
        /// Destroys one of the caller's surface objects.
        SurfDestroy (SURF_DESTROY = 76) in Arrays [reply] {
            /// The value `SurfCreate` answered.
            obj: u64,
        };
    }
}
