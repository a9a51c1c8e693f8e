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
use std::io::{BufRead, Write};
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

/// Where the first block holding data at or past `at` starts (`at`'s
/// block if it holds any): a region's memfd never written there is a hole,
/// which reads as zeros without a page behind it. `len` if there is none
/// before it, and `at`'s block where the file cannot say (`SEEK_DATA`
/// unsupported): read then as it is.
fn next_data(f: &File, at: u64, len: u64) -> u64 {
    use std::os::fd::AsFd;
    let Ok(off) = i64::try_from(at) else {
        return at;
    };
    match nix::unistd::lseek(f.as_fd(), off, nix::unistd::Whence::SeekData) {
        Ok(d) => {
            let d = u64::try_from(d).unwrap_or(at).max(at);
            (d - d % BLOCK as u64).max(at).min(len)
        }
        // Nothing but holes from `at` to the file's end.
        Err(nix::errno::Errno::ENXIO) => len,
        Err(_) => at,
    }
}

fn is_zero(b: &[u8]) -> bool {
    // OR-folded in pieces the compiler vectorizes, stopping at the first
    // piece that is not zero.
    b.chunks(64).all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0)
}

/// What a region's blocks were, written: how many held bytes, how many
/// were read and found zero, how many were holes (not read).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Blocks {
    /// Blocks sent with their bytes.
    pub data: u64,
    /// Blocks read and found all zero.
    pub zero: u64,
    /// Blocks with no page behind them, passed over unread.
    pub holes: u64,
}

/// Writes the first `len` bytes of `fd` (read at offsets: the region's fd
/// shares its file offset with the workers') to `w` in blocks; what they
/// were.
pub fn write(fd: &OwnedFd, len: u64, w: &mut impl Write) -> std::io::Result<Blocks> {
    let f = File::from(fd.try_clone()?);
    let mut buf = vec![0u8; BLOCK];
    let mut seen = Blocks::default();
    let mut at = 0u64;
    // Blocks before this hold no data: zeros, not read.
    let mut data = 0u64;
    while at < len {
        if at >= data {
            data = next_data(&f, at, len);
        }
        let n = block_len(len, at);
        if at + (n as u64) <= data {
            w.write_all(&[ZERO])?;
            seen.holes += 1;
            at += n as u64;
            continue;
        }
        let b = &mut buf[..n];
        f.read_exact_at(b, at)?;
        if is_zero(b) {
            w.write_all(&[ZERO])?;
            seen.zero += 1;
        } else {
            w.write_all(&[BYTES])?;
            w.write_all(b)?;
            seen.data += 1;
        }
        at += b.len() as u64;
    }
    Ok(seen)
}

/// Reads a region of `len` bytes in blocks from `r` into `out` (a new,
/// empty memfd: zero blocks are left as holes). A marker other than the
/// two, or a short stream, is an error.
pub fn read(r: &mut impl BufRead, len: u64, out: &File) -> std::io::Result<()> {
    out.set_len(len)?;
    let mut at = 0u64;
    while at < len {
        let n = block_len(len, at);
        let mut marker = [0u8];
        r.read_exact(&mut marker)?;
        match marker[0] {
            ZERO => {}
            BYTES => pass(r, n as u64, out, at)?,
            m => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a region block at {at} marked {m}"),
                ))
            }
        }
        at += n as u64;
    }
    Ok(())
}

/// Writes the next `len` bytes of `r` into `out` at `at`, from `r`'s own
/// buffer (no copy of ours). A short stream is `UnexpectedEof`.
pub fn pass(r: &mut impl BufRead, len: u64, out: &File, mut at: u64) -> std::io::Result<()> {
    let mut left = len;
    while left > 0 {
        let got = r.fill_buf()?;
        if got.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let k = got.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        out.write_all_at(&got[..k], at)?;
        r.consume(k);
        at += k as u64;
        left -= k as u64;
    }
    Ok(())
}

/// Makes the first `len` bytes of `to` (a VM's region, holding QEMU's
/// copy) those of `from`, writing only the blocks that differ: most are
/// zero on both sides, and a block written needlessly costs a page
/// allocated. Holes on both sides are passed over unread.
pub fn write_over(from: &OwnedFd, to: &File, len: u64) -> std::io::Result<u64> {
    let from = File::from(from.try_clone()?);
    let (mut a, mut b) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
    let (mut at, mut written) = (0u64, 0u64);
    let mut data = 0u64;
    while at < len {
        if at >= data {
            data = next_data(&from, at, len).min(next_data(to, at, len));
            if data > at {
                at = data;
                continue;
            }
            // Data here: look again past this block.
            data = at + 1;
        }
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
        let seen = write(&memfd_with(&region), len as u64, &mut stream).unwrap();
        let read_as_zero = Blocks {
            data: 2,
            zero: 2,
            holes: 0,
        };
        assert_eq!(seen, read_as_zero, "every page written: none a hole");
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

    /// A memfd of `len` bytes never written but at `at` (holes elsewhere).
    fn sparse(len: usize, at: &[(usize, u8)]) -> File {
        let f = File::from(crate::save_file::memfd("s").unwrap());
        f.set_len(len as u64).unwrap();
        for &(off, v) in at {
            f.write_all_at(&[v], off as u64).unwrap();
        }
        f
    }

    #[test]
    fn holes_are_zeros_in_the_stream_and_are_passed_over_writing_over() {
        let blocks = 40;
        let len = blocks * BLOCK;
        // Data in blocks 3 and 30 (the latter on a page inside the block,
        // not at its start), holes elsewhere.
        let at = [(3 * BLOCK + 9, 5u8), (30 * BLOCK + 8192 + 1, 7)];
        let from = sparse(len, &at);
        let mut stream = Vec::new();
        let seen = write(
            &OwnedFd::from(from.try_clone().unwrap()),
            len as u64,
            &mut stream,
        )
        .unwrap();
        let holes = Blocks {
            data: 2,
            zero: 0,
            holes: 38,
        };
        assert_eq!(seen, holes);
        assert_eq!(
            stream.len(),
            (blocks - 2) + 2 * (1 + BLOCK),
            "38 blocks of zeros as a byte each, two with their bytes"
        );
        let back = File::from(crate::save_file::memfd("b").unwrap());
        read(&mut stream.as_slice(), len as u64, &back).unwrap();
        let mut got = vec![1u8; len];
        back.read_exact_at(&mut got, 0).unwrap();
        let mut want = vec![0u8; len];
        for &(off, v) in &at {
            want[off] = v;
        }
        assert_eq!(got, want);
        // QEMU's copy: stale in block 10 (a hole at the source), the same
        // in block 3, a hole in block 30.
        let to = sparse(len, &[(10 * BLOCK + 4, 2), at[0]]);
        let written = write_over(&OwnedFd::from(from), &to, len as u64).unwrap();
        assert_eq!(written, 2 * BLOCK as u64, "blocks 10 and 30");
        to.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(got, want);
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
