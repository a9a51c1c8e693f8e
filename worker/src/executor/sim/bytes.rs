//! The bytes of a piece of model memory: on the heap, or in a memfd that
//! another worker of the VM maps too (memory exported across workers,
//! `memory.rs`'s `export_mem`); the only `unsafe` of the sim.

use std::fs::File;
use std::os::fd::OwnedFd;

use protocol::Status;
use vm_memory::mmap::MmapRegion;
use vm_memory::FileOffset;

/// Model memory's bytes.
pub(crate) enum Bytes {
    /// Private to this worker.
    Heap(Vec<u8>),
    /// A memfd mapped shared, and the fd (to pass on).
    Shared(MmapRegion, OwnedFd),
}

impl Bytes {
    /// `fd` (a memfd of at least `len` bytes) mapped.
    pub(crate) fn map(fd: OwnedFd, len: usize) -> Result<Bytes, Status> {
        let file = File::from(fd.try_clone().map_err(|_| Status::OutOfMemory)?);
        let actual = file.metadata().map_err(|_| Status::InvalidValue)?.len();
        if actual < len as u64 || len == 0 {
            // A short file would fault on access instead of failing here.
            return Err(Status::InvalidValue);
        }
        let m = MmapRegion::from_file(FileOffset::new(file, 0), len)
            .map_err(|_| Status::OutOfMemory)?;
        Ok(Bytes::Shared(m, fd))
    }

    /// These bytes moved into a new memfd, mapped (done once: shared
    /// bytes stay).
    pub(crate) fn make_shared(&mut self) -> Result<(), Status> {
        let Bytes::Heap(v) = self else {
            return Ok(());
        };
        let fd = transport::shm::create_memfd("fairvgpu-sim-ipc", v.len())
            .map_err(|_| Status::OutOfMemory)?;
        let mut shared = Bytes::map(fd, v.len())?;
        shared.copy_from_slice(v);
        *self = shared;
        Ok(())
    }

    /// A copy of the memfd's fd, if shared.
    pub(crate) fn fd(&self) -> Option<OwnedFd> {
        match self {
            Bytes::Heap(_) => None,
            Bytes::Shared(_, fd) => fd.try_clone().ok(),
        }
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Heap(v) => v,
            // SAFETY: the mapping lives as long as `self`, is `size()`
            // bytes, readable and writable; the caller holds the buffer's
            // mutex, so no other thread of this process touches it. The
            // other worker that maps it writes it as a process sharing
            // device memory does (the guest's programs order their
            // accesses); the bytes are plain data, any value is valid.
            Bytes::Shared(m, _) => unsafe { std::slice::from_raw_parts(m.as_ptr(), m.size()) },
        }
    }
}

impl std::ops::DerefMut for Bytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Bytes::Heap(v) => v,
            // SAFETY: as in `deref`; `&mut self` makes this the only
            // reference into the mapping in this process.
            Bytes::Shared(m, _) => unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), m.size()) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_bytes_are_seen_by_a_second_mapping_and_keep_their_contents() {
        let mut a = Bytes::Heap(vec![1, 2, 3, 4]);
        a.make_shared().unwrap();
        assert_eq!(&a[..], &[1, 2, 3, 4]);
        let mut b = Bytes::map(a.fd().unwrap(), 4).unwrap();
        b[0] = 9;
        assert_eq!(a[0], 9, "one memory");
        drop(a);
        assert_eq!(&b[..], &[9, 2, 3, 4], "kept while mapped");
        assert!(Bytes::map(b.fd().unwrap(), 8).is_err(), "past its end");
    }
}
