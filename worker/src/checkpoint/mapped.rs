//! A checkpoint stream read in place. A restoring worker maps the memfd the
//! daemon handed it instead of copying it out: its device memory then
//! crosses the host's memory once (to the device), not twice. A memory
//! blob of the image is a slice of the mapping ([`Blob`]).
//!
//! The daemon wrote the stream before it handed the memfd over and writes
//! no more to it. The worker seals it against shrinking before it maps it,
//! so that no access can fault, and writes its reason into it (a failed
//! restore, `answer.rs`) only once the image and its mapping are gone.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::mman::{
    madvise, mmap, mmap_anonymous, mremap, munmap, MRemapFlags, MapFlags, MmapAdvise, ProtFlags,
};

/// A stream's memfd, mapped read-only.
#[derive(Debug)]
pub struct Mapped {
    ptr: NonNull<u8>,
    len: usize,
    /// Its holes (where, how long; page-aligned, in order): zeros.
    holes: Vec<(usize, usize)>,
}

// SAFETY: the mapping is read-only and nobody writes the memfd while it is
// mapped (see the module above), so references to it may cross threads.
unsafe impl Send for Mapped {}
// SAFETY: as above.
unsafe impl Sync for Mapped {}

impl Mapped {
    /// Maps all of `fd`, sealed first against shrinking. An fd that cannot
    /// be sealed (a memfd made without `MFD_ALLOW_SEALING`), or an empty
    /// one, is an error: the caller reads it as a stream instead.
    ///
    /// The memfd's holes (a stream's blocks of zeros, `save_file`'s) are
    /// mapped as anonymous zero pages: read, a hole of a memfd would get a
    /// page of its own, allocated and zeroed, in the guest's pause.
    pub fn of(fd: &OwnedFd) -> std::io::Result<Mapped> {
        fcntl(fd.as_fd(), FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK))?;
        let size = nix::sys::stat::fstat(fd.as_fd())?.st_size;
        let len = usize::try_from(size).map_err(|_| std::io::ErrorKind::InvalidData)?;
        let n = std::num::NonZeroUsize::new(len).ok_or(std::io::ErrorKind::UnexpectedEof)?;
        let holes = holes(fd, len);
        // SAFETY: a new read-only shared mapping of the whole memfd, which
        // can no longer shrink (sealed above), so no access through it can
        // fault; nothing else is at the address the kernel picks.
        let p = unsafe {
            mmap(
                None,
                n,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        }?;
        let map = Mapped {
            ptr: p.cast(),
            len,
            holes,
        };
        for &(at, hole) in &map.holes {
            let Some(k) = std::num::NonZeroUsize::new(hole) else {
                continue;
            };
            // SAFETY: `[at, at + hole)` lies within our own mapping just
            // made (`holes` keeps inside `len`), page-aligned; it is
            // replaced by a private read-only anonymous mapping, which
            // reads as zeros as the hole does. No reference into it exists
            // yet.
            unsafe {
                mmap_anonymous(
                    Some(
                        std::num::NonZeroUsize::new(p.as_ptr() as usize + at)
                            .ok_or(std::io::ErrorKind::InvalidData)?,
                    ),
                    k,
                    ProtFlags::PROT_READ,
                    MapFlags::MAP_PRIVATE | MapFlags::MAP_FIXED,
                )
            }?;
        }
        // Its data alone is faulted in ahead: the holes' zero pages are
        // never read (a restore sets that device memory, `Blob::runs`).
        let mut at = 0;
        for (from, to) in map
            .holes
            .iter()
            .map(|&(h, n)| (h, h + n))
            .chain(std::iter::once((len, len)))
        {
            if from > at {
                // SAFETY: `at` < `from` <= `len`: within our own mapping.
                let data = unsafe { p.byte_add(at) };
                // SAFETY: `at` is page aligned (0, or a hole's end) and
                // `[at, from)` within our own mapping; the advice only
                // faults pages in ahead (a kernel without it says so, and
                // they fault as read).
                let _ = unsafe { madvise(data, from - at, MmapAdvise::MADV_POPULATE_READ) };
            }
            at = to;
        }
        Ok(map)
    }

