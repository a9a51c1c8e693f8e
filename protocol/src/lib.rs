//! The messages between the guest library and the host worker.
//!
//! A message is a descriptor's opcode plus its 88-byte inline payload, in a
//! fixed little-endian layout, plus optional bulk data in the arena (a PTX
//! image, kernel parameters, the bytes of a copy). [`Request::decode`] is the
//! only way the host turns guest bytes into a request: it checks the opcode,
//! every enum value, every length and every launch dimension, and refuses
//! anything else with a [`ProtoError`] — it never panics on any input.

#![warn(missing_docs)]

mod codec;
pub mod fatbin;
pub mod status;
pub mod tensor_map;

pub use codec::{Reader, Writer};
pub use status::Status;

/// Size of the inline payload (must equal the transport's `INLINE_SIZE`).
pub const INLINE: usize = 88;
/// Version of this message set, exchanged in `Hello`.
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest single allocation or copy the host accepts (1 TiB).
pub const MAX_LEN: u64 = 1 << 40;
/// Largest module image or kernel name.
pub const MAX_IMAGE: u64 = 256 << 20;
/// Highest `CUfunction_attribute` forwarded (MAX_THREADS_PER_BLOCK ..
/// CLUSTER_SCHEDULING_POLICY_PREFERENCE).
pub const MAX_FUNC_ATTRIBUTE: u32 = 15;
/// Highest `CUlimit` forwarded (STACK_SIZE .. PERSISTING_L2_CACHE_SIZE).
pub const MAX_LIMIT: u32 = 6;
/// Most blocks in a thread block cluster (Hopper's non-portable limit).
pub const MAX_CLUSTER_BLOCKS: u64 = 16;
/// `Launch` flags.
pub mod launch_flags {
    /// A cooperative launch: every block resident at once (grid-wide sync).
    pub const COOPERATIVE: u32 = 1;
}
/// Input types of `Link` records (`CUjitInputType`).
pub mod link_input {
    #![allow(missing_docs)]
    pub const CUBIN: u32 = 0;
    pub const PTX: u32 = 1;
    pub const FATBINARY: u32 = 2;
}

/// Parses `Link` records; an error for any record that does not fit.
pub fn link_records(data: &[u8]) -> Result<Vec<(u32, &[u8])>, ProtoError> {
    let mut r = Reader::new(data);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        let kind = r.u32()?;
        if kind > link_input::FATBINARY {
            return Err(bad(
                "link input",
                format!("input type {kind} not supported"),
            ));
        }
        let len = r.u32()? as usize;
        out.push((kind, r.bytes(len)?));
    }
    Ok(out)
}

/// Size and address granularity of the virtual memory management requests
/// (`Vmm*`: the driver's minimum granularity for device memory, 2 MiB).
pub const VMM_GRANULARITY: u64 = 2 << 20;

/// A VMM size (at most [`MAX_LEN`]) or address: nonzero, a multiple of
/// [`VMM_GRANULARITY`].
fn check_vmm(field: &'static str, v: u64) -> Result<u64, ProtoError> {
    let max = if field == "size" { MAX_LEN } else { u64::MAX };
    if v == 0 || !v.is_multiple_of(VMM_GRANULARITY) || v > max {
        return Err(bad(
            field,
            format!("{v:#x} is not a nonzero multiple of 2 MiB"),
        ));
    }
    Ok(v)
}

/// Largest kernel parameter buffer (CUDA's limit is 32,764 bytes).
pub const MAX_PARAMS: u64 = 32_764;

/// Why bytes from a guest are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The opcode is not one we know.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u32),
    /// A field has a value the protocol does not allow.
    #[error("field {field}: {why}")]
    BadField {
        /// Field name.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Reading past the inline payload.
    #[error("message truncated")]
    Truncated,
}

fn bad(field: &'static str, why: impl Into<String>) -> ProtoError {
    ProtoError::BadField {
        field,
        why: why.into(),
    }
}

/// Which kind of module image follows in the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// PTX text.
    Ptx,
    /// A cubin or fatbin.
    Cubin,
}

/// Where a kernel parameter lies in the kernel's parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Param {
    /// Byte offset in the parameter buffer (as the C ABI lays it out).
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

impl Param {
    /// Encodes a kernel's parameters for `ModuleGetFunction`'s reply data.
    pub fn encode_all(params: &[Param]) -> Vec<u8> {
        params
            .iter()
            .flat_map(|p| {
                p.size
                    .to_le_bytes()
                    .into_iter()
                    .chain(p.offset.to_le_bytes())
            })
            .collect()
    }

