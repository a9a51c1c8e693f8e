//! The managed-memory entry points: allocation, prefetch, advice, stream
//! attachment and range attributes (what each does: see `super`).

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::{CUdeviceptr, CUstream};

use super::{read, to_device, write, Advice, DEVICE_CPU, DEVICE_INVALID};
use crate::state::out;
use crate::state::thread::need_ctx;
use crate::{code, CuResult};

/// `CUmemLocation`, passed by value: type and id.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Location {
    ty: c_int,
    id: c_int,
}

/// `CUmemLocationType`.
mod loc {
    pub const INVALID: i32 = 0;
    pub const DEVICE: i32 = 1;
    pub const HOST: i32 = 2;
    pub const HOST_NUMA_CURRENT: i32 = 4;
}

/// `CU_MEM_ATTACH_GLOBAL | HOST | SINGLE`.
const ATTACH_FLAGS: [u32; 3] = [1, 2, 4];

/// The device a location names: 0 or [`DEVICE_CPU`].
fn device_of(l: Location) -> Result<i32, CuResult> {
    match l.ty {
        loc::DEVICE if l.id == 0 => Ok(0),
        loc::DEVICE => Err(code::INVALID_DEVICE),
        loc::HOST..=loc::HOST_NUMA_CURRENT => Ok(DEVICE_CPU),
        _ => Err(code::INVALID_VALUE),
    }
}

/// A device argument naming the device or the CPU.
fn device_or_cpu(dev: c_int) -> Result<i32, CuResult> {
    match dev {
        0 | DEVICE_CPU => Ok(dev),
        _ => Err(code::INVALID_DEVICE),
    }
}

/// Where `[ptr, ptr + count)` is managed memory: on the device (true), or
/// from the pinned pool (false, where nothing migrates).
fn managed_range(ptr: u64, count: u64) -> Result<bool, CuResult> {
    if count == 0 {
        return Err(code::INVALID_VALUE);
    }
    if super::contains(ptr, count) {
        return Ok(true);
    }
    match crate::host_memory::attribute(ptr, 8) {
        Some(Ok(crate::host_memory::Attr::I32(1))) => Ok(false),
        _ => Err(code::INVALID_VALUE),
    }
}

/// Changes the advice kept for the allocation holding the range.
fn with_advice(ptr: u64, count: u64, f: impl FnOnce(&mut Advice)) -> Result<(), CuResult> {
    if managed_range(ptr, count)? {
        if let Some((_, m)) = write().holding(ptr, count) {
            f(&mut m.advice);
        }
    }
    Ok(())
}

/// Migrates `[ptr, ptr + count)` to `dev` (0 or [`DEVICE_CPU`]).
fn prefetch(ptr: u64, count: u64, dev: i32, st: CUstream) -> Result<(), CuResult> {
    need_ctx()?;
    let stream = crate::state::thread::resolve(st)?;
    if !managed_range(ptr, count)? {
        return Ok(());
    }
    let mut t = write();
    if dev != DEVICE_CPU {
        to_device(&mut t, Some((ptr, count)), stream)?;
    }
    // A prefetch to the CPU moves nothing now: bringing the data back
    // means waiting for the context's work, and work queued before it may
    // wait on the CPU itself (UnifiedMemoryPerf queues a kernel spinning
    // on a latch, then prefetches to the CPU, then sets the latch: waiting
    // here never returns). The CPU's first touch brings the range back
    // (the fault synchronizes then), as the prefetch would have.

    if let Some((_, m)) = t.holding(ptr, count) {
        m.advice.last_prefetch = dev;
    }
    Ok(())
}

/// `cuMemAdvise`'s advice for device `dev`.
fn advise(ptr: u64, count: u64, advice: c_int, dev: i32) -> Result<(), CuResult> {
    need_ctx()?;
    match advice {
        1 | 2 => with_advice(ptr, count, |a| a.read_mostly = advice == 1),
        3 => with_advice(ptr, count, |a| a.preferred = dev),
        4 => with_advice(ptr, count, |a| a.preferred = DEVICE_INVALID),
        5 | 6 => with_advice(ptr, count, |a| a.accessed_by = advice == 5 && dev == 0),
        _ => Err(code::INVALID_VALUE),
    }
}

/// The advice kept for the range (the defaults for pool memory).
fn advice_of(ptr: u64, count: u64) -> Result<Advice, CuResult> {
    let default = Advice {
        read_mostly: false,
        preferred: DEVICE_INVALID,
        accessed_by: false,
        last_prefetch: DEVICE_INVALID,
        attach: 1,
    };
    if !managed_range(ptr, count)? {
        return Ok(default);
    }
    let t = read();
    let base = t.base_of(ptr, count).ok_or(code::INVALID_VALUE)?;
    Ok(t.allocs.get(&base).map_or(default, |m| m.advice))
}

