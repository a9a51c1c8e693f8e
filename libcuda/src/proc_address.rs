//! `cuGetProcAddress`: entry points by base name, with the driver's
//! version rules.
//!
//! The table (made by `build.rs` from `data/entry_points.tsv`) has a row
//! per exported symbol: its base name, the CUDA version that introduced
//! that variant, and whether it is the per-thread default stream flavour
//! (`_ptds`/`_ptsz`). A caller asking for `base` at version `v` gets the
//! newest variant introduced at or before `v`; with
//! `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, that variant's
//! per-thread flavour where it has one.

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::state::out;
use crate::{code, CuResult};

/// Which default stream a variant uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavour {
    /// The legacy default stream (the plain symbol).
    Legacy,
    /// The per-thread default stream (`_ptds`/`_ptsz`).
    PerThread,
}

/// A function's address (a plain pointer the table may hold).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Addr(pub *const ());

// SAFETY: the addresses are of functions, immutable for the process's life.
unsafe impl Sync for Addr {}

/// One exported symbol.
#[derive(Debug)]
pub(crate) struct EntryPoint {
    pub symbol: &'static str,
    pub base: &'static str,
    pub version: u32,
    pub flavour: Flavour,
    pub addr: Addr,
}

include!(concat!(env!("OUT_DIR"), "/entry_points.rs"));

/// `CUdriverProcAddressQueryResult`.
const FOUND: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;
const VERSION_NOT_SUFFICIENT: c_int = 2;

/// `CU_GET_PROC_ADDRESS_*` flags.
const LEGACY_STREAM: u64 = 1 << 0;
const PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// The entry point `base` at `version` resolves to, or the
/// `CUdriverProcAddressQueryResult` saying why there is none.
pub(crate) fn lookup(base: &str, version: u32, flags: u64) -> Result<&'static EntryPoint, c_int> {
    let start = ENTRY_POINTS.partition_point(|e| e.base < base);
    let rows = &ENTRY_POINTS[start..];
    let rows = &rows[..rows.partition_point(|e| e.base == base)];
    if rows.is_empty() {
        return Err(SYMBOL_NOT_FOUND);
    }
    // Rows of one base are sorted by version.
    let plain = rows
        .iter()
        .rev()
        .find(|e| e.flavour == Flavour::Legacy && e.version <= version)
        .ok_or(VERSION_NOT_SUFFICIENT)?;
    let per_thread = flags & PER_THREAD_DEFAULT_STREAM != 0 && flags & LEGACY_STREAM == 0;
    if per_thread {
        let flavoured = rows.iter().find(|e| {
            e.flavour == Flavour::PerThread
                && e.version <= version
                && e.symbol.len() == plain.symbol.len() + 5
                && e.symbol.starts_with(plain.symbol)
        });
        if let Some(e) = flavoured {
            return Ok(e);
        }
        // Per-thread flavours began with CUDA 7.0: asked for earlier, there
        // is none yet.
        if rows.iter().any(|e| e.flavour == Flavour::PerThread) {
            return Err(VERSION_NOT_SUFFICIENT);
        }
    }
    Ok(plain)
}

/// Looks `symbol` up, answering as `cuGetProcAddress_v2` does on a CUDA
/// 13 driver: a name not found, or asked for at a version older than its
/// first, is success with a null pointer and the reason in `status`; a
/// version newer than the driver is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `symbol` must be a NUL-terminated string; `pfn` and `status` writable
/// (or null).
unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Result<(), CuResult> {
    if symbol.is_null() || pfn.is_null() || version > crate::DRIVER_VERSION {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: NUL-terminated (this function's contract).
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let result = lookup(&name, version.max(0) as u32, flags);
    let (addr, found) = match result {
        Ok(e) => (e.addr.0 as *mut c_void, FOUND),
        Err(why) => {
            // Loaders resolve every entry point up front; a miss matters
            // only if the program then needs it.
            if std::env::var_os("FAIRVGPU_LIBCUDA_DEBUG").is_some() {
                eprintln!("fairvgpu libcuda: no entry point {name} at version {version} ({why})");
            }
            (std::ptr::null_mut(), why)
        }
    };
    out(pfn, addr)?;
    crate::state::out_opt(status, found)
}

export! {
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) {
        // SAFETY: the caller's arguments, per the API contract.
        unsafe { get_proc_address(symbol, pfn, version, flags, status) }
    }

    /// The CUDA 11.3-11.8 signature, without the status out-parameter.
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
        // SAFETY: the caller's arguments, per the API contract.
        unsafe { get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(base: &str, version: u32, flags: u64) -> Result<&'static str, c_int> {
        lookup(base, version, flags).map(|e| e.symbol)
    }

    #[test]
    fn the_table_is_sorted_and_complete() {
        assert_eq!(ENTRY_POINTS.len(), 674);
        assert!(ENTRY_POINTS
            .windows(2)
            .all(|w| (w[0].base, w[0].version) <= (w[1].base, w[1].version)));
    }

    #[test]
    fn versions_pick_the_newest_variant_at_or_before_them() {
        assert_eq!(sym("cuMemAlloc", 13000, 0), Ok("cuMemAlloc_v2"));
        assert_eq!(sym("cuMemAlloc", 3010, 0), Ok("cuMemAlloc"));
        assert_eq!(sym("cuCtxCreate", 12000, 0), Ok("cuCtxCreate_v3"));
        assert_eq!(sym("cuCtxCreate", 13000, 0), Ok("cuCtxCreate_v4"));
        assert_eq!(sym("cuGetProcAddress", 12000, 0), Ok("cuGetProcAddress_v2"));
        assert_eq!(sym("cuGetProcAddress", 11030, 0), Ok("cuGetProcAddress"));
        assert_eq!(sym("cuMemAlloc", 1000, 0), Err(VERSION_NOT_SUFFICIENT));
        assert_eq!(sym("cuNoSuchThing", 13000, 0), Err(SYMBOL_NOT_FOUND));
        // Variant names are not base names.
        assert_eq!(sym("cuMemAlloc_v2", 13000, 0), Err(SYMBOL_NOT_FOUND));
    }

    #[test]
    fn per_thread_flavours_follow_the_flag() {
        assert_eq!(
            sym("cuMemcpyHtoD", 13000, PER_THREAD_DEFAULT_STREAM),
            Ok("cuMemcpyHtoD_v2_ptds")
        );
        assert_eq!(
            sym("cuMemcpyHtoDAsync", 13000, PER_THREAD_DEFAULT_STREAM),
            Ok("cuMemcpyHtoDAsync_v2_ptsz")
        );
        assert_eq!(
            sym("cuMemcpyHtoD", 13000, LEGACY_STREAM),
            Ok("cuMemcpyHtoD_v2")
        );
        assert_eq!(
            sym("cuMemcpyHtoD", 3020, PER_THREAD_DEFAULT_STREAM),
            Err(VERSION_NOT_SUFFICIENT)
        );
        // No per-thread flavour: the plain one.
        assert_eq!(
            sym("cuMemAlloc", 13000, PER_THREAD_DEFAULT_STREAM),
            Ok("cuMemAlloc_v2")
        );
    }
}
