//! The process's pages of a managed allocation: a memfd mapped twice, once
//! at the allocation's device address (the program's view, whose
//! protection says where the bytes are) and once wherever the kernel likes
//! (the stand-in's view, always read-write, through which migrations copy
//! without ever faulting and without opening the program's view early).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::residence::Span;

/// What the program may do with a span of its view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prot {
    None,
    Read,
    ReadWrite,
}

/// The two views of one allocation.
#[derive(Debug)]
pub(crate) struct View {
    /// The program's view: the device address.
    addr: u64,
    len: usize,
    /// The stand-in's view.
    alias: *mut u8,
    _fd: OwnedFd,
}

// SAFETY: the views are plain memory mappings; who may touch which bytes
// when is the residence table's business (see `super`), kept under its lock.
unsafe impl Send for View {}
// SAFETY: as above.
unsafe impl Sync for View {}

fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

impl View {
    /// Maps `len` bytes (page multiple) of a new memfd at `addr`, over the
    /// inaccessible reservation the stand-in made there for the device
    /// allocation, with protection `p`, and the alias.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be the stand-in's own reservation
    /// (`crate::reserve`), holding nothing of the program's.
    pub unsafe fn over_reservation(addr: u64, len: usize, p: Prot) -> std::io::Result<View> {
        // SAFETY: a new anonymous file; the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"fairvgpu-managed".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(last_error());
        }
        // SAFETY: `fd` was just made and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizes our own new file (sparse: no memory until written).
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(last_error());
        }
        // SAFETY: a new shared mapping of our file wherever the kernel likes.
        let alias = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if alias == libc::MAP_FAILED {
            return Err(last_error());
        }
        // SAFETY: replaces the stand-in's own reservation at [addr, addr +
        // len) (this function's contract) with our file; nothing of the
        // program's is there.
        let at = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                prot(p),
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED || at as u64 != addr {
            let e = last_error();
            // SAFETY: the alias just made, known to nothing else.
            unsafe { libc::munmap(alias, len) };
            return Err(e);
        }
        Ok(View {
            addr,
            len,
            alias: alias as *mut u8,
            _fd: fd,
        })
    }

    /// Sets what the program may do with span `s` (page-aligned; chunks
    /// are).
    pub fn protect(&self, s: Span, p: Prot) -> std::io::Result<()> {
        assert!(s.off + s.len <= self.len as u64, "span outside the view");
        // SAFETY: changes the protection of pages of the program's view,
        // which this `View` mapped and owns; the stand-in never touches
        // them through this view.
        let r = unsafe {
            libc::mprotect(
                (self.addr + s.off) as *mut libc::c_void,
                s.len as usize,
                prot(p),
            )
        };
        if r != 0 {
            return Err(last_error());
        }
        Ok(())
    }

    /// The bytes of span `s`, through the alias, to copy them to the
    /// device. The caller makes sure the program cannot write them
    /// meanwhile (its view of `s` is read-only or inaccessible).
    pub fn bytes(&self, s: Span) -> &[u8] {
        assert!(s.off + s.len <= self.len as u64, "span outside the view");
        let p = self.alias.wrapping_add(s.off as usize);
        // SAFETY: inside the alias mapping (checked above), which lives as
        // long as `self`; no one writes it meanwhile (the caller's duty).
        unsafe { std::slice::from_raw_parts(p, s.len as usize) }
    }

    /// The bytes of span `s`, through the alias, to fill them from the
    /// device. The program's view of `s` must be inaccessible meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub fn bytes_mut(&self, s: Span) -> &mut [u8] {
        assert!(s.off + s.len <= self.len as u64, "span outside the view");
        let p = self.alias.wrapping_add(s.off as usize);
        // SAFETY: inside the alias mapping (checked above), which lives as
        // long as `self`; nothing else reads or writes it meanwhile (the
        // caller's duty, under the residence table's write lock).
        unsafe { std::slice::from_raw_parts_mut(p, s.len as usize) }
    }
}

impl Drop for View {
    /// Unmaps the alias. The program's view stays until the device range's
    /// reservation is given back (`crate::reserve::release`).
    fn drop(&mut self) {
        // SAFETY: the alias this `View` mapped; no slice of it outlives
        // `self` (they borrow it).
        unsafe { libc::munmap(self.alias as *mut libc::c_void, self.len) };
    }
}

fn prot(p: Prot) -> libc::c_int {
    match p {
        Prot::None => libc::PROT_NONE,
        Prot::Read => libc::PROT_READ,
        Prot::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_views_see_the_same_bytes_and_protection_is_the_programs_alone() {
        let len = 4 * 4096;
        // A free range is a guess another test's thread may take first.
        let addr = (0..10)
            .map(|_| crate::reserve::free_range(len as u64, 4096))
            .find(|&a| a != 0 && crate::reserve::reserve(a, len as u64))
            .expect("a free range");
        // SAFETY: our own reservation just made.
        let v = unsafe { View::over_reservation(addr, len, Prot::ReadWrite) }.unwrap();
        // SAFETY: the program's view, read-write.
        unsafe { *((addr + 4096) as *mut u8) = 7 };
        let page = Span {
            off: 4096,
            len: 4096,
        };
        assert_eq!(v.bytes(page)[0], 7);
        v.protect(page, Prot::None).unwrap();
        // The alias stays writable while the program's view is closed.
        v.bytes_mut(page)[1] = 9;
        v.protect(page, Prot::Read).unwrap();
        // SAFETY: readable again.
        assert_eq!(unsafe { *((addr + 4097) as *const u8) }, 9);
        drop(v);
        crate::reserve::release(addr, len as u64);
    }
}
