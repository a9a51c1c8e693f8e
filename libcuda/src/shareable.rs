//! Shareable handles as POSIX file descriptors
//! (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), for VMM allocations
//! (`vmm.rs`) and memory pools (`mem_pool.rs`) between the processes of
//! one VM.
//!
//! A handle is a real descriptor of the process, so that it travels over a
//! Unix socket (`SCM_RIGHTS`), is inherited and `dup`ed, and is closed
//! with `close`, as the driver's is: a sealed memfd whose 64 bytes name
//! what the host exported (`protocol::Request::VmmExport`, `PoolExport`):
//! ours [`MAGIC`], its kind, the host's token and the memory's size. The
//! token, not the descriptor, is what the host checks: a descriptor made
//! up by hand, or carrying a token of another VM, imports nothing
//! (`CUDA_ERROR_INVALID_VALUE`, as the driver answers a descriptor that is
//! not one of its handles).

use std::ffi::c_int;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use crate::{code, CuResult};

/// What a handle's content starts with.
const MAGIC: &[u8; 8] = b"fvgshr01";

/// The seals every handle of ours carries: its content never changes.
const SEALS: c_int =
    libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Kind {
    /// Physical memory of a VMM allocation.
    Vmm = 1,
    /// A memory pool.
    Pool = 2,
}

/// What a handle carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Content {
    pub kind: Kind,
    pub token: u64,
    pub size: u64,
}

impl Content {
    fn bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(MAGIC);
        for (i, v) in [self.kind as u64, self.token, self.size].iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn parse(b: &[u8; 64], kind: Kind) -> Option<Content> {
        if &b[..8] != MAGIC {
            return None;
        }
        let v =
            |i: usize| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().unwrap_or_default());
        let c = Content {
            kind,
            token: v(1),
            size: v(2),
        };
        (v(0) == kind as u64 && c.token != 0).then_some(c)
    }
}

/// A new descriptor of the process carrying `c` (its number, for the
/// caller's `int`).
pub(crate) fn make(c: Content) -> Result<c_int, CuResult> {
    // SAFETY: a NUL-terminated name and plain flags; the answer is checked.
    let fd = unsafe { libc::memfd_create(c"fairvgpu-shareable".as_ptr(), libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(code::OUT_OF_MEMORY);
    }
    // SAFETY: `fd` was just made and is owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let b = c.bytes();
    // SAFETY: `b` is 64 readable bytes; the descriptor is ours.
    let n = unsafe { libc::pwrite(owned.as_raw_fd(), b.as_ptr().cast(), b.len(), 0) };
    // SAFETY: an fcntl with an integer argument on our descriptor.
    let sealed = unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_ADD_SEALS, SEALS) };
    if n != b.len() as isize || sealed != 0 {
        return Err(code::OUT_OF_MEMORY);
    }
    Ok(owned.into_raw_fd())
}

/// What the descriptor `fd` (the caller's, left open) carries, if it is a
/// handle of ours of `kind`.
pub(crate) fn read(fd: c_int, kind: Kind) -> Result<Content, CuResult> {
    if fd < 0 {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: an fcntl query on a descriptor number; a bad one answers -1.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals < 0 || seals & SEALS != SEALS {
        return Err(code::INVALID_VALUE);
    }
    let mut b = [0u8; 64];
    // SAFETY: `b` is 64 writable bytes; the descriptor stays the caller's.
    let n = unsafe { libc::pread(fd, b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(code::INVALID_VALUE);
    }
    Content::parse(&b, kind).ok_or(code::INVALID_VALUE)
}

/// The descriptor number a `void *` shareable handle argument carries
/// (`(void *)(uintptr_t)fd`, as the driver takes it).
pub(crate) fn fd_of(os_handle: *mut std::ffi::c_void) -> Result<c_int, CuResult> {
    c_int::try_from(os_handle as usize).map_err(|_| code::INVALID_VALUE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(fd: c_int) {
        // SAFETY: a descriptor this test made and owns.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }

    #[test]
    fn a_handle_is_a_sealed_descriptor_carrying_its_token() {
        let c = Content {
            kind: Kind::Vmm,
            token: 0xfeed_beef,
            size: 2 << 20,
        };
        let fd = make(c).unwrap();
        assert_eq!(read(fd, Kind::Vmm), Ok(c));
        assert_eq!(
            read(fd, Kind::Pool),
            Err(code::INVALID_VALUE),
            "another kind"
        );
        // SAFETY: a plain write attempt on our descriptor; sealed, it fails.
        let w = unsafe { libc::pwrite(fd, b"x".as_ptr().cast(), 1, 0) };
        assert_eq!(w, -1, "sealed against writes");
        // A dup is the same handle.
        // SAFETY: dup of our descriptor.
        let d = unsafe { libc::dup(fd) };
        assert_eq!(read(d, Kind::Vmm), Ok(c));
        close(d);
        close(fd);
        assert_eq!(read(fd, Kind::Vmm), Err(code::INVALID_VALUE), "closed");
        assert_eq!(read(-1, Kind::Vmm), Err(code::INVALID_VALUE));
    }

    #[test]
    fn descriptors_not_ours_are_refused() {
        // A pipe, and an unsealed memfd holding a forged content.
        let mut p = [0; 2];
        // SAFETY: two ints for the pipe's ends.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        assert_eq!(read(p[0], Kind::Vmm), Err(code::INVALID_VALUE));
        close(p[0]);
        close(p[1]);
        // SAFETY: as in `make`.
        let fd = unsafe { libc::memfd_create(c"forged".as_ptr(), libc::MFD_ALLOW_SEALING) };
        let b = Content {
            kind: Kind::Vmm,
            token: 7,
            size: 1,
        }
        .bytes();
        // SAFETY: 64 readable bytes to our descriptor.
        assert_eq!(unsafe { libc::pwrite(fd, b.as_ptr().cast(), 64, 0) }, 64);
        assert_eq!(read(fd, Kind::Vmm), Err(code::INVALID_VALUE), "not sealed");
        close(fd);
        assert_eq!(Content::parse(&[0; 64], Kind::Vmm), None, "no magic");
        let mut zero = Content {
            kind: Kind::Pool,
            token: 1,
            size: 0,
        }
        .bytes();
        zero[16..24].fill(0);
        assert_eq!(Content::parse(&zero, Kind::Pool), None, "token 0");
        assert_eq!(fd_of(usize::MAX as *mut _), Err(code::INVALID_VALUE));
        assert_eq!(fd_of(3 as *mut _), Ok(3));
    }
}
