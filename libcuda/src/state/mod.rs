//! The process's driver state: the connections to the vGPU (made by
//! `cuInit`) and the tables of what the process holds, which answer many
//! calls without a round trip.
//!
//! Each thread that calls the GPU gets a channel of its own, up to
//! `FAIRVGPU_CHANNELS_PER_PROCESS` (4 by default; the region's channels are
//! shared by all of a VM's processes): a thread waiting in a synchronize
//! holds up no other thread's calls. Threads beyond that share the
//! channels. A thread keeps its channel for life (its calls stay in order
//! on it); the host runs the process's calls in the order they were made
//! across all its channels.
//!
//! Every piece of mutable state the stand-in keeps is here, each item
//! saying what it holds and who changes it:
//! - this file: [`Driver`] (made once by `cuInit`: the channels, the
//!   pinned pool, and the handle tables of [`Objects`]) and whether the
//!   process let go of its vGPU at exit;
//! - [`process`]: the other process-wide tables (streams capturing, VMM,
//!   arrays and textures, IPC, host functions, tensor maps, the fault
//!   handler's previous action);
//! - [`thread`]: every `thread_local!` (context stack, default streams,
//!   channel slot, calls in flight, capture mode and info);
//! - [`log`]: what was logged once, and whether calls are traced;
//! - [`pinned`] and [`tables`]: the entries the API families keep in
//!   [`Driver`] and [`Objects`] (the pinned pool and its blocks, memory
//!   pools, libraries), defined here so that this module names no family.
//!
//! Two tables live beside the types they hold, so that this module names
//! no API family: the graph store (`GRAPHS` in `graph/model.rs`: graphs,
//! executable graphs, captures) and the managed-memory table (`TABLE` and
//! `COUNT` in `managed/mod.rs`). The other `static`s of the crate are
//! constants: the export tables and
//! the zeroed blocks they hand out (`export_table/`), the error texts
//! (`device.rs`, built once from constant tables), and the entry-point
//! table `build.rs` makes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use guest::{Function, Gpu, GuestError};
use protocol::DeviceInfo;

use crate::{code, CuResult};

pub(crate) mod control;
pub(crate) mod log;
pub(crate) mod pinned;
pub(crate) mod process;
pub(crate) mod tables;
pub(crate) mod thread;

use thread::InCall;

/// What `cuInit` made.
pub(crate) struct Driver {
    /// The device as the host describes it.
    pub info: DeviceInfo,
    /// `CUdevice_attribute` values, cached at attach time.
    pub attrs: HashMap<u32, i32>,
    /// The connections (one per slot, made when a thread first needs it);
    /// `None` once the process let go of them at exit.
    channels: Vec<Mutex<Option<Gpu>>>,
    /// Threads bound to each slot.
    users: Vec<AtomicUsize>,
    /// Slots opened so far (0 ..= `channels.len()`), and the lock under
    /// which a thread picks or opens one.
    opened: Mutex<usize>,
    /// What opens further channels.
    joiner: Mutex<guest::Joiner>,
    /// The vGPU's pinned pool as mapped here (none if it has none).
    pool: Option<pinned::Pool>,
    /// The tables.
    objects: Mutex<Objects>,
}

/// What a device allocation or module global is, for pointer queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeKind {
    /// `cuMemAlloc` and friends.
    Device,
    /// A module's global variable (freed with its module).
    Global,
    /// Another process's memory opened by IPC handle (closed, not freed).
    Imported,
    /// Managed memory on the device (`crate::managed`), mapped in the
    /// process at the same address.
    Managed,
}

/// A device address range the process holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Range {
    pub size: u64,
    pub kind: RangeKind,
}

