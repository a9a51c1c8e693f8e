//! The region's pinned pool: page-locked host memory in the shared region,
//! reachable by the device, that guests get for `cuMemHostAlloc`,
//! registered memory and managed memory. Copies to and from it are DMA
//! with no staging; kernels can read and write it. The pool is the VM's
//! (all its processes map it); each block belongs to the session that
//! asked for it, is checked on every use, and goes back with it.
//!
//! The pool is one budget for the whole vGPU: its workers (one per guest
//! process where the VM has process slots) claim chunks of it as their
//! processes ask, in the VM's ledger (`ledger.rs`), and hand out blocks
//! from their own chunks first fit, in pages; a chunk goes back once no
//! block is in it, and all of a worker's when it ends. Where the GPU
//! reaches registered host memory at its host address, each block is
//! registered with the device when handed out and unregistered when
//! freed, as the driver's own `cuMemHostAlloc` pins per call
//! ([`alloc`], [`free`], [`release`]); elsewhere the worker registered the
//! whole pool at its start (`setup.rs`).

use std::collections::{BTreeMap, BTreeSet};

use protocol::Status;

use super::sessions::SessionId;
use crate::ledger::{chunk_size, ChunkOwner, Ledger};

/// Blocks are handed out in pages.
pub(super) const PAGE: u64 = 4096;

/// The pool's blocks: offset -> (length, owner).
#[derive(Debug)]
pub(super) struct PinnedPool {
    /// The pool's bytes.
    size: u64,
    /// The pool's device address (0: not reachable by the device).
    device_base: u64,
    /// Whether each block is registered with the device on its own (else
    /// the whole pool is).
    per_block: bool,
    blocks: BTreeMap<u64, (u64, SessionId)>,
    used: u64,
    /// The VM's chunk table, the slot this worker claims chunks as, a
    /// chunk's bytes, and the chunks it holds.
    ledger: Ledger,
    slot: u32,
    chunk: u64,
    owned: BTreeSet<u64>,
}

impl PinnedPool {
    /// A pool of `size` bytes whose chunks this worker claims in `ledger`
    /// as process slot `slot`'s; whatever the slot's previous worker held
    /// there is given back first (it ended, perhaps without doing so).
    pub fn new(size: u64, ledger: Ledger, slot: u32) -> PinnedPool {
        let freed = ledger.reclaim_chunks(slot);
        if freed > 0 {
            tracing::info!(
                slot,
                chunks = freed,
                "pinned pool chunks the slot's previous worker held given back"
            );
        }
        PinnedPool {
            size,
            device_base: 0,
            per_block: false,
            blocks: BTreeMap::new(),
            used: 0,
            chunk: chunk_size(size),
            ledger,
            slot,
            owned: BTreeSet::new(),
        }
    }

    /// Sets the pool's device address (where kernels and device-side
    /// operations reach it) and whether its blocks are registered one by
    /// one.
    pub fn set_device_base(&mut self, base: u64, per_block: bool) {
        self.device_base = base;
        self.per_block = per_block;
    }

    /// Whether [dev, dev+len) is device-mapped pool memory of `owner`'s
    /// blocks: a memset there is the device writing the process's own
    /// page-locked memory.
    pub fn owns_device_range(&self, owner: SessionId, dev: u64, len: u64) -> bool {
        self.device_base != 0
            && dev >= self.device_base
            && self.check(owner, dev - self.device_base, len).is_ok()
    }

    /// A block of at least `len` bytes for `owner`: first fit in the
    /// chunks this worker holds, else in chunks it claims; its offset.
    pub fn alloc(&mut self, len: u64, owner: SessionId) -> Result<u64, Status> {
        if len == 0 {
            return Err(Status::InvalidValue);
        }
        let len = len
            .checked_next_multiple_of(PAGE)
            .filter(|&l| l <= self.size)
            .ok_or(Status::OutOfMemory)?;
        let at = match self.fit_in_owned(len) {
            Some(at) => at,
            None => self.claim_run(len)?,
        };
        self.blocks.insert(at, (len, owner));
        self.used += len;
        Ok(at)
    }

    /// `owner`'s block `[off, off + len)` again, as a checkpoint has it
    /// (`checkpoint.rs`): whole pages within the pool, apart from every
    /// block, in chunks this worker holds or claims.
    pub fn restore_block(&mut self, off: u64, len: u64, owner: SessionId) -> Result<(), Status> {
        let end = off.checked_add(len).ok_or(Status::InvalidValue)?;
        let whole =
            len > 0 && off.is_multiple_of(PAGE) && len.is_multiple_of(PAGE) && end <= self.size;
        let apart = self
            .blocks
            .range(..end)
            .next_back()
            .is_none_or(|(&o, &(l, _))| o + l <= off);
        if !whole || !apart {
            return Err(Status::InvalidValue);
        }
        for k in off / self.chunk..end.div_ceil(self.chunk) {
            if !self.owned.contains(&k) {
                if !self.ledger.claim_chunk(crate::usize_from(k), self.slot) {
                    return Err(Status::OutOfMemory);
                }
                self.owned.insert(k);
            }
        }
        self.blocks.insert(off, (len, owner));
        self.used += len;
        Ok(())
    }