    /// The runs of `[at, at + len)` (within the stream), each as (where
    /// from `at`, how long, whether it lies in a hole and so is zeros).
    fn runs(&self, at: usize, len: usize) -> Vec<(usize, usize, bool)> {
        let end = at + len;
        let mut out = Vec::new();
        let mut pos = at;
        let first = self.holes.partition_point(|&(h, n)| h + n <= at);
        for &(h, n) in &self.holes[first..] {
            if h >= end {
                break;
            }
            let (hs, he) = (h.max(pos), (h + n).min(end));
            if hs > pos {
                out.push((pos - at, hs - pos, false));
            }
            if he > hs {
                out.push((hs - at, he - hs, true));
            }
            pos = he.max(pos);
        }
        if pos < end {
            out.push((pos - at, end - pos, false));
        }
        out
    }

    /// The stream.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self`
        // lives, and nobody writes them meanwhile (the module above).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

/// The page-aligned holes of the memfd `fd`'s first `len` bytes: (where,
/// how long). None where the file cannot say.
fn holes(fd: &OwnedFd, len: usize) -> Vec<(usize, usize)> {
    use nix::unistd::{lseek, Whence};
    let page = 4096usize;
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < len {
        let Ok(off) = i64::try_from(at) else { break };
        let Ok(h) = lseek(fd.as_fd(), off, Whence::SeekHole) else {
            break;
        };
        let hole = usize::try_from(h).unwrap_or(len).min(len);
        if hole >= len {
            break;
        }
        let data = match lseek(fd.as_fd(), h, Whence::SeekData) {
            Ok(d) => usize::try_from(d).unwrap_or(len).min(len),
            Err(_) => len,
        };
        let (start, end) = (hole.next_multiple_of(page), data - data % page);
        if end > start {
            out.push((start, end - start));
        }
        at = data.max(hole + 1);
    }
    out
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `len` bytes, unmapped once; the slices
        // handed out borrow `self` or an `Arc` of it, so none outlives it.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// A memfd sized and mapped for writing: a worker's checkpoint written in
/// place (`in_place.rs`). The daemon made the memfd for it (or kept one a
/// checkpoint sent ahead filled, whose pages are then reused), and
/// neither reads nor resizes it until told it is written.
#[derive(Debug)]
pub struct MappedMut {
    ptr: NonNull<u8>,
    /// Bytes of the stream: the memfd's length.
    len: usize,
    /// Bytes mapped, at least `len` (more where the memfd was cut since).
    mapped: usize,
    /// The memfd (device, inode).
    file: (u64, u64),
}

// SAFETY: the mapping is the worker's own and only written through
// `&mut self`; moving it to another thread moves that access with it.
unsafe impl Send for MappedMut {}

/// How long a memfd's mapping is kept for a handover after the checkpoint
/// sent ahead: as long as the daemon keeps the memfd.
pub const KEEP_MAPPED: std::time::Duration = std::time::Duration::from_secs(600);

/// The mapping of a memfd a checkpoint sent ahead was written into, kept
/// for the handover's checkpoint, which the daemon writes over the same
/// memfd: mapping its pages again cost 31-40 ms of the guest's pause for
/// 230-275 MB (`docs/measured.md`).
#[derive(Debug)]
pub struct KeptMap {
    map: MappedMut,
    since: std::time::Instant,
}

impl KeptMap {
    /// Whether it has been kept past [`KEEP_MAPPED`].
    pub fn stale(&self) -> bool {
        self.since.elapsed() > KEEP_MAPPED
    }
}

impl MappedMut {
    /// Sizes `fd` (the memfd `file`) to `len` bytes and maps it for
    /// writing; `len` 0 is an error (the caller writes the stream instead).
    fn create(fd: &OwnedFd, file: (u64, u64), len: usize) -> std::io::Result<MappedMut> {
        let n = std::num::NonZeroUsize::new(len).ok_or(std::io::ErrorKind::InvalidInput)?;
        let size = i64::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        nix::unistd::ftruncate(fd.as_fd(), size)?;
        // SAFETY: a new shared mapping of the whole memfd, `len` bytes
        // long, which only the daemon could resize and does not until told
        // the stream is written (above), so no access through it faults;
        // nothing else is at the address the kernel picks.
        let p = unsafe {
            mmap(
                None,
                n,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                fd.as_fd(),
                0,
            )
        }?;
        Ok(MappedMut {
            ptr: p.cast(),
            len,
            mapped: len,
            file,
        })
    }

    /// [`MappedMut::create`], but through `kept`'s mapping where it is of
    /// the same memfd: the memfd sized to `len`, only pages past what was
    /// mapped mapped anew. The mapping is kept again where `keep`, else
    /// dropped once the stream is written (`write`). A new mapping to keep
    /// has a quarter more pages, past the stream's end: a handover's stream
    /// is often longer than the one sent ahead (a training's modules and
    /// memory grow), and pages mapped then are not in the guest's pause.
    pub fn reuse(
        kept: &mut Option<KeptMap>,
        fd: &OwnedFd,
        len: usize,
        keep: bool,
        write: impl FnOnce(&mut MappedMut) -> Result<u64, super::FormatError>,
    ) -> Result<u64, super::FormatError> {
        let file = file_of(fd)?;
        let mut map = match kept.take() {
            Some(k) if k.map.file == file => {
                let mut m = k.map;
                m.resize(fd, len)?;
                m
            }
            _ if keep => {
                let mut m = MappedMut::create(fd, file, len + (len / 4).next_multiple_of(4096))?;
                m.len = len;
                m
            }
            _ => MappedMut::create(fd, file, len)?,
        };
        let r = write(&mut map);
        if keep && r.is_ok() {
            *kept = Some(KeptMap {
                map,
                since: std::time::Instant::now(),
            });
        }
        r
    }

    /// The memfd sized to `len`, the mapping grown to cover it where it
    /// did not (its pages up to then stay mapped).
    fn resize(&mut self, fd: &OwnedFd, len: usize) -> std::io::Result<()> {
        let size = i64::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        nix::unistd::ftruncate(fd.as_fd(), size)?;
        if len > self.mapped {
            // SAFETY: our own shared mapping of `mapped` bytes, moved if
            // need be; no reference into it is held (`&mut self`), and the
            // memfd now covers all `len` bytes, so no access through the
            // grown mapping faults.
            let p = unsafe {
                mremap(
                    self.ptr.cast(),
                    self.mapped,
                    len,
                    MRemapFlags::MREMAP_MAYMOVE,
                    None,
                )
            }?;
            let page = 4096;
            let from = self.mapped.next_multiple_of(page);
            self.ptr = p.cast();
            self.mapped = len;
            if from < len {
                // SAFETY: `from` < `len`, within the mapping just grown.
                let tail = unsafe { p.byte_add(from) };
                // SAFETY: advice over the new part of our own mapping, page
                // aligned; it only faults its pages in ahead.
                let _ = unsafe { madvise(tail, len - from, MmapAdvise::MADV_POPULATE_WRITE) };
            }
        }
        self.len = len;
        Ok(())
    }

    /// The stream's bytes, to write.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` writable bytes for as long as `self`
        // lives; the daemon does not touch them until told (above), and
        // the borrow of `self` keeps this the only reference here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// The file `fd` is (device, inode).
fn file_of(fd: &OwnedFd) -> std::io::Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd.as_fd())?;
    Ok((st.st_dev, st.st_ino))
}

impl Drop for MappedMut {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `mapped` bytes, unmapped once; slices
        // of it borrow `self`.
        let _ = unsafe { munmap(self.ptr.cast(), self.mapped) };
    }
}