/// A kernel the process looked up.
#[derive(Debug, Clone)]
pub(crate) struct Kernel {
    /// Host handle and parameter sizes.
    pub func: Function,
    /// The module it came from.
    pub module: u64,
    /// Its name as looked up (`cuFuncGetName`).
    pub name: std::ffi::CString,
    /// Its `MAX_THREADS_PER_BLOCK`, once asked (0: not yet), shared by the
    /// copies of this entry so that a launch asks the host once.
    pub max_threads: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

/// A context the process made or retained. Its handle is the address of a
/// boxed `ContextCell`, so no two contexts ever share one.
#[derive(Debug, Default)]
pub(crate) struct ContextInfo {
    /// `CU_CTX_*` flags it was made with.
    pub flags: u32,
    /// Whether it is the device's primary context.
    pub primary: bool,
}

/// The destructor the runtime gives for a value it stores per context
/// (context-local storage, `export_table`).
pub(crate) type ClsDtor =
    extern "C" fn(cudarc::driver::sys::CUcontext, *mut std::ffi::c_void, *mut std::ffi::c_void);

/// What the process holds, by handle.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    pub kernels: HashMap<u64, Kernel>,
    pub contexts: HashMap<usize, ContextInfo>,
    /// The primary context's handle (0: not retained yet) and its retain count.
    pub primary: usize,
    pub primary_retains: u32,
    /// Flags set for the primary context (`cuDevicePrimaryCtxSetFlags`).
    pub primary_flags: u32,
    /// Device ranges by start address.
    pub ranges: BTreeMap<u64, Range>,
    /// Device allocations made as VMM mappings (see
    /// `alloc::device_alloc`): start -> length mapped on the host.
    pub mapped_allocs: HashMap<u64, u64>,
    /// Streams made here, with their flags and priorities.
    pub streams: HashMap<u64, (u32, i32)>,
    /// Loaded modules (and libraries, which are modules here), with the
    /// module globals looked up in each.
    pub modules: HashMap<u64, Vec<u64>>,
    /// Blocks of the pinned pool (host, registered and managed memory), by
    /// their address in the process.
    pub host: pinned::Blocks,
    /// Page-locked memory the pool could not hold, by its start in the
    /// process (`host_spill.rs`).
    pub spilled: BTreeMap<u64, pinned::Spilled>,
    /// Memory pools and stream-ordered allocations.
    pub pools: tables::Pools,
    /// Libraries by handle (loaded on the host when first used).
    pub libraries: HashMap<usize, tables::Library>,
    /// The runtime's context-local storage: (context, key) -> (value,
    /// destructor), see `export_table`.
    pub cls: HashMap<(usize, usize), (usize, Option<ClsDtor>)>,
}

impl Objects {
    /// The range holding `ptr`: (start, range).
    pub fn range_of(&self, ptr: u64) -> Option<(u64, Range)> {
        let (&base, &r) = self.ranges.range(..=ptr).next_back()?;
        (ptr < base.saturating_add(r.size)).then_some((base, r))
    }

    /// Makes a new context handle (a unique address) with `info`.
    pub fn new_context(&mut self, info: ContextInfo) -> usize {
        // The handle is an address nothing else will ever have: a leaked
        // allocation of one byte per context made (a handful per process).
        let h = Box::into_raw(Box::new(0u8)) as usize;
        self.contexts.insert(h, info);
        h
    }

    /// The primary context, made (not retained) if it does not exist yet.
    pub fn primary(&mut self) -> usize {
        if self.primary == 0 {
            let flags = self.primary_flags;
            self.primary = self.new_context(ContextInfo {
                flags,
                primary: true,
            });
        }
        self.primary
    }
}

/// The driver state: set once by the first `cuInit` ([`init`]), never
/// changed after (its parts have their own locks).
static DRIVER: OnceLock<Result<Driver, CuResult>> = OnceLock::new();

/// Gives back a thread's binding to `slot` (the thread ended).
fn unbind(slot: usize) {
    if let Some(Ok(d)) = DRIVER.get() {
        d.users[slot].fetch_sub(1, Ordering::Relaxed);
    }
}