    /// The first gap of `len` bytes in a run of chunks this worker holds.
    fn fit_in_owned(&self, len: u64) -> Option<u64> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &k in &self.owned {
            match runs.last_mut() {
                Some((_, end)) if *end == k => *end = k + 1,
                _ => runs.push((k, k + 1)),
            }
        }
        runs.into_iter().find_map(|(first, end)| {
            let (start, end) = (first * self.chunk, (end * self.chunk).min(self.size));
            let mut at = start;
            for (&off, &(l, _)) in self.blocks.range(start..end) {
                if off - at >= len {
                    return Some(at);
                }
                at = off + l;
            }
            (end - at >= len).then_some(at)
        })
    }

    /// Claims the first run of free chunks that holds `len` bytes; its
    /// offset.
    fn claim_run(&mut self, len: u64) -> Result<u64, Status> {
        let n = len.div_ceil(self.chunk);
        let count = self.size.div_ceil(self.chunk);
        let mut first = 0;
        while first + n <= count && first * self.chunk + len <= self.size {
            let k = |i: u64| crate::usize_from(i);
            if let Some(taken) =
                (first..first + n).find(|&i| self.ledger.chunk(k(i)) != ChunkOwner::Free)
            {
                first = taken + 1;
                continue;
            }
            let got = (first..first + n)
                .take_while(|&i| self.ledger.claim_chunk(k(i), self.slot))
                .count() as u64;
            if got == n {
                self.owned.extend(first..first + n);
                return Ok(first * self.chunk);
            }
            // Another worker took one meanwhile: ours go back.
            for i in first..first + got {
                self.ledger.give_back_chunk(k(i), self.slot);
            }
            first += got + 1;
        }
        Err(Status::OutOfMemory)
    }

    /// Gives back the chunks of `[off, off + len)` that no block is in any
    /// more.
    fn give_back_empty(&mut self, off: u64, len: u64) {
        let last = (off + len).div_ceil(self.chunk);
        for k in off / self.chunk..last {
            let (start, end) = (k * self.chunk, (k + 1) * self.chunk);
            let used = self
                .blocks
                .range(..end)
                .next_back()
                .is_some_and(|(&o, &(l, _))| o + l > start);
            if !used && self.owned.remove(&k) {
                self.give_back_chunk(k);
            }
        }
    }

    fn give_back_chunk(&self, k: u64) {
        if !self.ledger.give_back_chunk(crate::usize_from(k), self.slot) {
            tracing::warn!(
                chunk = k,
                "a pinned pool chunk this worker held was not its own in the ledger"
            );
        }
    }

    /// The length of `owner`'s block at `off`.
    pub fn block(&self, off: u64, owner: SessionId) -> Result<u64, Status> {
        match self.blocks.get(&off) {
            Some(&(len, o)) if o == owner => Ok(len),
            _ => Err(Status::InvalidValue),
        }
    }

    /// Gives back `owner`'s block at `off`.
    pub fn free(&mut self, off: u64, owner: SessionId) -> Result<(), Status> {
        let len = self.block(off, owner)?;
        self.blocks.remove(&off);
        self.used -= len;
        self.give_back_empty(off, len);
        Ok(())
    }

    /// `owner`'s blocks, `(offset, length)`.
    pub fn blocks_of(&self, owner: SessionId) -> Vec<(u64, u64)> {
        self.blocks
            .iter()
            .filter(|(_, &(_, o))| o == owner)
            .map(|(&off, &(len, _))| (off, len))
            .collect()
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

    /// Bytes of the chunks this worker holds.
    #[cfg(test)]
    pub fn held(&self) -> u64 {
        self.owned.len() as u64 * self.chunk
    }
}

impl Drop for PinnedPool {
    /// The worker ends: its chunks go back to the VM's other workers.
    fn drop(&mut self) {
        for k in std::mem::take(&mut self.owned) {
            self.give_back_chunk(k);
        }
    }
}

