//! `cuGetExportTable`: the driver's private tables, which the CUDA runtime
//! (`libcudart`, static and shared, 12.x and 13.x) and the libraries built
//! on it (cuBLAS, cuBLASLt, cuFFT) ask for by 16-byte identifier. The
//! cluster table (`cluster.rs`) is what cuBLASLt's Hopper kernels for
//! fp16 and bf16 products need.
//!
//! A table is an array of words: its size in bytes, then function pointers
//! (the context-local storage table has no size: three functions and a
//! null). Each table here has the real driver's number of slots; a slot we
//! do not serve holds a stub that logs once and answers 0 (for slots the
//! runtime calls and whose result it ignores) or `CUDA_ERROR_NOT_SUPPORTED`
//! — never a null a caller could jump through. What each slot does is as
//! measured on driver 580 and documented by other reimplementations.

mod cluster;
mod integrity;

use std::ffi::{c_char, c_void};

use cudarc::driver::sys::{CUcontext, CUdevice, CUfunction, CUmodule, CUuuid};

use crate::state::thread::current;
use crate::state::{self, objects, out};
use crate::{code, CuResult};

/// A table: slot 0 is its size in bytes, the others function pointers.
#[repr(C)]
pub(crate) struct Table<const N: usize>([*const c_void; N]);

// SAFETY: the tables are immutable statics of function addresses.
unsafe impl<const N: usize> Sync for Table<N> {}

const fn size(slots: usize) -> *const c_void {
    (slots * 8) as *const c_void
}

/// An unserved slot whose answer the callers ignore or accept as success.
extern "C" fn quiet<const T: u8, const S: u8>() -> CuResult {
    if std::env::var_os("FAIRVGPU_LIBCUDA_DEBUG").is_some() {
        crate::log_once(&format!("export table {T} slot {S} called (answered 0)"));
    }
    code::SUCCESS
}

/// Fills slots `$i` of table `$t` with their own [`refused`] stubs.
macro_rules! each_refused {
    ($t:ident, $tab:literal, $($i:literal)*) => {
        $( $t[$i] = refused::<$tab, $i> as *const c_void; )*
    };
}

/// An unserved slot: `CUDA_ERROR_NOT_SUPPORTED`, logged once.
extern "C" fn refused<const T: u8, const S: u8>() -> CuResult {
    crate::not_supported(&format!("export table {T} slot {S}"))
}

// ---------------------------------------------------------------- cudart interface

/// Slot 2: the device's primary context, neither retained nor made current.
extern "C" fn primary_context(ctx: *mut CUcontext, dev: CUdevice) -> CuResult {
    crate::entry(|| {
        state::driver()?;
        if dev != 0 {
            return Err(code::INVALID_DEVICE);
        }
        out(ctx, objects()?.primary() as CUcontext)
    })
}

/// Slot 1: a module from a fat binary wrapper, as `cuModuleLoadData`.
extern "C" fn module_from_wrapper(m: *mut *mut c_void, wrapper: *const c_void) -> CuResult {
    // SAFETY: the runtime passes a module image (its contract for this slot).
    unsafe { crate::module::cuModuleLoadData(m as _, wrapper) }
}

/// Slot 6: as slot 1, with options we do not serve (they must be absent).
extern "C" fn module_from_wrapper_ext(
    m: *mut *mut c_void,
    wrapper: *const c_void,
    a: *const c_void,
    b: *const c_void,
    n: u32,
) -> CuResult {
    if !a.is_null() || !b.is_null() || n != 0 {
        return crate::not_supported("module loading with options (export table slot 6)");
    }
    module_from_wrapper(m, wrapper)
}

/// Slot 8: as slot 6, with the fat binary header first.
extern "C" fn module_from_fatbin_ext(
    fatbin: *const c_void,
    m: *mut *mut c_void,
    a: *const c_void,
    b: *const c_void,
    n: u32,
) -> CuResult {
    module_from_wrapper_ext(m, fatbin, a, b, n)
}

extern "C" fn nothing(_: usize) {}

static CUDART_INTERFACE: Table<13> = Table([
    size(13),
    module_from_wrapper as *const c_void,
    primary_context as *const c_void,
    refused::<1, 3> as *const c_void,
    refused::<1, 4> as *const c_void,
    refused::<1, 5> as *const c_void,
    module_from_wrapper_ext as *const c_void,
    nothing as *const c_void,
    module_from_fatbin_ext as *const c_void,
    refused::<1, 9> as *const c_void,
    refused::<1, 10> as *const c_void,
    refused::<1, 11> as *const c_void,
    // Loads the compilers (CUDA 13.1+): the host's driver has them.
    quiet::<1, 12> as *const c_void,
]);