/// Channels a process may hold (`FAIRVGPU_CHANNELS_PER_PROCESS`, 1 to 64).
fn channels_per_process() -> usize {
    std::env::var("FAIRVGPU_CHANNELS_PER_PROCESS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4usize)
        .clamp(1, 64)
}

/// Set when the process let go of its vGPU at exit: later calls answer
/// `CUDA_ERROR_DEINITIALIZED`, as the driver's do after its own teardown.
static DEINITIALIZED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the process let go of its vGPU (it is exiting).
pub(crate) fn deinitialized() -> bool {
    DEINITIALIZED.load(std::sync::atomic::Ordering::Acquire)
}

/// The error code of a failed guest call.
pub(crate) fn code_of(e: GuestError) -> CuResult {
    match e {
        GuestError::Cuda(s) => s.code(),
        GuestError::NoVgpu => code::NO_DEVICE,
        GuestError::VgpuReset => code::CONTEXT_IS_DESTROYED,
        GuestError::Transport(_) | GuestError::Protocol(_) | GuestError::Device { .. } => {
            code::UNKNOWN
        }
    }
}

/// Attaches to the vGPU once per process; later calls return the first
/// result.
pub(crate) fn init() -> CuResult {
    match DRIVER.get_or_init(attach) {
        Ok(_) => code::SUCCESS,
        Err(e) => *e,
    }
}

fn attach() -> Result<Driver, CuResult> {
    match Gpu::from_env() {
        Ok(gpu) => {
            let info = gpu.device_info().clone();
            let attrs = info.attributes.iter().copied().collect();
            // SAFETY: `release_at_exit` is an `extern "C" fn()` that never unwinds.
            unsafe { libc::atexit(release_at_exit) };
            let slots = channels_per_process();
            let joiner = gpu.joiner();
            let pool = pinned::Pool::map(gpu.region(), info.pinned_size, info.pinned_base);
            let mut channels: Vec<Mutex<Option<Gpu>>> =
                (0..slots).map(|_| Mutex::new(None)).collect();
            channels[0] = Mutex::new(Some(gpu));
            control::start();
            Ok(Driver {
                info,
                attrs,
                channels,
                users: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
                opened: Mutex::new(1),
                joiner: Mutex::new(joiner),
                pool,
                objects: Mutex::new(Objects::default()),
            })
        }
        Err(e) => {
            eprintln!("fairvgpu libcuda: cannot attach to a vGPU: {e}");
            Err(code::NO_DEVICE)
        }
    }
}

/// Lets go of the vGPU channel when the program exits normally, so that the
/// host sees a clean close (a killed program's channel is given back by the
/// kernel module or the host instead). A thread still inside a call keeps
/// the lock: then nothing is done here. Calls made after this (by other
/// atexit handlers, the CUDA runtime's teardown) answer
/// `CUDA_ERROR_DEINITIALIZED`.
extern "C" fn release_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        DEINITIALIZED.store(true, std::sync::atomic::Ordering::Release);
        if let Some(Ok(d)) = DRIVER.get() {
            for ch in &d.channels {
                if let Ok(mut g) = ch.try_lock() {
                    drop(g.take());
                }
            }
        }
    });
}

/// The driver state; `CUDA_ERROR_NOT_INITIALIZED` before a successful `cuInit`.
pub(crate) fn driver() -> Result<&'static Driver, CuResult> {
    if deinitialized() {
        return Err(code::DEINITIALIZED);
    }
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        _ => Err(code::NOT_INITIALIZED),
    }
}

impl Driver {
    /// Runs `f` on the calling thread's connection.
    pub fn gpu<R>(&self, f: impl FnOnce(&mut Gpu) -> guest::Result<R>) -> Result<R, CuResult> {
        let _in = InCall::enter();
        let slot = self.slot();
        let mut g = self.channels[slot]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let gpu = g.as_mut().ok_or(code::DEINITIALIZED)?;
        f(gpu).map_err(code_of)
    }

