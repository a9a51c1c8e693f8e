//! Device memory: allocation, copies, memsets, and what a pointer is.
//!
//! Device pointers are the host worker's device addresses. The process's
//! device ranges are kept here (`state::Objects::ranges`), so that
//! copies of inferred direction (`cuMemcpy`) and pointer queries are
//! answered without a round trip.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUstream};

use crate::alloc::{device_alloc, free_device};
use crate::copy_nd::Box3d;
use crate::graph::{MemsetOp, Op};
use crate::managed::work;
use crate::state::thread::resolve;
use crate::state::thread::{current, need_ctx};
use crate::state::{gpu, host_dst, host_src, objects, out, out_opt, RangeKind};
use crate::{code, memtype, CuResult};

/// Whether `ptr` lies in a device range of the process.
pub(crate) fn is_device(ptr: u64) -> Result<bool, CuResult> {
    Ok(objects()?.range_of(ptr).is_some())
}

fn alloc(p: *mut CUdeviceptr, size: usize) -> Result<(), CuResult> {
    need_ctx()?;
    if size == 0 || p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    let d = device_alloc(size as u64)?;
    out(p, d)
}

fn free(p: CUdeviceptr) -> Result<(), CuResult> {
    need_ctx()?;
    if p == 0
        || crate::managed::free(p)?
        || crate::host_memory::free_managed(p)?
        || crate::graph::memory::free_outside(p)?
        || crate::mem_pool::free_imported(p, None)?
    {
        return Ok(());
    }
    match objects()?.ranges.get(&p) {
        Some(r) if r.kind == RangeKind::Device => {}
        _ => return Err(code::INVALID_VALUE),
    }
    free_device(p)
}

/// Frees managed memory at `p` (on the device or in the pinned pool);
/// an invalid value if `p` is no managed allocation's start.
pub(crate) fn free_managed_any(p: CUdeviceptr) -> Result<(), CuResult> {
    if crate::managed::free(p)? || crate::host_memory::free_managed(p)? {
        Ok(())
    } else {
        Err(code::INVALID_VALUE)
    }
}

pub(crate) fn htod(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    st: CUstream,
    sync: bool,
) -> CuResult2 {
    need_ctx()?;
    if n == 0 {
        // Nothing to copy: success whatever the addresses, as natively.
        return Ok(());
    }
    if captured(
        st,
        Box3d::linear((dst, true), (src as u64, false), n as u64),
    )? {
        return Ok(());
    }
    if pinned_device(dst, n) {
        return copy_inferred(dst, src as u64, n, st, sync);
    }
    if crate::managed::contains(src as u64, n as u64) {
        // Managed memory is the device's: copied there, never read here.
        return dtod(dst, src as u64, n, st, sync);
    }
    let stream = resolve(st)?;
    if let Some(off) = crate::host_memory::pinned_span(src as u64, n as u64) {
        // DMA from the pinned pool when the stream gets there.
        return work(stream, |g| {
            g.memcpy_htod_pinned(dst, off, n as u64, stream)?;
            if sync {
                g.stream_synchronize(stream)?;
            }
            Ok(())
        });
    }
    // SAFETY: the caller passes `n` readable bytes at `src` (API contract).
    let b = unsafe { host_src(src, n) }?;
    // The bytes are in the ring when this returns, so the caller may reuse
    // its buffer at once (stricter than CUDA requires of async copies).
    work(stream, |g| {
        g.memcpy_htod_async(dst, b, stream)?;
        if sync {
            g.stream_synchronize(stream)?;
        }
        Ok(())
    })
}