    /// Decodes `ModuleGetFunction`'s reply data.
    pub fn decode_all(data: &[u8]) -> Vec<Param> {
        data.chunks_exact(8)
            .map(|c| Param {
                size: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                offset: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect()
    }
}

/// Launch geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dim3 {
    /// x
    pub x: u32,
    /// y
    pub y: u32,
    /// z
    pub z: u32,
}

impl Dim3 {
    /// Product of the three, as u64, saturating: the dimensions come from the
    /// guest, and a wrapped product could pass a bounds check.
    pub fn count(&self) -> u64 {
        (u64::from(self.x) * u64::from(self.y)).saturating_mul(u64::from(self.z))
    }
}

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
    /// parameter's size and offset ([`Param::encode_all`]) in data.
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
    /// [`tensor_map::TensorMapParams`], the reply's data the 128 bytes.
    TensorMapEncode,
    /// Load a module image the host may hold already: by its
    /// [`image_hash`]. Reply: the module handle, or `NotFound` (then the
    /// guest sends the image with `ModuleLoad`).
    ModuleLoadCached {
        /// PTX or cubin.
        kind: ImageKind,
        /// The image's length.
        len: u64,
        /// Its SHA-256.
        hash: [u8; 32],
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
        /// [`launch_flags`].
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
        /// Bytes (a multiple of [`VMM_GRANULARITY`]).
        size: u64,
        /// Alignment: 0 (the default) or a power of two.
        align: u64,
    },
    /// Gives back a whole reservation with nothing mapped in it.
    VmmAddressFree {
        /// Its address.
        ptr: u64,
        /// Its size.
        size: u64,
    },
    /// Physical device memory (cuMemCreate; reply: its handle), counted
    /// against the vGPU's memory limit.
    VmmCreate {
        /// Bytes (a multiple of [`VMM_GRANULARITY`]).
        size: u64,
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
    /// (reply: the handle and its size).
    VmmRetain {
        /// An address inside a mapping.
        ptr: u64,
    },
}

/// Module images this large or larger are cached on the host and asked for
/// by hash first (`ModuleLoadCached`); smaller ones cost less to send than
/// to ask for.
pub const CACHED_IMAGE: u64 = 64 << 10;

/// The content hash a module image is cached by on the host (SHA-256).
pub fn image_hash(image: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(image).into()
}

/// Opcodes on the wire.
pub mod op {
    #![allow(missing_docs)]
    pub const HELLO: u32 = 1;
    pub const JOIN: u32 = 5;
    pub const CTX_SYNCHRONIZE: u32 = 2;
    pub const MEM_ALLOC: u32 = 10;
    pub const MEM_FREE: u32 = 11;
    pub const MEM_GET_INFO: u32 = 12;
    pub const MEM_FREE_ASYNC: u32 = 17;
    pub const PINNED_ALLOC: u32 = 18;
    pub const PINNED_FREE: u32 = 19;
    pub const MEMCPY_HTOD_PINNED: u32 = 6;
    pub const MEMCPY_DTOH_PINNED: u32 = 7;
    pub const MEMCPY_HTOD: u32 = 13;
    pub const MEMCPY_DTOH: u32 = 14;
    pub const MEMCPY_DTOD: u32 = 15;
    pub const MEMSET: u32 = 16;
    pub const MODULE_LOAD: u32 = 20;
    pub const MODULE_UNLOAD: u32 = 21;
    pub const MODULE_GET_FUNCTION: u32 = 22;
    pub const FUNC_GET_ATTRIBUTE: u32 = 23;
    pub const OCCUPANCY: u32 = 24;
    pub const MODULE_GET_GLOBAL: u32 = 25;
    pub const OCCUPANCY_SMEM: u32 = 28;
    pub const OCCUPANCY_CLUSTERS: u32 = 29;
    pub const TENSOR_MAP_ENCODE: u32 = 90;
    pub const MODULE_LOAD_CACHED: u32 = 91;
    pub const LINK: u32 = 26;
    pub const FUNC_SET_ATTRIBUTE: u32 = 27;
    pub const CTX_GET_LIMIT: u32 = 3;
    pub const CTX_SET_LIMIT: u32 = 4;
    pub const LAUNCH: u32 = 30;
    pub const STREAM_CREATE: u32 = 40;
    pub const STREAM_DESTROY: u32 = 41;
    pub const STREAM_SYNCHRONIZE: u32 = 42;
    pub const STREAM_QUERY: u32 = 43;
    pub const STREAM_WAIT_EVENT: u32 = 44;
    pub const HOST_FN: u32 = 45;
    pub const WAIT_HOST_FN: u32 = 46;
    pub const HOST_FN_DONE: u32 = 47;
    pub const EVENT_CREATE: u32 = 50;
    pub const EVENT_DESTROY: u32 = 51;
    pub const EVENT_RECORD: u32 = 52;
    pub const EVENT_SYNCHRONIZE: u32 = 53;
    pub const EVENT_QUERY: u32 = 54;
    pub const EVENT_ELAPSED_TIME: u32 = 55;
    pub const VMM_RESERVE: u32 = 80;
    pub const VMM_ADDRESS_FREE: u32 = 81;
    pub const VMM_CREATE: u32 = 82;
    pub const VMM_RELEASE: u32 = 83;
    pub const VMM_MAP: u32 = 84;
    pub const VMM_UNMAP: u32 = 85;
    pub const VMM_SET_ACCESS: u32 = 86;
    pub const VMM_RETAIN: u32 = 87;
    /// A continuation chunk of the previous message's data.
    pub const DATA: u32 = 100;
}

/// A cluster shape: none (all zero), or every dimension set, at most
/// [`MAX_CLUSTER_BLOCKS`] blocks, dividing the grid.
fn check_cluster(grid: Dim3, cluster: Dim3) -> Result<(), ProtoError> {
    if cluster == Dim3::default() {
        return Ok(());
    }
    let dims = [
        (grid.x, cluster.x),
        (grid.y, cluster.y),
        (grid.z, cluster.z),
    ];
    if cluster.count() > MAX_CLUSTER_BLOCKS || dims.iter().any(|&(g, c)| c == 0 || g % c != 0) {
        return Err(bad("cluster", format!("{cluster:?} for grid {grid:?}")));
    }
    Ok(())
}

/// A module image's kind and length, as `ModuleLoad` and
/// `ModuleLoadCached` carry them.
fn read_image(r: &mut Reader<'_>) -> Result<(ImageKind, u64), ProtoError> {
    let kind = match r.u32()? {
        0 => ImageKind::Ptx,
        1 => ImageKind::Cubin,
        k => return Err(bad("kind", format!("unknown image kind {k}"))),
    };
    let len = check_len("len", r.u64()?, MAX_IMAGE)?;
    if len == 0 {
        return Err(bad("len", "empty image"));
    }
    Ok((kind, len))
}

fn write_image(w: &mut Writer<'_>, kind: ImageKind, len: u64) {
    w.u32(match kind {
        ImageKind::Ptx => 0,
        ImageKind::Cubin => 1,
    });
    w.u64(len);
}

fn write_dim(w: &mut Writer<'_>, d: Dim3) {
    w.u32(d.x);
    w.u32(d.y);
    w.u32(d.z);
}

fn read_dim(r: &mut Reader<'_>) -> Result<Dim3, ProtoError> {
    Ok(Dim3 {
        x: r.u32()?,
        y: r.u32()?,
        z: r.u32()?,
    })
}

/// A launch's grid, block and dynamic shared memory, as the wire gives them.
fn read_shape(r: &mut Reader<'_>) -> Result<(Dim3, Dim3, u32), ProtoError> {
    let grid = read_dim(r)?;
    let block = read_dim(r)?;
    let shared_mem = r.u32()?;
    check_shape(grid, block, shared_mem)?;
    Ok((grid, block, shared_mem))
}

/// The limits every launch shape is held to (those of CUDA's devices).
fn check_shape(grid: Dim3, block: Dim3, shared_mem: u32) -> Result<(), ProtoError> {
    if grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > i32::MAX as u32 {
        return Err(bad("grid", format!("{grid:?} out of range")));
    }
    if grid.y > 65_535 || grid.z > 65_535 {
        return Err(bad(
            "grid",
            format!("{grid:?}: y and z are limited to 65535"),
        ));
    }
    if block.x == 0 || block.y == 0 || block.z == 0 || block.count() > 1024 || block.z > 64 {
        return Err(bad("block", format!("{block:?} out of range")));
    }
    if shared_mem > 256 << 10 {
        return Err(bad("shared_mem", format!("{shared_mem} bytes")));
    }
    Ok(())
}

fn check_len(field: &'static str, v: u64, max: u64) -> Result<u64, ProtoError> {
    if v > max {
        return Err(bad(field, format!("{v} exceeds {max}")));
    }
    Ok(v)
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
            Link { .. } => op::LINK,
            Launch { .. } => op::LAUNCH,
            StreamCreate { .. } => op::STREAM_CREATE,
            StreamDestroy { .. } => op::STREAM_DESTROY,
            StreamSynchronize { .. } => op::STREAM_SYNCHRONIZE,
            StreamQuery { .. } => op::STREAM_QUERY,
            StreamWaitEvent { .. } => op::STREAM_WAIT_EVENT,
            HostFn { .. } => op::HOST_FN,
            WaitHostFn => op::WAIT_HOST_FN,
            HostFnDone { .. } => op::HOST_FN_DONE,
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
            _ => None,
        }
    }

    /// Encodes into an inline payload.
    pub fn encode(&self, out: &mut [u8; INLINE]) {
        use Request::*;
        let mut w = Writer::new(out);
        match *self {
            Hello { version } => w.u32(version),
            Join { token } => {
                w.u64(token[0]);
                w.u64(token[1]);
            }
            CtxSynchronize | MemGetInfo | WaitHostFn | TensorMapEncode => {}
            HostFn { stream, id } => {
                w.u64(stream);
                w.u64(id);
            }
            HostFnDone { id } => w.u64(id),
            MemAlloc { size } => w.u64(size),
            MemFree { ptr } => w.u64(ptr),
            MemFreeAsync { ptr, stream } => {
                w.u64(ptr);
                w.u64(stream);
            }
            PinnedAlloc { size } => w.u64(size),
            PinnedFree { offset } => w.u64(offset),
            MemcpyHtoDPinned {
                dst: a,
                offset,
                len,
                stream,
            }
            | MemcpyDtoHPinned {
                src: a,
                offset,
                len,
                stream,
            } => {
                w.u64(a);
                w.u64(offset);
                w.u64(len);
                w.u64(stream);
            }
            MemcpyHtoD { dst, len, stream } => {
                w.u64(dst);
                w.u64(len);
                w.u64(stream);
            }
            MemcpyDtoH { src, len, stream } => {
                w.u64(src);
                w.u64(len);
                w.u64(stream);
            }
            MemcpyDtoD {
                dst,
                src,
                len,
                stream,
            } => {
                w.u64(dst);
                w.u64(src);
                w.u64(len);
                w.u64(stream);
            }
            Memset {
                dst,
                value,
                width,
                count,
                stream,
            } => {
                w.u64(dst);
                w.u32(value);
                w.u32(width);
                w.u64(count);
                w.u64(stream);
            }
            ModuleLoadCached { kind, len, hash } => {
                write_image(&mut w, kind, len);
                for c in hash.chunks_exact(8) {
                    w.u64(u64::from_le_bytes(c.try_into().unwrap_or_default()));
                }
            }
            ModuleLoad { kind, len } => write_image(&mut w, kind, len),
            ModuleUnload { module } | ModuleGetFunction { module } => w.u64(module),
            FuncGetAttribute { func, attr } => {
                w.u64(func);
                w.u32(attr);
            }
            Occupancy {
                func,
                block_size,
                shared_mem,
            } => {
                w.u64(func);
                w.u32(block_size);
                w.u32(shared_mem);
            }
            ModuleGetGlobal { module } => w.u64(module),
            OccupancySmem {
                func,
                num_blocks,
                block_size,
            } => {
                w.u64(func);
                w.u32(num_blocks);
                w.u32(block_size);
            }
            Link { len } => w.u64(len),
            OccupancyClusters {
                func,
                grid,
                block,
                shared_mem,
                cluster,
                potential,
            } => {
                w.u64(func);
                for d in [grid, block, cluster] {
                    write_dim(&mut w, d);
                }
                w.u32(shared_mem);
                w.u32(u32::from(potential));
            }
            Launch {
                func,
                grid,
                block,
                shared_mem,
                stream,
                cluster,
                flags,
            } => {
                w.u64(func);
                write_dim(&mut w, grid);
                write_dim(&mut w, block);
                w.u32(shared_mem);
                w.u64(stream);
                write_dim(&mut w, cluster);
                w.u32(flags);
            }
            StreamCreate { flags, priority } => {
                w.u32(flags);
                w.u32(priority as u32);
            }
            EventCreate { flags } => w.u32(flags),
            StreamWaitEvent {
                stream,
                event,
                flags,
            } => {
                w.u64(stream);
                w.u64(event);
                w.u32(flags);
            }
            FuncSetAttribute { func, attr, value } => {
                w.u64(func);
                w.u32(attr);
                w.u32(value as u32);
            }
            CtxGetLimit { limit } => w.u32(limit),
            CtxSetLimit { limit, value } => {
                w.u32(limit);
                w.u64(value);
            }
            StreamDestroy { stream } | StreamSynchronize { stream } | StreamQuery { stream } => {
                w.u64(stream)
            }
            EventDestroy { event } | EventSynchronize { event } | EventQuery { event } => {
                w.u64(event)
            }
            EventRecord { event, stream } => {
                w.u64(event);
                w.u64(stream);
            }
            EventElapsedTime { start, end } => {
                w.u64(start);
                w.u64(end);
            }
            VmmReserve { size: a, align: b }
            | VmmAddressFree { ptr: a, size: b }
            | VmmUnmap { ptr: a, size: b } => {
                w.u64(a);
                w.u64(b);
            }
            VmmCreate { size: a } | VmmRelease { handle: a } | VmmRetain { ptr: a } => w.u64(a),
            VmmMap {
                ptr,
                size,
                offset,
                handle,
            } => {
                w.u64(ptr);
                w.u64(size);
                w.u64(offset);
                w.u64(handle);
            }
            VmmSetAccess { ptr, size, flags } => {
                w.u64(ptr);
                w.u64(size);
                w.u32(flags);
            }
        }
    }

    /// Decodes and validates a request. Total on every input: an error, never a panic.
    pub fn decode(opcode: u32, inline: &[u8; INLINE]) -> Result<Request, ProtoError> {
        use Request::*;
        let mut r = Reader::new(inline);
        let req = match opcode {
            op::HELLO => Hello { version: r.u32()? },
            op::JOIN => Join {
                token: [r.u64()?, r.u64()?],
            },
            op::CTX_SYNCHRONIZE => CtxSynchronize,
            op::HOST_FN => HostFn {
                stream: r.u64()?,
                id: r.u64()?,
            },
            op::WAIT_HOST_FN => WaitHostFn,
            op::HOST_FN_DONE => HostFnDone { id: r.u64()? },
            op::MEM_ALLOC => {
                let size = check_len("size", r.u64()?, MAX_LEN)?;
                if size == 0 {
                    return Err(bad("size", "zero-byte allocation"));
                }
                MemAlloc { size }
            }
            op::MEM_FREE => MemFree { ptr: r.u64()? },
            op::PINNED_ALLOC => {
                let size = check_len("size", r.u64()?, MAX_LEN)?;
                if size == 0 {
                    return Err(bad("size", "zero-byte allocation"));
                }
                PinnedAlloc { size }
            }
            op::PINNED_FREE => PinnedFree { offset: r.u64()? },
            op::MEMCPY_HTOD_PINNED => MemcpyHtoDPinned {
                dst: r.u64()?,
                offset: r.u64()?,
                len: check_len("len", r.u64()?, MAX_LEN)?,
                stream: r.u64()?,
            },
            op::MEMCPY_DTOH_PINNED => MemcpyDtoHPinned {
                src: r.u64()?,
                offset: r.u64()?,
                len: check_len("len", r.u64()?, MAX_LEN)?,
                stream: r.u64()?,
            },
            op::MEM_FREE_ASYNC => MemFreeAsync {
                ptr: r.u64()?,
                stream: r.u64()?,
            },
            op::MEM_GET_INFO => MemGetInfo,
            op::MEMCPY_HTOD => MemcpyHtoD {
                dst: r.u64()?,
                len: check_len("len", r.u64()?, MAX_LEN)?,
                stream: r.u64()?,
            },
            op::MEMCPY_DTOH => MemcpyDtoH {
                src: r.u64()?,
                len: check_len("len", r.u64()?, MAX_LEN)?,
                stream: r.u64()?,
            },
            op::MEMCPY_DTOD => MemcpyDtoD {
                dst: r.u64()?,
                src: r.u64()?,
                len: check_len("len", r.u64()?, MAX_LEN)?,
                stream: r.u64()?,
            },
            op::MEMSET => {
                let dst = r.u64()?;
                let value = r.u32()?;
                let width = r.u32()?;
                if !matches!(width, 1 | 2 | 4) {
                    return Err(bad("width", format!("{width} is not 1, 2 or 4")));
                }
                let count = check_len("count", r.u64()?, MAX_LEN / u64::from(width))?;
                Memset {
                    dst,
                    value,
                    width,
                    count,
                    stream: r.u64()?,
                }
            }
            op::MODULE_LOAD => {
                let (kind, len) = read_image(&mut r)?;
                ModuleLoad { kind, len }
            }
            op::MODULE_UNLOAD => ModuleUnload { module: r.u64()? },
            op::MODULE_GET_FUNCTION => ModuleGetFunction { module: r.u64()? },
            op::FUNC_GET_ATTRIBUTE => {
                let func = r.u64()?;
                let attr = r.u32()?;
                if attr > MAX_FUNC_ATTRIBUTE {
                    return Err(bad("attr", format!("function attribute {attr} unknown")));
                }
                FuncGetAttribute { func, attr }
            }
            op::OCCUPANCY => {
                let func = r.u64()?;
                let block_size = r.u32()?;
                if block_size == 0 || block_size > 1024 {
                    return Err(bad("block_size", format!("{block_size} threads")));
                }
                let shared_mem = r.u32()?;
                if shared_mem > 256 << 10 {
                    return Err(bad("shared_mem", format!("{shared_mem} bytes")));
                }
                Occupancy {
                    func,
                    block_size,
                    shared_mem,
                }
            }
            op::MODULE_GET_GLOBAL => ModuleGetGlobal { module: r.u64()? },
            op::TENSOR_MAP_ENCODE => TensorMapEncode,
            op::MODULE_LOAD_CACHED => {
                let (kind, len) = read_image(&mut r)?;
                let mut hash = [0u8; 32];
                for c in hash.chunks_exact_mut(8) {
                    c.copy_from_slice(&r.u64()?.to_le_bytes());
                }
                ModuleLoadCached { kind, len, hash }
            }
            op::OCCUPANCY_SMEM => {
                let func = r.u64()?;
                let num_blocks = r.u32()?;
                let block_size = r.u32()?;
                if num_blocks == 0 || num_blocks > 2048 {
                    return Err(bad("num_blocks", format!("{num_blocks} blocks")));
                }
                if block_size == 0 || block_size > 1024 {
                    return Err(bad("block_size", format!("{block_size} threads")));
                }
                OccupancySmem {
                    func,
                    num_blocks,
                    block_size,
                }
            }
            op::OCCUPANCY_CLUSTERS => {
                let func = r.u64()?;
                let grid = read_dim(&mut r)?;
                let block = read_dim(&mut r)?;
                let cluster = read_dim(&mut r)?;
                let shared_mem = r.u32()?;
                check_shape(grid, block, shared_mem)?;
                // A question, not a launch: any cluster the grid can hold
                // may be asked about (the driver answers for sizes it
                // cannot run).
                if cluster.count() > 1024 {
                    return Err(bad("cluster", format!("{cluster:?}")));
                }
                let potential = match r.u32()? {
                    0 => false,
                    1 => true,
                    v => return Err(bad("potential", format!("{v}"))),
                };
                OccupancyClusters {
                    func,
                    grid,
                    block,
                    shared_mem,
                    cluster,
                    potential,
                }
            }
            op::LINK => {
                let len = check_len("len", r.u64()?, MAX_IMAGE)?;
                if len == 0 {
                    return Err(bad("len", "nothing to link"));
                }
                Link { len }
            }
            op::LAUNCH => {
                let func = r.u64()?;
                let (grid, block, shared_mem) = read_shape(&mut r)?;
                let stream = r.u64()?;
                let cluster = read_dim(&mut r)?;
                check_cluster(grid, cluster)?;
                let flags = r.u32()?;
                if flags & !launch_flags::COOPERATIVE != 0 {
                    return Err(bad("flags", format!("unknown launch flags {flags:#x}")));
                }
                Launch {
                    func,
                    grid,
                    block,
                    shared_mem,
                    stream,
                    cluster,
                    flags,
                }
            }
            op::STREAM_CREATE => {
                let flags = r.u32()?;
                if flags > 1 {
                    return Err(bad("flags", format!("unknown stream flags {flags:#x}")));
                }
                let priority = r.u32()? as i32;
                if !(-64..=64).contains(&priority) {
                    return Err(bad("priority", format!("{priority}")));
                }
                StreamCreate { flags, priority }
            }
            op::STREAM_WAIT_EVENT => {
                let stream = r.u64()?;
                let event = r.u64()?;
                let flags = r.u32()?;
                if flags > 1 {
                    return Err(bad("flags", format!("unknown wait flags {flags:#x}")));
                }
                StreamWaitEvent {
                    stream,
                    event,
                    flags,
                }
            }
            op::FUNC_SET_ATTRIBUTE => {
                let func = r.u64()?;
                let attr = r.u32()?;
                let value = r.u32()? as i32;
                let ok = match attr {
                    8 => (0..=256 << 10).contains(&value),
                    9 => (-1..=100).contains(&value),
                    11..=13 => (0..=MAX_CLUSTER_BLOCKS as i32).contains(&value),
                    14 => (0..=1).contains(&value),
                    15 => (0..=2).contains(&value),
                    _ => {
                        return Err(bad(
                            "attr",
                            format!("function attribute {attr} is read-only"),
                        ))
                    }
                };
                if !ok {
                    return Err(bad(
                        "value",
                        format!("{value} for function attribute {attr}"),
                    ));
                }
                FuncSetAttribute { func, attr, value }
            }
            op::CTX_GET_LIMIT => CtxGetLimit {
                limit: check_len("limit", u64::from(r.u32()?), u64::from(MAX_LIMIT))? as u32,
            },
            op::CTX_SET_LIMIT => CtxSetLimit {
                limit: check_len("limit", u64::from(r.u32()?), u64::from(MAX_LIMIT))? as u32,
                value: check_len("value", r.u64()?, MAX_LEN)?,
            },
            op::STREAM_DESTROY => StreamDestroy { stream: r.u64()? },
            op::STREAM_SYNCHRONIZE => StreamSynchronize { stream: r.u64()? },
            op::STREAM_QUERY => StreamQuery { stream: r.u64()? },
            op::EVENT_CREATE => EventCreate { flags: r.u32()? },
            op::EVENT_DESTROY => EventDestroy { event: r.u64()? },
            op::EVENT_RECORD => EventRecord {
                event: r.u64()?,
                stream: r.u64()?,
            },
            op::EVENT_SYNCHRONIZE => EventSynchronize { event: r.u64()? },
            op::EVENT_QUERY => EventQuery { event: r.u64()? },
            op::EVENT_ELAPSED_TIME => EventElapsedTime {
                start: r.u64()?,
                end: r.u64()?,
            },
            op::VMM_RESERVE => {
                let size = check_vmm("size", r.u64()?)?;
                let align = r.u64()?;
                if align != 0 && (!align.is_power_of_two() || align > MAX_LEN) {
                    return Err(bad("align", format!("{align:#x}")));
                }
                VmmReserve { size, align }
            }
            op::VMM_ADDRESS_FREE => VmmAddressFree {
                ptr: check_vmm("ptr", r.u64()?)?,
                size: check_vmm("size", r.u64()?)?,
            },
            op::VMM_CREATE => VmmCreate {
                size: check_vmm("size", r.u64()?)?,
            },
            op::VMM_RELEASE => VmmRelease { handle: r.u64()? },
            op::VMM_MAP => {
                let (ptr, size) = (check_vmm("ptr", r.u64()?)?, check_vmm("size", r.u64()?)?);
                let offset = r.u64()?;
                if !offset.is_multiple_of(VMM_GRANULARITY) || offset > MAX_LEN {
                    return Err(bad("offset", format!("{offset:#x}")));
                }
                VmmMap {
                    ptr,
                    size,
                    offset,
                    handle: r.u64()?,
                }
            }
            op::VMM_UNMAP => VmmUnmap {
                ptr: check_vmm("ptr", r.u64()?)?,
                size: check_vmm("size", r.u64()?)?,
            },
            op::VMM_SET_ACCESS => {
                let (ptr, size) = (check_vmm("ptr", r.u64()?)?, check_vmm("size", r.u64()?)?);
                let flags = r.u32()?;
                if !matches!(flags, 1 | 3) {
                    return Err(bad("flags", format!("access flags {flags:#x}")));
                }
                VmmSetAccess { ptr, size, flags }
            }
            op::VMM_RETAIN => VmmRetain { ptr: r.u64()? },
            other => return Err(ProtoError::UnknownOpcode(other)),
        };
        Ok(req)
    }
}

