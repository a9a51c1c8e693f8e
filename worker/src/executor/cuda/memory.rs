//! Device memory of a context: allocations (plain or movable VMM ranges),
//! copies and memsets.

use std::ffi::c_void;
use std::ptr::null_mut;

use cudarc::driver::sys;
use protocol::Status;
use vm_memory::VolatileSlice;

use super::check;
use super::context::CudaContext;
use super::vmm::{vmm_free, vmm_new_guest, VmmAlloc};
use crate::executor::{Handle, Memory};

impl CudaContext {
    /// The stream of device-to-host copies into the arenas.
    pub(super) fn copy_stream(&mut self) -> Result<sys::CUstream, Status> {
        if self.copy.is_null() {
            let mut st: sys::CUstream = null_mut();
            // SAFETY: out-parameter on our stack; the context is current.
            check(unsafe {
                sys::cuStreamCreate(&mut st, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            })?;
            self.copy = st;
        }
        Ok(self.copy)
    }
}

impl Memory for CudaContext {
    fn alloc(&mut self, size: u64) -> Result<u64, Status> {
        self.bind()?;
        if !self.vmm {
            let mut p = 0;
            // SAFETY: out-parameter on our stack.
            check(unsafe { sys::cuMemAlloc_v2(&mut p, crate::usize_from(size)) })?;
            self.plain.insert(p);
            return Ok(p);
        }
        let padded = crate::usize_from(self.footprint(size.max(1)));
        // A range over a moved global's old address (see `globals.rs`)
        // is kept aside while another is made, then given back.
        let mut aside = Vec::new();
        let made = loop {
            let (va, handle) = match vmm_new_guest(padded, self.ordinal) {
                Ok(v) => v,
                Err(e) => break Err(e),
            };
            if !self.globals.overlaps(va, padded as u64) {
                break Ok((va, handle));
            }
            aside.push((va, VmmAlloc { padded, handle }));
            if aside.len() >= 4 {
                break Err(Status::OutOfMemory);
            }
        };
        for (va, a) in aside {
            vmm_free(va, &a);
        }
        let (va, handle) = made?;
        self.allocs.insert(va, VmmAlloc { padded, handle });
        Ok(va)
    }

    fn footprint(&self, size: u64) -> u64 {
        let g = self.granularity as u64;
        size.div_ceil(g).saturating_mul(g)
    }

    fn free(&mut self, ptr: u64) -> Result<(), Status> {
        self.bind()?;
        if let Some(a) = self.allocs.remove(&ptr) {
            // Work still using it must finish first, as cuMemFree would wait.
            // SAFETY: no arguments; our context is current.
            check(unsafe { sys::cuCtxSynchronize() })?;
            vmm_free(ptr, &a);
            return Ok(());
        }
        // SAFETY: the worker checked `ptr` is a live allocation of this context.
        check(unsafe { sys::cuMemFree_v2(ptr) })?;
        self.plain.remove(&ptr);
        Ok(())
    }

    fn htod(&mut self, dst: u64, src: &VolatileSlice<'_>, s: Handle) -> Result<(), Status> {
        let dst = self.globals.addr(dst);
        self.bind()?;
        let st = self.stream(s)?;
        let p = src.ptr_guard().as_ptr() as *const c_void;
        // SAFETY: `src` is a live mapping of `src.len()` bytes; the destination range
        // was validated; pageable source memory is staged before the call returns.
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, p, src.len(), st) })
    }

    fn dtoh(&mut self, dst: &VolatileSlice<'_>, src: u64, s: Handle) -> Result<(), Status> {
        let src = self.globals.addr(src);
        self.bind()?;
        self.stream(s)?;
        // The work before the copy is done (the worker waited for its
        // mark): the copy goes on a stream of its own, so that it waits for
        // nothing submitted since.
        let st = self.copy_stream()?;
        let p = dst.ptr_guard_mut().as_ptr() as *mut c_void;
        // SAFETY: `dst` is a live, writable mapping of `dst.len()` bytes; the
        // source range was validated; the copy completes before we return.
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(p, src, dst.len(), st) })?;
        // SAFETY: our own stream of this context.
        check(unsafe { sys::cuStreamSynchronize(st) })
    }

    fn dtoh_async(&mut self, dst: &VolatileSlice<'_>, src: u64, s: Handle) -> Result<(), Status> {
        let src = self.globals.addr(src);
        self.bind()?;
        let st = self.stream(s)?;
        let p = dst.ptr_guard_mut().as_ptr() as *mut c_void;
        // SAFETY: `dst` is pinned pool memory, registered with the driver and
        // mapped as long as the executor lives; the source range was
        // validated; the guest waits on the stream before reading it.
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(p, src, dst.len(), st) })
    }

    fn dtod(&mut self, dst: u64, src: u64, len: u64, s: Handle) -> Result<(), Status> {
        let (dst, src) = (self.globals.addr(dst), self.globals.addr(src));
        self.bind()?;
        let st = self.stream(s)?;
        // SAFETY: both ranges validated by the worker.
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, crate::usize_from(len), st) })
    }

    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        width: u32,
        count: u64,
        s: Handle,
    ) -> Result<(), Status> {
        let dst = self.globals.addr(dst);
        self.bind()?;
        let n = crate::usize_from(count);
        let st = self.stream(s)?;
        // The value's low `width` bytes, as the protocol says (and the sim).
        let [b0, b1, _, _] = value.to_le_bytes();
        let r = match width {
            // SAFETY: range validated by the worker.
            1 => unsafe { sys::cuMemsetD8Async(dst, b0, n, st) },
            // SAFETY: as above.
            2 => unsafe { sys::cuMemsetD16Async(dst, u16::from_le_bytes([b0, b1]), n, st) },
            // SAFETY: as above.
            _ => unsafe { sys::cuMemsetD32Async(dst, value, n, st) },
        };
        check(r)
    }
}
