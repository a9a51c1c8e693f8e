//! The model's device memory in host RAM: finding the allocation or VMM
//! mapping an address lies in, and reading and writing through it.

use std::sync::{Arc, Mutex, MutexGuard};

use protocol::Status;
use vm_memory::VolatileSlice;

use super::bytes::Bytes;
use super::context::SimContext;
use crate::executor::{Handle, Ipc, Memory, Portable, SharedMem};

/// Bytes of model memory: an allocation's, or a VMM handle's. Shared with
/// the contexts of the worker that import it (IPC, see
/// [`SimContext::share_mem`]), as every context of one process reaches
/// every device address on a GPU.
pub(super) type Buf = Arc<Mutex<Bytes>>;

/// Memory another context of the worker imports: its bytes and where the
/// range starts in them.
pub(super) struct SharedBuf {
    pub buf: Buf,
    pub offset: u64,
}

pub(super) fn lock(b: &Buf) -> MutexGuard<'_, Bytes> {
    b.lock().unwrap_or_else(|e| e.into_inner())
}

impl SimContext {
    /// The memory containing [ptr, ptr+len), and the offset in it: an
    /// allocation, a VMM mapping, or memory imported from another context.
    pub(super) fn locate(
        &self,
        ptr: u64,
        len: u64,
    ) -> Result<(MutexGuard<'_, Bytes>, usize), Status> {
        match self.pinned.reach(ptr, len) {
            // Mapped host memory this worker registered: real kernels
            // reach it; the model's do not.
            Some(Ok(())) => return Err(Status::NotSupported),
            // The rest of the pool: not mapped for the device.
            Some(Err(e)) => return Err(e),
            None => {}
        }
        let fits =
            |base: u64, size: u64| (ptr - base).checked_add(len).is_some_and(|end| end <= size);
        if let Some((&base, buf)) = self.mem.range(..=ptr).next_back() {
            let g = lock(buf);
            if fits(base, g.len() as u64) {
                return Ok((g, crate::usize_from(ptr - base)));
            }
        }
        // Mapped VMM memory: the handle's bytes.
        if let Some((&va, &(size, h, offset))) = self.vmm_maps.range(..=ptr).next_back() {
            if fits(va, size) {
                let buf = self.vmm_phys.get(&h).ok_or(Status::IllegalAddress)?;
                return Ok((lock(buf), crate::usize_from(offset + ptr - va)));
            }
        }
        let (&base, &(size, ref shared)) = self
            .imports
            .range(..=ptr)
            .next_back()
            .ok_or(Status::IllegalAddress)?;
        if !fits(base, size) {
            return Err(Status::IllegalAddress);
        }
        Ok((
            lock(&shared.buf),
            crate::usize_from(shared.offset + ptr - base),
        ))
    }

    /// What another context of the worker needs to reach `[base, base +
    /// size)` of this one's memory (an allocation or a mapping).
    pub(super) fn share(&self, base: u64, size: u64) -> Result<SharedBuf, Status> {
        if let Some(buf) = self.mem.get(&base) {
            if size <= lock(buf).len() as u64 {
                return Ok(SharedBuf {
                    buf: buf.clone(),
                    offset: 0,
                });
            }
        }
        match self.vmm_maps.get(&base) {
            Some(&(n, h, offset)) if size <= n => Ok(SharedBuf {
                buf: self.vmm_phys.get(&h).ok_or(Status::InvalidValue)?.clone(),
                offset,
            }),
            _ => Err(Status::InvalidValue),
        }
    }