pub(crate) fn dtoh(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    st: CUstream,
    sync: bool,
) -> CuResult2 {
    need_ctx()?;
    if n == 0 {
        // Nothing to copy: success whatever the addresses, as natively.
        return Ok(());
    }
    if captured(
        st,
        Box3d::linear((dst as u64, false), (src, true), n as u64),
    )? {
        return Ok(());
    }
    if pinned_device(src, n) {
        return copy_inferred(dst as u64, src, n, st, sync);
    }
    if crate::managed::contains(dst as u64, n as u64) {
        // Managed memory is the device's: copied there, never written here.
        return dtod(dst as u64, src, n, st, sync);
    }
    let stream = resolve(st)?;
    if let Some(off) = crate::host_memory::pinned_span(dst as u64, n as u64) {
        // DMA into the pinned pool when the stream gets there: an
        // asynchronous copy returns at once, as on a GPU.
        return work(stream, |g| {
            g.memcpy_dtoh_pinned(src, off, n as u64, stream)?;
            if sync {
                g.stream_synchronize(stream)?;
            }
            Ok(())
        });
    }
    // SAFETY: the caller passes `n` writable bytes at `dst` (API contract).
    let b = unsafe { host_dst(dst, n) }?;
    // Completes before returning (allowed for asynchronous copies to
    // pageable memory).
    work(stream, |g| g.memcpy_dtoh(b, src, stream))
}

pub(crate) fn dtod(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    st: CUstream,
    sync: bool,
) -> CuResult2 {
    need_ctx()?;
    if n == 0 {
        return Ok(());
    }
    if captured(st, Box3d::linear((dst, true), (src, true), n as u64))? {
        return Ok(());
    }
    if pinned_device(dst, n) || pinned_device(src, n) {
        return copy_inferred(dst, src, n, st, sync);
    }
    let stream = resolve(st)?;
    work(stream, |g| {
        g.memcpy_dtod_async(dst, src, n as u64, stream)?;
        if sync {
            g.stream_synchronize(stream)?;
        }
        Ok(())
    })
}

/// The process's own address of a host pointer: itself, or for a device
/// address of the pinned pool, the pool's address here.
pub(crate) fn host_view(ptr: u64, n: usize) -> u64 {
    match crate::host_memory::pinned_span(ptr, n as u64) {
        Some(off) => crate::host_memory::host_address(off).unwrap_or(ptr),
        None => ptr,
    }
}

/// A copy whose direction the pointers tell (unified addressing): device
/// memory is what the process allocated on the device; anything else is
/// host memory (pinned or not).
fn copy_inferred(dst: u64, src: u64, n: usize, st: CUstream, sync: bool) -> CuResult2 {
    need_ctx()?;
    if n == 0 {
        return Ok(());
    }
    match (is_device(dst)?, is_device(src)?) {
        (true, true) => dtod(dst, src, n, st, sync),
        (true, false) => htod(dst, host_view(src, n) as *const c_void, n, st, sync),
        (false, true) => dtoh(host_view(dst, n) as *mut c_void, src, n, st, sync),
        (false, false) => {
            if captured(st, Box3d::linear((dst, false), (src, false), n as u64))? {
                return Ok(());
            }
            // Host to host: the stream's earlier work first, as the driver
            // orders it.
            let stream = resolve(st)?;
            gpu(|g| g.stream_synchronize(stream))?;
            let (d, s) = (host_view(dst, n), host_view(src, n));
            // SAFETY: the caller passes `n` readable bytes at `src` and `n`
            // writable bytes at `dst` (API contract); the ranges may overlap
            // only if the caller's may.
            unsafe { std::ptr::copy(s as *const u8, d as *mut u8, n) };
            Ok(())
        }
    }
}

type CuResult2 = Result<(), CuResult>;

/// Whether a "device" pointer of a copy is mapped page-locked memory (the
/// pinned pool's device address, as `cuMemHostGetDevicePointer` gives):
/// host memory here, copied as such.
fn pinned_device(ptr: u64, n: usize) -> bool {
    n > 0 && crate::host_memory::pinned_span(ptr, n as u64).is_some()
}

/// Adds a copy to `st`'s capture if it is capturing (true).
fn captured(st: CUstream, b: Box3d) -> Result<bool, CuResult> {
    crate::graph::capture::add(st, || Ok(Op::Copy(b)))
}

