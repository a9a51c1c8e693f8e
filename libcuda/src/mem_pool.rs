//! Stream-ordered allocation and memory pools.
//!
//! An allocation made "in stream order" is usable by the stream's work
//! from that point on: an allocation made now is too, so `cuMemAllocAsync`
//! allocates at once. A stream-ordered free goes to the host, which frees
//! once the device has done the work submitted to the stream before it.
//! Pools are kept here: their attributes, and what is allocated from each
//! (the figures `CU_MEMPOOL_ATTR_*_MEM_*` report). The memory itself comes
//! from the vGPU's allocations, under its limit; a pool keeps nothing back
//! once freed, so trimming has nothing to do.
//!
//! A pool made with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` is shared
//! with the VM's other processes: exported as a file descriptor
//! (`shareable.rs`) that carries the host's token for it, its allocations
//! as `CUmemPoolPtrExportData` carrying the host's token for each (IPC
//! memory tagged with the pool's token, the host's `session/share.rs`).
//! An importer allocates nothing from an imported pool; it imports
//! pointers through it and frees them (`cuMemFree`, `cuMemFreeAsync`),
//! which closes them as `cuIpcCloseMemHandle` does.

use std::ffi::{c_int, c_void};

use cudarc::driver::sys::{CUdevice, CUdeviceptr, CUstream};

use crate::state::tables::Pool;
use crate::state::thread::need_ctx;
use crate::state::thread::resolve;
use crate::state::{gpu, objects, out, RangeKind};
use crate::{code, CuResult};

fn alloc_from(p: *mut CUdeviceptr, size: usize, pool: usize, st: CUstream) -> Result<(), CuResult> {
    need_ctx()?;
    if p.is_null() || size == 0 {
        return Err(code::INVALID_VALUE);
    }
    resolve(st)?;
    // An imported pool gives pointers imported through it only.
    match objects()?.pools.pools.get(&pool) {
        Some(pl) if pl.imported == 0 => {}
        _ => return Err(code::INVALID_VALUE),
    }
    let d = crate::alloc::device_alloc(size as u64)?;
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
        if ptr == 0 {
            // As cuMemFree: nothing to free (cuSPARSE frees unset buffers so).
            return Ok(());
        }
        if free_imported(ptr, Some(stream))? {
            return Ok(());
        }
        if crate::managed::contains(ptr, 1) || crate::host_memory::is_managed(ptr) {
            // Managed memory goes once the stream has got there.
            gpu(|g| g.stream_synchronize(stream))?;
            return crate::memory::free_managed_any(ptr);
        }
        {
            let mut o = objects()?;
            match o.ranges.get(&ptr) {
                Some(r) if r.kind == RangeKind::Device => {}
                _ => return Err(code::INVALID_VALUE),
            }
            if !o.mapped_allocs.contains_key(&ptr) {
                crate::alloc::forget_alloc(&mut o, ptr);
                drop(o);
                return gpu(|g| g.mem_free_async(ptr, stream));
            }
        }
        // Memory made as a mapping (see `alloc::device_alloc`) is
        // unmapped once the stream has got there.
        gpu(|g| g.stream_synchronize(stream))?;
        crate::alloc::free_device(ptr)
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
        if p.handle_types & !(crate::vmm::HANDLE_TYPE_POSIX_FD as c_int) != 0 {
            return Err(crate::not_supported("pools shareable other than as file descriptors"));
        }
        let h = Box::into_raw(Box::new(0u8)) as usize;
        objects()?.pools.pools.insert(h, Pool { handle_types: p.handle_types, ..Pool::default() });
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

/// `CUmemPoolPtrExportData`: 64 opaque bytes, ours `PTR_MAGIC`, then the
/// allocation's token, start, size and its pool's token.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PtrExportData {
    reserved: [u8; 64],
}

/// What a pointer's export data of ours starts with.
const PTR_MAGIC: &[u8; 8] = b"fvgpptr1";

impl PtrExportData {
    fn new(token: u64, base: u64, size: u64, pool: u64) -> Self {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(PTR_MAGIC);
        for (i, v) in [token, base, size, pool].iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        PtrExportData { reserved: b }
    }

    /// (allocation token, pool token) if it is ours.
    fn tokens(&self) -> Option<(u64, u64)> {
        let b = &self.reserved;
        if &b[..8] != PTR_MAGIC {
            return None;
        }
        let v =
            |i: usize| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().unwrap_or_default());
        (v(0) != 0 && v(3) != 0).then(|| (v(0), v(3)))
    }
}

/// Frees a pointer imported from another process's pool (closes it, once
/// `stream`'s work before is done); false if `ptr` is not one.
pub(crate) fn free_imported(ptr: u64, stream: Option<u64>) -> Result<bool, CuResult> {
    {
        let mut o = objects()?;
        let Some(n) = o.pools.imported_ptrs.get_mut(&ptr) else {
            return Ok(false);
        };
        *n -= 1;
        if *n == 0 {
            o.pools.imported_ptrs.remove(&ptr);
        }
    }
    if let Some(st) = stream {
        gpu(|g| g.stream_synchronize(st))?;
    }
    crate::ipc::close(ptr)?;
    Ok(true)
}

