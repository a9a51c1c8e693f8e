//! VMM on the model: reserved address ranges (never handed out twice),
//! physical allocations by handle, and the mappings between them, which
//! the context's memory accesses look up (`memory.rs`). A simulated GPU has
//! generic compression (its attribute 107 is 1) unless
//! `SimParams::no_compression_gpu` names it: compressible memory is
//! granted as asked where it has, made plain where not, and holds bytes as
//! any other; it keeps the vGPU from moving to a GPU without.

use std::sync::Arc;

use protocol::Status;

use super::context::SimContext;
use super::memory::{lock, zeroed, Buf};
use crate::executor::{Handle, SharedMem, Vmm};

/// A new handle, numbered apart from every other context's handles (an
/// imported one is used by the importer's context only).
fn next_handle() -> Handle {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0x564d_0000);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl SimContext {
    /// Compressible memory keeps the vGPU from a GPU without compression.
    pub(super) fn compression_keeper(&self, target: u32) -> Option<crate::executor::Keeper> {
        (target != self.device
            && !self.vmm_compressed.is_empty()
            && !self.params.compresses(target))
        .then_some(crate::executor::Keeper::CompressibleMemory)
    }
}

impl SimContext {
    /// A handle of this context for `buf` (physical memory another worker
    /// exported).
    pub(super) fn adopt_phys(&mut self, buf: Buf) -> Handle {
        let h = next_handle();
        self.vmm_phys.insert(h, buf);
        h
    }
}

impl Vmm for SimContext {
    fn vmm_address_free(&mut self, _ptr: u64, _size: u64) -> Result<(), Status> {
        // Addresses are never handed out again in the model.
        Ok(())
    }

    fn vmm_reserve(&mut self, size: u64, align: u64, addr: u64) -> Result<u64, Status> {
        self.alive()?;
        // The address asked for is taken where the model has handed out
        // nothing (`addresses.rs`); a gap after it, as after allocations.
        self.addresses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .at(addr, size, align)
    }

    fn vmm_create(&mut self, size: u64, compression: u8) -> Result<Handle, Status> {
        self.alive()?;
        // The driver's types: none or generic.
        if compression > protocol::VMM_COMPRESSION_GENERIC {
            return Err(Status::InvalidValue);
        }
        let buf = zeroed(size)?;
        let h = next_handle();
        self.vmm_phys.insert(h, buf);
        // As a driver does: asked of a GPU without it, the memory is plain.
        if compression != 0 && self.params.compresses(self.device) {
            self.vmm_compressed.insert(h, compression);
        }
        Ok(h)
    }

    fn vmm_compression(&self, handle: Handle) -> Result<u8, Status> {
        if !self.vmm_phys.contains_key(&handle) {
            return Err(Status::InvalidHandle);
        }
        Ok(self.vmm_compressed.get(&handle).copied().unwrap_or(0))
    }

    fn vmm_release(&mut self, handle: Handle) -> Result<(), Status> {
        self.vmm_compressed.remove(&handle);
        self.vmm_phys
            .remove(&handle)
            .map(drop)
            .ok_or(Status::InvalidHandle)
    }

    fn vmm_map(&mut self, ptr: u64, size: u64, offset: u64, handle: Handle) -> Result<(), Status> {
        let len = self
            .vmm_phys
            .get(&handle)
            .ok_or(Status::InvalidHandle)?
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len() as u64;
        if offset.checked_add(size).is_none_or(|e| e > len) {
            return Err(Status::InvalidValue);
        }
        self.vmm_maps.insert(ptr, (size, handle, offset));
        Ok(())
    }

    fn vmm_unmap(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        match self.vmm_maps.get(&ptr) {
            Some(&(n, ..)) if n == size => {
                self.vmm_maps.remove(&ptr);
                Ok(())
            }
            _ => Err(Status::InvalidValue),
        }
    }

    /// The handle's bytes themselves, for another context to hold.
    fn share_phys(&mut self, handle: Handle) -> Result<SharedMem, Status> {
        self.alive()?;
        let buf = self.vmm_phys.get(&handle).ok_or(Status::InvalidHandle)?;
        Ok(SharedMem(Some(Arc::new(buf.clone()))))
    }

