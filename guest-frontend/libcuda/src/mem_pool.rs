//! Stream-ordered allocation and memory pools.
//!
//! An allocation made "in stream order" is usable by the stream's work
//! from that point on: an allocation made now is too, so `cuMemAllocAsync`
//! allocates at once. A stream-ordered free goes to the host, which frees
//! once the device has done the work submitted to the stream before it.
//! Pools are kept here: their attributes, and what is allocated from each
//! (the figures `CU_MEMPOOL_ATTR_*_MEM_*` report). The memory itself comes
//! from the vGPU's allocations, under its limit; a pool keeps nothing back
//! once freed, so trimming has nothing to do. Pools cannot be shared with
//! other processes (exporting one is not supported).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};

use cudarc::driver::sys::{CUdevice, CUdeviceptr, CUstream};

use crate::context::need_ctx;
use crate::state::{gpu, objects, out, RangeKind};
use crate::stream::resolve;
use crate::{code, CuResult};

/// A pool: its settable attributes, and what is allocated from it.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    /// REUSE_FOLLOW_EVENT_DEPENDENCIES, REUSE_ALLOW_OPPORTUNISTIC,
    /// REUSE_ALLOW_INTERNAL_DEPENDENCIES.
    reuse: [c_int; 3],
    release_threshold: u64,
    used: u64,
    used_high: u64,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            reuse: [1, 1, 1],
            release_threshold: 0,
            used: 0,
            used_high: 0,
        }
    }
}

/// The pools: by handle, the device's current one, and which pool each
/// stream-ordered allocation came from.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    pools: HashMap<usize, Pool>,
    default: usize,
    current: usize,
    of: HashMap<u64, (usize, u64)>,
}

impl Pools {
    /// The device's default pool, made on first use.
    fn default_pool(&mut self) -> usize {
        if self.default == 0 {
            let h = Box::into_raw(Box::new(0u8)) as usize;
            self.pools.insert(h, Pool::default());
            self.default = h;
        }
        self.default
    }

    fn current(&mut self) -> usize {
        if self.current == 0 {
            self.current = self.default_pool();
        }
        self.current
    }
}

fn alloc_from(p: *mut CUdeviceptr, size: usize, pool: usize, st: CUstream) -> Result<(), CuResult> {
    need_ctx()?;
    if p.is_null() || size == 0 {
        return Err(code::INVALID_VALUE);
    }
    resolve(st)?;
    if !objects()?.pools.pools.contains_key(&pool) {
        return Err(code::INVALID_VALUE);
    }
    let d = crate::memory::device_alloc(size as u64)?;
    let mut o = objects()?;
    if let Some(pl) = o.pools.pools.get_mut(&pool) {
        pl.used += size as u64;
        pl.used_high = pl.used_high.max(pl.used);
    }
    o.pools.of.insert(d, (pool, size as u64));
    out(p, d)
}

/// Checks that a `CUmemLocation` and allocation type name the device's
/// memory (the only pools a vGPU has).
fn device_location(location: *const [c_int; 2], ty: c_int) -> Result<(), CuResult> {
    crate::state::driver()?;
    if location.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: a CUmemLocation: type and id (API contract).
    let [lt, id] = unsafe { location.read_unaligned() };
    if lt != 1 || ty != 1 {
        return Err(crate::not_supported("memory pools of host memory"));
    }
    if id != 0 {
        return Err(code::INVALID_DEVICE);
    }
    Ok(())
}

/// Forgets what a freed allocation took from its pool (if it came from one).
pub(crate) fn freed(o: &mut crate::state::Objects, ptr: u64) {
    if let Some((pool, size)) = o.pools.of.remove(&ptr) {
        if let Some(pl) = o.pools.pools.get_mut(&pool) {
            pl.used = pl.used.saturating_sub(size);
        }
    }
}

fn check_pool(pool: *mut c_void) -> Result<usize, CuResult> {
    let h = pool as usize;
    if !objects()?.pools.pools.contains_key(&h) {
        return Err(code::INVALID_VALUE);
    }
    Ok(h)
}

