//! The `Vmm` family of [`super::Context`]: the guest's own virtual memory management
//! (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`...) and shareable physical memory.

use protocol::Status;

use super::{Handle, SharedMem};

/// The guest's own virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`...)
/// and shareable physical memory.
pub trait Vmm {
    /// Reserves `size` bytes of device address space (`align`: 0 or a power
    /// of two; `addr`: 0, or the address asked for, which the device may
    /// not give) for the guest's own mappings (cuMemAddressReserve). The
    /// worker checks every VMM call against the session's table
    /// (`session::vmm`) first.
    fn vmm_reserve(&mut self, _size: u64, _align: u64, _addr: u64) -> Result<u64, Status> {
        Err(Status::NotSupported)
    }
    /// Frees a reservation with nothing mapped in it.
    fn vmm_address_free(&mut self, _ptr: u64, _size: u64) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// Makes `size` bytes of physical memory on the context's GPU,
    /// compressible if `compression` is `CU_MEM_ALLOCATION_COMP_GENERIC`
    /// (the device may not grant it: [`Self::vmm_compression`] says);
    /// returns a handle of this executor's.
    fn vmm_create(&mut self, _size: u64, _compression: u8) -> Result<Handle, Status> {
        Err(Status::NotSupported)
    }
    /// The compression type `handle`'s memory has, as the device reports
    /// it (not as it was asked for).
    fn vmm_compression(&self, _handle: Handle) -> Result<u8, Status> {
        Err(Status::NotSupported)
    }
    /// Frees physical memory that nothing maps.
    fn vmm_release(&mut self, _handle: Handle) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// Maps `size` bytes of `handle`'s memory from `offset` at `ptr` (in a
    /// reservation, over nothing mapped), readable and writable from the
    /// context's GPU.
    fn vmm_map(
        &mut self,
        _ptr: u64,
        _size: u64,
        _offset: u64,
        _handle: Handle,
    ) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// Unmaps one whole mapping.
    fn vmm_unmap(&mut self, _ptr: u64, _size: u64) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// What another context of this worker needs to hold the physical
    /// memory of `handle` (a shareable handle, `session/share.rs`): the
    /// memory itself, freed once its last holder lets go.
    fn share_phys(&mut self, _handle: Handle) -> Result<SharedMem, Status> {
        Err(Status::NotSupported)
    }
    /// A handle of this context for `size` bytes of physical memory another
    /// context shared ([`Self::share_phys`]): mapped, released and held
    /// as one made by [`Self::vmm_create`].
    fn import_phys(&mut self, _mem: &SharedMem, _size: u64) -> Result<Handle, Status> {
        Err(Status::NotSupported)
    }
}