/// A device as a location: (type, id).
fn as_location(dev: i32) -> (i32, i32) {
    match dev {
        0 => (loc::DEVICE, 0),
        DEVICE_CPU => (loc::HOST, 0),
        _ => (loc::INVALID, 0),
    }
}

/// `cuMemRangeGetAttribute`'s attribute `attr` of the range into `data`
/// (`size` bytes).
fn range_attribute(
    data: *mut c_void,
    size: usize,
    attr: c_int,
    ptr: u64,
    count: u64,
) -> Result<(), CuResult> {
    if data.is_null() {
        return Err(code::INVALID_VALUE);
    }
    let a = advice_of(ptr, count)?;
    let one = |v: i32| {
        if size != 4 {
            return Err(code::INVALID_VALUE);
        }
        out(data as *mut i32, v)
    };
    match attr {
        1 => one(i32::from(a.read_mostly)),
        2 => one(a.preferred),
        3 => {
            // ACCESSED_BY: the devices, then CU_DEVICE_INVALID to the end.
            if size == 0 || !size.is_multiple_of(4) {
                return Err(code::INVALID_VALUE);
            }
            // SAFETY: `size` writable bytes at `data` (API contract),
            // checked to hold whole ints.
            let v = unsafe { std::slice::from_raw_parts_mut(data as *mut i32, size / 4) };
            v.fill(DEVICE_INVALID);
            if a.accessed_by {
                v[0] = 0;
            }
            Ok(())
        }
        4 => one(a.last_prefetch),
        5 => one(as_location(a.preferred).0),
        6 => one(as_location(a.preferred).1),
        7 => one(as_location(a.last_prefetch).0),
        8 => one(as_location(a.last_prefetch).1),
        _ => Err(code::INVALID_VALUE),
    }
}

export! {
    /// In device memory, migrating to the process on touch (see the
    /// module's notes); `CU_MEM_ATTACH_GLOBAL` or `CU_MEM_ATTACH_HOST`.
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, size: usize, flags: c_uint) {
        need_ctx()?;
        if dptr.is_null() || size == 0 || !matches!(flags, 1 | 2) {
            return Err(code::INVALID_VALUE);
        }
        let d = super::alloc(size as u64, flags)?;
        out(dptr, d)
    }

    /// Checked and kept; every kernel may reach any managed memory here.
    fn cuStreamAttachMemAsync [cuStreamAttachMemAsync_ptsz per_thread] (st: CUstream, ptr: CUdeviceptr, len: usize, flags: c_uint) {
        need_ctx()?;
        crate::state::thread::resolve(st)?;
        if !ATTACH_FLAGS.contains(&flags) {
            return Err(code::INVALID_VALUE);
        }
        let whole = if len == 0 { 1 } else { len as u64 };
        with_advice(ptr, whole, |a| a.attach = flags)
    }

    fn cuMemPrefetchAsync [cuMemPrefetchAsync_ptsz per_thread] (ptr: CUdeviceptr, count: usize, dev: c_int, st: CUstream) {
        prefetch(ptr, count as u64, device_or_cpu(dev)?, st)
    }

    fn cuMemPrefetchAsync_v2 [cuMemPrefetchAsync_v2_ptsz per_thread] (ptr: CUdeviceptr, count: usize, location: Location, flags: c_uint, st: CUstream) {
        if flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        prefetch(ptr, count as u64, device_of(location)?, st)
    }

    fn cuMemAdvise(ptr: CUdeviceptr, count: usize, advice: c_int, dev: c_int) {
        let dev = if matches!(advice, 1 | 2) { 0 } else { device_or_cpu(dev)? };
        advise(ptr, count as u64, advice, dev)
    }

    fn cuMemAdvise_v2(ptr: CUdeviceptr, count: usize, advice: c_int, l: Location) {
        let dev = if matches!(advice, 1 | 2) { 0 } else { device_of(l)? };
        advise(ptr, count as u64, advice, dev)
    }

    fn cuMemRangeGetAttribute(data: *mut c_void, size: usize, attr: c_int, ptr: CUdeviceptr, count: usize) {
        need_ctx()?;
        range_attribute(data, size, attr, ptr, count as u64)
    }

    fn cuMemRangeGetAttributes(data: *mut *mut c_void, sizes: *mut usize, attrs: *mut c_int, n: usize, ptr: CUdeviceptr, count: usize) {
        need_ctx()?;
        if n == 0 || data.is_null() || sizes.is_null() || attrs.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: `n` output pointers (API contract).
        let data = unsafe { std::slice::from_raw_parts(data, n) };
        // SAFETY: `n` sizes (API contract).
        let sizes = unsafe { std::slice::from_raw_parts(sizes, n) };
        // SAFETY: `n` attributes (API contract).
        let attrs = unsafe { std::slice::from_raw_parts(attrs, n) };
        for ((&d, &s), &a) in data.iter().zip(sizes).zip(attrs) {
            range_attribute(d, s, a, ptr, count as u64)?;
        }
        Ok(())
    }
}