export! {
    /// On a capturing stream, an allocation node of the capture's graph.
    fn cuMemAllocAsync [cuMemAllocAsync_ptsz per_thread] (p: *mut CUdeviceptr, size: usize, st: CUstream) {
        if crate::graph::memory::alloc_in_capture(p, size as u64, st)? {
            return Ok(());
        }
        let pool = objects()?.pools.current();
        alloc_from(p, size, pool, st)
    }

    fn cuMemAllocFromPoolAsync [cuMemAllocFromPoolAsync_ptsz per_thread] (p: *mut CUdeviceptr, size: usize, pool: *mut c_void, st: CUstream) {
        let h = check_pool(pool)?;
        alloc_from(p, size, h, st)
    }

    /// Any allocation of the process may be freed in stream order; on a
    /// capturing stream, a graph allocation gets a free node.
    fn cuMemFreeAsync [cuMemFreeAsync_ptsz per_thread] (ptr: CUdeviceptr, st: CUstream) {
        need_ctx()?;
        if crate::graph::memory::free_in_capture(ptr, st)?
            || crate::graph::memory::free_outside(ptr)?
        {
            return Ok(());
        }
        let stream = resolve(st)?;
        {
            let mut o = objects()?;
            match o.ranges.get(&ptr) {
                Some(r) if r.kind == RangeKind::Device => {}
                _ => return Err(code::INVALID_VALUE),
            }
            if !o.mapped_allocs.contains_key(&ptr) {
                crate::memory::forget_alloc(&mut o, ptr);
                drop(o);
                return gpu(|g| g.mem_free_async(ptr, stream));
            }
        }
        // Memory made as a mapping (see `memory::device_alloc`) is
        // unmapped once the stream has got there.
        gpu(|g| g.stream_synchronize(stream))?;
        crate::memory::free_device(ptr)
    }

    /// CUDA 13's pools by location: the device's (memory of type pinned).
    fn cuMemGetDefaultMemPool(pool: *mut *mut c_void, location: *const [c_int; 2], ty: c_int) {
        device_location(location, ty)?;
        let h = objects()?.pools.default_pool();
        out(pool, h as *mut c_void)
    }

    fn cuMemGetMemPool(pool: *mut *mut c_void, location: *const [c_int; 2], ty: c_int) {
        device_location(location, ty)?;
        let h = objects()?.pools.current();
        out(pool, h as *mut c_void)
    }

    fn cuMemSetMemPool(location: *const [c_int; 2], ty: c_int, pool: *mut c_void) {
        device_location(location, ty)?;
        let h = check_pool(pool)?;
        objects()?.pools.current = h;
        Ok(())
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, d: CUdevice) {
        crate::state::driver()?;
        if d != 0 {
            return Err(code::INVALID_DEVICE);
        }
        let h = objects()?.pools.default_pool();
        out(pool, h as *mut c_void)
    }

    fn cuDeviceGetMemPool(pool: *mut *mut c_void, d: CUdevice) {
        crate::state::driver()?;
        if d != 0 {
            return Err(code::INVALID_DEVICE);
        }
        let h = objects()?.pools.current();
        out(pool, h as *mut c_void)
    }

    fn cuDeviceSetMemPool(d: CUdevice, pool: *mut c_void) {
        crate::state::driver()?;
        if d != 0 {
            return Err(code::INVALID_DEVICE);
        }
        let h = check_pool(pool)?;
        objects()?.pools.current = h;
        Ok(())
    }

    /// Pools of device memory only: a `CUmemPoolProps` asking for another
    /// location (host memory, IPC handles) is not supported.
    fn cuMemPoolCreate(pool: *mut *mut c_void, props: *const PoolProps) {
        crate::state::driver()?;
        if pool.is_null() || props.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a CUmemPoolProps (API contract), read as integers.
        let p = unsafe { props.read_unaligned() };
        if p.alloc_type != 1 || p.location_type != 1 || p.location_id != 0 {
            return Err(crate::not_supported("cuMemPoolCreate of anything but device memory"));
        }
        if p.handle_types != 0 {
            return Err(crate::not_supported("cuMemPoolCreate with shareable handles"));
        }
        let h = Box::into_raw(Box::new(0u8)) as usize;
        objects()?.pools.pools.insert(h, Pool::default());
        out(pool, h as *mut c_void)
    }

    fn cuMemPoolDestroy(pool: *mut c_void) {
        let h = check_pool(pool)?;
        let mut o = objects()?;
        if h == o.pools.default {
            return Err(code::INVALID_VALUE);
        }
        o.pools.pools.remove(&h);
        if o.pools.current == h {
            o.pools.current = o.pools.default;
        }
        Ok(())
    }

    fn cuMemPoolSetAttribute(pool: *mut c_void, attr: c_int, value: *mut c_void) {
        let h = check_pool(pool)?;
        if value.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let mut o = objects()?;
        let pl = o.pools.pools.get_mut(&h).ok_or(code::INVALID_VALUE)?;
        match attr {
            // SAFETY: an int for the reuse attributes (API contract).
            1..=3 => pl.reuse[attr as usize - 1] = unsafe { (value as *const c_int).read_unaligned() },
            // SAFETY: a cuuint64_t (API contract).
            4 => pl.release_threshold = unsafe { (value as *const u64).read_unaligned() },
            // The high-water marks reset to the current figure (only 0 may be set).
            6 | 8 => {
                // SAFETY: a cuuint64_t (API contract).
                if unsafe { (value as *const u64).read_unaligned() } != 0 {
                    return Err(code::INVALID_VALUE);
                }
                pl.used_high = pl.used;
            }
            _ => return Err(code::INVALID_VALUE),
        }
        Ok(())
    }

    /// The pool reserves what is allocated from it and no more.
    fn cuMemPoolGetAttribute(pool: *mut c_void, attr: c_int, value: *mut c_void) {
        let h = check_pool(pool)?;
        let o = objects()?;
        let pl = o.pools.pools.get(&h).ok_or(code::INVALID_VALUE)?;
        match attr {
            1..=3 => out(value as *mut c_int, pl.reuse[attr as usize - 1]),
            4 => out(value as *mut u64, pl.release_threshold),
            5 | 7 => out(value as *mut u64, pl.used),
            6 | 8 => out(value as *mut u64, pl.used_high),
            _ => Err(code::INVALID_VALUE),
        }
    }

    /// Nothing is kept back after a free: nothing to trim.
    fn cuMemPoolTrimTo(pool: *mut c_void, _keep: usize) {
        check_pool(pool).map(drop)
    }

    /// The vGPU's one device always has read-write access to its pools.
    fn cuMemPoolSetAccess(pool: *mut c_void, map: *const AccessDesc, count: usize) {
        check_pool(pool)?;
        if count > 0 && map.is_null() {
            return Err(code::INVALID_VALUE);
        }
        for i in 0..count {
            // SAFETY: `count` descriptors (API contract).
            let d = unsafe { map.wrapping_add(i).read_unaligned() };
            if d.location_type != 1 || d.location_id != 0 || d.flags != 3 {
                return Err(code::INVALID_DEVICE);
            }
        }
        Ok(())
    }

    fn cuMemPoolGetAccess(flags: *mut c_int, pool: *mut c_void, location: *const [c_int; 2]) {
        check_pool(pool)?;
        if location.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a CUmemLocation: type and id (API contract).
        let [ty, id] = unsafe { location.read_unaligned() };
        out(flags, if ty == 1 && id == 0 { 3 } else { 0 })
    }
}

/// `CUmemPoolProps`, read with plain integers: allocation type, handle
/// types, location (type, id), and what follows.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PoolProps {
    alloc_type: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    rest: [u8; 56],
}

/// `CUmemAccessDesc`: location (type, id) and flags.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AccessDesc {
    location_type: c_int,
    location_id: c_int,
    flags: c_int,
}
