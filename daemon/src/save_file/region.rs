//! A region in a save file or a handover, in blocks: most of a VM's
//! region is zero (arenas no transfer reached, the pinned pool's free
//! pages), so a block of zeros is one marker byte and nothing more.
//!
//! ```text
//! per block of BLOCK bytes (the last one shorter where the region ends):
//!   0                  all zero
//!   1 | BLOCK bytes    its bytes
//! ```

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

/// Bytes of a block.
pub const BLOCK: usize = 64 << 10;
const ZERO: u8 = 0;
const BYTES: u8 = 1;

/// The length of the block at `at` of a region of `len` bytes.
fn block_len(len: u64, at: u64) -> usize {
    usize::try_from((len - at).min(BLOCK as u64)).unwrap_or(BLOCK)
}

fn is_zero(b: &[u8]) -> bool {
    // OR-folded in pieces the compiler vectorizes, stopping at the first
    // piece that is not zero.
    b.chunks(64).all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0)
}

/// Writes the first `len` bytes of `fd` (read at offsets: the region's fd
/// shares its file offset with the workers') to `w` in blocks.
pub fn write(fd: &OwnedFd, len: u64, w: &mut impl Write) -> std::io::Result<()> {
    let f = File::from(fd.try_clone()?);
    let mut buf = vec![0u8; BLOCK];
    let mut at = 0u64;
    while at < len {
        let b = &mut buf[..block_len(len, at)];
        f.read_exact_at(b, at)?;
        if is_zero(b) {
            w.write_all(&[ZERO])?;
        } else {
            w.write_all(&[BYTES])?;
            w.write_all(b)?;
        }
        at += b.len() as u64;
    }
    Ok(())
}

/// Reads a region of `len` bytes in blocks from `r` into `out` (a new,
/// empty memfd: zero blocks are left as holes). A marker other than the
/// two, or a short stream, is an error.
pub fn read(r: &mut impl Read, len: u64, out: &File) -> std::io::Result<()> {
    out.set_len(len)?;
    let mut buf = vec![0u8; BLOCK];
    let mut at = 0u64;
    while at < len {
        let b = &mut buf[..block_len(len, at)];
        let mut marker = [0u8];
        r.read_exact(&mut marker)?;
        match marker[0] {
            ZERO => {}
            BYTES => {
                r.read_exact(b)?;
                out.write_all_at(b, at)?;
            }
            m => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a region block at {at} marked {m}"),
                ))
            }
        }
        at += b.len() as u64;
    }
    Ok(())
}

/// Makes the first `len` bytes of `to` (a VM's region, holding QEMU's
/// copy) those of `from`, writing only the blocks that differ: most are
/// zero on both sides, and a block written needlessly costs a page
/// allocated.
pub fn write_over(from: &OwnedFd, to: &File, len: u64) -> std::io::Result<u64> {
    let from = File::from(from.try_clone()?);
    let (mut a, mut b) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
    let (mut at, mut written) = (0u64, 0u64);
    while at < len {
        let n = block_len(len, at);
        from.read_exact_at(&mut a[..n], at)?;
        to.read_exact_at(&mut b[..n], at)?;
        if a[..n] != b[..n] {
            to.write_all_at(&a[..n], at)?;
            written += n as u64;
        }
        at += n as u64;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd_with(bytes: &[u8]) -> OwnedFd {
        let fd = crate::save_file::memfd("t").unwrap();
        File::from(fd.try_clone().unwrap())
            .write_all_at(bytes, 0)
            .unwrap();
        fd
    }

    #[test]
    fn zero_blocks_travel_as_one_byte_and_come_back_whole() {
        let len = 3 * BLOCK + 100;
        let mut region = vec![0u8; len];
        region[BLOCK + 7] = 9;
        region[len - 1] = 4;
        let mut stream = Vec::new();
        write(&memfd_with(&region), len as u64, &mut stream).unwrap();
        assert_eq!(
            stream.len(),
            1 + (1 + BLOCK) + 1 + (1 + 100),
            "two blocks of zeros, one byte each"
        );
        let out = File::from(crate::save_file::memfd("o").unwrap());
        read(&mut stream.as_slice(), len as u64, &out).unwrap();
        let mut back = vec![1u8; len];
        out.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, region);
    }

    #[test]
    fn a_bad_marker_or_a_short_stream_is_refused() {
        let out = File::from(crate::save_file::memfd("o").unwrap());
        let e = read(&mut [7u8].as_slice(), BLOCK as u64, &out).unwrap_err();
        assert!(e.to_string().contains("marked 7"), "{e}");
        let short = [BYTES, 1, 2, 3];
        assert!(read(&mut short.as_slice(), BLOCK as u64, &out).is_err());
        assert!(read(&mut [].as_slice(), 1, &out).is_err());
    }

    #[test]
    fn writing_over_writes_only_what_differs_zeros_included() {
        let len = 4 * BLOCK;
        let mut want = vec![0u8; len];
        want[5] = 1;
        let mut there = vec![0u8; len];
        there[2 * BLOCK + 3] = 8; // QEMU's copy, stale where the source is zero now
        let to = File::from(memfd_with(&there));
        let written = write_over(&memfd_with(&want), &to, len as u64).unwrap();
        assert_eq!(written, 2 * BLOCK as u64);
        let mut back = vec![1u8; len];
        to.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, want);
    }
}
