//! A session's virtual memory management state (cuMemAddressReserve,
//! cuMemCreate, cuMemMap): what the guest reserved, the physical memory it
//! holds by handle, and what is mapped where. Every guest request is checked
//! here before the executor sees it: a process maps only its own handles
//! into its own reservations, mappings never overlap, and it unmaps only
//! whole mappings of its own. Physical memory is counted against the
//! vGPU's limit (by the worker) from its creation until it is both
//! released and unmapped.

use std::collections::BTreeMap;

use protocol::Status;

use crate::executor::{Handle, HandleMap};

/// Physical memory made by `VmmCreate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Phys {
    size: u64,
    /// Device memory it takes, counted against the limit.
    charge: u64,
    /// Handles the guest holds (created or retained, not yet released).
    refs: u32,
    /// Mappings of it.
    maps: u32,
}

/// A mapping of (part of) a handle's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mapping {
    size: u64,
    handle: Handle,
}

/// Physical memory whose last handle and last mapping are gone: the
/// executor frees it and the worker uncounts `charge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dead {
    /// Its handle.
    pub handle: Handle,
    /// What it took from the limit.
    pub charge: u64,
}

/// The table.
#[derive(Debug, Default)]
pub struct Vmm {
    /// base -> size of each reservation.
    reserved: BTreeMap<u64, u64>,
    phys: HandleMap<Phys>,
    /// base -> mapping.
    maps: BTreeMap<u64, Mapping>,
}

impl Vmm {
    /// Whether the session holds nothing (no reservation, no memory).
    pub fn is_empty(&self) -> bool {
        self.reserved.is_empty() && self.phys.is_empty()
    }

    /// Records a reservation the executor made.
    pub fn reserved(&mut self, base: u64, size: u64) {
        self.reserved.insert(base, size);
    }

    /// Takes out a whole reservation with nothing mapped in it.
    pub fn address_free(&mut self, base: u64, size: u64) -> Result<(), Status> {
        if self.reserved.get(&base) != Some(&size) {
            return Err(Status::InvalidValue);
        }
        if self.maps.range(base..base + size).next().is_some() {
            return Err(Status::InvalidValue);
        }
        self.reserved.remove(&base);
        Ok(())
    }

    /// Records physical memory the executor made (one handle held).
    pub fn created(&mut self, handle: Handle, size: u64, charge: u64) {
        self.phys.insert(
            handle,
            Phys {
                size,
                charge,
                refs: 1,
                maps: 0,
            },
        );
    }

    /// The size of the memory of `handle`, if the guest holds it.
    pub fn held(&self, handle: Handle) -> Option<u64> {
        self.phys
            .get(&handle)
            .filter(|p| p.refs > 0)
            .map(|p| p.size)
    }

    /// Holds `handle` once more (imported again, as the driver gives a
    /// handle of memory the process still maps even after releasing its
    /// last one); whether the memory is still the guest's.
    pub fn hold(&mut self, handle: Handle) -> bool {
        match self.phys.get_mut(&handle) {
            Some(p) => p.refs.checked_add(1).map(|r| p.refs = r).is_some(),
            None => false,
        }
    }

    /// Lets go of one handle of the guest's; the memory, if that was all
    /// that held it.
    pub fn release(&mut self, handle: Handle) -> Result<Option<Dead>, Status> {
        let p = self
            .phys
            .get_mut(&handle)
            .filter(|p| p.refs > 0)
            .ok_or(Status::InvalidValue)?;
        p.refs -= 1;
        Ok(self.reap(handle))
    }

    /// Forgets `handle` if nothing holds it any more.
    fn reap(&mut self, handle: Handle) -> Option<Dead> {
        let p = *self.phys.get(&handle)?;
        if p.refs > 0 || p.maps > 0 {
            return None;
        }
        self.phys.remove(&handle);
        Some(Dead {
            handle,
            charge: p.charge,
        })
    }

