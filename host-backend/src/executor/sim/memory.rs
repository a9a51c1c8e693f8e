//! The model's device memory in host RAM: finding the allocation or VMM
//! mapping an address lies in, and reading and writing through it.

use protocol::Status;
use vm_memory::VolatileSlice;

use super::context::SimContext;

impl SimContext {
    /// The allocation containing [ptr, ptr+len), and the offset in it.
    pub(super) fn locate(&mut self, ptr: u64, len: u64) -> Result<(&mut Vec<u8>, usize), Status> {
        let (pool, pool_len) = self.pinned;
        if ptr >= pool && ptr - pool < pool_len {
            // Mapped host memory: real kernels reach it; the model's do not.
            return Err(Status::NotSupported);
        }
        let fits =
            |base: u64, size: u64| (ptr - base).checked_add(len).is_some_and(|end| end <= size);
        let alloc = self.mem.range(..=ptr).next_back();
        if let Some((&base, buf)) = alloc.filter(|(&b, buf)| fits(b, buf.len() as u64)) {
            let _ = buf;
            let buf = self.mem.get_mut(&base).ok_or(Status::IllegalAddress)?;
            return Ok((buf, (ptr - base) as usize));
        }
        // Mapped VMM memory: the handle's bytes.
        let (&va, &(size, h, offset)) = self
            .vmm_maps
            .range(..=ptr)
            .next_back()
            .ok_or(Status::IllegalAddress)?;
        if !fits(va, size) {
            return Err(Status::IllegalAddress);
        }
        let buf = self.vmm_phys.get_mut(&h).ok_or(Status::IllegalAddress)?;
        Ok((buf, (offset + ptr - va) as usize))
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
            .is_some_and(|(&b, buf)| ptr - b < buf.len() as u64);
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
        let (buf, off) = self.locate(ptr, v.len() as u64 * 4)?;
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
                .subslice((p - src) as usize, n as usize)
                .map_err(|_| Status::InvalidValue)?;
            part.copy_from(&buf[off..off + n as usize]);
        }
        Ok(())
    }
}

/// `size` bytes of zeroed model memory, or `OutOfMemory` if the host has
/// not got them.
pub(super) fn zeroed(size: u64) -> Result<Vec<u8>, Status> {
    let len = usize::try_from(size).map_err(|_| Status::OutOfMemory)?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(len)
        .map_err(|_| Status::OutOfMemory)?;
    buf.resize(len, 0);
    Ok(buf)
}
