//! Virtual memory management: address reservations, physical memory by
//! handle, mappings (cuMemAddressReserve, cuMemCreate, cuMemMap, ...).
//!
//! The host holds the truth (`protocol::Request::Vmm*`, checked against
//! the process's own table there); what is kept here answers the queries
//! that need no round trip (granularity, a handle's properties, access
//! flags). Sizes and addresses are multiples of 2 MiB
//! ([`protocol::VMM_GRANULARITY`], the driver's minimum granularity on the
//! GPUs served). A reservation is reserved in this process's address space
//! too (`reserve`) and is device memory to pointer queries and copies of
//! inferred direction. The host makes every mapping readable and writable
//! from the device when it maps it; `cuMemGetAccess` reports what the
//! program set, as the driver does. Memory is the vGPU's own device
//! memory only (ordinal 0): no host or NUMA locations. It may be
//! compressible (`CU_MEM_ALLOCATION_COMP_GENERIC`): the host asks its
//! driver for it and answers with what the driver gave, which the
//! handle's properties report. Memory made with
//! `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` is exported to the VM's
//! other processes as a file descriptor (`shareable.rs`); the importer
//! gets a handle of its own for the same memory, which stays counted to
//! the exporter (the host's `session/share.rs`).

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::MutexGuard;

use cudarc::driver::sys::CUdeviceptr;
use protocol::{Request, VMM_GRANULARITY as G};

use crate::shareable;
use crate::state::process::{lock, VmmTable as Table, VMM};
use crate::state::{driver, gpu, objects, out, Range, RangeKind};
use crate::{code, CuResult};

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Location {
    ty: c_int,
    id: c_int,
}

/// `CUmemAllocationProp` (32 bytes; enums as plain integers).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AllocationProp {
    ty: c_uint,
    handle_types: c_uint,
    location: Location,
    win32_meta: *mut c_void,
    compression: u8,
    rdma_capable: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AccessDesc {
    location: Location,
    flags: c_uint,
}

const PINNED: c_uint = 1;
const LOCATION_DEVICE: c_int = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: the shareable handle
/// served (`shareable.rs`), between the processes of the VM.
pub(crate) const HANDLE_TYPE_POSIX_FD: c_uint = 1;
const PROT_READ: c_uint = 1;
const PROT_READWRITE: c_uint = 3;

fn table() -> MutexGuard<'static, Table> {
    lock(&VMM)
}

/// A size or address of the API: nonzero, a multiple of the granularity.
fn granular(v: u64) -> Result<u64, CuResult> {
    if v == 0 || !v.is_multiple_of(G) {
        return Err(code::INVALID_VALUE);
    }
    Ok(v)
}

/// Checks a location: the vGPU's device.
fn device_location(l: Location) -> Result<(), CuResult> {
    if l.ty != LOCATION_DEVICE {
        return Err(crate::not_supported("VMM memory outside the device"));
    }
    if l.id != 0 {
        return Err(code::INVALID_DEVICE);
    }
    Ok(())
}

/// Reads and checks the caller's allocation properties: pinned memory of
/// the device, of a compression type the driver defines.
fn read_prop(prop: *const AllocationProp) -> Result<AllocationProp, CuResult> {
    if prop.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: a CUmemAllocationProp the caller provides (API contract);
    // every field is an integer or a pointer we never follow.
    let p = unsafe { prop.read_unaligned() };
    if p.ty != PINNED {
        return Err(crate::not_supported(
            "VMM memory other than pinned device memory",
        ));
    }
    device_location(p.location)?;
    if p.compression > protocol::VMM_COMPRESSION_GENERIC {
        return Err(code::INVALID_VALUE);
    }
    Ok(p)
}

/// Records the compression type the host reported for handle `h`.
fn set_compression(t: &mut Table, h: u64, granted: u64) {
    match u8::try_from(granted) {
        Ok(0) | Err(_) => t.compressed.remove(&h),
        Ok(c) => t.compressed.insert(h, c),
    };
}

/// A host call with its reply values.
fn call(req: Request) -> Result<[u64; 4], CuResult> {
    gpu(|g| g.request(&req)).map(|r| r.vals)
}

