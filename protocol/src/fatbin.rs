//! NVIDIA's fat binary container, as `nvcc` embeds it in programs: a
//! 16-byte header (magic `0xBA55ED50`, version, header size, size of what
//! follows) and entries, each a header (kind, its own size, the payload's
//! size, compressed size, architecture, flags, uncompressed size) and a
//! payload: PTX text or an ELF cubin, raw, LZ4-compressed (flag `0x2000`)
//! or ZSTD-compressed (flag `0x8000`).
//!
//! The host reads the containers guests send when it must see inside them
//! (the `sim` executor runs the PTX). Every offset and size is checked and
//! decompression is bounded: a hostile image is an error, never a panic or
//! an allocation past [`crate::MAX_IMAGE`].

use std::io::Read;

use crate::ProtoError;

/// The container's magic.
pub const MAGIC: u32 = 0xBA55_ED50;
const LZ4: u64 = 0x2000;
const ZSTD: u64 = 0x8000;

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// PTX text.
    Ptx,
    /// An ELF cubin (machine code for one architecture).
    Elf,
    /// Another kind (skipped).
    Other(u16),
}

/// One entry, its payload decompressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What it holds.
    pub kind: Kind,
    /// The SM architecture it is for (e.g. 90).
    pub arch: u32,
    /// The payload (PTX without trailing NULs).
    pub payload: Vec<u8>,
}