/// A block of `len` bytes for `owner`, registered with the device if
/// blocks are registered one by one; its offset in the pool.
pub(super) fn alloc(
    gpu: &mut super::shared::Gpu,
    len: u64,
    owner: SessionId,
) -> Result<u64, Status> {
    let off = gpu.pinned.alloc(len, owner)?;
    if gpu.pinned.per_block {
        let len = gpu.pinned.block(off, owner)?;
        let r = part(gpu, off, len).and_then(|p| gpu.exec.register_pinned_block(&p.as_slice()));
        if let Err(s) = r {
            // A guest can cause it (the host's locked memory exhausted):
            // its refusal is logged, rate-limited, by the caller.
            tracing::debug!("a pinned block not registered with the device: {s:?}");
            let _ = gpu.pinned.free(off, owner);
            return Err(Status::OutOfMemory);
        }
    }
    Ok(off)
}

/// `owner`'s block `[off, off + len)` again, from a checkpoint, registered
/// with the device as [`alloc`] registers one.
pub(super) fn restore(
    gpu: &mut super::shared::Gpu,
    off: u64,
    len: u64,
    owner: SessionId,
) -> Result<(), Status> {
    gpu.pinned.restore_block(off, len, owner)?;
    if gpu.pinned.per_block {
        let r = part(gpu, off, len).and_then(|p| gpu.exec.register_pinned_block(&p.as_slice()));
        if let Err(s) = r {
            let _ = gpu.pinned.free(off, owner);
            return Err(s);
        }
    }
    Ok(())
}

/// Gives back `owner`'s block at `off`, unregistered from the device first.
pub(super) fn free(gpu: &mut super::shared::Gpu, off: u64, owner: SessionId) -> Result<(), Status> {
    let len = gpu.pinned.block(off, owner)?;
    unregister(gpu, off, len);
    gpu.pinned.free(off, owner)
}

/// Gives back every block of `owner` (its session ended).
pub(super) fn release(gpu: &mut super::shared::Gpu, owner: SessionId) {
    for (off, len) in gpu.pinned.blocks_of(owner) {
        unregister(gpu, off, len);
        let _ = gpu.pinned.free(off, owner);
    }
}

