//! Hopper's tensor-map descriptors, encoded by the host's driver (the
//! format is the driver's): `cuTensorMapEncodeTiled`,
//! `cuTensorMapEncodeIm2col`, `cuTensorMapReplaceAddress`.
//!
//! The host checks that the tensor lies in the process's own memory. To
//! check a new address the host needs the tensor's shape, which the
//! descriptor does not say: the shapes of the descriptors made here are
//! kept, by their bytes.

use std::collections::HashMap;
use std::ffi::{c_uint, c_void};

use protocol::tensor_map::{TensorMapKind, TensorMapParams, TENSOR_MAP_BYTES};

use crate::state::gpu;
use crate::state::process::{lock, TensorMap as Map, TENSOR_MAPS};
use crate::{code, CuResult};

const KEEP: usize = 4096;

fn remember(map: Map, p: TensorMapParams) {
    let mut g = lock(&TENSOR_MAPS);
    let m = g.get_or_insert_with(HashMap::new);
    if m.len() >= KEEP {
        m.clear();
    }
    m.insert(map, p);
}

/// `n` values at `p` (none if `n` is 0), copied into a zero-padded array.
fn array<T: Copy + Default, const N: usize>(p: *const T, n: usize) -> Result<[T; N], CuResult> {
    let mut a = [T::default(); N];
    if n == 0 {
        return Ok(a);
    }
    if p.is_null() || n > N {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: `n` values at `p` (the API's contract for each array).
    a[..n].copy_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
    Ok(a)
}

/// Asks the host to encode `p`; writes the descriptor to `out`.
fn encode(out: *mut Map, p: TensorMapParams) -> Result<(), CuResult> {
    if out.is_null() {
        return Err(code::INVALID_VALUE);
    }
    crate::state::thread::need_ctx()?;
    let bytes = gpu(|g| g.tensor_map(&p.encode()))?;
    let map: Map = bytes.try_into().map_err(|_| code::UNKNOWN)?;
    // SAFETY: checked for null; the caller's descriptor to fill.
    unsafe { out.write_unaligned(map) };
    remember(map, TensorMapParams { map, ..p });
    Ok(())
}

fn base(dtype: c_uint, rank: c_uint, addr: *mut c_void) -> TensorMapParams {
    TensorMapParams {
        kind: TensorMapKind::Tiled,
        dtype,
        rank,
        address: addr as u64,
        dims: [0; 5],
        strides: [0; 4],
        box_dim: [0; 5],
        elem_strides: [0; 5],
        interleave: 0,
        swizzle: 0,
        l2_promotion: 0,
        oob_fill: 0,
        lower: [0; 3],
        upper: [0; 3],
        channels_per_pixel: 0,
        pixels_per_column: 0,
        map: [0; TENSOR_MAP_BYTES],
    }
}

export! {
    fn cuTensorMapEncodeTiled(out: *mut Map, dtype: c_uint, rank: c_uint, addr: *mut c_void, dims: *const u64, strides: *const u64, boxes: *const u32, elem: *const u32, interleave: c_uint, swizzle: c_uint, l2: c_uint, oob: c_uint) {
        let r = rank as usize;
        if !(1..=5).contains(&r) {
            return Err(code::INVALID_VALUE);
        }
        let p = TensorMapParams {
            dims: array(dims, r)?,
            strides: array(strides, r - 1)?,
            box_dim: array(boxes, r)?,
            elem_strides: array(elem, r)?,
            interleave,
            swizzle,
            l2_promotion: l2,
            oob_fill: oob,
            ..base(dtype, rank, addr)
        };
        encode(out, p)
    }

    fn cuTensorMapEncodeIm2col(out: *mut Map, dtype: c_uint, rank: c_uint, addr: *mut c_void, dims: *const u64, strides: *const u64, lower: *const i32, upper: *const i32, channels: c_uint, pixels: c_uint, elem: *const u32, interleave: c_uint, swizzle: c_uint, l2: c_uint, oob: c_uint) {
        let r = rank as usize;
        if !(3..=5).contains(&r) {
            return Err(code::INVALID_VALUE);
        }
        let p = TensorMapParams {
            kind: TensorMapKind::Im2col,
            dims: array(dims, r)?,
            strides: array(strides, r - 1)?,
            lower: array(lower, r - 2)?,
            upper: array(upper, r - 2)?,
            channels_per_pixel: channels,
            pixels_per_column: pixels,
            elem_strides: array(elem, r)?,
            interleave,
            swizzle,
            l2_promotion: l2,
            oob_fill: oob,
            ..base(dtype, rank, addr)
        };
        encode(out, p)
    }

    /// Only descriptors this process made can be changed (the host checks
    /// the tensor at its new address against the shape they were made
    /// with).
    fn cuTensorMapReplaceAddress(map: *mut Map, addr: *mut c_void) {
        if map.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: checked for null; the caller's descriptor.
        let old = unsafe { map.read_unaligned() };
        let p = lock(&TENSOR_MAPS)
            .as_ref()
            .and_then(|m| m.get(&old).copied())
            .ok_or(code::INVALID_VALUE)?;
        encode(map, TensorMapParams { kind: TensorMapKind::Replace, address: addr as u64, map: old, ..p })
    }
}
