//! The device memory a vGPU served by several workers (a worker per guest
//! process) holds, counted against its limit across them, in a page only
//! the host's processes share (a memfd the daemon makes and passes to
//! each; the guest never sees it). A vGPU's one worker counts alone
//! (`serve/shared.rs`, `Memory`).
//!
//! Memory is reserved before it is allocated ([`Ledger::reserve`]: the
//! check against the limit and the count are one atomic step, so that two
//! workers allocating at once cannot both fit under it) and given back if
//! the allocation fails.
//!
//! After the first page, the ledger holds the VM's pinned pool's chunk
//! table: one word per chunk of the pool (see [`chunk_size`]), 0 when the
//! chunk is free, else 1 + the process slot whose worker holds it. A
//! worker claims a chunk with a compare-and-swap from 0 and gives it back
//! with one to 0, so no two workers ever hold one chunk; a new worker for a
//! slot frees what its dead predecessor held ([`Ledger::reclaim_chunks`]).
//! Another worker writes this page too: a word that is neither 0 nor a
//! slot's is taken by nobody we know, and never handed out.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use transport::shm::SharedMemory;

use crate::Error;

/// Bytes of a ledger: a first page, the count at offset 0, then from
/// [`SLOTS_AT`] each process slot's process (its pid and the bytes it
/// holds, 8 bytes each), which the slot's worker publishes for the VM's
/// monitors; then the pinned pool's chunk table ([`CHUNKS`] words).
pub const LEDGER_SIZE: usize = CHUNKS_AT + CHUNKS * 8;

/// Where the chunk table begins.
const CHUNKS_AT: usize = 4096;

/// Words of the chunk table: a pool is cut into this many chunks at most.
pub const CHUNKS: usize = 8192;

/// The smallest chunk of the pinned pool.
pub const MIN_CHUNK: u64 = 64 << 10;

/// Bytes of one chunk of a pinned pool of `pool` bytes: 64 KiB, or the
/// power of two that cuts the pool into [`CHUNKS`] chunks at most (every
/// worker of a VM computes the same from the region's layout).
pub fn chunk_size(pool: u64) -> u64 {
    pool.div_ceil(CHUNKS as u64)
        .checked_next_power_of_two()
        .unwrap_or(u64::MAX)
        .max(MIN_CHUNK)
}

/// Who holds a chunk of the pinned pool, as the chunk table says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkOwner {
    /// Nobody: any worker may claim it.
    Free,
    /// The worker of this process slot.
    Slot(u32),
    /// A word no worker writes (another process's mistake): held, by
    /// nobody we know; never handed out.
    Invalid(u64),
}

/// Where the slots' entries begin.
const SLOTS_AT: usize = 64;

/// The VM's log window: its start (seconds since the epoch) and the lines
/// its workers logged in it (see [`Ledger::log_line`]).
const LOG_WINDOW_AT: usize = 16;

/// Slots with an entry (as many as a region has process slots at most).
const SLOTS: u32 = transport::layout::MAX_PARTITIONS;

/// A vGPU's count of device memory held, shared by its workers.
#[derive(Debug)]
pub struct Ledger {
    page: SharedMemory,
}

impl Ledger {
    /// The ledger in the memfd `fd` ([`LEDGER_SIZE`] bytes, see
    /// [`Ledger::create`]).
    pub fn shared(fd: OwnedFd) -> Result<Ledger, Error> {
        let page = SharedMemory::map(fd, LEDGER_SIZE)?;
        page.atomic_u64(0)?;
        Ok(Ledger { page })
    }

    /// A new ledger's memfd, counting nothing (the daemon makes one per
    /// VM).
    pub fn create(name: &str) -> Result<OwnedFd, Error> {
        Ok(transport::shm::create_memfd(name, LEDGER_SIZE)?)
    }

    /// A ledger of this worker's alone (a vGPU's one worker: its pinned
    /// pool's chunk table), in its own memory.
    pub fn local() -> Ledger {
        Ledger {
            page: SharedMemory::heap(LEDGER_SIZE),
        }
    }

    /// Who holds chunk `k` of the pinned pool (a chunk past the table:
    /// nobody may take it).
    pub fn chunk(&self, k: usize) -> ChunkOwner {
        match self.chunk_word(k).map(|w| w.load(Ordering::Acquire)) {
            None => ChunkOwner::Invalid(0),
            Some(0) => ChunkOwner::Free,
            Some(v) => match u32::try_from(v - 1) {
                Ok(slot) if slot < SLOTS => ChunkOwner::Slot(slot),
                _ => ChunkOwner::Invalid(v),
            },
        }
    }

