//! `libnvidia-ml.so.1` for guests: NVML answered from the vGPU.
//!
//! Whatever the host has, a process sees exactly its vGPU, as device 0:
//! its name, its UUID (the host's for it) and PCI address (the same the
//! `libcuda.so.1` stand-in gives: `guest::vgpu_uuid`,
//! `guest::PCI_BUS_ID`), its memory limit as the device's memory,
//! what its processes hold as the host counts it, its share of the GPU as
//! the utilization, and its processes. The figures that change come from
//! the host (`VgpuStatus`) on a channel of this library's own that opens no
//! session: NVML takes no context on the GPU and is not one of the vGPU's
//! processes.
//!
//! | family | module |
//! | --- | --- |
//! | init, shutdown, versions, error strings, device handles | [`system`] |
//! | one device's figures | [`device`] |
//! | event sets (a vGPU raises none) | [`events`] |
//! | the private table `nvidia-smi` asks for (`nvmlInternalGetExportTable`) | [`internal`] |
//! | the connection to the vGPU | `state` |
//! | NVML's structures and constants | `abi` |
//!
//! The versions are the host's: its driver release
//! (`nvmlSystemGetDriverVersion`), NVML's version made of it as NVML makes
//! it ("13.580.65.06"), its CUDA version (no more than the CUDA stand-in
//! implements).
//!
//! Every symbol NVML exports (`data/symbols.txt`, from `nvml.h`) is
//! exported: `build.rs` makes a stub for each one no module serves, which
//! answers `NVML_ERROR_NOT_SUPPORTED` and logs its name once (with
//! `FAIRVGPU_NVML_DEBUG` set). Figures of the physical GPU the host does
//! not pass on (temperature, power, fans, clocks, ECC, serial) are
//! `NVML_ERROR_NOT_SUPPORTED`, which monitoring tools show as "N/A".
//!
//! The vGPU is found as `guest::Gpu::from_env` says: in a VM, the
//! kernel module's `/dev/fairvgpu0` (or `FAIRVGPU_DEVICE`); on the host and
//! in tests, `FAIRVGPU_SOCKET`. Every exported function catches panics and
//! checks every pointer it is given.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::collections::HashSet;
use std::ffi::c_char;
use std::sync::Mutex;

/// `nvmlReturn_t` as the C ABI carries it.
pub type Ret = u32;

/// The `nvmlReturn_t` codes, with NVML's own wording ([`describe`]).
pub(crate) mod code {
    #![allow(missing_docs, dead_code)]
    use super::Ret;
    pub const SUCCESS: Ret = 0;
    pub const UNINITIALIZED: Ret = 1;
    pub const INVALID_ARGUMENT: Ret = 2;
    pub const NOT_SUPPORTED: Ret = 3;
    pub const NOT_FOUND: Ret = 6;
    pub const INSUFFICIENT_SIZE: Ret = 7;
    pub const DRIVER_NOT_LOADED: Ret = 9;
    pub const FUNCTION_NOT_FOUND: Ret = 13;
    pub const GPU_IS_LOST: Ret = 15;
    pub const ARGUMENT_VERSION_MISMATCH: Ret = 25;
    pub const UNKNOWN: Ret = 999;
}

/// Runs an entry point's body: its `Err` is the call's `nvmlReturn_t`, and
/// a panic (a bug here) becomes `NVML_ERROR_UNKNOWN` instead of unwinding
/// into C.
pub(crate) fn entry(f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => code::UNKNOWN,
    }
}

/// Writes `v` to out-parameter `p`; null is an invalid argument.
pub(crate) fn out<T>(p: *mut T, v: T) -> Result<(), Ret> {
    if p.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    // SAFETY: a non-null out-parameter the caller provides for a value of
    // this type (NVML's contract).
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes `text` NUL-terminated into the caller's `len`-byte buffer; one
/// too small is `NVML_ERROR_INSUFFICIENT_SIZE`, as NVML answers.
pub(crate) fn out_str(buf: *mut c_char, len: u32, text: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    let b = text.as_bytes();
    if (len as usize) < b.len() + 1 {
        return Err(code::INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller provides `len` writable bytes at `buf` (NVML's
    // contract), and `len` holds the text and its NUL.
    let dst = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), b.len() + 1) };
    dst[..b.len()].copy_from_slice(b);
    dst[b.len()] = 0;
    Ok(())
}

/// A C string argument (null is an invalid argument).
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(p: *const c_char) -> Result<&'a str, Ret> {
    if p.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    let s = unsafe { std::ffi::CStr::from_ptr(p) };
    s.to_str().map_err(|_| code::INVALID_ARGUMENT)
}

/// NVML's wording for `nvmlReturn_t` `r` (what `nvmlErrorString` answers).
pub(crate) fn describe(r: Ret) -> &'static std::ffi::CStr {
    match r {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt Request Issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"ECC is not supported in vGPU",
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        30 => c"Reset type not supported",
        _ => c"Unknown Error",
    }
}

/// Logs `what` on standard error once per process, where
/// `FAIRVGPU_NVML_DEBUG` asks for it (monitoring tools probe many entry
/// points; their output stays clean otherwise).
pub(crate) fn log_once(what: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    if std::env::var_os("FAIRVGPU_NVML_DEBUG").is_none() {
        return;
    }
    let mut g = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if g.get_or_insert_with(HashSet::new).insert(what.to_owned()) {
        eprintln!("fairvgpu libnvidia-ml: {what}");
    }
}

/// What every entry point that no module serves answers.
pub(crate) fn unserved(symbol: &str) -> Ret {
    log_once(&format!(
        "{symbol} is not supported; returning NVML_ERROR_NOT_SUPPORTED"
    ));
    code::NOT_SUPPORTED
}

/// Defines exported entry points: `fn nvmlName [aliases] (args) { body }`,
/// the body returning `Result<(), Ret>`; panics are caught. `build.rs`
/// reads these `fn` lines to know which symbols are served.
macro_rules! export {
    ($(
        $(#[$meta:meta])*
        fn $name:ident $([$($alias:ident),*])? ($($params:tt)*) $body:block
    )*) => {$(
        export!(@fn $(#[$meta])* $name ($($params)*) $body);
        export!(@aliases $name ($($params)*) [$($($alias),*)?]);
    )*};
    (@fn $(#[$meta:meta])* $name:ident ($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::Ret {
            $crate::entry(|| -> ::std::result::Result<(), $crate::Ret> { $body })
        }
    };
    (@aliases $name:ident $params:tt [$($alias:ident),*]) => {
        $(export!(@alias $name $alias $params);)*
    };
    (@alias $name:ident $alias:ident ($($arg:ident : $ty:ty),* $(,)?)) => {
        #[doc = concat!("`", stringify!($alias), "`: the same as [`", stringify!($name), "`].")]
        #[no_mangle]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $crate::Ret {
            // SAFETY: the caller keeps the contract of the function it names.
            unsafe { $name($($arg),*) }
        }
    };
}

mod abi;
mod state;

pub mod device;
pub mod events;
pub mod internal;
pub mod system;

/// Exported stubs for the symbols no module serves (made by `build.rs`).
pub mod unserved_stubs {
    include!(concat!(env!("OUT_DIR"), "/unserved.rs"));
}
