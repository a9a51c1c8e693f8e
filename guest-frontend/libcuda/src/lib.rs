//! `libcuda.so.1` for guests: the CUDA driver API, each call forwarded to
//! the vGPU through [`guest_frontend::Gpu`].
//!
//! Handles and pointers use `cudarc`'s generated types, so the ABI is the
//! driver's. Enum-typed arguments and results travel as plain integers: a C
//! caller may pass any value, and a Rust enum must never hold an undeclared one.
//! Answers that cannot change (device count, name, attributes, versions,
//! error strings, the current context) are given here without a round trip.
//!
//! The vGPU is found as [`guest_frontend::Gpu::from_env`] says: in a VM, the
//! kernel module's `/dev/fairvgpu0` (or `FAIRVGPU_DEVICE`); on the host
//! itself and in tests, `FAIRVGPU_SOCKET` (the vGPU's ivshmem-server socket).
//!
//! Every exported function catches panics (nothing may unwind into C) and
//! checks every pointer it is given for null.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

mod image;

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUmodule, CUstream,
};
use guest_frontend::{Function, Gpu, GuestError};
use protocol::{DeviceInfo, Dim3, Status};

/// `CUresult` as the C ABI carries it.
pub type CuResult = c_uint;

const SUCCESS: CuResult = 0;
const INVALID_VALUE: CuResult = 1;
const NOT_INITIALIZED: CuResult = 3;
const NO_DEVICE: CuResult = 100;
const INVALID_DEVICE: CuResult = 101;
const INVALID_CONTEXT: CuResult = 201;
const INVALID_HANDLE: CuResult = 400;
const NOT_FOUND: CuResult = 500;
const NOT_SUPPORTED: CuResult = 801;
const UNKNOWN: CuResult = 999;
/// CUDA_ERROR_CONTEXT_IS_DESTROYED: the vGPU's host worker restarted and
/// the process's GPU state is gone (as after a sticky error on a real GPU,
/// the program must start again).
const CONTEXT_IS_DESTROYED: CuResult = 709;

/// The CUDA version this library reports (13.0).
const DRIVER_VERSION: c_int = 13000;

struct State {
    gpu: Gpu,
    info: DeviceInfo,
    attrs: HashMap<u32, i32>,
    functions: HashMap<usize, Function>,
    contexts: HashSet<usize>,
    next_ctx: usize,
    primary: usize,
    /// Device ranges this process holds (allocations, module globals), for
    /// cuPointerGetAttribute without a round trip.
    ranges: std::collections::BTreeMap<u64, u64>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static INIT: OnceLock<CuResult> = OnceLock::new();

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    static STACK: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn code(e: GuestError) -> CuResult {
    match e {
        GuestError::Cuda(s) => s.code(),
        GuestError::NoVgpu => NO_DEVICE,
        GuestError::VgpuReset => CONTEXT_IS_DESTROYED,
        GuestError::Transport(_) | GuestError::Protocol(_) | GuestError::Device { .. } => UNKNOWN,
    }
}

/// Lets go of the vGPU channel when the program exits normally, so that the
/// host sees a clean close (a killed program's channel is given back by the
/// kernel module or the host instead). A thread still inside a call keeps
/// the lock: then nothing is done here.
extern "C" fn release_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Ok(mut s) = STATE.try_lock() {
            drop(s.take());
        }
    });
}

fn connect() -> CuResult {
    match Gpu::from_env() {
        Ok(gpu) => {
            let info = gpu.device_info().clone();
            let attrs = info.attributes.iter().copied().collect();
            *lock() = Some(State {
                gpu,
                info,
                attrs,
                functions: HashMap::new(),
                contexts: HashSet::new(),
                next_ctx: 0x1000,
                primary: 0,
                ranges: Default::default(),
            });
            // SAFETY: `release_at_exit` is an `extern "C" fn()` that never unwinds.
            unsafe { libc::atexit(release_at_exit) };
            SUCCESS
        }
        Err(e) => {
            eprintln!("fairvgpu libcuda: cannot attach to a vGPU: {e}");
            NO_DEVICE
        }
    }
}

fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on the attached state; `NOT_INITIALIZED` before `cuInit`.
fn with<F: FnOnce(&mut State) -> Result<(), CuResult>>(f: F) -> CuResult {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut g = lock();
        match g.as_mut() {
            None => NOT_INITIALIZED,
            Some(s) => f(s).err().unwrap_or(SUCCESS),
        }
    }));
    r.unwrap_or(UNKNOWN)
}

fn out<T>(p: *mut T, v: T) -> Result<(), CuResult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null out-parameter provided by the caller for this value.
    unsafe { p.write(v) };
    Ok(())
}

fn need_ctx() -> Result<(), CuResult> {
    if CURRENT.with(Cell::get) == 0 {
        return Err(INVALID_CONTEXT);
    }
    Ok(())
}

fn once_unsupported(name: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut g = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if g.get_or_insert_with(HashSet::new).insert(name.to_owned()) {
        eprintln!("fairvgpu libcuda: {name} is not supported; returning CUDA_ERROR_NOT_SUPPORTED");
    }
}