fn bad(why: impl Into<String>) -> ProtoError {
    ProtoError::BadField {
        field: "fatbin",
        why: why.into(),
    }
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, ProtoError> {
    let s = b.get(at..at + 2).ok_or_else(|| bad("truncated"))?;
    Ok(u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, ProtoError> {
    let s = b.get(at..at + 4).ok_or_else(|| bad("truncated"))?;
    Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, ProtoError> {
    let s = b.get(at..at + 8).ok_or_else(|| bad("truncated"))?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_le_bytes(a))
}

/// Whether `image` starts like a fat binary container.
pub fn is_fatbin(image: &[u8]) -> bool {
    u32_at(image, 0).is_ok_and(|m| m == MAGIC)
}

/// The entries of the container at the start of `image`, decompressed.
pub fn entries(image: &[u8]) -> Result<Vec<Entry>, ProtoError> {
    if !is_fatbin(image) {
        return Err(bad("not a fat binary"));
    }
    let header = usize::from(u16_at(image, 6)?);
    let size = usize::try_from(u64_at(image, 8)?).map_err(|_| bad("size"))?;
    let end = header
        .checked_add(size)
        .filter(|&e| e <= image.len() && header >= 16)
        .ok_or_else(|| bad("container larger than the image"))?;
    let mut out = Vec::new();
    let mut total = 0u64;
    let mut at = header;
    while at < end {
        let e = &image[at..end];
        let kind = match u16_at(e, 0)? {
            1 => Kind::Ptx,
            2 => Kind::Elf,
            k => Kind::Other(k),
        };
        let hsize = u32_at(e, 4)? as usize;
        let psize = usize::try_from(u64_at(e, 8)?).map_err(|_| bad("payload size"))?;
        if hsize < 64 {
            return Err(bad(format!("entry header of {hsize} bytes")));
        }
        let payload = hsize
            .checked_add(psize)
            .and_then(|pend| e.get(hsize..pend))
            .ok_or_else(|| bad("entry larger than the container"))?;
        let compressed = u32_at(e, 16)? as usize;
        let arch = u32_at(e, 28)?;
        let flags = u64_at(e, 40)?;
        let full = u64_at(e, 56)?;
        let bytes = if flags & (LZ4 | ZSTD) != 0 {
            total = total.saturating_add(full);
            if total > crate::MAX_IMAGE {
                return Err(bad("decompresses past the largest image"));
            }
            let src = payload
                .get(..compressed)
                .ok_or_else(|| bad("compressed size past the payload"))?;
            let full = usize::try_from(full).map_err(|_| bad("uncompressed size"))?;
            decompress(src, full, flags & ZSTD != 0)?
        } else {
            payload.to_vec()
        };
        let mut bytes = bytes;
        if kind == Kind::Ptx {
            while bytes.last() == Some(&0) {
                bytes.pop();
            }
        }
        out.push(Entry {
            kind,
            arch,
            payload: bytes,
        });
        at += hsize + psize;
    }
    Ok(out)
}

/// Decompresses `src` into exactly `len` bytes.
fn decompress(src: &[u8], len: usize, zstd: bool) -> Result<Vec<u8>, ProtoError> {
    let out = if zstd {
        let mut d =
            ruzstd::decoding::StreamingDecoder::new(src).map_err(|e| bad(format!("zstd: {e}")))?;
        let mut v = Vec::new();
        (&mut d)
            .take(len as u64 + 1)
            .read_to_end(&mut v)
            .map_err(|e| bad(format!("zstd: {e}")))?;
        v
    } else {
        lz4_flex::block::decompress(src, len).map_err(|e| bad(format!("lz4: {e}")))?
    };
    if out.len() != len {
        return Err(bad(format!(
            "decompressed {} bytes, the header says {len}",
            out.len()
        )));
    }
    Ok(out)
}

/// The PTX of the highest architecture in a fat binary, if it holds any.
pub fn best_ptx(image: &[u8]) -> Result<Option<Vec<u8>>, ProtoError> {
    Ok(entries(image)?
        .into_iter()
        .filter(|e| e.kind == Kind::Ptx)
        .max_by_key(|e| e.arch)
        .map(|e| e.payload))
}

/// Builds a container (for tests and tools): each entry as (kind, arch,
/// payload), stored raw.
pub fn build(entries: &[(Kind, u32, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (kind, arch, payload) in entries {
        let k: u16 = match kind {
            Kind::Ptx => 1,
            Kind::Elf => 2,
            Kind::Other(k) => *k,
        };
        let padded = payload.len().next_multiple_of(8);
        let mut h = [0u8; 64];
        h[0..2].copy_from_slice(&k.to_le_bytes());
        h[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
        h[4..8].copy_from_slice(&64u32.to_le_bytes());
        h[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
        h[28..32].copy_from_slice(&arch.to_le_bytes());
        h[40..48].copy_from_slice(&0x11u64.to_le_bytes());
        body.extend_from_slice(&h);
        body.extend_from_slice(payload);
        body.resize(body.len() + padded - payload.len(), 0);
    }
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn entries_round_trip_and_ptx_loses_its_nuls() {
        let img = build(&[
            (Kind::Elf, 90, b"\x7fELF-not-really"),
            (Kind::Ptx, 80, b".version 8.0\0"),
            (Kind::Ptx, 90, b".version 9.0\0\0"),
        ]);
        let e = entries(&img).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].kind, Kind::Elf);
        assert_eq!(&e[0].payload[..16], b"\x7fELF-not-really\0");
        assert_eq!(best_ptx(&img).unwrap().unwrap(), b".version 9.0");
    }

    #[test]
    fn lz4_payloads_are_decompressed() {
        let text = b".version 9.0 .target sm_90 .version 9.0 .target sm_90 ".repeat(8);
        let packed = lz4_flex::block::compress(&text);
        let mut img = build(&[(Kind::Ptx, 90, &packed)]);
        // Mark the entry compressed: its sizes and flags.
        let e = 16;
        img[e + 16..e + 20].copy_from_slice(&u32::try_from(packed.len()).unwrap().to_le_bytes());
        img[e + 40..e + 48].copy_from_slice(&(0x11u64 | LZ4).to_le_bytes());
        img[e + 56..e + 64].copy_from_slice(&(text.len() as u64).to_le_bytes());
        assert_eq!(best_ptx(&img).unwrap().unwrap(), text);
        // A lying uncompressed size is an error.
        img[e + 56..e + 64].copy_from_slice(&(text.len() as u64 + 5).to_le_bytes());
        assert!(entries(&img).is_err());
    }

    #[test]
    fn sizes_past_the_image_are_errors() {
        let mut img = build(&[(Kind::Ptx, 90, b"x")]);
        img[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(entries(&img).is_err());
        let mut img = build(&[(Kind::Ptx, 90, b"x")]);
        img[16 + 8..16 + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(entries(&img).is_err());
        assert!(entries(b"nope").is_err());
    }

    proptest! {
        #[test]
        fn parsing_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..400), cut in 0usize..400) {
            let mut img = build(&[(Kind::Ptx, 90, b".version 9.0")]);
            img.extend_from_slice(&bytes);
            let n = cut.min(img.len());
            let _ = entries(&img[..n]);
            let mut garbage = MAGIC.to_le_bytes().to_vec();
            garbage.extend_from_slice(&bytes);
            let _ = entries(&garbage);
        }
    }
}