/// Bytes of an image's device memory or module: its own, shared with what
/// holds them (a loaded module's image), or a slice of the stream it was
/// read from, in place.
#[derive(Clone)]
pub enum Blob {
    /// Its own bytes (taken from a device, or read from a stream).
    Owned(Vec<u8>),
    /// Bytes shared, not copied: a module's image as its context keeps it.
    Shared(Arc<[u8]>),
    /// `len` bytes at `at` of a mapped stream.
    Mapped {
        /// The stream.
        map: Arc<Mapped>,
        /// Where in it.
        at: usize,
        /// How many bytes.
        len: usize,
    },
}

impl Blob {
    /// Its runs, each as (where, how long, whether all zeros): a blob
    /// mapped from a stream's holes is known to be zeros without a look,
    /// so that a restore sets that device memory rather than copying it.
    /// Any other blob is one run of bytes.
    pub fn runs(&self) -> Vec<(usize, usize, bool)> {
        match self {
            Blob::Mapped { map, at, len } => map.runs(*at, *len),
            _ if self.is_empty() => Vec::new(),
            _ => vec![(0, self.len(), false)],
        }
    }
}

impl Default for Blob {
    fn default() -> Self {
        Blob::Owned(Vec::new())
    }
}

impl From<Vec<u8>> for Blob {
    fn from(v: Vec<u8>) -> Blob {
        Blob::Owned(v)
    }
}