    /// A handle of this context for bytes another one shared.
    fn import_phys(&mut self, mem: &SharedMem, size: u64) -> Result<Handle, Status> {
        self.alive()?;
        let buf = mem
            .0
            .as_ref()
            .and_then(|m| m.downcast_ref::<Buf>())
            .ok_or(Status::InvalidValue)?;
        if lock(buf).len() as u64 != size {
            return Err(Status::InvalidValue);
        }
        let h = next_handle();
        self.vmm_phys.insert(h, buf.clone());
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use protocol::{Dim3, ImageKind, Status};
    use vm_memory::VolatileSlice;

    use crate::executor::sim::kernels::vector_add_params;
    use crate::executor::sim::{SimExecutor, SimParams};
    use crate::executor::Executor;

    #[test]
    fn mapped_vmm_memory_is_the_handles_bytes_until_unmapped() {
        const G: u64 = protocol::VMM_GRANULARITY;
        let mut ctx = SimExecutor::new(SimParams::default()).open().unwrap();
        let va = ctx.vmm_reserve(4 * G, 0, 0).unwrap();
        let (a, b) = (
            ctx.vmm_create(2 * G, 0).unwrap(),
            ctx.vmm_create(2 * G, 0).unwrap(),
        );
        ctx.vmm_map(va, 2 * G, 0, a).unwrap();
        ctx.vmm_map(va + 2 * G, G, G, b).unwrap();
        // A copy across the two mappings, as one range.
        let mut data: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        let at = va + 2 * G - 2048;
        ctx.htod(at, &VolatileSlice::from(&mut data[..]), 0)
            .unwrap();
        ctx.memset(at + 1000, 0xabcd, 2, 1024, 0).unwrap();
        let mut back = vec![0u8; 4096];
        ctx.dtoh(&VolatileSlice::from(&mut back[..]), at, 0)
            .unwrap();
        assert_eq!(back[..1000], data[..1000]);
        assert_eq!(back[1000..1004], [0xcd, 0xab, 0xcd, 0xab]);
        assert_eq!(back[3048..], data[3048..]);
        // Kernels see it too.
        let m = ctx
            .load_module(ImageKind::Ptx, crate::KERNELS_PTX.as_bytes())
            .unwrap();
        let (f, _) = ctx.function(m, "vector_add").unwrap();
        let (g, bl) = (Dim3 { x: 1, y: 1, z: 1 }, Dim3 { x: 16, y: 1, z: 1 });
        ctx.launch(f, g, bl, 0, 0, &vector_add_params(va, va, va + 64, 16))
            .unwrap();
        // Unmapped (or never mapped) addresses fault like any other.
        ctx.vmm_unmap(va + 2 * G, G).unwrap();
        ctx.vmm_release(b).unwrap();
        assert_eq!(ctx.dtod(va + 3 * G, va, 16, 0), Err(Status::IllegalAddress));
        assert_eq!(
            ctx.memset(va + 2 * G, 0, 1, 1, 0),
            Err(Status::IllegalAddress)
        );
        assert_eq!(ctx.vmm_unmap(va, G), Err(Status::InvalidValue));
        ctx.vmm_unmap(va, 2 * G).unwrap();
        assert_eq!(ctx.memset(va, 0, 1, 1, 0), Err(Status::IllegalAddress));
    }

    #[test]
    fn compressible_memory_is_granted_remembered_and_holds_bytes() {
        const G: u64 = protocol::VMM_GRANULARITY;
        let mut ctx = SimExecutor::new(SimParams::default()).open().unwrap();
        let c = ctx
            .vmm_create(G, protocol::VMM_COMPRESSION_GENERIC)
            .unwrap();
        let plain = ctx.vmm_create(G, 0).unwrap();
        assert_eq!(
            ctx.vmm_compression(c),
            Ok(protocol::VMM_COMPRESSION_GENERIC)
        );
        assert_eq!(ctx.vmm_compression(plain), Ok(0));
        assert_eq!(ctx.vmm_create(G, 2), Err(Status::InvalidValue));
        let va = ctx.vmm_reserve(G, 0, 0).unwrap();
        ctx.vmm_map(va, G, 0, c).unwrap();
        let mut data: Vec<u8> = (0..4096u32)
            .map(|i| u8::try_from(i * 7 % 256).unwrap())
            .collect();
        ctx.htod(va + 4096, &VolatileSlice::from(&mut data[..]), 0)
            .unwrap();
        let mut back = vec![0u8; 4096];
        ctx.dtoh(&VolatileSlice::from(&mut back[..]), va + 4096, 0)
            .unwrap();
        assert_eq!(back, data);
        ctx.vmm_unmap(va, G).unwrap();
        ctx.vmm_release(c).unwrap();
        assert_eq!(ctx.vmm_compression(c), Err(Status::InvalidHandle));
    }

    #[test]
    fn a_gpu_without_compression_makes_it_plain_and_keeps_compressible_memory_away() {
        use crate::executor::Keeper;
        const G: u64 = protocol::VMM_GRANULARITY;
        let mut exec = SimExecutor::new(SimParams {
            gpus: 2,
            no_compression_gpu: Some(1),
            ..SimParams::default()
        });
        let attr = |e: &SimExecutor| e.info().attributes.iter().find(|a| a.0 == 107).map(|a| a.1);
        assert_eq!(attr(&exec), Some(1));
        let mut ctx = exec.open().unwrap();
        let c = ctx
            .vmm_create(G, protocol::VMM_COMPRESSION_GENERIC)
            .unwrap();
        assert_eq!(ctx.migration_keeper_to(0), None);
        assert_eq!(ctx.migration_keeper_to(1), Some(Keeper::CompressibleMemory));
        assert_eq!(ctx.migrate(1, None).unwrap_err(), Status::NotSupported);
        ctx.vmm_release(c).unwrap();
        assert_eq!(ctx.migration_keeper_to(1), None);
        ctx.migrate(1, None).unwrap();
        // Asked of GPU 1, compressible memory is made plain.
        let p = ctx
            .vmm_create(G, protocol::VMM_COMPRESSION_GENERIC)
            .unwrap();
        assert_eq!(ctx.vmm_compression(p), Ok(0));
        exec.set_device(1).unwrap();
        assert_eq!(attr(&exec), Some(0));
    }
}
