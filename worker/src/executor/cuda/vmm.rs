//! Virtual memory management: the movable ranges allocations are made of,
//! and the guest's own reservations, physical memory and mappings.

use std::sync::Arc;

use cudarc::driver::sys;
use protocol::Status;

use super::check;
use super::context::CudaContext;
use crate::executor::{Handle, SharedMem, Vmm};

/// The guest's own virtual memory management objects (cuMemAddressReserve,
/// cuMemCreate, cuMemMap; the worker checked each call against the
/// session's table), undone when the context goes.
#[derive(Default)]
pub(super) struct GuestVmm {
    /// base -> size of each reservation.
    pub(super) reserved: std::collections::HashMap<u64, usize>,
    /// Our handle -> the driver's, and its size (to make it again on
    /// another GPU). Shared with another context of the worker when the
    /// guest exported it through a shareable handle (`share_phys`).
    pub(super) phys: crate::executor::HandleMap<(Arc<Phys>, usize)>,
    /// base -> size, our handle and the offset in its memory of each
    /// mapping (to map the memory made on another GPU in its place).
    pub(super) maps: std::collections::HashMap<u64, (usize, Handle, u64)>,
    /// Our handles whose memory the driver made compressible, with the
    /// compression type it gave (made so again on another GPU).
    pub(super) compressed: std::collections::HashMap<Handle, u8>,
}

impl GuestVmm {
    /// Unmaps, releases and unreserves everything (the context is current).
    pub(super) fn clear(&mut self) {
        for (va, (n, _, _)) in self.maps.drain() {
            // SAFETY: our own mapping, undone once.
            let _ = unsafe { sys::cuMemUnmap(va, n) };
        }
        // Released as the last holder lets go (`Phys::drop`).
        self.phys.clear();
        for (va, n) in self.reserved.drain() {
            // SAFETY: our own reservation, nothing mapped in it any more.
            let _ = unsafe { sys::cuMemAddressFree(va, n) };
        }
        self.compressed.clear();
    }

    /// The compression type our handle's memory has (0 if none).
    pub(super) fn compression_of(&self, handle: Handle) -> u8 {
        self.compressed.get(&handle).copied().unwrap_or(0)
    }
}

/// The driver's handle of physical memory the guest made, released once
/// every context holding it (the maker, importers of a shareable handle)
/// let go; the driver keeps the memory while it is still mapped.
pub(super) struct Phys(pub(super) sys::CUmemGenericAllocationHandle);

impl Drop for Phys {
    fn drop(&mut self) {
        // SAFETY: the driver's handle, made by `cuMemCreate` and released
        // once, here, when nothing of ours holds it any more (a VMM call
        // that needs no current context).
        let _ = unsafe { sys::cuMemRelease(self.0) };
    }
}

/// Device memory made with the virtual memory management API: a reserved
/// address range with physical memory of the current GPU mapped into it.
pub(super) struct VmmAlloc {
    pub(super) padded: usize,
    pub(super) handle: sys::CUmemGenericAllocationHandle,
}

/// Allocation properties for pinned device memory on GPU `ordinal`,
/// compressible if `compression` is `CU_MEM_ALLOCATION_COMP_GENERIC`.
pub(super) fn vmm_prop_compressed(ordinal: u32, compression: u8) -> sys::CUmemAllocationProp {
    let mut prop = vmm_prop(ordinal);
    prop.allocFlags.compressionType = compression;
    prop
}

/// The compression type the driver gave the memory of handle `h`.
pub(super) fn granted_compression(h: sys::CUmemGenericAllocationHandle) -> Result<u8, Status> {
    // SAFETY: as in `vmm_prop`: all-zero is a valid property struct.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: out-parameter on our stack; a live handle of ours.
    check(unsafe { sys::cuMemGetAllocationPropertiesFromHandle(&mut prop, h) })?;
    Ok(prop.allocFlags.compressionType)
}

/// Whether GPU `ordinal` makes compressible memory
/// (`CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED`).
pub(super) fn compression_supported(ordinal: u32) -> bool {
    let Ok(dev) = super::device::device(ordinal) else {
        return false;
    };
    let a = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED;
    let mut v = 0;
    // SAFETY: out-parameter on our stack; a device of the driver's.
    let r = unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
    r == sys::cudaError_enum::CUDA_SUCCESS && v != 0
}

