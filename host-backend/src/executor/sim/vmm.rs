//! VMM on the model: reserved address ranges (never handed out twice),
//! physical allocations by handle, and the mappings between them, which
//! the context's memory accesses look up (`memory.rs`).

use std::sync::Arc;

use protocol::Status;

use super::context::SimContext;
use super::memory::{lock, zeroed, Buf};
use crate::executor::{Handle, SharedMem};

/// A new handle, numbered apart from every other context's handles (an
/// imported one is used by the importer's context only).
fn next_handle() -> Handle {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0x564d_0000);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl SimContext {
    pub(super) fn vmm_reserve(&mut self, size: u64, align: u64, addr: u64) -> Result<u64, Status> {
        self.alive()?;
        // The address asked for is taken where the model has handed out
        // nothing (`addresses.rs`); a gap after it, as after allocations.
        self.addresses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .at(addr, size, align)
    }

    pub(super) fn vmm_create(&mut self, size: u64) -> Result<Handle, Status> {
        self.alive()?;
        let buf = zeroed(size)?;
        let h = next_handle();
        self.vmm_phys.insert(h, buf);
        Ok(h)
    }

    /// The handle's bytes themselves, for another context to hold.
    pub(super) fn share_phys(&mut self, handle: Handle) -> Result<SharedMem, Status> {
        self.alive()?;
        let buf = self.vmm_phys.get(&handle).ok_or(Status::InvalidHandle)?;
        Ok(SharedMem(Some(Arc::new(buf.clone()))))
    }

    /// A handle of this context for bytes another one shared.
    pub(super) fn import_phys(&mut self, mem: &SharedMem, size: u64) -> Result<Handle, Status> {
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

    pub(super) fn vmm_release(&mut self, handle: Handle) -> Result<(), Status> {
        self.vmm_phys
            .remove(&handle)
            .map(drop)
            .ok_or(Status::InvalidHandle)
    }

    pub(super) fn vmm_map(
        &mut self,
        ptr: u64,
        size: u64,
        offset: u64,
        handle: Handle,
    ) -> Result<(), Status> {
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

    pub(super) fn vmm_unmap(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        match self.vmm_maps.get(&ptr) {
            Some(&(n, ..)) if n == size => {
                self.vmm_maps.remove(&ptr);
                Ok(())
            }
            _ => Err(Status::InvalidValue),
        }
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
            ctx.vmm_create(2 * G).unwrap(),
            ctx.vmm_create(2 * G).unwrap(),
        );
        ctx.vmm_map(va, 2 * G, 0, a).unwrap();
        ctx.vmm_map(va + 2 * G, G, G, b).unwrap();
        // A copy across the two mappings, as one range.
        let mut data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
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
            .load_module(ImageKind::Ptx, crate::demo::KERNELS_PTX.as_bytes())
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
}