/// A reply: the status travels in the descriptor, up to ten u64 values inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reply {
    /// Values, meaning per request (a pointer, a handle, free/total, f32 bits).
    pub vals: [u64; 4],
}

impl Reply {
    /// A reply with one value.
    pub fn one(v: u64) -> Reply {
        Reply { vals: [v, 0, 0, 0] }
    }

    /// Encodes into an inline payload.
    pub fn encode(&self, out: &mut [u8; INLINE]) {
        let mut w = Writer::new(out);
        for v in self.vals {
            w.u64(v);
        }
    }

    /// Decodes (a reply comes from the trusted host; still total).
    pub fn decode(inline: &[u8; INLINE]) -> Reply {
        let mut r = Reader::new(inline);
        let mut vals = [0u64; 4];
        for v in &mut vals {
            *v = r.u64().unwrap_or(0);
        }
        Reply { vals }
    }
}

/// What `Hello` answers: the device as the guest should see it. Encoded in the
/// reply's data as little-endian fields.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Memory this vGPU may allocate (its limit).
    pub total_mem: u64,
    /// Compute capability major, minor.
    pub cc: (u32, u32),
    /// Multiprocessors.
    pub sm_count: u32,
    /// `(CUdevice_attribute, value)` pairs answered in the guest without a round trip.
    pub attributes: Vec<(u32, i32)>,
    /// Bytes of the region's pinned pool (0: none).
    pub pinned_size: u64,
    /// The device address of the pool's first byte (where kernels reach
    /// it); guests map the pool at this address too when they can, so that
    /// a pinned pointer is the same on both sides.
    pub pinned_base: u64,
}