export! {
    /// 2 MiB, minimum and recommended, compressible or not.
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const AllocationProp, option: c_int) {
        driver()?;
        read_prop(prop)?;
        if !(0..=1).contains(&option) {
            return Err(code::INVALID_VALUE);
        }
        out(granularity, G as usize)
    }

    /// The alignment is honoured; the address asked for is a hint, not taken.
    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: c_ulonglong) {
        driver()?;
        let size = granular(size as u64)?;
        let _ = addr;
        if ptr.is_null() || flags != 0 || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(code::INVALID_VALUE);
        }
        let align = alignment as u64;
        // Addresses the process uses itself are kept aside while another
        // reservation is made (as `alloc::device_alloc` does); after the
        // first, at an address free in this process, which the host's
        // driver takes where it is free there too.
        let va = crate::reserve::place(
            size,
            |i| {
                let addr = if i == 0 { 0 } else { crate::reserve::free_range(size, align.max(G)) };
                call(Request::VmmReserve { size, align, addr }).map(|v| v[0])
            },
            |va| {
                let _ = call(Request::VmmAddressFree { ptr: va, size });
            },
        )?;
        objects()?.ranges.insert(va, Range { size, kind: RangeKind::Device });
        out(ptr, va)
    }

    /// The whole reservation, with nothing mapped in it.
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        driver()?;
        let size = granular(size as u64)?;
        call(Request::VmmAddressFree { ptr: granular(ptr)?, size })?;
        crate::reserve::release(ptr, size);
        objects()?.ranges.remove(&ptr);
        Ok(())
    }

    fn cuMemCreate(handle: *mut c_ulonglong, size: usize, prop: *const AllocationProp, flags: c_ulonglong) {
        driver()?;
        let p = read_prop(prop)?;
        if handle.is_null() || flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        if p.handle_types & !HANDLE_TYPE_POSIX_FD != 0 {
            return Err(crate::not_supported("VMM handles shareable other than as file descriptors"));
        }
        let v = call(Request::VmmCreate {
            size: granular(size as u64)?,
            compression: p.compression,
        })?;
        let h = v[0];
        let mut t = table();
        t.handles.insert(h, (1, p.handle_types));
        // What the host's driver gave (the sample programs check it).
        set_compression(&mut t, h, v[1]);
        drop(t);
        out(handle, h)
    }

    /// The memory goes once it is unmapped too.
    fn cuMemRelease(handle: c_ulonglong) {
        driver()?;
        call(Request::VmmRelease { handle })?;
        let mut t = table();
        if let Some(e) = t.handles.get_mut(&handle) {
            e.0 -= 1;
            if e.0 == 0 {
                t.handles.remove(&handle);
                t.compressed.remove(&handle);
            }
        }
        Ok(())
    }

    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: c_ulonglong, flags: c_ulonglong) {
        driver()?;
        if flags != 0 || !(offset as u64).is_multiple_of(G) {
            return Err(code::INVALID_VALUE);
        }
        let (ptr, size) = (granular(ptr)?, granular(size as u64)?);
        call(Request::VmmMap { ptr, size, offset: offset as u64, handle })?;
        // No access until set, as the driver has it.
        table().maps.insert(ptr, (size, 0));
        Ok(())
    }

    /// Whole mappings only.
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        driver()?;
        let (ptr, size) = (granular(ptr)?, granular(size as u64)?);
        call(Request::VmmUnmap { ptr, size })?;
        let mut t = table();
        let gone: Vec<u64> = t.maps.range(ptr..ptr.saturating_add(size)).map(|(&b, _)| b).collect();
        for b in gone {
            t.maps.remove(&b);
        }
        Ok(())
    }

    /// Read or read-write access for the vGPU's device.
    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const AccessDesc, count: usize) {
        driver()?;
        if desc.is_null() || count == 0 || count > 64 {
            return Err(code::INVALID_VALUE);
        }
        let mut flags = 0;
        for i in 0..count {
            // SAFETY: `count` descriptors at `desc` (API contract), each
            // of integers; `i < count`, so this one is among them.
            let d = unsafe { desc.wrapping_add(i).read_unaligned() };
            device_location(d.location)?;
            if !matches!(d.flags, PROT_READ | PROT_READWRITE) {
                return Err(crate::not_supported("taking the device's access to VMM memory away"));
            }
            flags = d.flags;
        }
        let (ptr, size) = (granular(ptr)?, granular(size as u64)?);
        call(Request::VmmSetAccess { ptr, size, flags })?;
        let mut t = table();
        for (_, m) in t.maps.range_mut(ptr..ptr.saturating_add(size)) {
            m.1 = flags;
        }
        // The mapping the range starts in, if it starts before it.
        if let Some((&b, m)) = t.maps.range_mut(..ptr).next_back() {
            if ptr - b < m.0 {
                m.1 = flags;
            }
        }
        Ok(())
    }

    fn cuMemGetAccess(flags: *mut c_ulonglong, location: *const Location, ptr: CUdeviceptr) {
        driver()?;
        if location.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a CUmemLocation the caller provides (API contract).
        device_location(unsafe { location.read_unaligned() })?;
        let t = table();
        let (&b, &(size, f)) = t.maps.range(..=ptr).next_back().ok_or(code::INVALID_VALUE)?;
        if ptr - b >= size {
            return Err(code::INVALID_VALUE);
        }
        out(flags, c_ulonglong::from(f))
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut AllocationProp, handle: c_ulonglong) {
        driver()?;
        let t = table();
        let &(_, handle_types) = t.handles.get(&handle).ok_or(code::INVALID_VALUE)?;
        let compression = t.compressed.get(&handle).copied().unwrap_or(0);
        drop(t);
        out(prop, AllocationProp {
            ty: PINNED,
            handle_types,
            location: Location { ty: LOCATION_DEVICE, id: 0 },
            win32_meta: std::ptr::null_mut(),
            compression,
            rdma_capable: 0,
            usage: 0,
            reserved: [0; 4],
        })
    }

    /// A file descriptor for memory made with the POSIX file descriptor
    /// handle type, for another process of the VM.
    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: c_ulonglong, ty: c_uint, flags: c_ulonglong) {
        driver()?;
        if shareable.is_null() || flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        if ty != HANDLE_TYPE_POSIX_FD {
            return Err(crate::not_supported("shareable handles other than file descriptors"));
        }
        let &(_, types) = table().handles.get(&handle).ok_or(code::INVALID_VALUE)?;
        if types & HANDLE_TYPE_POSIX_FD == 0 {
            return Err(code::INVALID_VALUE);
        }
        let [token, size, ..] = call(Request::VmmExport { handle })?;
        let fd = shareable::make(shareable::Content { kind: shareable::Kind::Vmm, token, size })?;
        out(shareable as *mut c_int, fd)
    }

    /// A handle of this process for memory another process of the VM
    /// exported; the descriptor stays the caller's.
    fn cuMemImportFromShareableHandle(handle: *mut c_ulonglong, os_handle: *mut c_void, ty: c_uint) {
        driver()?;
        if handle.is_null() {
            return Err(code::INVALID_VALUE);
        }
        if ty != HANDLE_TYPE_POSIX_FD {
            return Err(crate::not_supported("shareable handles other than file descriptors"));
        }
        let c = shareable::read(shareable::fd_of(os_handle)?, shareable::Kind::Vmm)?;
        let [h, ..] = call(Request::VmmImport { token: c.token })?;
        let mut t = table();
        let e = t.handles.entry(h).or_insert((0, HANDLE_TYPE_POSIX_FD));
        e.0 += 1;
        e.1 |= HANDLE_TYPE_POSIX_FD;
        drop(t);
        out(handle, h)
    }

    /// The handle of the memory mapped at `addr`, held once more.
    fn cuMemRetainAllocationHandle(handle: *mut c_ulonglong, addr: *mut c_void) {
        driver()?;
        if handle.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let v = call(Request::VmmRetain { ptr: addr as u64 })?;
        let h = v[0];
        let mut t = table();
        t.handles.entry(h).or_insert((0, 0)).0 += 1;
        set_compression(&mut t, h, v[2]);
        drop(t);
        out(handle, h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structs_have_the_drivers_layout() {
        assert_eq!(std::mem::size_of::<Location>(), 8);
        assert_eq!(std::mem::size_of::<AllocationProp>(), 32);
        assert_eq!(std::mem::offset_of!(AllocationProp, location), 8);
        assert_eq!(std::mem::offset_of!(AllocationProp, win32_meta), 16);
        assert_eq!(std::mem::offset_of!(AllocationProp, compression), 24);
        assert_eq!(std::mem::size_of::<AccessDesc>(), 12);
        assert_eq!(
            std::mem::size_of::<AllocationProp>(),
            std::mem::size_of::<cudarc::driver::sys::CUmemAllocationProp>()
        );
    }
}
