//! The device addresses of guest allocations: one window of address space
//! the worker process reserves once, at the same address in every worker
//! ([`WINDOW_ADDR`]), from which each allocation takes a range.
//!
//! A worker that serves on from a checkpoint (`checkpoint.rs`) must map
//! each allocation at the address the guest holds. Left to the driver,
//! those addresses are wherever it put them in the first process, and in
//! the second process its own allocations (a context's, a module's) may
//! already be there. Inside the window, which the driver's own allocations
//! never take, every one of them is free in a new worker.

use std::collections::BTreeMap;
use std::sync::Mutex;

use cudarc::driver::sys;

/// Where the window is asked for: far from where the driver and the host's
/// mappings usually lie (the pinned pool is at `0x3f00_0000_0000`).
pub(super) const WINDOW_ADDR: u64 = 0x6000_0000_0000;
/// Its size: more than any GPU's memory, with room for fragmentation.
pub(super) const WINDOW_LEN: u64 = 1 << 40;
/// Alignment of every range (a GPU's allocation granularity, 2 MiB, divides it).
const ALIGN: u64 = 2 << 20;

/// Free ranges of a window: start -> length, merged where they touch.
#[derive(Debug)]
pub(super) struct Ranges {
    base: u64,
    len: u64,
    free: BTreeMap<u64, u64>,
}

impl Ranges {
    pub(super) fn new(base: u64, len: u64) -> Ranges {
        Ranges {
            base,
            len,
            free: BTreeMap::from([(base, len)]),
        }
    }

    /// The lowest free range of `len` bytes (rounded up to [`ALIGN`]).
    pub(super) fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.checked_next_multiple_of(ALIGN)?;
        let (&start, &n) = self.free.iter().find(|(_, &n)| n >= len)?;
        self.free.remove(&start);
        if n > len {
            self.free.insert(start + len, n - len);
        }
        Some(start)
    }

    /// Takes `[addr, addr + len)` (rounded up to [`ALIGN`]) if all of it is
    /// free.
    pub(super) fn take(&mut self, addr: u64, len: u64) -> bool {
        let Some(len) = len.checked_next_multiple_of(ALIGN) else {
            return false;
        };
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        let Some((&start, &n)) = self.free.range(..=addr).next_back() else {
            return false;
        };
        if !addr.is_multiple_of(ALIGN) || start + n < end {
            return false;
        }
        self.free.remove(&start);
        if addr > start {
            self.free.insert(start, addr - start);
        }
        if start + n > end {
            self.free.insert(end, start + n - end);
        }
        true
    }

    /// Gives `[addr, addr + len)` back; false if it is not the window's.
    pub(super) fn give(&mut self, addr: u64, len: u64) -> bool {
        let Some(len) = len.checked_next_multiple_of(ALIGN) else {
            return false;
        };
        if addr < self.base || addr.saturating_add(len) > self.base + self.len {
            return false;
        }
        let (mut start, mut n) = (addr, len);
        if let Some((&s, &m)) = self.free.range(..addr).next_back() {
            if s + m == addr {
                self.free.remove(&s);
                (start, n) = (s, m + n);
            }
        }
        if let Some(m) = self.free.remove(&(addr + len)) {
            n += m;
        }
        self.free.insert(start, n);
        true
    }
}

/// The process's window, reserved at its first use; `None` inside where the
/// driver refused it.
static WINDOW: Mutex<Option<Option<Ranges>>> = Mutex::new(None);

/// Runs `f` on the process's window, reserving it first if need be; `None`
/// where there is none.
fn with<R>(f: impl FnOnce(&mut Ranges) -> R) -> Option<R> {
    let mut w = WINDOW.lock().unwrap_or_else(|e| e.into_inner());
    let w = w.get_or_insert_with(|| {
        let mut va = 0u64;
        // SAFETY: out-parameter on our stack; the address is asked for.
        let r = unsafe {
            sys::cuMemAddressReserve(&mut va, crate::usize_from(WINDOW_LEN), 0, WINDOW_ADDR, 0)
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!("no window of device addresses ({r:?}): a checkpoint may not restore");
            return None;
        }
        if va != WINDOW_ADDR {
            tracing::warn!(
                "the window of device addresses is at {va:#x}, not {WINDOW_ADDR:#x}: \
                 a checkpoint of another worker may not restore here"
            );
        }
        Some(Ranges::new(va, WINDOW_LEN))
    });
    w.as_mut().map(f)
}

/// A range of `len` bytes of the window for a new allocation.
pub(super) fn alloc(len: u64) -> Option<u64> {
    with(|w| w.alloc(len)).flatten()
}

/// Range `[addr, addr + len)` of the window, for an allocation restored
/// at the address its guest holds; false if it is taken or outside.
pub(super) fn take(addr: u64, len: u64) -> bool {
    with(|w| w.take(addr, len)).unwrap_or(false)
}

/// Gives a range back; false if it is not the window's (its reservation is
/// its own then). A process with no window yet is not made to reserve one
/// here: none of its ranges can be the window's.
pub(super) fn give(addr: u64, len: u64) -> bool {
    let mut w = WINDOW.lock().unwrap_or_else(|e| e.into_inner());
    match w.as_mut() {
        Some(Some(r)) => r.give(addr, len),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = WINDOW_ADDR;
    const M: u64 = ALIGN;

    #[test]
    fn ranges_are_handed_out_lowest_first_and_merged_when_given_back() {
        let mut r = Ranges::new(B, 16 * M);
        let a = r.alloc(1).unwrap();
        let b = r.alloc(3 * M).unwrap();
        let c = r.alloc(M).unwrap();
        assert_eq!((a, b, c), (B, B + M, B + 4 * M));
        assert!(r.give(b, 3 * M));
        assert_eq!(r.alloc(2 * M), Some(B + M), "the first that fits");
        assert!(r.give(B + M, 2 * M));
        assert!(r.give(a, M));
        assert!(r.give(c, M));
        assert_eq!(r.free.len(), 1, "all merged again");
        assert_eq!(r.alloc(16 * M), Some(B));
        assert_eq!(r.alloc(M), None, "full");
    }

    #[test]
    fn a_range_is_taken_only_where_all_of_it_is_free() {
        let mut r = Ranges::new(B, 16 * M);
        assert!(r.take(B + 4 * M, 2 * M));
        assert!(!r.take(B + 5 * M, 2 * M), "overlaps a taken one");
        assert!(!r.take(B + 6 * M + 4096, M), "misaligned");
        assert!(!r.take(B + 15 * M, 2 * M), "past the end");
        assert!(!r.take(B - M, M), "below the window");
        assert!(r.take(B, M));
        assert_eq!(r.alloc(M), Some(B + M), "around what was taken");
        assert!(!r.give(B + 16 * M, M), "not the window's");
    }
}