// ---------------------------------------------------------------- tools hooks

/// Scratch buffers the driver lends the runtime, zeroed and never freed;
/// larger than the sizes reported, as runtimes read past them.
static BUFFER_1: Scratch<8192> = Scratch([0; 8192]);
static BUFFER_2: Scratch<256> = Scratch([0; 256]);

#[repr(C, align(64))]
struct Scratch<const N: usize>([u8; N]);

extern "C" fn buffer_1(p: *mut *const c_void, size: *mut usize) {
    let _ = out(p, BUFFER_1.0.as_ptr() as *const c_void);
    let _ = out(size, 1024);
}

extern "C" fn buffer_2(p: *mut *const c_void, size: *mut usize) {
    let _ = out(p, BUFFER_2.0.as_ptr() as *const c_void);
    let _ = out(size, 14);
}

static TOOLS_HOOKS: Table<7> = Table([
    size(7),
    quiet::<2, 1> as *const c_void,
    buffer_1 as *const c_void,
    quiet::<2, 3> as *const c_void,
    quiet::<2, 4> as *const c_void,
    quiet::<2, 5> as *const c_void,
    buffer_2 as *const c_void,
]);

// ---------------------------------------------------------------- tools TLS

/// Slot 2: the calling thread's current context (null if none).
extern "C" fn current_context(ctx: *mut CUcontext) -> CuResult {
    crate::entry(|| out(ctx, current() as CUcontext))
}

static TOOLS_TLS: Table<3> = Table([
    size(3),
    quiet::<3, 1> as *const c_void,
    current_context as *const c_void,
]);

// ---------------------------------------------------------------- context-local storage

use crate::state::ClsDtor;

/// The context `ctx` names, or the current one.
fn cls_context(ctx: CUcontext) -> Result<usize, CuResult> {
    if state::deinitialized() {
        return Err(code::DEINITIALIZED);
    }
    let h = if ctx.is_null() {
        current()
    } else {
        ctx as usize
    };
    if h == 0 {
        return Err(code::INVALID_CONTEXT);
    }
    Ok(h)
}

extern "C" fn cls_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Option<ClsDtor>,
) -> CuResult {
    crate::entry(|| {
        let h = cls_context(ctx)?;
        objects()?
            .cls
            .insert((h, key as usize), (value as usize, dtor));
        Ok(())
    })
}

extern "C" fn cls_delete(ctx: CUcontext, key: *mut c_void) -> CuResult {
    crate::entry(|| {
        let h = cls_context(ctx)?;
        objects()?.cls.remove(&(h, key as usize));
        Ok(())
    })
}

/// A missing key is `CUDA_ERROR_INVALID_HANDLE` (the runtime then builds
/// its state and puts it); no context is `CUDA_ERROR_INVALID_CONTEXT` (it
/// then makes the primary context current).
extern "C" fn cls_get(value: *mut *mut c_void, ctx: CUcontext, key: *mut c_void) -> CuResult {
    crate::entry(|| {
        let h = cls_context(ctx)?;
        let v = objects()?
            .cls
            .get(&(h, key as usize))
            .map(|&(v, _)| v)
            .ok_or(code::INVALID_HANDLE)?;
        out(value, v as *mut c_void)
    })
}

static CONTEXT_LOCAL_STORAGE: Table<4> = Table([
    cls_put as *const c_void,
    cls_delete as *const c_void,
    cls_get as *const c_void,
    std::ptr::null(),
]);

// ---------------------------------------------------------------- context checks

/// Slot 2: whether `ctx` wraps another (green contexts); ours never do.
extern "C" fn context_check(
    _ctx: CUcontext,
    flag: *mut u32,
    _other: *mut *const c_void,
) -> CuResult {
    crate::entry(|| out(flag, 0))
}

static CONTEXT_CHECKS: Table<15> = Table([
    size(15),
    refused::<5, 1> as *const c_void,
    context_check as *const c_void,
    // Slot 3 takes nothing and answers 0.
    quiet::<5, 3> as *const c_void,
    refused::<5, 4> as *const c_void,
    refused::<5, 5> as *const c_void,
    refused::<5, 6> as *const c_void,
    refused::<5, 7> as *const c_void,
    refused::<5, 8> as *const c_void,
    refused::<5, 9> as *const c_void,
    refused::<5, 10> as *const c_void,
    refused::<5, 11> as *const c_void,
    refused::<5, 12> as *const c_void,
    refused::<5, 13> as *const c_void,
    refused::<5, 14> as *const c_void,
]);

