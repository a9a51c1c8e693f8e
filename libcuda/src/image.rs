//! The extent of a module image handed over as a bare pointer, as the
//! driver itself must work it out: a fat binary wrapper (what `nvcc`'s
//! registration code passes), a fat binary, an ELF cubin, or NUL-terminated
//! PTX text.

use protocol::ImageKind;

/// `__fatBinC_Wrapper_t`'s magic; its `data` field points to a fat binary.
const WRAPPER_MAGIC: u32 = 0x4662_43b1;
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Longest image we will scan for a terminating NUL.
const MAX_PTX: usize = 256 << 20;

/// Where an image's bytes are: kind, start, length.
pub type Extent = (ImageKind, *const u8, usize);

/// Reads the kind and extent of the image at `p`.
///
/// # Safety
/// `p` must point to a readable module image (what cuModuleLoadData requires).
pub unsafe fn probe(p: *const u8) -> Option<Extent> {
    // SAFETY: every image kind is at least 16 bytes long (the caller's contract).
    let head = unsafe { std::slice::from_raw_parts(p, 16) };
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    if word(0) == WRAPPER_MAGIC {
        // Version 1 points to one fat binary. Version 2 (programs built with
        // relocatable device code) points to the device-linked fat binary,
        // and also lists the objects before linking, which only a JIT link
        // for another architecture would need.
        if !matches!(word(4), 1 | 2) {
            return None;
        }
        // SAFETY: a wrapper is {magic, version, data pointer, filename} (24 bytes).
        let data = unsafe { (p.wrapping_add(8) as *const *const u8).read_unaligned() };
        if data.is_null() || word_at(data) != FATBIN_MAGIC {
            return None;
        }
        // SAFETY: the wrapper's data is a fat binary (the caller's contract).
        return unsafe { probe(data) };
    }
    if word(0) == FATBIN_MAGIC {
        let hsize = u16::from_le_bytes([head[6], head[7]]) as usize;
        let fsize = u64::from_le_bytes(head[8..16].try_into().ok()?) as usize;
        return Some((ImageKind::Cubin, p, hsize.checked_add(fsize)?));
    }
    if head[..4] == *b"\x7fELF" {
        // SAFETY: a 64-bit ELF header is 64 bytes long.
        let eh = unsafe { std::slice::from_raw_parts(p, 64) };
        let shoff = u64::from_le_bytes(eh[0x28..0x30].try_into().ok()?) as usize;
        let shentsize = u16::from_le_bytes([eh[0x3a], eh[0x3b]]) as usize;
        let shnum = u16::from_le_bytes([eh[0x3c], eh[0x3d]]) as usize;
        return Some((
            ImageKind::Cubin,
            p,
            shoff.checked_add(shentsize.checked_mul(shnum)?)?,
        ));
    }
    // PTX: text up to the terminating NUL.
    // SAFETY: PTX passed to the driver is NUL-terminated (the caller's contract).
    let len = unsafe { libc::strnlen(p as *const libc::c_char, MAX_PTX) };
    Some((ImageKind::Ptx, p, len))
}

/// The first word of an image.
fn word_at(p: *const u8) -> u32 {
    // SAFETY: called on an image pointer (at least 16 readable bytes, the
    // contract of `probe`).
    unsafe { (p as *const u32).read_unaligned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapper_leads_to_its_fat_binary() {
        let mut fatbin = [0u8; 16 + 40];
        fatbin[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        fatbin[4..6].copy_from_slice(&1u16.to_le_bytes());
        fatbin[6..8].copy_from_slice(&16u16.to_le_bytes());
        fatbin[8..16].copy_from_slice(&40u64.to_le_bytes());
        let mut wrapper = [0u8; 24];
        wrapper[..4].copy_from_slice(&WRAPPER_MAGIC.to_le_bytes());
        wrapper[4..8].copy_from_slice(&1u32.to_le_bytes());
        wrapper[8..16].copy_from_slice(&(fatbin.as_ptr() as u64).to_le_bytes());
        // SAFETY: both images are complete and alive.
        let (kind, start, len) = unsafe { probe(wrapper.as_ptr()) }.unwrap();
        assert_eq!((kind, start, len), (ImageKind::Cubin, fatbin.as_ptr(), 56));
        wrapper[4] = 2;
        // SAFETY: as above.
        assert_eq!(unsafe { probe(wrapper.as_ptr()) }.unwrap().2, 56);
        wrapper[4] = 3;
        // SAFETY: as above.
        assert!(unsafe { probe(wrapper.as_ptr()) }.is_none());
        let ptx = b".version 8.0\n.target sm_90\0";
        // SAFETY: NUL-terminated text.
        let (kind, _, len) = unsafe { probe(ptx.as_ptr()) }.unwrap();
        assert_eq!((kind, len), (ImageKind::Ptx, ptx.len() - 1));
    }
}