fn memset(dst: CUdeviceptr, v: u32, width: u32, n: usize, st: CUstream, sync: bool) -> CuResult2 {
    need_ctx()?;
    let op = MemsetOp {
        dst,
        pitch: 0,
        value: v,
        elem: width,
        width: n,
        height: 1,
    };
    if crate::graph::capture::add(st, || Ok(Op::Memset(op)))? {
        return Ok(());
    }
    let stream = resolve(st)?;
    work(stream, |g| {
        g.memset_async(dst, v, width, n as u64, stream)?;
        if sync {
            g.stream_synchronize(stream)?;
        }
        Ok(())
    })
}

/// A 2D memset: `height` rows of `width` elements, `pitch` bytes apart.
#[allow(clippy::too_many_arguments)]
pub(crate) fn memset_2d(
    dst: CUdeviceptr,
    pitch: usize,
    v: u32,
    elem: u32,
    width: usize,
    height: usize,
    st: CUstream,
    sync: bool,
) -> CuResult2 {
    need_ctx()?;
    if height > 1 && pitch < width.saturating_mul(elem as usize) {
        return Err(code::INVALID_VALUE);
    }
    let op = MemsetOp {
        dst,
        pitch,
        value: v,
        elem,
        width,
        height,
    };
    if crate::graph::capture::add(st, || Ok(Op::Memset(op)))? {
        return Ok(());
    }
    let stream = resolve(st)?;
    work(stream, |g| {
        for row in 0..height as u64 {
            g.memset_async(dst + row * pitch as u64, v, elem, width as u64, stream)?;
        }
        if sync {
            g.stream_synchronize(stream)?;
        }
        Ok(())
    })
}

/// One pointer's attribute `attr` written to `data`; `Err` for a pointer
/// the process does not hold or an attribute we do not answer.
fn pointer_attribute(data: *mut c_void, attr: c_int, ptr: u64) -> CuResult2 {
    if let Some(a) = crate::host_memory::attribute(ptr, attr) {
        return a?.write(data);
    }
    let (base, r) = objects()?.range_of(ptr).ok_or(code::INVALID_VALUE)?;
    let managed = r.kind == RangeKind::Managed;
    match attr {
        // Managed memory is a host pointer too, at the same address.
        4 if managed => out(data as *mut u64, ptr), // HOST_POINTER
        8 => out(data as *mut c_int, c_int::from(managed)), // IS_MANAGED
        1 => out(data as *mut CUcontext, current() as CUcontext), // CONTEXT
        2 => out(data as *mut c_uint, memtype::DEVICE), // MEMORY_TYPE
        3 => out(data as *mut CUdeviceptr, ptr),    // DEVICE_POINTER
        4 => Err(code::INVALID_VALUE),              // HOST_POINTER
        6 => out(data as *mut c_int, 1),            // SYNC_MEMOPS
        7 | 20 => out(data as *mut u64, base),      // BUFFER_ID, MEMORY_BLOCK_ID
        9 => out(data as *mut c_int, 0),            // DEVICE_ORDINAL
        10 | 15 => out(data as *mut c_int, 0), // LEGACY_CUDA_IPC_CAPABLE, GPU_DIRECT_RDMA_CAPABLE
        11 | 19 => out(data as *mut CUdeviceptr, base), // RANGE_START_ADDR, MAPPING_BASE_ADDR
        12 | 18 => out(data as *mut usize, r.size as usize), // RANGE_SIZE, MAPPING_SIZE
        13 => out(data as *mut c_int, 1),      // MAPPED
        14 => out(data as *mut u64, 0),        // ALLOWED_HANDLE_TYPES
        16 => out(data as *mut c_int, 3),      // ACCESS_FLAGS: read-write
        17 => out(data as *mut *mut c_void, std::ptr::null_mut()), // MEMPOOL_HANDLE
        21 => out(data as *mut c_int, 0),      // IS_HW_DECOMPRESS_CAPABLE
        _ => Err(crate::not_supported(&format!(
            "cuPointerGetAttribute({attr})"
        ))),
    }
}

/// The range of page-locked or managed memory holding `ptr`: its start
/// and size.
fn pool_range(ptr: u64) -> Option<(u64, u64)> {
    use crate::host_memory::Attr;
    let get = |a| match crate::host_memory::attribute(ptr, a)? {
        Ok(Attr::U64(v)) => Some(v),
        _ => None,
    };
    Some((get(11)?, get(12)?)) // RANGE_START_ADDR, RANGE_SIZE
}