impl std::ops::Deref for Blob {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Blob::Owned(v) => v,
            Blob::Shared(s) => s,
            // In bounds: made only by `MappedReader::memory`, which checks.
            Blob::Mapped { map, at, len } => &map.bytes()[*at..*at + *len],
        }
    }
}

impl PartialEq for Blob {
    fn eq(&self, other: &Blob) -> bool {
        **self == **other
    }
}

impl Eq for Blob {}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Blob::Owned(_) => "owned",
            Blob::Shared(_) => "shared",
            Blob::Mapped { .. } => "mapped",
        };
        write!(f, "Blob({kind}, {} bytes)", self.len())
    }
}

/// A mapped stream read from its start; memory blobs come as slices of it.
#[derive(Debug)]
pub struct MappedReader {
    map: Arc<Mapped>,
    at: usize,
}

impl MappedReader {
    /// Reads `map` from its start.
    pub fn new(map: Arc<Mapped>) -> MappedReader {
        MappedReader { map, at: 0 }
    }

    /// The next `len` bytes as a slice of the mapping, passed over.
    pub fn memory(&mut self, len: u64) -> std::io::Result<Blob> {
        let left = self.map.len - self.at;
        let len = usize::try_from(len)
            .ok()
            .filter(|&n| n <= left)
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        let b = Blob::Mapped {
            map: self.map.clone(),
            at: self.at,
            len,
        };
        self.at += len;
        Ok(b)
    }
}