fn unregister(gpu: &mut super::shared::Gpu, off: u64, len: u64) {
    if !gpu.pinned.per_block {
        return;
    }
    let r = part(gpu, off, len).and_then(|p| gpu.exec.unregister_pinned_block(&p.as_slice()));
    if let Err(s) = r {
        tracing::warn!("a pinned block not unregistered from the device: {s:?}");
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
    use crate::ledger::MIN_CHUNK;

    const CHUNK_PAGES: u64 = MIN_CHUNK / PAGE;

    #[test]
    fn blocks_are_first_fit_owned_and_checked() {
        let mut p = PinnedPool::new(16 * PAGE, Ledger::local(), 0);
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
        assert_eq!(p.blocks_of(3), vec![(0, PAGE), (4 * PAGE, 12 * PAGE)]);
        for (off, _) in p.blocks_of(3) {
            p.free(off, 3).unwrap();
        }
        assert_eq!(p.used(), 3 * PAGE);
        assert!(p.alloc(u64::MAX, 1).is_err());
        assert_eq!(p.alloc(0, 1), Err(Status::InvalidValue), "no empty block");
    }

    /// A checkpoint's blocks come back to their owner in a new pool, their
    /// chunks claimed; a block across another, off a page, empty, or past
    /// the pool is refused, and so is one whose chunk another slot holds.
    #[test]
    fn blocks_restored_from_a_checkpoint_are_their_owners_again() {
        let fd = Ledger::create("restore-test").unwrap();
        let mut p = PinnedPool::new(
            8 * CHUNK_PAGES * PAGE,
            Ledger::shared(fd.try_clone().unwrap()).unwrap(),
            0,
        );
        p.restore_block(PAGE, 2 * PAGE, 7).unwrap();
        assert!(p.check(7, PAGE, 2 * PAGE).is_ok());
        assert!(p.check(8, PAGE, 1).is_err());
        assert_eq!((p.used(), p.held()), (2 * PAGE, CHUNK_PAGES * PAGE));
        for (off, len) in [
            (2 * PAGE, PAGE),
            (0, 2 * PAGE),
            (PAGE + 1, PAGE),
            (0, 0),
            (0, PAGE + 1),
        ] {
            assert_eq!(
                p.restore_block(off, len, 7),
                Err(Status::InvalidValue),
                "{off} {len}"
            );
        }
        assert!(
            p.restore_block(8 * CHUNK_PAGES * PAGE - PAGE, 2 * PAGE, 7)
                .is_err(),
            "past the pool"
        );
        let mut other = PinnedPool::new(8 * CHUNK_PAGES * PAGE, Ledger::shared(fd).unwrap(), 1);
        other.alloc(PAGE, 9).unwrap();
        let theirs = CHUNK_PAGES * PAGE;
        assert_eq!(
            p.restore_block(theirs, PAGE, 7),
            Err(Status::OutOfMemory),
            "another slot's chunk"
        );
        p.free(PAGE, 7).unwrap();
        assert_eq!(p.held(), 0, "the chunk goes back with its last block");
    }

    /// Two workers of a VM (two pools over one ledger memfd, as two
    /// slots' workers) hand out disjoint pages however they allocate and
    /// free; either may take the whole pool while the other holds
    /// nothing, and a chunk goes back once it is empty.
    #[test]
    fn two_workers_share_the_pool_without_overlap() {
        let fd = Ledger::create("fvg-pinned-two").unwrap();
        let ledger = || Ledger::shared(fd.try_clone().unwrap()).unwrap();
        let size = 16 * MIN_CHUNK;
        let mut a = PinnedPool::new(size, ledger(), 0);
        let mut b = PinnedPool::new(size, ledger(), 1);
        assert_eq!(a.alloc(size, 1), Ok(0), "the whole pool, by one worker");
        assert_eq!(b.alloc(PAGE, 1), Err(Status::OutOfMemory));
        a.free(0, 1).unwrap();
        assert_eq!(a.held(), 0, "empty chunks go back");
        let mut held: Vec<(u64, u64, char)> = Vec::new();
        let mut seed = 7u64;
        for round in 0..400 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let (p, who) = if seed >> 63 == 0 {
                (&mut a, 'a')
            } else {
                (&mut b, 'b')
            };
            let len = ((seed >> 20) % (CHUNK_PAGES * 3) + 1) * PAGE;
            if let Ok(off) = p.alloc(len, 1) {
                held.push((off, len, who));
            }
            if round % 3 == 0 && !held.is_empty() {
                let (off, _, w) = held.swap_remove(crate::usize_from(seed % held.len() as u64));
                let p = if w == 'a' { &mut a } else { &mut b };
                p.free(off, 1).unwrap();
            }
            let mut sorted = held.clone();
            sorted.sort_unstable();
            for w in sorted.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:?}");
            }
            assert!(sorted.last().is_none_or(|l| l.0 + l.1 <= size));
        }
        assert!(a.held() + b.held() <= size);
    }

    /// A worker that died holding chunks (no `Drop`) leaks nothing: the
    /// next worker for its slot gives them back at once; a worker that
    /// ends gives its own back.
    #[test]
    fn a_dead_workers_chunks_are_reclaimed_by_its_slots_next_worker() {
        let fd = Ledger::create("fvg-pinned-dead").unwrap();
        let ledger = || Ledger::shared(fd.try_clone().unwrap()).unwrap();
        let size = 8 * MIN_CHUNK;
        let mut dead = PinnedPool::new(size, ledger(), 2);
        dead.alloc(6 * MIN_CHUNK, 1).unwrap();
        std::mem::forget(dead);
        let mut other = PinnedPool::new(size, ledger(), 0);
        assert_eq!(other.alloc(3 * MIN_CHUNK, 1), Err(Status::OutOfMemory));
        let next = PinnedPool::new(size, ledger(), 2);
        assert_eq!(
            other.alloc(8 * MIN_CHUNK, 1),
            Ok(0),
            "all of it is free again"
        );
        drop(next);
        drop(other);
        let mut last = PinnedPool::new(size, ledger(), 5);
        assert_eq!(
            last.alloc(size, 1),
            Ok(0),
            "an ended worker gave its chunks back"
        );
    }

    /// Words in the chunk table no worker writes (another process's
    /// mistake) are held by nobody we know: never handed out, never
    /// reclaimed, never read as an offset.
    #[test]
    fn hostile_words_in_the_chunk_table_are_never_handed_out() {
        let fd = Ledger::create("fvg-pinned-hostile").unwrap();
        let ledger = || Ledger::shared(fd.try_clone().unwrap()).unwrap();
        let evil = ledger();
        let size = 4 * MIN_CHUNK;
        for (k, v) in [(0, u64::MAX), (2, 17), (3, 1 << 32)] {
            evil.poke_chunk(k, v);
        }
        let mut p = PinnedPool::new(size, ledger(), 0);
        assert_eq!(p.alloc(PAGE, 1), Ok(MIN_CHUNK), "the one chunk left");
        assert_eq!(p.alloc(MIN_CHUNK, 1), Err(Status::OutOfMemory));
        drop(p);
        for k in [0, 2, 3] {
            assert!(matches!(evil.chunk(k), ChunkOwner::Invalid(_)), "{k}");
        }
        assert_eq!(evil.chunk(1), ChunkOwner::Free);
    }
}