/// The value `cuPointerGetAttributes` gives attribute `attr` of a pointer
/// the process does not hold: zero of the attribute's width.
fn attribute_width(attr: c_int) -> usize {
    match attr {
        1 | 3 | 4 | 7 | 11 | 12 | 14 | 17 | 18 | 19 | 20 => 8,
        5 => 16, // P2P_TOKENS: two u64s
        _ => 4,
    }
}

export! {
    fn cuMemAlloc_v2(p: *mut CUdeviceptr, size: usize) {
        alloc(p, size)
    }

    /// Rows of `width` bytes, each starting at a multiple of the pitch
    /// alignment.
    fn cuMemAllocPitch_v2(p: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) {
        if width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) || pitch.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let row = width.checked_next_multiple_of(512).ok_or(code::INVALID_VALUE)?;
        let size = row.checked_mul(height).ok_or(code::INVALID_VALUE)?;
        alloc(p, size)?;
        out(pitch, row)
    }

    fn cuMemFree_v2(p: CUdeviceptr) {
        free(p)
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        need_ctx()?;
        let (f, t) = gpu(|g| g.mem_get_info())?;
        out(free, f as usize)?;
        out(total, t as usize)
    }

    fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr) {
        need_ctx()?;
        let found = objects()?.range_of(ptr).map(|(b, r)| (b, r.size));
        // Page-locked and managed memory: its block, as the driver answers
        // for a mapped host allocation (Numba sizes a mapped array's memset
        // this way).
        let (b, n) = match found {
            Some(f) => f,
            None => pool_range(ptr).ok_or(code::NOT_FOUND)?,
        };
        out_opt(base, b)?;
        out_opt(size, n as usize)
    }

    fn cuMemcpyHtoD_v2 [cuMemcpyHtoD_v2_ptds per_thread] (dst: CUdeviceptr, src: *const c_void, n: usize) {
        htod(dst, src, n, std::ptr::null_mut(), true)
    }

    fn cuMemcpyHtoDAsync_v2 [cuMemcpyHtoDAsync_v2_ptsz per_thread] (dst: CUdeviceptr, src: *const c_void, n: usize, st: CUstream) {
        htod(dst, src, n, st, false)
    }

    fn cuMemcpyDtoH_v2 [cuMemcpyDtoH_v2_ptds per_thread] (dst: *mut c_void, src: CUdeviceptr, n: usize) {
        dtoh(dst, src, n, std::ptr::null_mut(), true)
    }

    fn cuMemcpyDtoHAsync_v2 [cuMemcpyDtoHAsync_v2_ptsz per_thread] (dst: *mut c_void, src: CUdeviceptr, n: usize, st: CUstream) {
        dtoh(dst, src, n, st, false)
    }

    fn cuMemcpyDtoD_v2 [cuMemcpyDtoD_v2_ptds per_thread] (dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        dtod(dst, src, n, std::ptr::null_mut(), true)
    }

    fn cuMemcpyDtoDAsync_v2 [cuMemcpyDtoDAsync_v2_ptsz per_thread] (dst: CUdeviceptr, src: CUdeviceptr, n: usize, st: CUstream) {
        dtod(dst, src, n, st, false)
    }

    fn cuMemcpy [cuMemcpy_ptds per_thread] (dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        copy_inferred(dst, src, n, std::ptr::null_mut(), true)
    }

    fn cuMemcpyAsync [cuMemcpyAsync_ptsz per_thread] (dst: CUdeviceptr, src: CUdeviceptr, n: usize, st: CUstream) {
        copy_inferred(dst, src, n, st, false)
    }

    fn cuMemsetD8_v2 [cuMemsetD8_v2_ptds per_thread] (dst: CUdeviceptr, v: u8, n: usize) {
        memset(dst, u32::from(v), 1, n, std::ptr::null_mut(), true)
    }

    fn cuMemsetD16_v2 [cuMemsetD16_v2_ptds per_thread] (dst: CUdeviceptr, v: u16, n: usize) {
        memset(dst, u32::from(v), 2, n, std::ptr::null_mut(), true)
    }

    fn cuMemsetD32_v2 [cuMemsetD32_v2_ptds per_thread] (dst: CUdeviceptr, v: u32, n: usize) {
        memset(dst, v, 4, n, std::ptr::null_mut(), true)
    }

    fn cuMemsetD8Async [cuMemsetD8Async_ptsz per_thread] (dst: CUdeviceptr, v: u8, n: usize, st: CUstream) {
        memset(dst, u32::from(v), 1, n, st, false)
    }

    fn cuMemsetD16Async [cuMemsetD16Async_ptsz per_thread] (dst: CUdeviceptr, v: u16, n: usize, st: CUstream) {
        memset(dst, u32::from(v), 2, n, st, false)
    }

    fn cuMemsetD32Async [cuMemsetD32Async_ptsz per_thread] (dst: CUdeviceptr, v: u32, n: usize, st: CUstream) {
        memset(dst, v, 4, n, st, false)
    }

    fn cuMemsetD2D8_v2 [cuMemsetD2D8_v2_ptds per_thread] (dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize) {
        memset_2d(dst, pitch, u32::from(v), 1, w, h, std::ptr::null_mut(), true)
    }

    fn cuMemsetD2D16_v2 [cuMemsetD2D16_v2_ptds per_thread] (dst: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize) {
        memset_2d(dst, pitch, u32::from(v), 2, w, h, std::ptr::null_mut(), true)
    }

    fn cuMemsetD2D32_v2 [cuMemsetD2D32_v2_ptds per_thread] (dst: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize) {
        memset_2d(dst, pitch, v, 4, w, h, std::ptr::null_mut(), true)
    }

    fn cuMemsetD2D8Async [cuMemsetD2D8Async_ptsz per_thread] (dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize, st: CUstream) {
        memset_2d(dst, pitch, u32::from(v), 1, w, h, st, false)
    }

    fn cuMemsetD2D16Async [cuMemsetD2D16Async_ptsz per_thread] (dst: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize, st: CUstream) {
        memset_2d(dst, pitch, u32::from(v), 2, w, h, st, false)
    }

    fn cuMemsetD2D32Async [cuMemsetD2D32Async_ptsz per_thread] (dst: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize, st: CUstream) {
        memset_2d(dst, pitch, v, 4, w, h, st, false)
    }

    fn cuPointerGetAttribute(data: *mut c_void, attr: c_int, ptr: CUdeviceptr) {
        if data.is_null() {
            return Err(code::INVALID_VALUE);
        }
        pointer_attribute(data, attr, ptr)
    }

    /// Unlike the single query, a pointer the process does not hold gives
    /// zeroed values, not an error.
    fn cuPointerGetAttributes(n: c_uint, attrs: *mut c_int, data: *mut *mut c_void, ptr: CUdeviceptr) {
        crate::state::driver()?;
        if n == 0 || attrs.is_null() || data.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: `n` attributes (API contract).
        let attrs = unsafe { std::slice::from_raw_parts(attrs, n as usize) };
        // SAFETY: `n` output pointers (API contract).
        let data = unsafe { std::slice::from_raw_parts(data, n as usize) };
        let held = is_device(ptr)? || crate::host_memory::attribute(ptr, 2).is_some();
        for (&a, &d) in attrs.iter().zip(data) {
            if d.is_null() {
                return Err(code::INVALID_VALUE);
            }
            if held {
                if pointer_attribute(d, a, ptr).is_ok() {
                    continue;
                }
                if a == 4 {
                    // No host address for device memory: null.
                    out(d as *mut *mut c_void, std::ptr::null_mut())?;
                    continue;
                }
            }
            // SAFETY: `d` points to storage for attribute `a`, whose width
            // the attribute determines (API contract).
            unsafe { std::ptr::write_bytes(d as *mut u8, 0, attribute_width(a)) };
        }
        Ok(())
    }
}