/// Allocation properties for pinned device memory on GPU `ordinal`.
pub(super) fn vmm_prop(ordinal: u32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct for which all-zero is valid (every enum field
    // has a 0 variant: INVALID / NONE); the fields that matter are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = location_id(ordinal);
    super::ipc::request_fd(&mut prop, ordinal);
    prop
}

/// GPU `ordinal` as a memory location's id. The executor's ordinal passed
/// `device` (an `int`) when it opened; one past `i32::MAX` would be
/// `i32::MAX`, which names no GPU, and the driver refuses it.
fn location_id(ordinal: u32) -> i32 {
    i32::try_from(ordinal).unwrap_or(i32::MAX)
}

pub(super) fn vmm_access(ordinal: u32) -> sys::CUmemAccessDesc {
    // SAFETY: as in `vmm_prop`.
    let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = location_id(ordinal);
    d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d
}

/// Creates `padded` bytes of physical memory on GPU `ordinal` (of
/// compression type `compression`) and maps it at `va` (reserved by the
/// caller), readable and writable from that GPU.
pub(super) fn vmm_map(
    va: u64,
    padded: usize,
    ordinal: u32,
    compression: u8,
) -> Result<sys::CUmemGenericAllocationHandle, Status> {
    let prop = vmm_prop_compressed(ordinal, compression);
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: out-parameter on our stack; `prop` is a valid property struct.
    check(unsafe { sys::cuMemCreate(&mut h, padded, &prop, 0) })?;
    // SAFETY: `va` is a reserved range of `padded` bytes with nothing mapped;
    // `h` is a fresh handle of that size.
    if let Err(e) = check(unsafe { sys::cuMemMap(va, padded, 0, h, 0) }) {
        // SAFETY: our own handle, not mapped.
        let _ = unsafe { sys::cuMemRelease(h) };
        return Err(e);
    }
    let acc = vmm_access(ordinal);
    // SAFETY: the range was just mapped; one descriptor.
    if let Err(e) = check(unsafe { sys::cuMemSetAccess(va, padded, &acc, 1) }) {
        // SAFETY: undoing our own mapping and handle.
        let _ = unsafe { sys::cuMemUnmap(va, padded) };
        // SAFETY: as above.
        let _ = unsafe { sys::cuMemRelease(h) };
        return Err(e);
    }
    Ok(h)
}

/// Reserves `padded` bytes of address space and maps new memory of GPU
/// `ordinal` there (of compression type `compression`); undoes the
/// reservation if that fails.
pub(super) fn vmm_new(
    padded: usize,
    ordinal: u32,
    compression: u8,
) -> Result<(u64, sys::CUmemGenericAllocationHandle), Status> {
    let va = vmm_reserve(padded)?;
    match vmm_map(va, padded, ordinal, compression) {
        Ok(h) => Ok((va, h)),
        Err(e) => {
            // SAFETY: our own reservation, nothing mapped.
            let _ = unsafe { sys::cuMemAddressFree(va, padded) };
            Err(e)
        }
    }
}

/// Reserves `padded` bytes of device address space.
pub(super) fn vmm_reserve(padded: usize) -> Result<u64, Status> {
    let mut va = 0;
    // SAFETY: out-parameter on our stack; no fixed address, default alignment.
    check(unsafe { sys::cuMemAddressReserve(&mut va, padded, 0, 0, 0) })?;
    Ok(va)
}

/// New memory of GPU `ordinal` for a guest allocation of `padded` bytes,
/// at a range of the process's window of addresses (`window.rs`), or of
/// its own reservation where there is no window.
pub(super) fn vmm_new_guest(
    padded: usize,
    ordinal: u32,
) -> Result<(u64, sys::CUmemGenericAllocationHandle), Status> {
    let Some(va) = super::window::alloc(padded as u64) else {
        return vmm_new(padded, ordinal, 0);
    };
    vmm_map(va, padded, ordinal, 0)
        .map(|h| (va, h))
        .inspect_err(|_| {
            super::window::give(va, padded as u64);
        })
}

/// Unmaps and releases one VMM range, and gives its addresses back (to the
/// window, or to the driver where it had its own reservation).
pub(super) fn vmm_free(va: u64, a: &VmmAlloc) {
    // SAFETY: our own mapping and handle, each undone once.
    let _ = unsafe { sys::cuMemUnmap(va, a.padded) };
    // SAFETY: as above.
    let _ = unsafe { sys::cuMemRelease(a.handle) };
    if !super::window::give(va, a.padded as u64) {
        // SAFETY: our own reservation, undone once.
        let _ = unsafe { sys::cuMemAddressFree(va, a.padded) };
    }
}

impl Vmm for CudaContext {
    fn vmm_reserve(&mut self, size: u64, align: u64, addr: u64) -> Result<u64, Status> {
        self.bind()?;
        let n = usize::try_from(size).map_err(|_| Status::OutOfMemory)?;
        let mut va = 0;
        // SAFETY: out-parameter on our stack; an alignment of 0 or a power
        // of two and an address of 0 or a multiple of the granularity
        // (checked by the protocol), which the driver takes as a hint only.
        check(unsafe { sys::cuMemAddressReserve(&mut va, n, crate::usize_from(align), addr, 0) })?;
        self.guest_vmm.reserved.insert(va, n);
        Ok(va)
    }

    fn vmm_address_free(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        self.bind()?;
        match self.guest_vmm.reserved.get(&ptr) {
            Some(&n) if n as u64 == size => {}
            _ => return Err(Status::InvalidValue),
        }
        self.guest_vmm.reserved.remove(&ptr);
        // SAFETY: our own whole reservation, nothing mapped in it (the
        // worker checked), freed once.
        check(unsafe { sys::cuMemAddressFree(ptr, crate::usize_from(size)) })
    }

    fn vmm_create(&mut self, size: u64, compression: u8) -> Result<Handle, Status> {
        self.bind()?;
        let n = usize::try_from(size).map_err(|_| Status::OutOfMemory)?;
        let prop = vmm_prop_compressed(self.ordinal, compression);
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: out-parameter on our stack; a valid property struct
        // (pinned memory of this context's GPU, a compression type the
        // protocol checked: none or generic); a size that is a multiple of
        // 2 MiB (the protocol's check), no flags.
        check(unsafe { sys::cuMemCreate(&mut h, n, &prop, 0) })?;
        // What the driver gave, which may be less than was asked.
        let granted = if compression == 0 {
            Ok(0)
        } else {
            granted_compression(h)
        };
        let granted = match granted {
            Ok(g) => g,
            Err(e) => {
                // SAFETY: the handle just made, released once.
                let _ = unsafe { sys::cuMemRelease(h) };
                return Err(e);
            }
        };
        self.next_handle += 1;
        self.guest_vmm
            .phys
            .insert(self.next_handle, (Arc::new(Phys(h)), n));
        if granted != 0 {
            self.guest_vmm.compressed.insert(self.next_handle, granted);
        }
        Ok(self.next_handle)
    }

    fn vmm_compression(&self, handle: Handle) -> Result<u8, Status> {
        if !self.guest_vmm.phys.contains_key(&handle) {
            return Err(Status::InvalidHandle);
        }
        Ok(self.guest_vmm.compression_of(handle))
    }

    fn vmm_release(&mut self, handle: Handle) -> Result<(), Status> {
        self.bind()?;
        // Released once no context holds it (`Phys::drop`); no longer
        // mapped by this one (the worker checked).
        self.guest_vmm
            .phys
            .remove(&handle)
            .map(drop)
            .ok_or(Status::InvalidHandle)?;
        self.guest_vmm.compressed.remove(&handle);
        Ok(())
    }

    fn vmm_map(&mut self, ptr: u64, size: u64, offset: u64, handle: Handle) -> Result<(), Status> {
        self.bind()?;
        let h = self
            .guest_vmm
            .phys
            .get(&handle)
            .ok_or(Status::InvalidHandle)?
            .0
             .0;
        let n = crate::usize_from(size);
        // SAFETY: `ptr..ptr + size` lies in a reservation of ours with
        // nothing mapped there, and `offset + size` within the handle's
        // memory (the worker checked both); no flags.
        check(unsafe { sys::cuMemMap(ptr, n, crate::usize_from(offset), h, 0) })?;
        let acc = vmm_access(self.ordinal);
        // SAFETY: the range just mapped; one descriptor.
        if let Err(e) = check(unsafe { sys::cuMemSetAccess(ptr, n, &acc, 1) }) {
            // SAFETY: undoing the mapping just made.
            let _ = unsafe { sys::cuMemUnmap(ptr, n) };
            return Err(e);
        }
        self.guest_vmm.maps.insert(ptr, (n, handle, offset));
        Ok(())
    }

    fn vmm_unmap(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        self.bind()?;
        match self.guest_vmm.maps.get(&ptr) {
            Some(&(n, _, _)) if n as u64 == size => {}
            _ => return Err(Status::InvalidValue),
        }
        self.guest_vmm.maps.remove(&ptr);
        // SAFETY: one whole mapping of ours, undone once (the driver waits
        // for work still using it).
        check(unsafe { sys::cuMemUnmap(ptr, crate::usize_from(size)) })
    }

    /// The driver's handle itself, for another context of this process
    /// to hold (every context of a process reaches its VMM memory).
    fn share_phys(&mut self, handle: Handle) -> Result<SharedMem, Status> {
        let (p, _) = self
            .guest_vmm
            .phys
            .get(&handle)
            .ok_or(Status::InvalidHandle)?;
        Ok(SharedMem(Some(Arc::new(p.clone()))))
    }

    /// A handle of ours for physical memory another context shared.
    fn import_phys(&mut self, mem: &SharedMem, size: u64) -> Result<Handle, Status> {
        let p = mem
            .0
            .as_ref()
            .and_then(|m| m.downcast_ref::<Arc<Phys>>())
            .ok_or(Status::InvalidValue)?;
        let n = usize::try_from(size).map_err(|_| Status::InvalidValue)?;
        self.next_handle += 1;
        self.guest_vmm.phys.insert(self.next_handle, (p.clone(), n));
        Ok(self.next_handle)
    }
}
