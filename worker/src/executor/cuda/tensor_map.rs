//! Tensor-map descriptors encoded by the driver (`cuTensorMapEncodeTiled`,
//! `cuTensorMapEncodeIm2col`, `cuTensorMapReplaceAddress`).
//!
//! The functions are looked up with `cuGetProcAddress` and called with their
//! enum arguments as the plain integers `protocol::tensor_map` checked, so
//! no value the guest chose is ever held in a Rust enum.

use std::ffi::{c_void, CStr};

use cudarc::driver::sys;
use protocol::tensor_map::{TensorMapKind, TensorMapParams, TENSOR_MAP_BYTES};
use protocol::Status;

use super::check;

type Tiled = unsafe extern "C" fn(
    *mut [u8; TENSOR_MAP_BYTES],
    u32,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
) -> sys::CUresult;

type Im2col = unsafe extern "C" fn(
    *mut [u8; TENSOR_MAP_BYTES],
    u32,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    *const i32,
    *const i32,
    u32,
    u32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
) -> sys::CUresult;

type Replace = unsafe extern "C" fn(*mut [u8; TENSOR_MAP_BYTES], *mut c_void) -> sys::CUresult;

/// The driver's entry point `name`.
fn entry(name: &CStr) -> Result<*mut c_void, Status> {
    let mut f = std::ptr::null_mut();
    // SAFETY: a NUL-terminated name; out-parameters on our stack; a null
    // status pointer is allowed.
    check(unsafe {
        sys::cuGetProcAddress_v2(name.as_ptr(), &mut f, 12000, 0, std::ptr::null_mut())
    })?;
    if f.is_null() {
        return Err(Status::NotSupported);
    }
    Ok(f)
}

/// Encodes `p` (checked by its decoding) with the current context's driver.
pub(super) fn encode(p: &TensorMapParams) -> Result<[u8; TENSOR_MAP_BYTES], Status> {
    let mut map = [0u8; TENSOR_MAP_BYTES];
    let addr = p.address as *mut c_void;
    let r = match p.kind {
        TensorMapKind::Tiled => {
            let f = entry(c"cuTensorMapEncodeTiled")?;
            // SAFETY: the driver's cuTensorMapEncodeTiled, whose enum
            // arguments are 32-bit integers in the C ABI.
            let f: Tiled = unsafe { std::mem::transmute::<*mut c_void, Tiled>(f) };
            // SAFETY: arrays of `rank` entries (rank <= 5, checked), the
            // descriptor on our stack.
            unsafe {
                f(
                    &mut map,
                    p.dtype,
                    p.rank,
                    addr,
                    p.dims.as_ptr(),
                    p.strides.as_ptr(),
                    p.box_dim.as_ptr(),
                    p.elem_strides.as_ptr(),
                    p.interleave,
                    p.swizzle,
                    p.l2_promotion,
                    p.oob_fill,
                )
            }
        }
        TensorMapKind::Im2col => {
            let f = entry(c"cuTensorMapEncodeIm2col")?;
            // SAFETY: as above, for cuTensorMapEncodeIm2col.
            let f: Im2col = unsafe { std::mem::transmute::<*mut c_void, Im2col>(f) };
            // SAFETY: as above (corners have rank - 2 <= 3 entries).
            unsafe {
                f(
                    &mut map,
                    p.dtype,
                    p.rank,
                    addr,
                    p.dims.as_ptr(),
                    p.strides.as_ptr(),
                    p.lower.as_ptr(),
                    p.upper.as_ptr(),
                    p.channels_per_pixel,
                    p.pixels_per_column,
                    p.elem_strides.as_ptr(),
                    p.interleave,
                    p.swizzle,
                    p.l2_promotion,
                    p.oob_fill,
                )
            }
        }
        TensorMapKind::Replace => {
            map = p.map;
            let f = entry(c"cuTensorMapReplaceAddress")?;
            // SAFETY: the driver's cuTensorMapReplaceAddress.
            let f: Replace = unsafe { std::mem::transmute::<*mut c_void, Replace>(f) };
            // SAFETY: the descriptor on our stack.
            unsafe { f(&mut map, addr) }
        }
    };
    check(r)?;
    Ok(map)
}
