//! The region's pinned pool: page-locked host memory in the shared region,
//! registered with the device, that guests get for `cuMemHostAlloc`,
//! registered memory and managed memory. Copies to and from it are DMA
//! with no staging; kernels can read and write it. The pool is the VM's
//! (all its processes map it); each block belongs to the session that
//! asked for it, is checked on every use, and goes back with it.

use std::collections::BTreeMap;

use protocol::Status;

use super::sessions::SessionId;

/// Blocks are handed out in pages.
pub(super) const PAGE: u64 = 4096;

/// The pool's blocks: offset -> (length, owner).
#[derive(Debug, Default)]
pub(super) struct PinnedPool {
    /// Where its part of the region's pool begins (a process slot's
    /// worker hands out its slot's part alone) and ends.
    start: u64,
    size: u64,
    /// The pool's device address (0: not reachable by the device).
    device_base: u64,
    blocks: BTreeMap<u64, (u64, SessionId)>,
    used: u64,
}

impl PinnedPool {
    /// A pool handing out `[start, end)` of the region's pool.
    pub fn new_part(start: u64, end: u64) -> PinnedPool {
        PinnedPool {
            start,
            size: end,
            ..Default::default()
        }
    }

    /// Sets the pool's device address (where kernels and device-side
    /// operations reach it).
    pub fn set_device_base(&mut self, base: u64) {
        self.device_base = base;
    }

    /// Whether [dev, dev+len) is device-mapped pool memory of `owner`'s
    /// blocks: a memset there is the device writing the process's own
    /// page-locked memory.
    pub fn owns_device_range(&self, owner: SessionId, dev: u64, len: u64) -> bool {
        self.device_base != 0
            && dev >= self.device_base
            && self.check(owner, dev - self.device_base, len).is_ok()
    }

    /// A block of at least `len` bytes for `owner` (first fit); its offset.
    pub fn alloc(&mut self, len: u64, owner: SessionId) -> Result<u64, Status> {
        let len = len
            .checked_next_multiple_of(PAGE)
            .ok_or(Status::OutOfMemory)?;
        let mut at = self.start;
        for (&off, &(l, _)) in &self.blocks {
            if off - at >= len {
                break;
            }
            at = off + l;
        }
        if self.size.saturating_sub(at) < len {
            return Err(Status::OutOfMemory);
        }
        self.blocks.insert(at, (len, owner));
        self.used += len;
        Ok(at)
    }

    /// Gives back `owner`'s block at `off`.
    pub fn free(&mut self, off: u64, owner: SessionId) -> Result<(), Status> {
        match self.blocks.get(&off) {
            Some(&(len, o)) if o == owner => {
                self.blocks.remove(&off);
                self.used -= len;
                Ok(())
            }
            _ => Err(Status::InvalidValue),
        }
    }

    /// Gives back every block of `owner` (its session ended).
    pub fn release(&mut self, owner: SessionId) {
        let mut freed = 0;
        self.blocks.retain(|_, &mut (len, o)| {
            let keep = o != owner;
            if !keep {
                freed += len;
            }
            keep
        });
        self.used -= freed;
    }

    /// Checks that `[off, off + len)` lies in one block of `owner`.
    pub fn check(&self, owner: SessionId, off: u64, len: u64) -> Result<(), Status> {
        let end = off.checked_add(len).ok_or(Status::InvalidValue)?;
        match self.blocks.range(..=off).next_back() {
            Some((&base, &(l, o))) if o == owner && end <= base + l => Ok(()),
            _ => Err(Status::InvalidValue),
        }
    }

    /// Bytes handed out.
    pub fn used(&self) -> u64 {
        self.used
    }
}

/// A part of the pinned pool (checked to be the session's by the caller),
/// as a pointer and length that outlive the borrow of `sh`: the mapping
/// lives as long as the worker.
pub(super) struct PoolPart {
    addr: usize,
    len: usize,
}

impl PoolPart {
    pub fn as_slice(&self) -> vm_memory::VolatileSlice<'static> {
        // SAFETY: a range of the worker's pinned pool mapping (checked
        // against the pool's size below), which stays mapped until the
        // worker ends; all access through the slice is volatile.
        unsafe { vm_memory::VolatileSlice::new(self.addr as *mut u8, self.len) }
    }
}

pub(super) fn part(gpu: &super::shared::Gpu, offset: u64, len: u64) -> Result<PoolPart, Status> {
    let m = gpu.pinned_map.as_ref().ok_or(Status::NotSupported)?;
    let end = offset.checked_add(len).ok_or(Status::InvalidValue)?;
    if end > m.len() as u64 {
        return Err(Status::InvalidValue);
    }
    Ok(PoolPart {
        addr: m.addr() + crate::usize_from(offset),
        len: crate::usize_from(len),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_first_fit_owned_and_checked() {
        let mut p = PinnedPool::new_part(0, 16 * PAGE);
        let a = p.alloc(1, 1).unwrap();
        let b = p.alloc(3 * PAGE, 2).unwrap();
        assert_eq!((a, b), (0, PAGE));
        assert!(p.check(1, 0, PAGE).is_ok());
        assert!(p.check(1, 0, PAGE + 1).is_err(), "past its block");
        assert!(p.check(2, 0, 1).is_err(), "another session's block");
        assert!(p.check(2, PAGE, u64::MAX).is_err(), "overflow");
        assert!(p.free(b, 1).is_err(), "not its own");
        p.free(a, 1).unwrap();
        assert_eq!(p.alloc(PAGE, 3).unwrap(), 0, "the gap is reused");
        assert_eq!(p.alloc(12 * PAGE, 3).unwrap(), 4 * PAGE);
        assert_eq!(p.alloc(1, 4), Err(Status::OutOfMemory));
        p.release(3);
        assert_eq!(p.used(), 3 * PAGE);
        assert!(p.alloc(u64::MAX, 1).is_err());
    }

    /// A process slot's worker hands out its part of the region's pool
    /// alone.
    #[test]
    fn a_part_of_the_pool_hands_out_its_own_pages_alone() {
        let mut p = PinnedPool::new_part(8 * PAGE, 16 * PAGE);
        assert_eq!(p.alloc(PAGE, 1), Ok(8 * PAGE));
        assert_eq!(p.alloc(7 * PAGE, 1), Ok(9 * PAGE));
        assert_eq!(p.alloc(1, 1), Err(Status::OutOfMemory));
    }
}