// ---------------------------------------------------------------- init, device

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CuResult {
    if flags != 0 {
        return INVALID_VALUE;
    }
    *INIT.get_or_init(connect)
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CuResult {
    out(v, DRIVER_VERSION).err().unwrap_or(SUCCESS)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CuResult {
    with(|_| out(n, 1))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(d: *mut CUdevice, ordinal: c_int) -> CuResult {
    with(|_| {
        if ordinal == 0 {
            out(d, 0)
        } else {
            Err(INVALID_DEVICE)
        }
    })
}

fn check_dev(d: CUdevice) -> Result<(), CuResult> {
    if d == 0 {
        Ok(())
    } else {
        Err(INVALID_DEVICE)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, d: CUdevice) -> CuResult {
    with(|s| {
        check_dev(d)?;
        if name.is_null() || len <= 0 {
            return Err(INVALID_VALUE);
        }
        let bytes = s.info.name.as_bytes();
        let n = bytes.len().min(len as usize - 1);
        // SAFETY: the caller provides `len` writable bytes at `name`.
        let dst = unsafe { std::slice::from_raw_parts_mut(name as *mut u8, len as usize) };
        dst[..n].copy_from_slice(&bytes[..n]);
        dst[n] = 0;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, d: CUdevice) -> CuResult {
    with(|s| {
        check_dev(d)?;
        out(bytes, s.info.total_mem as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, d: CUdevice) -> CuResult {
    with(|s| {
        check_dev(d)?;
        let a = u32::try_from(attr).map_err(|_| INVALID_VALUE)?;
        // Cached from the host at attach time; unknown attributes read 0,
        // as the driver does for attributes a device lacks.
        out(v, s.attrs.get(&a).copied().unwrap_or(0))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    d: CUdevice,
) -> CuResult {
    with(|s| {
        check_dev(d)?;
        out(major, s.info.cc.0 as c_int)?;
        out(minor, s.info.cc.1 as c_int)
    })
}

/// A vGPU has its own identity: a UUID derived from the vGPU's socket and
/// device name (stable for the vGPU, different from the physical GPU's).
fn vgpu_uuid(s: &State) -> [u8; 16] {
    let mut h: [u64; 2] = [0xcbf2_9ce4_8422_2325, 0x8422_2325_cbf2_9ce4];
    let sock = std::env::var("FAIRVGPU_SOCKET")
        .or_else(|_| std::env::var("FAIRVGPU_DEVICE"))
        .unwrap_or_default();
    for (k, b) in sock.bytes().chain(s.info.name.bytes()).enumerate() {
        let w = &mut h[k % 2];
        *w = (*w ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&h[0].to_le_bytes());
    u[8..].copy_from_slice(&h[1].to_le_bytes());
    u[6] = (u[6] & 0x0f) | 0x40; // version 4
    u[8] = (u[8] & 0x3f) | 0x80; // variant 1
    u
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], d: CUdevice) -> CuResult {
    with(|s| {
        check_dev(d)?;
        out(uuid, vgpu_uuid(s))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], d: CUdevice) -> CuResult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid_v2(uuid, d) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus: *mut c_char,
    len: c_int,
    d: CUdevice,
) -> CuResult {
    with(|_| {
        check_dev(d)?;
        let id = b"0000:00:00.0";
        if bus.is_null() || len <= id.len() as c_int {
            return Err(INVALID_VALUE);
        }
        // SAFETY: the caller provides `len` writable bytes at `bus`.
        let dst = unsafe { std::slice::from_raw_parts_mut(bus as *mut u8, len as usize) };
        dst[..id.len()].copy_from_slice(id);
        dst[id.len()] = 0;
        Ok(())
    })
}

// ---------------------------------------------------------------- contexts
//
// A guest process has one channel and so one host context; CUDA contexts
// created here are names for it, with the per-thread current-context stack
// the driver API promises.

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut CUcontext,
    _flags: c_uint,
    d: CUdevice,
) -> CuResult {
    with(|s| {
        check_dev(d)?;
        s.next_ctx += 0x10;
        let h = s.next_ctx;
        s.contexts.insert(h);
        CURRENT.with(|c| c.set(h));
        out(ctx, h as CUcontext)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CuResult {
    with(|s| {
        if !s.contexts.remove(&(ctx as usize)) {
            return Err(INVALID_CONTEXT);
        }
        if CURRENT.with(Cell::get) == ctx as usize {
            CURRENT.with(|c| c.set(0));
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, d: CUdevice) -> CuResult {
    with(|s| {
        check_dev(d)?;
        if s.primary == 0 {
            s.next_ctx += 0x10;
            s.primary = s.next_ctx;
            s.contexts.insert(s.primary);
        }
        out(ctx, s.primary as CUcontext)
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(d: CUdevice) -> CuResult {
    with(|_| check_dev(d))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    d: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CuResult {
    with(|s| {
        check_dev(d)?;
        out(flags, 0)?;
        out(active, c_int::from(s.primary != 0))
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(d: CUdevice, _flags: c_uint) -> CuResult {
    // Scheduling flags (spin, yield, block) concern the host's thread; the
    // guest always spins, then blocks on its doorbell.
    with(|_| check_dev(d))
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(d: CUdevice) -> CuResult {
    with(|s| {
        check_dev(d)?;
        s.gpu.synchronize().map_err(code)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CuResult {
    with(|_| {
        need_ctx()?;
        out(flags, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(_ctx: CUcontext, v: *mut c_uint) -> CuResult {
    with(|_| out(v, DRIVER_VERSION as c_uint))
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CuResult {
    with(|s| {
        let h = ctx as usize;
        if h != 0 && !s.contexts.contains(&h) {
            return Err(INVALID_CONTEXT);
        }
        CURRENT.with(|c| c.set(h));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CuResult {
    with(|_| out(ctx, CURRENT.with(Cell::get) as CUcontext))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CuResult {
    with(|s| {
        if !s.contexts.contains(&(ctx as usize)) {
            return Err(INVALID_CONTEXT);
        }
        STACK.with(|st| st.borrow_mut().push(CURRENT.with(Cell::get)));
        CURRENT.with(|c| c.set(ctx as usize));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(ctx: *mut CUcontext) -> CuResult {
    with(|_| {
        let cur = CURRENT.with(Cell::get);
        if cur == 0 {
            return Err(INVALID_CONTEXT);
        }
        let prev = STACK.with(|st| st.borrow_mut().pop()).unwrap_or(0);
        CURRENT.with(|c| c.set(prev));
        if !ctx.is_null() {
            out(ctx, cur as CUcontext)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(d: *mut CUdevice) -> CuResult {
    with(|_| {
        need_ctx()?;
        out(d, 0)
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    with(|s| {
        need_ctx()?;
        s.gpu.synchronize().map_err(code)
    })
}

// ---------------------------------------------------------------- memory

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(p: *mut CUdeviceptr, size: usize) -> CuResult {
    with(|s| {
        need_ctx()?;
        if size == 0 {
            return Err(INVALID_VALUE);
        }
        let d = s.gpu.mem_alloc(size as u64).map_err(code)?;
        s.ranges.insert(d, size as u64);
        out(p, d)
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(p: CUdeviceptr) -> CuResult {
    with(|s| {
        need_ctx()?;
        s.gpu.mem_free(p).map_err(code)?;
        s.ranges.remove(&p);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    with(|s| {
        need_ctx()?;
        let (f, t) = s.gpu.mem_get_info().map_err(code)?;
        out(free, f as usize)?;
        out(total, t as usize)
    })
}

/// Host bytes from a C pointer.
///
/// # Safety
/// `p` must point to `n` readable bytes (the caller's contract with the driver API).
unsafe fn host_src<'a>(p: *const c_void, n: usize) -> Result<&'a [u8], CuResult> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, n) })
}

/// Host bytes to write, from a C pointer.
///
/// # Safety
/// `p` must point to `n` writable bytes.
unsafe fn host_dst<'a>(p: *mut c_void, n: usize) -> Result<&'a mut [u8], CuResult> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CuResult {
    with(|s| {
        need_ctx()?;
        // SAFETY: the caller passes `n` readable bytes at `src`.
        let b = unsafe { host_src(src, n) }?;
        s.gpu.memcpy_htod(dst, b).map_err(code)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    st: CUstream,
) -> CuResult {
    with(|s| {
        need_ctx()?;
        // SAFETY: as above. The bytes are in the ring when we return, so the
        // caller may reuse its buffer at once (stricter than CUDA requires).
        let b = unsafe { host_src(src, n) }?;
        s.gpu.memcpy_htod_async(dst, b, st as u64).map_err(code)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CuResult {
    with(|s| {
        need_ctx()?;
        // SAFETY: the caller passes `n` writable bytes at `dst`.
        let b = unsafe { host_dst(dst, n) }?;
        s.gpu.memcpy_dtoh(b, src, 0).map_err(code)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    st: CUstream,
) -> CuResult {
    with(|s| {
        need_ctx()?;
        // SAFETY: as above; completes before returning (allowed for async copies).
        let b = unsafe { host_dst(dst, n) }?;
        s.gpu.memcpy_dtoh(b, src, st as u64).map_err(code)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CuResult {
    with(|s| {
        need_ctx()?;
        s.gpu
            .memcpy_dtod_async(dst, src, n as u64, 0)
            .map_err(code)?;
        s.gpu.stream_synchronize(0).map_err(code)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    st: CUstream,
) -> CuResult {
    with(|s| {
        need_ctx()?;
        s.gpu
            .memcpy_dtod_async(dst, src, n as u64, st as u64)
            .map_err(code)
    })
}

fn memset(dst: CUdeviceptr, v: u32, width: u32, n: usize, st: CUstream, sync: bool) -> CuResult {
    with(|s| {
        need_ctx()?;
        s.gpu
            .memset_async(dst, v, width, n as u64, st as u64)
            .map_err(code)?;
        if sync {
            s.gpu.stream_synchronize(st as u64).map_err(code)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) -> CuResult {
    memset(dst, u32::from(v), 1, n, std::ptr::null_mut(), true)
}
#[no_mangle]
pub extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize) -> CuResult {
    memset(dst, u32::from(v), 2, n, std::ptr::null_mut(), true)
}
#[no_mangle]
pub extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, v: u32, n: usize) -> CuResult {
    memset(dst, v, 4, n, std::ptr::null_mut(), true)
}
#[no_mangle]
pub extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, st: CUstream) -> CuResult {
    memset(dst, u32::from(v), 1, n, st, false)
}
#[no_mangle]
pub extern "C" fn cuMemsetD32Async(dst: CUdeviceptr, v: u32, n: usize, st: CUstream) -> CuResult {
    memset(dst, v, 4, n, st, false)
}

// Page-locked host memory is ordinary memory to a remoted guest: copies go
// through the shared arenas either way.

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CuResult {
    // SAFETY: malloc has no preconditions; null is checked.
    let p = unsafe { libc::malloc(size.max(1)) };
    if p.is_null() {
        return 2; // CUDA_ERROR_OUT_OF_MEMORY
    }
    out(pp, p).err().unwrap_or(SUCCESS)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CuResult {
    // SAFETY: same contract as cuMemAllocHost_v2.
    unsafe { cuMemAllocHost_v2(pp, size) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CuResult {
    // SAFETY: `p` came from cuMemAllocHost_v2/cuMemHostAlloc (malloc), per the API contract.
    unsafe { libc::free(p) };
    SUCCESS
}

// ---------------------------------------------------------------- modules, launches

unsafe fn load(m: *mut CUmodule, img: *const c_void) -> CuResult {
    with(|s| {
        need_ctx()?;
        if img.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: `img` is a module image, per the driver API contract.
        let (kind, len) = unsafe { image::probe(img as *const u8) }.ok_or(INVALID_VALUE)?;
        // SAFETY: probe found `len` bytes of image at `img`.
        let bytes = unsafe { std::slice::from_raw_parts(img as *const u8, len) };
        let h = s.gpu.module_load(kind, bytes).map_err(code)?;
        out(m, h as CUmodule)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut CUmodule, img: *const c_void) -> CuResult {
    // SAFETY: forwarded contract.
    unsafe { load(m, img) }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    m: *mut CUmodule,
    img: *const c_void,
    _n: c_uint,
    _opts: *mut c_int,
    _vals: *mut *mut c_void,
) -> CuResult {
    // JIT options tune the host's compilation; the image is what matters.
    // SAFETY: forwarded contract.
    unsafe { load(m, img) }
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(m: CUmodule) -> CuResult {
    with(|s| {
        need_ctx()?;
        s.gpu.module_unload(m as u64).map_err(code)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut CUfunction,
    m: CUmodule,
    name: *const c_char,
) -> CuResult {
    with(|s| {
        need_ctx()?;
        if name.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: `name` is a NUL-terminated string, per the API contract.
        let n = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| INVALID_VALUE)?;
        let func = s.gpu.get_function(m as u64, n).map_err(code)?;
        let h = func.handle as usize;
        s.functions.insert(h, func);
        out(f, h as CUfunction)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(v: *mut c_int, attr: c_int, f: CUfunction) -> CuResult {
    with(|s| {
        let a = u32::try_from(attr).map_err(|_| INVALID_VALUE)?;
        if a > protocol::MAX_FUNC_ATTRIBUTE {
            once_unsupported(&format!("cuFuncGetAttribute({attr})"));
            return Err(NOT_SUPPORTED);
        }
        let val = s.gpu.func_attribute(f as u64, a).map_err(code)?;
        out(v, val)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    v: *mut c_int,
    attr: c_int,
    k: CUfunction,
    d: CUdevice,
) -> CuResult {
    if d != 0 {
        return INVALID_DEVICE;
    }
    // SAFETY: forwarded contract.
    unsafe { cuFuncGetAttribute(v, attr, k) }
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    st: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    with(|s| {
        need_ctx()?;
        if !extra.is_null() {
            once_unsupported("cuLaunchKernel with `extra`");
            return Err(NOT_SUPPORTED);
        }
        let func = s
            .functions
            .get(&(f as usize))
            .ok_or(INVALID_HANDLE)?
            .clone();
        let n = func.param_sizes.len();
        if n > 0 && params.is_null() {
            return Err(INVALID_VALUE);
        }
        let slots: &[*mut c_void] = if n == 0 {
            &[]
        } else {
            // SAFETY: `params` holds one pointer per kernel parameter (API contract).
            unsafe { std::slice::from_raw_parts(params, n) }
        };
        let mut views: Vec<&[u8]> = Vec::with_capacity(n);
        for (&slot, &size) in slots.iter().zip(&func.param_sizes) {
            let p = slot as *const u8;
            if p.is_null() {
                return Err(INVALID_VALUE);
            }
            // SAFETY: each parameter pointer addresses that parameter's value,
            // whose size the module's metadata gives.
            views.push(unsafe { std::slice::from_raw_parts(p, size as usize) });
        }
        let grid = Dim3 {
            x: gx,
            y: gy,
            z: gz,
        };
        let block = Dim3 {
            x: bx,
            y: by,
            z: bz,
        };
        s.gpu
            .launch(&func, grid, block, shared, st as u64, &views)
            .map_err(code)
    })
}

// The library API (CUDA 12) is the module API without a context: a library
// is a module of the guest's one host context, a kernel is its function.

fn need_ctx_or_primary(s: &mut State) {
    if CURRENT.with(Cell::get) == 0 {
        if s.primary == 0 {
            s.next_ctx += 0x10;
            s.primary = s.next_ctx;
            s.contexts.insert(s.primary);
        }
        CURRENT.with(|c| c.set(s.primary));
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    lib: *mut CUmodule,
    code: *const c_void,
    _jit_opts: *mut c_int,
    _jit_vals: *mut *mut c_void,
    _n_jit: c_uint,
    _lib_opts: *mut c_int,
    _lib_vals: *mut *mut c_void,
    _n_lib: c_uint,
) -> CuResult {
    let r = with(|s| {
        need_ctx_or_primary(s);
        Ok(())
    });
    if r != SUCCESS {
        return r;
    }
    // SAFETY: forwarded contract (a module image at `code`).
    unsafe { load(lib, code) }
}

#[no_mangle]
pub extern "C" fn cuLibraryUnload(lib: CUmodule) -> CuResult {
    with(|s| s.gpu.module_unload(lib as u64).map_err(code))
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(m: *mut CUmodule, lib: CUmodule) -> CuResult {
    with(|_| out(m, lib))
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    k: *mut CUfunction,
    lib: CUmodule,
    name: *const c_char,
) -> CuResult {
    let r = with(|s| {
        need_ctx_or_primary(s);
        Ok(())
    });
    if r != SUCCESS {
        return r;
    }
    // SAFETY: forwarded contract.
    unsafe { cuModuleGetFunction(k, lib, name) }
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(f: *mut CUfunction, k: CUfunction) -> CuResult {
    with(|s| {
        if !s.functions.contains_key(&(k as usize)) {
            return Err(INVALID_HANDLE);
        }
        out(f, k)
    })
}

/// cuLaunchKernelEx without launch attributes: the same launch as
/// cuLaunchKernel. Attributes (clusters, cooperative launch, ...) change
/// semantics we do not forward yet, so they are refused, not ignored.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    cfg: *const cudarc::driver::sys::CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    if cfg.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null pointer to a launch configuration (API contract).
    let c = unsafe { &*cfg };
    if c.numAttrs != 0 {
        once_unsupported("cuLaunchKernelEx with launch attributes");
        return NOT_SUPPORTED;
    }
    // SAFETY: forwarded contract.
    unsafe {
        cuLaunchKernel(
            f,
            c.gridDimX,
            c.gridDimY,
            c.gridDimZ,
            c.blockDimX,
            c.blockDimY,
            c.blockDimZ,
            c.sharedMemBytes,
            c.hStream,
            params,
            extra,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    f: CUfunction,
    block: c_int,
    smem: usize,
) -> CuResult {
    with(|s| {
        let b = u32::try_from(block).map_err(|_| INVALID_VALUE)?;
        let m = u32::try_from(smem).map_err(|_| INVALID_VALUE)?;
        let v = s.gpu.occupancy(f as u64, b, m).map_err(code)?;
        out(n, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    n: *mut c_int,
    f: CUfunction,
    block: c_int,
    smem: usize,
    _flags: c_uint,
) -> CuResult {
    // SAFETY: forwarded contract (the flags only affect caching decisions).
    unsafe { cuOccupancyMaxActiveBlocksPerMultiprocessor(n, f, block, smem) }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    p: *mut CUdeviceptr,
    bytes: *mut usize,
    m: CUmodule,
    name: *const c_char,
) -> CuResult {
    with(|s| {
        need_ctx()?;
        if name.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: NUL-terminated name, per the API contract.
        let n = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| INVALID_VALUE)?;
        let (addr, size) = s.gpu.module_global(m as u64, n).map_err(code)?;
        s.ranges.insert(addr, size);
        // Either output may be null.
        if !p.is_null() {
            out(p, addr)?;
        }
        if !bytes.is_null() {
            out(bytes, size as usize)?;
        }
        Ok(())
    })
}

/// cuPointerGetAttribute for the device ranges this process holds.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_int,
    ptr: CUdeviceptr,
) -> CuResult {
    with(|s| {
        let (&base, &size) = s.ranges.range(..=ptr).next_back().ok_or(INVALID_VALUE)?;
        if ptr >= base + size {
            return Err(INVALID_VALUE);
        }
        match attr {
            1 => out(data as *mut CUcontext, CURRENT.with(Cell::get) as CUcontext), // CONTEXT
            2 => out(data as *mut c_uint, 2), // MEMORY_TYPE: DEVICE
            3 => out(data as *mut CUdeviceptr, ptr), // DEVICE_POINTER
            9 => out(data as *mut c_int, 0),  // DEVICE_ORDINAL
            11 => out(data as *mut CUdeviceptr, base), // RANGE_START_ADDR
            12 => out(data as *mut usize, size as usize), // RANGE_SIZE
            _ => {
                once_unsupported(&format!("cuPointerGetAttribute({attr})"));
                Err(NOT_SUPPORTED)
            }
        }
    })
}

/// A link in progress (`CUlinkState`): inputs gathered in the guest, linked
/// on the host by cuLinkComplete.
struct LinkState {
    inputs: Vec<(u32, Vec<u8>)>,
    image: Vec<u8>,
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate_v2(
    _n: c_uint,
    _opts: *mut c_int,
    _vals: *mut *mut c_void,
    state: *mut *mut c_void,
) -> CuResult {
    let st = Box::into_raw(Box::new(LinkState {
        inputs: Vec::new(),
        image: Vec::new(),
    }));
    match out(state, st as *mut c_void) {
        Ok(()) => SUCCESS,
        Err(e) => {
            // SAFETY: `st` came from Box::into_raw just above and was not handed out.
            drop(unsafe { Box::from_raw(st) });
            e
        }
    }
}

/// The link state behind a handle from cuLinkCreate_v2.
///
/// # Safety
/// `st` must be a handle returned by cuLinkCreate_v2 and not yet destroyed.
unsafe fn link_state<'a>(st: *mut c_void) -> Result<&'a mut LinkState, CuResult> {
    if st.is_null() {
        return Err(INVALID_HANDLE);
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { &mut *(st as *mut LinkState) })
}

fn link_kind(t: c_int) -> Result<u32, CuResult> {
    match t {
        0 => Ok(protocol::link_input::CUBIN),
        1 => Ok(protocol::link_input::PTX),
        2 => Ok(protocol::link_input::FATBINARY),
        _ => {
            once_unsupported(&format!("cuLinkAddData input type {t}"));
            Err(NOT_SUPPORTED)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddData_v2(
    st: *mut c_void,
    ty: c_int,
    data: *mut c_void,
    size: usize,
    _name: *const c_char,
    _n: c_uint,
    _opts: *mut c_int,
    _vals: *mut *mut c_void,
) -> CuResult {
    let kind = match link_kind(ty) {
        Ok(k) => k,
        Err(e) => return e,
    };
    // SAFETY: a live link handle, per the API contract.
    let state = match unsafe { link_state(st) } {
        Ok(s) => s,
        Err(e) => return e,
    };
    // SAFETY: `size` readable bytes at `data`, per the API contract.
    match unsafe { host_src(data, size) } {
        Ok(b) => {
            state.inputs.push((kind, b.to_vec()));
            SUCCESS
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    st: *mut c_void,
    ty: c_int,
    path: *const c_char,
    _n: c_uint,
    _opts: *mut c_int,
    _vals: *mut *mut c_void,
) -> CuResult {
    let kind = match link_kind(ty) {
        Ok(k) => k,
        Err(e) => return e,
    };
    if path.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: NUL-terminated path, per the API contract.
    let p = unsafe { CStr::from_ptr(path) }
        .to_string_lossy()
        .into_owned();
    let Ok(bytes) = std::fs::read(&p) else {
        return 301;
    }; // CUDA_ERROR_FILE_NOT_FOUND
       // SAFETY: a live link handle, per the API contract.
    match unsafe { link_state(st) } {
        Ok(s) => {
            s.inputs.push((kind, bytes));
            SUCCESS
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkComplete(
    st: *mut c_void,
    image: *mut *mut c_void,
    size: *mut usize,
) -> CuResult {
    // SAFETY: a live link handle, per the API contract.
    let state = match unsafe { link_state(st) } {
        Ok(s) => s,
        Err(e) => return e,
    };
    with(|s| {
        need_ctx()?;
        let inputs: Vec<(u32, &[u8])> = state
            .inputs
            .iter()
            .map(|(k, b)| (*k, b.as_slice()))
            .collect();
        state.image = s.gpu.link(&inputs).map_err(code)?;
        // The image stays valid until cuLinkDestroy, as the driver promises.
        out(image, state.image.as_mut_ptr() as *mut c_void)?;
        out(size, state.image.len())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkDestroy(st: *mut c_void) -> CuResult {
    if st.is_null() {
        return INVALID_HANDLE;
    }
    // SAFETY: a handle from cuLinkCreate_v2, destroyed once (API contract).
    drop(unsafe { Box::from_raw(st as *mut LinkState) });
    SUCCESS
}

// ---------------------------------------------------------------- streams, events

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(p: *mut CUstream, flags: c_uint) -> CuResult {
    with(|s| {
        need_ctx()?;
        let h = s.gpu.stream_create(flags).map_err(code)?;
        out(p, h as CUstream)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(st: CUstream) -> CuResult {
    with(|s| s.gpu.stream_destroy(st as u64).map_err(code))
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(st: CUstream) -> CuResult {
    with(|s| s.gpu.stream_synchronize(st as u64).map_err(code))
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(st: CUstream) -> CuResult {
    with(|s| match s.gpu.stream_query(st as u64).map_err(code)? {
        true => Ok(()),
        false => Err(Status::NotReady.code()),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(p: *mut CUevent, flags: c_uint) -> CuResult {
    with(|s| {
        need_ctx()?;
        let h = s.gpu.event_create(flags).map_err(code)?;
        out(p, h as CUevent)
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(e: CUevent) -> CuResult {
    with(|s| s.gpu.event_destroy(e as u64).map_err(code))
}

#[no_mangle]
pub extern "C" fn cuEventRecord(e: CUevent, st: CUstream) -> CuResult {
    with(|s| s.gpu.event_record(e as u64, st as u64).map_err(code))
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(e: CUevent) -> CuResult {
    with(|s| s.gpu.event_synchronize(e as u64).map_err(code))
}

#[no_mangle]
pub extern "C" fn cuEventQuery(e: CUevent) -> CuResult {
    with(|s| match s.gpu.event_query(e as u64).map_err(code)? {
        true => Ok(()),
        false => Err(Status::NotReady.code()),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, a: CUevent, b: CUevent) -> CuResult {
    with(|s| {
        let v = s.gpu.event_elapsed_ms(a as u64, b as u64).map_err(code)?;
        out(ms, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, a: CUevent, b: CUevent) -> CuResult {
    // SAFETY: same contract.
    unsafe { cuEventElapsedTime(ms, a, b) }
}

// ---------------------------------------------------------------- errors, entry points

fn error_text(e: CuResult) -> Option<(&'static CStr, &'static CStr)> {
    Some(match e {
        0 => (c"CUDA_SUCCESS", c"no error"),
        1 => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        2 => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        3 => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        100 => (
            c"CUDA_ERROR_NO_DEVICE",
            c"no CUDA-capable device is detected",
        ),
        101 => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        200 => (
            c"CUDA_ERROR_INVALID_IMAGE",
            c"device kernel image is invalid",
        ),
        201 => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        218 => (c"CUDA_ERROR_INVALID_PTX", c"a PTX JIT compilation failed"),
        400 => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        500 => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        600 => (c"CUDA_ERROR_NOT_READY", c"device not ready"),
        700 => (
            c"CUDA_ERROR_ILLEGAL_ADDRESS",
            c"an illegal memory access was encountered",
        ),
        701 => (
            c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
            c"too many resources requested for launch",
        ),
        709 => (c"CUDA_ERROR_CONTEXT_IS_DESTROYED", c"context is destroyed"),
        719 => (c"CUDA_ERROR_LAUNCH_FAILED", c"unspecified launch failure"),
        801 => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        999 => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(e: CuResult, s: *mut *const c_char) -> CuResult {
    match error_text(e) {
        Some((n, _)) => out(s, n.as_ptr()).err().unwrap_or(SUCCESS),
        None => INVALID_VALUE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(e: CuResult, s: *mut *const c_char) -> CuResult {
    match error_text(e) {
        Some((_, t)) => out(s, t.as_ptr()).err().unwrap_or(SUCCESS),
        None => INVALID_VALUE,
    }
}

macro_rules! proc_table {
    ($($name:literal => $f:ident),* $(,)?) => {
        fn proc_lookup(name: &str) -> Option<*mut c_void> {
            match name {
                $($name => Some($f as *mut c_void),)*
                _ => None,
            }
        }
    };
}

proc_table! {
    "cuInit" => cuInit, "cuDriverGetVersion" => cuDriverGetVersion,
    "cuDeviceGetCount" => cuDeviceGetCount, "cuDeviceGet" => cuDeviceGet,
    "cuDeviceGetName" => cuDeviceGetName, "cuDeviceTotalMem" => cuDeviceTotalMem_v2,
    "cuDeviceGetAttribute" => cuDeviceGetAttribute, "cuDeviceGetUuid" => cuDeviceGetUuid_v2,
    "cuDeviceGetPCIBusId" => cuDeviceGetPCIBusId, "cuDevicePrimaryCtxGetState" => cuDevicePrimaryCtxGetState,
    "cuDevicePrimaryCtxSetFlags" => cuDevicePrimaryCtxSetFlags_v2, "cuDevicePrimaryCtxReset" => cuDevicePrimaryCtxReset_v2,
    "cuCtxGetFlags" => cuCtxGetFlags, "cuCtxGetApiVersion" => cuCtxGetApiVersion, "cuDeviceComputeCapability" => cuDeviceComputeCapability,
    "cuCtxCreate" => cuCtxCreate_v2, "cuCtxDestroy" => cuCtxDestroy_v2,
    "cuDevicePrimaryCtxRetain" => cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRelease" => cuDevicePrimaryCtxRelease_v2,
    "cuCtxSetCurrent" => cuCtxSetCurrent, "cuCtxGetCurrent" => cuCtxGetCurrent,
    "cuCtxPushCurrent" => cuCtxPushCurrent_v2, "cuCtxPopCurrent" => cuCtxPopCurrent_v2,
    "cuCtxGetDevice" => cuCtxGetDevice, "cuCtxSynchronize" => cuCtxSynchronize,
    "cuMemAlloc" => cuMemAlloc_v2, "cuMemFree" => cuMemFree_v2, "cuMemGetInfo" => cuMemGetInfo_v2,
    "cuMemcpyHtoD" => cuMemcpyHtoD_v2, "cuMemcpyHtoDAsync" => cuMemcpyHtoDAsync_v2,
    "cuMemcpyDtoH" => cuMemcpyDtoH_v2, "cuMemcpyDtoHAsync" => cuMemcpyDtoHAsync_v2,
    "cuMemcpyDtoD" => cuMemcpyDtoD_v2, "cuMemcpyDtoDAsync" => cuMemcpyDtoDAsync_v2,
    "cuMemsetD8" => cuMemsetD8_v2, "cuMemsetD16" => cuMemsetD16_v2, "cuMemsetD32" => cuMemsetD32_v2,
    "cuMemsetD8Async" => cuMemsetD8Async, "cuMemsetD32Async" => cuMemsetD32Async,
    "cuMemAllocHost" => cuMemAllocHost_v2, "cuMemHostAlloc" => cuMemHostAlloc, "cuMemFreeHost" => cuMemFreeHost,
    "cuModuleLoadData" => cuModuleLoadData, "cuModuleLoadDataEx" => cuModuleLoadDataEx,
    "cuModuleUnload" => cuModuleUnload, "cuModuleGetFunction" => cuModuleGetFunction,
    "cuLaunchKernel" => cuLaunchKernel, "cuLaunchKernelEx" => cuLaunchKernelEx,
    "cuOccupancyMaxActiveBlocksPerMultiprocessor" => cuOccupancyMaxActiveBlocksPerMultiprocessor,
    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags" => cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
    "cuModuleGetGlobal" => cuModuleGetGlobal_v2, "cuPointerGetAttribute" => cuPointerGetAttribute,
    "cuLinkCreate" => cuLinkCreate_v2, "cuLinkAddData" => cuLinkAddData_v2, "cuLinkAddFile" => cuLinkAddFile_v2,
    "cuLinkComplete" => cuLinkComplete, "cuLinkDestroy" => cuLinkDestroy,
    "cuLibraryLoadData" => cuLibraryLoadData, "cuLibraryUnload" => cuLibraryUnload,
    "cuLibraryGetModule" => cuLibraryGetModule, "cuLibraryGetKernel" => cuLibraryGetKernel,
    "cuKernelGetFunction" => cuKernelGetFunction, "cuFuncGetAttribute" => cuFuncGetAttribute,
    "cuKernelGetAttribute" => cuKernelGetAttribute,
    "cuStreamCreate" => cuStreamCreate, "cuStreamDestroy" => cuStreamDestroy_v2,
    "cuStreamSynchronize" => cuStreamSynchronize, "cuStreamQuery" => cuStreamQuery,
    "cuEventCreate" => cuEventCreate, "cuEventDestroy" => cuEventDestroy_v2, "cuEventRecord" => cuEventRecord,
    "cuEventSynchronize" => cuEventSynchronize, "cuEventQuery" => cuEventQuery,
    "cuEventElapsedTime" => cuEventElapsedTime_v2,
    "cuGetErrorName" => cuGetErrorName, "cuGetErrorString" => cuGetErrorString,
    "cuGetProcAddress" => cuGetProcAddress_v2,
}

/// cuGetProcAddress_v2: our own function by its base name (the versioned
/// variant this library implements); unknown names are NOT_FOUND with the
/// status the driver reports, and are logged once.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> CuResult {
    if symbol.is_null() || pfn.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: NUL-terminated symbol name, per the API contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let base = name
        .trim_end_matches("_v2")
        .trim_end_matches("_v3")
        .trim_end_matches("_v4");
    match proc_lookup(base) {
        Some(f) => {
            let _ = out(pfn, f);
            if !status.is_null() {
                let _ = out(status, 0); // CU_GET_PROC_ADDRESS_SUCCESS
            }
            SUCCESS
        }
        None => {
            // Loaders such as cuda-python resolve every entry point up front;
            // a miss matters only if the program then needs it.
            if std::env::var_os("FAIRVGPU_LIBCUDA_DEBUG").is_some() {
                eprintln!("fairvgpu libcuda: no entry point {name}");
            }
            let _ = out(pfn, std::ptr::null_mut());
            if !status.is_null() {
                let _ = out(status, 1); // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
            }
            NOT_FOUND
        }
    }
}

/// The CUDA 11.3-12.x signature without the status out-parameter.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    // SAFETY: forwarded contract.
    unsafe { cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut()) }
}
