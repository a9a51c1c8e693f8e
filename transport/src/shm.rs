//! The shared region's memory: a memfd mapping (real use) or a heap block
//! (unit tests and Miri). This is the only module of the crate with `unsafe`.
//!
//! Everything above this module reaches the pages through `vm-memory`'s
//! `VolatileSlice` (bounds-checked volatile copies) and `&AtomicU32/64`
//! obtained through `get_atomic_ref` (bounds- and alignment-checked). No
//! `&`/`&mut` to plain data in the shared pages is ever created.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, VolatileMemory, VolatileSlice};

use crate::error::{Error, Result};

enum Backing {
    Mapped(MmapRegion<()>),
    Heap(Box<[AtomicU64]>),
}

/// A mapped shared region.
pub struct SharedMemory {
    backing: Backing,
    len: usize,
}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.backing {
            Backing::Mapped(_) => "mapped",
            Backing::Heap(_) => "heap",
        };
        f.debug_struct("SharedMemory")
            .field("kind", &kind)
            .field("len", &self.len)
            .finish()
    }
}

impl SharedMemory {
    /// Zeroed memory on the heap, for tests that need no second process.
    pub fn heap(len: usize) -> SharedMemory {
        let words = len.div_ceil(8);
        let backing: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        SharedMemory {
            backing: Backing::Heap(backing),
            len: words * 8,
        }
    }

    /// Maps `len` bytes of `fd` shared and read-write. The file must be at
    /// least `len` long; that is checked here, so a short file is an error
    /// and not a SIGBUS later.
    pub fn map(fd: OwnedFd, len: usize) -> Result<SharedMemory> {
        let file = File::from(fd);
        let actual = file
            .metadata()
            .map_err(|e| Error::io("fstat of shared memory", e))?
            .len();
        if actual < len as u64 {
            return Err(Error::BadLayout(format!(
                "shared memory file has {actual} bytes, layout needs {len}"
            )));
        }
        let region = MmapRegion::from_file(FileOffset::new(file, 0), len)?;
        Ok(SharedMemory {
            backing: Backing::Mapped(region),
            len,
        })
    }

    /// Maps `len` bytes of a device file (the guest kernel module's
    /// `/dev/fairvgpuN`), whose size is not a file size: the caller got `len`
    /// from the driver, which refuses a mapping larger than the BAR.
    pub fn map_device(fd: OwnedFd, len: usize) -> Result<SharedMemory> {
        let region = MmapRegion::from_file(FileOffset::new(File::from(fd), 0), len)?;
        Ok(SharedMemory {
            backing: Backing::Mapped(region),
            len,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never, in practice).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole region as a volatile slice.
    pub fn slice(&self) -> VolatileSlice<'_> {
        match &self.backing {
            Backing::Mapped(m) => m.as_volatile_slice(),
            Backing::Heap(words) => {
                // SAFETY: `words` is a live allocation of `self.len` bytes owned
                // by `self`; the slice borrows `self`, so it cannot outlive it.
                // All access through the slice is volatile or atomic, which is
                // sound for memory also reached through the `AtomicU64`s.
                unsafe { VolatileSlice::new(words.as_ptr() as *mut u8, self.len) }
            }
        }
    }

    /// An atomic `u32` at `off` (bounds and alignment checked).
    pub fn atomic_u32(&self, off: usize) -> Result<&AtomicU32> {
        let s = self.slice();
        let r: &AtomicU32 = s.get_atomic_ref(off)?;
        // The reference vm-memory hands out borrows the temporary slice; the
        // memory it points to lives as long as `self`.
        Ok(extend(r, self))
    }

    /// An atomic `u64` at `off` (bounds and alignment checked).
    pub fn atomic_u64(&self, off: usize) -> Result<&AtomicU64> {
        let s = self.slice();
        let r: &AtomicU64 = s.get_atomic_ref(off)?;
        Ok(extend(r, self))
    }
}

impl SharedMemory {
    /// The file behind a mapped region (none for heap memory).
    pub(crate) fn file(&self) -> Option<&File> {
        match &self.backing {
            Backing::Mapped(m) => m.file_offset().map(|f| f.file()),
            Backing::Heap(_) => None,
        }
    }

