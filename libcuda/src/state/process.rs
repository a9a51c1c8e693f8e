//! The process-wide tables of the driver API families that live outside
//! [`super::Objects`]: each `static` here says what it holds and which
//! module changes it. The families keep the logic; their types live here
//! so that this module imports no family.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::c_void;
use std::sync::atomic::AtomicUsize;
use std::sync::{Mutex, MutexGuard, Once, OnceLock};

use cudarc::driver::sys::CUstream;
use protocol::array::ArrayDesc;
use protocol::tensor_map::TensorMapParams;

use crate::CuResult;

/// Locks `m`, taking over a lock a panicking thread left.
pub(crate) fn lock<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// Interprocess memory and events (`ipc.rs`).

/// Events of this process made with `CU_EVENT_INTERPROCESS`: added by
/// `cuEventCreate`, removed by `cuEventDestroy` (through `ipc::event_*`).
pub(crate) static IPC_EVENTS: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());

/// Ranges this process opened from other processes' IPC handles: start ->
/// opens; changed by `cuIpcOpenMemHandle` and `cuIpcCloseMemHandle`.
pub(crate) static IPC_OPENED: Mutex<BTreeMap<u64, u32>> = Mutex::new(BTreeMap::new());

// Tensor maps (`tensor_map.rs`).

/// `CUtensorMap`: 128 bytes, 64-byte aligned.
pub(crate) type TensorMap = [u8; protocol::tensor_map::TENSOR_MAP_BYTES];

/// Descriptors `cuTensorMapEncode*` made here and their shapes (`None`
/// until the first; emptied when it reaches its bound), read by
/// `cuTensorMapReplaceAddress`.
pub(crate) static TENSOR_MAPS: Mutex<Option<HashMap<TensorMap, TensorMapParams>>> =
    Mutex::new(None);

// Stream capture (`graph/capture.rs`).

/// Streams capturing now, so that a stream's operations look no further
/// while none is: counted up by `cuStreamBeginCapture`, down by
/// `cuStreamEndCapture` (and the invalidation of a capture).
pub(crate) static CAPTURING: AtomicUsize = AtomicUsize::new(0);

// Host functions and stream callbacks (`host_fn.rs`).

/// `CUhostFn`.
pub(crate) type HostFn = unsafe extern "C" fn(*mut c_void);
/// `CUstreamCallback`.
pub(crate) type StreamCallback = unsafe extern "C" fn(CUstream, CuResult, *mut c_void);

/// A function waiting to run.
#[derive(Clone, Copy)]
pub(crate) enum Call {
    Fn(HostFn, usize),
    Callback(StreamCallback, usize, usize),
}

/// Functions queued on the host and not yet run.
#[derive(Default)]
pub(crate) struct HostFns {
    /// The last id given out.
    pub next: u64,
    /// Id -> the function to run when the host hands the id out.
    pub calls: HashMap<u64, Call>,
}

/// The host functions waiting (`None` until the first): added by
/// `host_fn::enqueue`, taken by the callback thread as the host hands
/// each out (or by `enqueue` when queuing it failed).
pub(crate) static HOST_FNS: Mutex<Option<HostFns>> = Mutex::new(None);

/// Whether the callback thread runs (false: none could be started); set by
/// the first `host_fn::enqueue`, never changed after.
pub(crate) static CALLBACK_THREAD: OnceLock<bool> = OnceLock::new();

// Virtual memory management (`vmm.rs`).

/// What the process holds, as the host answered.
#[derive(Debug)]
pub(crate) struct VmmTable {
    /// Handle -> (handles held, requested handle types).
    pub handles: BTreeMap<u64, (u32, std::ffi::c_uint)>,
    /// Mapping start -> (size, access flags set).
    pub maps: BTreeMap<u64, (u64, std::ffi::c_uint)>,
    /// Handle -> the compression type the host's driver gave its memory
    /// (handles of compressible memory only).
    pub compressed: BTreeMap<u64, u8>,
}

/// What the VMM entry points (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`,
/// their releases) hold; changed by them only.
pub(crate) static VMM: Mutex<VmmTable> = Mutex::new(VmmTable {
    handles: BTreeMap::new(),
    maps: BTreeMap::new(),
    compressed: BTreeMap::new(),
});

// Arrays, textures and surfaces (`arrays.rs`).

/// Bytes of `CUDA_RESOURCE_DESC`, `CUDA_TEXTURE_DESC`,
/// `CUDA_RESOURCE_VIEW_DESC`.
pub(crate) const RES_DESC: usize = 144;
pub(crate) const TEX_DESC: usize = 104;
pub(crate) const VIEW_DESC: usize = 112;

/// A texture object as the program described it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Texture {
    pub res: [u8; RES_DESC],
    pub tex: [u8; TEX_DESC],
    pub view: Option<[u8; VIEW_DESC]>,
}

/// The arrays and objects the process made, by handle.
#[derive(Debug)]
pub(crate) struct ArrayTable {
    pub arrays: BTreeMap<u64, ArrayDesc>,
    pub textures: BTreeMap<u64, Texture>,
    pub surfaces: BTreeMap<u64, [u8; RES_DESC]>,
}

/// What the array, texture and surface entry points made (kept to answer
/// the descriptor queries); changed by their creates and destroys.
pub(crate) static ARRAYS: Mutex<ArrayTable> = Mutex::new(ArrayTable {
    arrays: BTreeMap::new(),
    textures: BTreeMap::new(),
    surfaces: BTreeMap::new(),
});

// The managed-memory fault handler (`managed/fault.rs`).

/// The action that was installed before ours.
pub(crate) struct Prev(pub libc::sigaction);

// SAFETY: a plain C struct of function pointers and flags, written once
// before the handler can run and only read after.
unsafe impl Send for Prev {}
// SAFETY: as above.
unsafe impl Sync for Prev {}

/// The SIGSEGV action that was there before the managed-memory fault
/// handler: set once by `managed::fault::install`, read by the handler for
/// the faults that are not managed memory's.
pub(crate) static FAULT_PREV: OnceLock<Prev> = OnceLock::new();

/// Runs `managed::fault::install` once per process.
pub(crate) static FAULT_INSTALL: Once = Once::new();