/// The host's token for this process's pool `h`, exported on first use;
/// the pool must have been made with the file descriptor handle type.
fn pool_token(h: usize) -> Result<u64, CuResult> {
    {
        let o = objects()?;
        let pl = o.pools.pools.get(&h).ok_or(code::INVALID_VALUE)?;
        if pl.imported != 0 || pl.handle_types & crate::vmm::HANDLE_TYPE_POSIX_FD as c_int == 0 {
            return Err(code::INVALID_VALUE);
        }
        if pl.export != 0 {
            return Ok(pl.export);
        }
    }
    let token = gpu(|g| g.request(&protocol::Request::PoolExport { pool: h as u64 }))?.vals[0];
    if let Some(pl) = objects()?.pools.pools.get_mut(&h) {
        pl.export = token;
    }
    Ok(token)
}

export! {
    /// A file descriptor for a pool made with the file descriptor handle
    /// type, for another process of the VM.
    fn cuMemPoolExportToShareableHandle(handle: *mut c_void, pool: *mut c_void, ty: c_int, flags: u64) {
        let h = check_pool(pool)?;
        if handle.is_null() || flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        if ty != crate::vmm::HANDLE_TYPE_POSIX_FD as c_int {
            return Err(crate::not_supported("shareable handles other than file descriptors"));
        }
        let token = pool_token(h)?;
        let fd = crate::shareable::make(crate::shareable::Content {
            kind: crate::shareable::Kind::Pool,
            token,
            size: 0,
        })?;
        out(handle as *mut c_int, fd)
    }

    /// A pool of this process standing for another process's exported
    /// pool: pointers exported from it are imported through it.
    fn cuMemPoolImportFromShareableHandle(pool: *mut *mut c_void, handle: *mut c_void, ty: c_int, flags: u64) {
        crate::state::driver()?;
        if pool.is_null() || flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        if ty != crate::vmm::HANDLE_TYPE_POSIX_FD as c_int {
            return Err(crate::not_supported("shareable handles other than file descriptors"));
        }
        let fd = crate::shareable::fd_of(handle)?;
        let c = crate::shareable::read(fd, crate::shareable::Kind::Pool)?;
        gpu(|g| g.request(&protocol::Request::PoolImport { token: c.token }))?;
        let h = Box::into_raw(Box::new(0u8)) as usize;
        let imported = Pool {
            handle_types: crate::vmm::HANDLE_TYPE_POSIX_FD as c_int,
            imported: c.token,
            ..Pool::default()
        };
        objects()?.pools.pools.insert(h, imported);
        out(pool, h as *mut c_void)
    }

    /// The export data of an allocation from an exportable pool.
    fn cuMemPoolExportPointer(data: *mut PtrExportData, ptr: CUdeviceptr) {
        need_ctx()?;
        if data.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let pool = objects()?.pools.of.get(&ptr).map(|&(p, _)| p).ok_or(code::INVALID_VALUE)?;
        let token = pool_token(pool)?;
        let r = gpu(|g| g.request(&protocol::Request::PoolExportPointer { pool: token, ptr }))?;
        let [t, base, size, _] = r.vals;
        out(data, PtrExportData::new(t, base, size, token))
    }

    /// Another process's allocation, through the pool imported for its
    /// pool, at the exporter's address.
    fn cuMemPoolImportPointer(ptr: *mut CUdeviceptr, pool: *mut c_void, data: *const PtrExportData) {
        need_ctx()?;
        let h = check_pool(pool)?;
        if ptr.is_null() || data.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let imported = objects()?.pools.pools.get(&h).map_or(0, |pl| pl.imported);
        // SAFETY: 64 bytes of export data the caller provides (API contract).
        let d = unsafe { data.read_unaligned() };
        let (token, of_pool) = d.tokens().ok_or(code::INVALID_VALUE)?;
        if imported == 0 || of_pool != imported {
            return Err(code::INVALID_VALUE);
        }
        let r = gpu(|g| g.request(&protocol::Request::PoolImportPointer { pool: imported, token }))?;
        let [base, size, ..] = r.vals;
        crate::ipc::opened_range(base, size)?;
        *objects()?.pools.imported_ptrs.entry(base).or_insert(0) += 1;
        out(ptr, base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_data_has_the_drivers_size_and_carries_its_tokens() {
        assert_eq!(std::mem::size_of::<PtrExportData>(), 64);
        assert_eq!(
            std::mem::size_of::<PtrExportData>(),
            std::mem::size_of::<cudarc::driver::sys::CUmemPoolPtrExportData>()
        );
        let d = PtrExportData::new(0xfeed, 0x7f00_0000_0000, 4096, 0xbeef);
        assert_eq!(d.tokens(), Some((0xfeed, 0xbeef)));
        assert_eq!(PtrExportData { reserved: [0; 64] }.tokens(), None, "zeroed");
        assert_eq!(
            PtrExportData::new(0xfeed, 1, 1, 0).tokens(),
            None,
            "no pool"
        );
        let mut other = d;
        other.reserved[3] ^= 1;
        assert_eq!(other.tokens(), None, "not ours");
    }
}