    /// Maps `len` bytes of the region's file from offset `off` a second
    /// time, at address `addr` if it is free (else wherever the kernel
    /// puts it): see [`FixedMapping`].
    pub fn map_part(&self, off: usize, len: usize, addr: usize) -> Result<FixedMapping> {
        let file = self
            .file()
            .ok_or_else(|| Error::BadLayout("heap memory has no file to map".into()))?;
        if off.checked_add(len).is_none_or(|end| end > self.len) || len == 0 {
            return Err(Error::BadLayout(format!(
                "part {off}+{len} of {} bytes",
                self.len
            )));
        }
        // Below the mapping's length, so within off_t.
        let file_off = libc::off_t::try_from(off)
            .map_err(|_| Error::BadLayout(format!("part offset {off} past off_t")))?;
        let flags = libc::MAP_SHARED
            | if addr != 0 {
                libc::MAP_FIXED_NOREPLACE
            } else {
                0
            };
        // SAFETY: a new shared mapping of our own file's pages, at an address
        // the kernel checks is free (MAP_FIXED_NOREPLACE) or picks itself;
        // nothing in this process refers to that address range yet.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_fd().as_raw_fd(),
                file_off,
            )
        };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            // Taken (or no fixed placement on this kernel): anywhere will do.
            if addr != 0 {
                return self.map_part(off, len, 0);
            }
            return Err(Error::io("mmap of the pinned pool", e));
        }
        Ok(FixedMapping {
            addr: p as usize,
            len,
        })
    }

    /// Replaces the `len` bytes of this process's memory at `addr` with a
    /// mapping of the region's file from offset `off`.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be memory of the caller's that may be
    /// replaced (its contents are lost; the caller copies what it needs
    /// first), page-aligned, and referred to by nothing that would break.
    pub unsafe fn map_part_over(&self, off: usize, len: usize, addr: usize) -> Result<()> {
        let file = self
            .file()
            .ok_or_else(|| Error::BadLayout("heap memory has no file to map".into()))?;
        if off.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::BadLayout(format!(
                "part {off}+{len} of {} bytes",
                self.len
            )));
        }
        // Below the mapping's length, so within off_t.
        let file_off = libc::off_t::try_from(off)
            .map_err(|_| Error::BadLayout(format!("part offset {off} past off_t")))?;
        // SAFETY: per this function's contract, the range may be replaced.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_fd().as_raw_fd(),
                file_off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::io(
                "mmap over registered memory",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }
}

impl SharedMemory {
    /// Copies the caller's pages `[addr, addr + len)` to `copy_to` (the
    /// caller's own mapping of `[off, off + len)` of the region) and maps
    /// that part of the region over them, with nothing written to the
    /// calling thread's stack in between: on x86-64 the copy and the
    /// `mmap` are one block of instructions using registers only, so the
    /// range may even hold the caller's live stack frames (a program that
    /// registers a buffer on its stack: every frame in it is copied as it
    /// is when mapped over). Elsewhere it is a copy and then
    /// [`SharedMemory::map_part_over`].
    ///
    /// # Safety
    /// As [`SharedMemory::map_part_over`] (page-aligned, replaceable,
    /// readable), and `copy_to` must be a writable mapping of `len` bytes of
    /// this region's part at `off`.
    pub unsafe fn copy_and_map_part_over(
        &self,
        off: usize,
        len: usize,
        addr: usize,
        copy_to: usize,
    ) -> Result<()> {
        let file = self
            .file()
            .ok_or_else(|| Error::BadLayout("heap memory has no file to map".into()))?;
        if off.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::BadLayout(format!(
                "part {off}+{len} of {} bytes",
                self.len
            )));
        }
        #[cfg(target_arch = "x86_64")]
        {
            // An open descriptor is never negative.
            let fd = usize::try_from(file.as_fd().as_raw_fd())
                .map_err(|_| Error::BadLayout("negative file descriptor".into()))?;
            let ret: isize;
            // SAFETY: per this function's contract: `[addr, addr + len)` is
            // readable and may be replaced, `copy_to` is writable for `len`
            // bytes (a different mapping of the same file part); the block
            // touches no memory but those two ranges and no stack (`rep
            // movsb` then the mmap system call, registers only).
            unsafe {
                std::arch::asm!(
                    "rep movsb",
                    "mov rdi, {a}",
                    "mov rsi, {n}",
                    "mov eax, 9",
                    "syscall",
                    a = in(reg) addr,
                    n = in(reg) len,
                    inout("rdi") copy_to => _,
                    inout("rsi") addr => _,
                    inout("rcx") len => _,
                    in("rdx") (libc::PROT_READ | libc::PROT_WRITE) as usize,
                    in("r10") (libc::MAP_SHARED | libc::MAP_FIXED) as usize,
                    in("r8") fd,
                    in("r9") off,
                    lateout("rax") ret,
                    lateout("r11") _,
                    options(nostack)
                );
            }
            if ret < 0 {
                return Err(Error::io("mmap over registered memory", errno_of(ret)));
            }
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = file;
            // SAFETY: per this function's contract.
            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, copy_to as *mut u8, len) };
            // SAFETY: per this function's contract.
            unsafe { self.map_part_over(off, len, addr) }
        }
    }
}