    /// Claims chunk `k` for process slot `slot`'s worker if it is free;
    /// whether it did.
    pub fn claim_chunk(&self, k: usize, slot: u32) -> bool {
        match self.chunk_word(k) {
            Some(w) if slot < SLOTS => w
                .compare_exchange(0, u64::from(slot) + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            _ => false,
        }
    }

    /// Gives back chunk `k` if slot `slot`'s worker holds it; whether it did.
    pub fn give_back_chunk(&self, k: usize, slot: u32) -> bool {
        match self.chunk_word(k) {
            Some(w) if slot < SLOTS => w
                .compare_exchange(u64::from(slot) + 1, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            _ => false,
        }
    }

    /// Gives back every chunk slot `slot`'s worker holds (a new worker for
    /// the slot: its predecessor ended, perhaps without giving them back);
    /// how many.
    pub fn reclaim_chunks(&self, slot: u32) -> usize {
        (0..CHUNKS)
            .filter(|&k| self.give_back_chunk(k, slot))
            .count()
    }

    /// Writes `v` into chunk `k`'s word, as a buggy or hostile worker
    /// could.
    #[cfg(test)]
    pub fn poke_chunk(&self, k: usize, v: u64) {
        if let Some(w) = self.chunk_word(k) {
            w.store(v, Ordering::Release);
        }
    }

    /// The word of chunk `k` (None past the table).
    fn chunk_word(&self, k: usize) -> Option<&AtomicU64> {
        if k >= CHUNKS {
            return None;
        }
        self.page.atomic_u64(CHUNKS_AT + k * 8).ok()
    }

    /// Bytes the vGPU holds (over all its workers).
    pub fn used(&self) -> u64 {
        self.count().load(Ordering::Acquire)
    }

    /// Counts `bytes` more held if that keeps the vGPU within `limit`;
    /// false (nothing counted) if not.
    pub fn reserve(&self, bytes: u64, limit: u64) -> bool {
        self.count()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(bytes).filter(|&t| t <= limit)
            })
            .is_ok()
    }