    /// The calling thread's slot: its own, or on its first call a slot no
    /// thread uses, a new channel while there are fewer than the cap, else
    /// the least used slot.
    fn slot(&self) -> usize {
        if let Some(s) = thread::bound_slot() {
            return s;
        }
        let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        let used = |i: usize| self.users[i].load(Ordering::Relaxed);
        let free = (0..*opened).find(|&i| used(i) == 0);
        let slot = match free {
            Some(i) => i,
            None if *opened < self.channels.len() => match self.joiner().join() {
                Ok(g) => {
                    let i = *opened;
                    *self.channels[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(g);
                    *opened += 1;
                    i
                }
                // No channel free in the region: share.
                Err(_) => (0..*opened).min_by_key(|&i| used(i)).unwrap_or(0),
            },
            None => (0..*opened).min_by_key(|&i| used(i)).unwrap_or(0),
        };
        self.users[slot].fetch_add(1, Ordering::Relaxed);
        if !thread::bind_slot(slot) {
            // The thread is ending; it keeps no binding.
            self.users[slot].fetch_sub(1, Ordering::Relaxed);
        }
        slot
    }

    /// The pinned pool as mapped here.
    pub fn pool(&self) -> Option<&pinned::Pool> {
        self.pool.as_ref()
    }

    /// What opens a further channel to the process's session.
    pub fn joiner(&self) -> guest::Joiner {
        self.joiner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Further channels open at the daemon at `to` from now on.
    pub fn follow_joiner(&self, to: &std::path::Path) {
        self.joiner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .follow(to.to_owned());
    }

    /// Holds every call of the process (`control.rs`): the lock under which
    /// a thread opens a channel, then each channel's, in the order `slot`
    /// takes them. Calls under way finish first.
    pub fn hold_every_channel(
        &'static self,
    ) -> (
        MutexGuard<'static, usize>,
        Vec<MutexGuard<'static, Option<Gpu>>>,
    ) {
        let opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        let channels = self
            .channels
            .iter()
            .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()))
            .collect();
        (opened, channels)
    }

    /// The tables (held briefly: never across a call to the host).
    pub fn objects(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Shorthand: runs `f` on the connection of the initialized driver.
pub(crate) fn gpu<R>(f: impl FnOnce(&mut Gpu) -> guest::Result<R>) -> Result<R, CuResult> {
    driver()?.gpu(f)
}

/// Shorthand: the tables of the initialized driver.
pub(crate) fn objects() -> Result<MutexGuard<'static, Objects>, CuResult> {
    Ok(driver()?.objects())
}

/// Writes `v` to the caller's out-parameter `p`.
pub(crate) fn out<T>(p: *mut T, v: T) -> Result<(), CuResult> {
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: a non-null out-parameter the caller provides for this value
    // (the driver API's contract).
    unsafe { p.write(v) };
    Ok(())
}

/// Writes `v` to `p` unless `p` is null (outputs the API lets callers skip).
pub(crate) fn out_opt<T>(p: *mut T, v: T) -> Result<(), CuResult> {
    if p.is_null() {
        Ok(())
    } else {
        out(p, v)
    }
}

/// A C string argument.
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(p: *const std::ffi::c_char) -> Result<&'a str, CuResult> {
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: per this function's contract.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| code::INVALID_VALUE)
}

/// Host bytes from a C pointer.
///
/// # Safety
/// `p` must point to `n` readable bytes (the caller's contract with the driver API).
pub(crate) unsafe fn host_src<'a>(
    p: *const std::ffi::c_void,
    n: usize,
) -> Result<&'a [u8], CuResult> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, n) })
}

/// Host bytes to write, from a C pointer.
///
/// # Safety
/// `p` must point to `n` writable bytes.
pub(crate) unsafe fn host_dst<'a>(
    p: *mut std::ffi::c_void,
    n: usize,
) -> Result<&'a mut [u8], CuResult> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) })
}