// ---------------------------------------------------------------- integrity

extern "C" fn integrity_check(version: u32, unix_seconds: u64, result: *mut [u64; 2]) -> CuResult {
    crate::entry(|| {
        let devices = match state::driver() {
            Ok(d) => {
                let a = |n| crate::device::vgpu_attribute(n, d.attrs.get(&n).copied());
                vec![(guest::vgpu_uuid(&d.info), a(50), a(33), a(34))]
            }
            Err(_) => Vec::new(),
        };
        let inputs = integrity::Inputs {
            driver_version: crate::DRIVER_VERSION as u32,
            // SAFETY: getpid and pthread_self have no preconditions.
            pid: unsafe { libc::getpid() } as u32,
            // SAFETY: as above.
            thread: unsafe { libc::pthread_self() } as u32,
            cudart_table: &CUDART_INTERFACE as *const _ as u64,
            integrity_table: &INTEGRITY_CHECK as *const _ as u64,
            check_fn: INTEGRITY_CHECK.0[1] as u64,
            devices,
        };
        out(result, integrity::answer(version, unix_seconds, &inputs))
    })
}

static INTEGRITY_CHECK: Table<3> = Table([
    size(3),
    integrity_check as *const c_void,
    refused::<6, 2> as *const c_void,
]);

// ---------------------------------------------------------------- cuBLASLt's table

/// Slot 4: a context's unique id (as `cuCtxGetId`).
extern "C" fn context_id(ctx: CUcontext, id: *mut u64) -> CuResult {
    // SAFETY: the same contract as cuCtxGetId.
    unsafe { crate::context::cuCtxGetId(ctx, id) }
}

/// Slot 51: cuBLAS asks it, before its first launch, for an object of the
/// driver's about a handle in `arg1` (all ones: an invalid handle). What
/// it reads of the object is not known; an object of zeros is what it
/// accepts (an opaque, zeroed 512-byte block, the same for every handle).
extern "C" fn context_object(_ctx: u64, handle: u64, object: *mut *const u64) -> CuResult {
    static OBJECT: [u64; 64] = [0; 64];
    if object.is_null() {
        return code::INVALID_VALUE;
    }
    if handle == u64::MAX {
        return code::INVALID_HANDLE;
    }
    crate::log_once("export table 7 slot 51 answered with a zeroed object");
    // SAFETY: checked for null; the caller's out-parameter.
    unsafe { object.write(OBJECT.as_ptr()) };
    code::SUCCESS
}

/// Slot 39: cuBLAS asks it, after slot 51, for a value of that object
/// (the driver answers 0 for a kernel of a loaded library).
extern "C" fn object_value(_ctx: u64, object: u64, value: *mut u64) -> CuResult {
    if object == 0 || value.is_null() {
        return code::INVALID_VALUE;
    }
    // SAFETY: checked for null; the caller's out-parameter.
    unsafe { value.write(0) };
    code::SUCCESS
}

/// Table `21318c60`: 93 slots, of which cuBLASLt calls slot 4 before
/// every GEMM and cuBLAS slots 51 and 39 before its first launch.
static CONTEXT_IDS: Table<93> = {
    let mut t = [refused::<7, 0> as *const c_void; 93];
    // Each slot its own stub, so that a log names the slot called.
    each_refused!(t, 7, 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92);
    t[0] = size(93);
    t[4] = context_id as *const c_void;
    t[51] = context_object as *const c_void;
    t[39] = object_value as *const c_void;
    Table(t)
};

/// Table `69a28e9f`: 34 slots a library in PyTorch's process registers
/// callbacks with; the driver answers 0.
static CALLBACKS: Table<34> = {
    let mut t = [quiet::<8, 0> as *const c_void; 34];
    t[0] = size(34);
    Table(t)
};

/// What slot 7 of the tools' module table calls for each kernel: the
/// caller's data, the kernel, and its name (the `cuFuncGetName` string).
type Visit = extern "C" fn(data: *mut c_void, f: CUfunction, name: *const c_char);

