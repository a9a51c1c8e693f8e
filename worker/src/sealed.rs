//! Immutable bytes several processes can map: a memfd sealed against
//! writing, shrinking and growing, mapped read-only. Once sealed nobody,
//! its maker included, can change the bytes, so a process that checked
//! them once (the daemon hashing a module image) can hand the fd to others
//! who need not check again, and the pages exist once however many map it.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

use crate::{Error, ImageError};

/// The seals that make the bytes immutable.
fn immutable() -> SealFlag {
    SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW
}

fn io(what: &'static str, e: impl Into<std::io::Error>) -> Error {
    Error::Io {
        what,
        source: e.into(),
    }
}

/// Bytes in a sealed memfd, mapped read-only.
pub struct SealedBytes {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only and its bytes can never change (the
// seals), so sharing or sending references to it between threads is sound.
unsafe impl Send for SealedBytes {}
// SAFETY: as above.
unsafe impl Sync for SealedBytes {}

impl std::fmt::Debug for SealedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedBytes")
            .field("len", &self.len)
            .finish()
    }
}

impl SealedBytes {
    /// Copies `bytes` (not empty) into a new memfd and seals it.
    pub fn new(name: &str, bytes: &[u8]) -> Result<SealedBytes, Error> {
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .map_err(|e| io("memfd_create", e))?;
        let mut file = File::from(fd);
        file.write_all(bytes)
            .map_err(|e| io("filling a memfd", e))?;
        let fd = OwnedFd::from(file);
        fcntl(
            fd.as_fd(),
            FcntlArg::F_ADD_SEALS(immutable() | SealFlag::F_SEAL_SEAL),
        )
        .map_err(|e| io("sealing a memfd", e))?;
        Self::map(fd, bytes.len())
    }

    /// Maps an fd another process sent: it must be a memfd sealed against
    /// writing, shrinking and growing, of exactly `len` (not 0) bytes.
    pub fn from_fd(fd: OwnedFd, len: usize) -> Result<SealedBytes, Error> {
        let seals = fcntl(fd.as_fd(), FcntlArg::F_GET_SEALS).map_err(|e| io("reading seals", e))?;
        if !SealFlag::from_bits_truncate(seals).contains(immutable()) {
            return Err(ImageError::NotSealed.into());
        }
        let size = nix::sys::stat::fstat(fd.as_fd())
            .map_err(|e| io("fstat of an image fd", e))?
            .st_size;
        if u64::try_from(size).ok() != Some(len as u64) {
            return Err(ImageError::WrongSize { size, len }.into());
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<SealedBytes, Error> {
        let n = std::num::NonZeroUsize::new(len).ok_or(ImageError::Empty)?;
        // SAFETY: a new read-only shared mapping of `len` bytes of a file
        // that is exactly that long and can no longer shrink (sealed), so
        // no access through it can fault; nothing else is at the address
        // the kernel picks.
        let p = unsafe {
            mmap(
                None,
                n,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        }
        .map_err(|e| io("mapping an image", e))?;
        Ok(SealedBytes {
            fd,
            ptr: p.cast(),
            len,
        })
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self`
        // lives, and no one can write them (sealed).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The memfd, to send to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: see [`SealedBytes::new`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SealedBytes {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `len` bytes, unmapped once; the slices
        // handed out borrow `self`, so none outlives it.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_bytes_cannot_be_changed_and_map_again_elsewhere() {
        let s = SealedBytes::new("t", b"module image").unwrap();
        assert_eq!(s.bytes(), b"module image");
        // Nobody can write, even through a new fd of the same file.
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&s.fd()));
        assert!(std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"X"))
            .is_err());
        // Another mapping of the same fd sees the same bytes.
        let again = SealedBytes::from_fd(s.fd().try_clone_to_owned().unwrap(), 12).unwrap();
        assert_eq!(again.bytes(), b"module image");
        // The length must be the file's.
        let e = SealedBytes::from_fd(s.fd().try_clone_to_owned().unwrap(), 11).unwrap_err();
        assert!(
            matches!(e, Error::Image(ImageError::WrongSize { size: 12, len: 11 })),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "image: an image fd of 12 bytes, not 11");
    }

    #[test]
    fn an_unsealed_fd_is_refused() {
        let fd = memfd_create("u", MFdFlags::MFD_CLOEXEC).unwrap();
        let mut f = File::from(fd);
        f.write_all(b"abc").unwrap();
        let e = SealedBytes::from_fd(OwnedFd::from(f), 3).unwrap_err();
        assert!(matches!(e, Error::Image(ImageError::NotSealed)), "{e:?}");
        assert!(e.to_string().contains("not sealed"), "{e}");
    }
}