    /// `[ptr, ptr + len)` in pieces that each lie in one allocation or one
    /// mapping (VMM mappings that follow one another are one range to a
    /// program): (start, length) of each.
    pub(super) fn pieces(&self, ptr: u64, len: u64) -> Vec<(u64, u64)> {
        let whole = vec![(ptr, len)];
        let in_alloc = self
            .mem
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, buf)| ptr - b < lock(buf).len() as u64);
        let Some(end) = ptr.checked_add(len).filter(|_| !in_alloc) else {
            return whole;
        };
        let mut out = Vec::new();
        let mut at = ptr;
        while at < end {
            match self.vmm_maps.range(..=at).next_back() {
                Some((&va, &(size, ..))) if at < va + size => {
                    let n = (va + size).min(end) - at;
                    out.push((at, n));
                    at += n;
                }
                // A hole: `locate` reports it.
                _ => return whole,
            }
        }
        if out.is_empty() {
            whole
        } else {
            out
        }
    }

    pub(super) fn read_f32s(&mut self, ptr: u64, n: usize) -> Result<Vec<f32>, Status> {
        let (buf, off) = self.locate(ptr, n as u64 * 4)?;
        Ok(buf[off..off + n * 4]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    pub(super) fn write_f32s(&mut self, ptr: u64, v: &[f32]) -> Result<(), Status> {
        let (mut buf, off) = self.locate(ptr, v.len() as u64 * 4)?;
        for (i, x) in v.iter().enumerate() {
            buf[off + 4 * i..off + 4 * i + 4].copy_from_slice(&x.to_le_bytes());
        }
        Ok(())
    }

    /// Copies device bytes from `src` into `dst`.
    pub(super) fn read_into(&mut self, dst: &VolatileSlice<'_>, src: u64) -> Result<(), Status> {
        for (p, n) in self.pieces(src, dst.len() as u64) {
            let (buf, off) = self.locate(p, n)?;
            let part = dst
                .subslice(crate::usize_from(p - src), crate::usize_from(n))
                .map_err(|_| Status::InvalidValue)?;
            part.copy_from(&buf[off..off + crate::usize_from(n)]);
        }
        Ok(())
    }
}

/// `size` bytes of zeroed model memory, or `OutOfMemory` if the host has
/// not got them.
pub(super) fn zeroed(size: u64) -> Result<Buf, Status> {
    let len = usize::try_from(size).map_err(|_| Status::OutOfMemory)?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(len)
        .map_err(|_| Status::OutOfMemory)?;
    buf.resize(len, 0);
    Ok(Arc::new(Mutex::new(Bytes::Heap(buf))))
}

impl Memory for SimContext {
    fn alloc(&mut self, size: u64) -> Result<u64, Status> {
        self.alive()?;
        let buf = zeroed(size)?;
        // Kept apart (and 2 MiB aligned) so that an overrun is an error.
        let base = self
            .addresses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fresh(size, 0)?;
        self.mem.insert(base, buf);
        Ok(base)
    }

    fn free(&mut self, ptr: u64) -> Result<(), Status> {
        self.mem.remove(&ptr).map(drop).ok_or(Status::InvalidValue)
    }

    fn htod(&mut self, dst: u64, src: &VolatileSlice<'_>, stream: Handle) -> Result<(), Status> {
        self.alive()?;
        self.pinned.reach_slice(src)?;
        let len = src.len();
        for (p, n) in self.pieces(dst, len as u64) {
            let (mut buf, off) = self.locate(p, n)?;
            let part = src
                .subslice(crate::usize_from(p - dst), crate::usize_from(n))
                .map_err(|_| Status::InvalidValue)?;
            part.copy_to(&mut buf[off..off + crate::usize_from(n)]);
        }
        let ns = self.copy_ns(len as u64);
        self.submit(ns, stream);
        Ok(())
    }

    fn dtoh(&mut self, dst: &VolatileSlice<'_>, src: u64, stream: Handle) -> Result<(), Status> {
        self.alive()?;
        let len = dst.len();
        let ns = self.copy_ns(len as u64);
        let done = self.submit(ns, stream);
        self.read_into(dst, src)?;
        Self::wait_until(done);
        Ok(())
    }

    fn dtoh_async(
        &mut self,
        dst: &VolatileSlice<'_>,
        src: u64,
        stream: Handle,
    ) -> Result<(), Status> {
        self.alive()?;
        self.pinned.reach_slice(dst)?;
        // The model computes at submission: the bytes are those the work
        // submitted before has written.
        let len = dst.len();
        self.read_into(dst, src)?;
        let ns = self.copy_ns(len as u64);
        self.submit(ns, stream);
        Ok(())
    }

    fn dtod(&mut self, dst: u64, src: u64, len: u64, stream: Handle) -> Result<(), Status> {
        let mut data = Vec::new();
        for (p, n) in self.pieces(src, len) {
            let (buf, off) = self.locate(p, n)?;
            data.extend_from_slice(&buf[off..off + crate::usize_from(n)]);
        }
        for (p, n) in self.pieces(dst, len) {
            let (mut out, off) = self.locate(p, n)?;
            let from = crate::usize_from(p - dst);
            out[off..off + crate::usize_from(n)]
                .copy_from_slice(&data[from..from + crate::usize_from(n)]);
        }
        let ns = self.mem_ns(2 * len);
        self.submit(ns, stream);
        Ok(())
    }

    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        width: u32,
        count: u64,
        stream: Handle,
    ) -> Result<(), Status> {
        let w = width as usize;
        let len = count
            .checked_mul(u64::from(width))
            .ok_or(Status::InvalidValue)?;
        let pat = &value.to_le_bytes()[..w];
        for (p, n) in self.pieces(dst, len) {
            let (mut buf, off) = self.locate(p, n)?;
            // The pattern by byte offset from `dst` (pieces split anywhere).
            let from = crate::usize_from(p - dst);
            for (i, b) in buf[off..off + crate::usize_from(n)].iter_mut().enumerate() {
                *b = pat[(from + i) % w];
            }
        }
        let ns = self.mem_ns(len);
        self.submit(ns, stream);
        Ok(())
    }
}

