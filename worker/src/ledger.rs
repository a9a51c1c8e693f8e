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

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use transport::shm::SharedMemory;

use crate::Error;

/// Bytes of a ledger: one page, the count at offset 0, then from
/// [`SLOTS_AT`] each process slot's process (its pid and the bytes it
/// holds, 8 bytes each), which the slot's worker publishes for the VM's
/// monitors.
pub const LEDGER_SIZE: usize = 4096;

/// Where the slots' entries begin.
const SLOTS_AT: usize = 64;

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
    /// its process is no longer published and what it still held (a
    /// worker that crashed freed nothing) is given back to the count.
    /// Returns those bytes.
    pub fn forget(&self, slot: u32) -> u64 {
        if slot >= SLOTS {
            return 0;
        }
        let at = SLOTS_AT + slot as usize * 16;
        let (Ok(p), Ok(b)) = (self.page.atomic_u64(at), self.page.atomic_u64(at + 8)) else {
            return 0;
        };
        p.store(0, Ordering::Release);
        let held = b.swap(0, Ordering::AcqRel);
        self.release(held);
        held
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

    /// A slot's worker that died holding memory: the daemon gives it back.
    #[test]
    fn what_a_dead_slot_held_is_given_back() {
        let l = Ledger::shared(Ledger::create("fvg-ledger-forget").unwrap()).unwrap();
        assert!(l.reserve(30, 100));
        l.hold(1, 30);
        l.publish(1, 77, 30);
        assert!(l.reserve(10, 100));
        l.hold(2, 10);
        assert_eq!(l.forget(1), 30);
        assert_eq!(l.used(), 10, "slot 2's own stays counted");
        assert!(l.processes().is_empty(), "{:?}", l.processes());
        assert_eq!(l.forget(1), 0, "once");
        assert_eq!(l.forget(99), 0);
    }
}