impl Read for MappedReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let rest = &self.map.bytes()[self.at..];
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn memfd(bytes: &[u8], sealing: bool) -> OwnedFd {
        let flags = if sealing {
            nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING
        } else {
            nix::sys::memfd::MFdFlags::empty()
        };
        let fd = nix::sys::memfd::memfd_create(c"mapped-test", flags).unwrap();
        let mut f = std::fs::File::from(fd);
        f.write_all(bytes).unwrap();
        OwnedFd::from(f)
    }

    #[test]
    fn a_stream_reads_in_place_and_its_blobs_are_slices_of_it() {
        let fd = memfd(b"headBLOBtail", true);
        let map = Arc::new(Mapped::of(&fd).unwrap());
        let mut r = MappedReader::new(map.clone());
        let mut head = [0; 4];
        r.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"head");
        let blob = r.memory(4).unwrap();
        assert_eq!(&*blob, b"BLOB");
        assert!(matches!(blob, Blob::Mapped { at: 4, len: 4, .. }));
        assert_eq!(blob, Blob::from(b"BLOB".to_vec()));
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"tail");
        // Past its end: refused, nothing passed over.
        assert!(r.memory(1).is_err());
        // Sealed: the memfd cannot shrink under the mapping.
        let f = std::fs::File::from(fd);
        assert!(f.set_len(2).is_err());
        assert!(f.set_len(100).is_ok(), "growing is harmless");
    }

    #[test]
    fn a_sparse_stream_reads_as_zeros_in_its_holes_without_pages_for_them() {
        use std::os::unix::fs::FileExt;
        let fd = memfd(b"", true);
        let f = std::fs::File::from(fd.try_clone().unwrap());
        let len = 64usize << 20;
        f.set_len(len as u64).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"middle", 32 << 20).unwrap();
        f.write_all_at(b"tail", len as u64 - 4).unwrap();
        let blocks = || nix::sys::stat::fstat(fd.as_fd()).unwrap().st_blocks;
        let before = blocks();
        let map = Mapped::of(&fd).unwrap();
        let b = map.bytes();
        assert_eq!(&b[..4], b"head");
        assert_eq!(&b[32 << 20..(32 << 20) + 6], b"middle");
        assert_eq!(&b[len - 4..], b"tail");
        let zeros = b.iter().filter(|&&x| x == 0).count();
        assert_eq!(zeros, len - 14, "every other byte reads as zero");
        assert_eq!(blocks(), before, "reading the holes allocated nothing");
        // A blob over them knows its zeros without reading them.
        let (mib, page) = (1usize << 20, 4096usize);
        let map = Arc::new(map);
        let blob = Blob::Mapped {
            map: map.clone(),
            at: 100,
            len: 40 * mib,
        };
        assert_eq!(
            blob.runs(),
            [
                (0, page - 100, false),
                (page - 100, 32 * mib - page, true),
                (32 * mib - 100, page, false),
                (32 * mib - 100 + page, 8 * mib - page + 100, true),
            ]
        );
        let inside = Blob::Mapped {
            map,
            at: 2 * page,
            len: 3,
        };
        assert_eq!(inside.runs(), [(0, 3, true)]);
        assert_eq!(Blob::from(vec![1, 2]).runs(), [(0, 2, false)]);
        assert!(Blob::default().runs().is_empty());
    }

    /// A memfd written again through the mapping kept: the same mapping
    /// where the stream fits it, grown (its pages kept) where not, cut
    /// with the memfd; another memfd is mapped anew.
    #[test]
    fn a_kept_mapping_is_written_through_again_grown_or_cut() {
        use std::os::unix::fs::FileExt;
        let page = 4096usize;
        let fd = memfd(b"", true);
        let f = std::fs::File::from(fd.try_clone().unwrap());
        let mut kept = None;
        let fill = |b: u8| {
            move |m: &mut MappedMut| -> Result<u64, super::super::FormatError> {
                m.bytes_mut().fill(b);
                Ok(m.len as u64)
            }
        };
        MappedMut::reuse(&mut kept, &fd, 3 * page, true, fill(1)).unwrap();
        let first = kept.as_ref().unwrap().map.ptr;
        // Shorter: the same mapping, the memfd cut.
        MappedMut::reuse(&mut kept, &fd, page + 5, true, fill(2)).unwrap();
        assert_eq!(kept.as_ref().unwrap().map.ptr, first, "the same mapping");
        assert_eq!(f.metadata().unwrap().len(), (page + 5) as u64);
        // Longer than ever mapped: grown, every byte writable.
        let n = 100 * page + 7;
        MappedMut::reuse(&mut kept, &fd, n, true, |m| {
            assert_eq!(m.bytes_mut()[..page + 5], [2; 4101], "what it held");
            fill(3)(m)
        })
        .unwrap();
        let mut b = vec![0u8; n];
        f.read_exact_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 3));
        assert_eq!(f.metadata().unwrap().len(), n as u64);
        // Not kept once asked not to; another memfd is not written
        // through this one's mapping.
        MappedMut::reuse(&mut kept, &fd, n, false, fill(4)).unwrap();
        assert!(kept.is_none());
        let other = memfd(b"", true);
        MappedMut::reuse(&mut kept, &fd, page, true, fill(5)).unwrap();
        MappedMut::reuse(&mut kept, &other, page, true, fill(6)).unwrap();
        f.read_exact_at(&mut b[..page], 0).unwrap();
        assert!(
            b[..page].iter().all(|&x| x == 5),
            "the first memfd untouched"
        );
        assert!(!kept.as_ref().unwrap().stale());
    }

    #[test]
    fn a_memfd_that_cannot_be_sealed_or_is_empty_is_not_mapped() {
        assert!(Mapped::of(&memfd(b"bytes", false)).is_err());
        assert!(Mapped::of(&memfd(b"", true)).is_err());
    }
}