/// Slot 7: calls `visit(data, f, name)` for each kernel `f` of `module`,
/// in the module's order, before it returns; answers how many kernels it
/// visited. The context argument is not used.
///
/// cuFFT (12.0, of CUDA 13) is the caller seen: planning a transform, it
/// loads each kernel image with cuModuleLoadData and, having no name for
/// the image's one kernel, gets its handle here with a callback that
/// stores its second argument through its first, taking a return of 1 as
/// success (else `CUFFT_INTERNAL_ERROR`).
///
/// Measured on driver 580 (CUDA 13.0, H100), calling the slot directly:
/// modules of 0, 1, 2 and 3 kernels answer 0, 1, 2 and 3 and call back
/// that many times, in the order of the PTX's `.entry`s; the handles are
/// those cuModuleGetFunction gives, the same on every call, and the name
/// is the pointer cuFuncGetName gives; a null, foreign or bogus context
/// changes nothing; a null callback visits nothing and still answers the
/// count; a library's module (cuLibraryGetModule) lists the library's
/// kernels. A null module crashes the driver: here it, and any module we
/// do not know, answers 0 with no call.
extern "C" fn each_function(
    _ctx: CUcontext,
    module: CUmodule,
    visit: Option<Visit>,
    data: *mut c_void,
) -> u32 {
    let mut found = Vec::new();
    let r = crate::entry(|| {
        let fs = crate::module::functions(module as u64)?;
        let o = objects()?;
        for f in fs {
            // The name lives as long as the kernel's entry (until its
            // module is unloaded).
            let name = o.kernels.get(&f).ok_or(code::UNKNOWN)?.name.as_ptr();
            found.push((f, name));
        }
        Ok(())
    });
    crate::trace("export table 9 slot 7", r);
    if r != code::SUCCESS {
        return 0;
    }
    // No lock of ours is held while the caller's code runs.
    if let Some(visit) = visit {
        for &(f, name) in &found {
            visit(data, f as CUfunction, name);
        }
    }
    found.len() as u32
}

/// Table `6e163fbe`, the tools' module table (`CU_ETID_ToolsModule` in
/// NVIDIA's tools headers): 99 slots, as driver 580 has. Slot 7 is served
/// (see [`each_function`]); every other slot is refused, each logging its
/// own number.
static MODULE_TOOLS: Table<99> = {
    let mut t = [refused::<9, 0> as *const c_void; 99];
    each_refused!(t, 9, 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98);
    t[0] = size(99);
    t[7] = each_function as *const c_void;
    Table(t)
};

/// The identifiers, as the 16 bytes in memory.
fn table(id: &[u8; 16]) -> Option<*const c_void> {
    let t = match id {
        [0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9] => {
            &CUDART_INTERFACE as *const _ as *const c_void
        }
        [0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66] => {
            &TOOLS_HOOKS as *const _ as *const c_void
        }
        [0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc] => {
            &TOOLS_TLS as *const _ as *const c_void
        }
        [0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93] => {
            &CONTEXT_LOCAL_STORAGE as *const _ as *const c_void
        }
        [0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e] => {
            &CONTEXT_CHECKS as *const _ as *const c_void
        }
        [0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2] => {
            &INTEGRITY_CHECK as *const _ as *const c_void
        }
        [0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2] => {
            &CONTEXT_IDS as *const _ as *const c_void
        }
        [0x69, 0xa2, 0x8e, 0x9f, 0x24, 0x49, 0x8b, 0x47, 0xb0, 0x30, 0xc5, 0xda, 0x33, 0x0e, 0xa4, 0xe9] => {
            &CALLBACKS as *const _ as *const c_void
        }
        [0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e] => {
            &MODULE_TOOLS as *const _ as *const c_void
        }
        [0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca] => {
            &cluster::CLUSTERS as *const _ as *const c_void
        }
        _ => return None,
    };
    Some(t)
}

fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

export! {
    /// A table we do not serve (the runtime 13's `f8cff951`, which it only
    /// looks for, graphics and Windows tables) is `CUDA_ERROR_INVALID_VALUE`
    /// with a null table, as the driver answers an unknown identifier.
    fn cuGetExportTable(ptable: *mut *const c_void, id: *const CUuuid) {
        if ptable.is_null() || id.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a 16-byte identifier (API contract).
        let bytes: [u8; 16] = unsafe { (*id).bytes }.map(|b| b as u8);
        match table(&bytes) {
            Some(t) => out(ptable, t),
            None => {
                if std::env::var_os("FAIRVGPU_LIBCUDA_DEBUG").is_some() {
                    crate::log_once(&format!("no export table {}", hex(&bytes)));
                }
                out(ptable, std::ptr::null())?;
                Err(code::INVALID_VALUE)
            }
        }
    }
}