/// Maps fresh private pages over `[addr, addr + len)` holding the `len`
/// bytes at `from` (registered memory given back to the program: the pool's
/// pages mapped over it are replaced by pages of its own with what they
/// hold), with nothing written to the calling thread's stack in between (on
/// x86-64 one block of instructions using registers only), since the range
/// may hold the caller's live stack frames.
///
/// # Safety
/// `[addr, addr + len)` is page-aligned memory of the caller's that may be
/// replaced, and `from` is readable for `len` bytes in another mapping.
pub unsafe fn map_private_copy_over(addr: usize, len: usize, from: usize) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    {
        let ret: isize;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED) as usize;
        // SAFETY: per this function's contract: the mmap replaces only
        // `[addr, addr + len)`; the copy reads `from` and writes the fresh
        // pages; registers only, no stack.
        unsafe {
            std::arch::asm!(
                "syscall",
                "test rax, rax",
                "js 2f",
                "mov rcx, rsi",
                "mov rsi, {from}",
                "rep movsb",
                "2:",
                from = in(reg) from,
                inout("rax") 9isize => ret,
                inout("rdi") addr => _,
                inout("rsi") len => _,
                in("rdx") (libc::PROT_READ | libc::PROT_WRITE) as usize,
                in("r10") flags,
                in("r8") usize::MAX,
                in("r9") 0usize,
                out("rcx") _,
                out("r11") _,
                options(nostack)
            );
        }
        if ret < 0 {
            return Err(Error::io(
                "mmap of private pages over registered memory",
                errno_of(ret),
            ));
        }
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let keep = {
            let mut v = vec![0u8; len];
            // SAFETY: per this function's contract.
            unsafe { std::ptr::copy_nonoverlapping(from as *const u8, v.as_mut_ptr(), len) };
            v
        };
        // SAFETY: per this function's contract, the range may be replaced.
        let m = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if m == libc::MAP_FAILED {
            return Err(Error::io(
                "mmap of private pages over registered memory",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: the fresh pages are ours and `len` long.
        unsafe { std::ptr::copy_nonoverlapping(keep.as_ptr(), addr as *mut u8, len) };
        Ok(())
    }
}

impl SharedMemory {
    /// Makes this mapping the memory of `to` (another host's region, that
    /// the caller filled): `to`'s file is mapped over every shared mapping of this
    /// mapping's file in the process, each at its own address and file
    /// offset (the channels' mappings, the pinned pool's, memory registered
    /// over), and this mapping's descriptor becomes `to`'s. What a guest's
    /// RAM is to it after QEMU moved its VM, for a guest process on the host
    /// itself. Returns how many mappings were replaced.
    ///
    /// # Safety
    /// No thread reads or writes any mapping of this file meanwhile, and
    /// `to` holds what they should read from now on; the descriptor this
    /// mapping holds is referred to by nothing else.
    pub unsafe fn follow(&self, to: &SharedMemory) -> Result<usize> {
        let (Some(from), Some(to)) = (self.file(), to.file()) else {
            return Err(Error::BadLayout("heap memory has no file to follow".into()));
        };
        let to_len = to
            .metadata()
            .map_err(|e| Error::io("fstat of the region to follow", e))?
            .len();
        if to_len != self.len as u64 {
            return Err(Error::BadLayout(format!(
                "a region of {to_len} bytes to follow, this one has {}",
                self.len
            )));
        }
        let mut moved = 0;
        for m in mappings_of(from)? {
            if m.offset
                .checked_add(m.len as u64)
                .is_none_or(|end| end > to_len)
            {
                return Err(Error::BadLayout(format!(
                    "a mapping of {} bytes at offset {} past the region",
                    m.len, m.offset
                )));
            }
            let off = libc::off_t::try_from(m.offset)
                .map_err(|_| Error::BadLayout(format!("offset {} past off_t", m.offset)))?;
            // SAFETY: per this function's contract nothing uses the range
            // meanwhile; the new pages are `to`'s at the same offset, within
            // its length (checked above), with the same protection.
            let p = unsafe {
                libc::mmap(
                    m.addr as *mut libc::c_void,
                    m.len,
                    m.prot,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    to.as_raw_fd(),
                    off,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(Error::io(
                    "mmap of the followed region",
                    std::io::Error::last_os_error(),
                ));
            }
            moved += 1;
        }
        // SAFETY: onto our own descriptor, which per the contract nothing
        // else refers to: from here on it is `to`'s file.
        unsafe { dup_onto(to, from)? };
        Ok(moved)
    }
}

/// Makes the descriptor `onto` refer to `from`'s file (a doorbell that
/// now rings another host's eventfd).
///
/// # Safety
/// Whoever owns `onto` means it to be `from`'s file from now on, and no
/// thread waits on it meanwhile.
pub unsafe fn dup_onto(from: &impl AsFd, onto: &impl AsFd) -> Result<()> {
    let (a, b) = (from.as_fd().as_raw_fd(), onto.as_fd().as_raw_fd());
    // SAFETY: both descriptors are open; per the contract `onto`'s owner
    // wants it replaced.
    if unsafe { libc::dup3(a, b, libc::O_CLOEXEC) } < 0 {
        return Err(Error::io("dup3", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// One shared mapping of a file in this process.
#[derive(Debug, PartialEq, Eq)]
struct Mapping {
    addr: usize,
    len: usize,
    offset: u64,
    prot: libc::c_int,
}

/// The shared mappings of `file` in this process, from `/proc/self/maps`.
fn mappings_of(file: &File) -> Result<Vec<Mapping>> {
    use std::os::unix::fs::MetadataExt;
    let meta = file
        .metadata()
        .map_err(|e| Error::io("fstat of the region", e))?;
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| Error::io("reading /proc/self/maps", e))?;
    let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
    Ok(maps
        .lines()
        .filter_map(|l| parse_mapping(l, dev, meta.ino()))
        .collect())
}

/// A line of `/proc/self/maps` (`start-end perms offset major:minor inode
/// path`, numbers in hex but the inode), if it maps inode `ino` of device
/// `dev` shared.
fn parse_mapping(line: &str, dev: (u32, u32), ino: u64) -> Option<Mapping> {
    let mut f = line.split_ascii_whitespace();
    let (range, perms, offset, device, inode) =
        (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let (maj, min) = device.split_once(':')?;
    let same = u32::from_str_radix(maj, 16).ok()? == dev.0
        && u32::from_str_radix(min, 16).ok()? == dev.1
        && inode.parse::<u64>().ok()? == ino;
    if !same || perms.as_bytes().get(3) != Some(&b's') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let (start, end) = (
        usize::from_str_radix(start, 16).ok()?,
        usize::from_str_radix(end, 16).ok()?,
    );
    let mut prot = libc::PROT_NONE;
    if perms.starts_with('r') {
        prot |= libc::PROT_READ;
    }
    if perms.as_bytes().get(1) == Some(&b'w') {
        prot |= libc::PROT_WRITE;
    }
    Some(Mapping {
        addr: start,
        len: end.checked_sub(start)?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        prot,
    })
}

/// A part of the region mapped a second time, at an address of its own
/// (the pinned pool at the address the GPU knows it by). Unmapped on drop.
#[derive(Debug)]
pub struct FixedMapping {
    addr: usize,
    len: usize,
}

impl FixedMapping {
    /// Where it is mapped.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mapping as a volatile slice.
    pub fn slice(&self) -> VolatileSlice<'_> {
        // SAFETY: a live shared mapping of `len` bytes that this value owns
        // and unmaps only on drop; the slice borrows `self`. All access
        // through it is volatile.
        unsafe { VolatileSlice::new(self.addr as *mut u8, self.len) }
    }
}

impl Drop for FixedMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; slices of it borrowed
        // `self` and are gone.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// The error of a raw system call that returned `ret` (negative: `-errno`).
#[cfg(target_arch = "x86_64")]
fn errno_of(ret: isize) -> std::io::Error {
    // The kernel returns -4095..=-1; anything else is not an errno.
    std::io::Error::from_raw_os_error(i32::try_from(-ret).unwrap_or(libc::EINVAL))
}

fn extend<'a, T>(r: &T, _owner: &'a SharedMemory) -> &'a T {
    // SAFETY: `r` points into the memory owned by `_owner` (it came from
    // `_owner.slice()`), which stays mapped for as long as `_owner` is
    // borrowed, i.e. for `'a`.
    unsafe { &*(r as *const T) }
}

/// Creates an anonymous shared-memory file of `len` bytes, sealed against
/// shrinking and growing, so that no peer holding the fd can truncate it
/// under the host's mapping (which would turn host reads into SIGBUS).
pub fn create_memfd(name: &str, len: usize) -> Result<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
        .map_err(|e| Error::io("memfd_create", e))?;
    let size = i64::try_from(len)
        .map_err(|_| Error::BadLayout(format!("memfd of {len} bytes past off_t")))?;
    nix::unistd::ftruncate(fd.as_fd(), size).map_err(|e| Error::io("ftruncate", e))?;
    fcntl(
        fd.as_fd(),
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map_err(|e| Error::io("sealing memfd", e))?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn heap_atomics_and_bounds() {
        let m = SharedMemory::heap(4096);
        m.atomic_u32(8).unwrap().store(7, Ordering::Relaxed);
        assert_eq!(m.atomic_u32(8).unwrap().load(Ordering::Relaxed), 7);
        assert!(m.atomic_u32(4094).is_err());
        assert!(m.atomic_u32(2).is_err(), "misaligned access must fail");
        assert!(m.atomic_u64(4096).is_err());
    }

    #[test]
    fn a_maps_line_is_read_only_for_the_file_and_shared() {
        let line = "7f00a000-7f00c000 rw-s 00200000 00:01 4242   /memfd:vm1 (deleted)";
        let m = parse_mapping(line, (0, 1), 4242).unwrap();
        assert_eq!(
            m,
            Mapping {
                addr: 0x7f00_a000,
                len: 0x2000,
                offset: 0x20_0000,
                prot: libc::PROT_READ | libc::PROT_WRITE
            }
        );
        assert!(parse_mapping(line, (0, 1), 4243).is_none(), "another inode");
        assert!(
            parse_mapping(line, (0, 2), 4242).is_none(),
            "another device"
        );
        let private = line.replace("rw-s", "rw-p");
        assert!(parse_mapping(&private, (0, 1), 4242).is_none(), "private");
        assert!(parse_mapping("7f00c000-7f00a000 rw-s 0 00:01 4242", (0, 1), 4242).is_none());
        assert!(parse_mapping("garbage", (0, 1), 4242).is_none());
    }

    #[cfg(not(miri))]
    #[test]
    fn following_maps_the_new_file_under_every_mapping_of_the_old() {
        let old = create_memfd("old", 16384).unwrap();
        let new = create_memfd("new", 16384).unwrap();
        let a = SharedMemory::map(old.try_clone().unwrap(), 16384).unwrap();
        let part = a.map_part(8192, 4096, 0).unwrap();
        a.atomic_u64(8192).unwrap().store(1, Ordering::SeqCst);
        let b = SharedMemory::map(new.try_clone().unwrap(), 16384).unwrap();
        b.atomic_u64(8192).unwrap().store(2, Ordering::SeqCst);
        drop(new);
        // SAFETY: nothing else in this test uses `a` or `part` meanwhile.
        let moved = unsafe { a.follow(&b) }.unwrap();
        assert_eq!(moved, 2, "the whole mapping and the part");
        assert_eq!(a.atomic_u64(8192).unwrap().load(Ordering::SeqCst), 2);
        let word = part
            .slice()
            .get_atomic_ref::<AtomicU64>(0)
            .unwrap()
            .load(Ordering::SeqCst);
        assert_eq!(word, 2, "the second mapping follows too");
        a.atomic_u64(0).unwrap().store(9, Ordering::SeqCst);
        assert_eq!(
            b.atomic_u64(0).unwrap().load(Ordering::SeqCst),
            9,
            "shared with the new file"
        );
        let short = SharedMemory::map(create_memfd("short", 8192).unwrap(), 8192).unwrap();
        assert!(
            // SAFETY: as above.
            unsafe { a.follow(&short) }.is_err(),
            "a region of another size"
        );
        drop(old);
    }

    #[cfg(not(miri))]
    #[test]
    fn memfd_is_sealed_and_shared() {
        let fd = create_memfd("t", 8192).unwrap();
        let dup = fd.try_clone().unwrap();
        let a = SharedMemory::map(fd, 8192).unwrap();
        let b = SharedMemory::map(dup.try_clone().unwrap(), 8192).unwrap();
        a.atomic_u64(4096).unwrap().store(42, Ordering::SeqCst);
        assert_eq!(b.atomic_u64(4096).unwrap().load(Ordering::SeqCst), 42);
        let r = nix::unistd::ftruncate(dup.as_fd(), 4096);
        assert!(r.is_err(), "shrinking a sealed memfd must fail");
        assert!(
            SharedMemory::map(dup, 16384).is_err(),
            "mapping past the end must fail"
        );
    }
}
