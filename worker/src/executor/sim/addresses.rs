//! The device addresses the model hands out, shared by every context of one
//! worker (one address space, as a GPU with unified addressing has): never
//! the same address twice, so a use after free faults, and a gap after each
//! range, so an overrun faults too.
//!
//! Fresh ranges go upwards from [`BASE`]. An address asked for (a VMM
//! reservation's hint) is taken where nothing was ever handed out;
//! otherwise a fresh range is handed out instead, as the driver treats its
//! hint. What was handed out is kept as merged intervals: fresh ranges
//! follow each other, so they stay one interval.

use std::collections::BTreeMap;

use protocol::Status;

/// Where the model's fresh ranges start.
pub(super) const BASE: u64 = 0x7f00_0000_0000;

/// The gap after every range, and the alignment of fresh ranges.
const GAP: u64 = 2 << 20;

#[derive(Debug)]
pub(super) struct Addresses {
    /// The next fresh range's start: above everything handed out.
    next: u64,
    /// Everything ever handed out, gaps included: start -> end, merged
    /// where one ends as the next starts.
    taken: BTreeMap<u64, u64>,
}

impl Default for Addresses {
    fn default() -> Self {
        Addresses {
            next: BASE,
            taken: BTreeMap::new(),
        }
    }
}

impl Addresses {
    /// A fresh range of `len` bytes aligned to `align` (a power of two, at
    /// least [`GAP`] is used).
    pub fn fresh(&mut self, len: u64, align: u64) -> Result<u64, Status> {
        let base = self
            .next
            .checked_next_multiple_of(align.max(GAP))
            .ok_or(Status::OutOfMemory)?;
        self.take(base, end(base, len)?);
        Ok(base)
    }

    /// `len` bytes at `addr` if it is aligned to `align` and nothing there
    /// was ever handed out; else a fresh range.
    pub fn at(&mut self, addr: u64, len: u64, align: u64) -> Result<u64, Status> {
        let align = align.max(GAP);
        if addr == 0 || !addr.is_multiple_of(align) {
            return self.fresh(len, align);
        }
        let stop = end(addr, len)?;
        let clear = self
            .taken
            .range(..stop)
            .next_back()
            .is_none_or(|(_, &e)| e <= addr);
        if !clear {
            return self.fresh(len, align);
        }
        self.take(addr, stop);
        Ok(addr)
    }

    /// Records `[start, stop)` as handed out (nothing of it was).
    fn take(&mut self, mut start: u64, mut stop: u64) {
        if let Some((&s, &e)) = self.taken.range(..start).next_back() {
            if e == start {
                self.taken.remove(&s);
                start = s;
            }
        }
        if let Some(e) = self.taken.remove(&stop) {
            stop = e;
        }
        self.taken.insert(start, stop);
        self.next = self.next.max(stop);
    }
}

/// The end of a range of `len` bytes at `base`, rounded up to whole gaps,
/// with the gap after it.
fn end(base: u64, len: u64) -> Result<u64, Status> {
    len.div_ceil(GAP)
        .checked_mul(GAP)
        .and_then(|n| n.checked_add(GAP))
        .and_then(|n| base.checked_add(n))
        .ok_or(Status::OutOfMemory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_ranges_never_repeat_and_keep_a_gap() {
        let mut a = Addresses::default();
        let x = a.fresh(10, 0).unwrap();
        let y = a.fresh(GAP + 1, 0).unwrap();
        assert_eq!(x, BASE);
        assert_eq!(y, BASE + 2 * GAP, "one gap after the first");
        assert_eq!(
            a.fresh(1, 0).unwrap(),
            y + 3 * GAP,
            "two gaps long, one after"
        );
        assert_eq!(a.taken.len(), 1, "one interval");
    }

    #[test]
    fn an_address_asked_for_is_taken_only_where_nothing_was() {
        let mut a = Addresses::default();
        let x = a.fresh(GAP, 0).unwrap();
        // Above everything handed out: taken, and fresh ones go on after it.
        let far = BASE + (64 << 30);
        assert_eq!(a.at(far, GAP, 0).unwrap(), far);
        assert_eq!(a.fresh(1, 0).unwrap(), far + 2 * GAP);
        // Where ranges were handed out: not taken.
        assert_ne!(a.at(x, GAP, 0).unwrap(), x);
        assert_ne!(a.at(far + GAP, GAP, 0).unwrap(), far + GAP);
        // Between them, and below them, once; not where its end overlaps.
        let mid = far - (1 << 30);
        assert_eq!(a.at(mid, GAP, 0).unwrap(), mid);
        assert_ne!(a.at(mid, GAP, 0).unwrap(), mid);
        assert_ne!(
            a.at(mid - GAP, GAP, 0).unwrap(),
            mid - GAP,
            "its end overlaps"
        );
        assert_eq!(a.at(mid - 2 * GAP, GAP, 0).unwrap(), mid - 2 * GAP);
        let low = BASE - (1 << 30);
        assert_eq!(a.at(low, GAP, 0).unwrap(), low);
        // Misaligned: not taken.
        assert_ne!(
            a.at(low + (8 << 20) + 4096, GAP, 0).unwrap(),
            low + (8 << 20) + 4096
        );
    }
}