impl DeviceInfo {
    /// Serializes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        let name = self.name.as_bytes();
        v.extend_from_slice(&(name.len() as u32).to_le_bytes());
        v.extend_from_slice(name);
        v.extend_from_slice(&self.total_mem.to_le_bytes());
        v.extend_from_slice(&self.cc.0.to_le_bytes());
        v.extend_from_slice(&self.cc.1.to_le_bytes());
        v.extend_from_slice(&self.sm_count.to_le_bytes());
        v.extend_from_slice(&(self.attributes.len() as u32).to_le_bytes());
        for (a, val) in &self.attributes {
            v.extend_from_slice(&a.to_le_bytes());
            v.extend_from_slice(&val.to_le_bytes());
        }
        v.extend_from_slice(&self.pinned_size.to_le_bytes());
        v.extend_from_slice(&self.pinned_base.to_le_bytes());
        v
    }

    /// Parses, bounds-checked.
    pub fn from_bytes(b: &[u8]) -> Result<DeviceInfo, ProtoError> {
        let mut r = Reader::new(b);
        let n = r.u32()? as usize;
        let name = String::from_utf8_lossy(r.bytes(n)?).into_owned();
        let total_mem = r.u64()?;
        let cc = (r.u32()?, r.u32()?);
        let sm_count = r.u32()?;
        let count = r.u32()? as usize;
        let mut attributes = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            attributes.push((r.u32()?, r.u32()? as i32));
        }
        let pinned_size = r.u64()?;
        let pinned_base = r.u64()?;
        Ok(DeviceInfo {
            name,
            total_mem,
            cc,
            sm_count,
            attributes,
            pinned_size,
            pinned_base,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Request> {
        let d = |x, y, z| Dim3 { x, y, z };
        vec![
            Request::Hello { version: 1 },
            Request::Join { token: [7, 9] },
            Request::CtxSynchronize,
            Request::MemAlloc { size: 4096 },
            Request::MemFree { ptr: 0x7000_0000 },
            Request::MemGetInfo,
            Request::MemFreeAsync { ptr: 5, stream: 6 },
            Request::PinnedAlloc { size: 4096 },
            Request::PinnedFree { offset: 8192 },
            Request::MemcpyHtoDPinned {
                dst: 1,
                offset: 2,
                len: 3,
                stream: 4,
            },
            Request::MemcpyDtoHPinned {
                src: 1,
                offset: 2,
                len: 3,
                stream: 4,
            },
            Request::MemcpyHtoD {
                dst: 1,
                len: 2,
                stream: 3,
            },
            Request::MemcpyDtoH {
                src: 1,
                len: 2,
                stream: 3,
            },
            Request::MemcpyDtoD {
                dst: 1,
                src: 2,
                len: 3,
                stream: 4,
            },
            Request::Memset {
                dst: 1,
                value: 0xabcd,
                width: 2,
                count: 9,
                stream: 0,
            },
            Request::ModuleLoad {
                kind: ImageKind::Cubin,
                len: 100,
            },
            Request::ModuleUnload { module: 5 },
            Request::ModuleGetFunction { module: 5 },
            Request::FuncGetAttribute { func: 5, attr: 4 },
            Request::Occupancy {
                func: 5,
                block_size: 256,
                shared_mem: 0,
            },
            Request::ModuleGetGlobal { module: 5 },
            Request::TensorMapEncode,
            Request::ModuleLoadCached {
                kind: ImageKind::Cubin,
                len: 1 << 20,
                hash: image_hash(b"an image"),
            },
            Request::OccupancySmem {
                func: 5,
                num_blocks: 4,
                block_size: 128,
            },
            Request::Link { len: 100 },
            Request::OccupancyClusters {
                func: 9,
                grid: d(64, 1, 1),
                block: d(128, 1, 1),
                shared_mem: 1024,
                cluster: d(4, 1, 1),
                potential: false,
            },
            Request::Launch {
                func: 9,
                grid: d(100, 2, 1),
                block: d(256, 1, 1),
                shared_mem: 0,
                stream: 7,
                cluster: d(2, 2, 1),
                flags: launch_flags::COOPERATIVE,
            },
            Request::StreamCreate {
                flags: 1,
                priority: -3,
            },
            Request::StreamWaitEvent {
                stream: 2,
                event: 3,
                flags: 0,
            },
            Request::HostFn { stream: 2, id: 9 },
            Request::WaitHostFn,
            Request::HostFnDone { id: 9 },
            Request::FuncSetAttribute {
                func: 5,
                attr: 8,
                value: 100_000,
            },
            Request::CtxGetLimit { limit: 1 },
            Request::CtxSetLimit {
                limit: 2,
                value: 1 << 26,
            },
            Request::StreamDestroy { stream: 2 },
            Request::StreamSynchronize { stream: 2 },
            Request::StreamQuery { stream: 2 },
            Request::EventCreate { flags: 0 },
            Request::EventDestroy { event: 3 },
            Request::EventRecord {
                event: 3,
                stream: 2,
            },
            Request::EventSynchronize { event: 3 },
            Request::EventQuery { event: 3 },
            Request::EventElapsedTime { start: 3, end: 4 },
            Request::VmmReserve {
                size: 4 << 20,
                align: 1 << 30,
            },
            Request::VmmAddressFree {
                ptr: 0x7f00_0000_0000,
                size: 2 << 20,
            },
            Request::VmmCreate { size: 6 << 20 },
            Request::VmmRelease { handle: 9 },
            Request::VmmMap {
                ptr: 0x7f00_0020_0000,
                size: 2 << 20,
                offset: 2 << 20,
                handle: 9,
            },
            Request::VmmUnmap {
                ptr: 0x7f00_0020_0000,
                size: 2 << 20,
            },
            Request::VmmSetAccess {
                ptr: 0x7f00_0020_0000,
                size: 2 << 20,
                flags: 3,
            },
            Request::VmmRetain {
                ptr: 0x7f00_0020_0010,
            },
        ]
    }

    #[test]
    fn every_request_round_trips() {
        for r in samples() {
            let mut b = [0u8; INLINE];
            r.encode(&mut b);
            assert_eq!(Request::decode(r.opcode(), &b).unwrap(), r);
        }
    }

    #[test]
    fn invalid_fields_are_refused() {
        let enc = |r: Request| {
            let mut b = [0u8; INLINE];
            r.encode(&mut b);
            (r.opcode(), b)
        };
        let d = |x, y, z| Dim3 { x, y, z };
        let launch = |grid, block, shared_mem| Request::Launch {
            func: 1,
            grid,
            block,
            shared_mem,
            stream: 0,
            cluster: Dim3::default(),
            flags: 0,
        };
        for (opc, b) in [
            enc(Request::MemAlloc { size: 0 }),
            enc(Request::MemAlloc { size: MAX_LEN + 1 }),
            enc(Request::Memset {
                dst: 0,
                value: 0,
                width: 3,
                count: 1,
                stream: 0,
            }),
            enc(Request::ModuleLoad {
                kind: ImageKind::Ptx,
                len: 0,
            }),
            enc(Request::ModuleLoad {
                kind: ImageKind::Ptx,
                len: MAX_IMAGE + 1,
            }),
            enc(launch(d(0, 1, 1), d(1, 1, 1), 0)),
            enc(launch(d(1, 70_000, 1), d(1, 1, 1), 0)),
            enc(launch(d(1, 1, 1), d(1025, 1, 1), 0)),
            enc(launch(d(1, 1, 1), d(32, 32, 2), 0)),
            enc(launch(d(1, 1, 1), d(1, 1, 1), 1 << 20)),
            enc(Request::Launch {
                func: 1,
                grid: d(3, 1, 1),
                block: d(1, 1, 1),
                shared_mem: 0,
                stream: 0,
                cluster: d(2, 1, 1),
                flags: 0,
            }),
            enc(Request::Launch {
                func: 1,
                grid: d(32, 1, 1),
                block: d(1, 1, 1),
                shared_mem: 0,
                stream: 0,
                cluster: d(32, 1, 1),
                flags: 0,
            }),
            enc(Request::StreamCreate {
                flags: 2,
                priority: 0,
            }),
            enc(Request::FuncSetAttribute {
                func: 1,
                attr: 0,
                value: 1,
            }),
            enc(Request::FuncSetAttribute {
                func: 1,
                attr: 9,
                value: 101,
            }),
            enc(Request::CtxSetLimit { limit: 7, value: 0 }),
            enc(Request::VmmCreate { size: 0 }),
            enc(Request::VmmCreate { size: 4096 }),
            enc(Request::VmmCreate {
                size: (3 << 20) / 2,
            }),
            enc(Request::VmmCreate {
                size: !((2 << 20) - 1),
            }),
            enc(Request::VmmReserve {
                size: 2 << 20,
                align: 3 << 20,
            }),
            enc(Request::VmmReserve { size: 0, align: 0 }),
            enc(Request::VmmAddressFree {
                ptr: 0x1000,
                size: 2 << 20,
            }),
            enc(Request::VmmMap {
                ptr: 2 << 20,
                size: 2 << 20,
                offset: 4096,
                handle: 1,
            }),
            enc(Request::VmmMap {
                ptr: 0,
                size: 2 << 20,
                offset: 0,
                handle: 1,
            }),
            enc(Request::VmmUnmap {
                ptr: 2 << 20,
                size: 1,
            }),
            enc(Request::VmmSetAccess {
                ptr: 2 << 20,
                size: 2 << 20,
                flags: 2,
            }),
            enc(Request::VmmSetAccess {
                ptr: 2 << 20,
                size: 2 << 20,
                flags: 0,
            }),
        ] {
            assert!(
                matches!(Request::decode(opc, &b), Err(ProtoError::BadField { .. })),
                "{opc}"
            );
        }
        // Found by the fuzzer: a block whose thread count overflows u64.
        let huge = launch(d(1, 1, 1), d(u32::MAX, u32::MAX, 64), 0);
        let (opc, b) = enc(huge);
        assert!(matches!(
            Request::decode(opc, &b),
            Err(ProtoError::BadField { .. })
        ));
        let mut b = [0u8; INLINE];
        b[0] = 7;
        assert!(Request::decode(op::MODULE_LOAD, &b).is_err());
        assert_eq!(
            Request::decode(9999, &b),
            Err(ProtoError::UnknownOpcode(9999))
        );
    }

    #[test]
    fn device_info_round_trips_and_truncation_is_an_error() {
        let info = DeviceInfo {
            name: "sim GPU".into(),
            total_mem: 1 << 30,
            cc: (9, 0),
            sm_count: 132,
            attributes: vec![(1, 1024), (16, 132)],
            pinned_size: 64 << 20,
            pinned_base: 0x3f00_0000_0000,
        };
        let b = info.to_bytes();
        assert_eq!(DeviceInfo::from_bytes(&b).unwrap(), info);
        for cut in 0..b.len() {
            assert!(DeviceInfo::from_bytes(&b[..cut]).is_err());
        }
    }

    proptest! {
        #[test]
        fn decode_is_total(opcode in 0u32..120, bytes in proptest::collection::vec(any::<u8>(), INLINE)) {
            let mut b = [0u8; INLINE];
            b.copy_from_slice(&bytes);
            if let Ok(r) = Request::decode(opcode, &b) {
                let mut again = [0u8; INLINE];
                r.encode(&mut again);
                prop_assert_eq!(Request::decode(r.opcode(), &again).unwrap(), r);
            }
        }

        #[test]
        fn device_info_parse_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = DeviceInfo::from_bytes(&bytes);
        }
    }
}
