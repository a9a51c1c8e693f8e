//! Keeps device addresses out of the process's own address space: every
//! device range the process holds is reserved here (mapped inaccessible,
//! never backed), so that no allocation of the program's can land on it,
//! and a pointer value is either device memory or host memory, never both.
//! Copies of inferred direction and pointer queries can then tell them
//! apart exactly, as on a GPU with unified addressing.

use crate::{code, CuResult};

/// Reserves `[addr, addr + len)`; false if part of it is already mapped in
/// this process (the device address is also a host address here).
pub(crate) fn reserve(addr: u64, len: u64) -> bool {
    let Ok(len) = usize::try_from(len.next_multiple_of(4096)) else {
        return false;
    };
    if !addr.is_multiple_of(4096) || len == 0 {
        // Not page-aligned (module globals): the pages around it are
        // reserved with the ranges holding them, or shared with others.
        return true;
    }
    // SAFETY: asks for a new private, inaccessible mapping at a fixed
    // address only if nothing is mapped there (MAP_FIXED_NOREPLACE); it
    // touches no existing memory.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    if p as u64 != addr {
        // An old kernel placed it elsewhere: not what we asked for.
        // SAFETY: the mapping just made, which nothing else knows of.
        unsafe { libc::munmap(p, len) };
        return false;
    }
    true
}

/// Tries of [`place`] before giving up.
const PLACE_TRIES: usize = 4;

/// Something made on the host at device addresses, reserved here: `make(i)`
/// makes it (try `i`) and answers its address. One that lands on addresses
/// the process uses itself is kept aside while another is made; those kept
/// aside are then undone (`undo`), whatever happened.
pub(crate) fn place(
    len: u64,
    make: impl FnMut(usize) -> Result<u64, CuResult>,
    undo: impl FnMut(u64),
) -> Result<u64, CuResult> {
    place_or(len, make, undo)?.ok_or_else(|| {
        crate::log_once("device addresses keep landing on the process's own memory");
        code::OUT_OF_MEMORY
    })
}

/// [`place`], answering `None` where every try landed on addresses the
/// process uses (the caller may then make the thing some other way).
pub(crate) fn place_or(
    len: u64,
    mut make: impl FnMut(usize) -> Result<u64, CuResult>,
    mut undo: impl FnMut(u64),
) -> Result<Option<u64>, CuResult> {
    let mut taken = Vec::new();
    let mut got = None;
    for i in 0..PLACE_TRIES {
        match make(i) {
            Ok(a) if reserve(a, len) => {
                got = Some(Ok(a));
                break;
            }
            Ok(a) => taken.push(a),
            Err(e) => {
                got = Some(Err(e));
                break;
            }
        }
    }
    for a in taken {
        undo(a);
    }
    got.transpose()
}

/// An address where `len` bytes aligned to `align` (a power of two) are
/// free in this process now, or 0 if none is found: the kernel picks a
/// free range, which is given back at once, so it is only a good guess.
pub(crate) fn free_range(len: u64, align: u64) -> u64 {
    let Some(span) = len.checked_add(align).and_then(|n| usize::try_from(n).ok()) else {
        return 0;
    };
    // SAFETY: a new private, inaccessible mapping wherever the kernel
    // likes; it touches no existing memory and is unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return 0;
    }
    // SAFETY: the mapping just made, which nothing else knows of.
    unsafe { libc::munmap(p, span) };
    (p as u64).next_multiple_of(align)
}

/// Gives back a reservation made by [`reserve`].
pub(crate) fn release(addr: u64, len: u64) {
    let Ok(len) = usize::try_from(len.next_multiple_of(4096)) else {
        return;
    };
    if !addr.is_multiple_of(4096) || len == 0 {
        return;
    }
    // SAFETY: the inaccessible mapping `reserve` made for this range; no
    // program memory is there.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_range_cannot_be_reserved_twice() {
        let addr = 0x3e00_0000_0000u64;
        assert!(reserve(addr, 8192));
        assert!(!reserve(addr + 4096, 4096), "it is taken");
        release(addr, 8192);
        assert!(reserve(addr + 4096, 4096));
        release(addr + 4096, 4096);
    }

    /// A free range is only a guess: another thread of this test binary
    /// may map there before `reserve` (one of ten guesses must do).
    #[test]
    fn a_free_range_is_aligned_and_can_be_reserved() {
        let g = 2 << 20;
        let a = (0..10)
            .map(|_| free_range(4 * g, g))
            .inspect(|a| assert!(*a != 0 && a.is_multiple_of(g), "{a:#x}"))
            .find(|&a| reserve(a, 4 * g))
            .expect("one of ten free ranges could be reserved");
        release(a, 4 * g);
    }
}