    /// Counts `bytes` fewer held (never below zero: another worker's
    /// mistake must not wrap the vGPU's count).
    pub fn release(&self, bytes: u64) {
        let _ = self
            .count()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(bytes))
            });
    }

    /// Publishes process slot `slot`'s process: its `pid` (0: none) and the
    /// device memory it holds.
    pub fn publish(&self, slot: u32, pid: u32, bytes: u64) {
        if slot >= SLOTS {
            return;
        }
        let at = SLOTS_AT + slot as usize * 16;
        if let (Ok(p), Ok(b)) = (self.page.atomic_u64(at), self.page.atomic_u64(at + 8)) {
            b.store(bytes, Ordering::Relaxed);
            p.store(u64::from(pid), Ordering::Release);
        }
    }

    /// Records that process slot `slot`'s worker holds `bytes` now (kept
    /// exact, so that the daemon can give back what a worker that died
    /// held: [`Ledger::forget`]).
    pub fn hold(&self, slot: u32, bytes: u64) {
        if slot < SLOTS {
            if let Ok(b) = self.page.atomic_u64(SLOTS_AT + slot as usize * 16 + 8) {
                b.store(bytes, Ordering::Release);
            }
        }
    }

    /// Process slot `slot`'s worker ended (the daemon, once it is gone):
    /// its process is no longer published, the pinned pool's chunks it
    /// still held go back, and what device memory it still held (a worker
    /// that crashed freed nothing) is given back to the count. Returns
    /// those bytes.
    pub fn forget(&self, slot: u32) -> u64 {
        if slot >= SLOTS {
            return 0;
        }
        self.reclaim_chunks(slot);
        let at = SLOTS_AT + slot as usize * 16;
        let (Ok(p), Ok(b)) = (self.page.atomic_u64(at), self.page.atomic_u64(at + 8)) else {
            return 0;
        };
        p.store(0, Ordering::Release);
        let held = b.swap(0, Ordering::AcqRel);
        self.release(held);
        held
    }

    /// Whether one more line of the VM's workers may go to the host's log:
    /// at most `burst` a `period_s` seconds for the whole VM, however many
    /// workers its processes have. Approximate at a window's turn (two
    /// words, each changed atomically).
    pub fn log_line(&self, burst: u64, period_s: u64) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (Ok(start), Ok(used)) = (
            self.page.atomic_u64(LOG_WINDOW_AT),
            self.page.atomic_u64(LOG_WINDOW_AT + 8),
        ) else {
            return true;
        };
        let s = start.load(Ordering::Acquire);
        // A start in the future is another process's mistake: a new window.
        if (now < s || now - s >= period_s)
            && start
                .compare_exchange(s, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            used.store(0, Ordering::Release);
        }
        used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < burst).then_some(n + 1)
        })
        .is_ok()
    }

    /// Every slot's process as published, `(pid, bytes)` in slot order.
    pub fn processes(&self) -> Vec<(u32, u64)> {
        let entry = |k: u32| {
            let at = SLOTS_AT + k as usize * 16;
            let pid = self.page.atomic_u64(at).ok()?.load(Ordering::Acquire);
            let bytes = self.page.atomic_u64(at + 8).ok()?.load(Ordering::Relaxed);
            // What another worker wrote: a pid past 32 bits is not one.
            u32::try_from(pid)
                .ok()
                .filter(|&p| p != 0)
                .map(|p| (p, bytes))
        };
        (0..SLOTS).filter_map(entry).collect()
    }

    /// The count (mapped and checked at [`Ledger::shared`]: offset 0 of a
    /// page is in bounds and aligned).
    fn count(&self) -> &AtomicU64 {
        static NONE: AtomicU64 = AtomicU64::new(0);
        self.page.atomic_u64(0).unwrap_or(&NONE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_fits_under_the_limit_or_counts_nothing() {
        let l = Ledger::shared(Ledger::create("fvg-ledger-fit").unwrap()).unwrap();
        assert!(l.reserve(60, 100));
        assert!(!l.reserve(41, 100));
        assert_eq!(l.used(), 60);
        assert!(l.reserve(40, 100));
        assert!(!l.reserve(u64::MAX, u64::MAX), "no overflow");
        l.release(200);
        assert_eq!(l.used(), 0, "never below zero");
    }

    /// Two workers' ledgers on one memfd count together: what one holds
    /// the other cannot take, and gets once it is given back; allocating
    /// at once from several threads never passes the limit.
    #[test]
    fn workers_sharing_a_ledger_count_together() {
        let fd = Ledger::create("fvg-ledger-test").unwrap();
        let a = Ledger::shared(fd.try_clone().unwrap()).unwrap();
        let b = Ledger::shared(fd.try_clone().unwrap()).unwrap();
        assert!(a.reserve(40 << 20, 64 << 20));
        assert!(!b.reserve(40 << 20, 64 << 20));
        assert!(b.reserve(20 << 20, 64 << 20));
        assert_eq!(a.used(), 60 << 20);
        a.release(40 << 20);
        assert!(b.reserve(40 << 20, 64 << 20));
        b.release(60 << 20);
        assert_eq!(a.used(), 0);
        let taken: u64 = (0..4)
            .map(|_| {
                let fd = fd.try_clone().unwrap();
                std::thread::spawn(move || {
                    let l = Ledger::shared(fd).unwrap();
                    (0..1000).filter(|_| l.reserve(3, 1000)).count() as u64 * 3
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(taken, 999, "exactly what fits, however the threads raced");
        assert_eq!(a.used(), 999);
    }

    /// Each slot's worker publishes its process; any of them reads all.
    #[test]
    fn slots_publish_their_processes_to_each_other() {
        let fd = Ledger::create("fvg-ledger-slots").unwrap();
        let a = Ledger::shared(fd.try_clone().unwrap()).unwrap();
        let b = Ledger::shared(fd).unwrap();
        a.publish(0, 41, 1 << 20);
        b.publish(3, 42, 2 << 20);
        b.publish(99, 43, 0);
        assert_eq!(a.processes(), vec![(41, 1 << 20), (42, 2 << 20)]);
        a.publish(0, 0, 0);
        assert_eq!(b.processes(), vec![(42, 2 << 20)]);
    }

    /// Two workers claiming chunks at once never both get one; a chunk
    /// goes back to its holder's slot alone; a new worker for a slot frees
    /// what the slot held, and nothing of another slot's.
    #[test]
    fn chunks_are_claimed_by_one_worker_and_reclaimed_by_slot() {
        let fd = Ledger::create("fvg-ledger-chunks").unwrap();
        let a = Ledger::shared(fd.try_clone().unwrap()).unwrap();
        let b = Ledger::shared(fd.try_clone().unwrap()).unwrap();
        assert!(a.claim_chunk(0, 0));
        assert!(!b.claim_chunk(0, 1), "held");
        assert_eq!(b.chunk(0), ChunkOwner::Slot(0));
        assert!(!b.give_back_chunk(0, 1), "not its own");
        assert!(!a.claim_chunk(CHUNKS, 0), "past the table");
        assert!(!a.claim_chunk(1, SLOTS), "no such slot");
        assert_eq!(a.chunk(CHUNKS), ChunkOwner::Invalid(0));
        assert!(b.claim_chunk(1, 1) && b.claim_chunk(2, 1));
        assert_eq!(a.reclaim_chunks(1), 2);
        assert_eq!(
            (a.chunk(0), a.chunk(1)),
            (ChunkOwner::Slot(0), ChunkOwner::Free)
        );
        let won: usize = (0..4u32)
            .map(|slot| {
                let fd = fd.try_clone().unwrap();
                std::thread::spawn(move || {
                    let l = Ledger::shared(fd).unwrap();
                    (0..CHUNKS).filter(|&k| l.claim_chunk(k, slot)).count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(won, CHUNKS - 1, "each free chunk claimed once");
    }

    /// What another process wrote into the chunk table is read as held by
    /// nobody unless it is 0 or a slot's word; such a chunk is neither
    /// claimed nor reclaimed.
    #[test]
    fn hostile_chunk_words_are_refused() {
        let l = Ledger::local();
        for (k, v) in [(0, u64::MAX), (1, u64::from(SLOTS) + 1), (2, 1 << 40)] {
            l.poke_chunk(k, v);
            assert_eq!(l.chunk(k), ChunkOwner::Invalid(v));
            assert!(!l.claim_chunk(k, 0));
        }
        l.poke_chunk(3, u64::from(SLOTS));
        assert_eq!(l.chunk(3), ChunkOwner::Slot(SLOTS - 1));
        for slot in 0..SLOTS {
            l.reclaim_chunks(slot);
        }
        assert_eq!(l.chunk(0), ChunkOwner::Invalid(u64::MAX));
        assert_eq!(l.chunk(3), ChunkOwner::Free);
    }

    #[test]
    fn chunks_cut_any_pool_into_the_table() {
        assert_eq!(chunk_size(0), MIN_CHUNK);
        assert_eq!(chunk_size(256 << 20), MIN_CHUNK);
        assert_eq!(chunk_size(1 << 30), 128 << 10);
        assert_eq!(chunk_size(64 << 30), 8 << 20);
        assert!((64u64 << 30).div_ceil(chunk_size(64 << 30)) <= CHUNKS as u64);
    }

    /// The VM's workers share one window of log lines.
    #[test]
    fn a_vms_workers_share_one_log_window() {
        let fd = Ledger::create("fvg-ledger-log").unwrap();
        let a = Ledger::shared(fd.try_clone().unwrap()).unwrap();
        let b = Ledger::shared(fd).unwrap();
        assert!(a.log_line(3, 60) && b.log_line(3, 60) && a.log_line(3, 60));
        assert!(
            !b.log_line(3, 60) && !a.log_line(3, 60),
            "the VM's three are spent"
        );
        // A window that started long ago, or in the future, starts anew.
        for start in [1, u64::MAX] {
            a.page
                .atomic_u64(LOG_WINDOW_AT)
                .unwrap()
                .store(start, Ordering::Release);
            assert!(b.log_line(3, 60));
        }
    }

    /// A slot's worker that died holding memory: the daemon gives it back.
    #[test]
    fn what_a_dead_slot_held_is_given_back() {
        let l = Ledger::shared(Ledger::create("fvg-ledger-forget").unwrap()).unwrap();
        assert!(l.reserve(30, 100));
        l.hold(1, 30);
        l.publish(1, 77, 30);
        assert!(l.reserve(10, 100));
        l.hold(2, 10);
        assert!(l.claim_chunk(5, 1) && l.claim_chunk(6, 2));
        assert_eq!(l.forget(1), 30);
        assert_eq!(l.used(), 10, "slot 2's own stays counted");
        assert_eq!(
            (l.chunk(5), l.chunk(6)),
            (ChunkOwner::Free, ChunkOwner::Slot(2))
        );
        assert!(l.processes().is_empty(), "{:?}", l.processes());
        assert_eq!(l.forget(1), 0, "once");
        assert_eq!(l.forget(99), 0);
    }
}