    /// Checks a map request: a handle the guest holds, the part of its
    /// memory inside it, at addresses inside one reservation of the
    /// guest's where nothing is mapped.
    pub fn check_map(
        &self,
        ptr: u64,
        size: u64,
        offset: u64,
        handle: Handle,
    ) -> Result<(), Status> {
        let p = self
            .phys
            .get(&handle)
            .filter(|p| p.refs > 0)
            .ok_or(Status::InvalidHandle)?;
        if offset.checked_add(size).is_none_or(|e| e > p.size) {
            return Err(Status::InvalidValue);
        }
        let end = ptr.checked_add(size).ok_or(Status::InvalidValue)?;
        let in_reservation = self
            .reserved
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &s)| end <= b + s);
        if !in_reservation {
            return Err(Status::InvalidValue);
        }
        // Overlap: a mapping starting inside, or the one before reaching in.
        let overlaps = self.maps.range(ptr..end).next().is_some()
            || self
                .maps
                .range(..ptr)
                .next_back()
                .is_some_and(|(&b, m)| b + m.size > ptr);
        if overlaps {
            return Err(Status::InvalidValue);
        }
        Ok(())
    }

    /// Records a mapping (after [`Vmm::check_map`] and the executor).
    pub fn mapped(&mut self, ptr: u64, size: u64, handle: Handle) {
        if let Some(p) = self.phys.get_mut(&handle) {
            p.maps += 1;
        }
        self.maps.insert(ptr, Mapping { size, handle });
    }

    /// The mappings (start, size) that make up `[ptr, ptr + size)`
    /// exactly, one after another; an error if it is not such a range.
    pub fn covering(&self, ptr: u64, size: u64) -> Result<Vec<(u64, u64)>, Status> {
        let end = ptr.checked_add(size).ok_or(Status::InvalidValue)?;
        let mut out = Vec::new();
        let mut at = ptr;
        for (&b, m) in self.maps.range(ptr..end) {
            if b != at {
                return Err(Status::InvalidValue);
            }
            out.push((b, m.size));
            at = b + m.size;
        }
        if at != end || out.is_empty() {
            return Err(Status::InvalidValue);
        }
        Ok(out)
    }

    /// Removes the mapping at `ptr` (the executor unmapped it); the
    /// memory, if nothing holds it any more.
    pub fn unmapped(&mut self, ptr: u64) -> Option<Dead> {
        let m = self.maps.remove(&ptr)?;
        let p = self.phys.get_mut(&m.handle)?;
        p.maps -= 1;
        self.reap(m.handle)
    }

    /// Whether `[ptr, ptr + len)` is mapped throughout (by mappings that
    /// follow one another).
    pub fn covers(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        let Some((&b, m)) = self.maps.range(..=ptr).next_back() else {
            return false;
        };
        let mut reach = b + m.size;
        if reach <= ptr {
            return false;
        }
        while reach < end {
            match self.maps.get(&reach) {
                Some(m) => reach += m.size,
                None => return false,
            }
        }
        true
    }

    /// The mapping holding `ptr`: its start and size.
    pub fn mapping_of(&self, ptr: u64) -> Option<(u64, u64)> {
        let (&b, m) = self.maps.range(..=ptr).next_back()?;
        (ptr < b + m.size).then_some((b, m.size))
    }

    /// The handle mapped at `ptr`, held once more by the guest: (handle,
    /// its size).
    pub fn retain(&mut self, ptr: u64) -> Result<(Handle, u64), Status> {
        let (&b, m) = self
            .maps
            .range(..=ptr)
            .next_back()
            .ok_or(Status::InvalidValue)?;
        if ptr >= b + m.size {
            return Err(Status::InvalidValue);
        }
        let p = self.phys.get_mut(&m.handle).ok_or(Status::InvalidValue)?;
        p.refs = p.refs.checked_add(1).ok_or(Status::InvalidValue)?;
        Ok((m.handle, p.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    #[test]
    fn maps_only_own_handles_into_own_reservations_without_overlap() {
        let mut v = Vmm::default();
        v.reserved(10 * G, 4 * G);
        v.created(7, 2 * G, 2 * G);
        assert_eq!(v.check_map(10 * G, 2 * G, 0, 8), Err(Status::InvalidHandle));
        assert!(v.check_map(20 * G, 2 * G, 0, 7).is_err(), "not reserved");
        assert!(v.check_map(13 * G, 2 * G, 0, 7).is_err(), "past the end");
        assert!(v.check_map(10 * G, 2 * G, G, 7).is_err(), "past the handle");
        assert!(v.check_map(10 * G, 2 * G, 0, 7).is_ok());
        v.mapped(10 * G, 2 * G, 7);
        assert!(v.check_map(11 * G, G, 0, 7).is_err(), "overlap");
        assert!(v.check_map(9 * G, 2 * G, 0, 7).is_err(), "overlap before");
        assert!(
            v.check_map(12 * G, G, G, 7).is_ok(),
            "the same memory twice"
        );
        assert!(v.covers(10 * G + 5, 100));
        assert!(!v.covers(12 * G, 1), "reserved, not mapped");
        v.mapped(12 * G, G, 7);
        assert!(v.covers(11 * G, 2 * G), "across two mappings");
        assert!(!v.covers(11 * G, 3 * G));
        assert!(v.address_free(10 * G, 4 * G).is_err(), "still mapped");
    }

    /// Random calls, forged or not: mappings stay apart and inside
    /// reservations, and every byte counted is uncounted exactly once.
    #[test]
    fn random_calls_keep_the_table_consistent() {
        let mut v = Vmm::default();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut counted, mut next) = (0u64, 1u64);
        for _ in 0..20_000 {
            let (a, s) = (rnd(64) * G, (1 + rnd(4)) * G);
            let h = rnd(next + 2);
            match rnd(7) {
                0 => v.reserved(a & !(16 * G - 1), 16 * G),
                1 => {
                    v.created(next, s, s);
                    counted += s;
                    next += 1;
                }
                2 => {
                    if let Ok(Some(d)) = v.release(h) {
                        counted -= d.charge;
                    }
                }
                3 => {
                    if v.check_map(a, s, rnd(2) * G, h).is_ok() {
                        v.mapped(a, s, h);
                    }
                }
                4 => {
                    for (p, _) in v.covering(a, s).unwrap_or_default() {
                        if let Some(d) = v.unmapped(p) {
                            counted -= d.charge;
                        }
                    }
                }
                5 => {
                    let _ = v.retain(a);
                }
                _ => {
                    let _ = v.address_free(a, 16 * G);
                }
            }
            let mut end = 0;
            for (&b, m) in &v.maps {
                assert!(b >= end, "overlap at {b:#x}");
                end = b + m.size;
                assert!(v.phys.contains_key(&m.handle));
            }
            let live: u64 = v.phys.values().map(|p| p.charge).sum();
            assert_eq!(live, counted);
        }
    }

    #[test]
    fn memory_lives_until_released_and_unmapped() {
        let mut v = Vmm::default();
        v.reserved(10 * G, 4 * G);
        v.created(7, 2 * G, 2 * G);
        v.mapped(10 * G, 2 * G, 7);
        assert_eq!(v.release(7), Ok(None), "still mapped");
        assert_eq!(v.release(7), Err(Status::InvalidValue), "double release");
        assert!(v.check_map(12 * G, 2 * G, 0, 7).is_err(), "released");
        assert_eq!(v.retain(11 * G), Ok((7, 2 * G)));
        assert_eq!(v.release(7), Ok(None));
        assert!(v.covering(10 * G, G).is_err(), "part of a mapping");
        assert!(v.covering(12 * G, 2 * G).is_err(), "nothing mapped");
        assert_eq!(v.covering(10 * G, 2 * G), Ok(vec![(10 * G, 2 * G)]));
        assert_eq!(
            v.unmapped(10 * G),
            Some(Dead {
                handle: 7,
                charge: 2 * G
            })
        );
        assert!(v.retain(10 * G).is_err(), "unmapped");
        assert!(v.address_free(10 * G, 2 * G).is_err(), "not its size");
        assert!(v.address_free(10 * G, 4 * G).is_ok());
        assert!(v.is_empty());
    }
}