impl Ipc for SimContext {
    fn share_mem(&mut self, base: u64, size: u64) -> Result<SharedMem, Status> {
        let shared = self.share(base, size)?;
        Ok(SharedMem(Some(std::sync::Arc::new(shared))))
    }

    fn import_mem(&mut self, base: u64, size: u64, mem: &SharedMem) -> Result<(), Status> {
        let shared = mem
            .0
            .as_ref()
            .and_then(|m| m.downcast_ref::<super::memory::SharedBuf>())
            .ok_or(Status::InvalidValue)?;
        let copy = super::memory::SharedBuf {
            buf: shared.buf.clone(),
            offset: shared.offset,
        };
        self.imports.insert(base, (size, copy));
        Ok(())
    }

    fn close_mem(&mut self, base: u64) {
        self.imports.remove(&base);
    }

    /// The bytes moved into a memfd (once), which the other worker maps;
    /// the handle's first 8 bytes say where the range starts in it.
    fn export_mem(&mut self, base: u64, size: u64) -> Result<Portable, Status> {
        self.alive()?;
        let shared = self.share(base, size)?;
        let mut b = lock(&shared.buf);
        b.make_shared()?;
        let mut handle = [0u8; 64];
        handle[..8].copy_from_slice(&shared.offset.to_le_bytes());
        Ok(Portable { handle, fd: b.fd() })
    }

    /// The other worker's memfd mapped, at an address of this context's.
    fn open_mem(&mut self, size: u64, p: Portable) -> Result<u64, Status> {
        self.alive()?;
        let fd = p.fd.ok_or(Status::InvalidValue)?;
        let offset =
            u64::from_le_bytes(p.handle[..8].try_into().map_err(|_| Status::InvalidValue)?);
        let len = offset
            .checked_add(size)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(Status::InvalidValue)?;
        let buf = Arc::new(Mutex::new(Bytes::map(fd, len)?));
        let base = self
            .addresses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fresh(size, 0)?;
        self.imports.insert(base, (size, SharedBuf { buf, offset }));
        Ok(base)
    }

    /// The handle's bytes moved into a memfd (once) the other worker maps.
    fn export_phys(&mut self, handle: Handle) -> Result<Portable, Status> {
        self.alive()?;
        let buf = self.vmm_phys.get(&handle).ok_or(Status::InvalidHandle)?;
        let mut b = lock(buf);
        b.make_shared()?;
        Ok(Portable {
            handle: [0; 64],
            fd: b.fd(),
        })
    }

    /// A handle of this context for the other worker's memfd, mapped.
    fn open_phys(&mut self, size: u64, p: Portable) -> Result<Handle, Status> {
        self.alive()?;
        let fd = p.fd.ok_or(Status::InvalidValue)?;
        let len = usize::try_from(size).map_err(|_| Status::InvalidValue)?;
        let buf = Arc::new(Mutex::new(Bytes::map(fd, len)?));
        Ok(self.adopt_phys(buf))
    }

    fn export_event(&mut self, event: Handle) -> Result<Portable, Status> {
        self.alive()?;
        self.export_shared_event(event)
    }

    fn open_event(&mut self, p: Portable) -> Result<Handle, Status> {
        self.alive()?;
        self.open_shared_event(p)
    }

    fn close_opened(&mut self, base: u64) -> Result<(), Status> {
        self.imports
            .remove(&base)
            .map(drop)
            .ok_or(Status::InvalidValue)
    }
}
