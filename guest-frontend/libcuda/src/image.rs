//! The length of a module image handed over as a bare pointer, as the
//! driver itself must work it out: a fatbin header, an ELF cubin, or
//! NUL-terminated PTX text.

use protocol::ImageKind;

const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Longest image we will scan for a terminating NUL.
const MAX_PTX: usize = 256 << 20;

/// Reads kind and length of the image at `p`.
///
/// # Safety
/// `p` must point to a readable module image (what cuModuleLoadData requires).
pub unsafe fn probe(p: *const u8) -> Option<(ImageKind, usize)> {
    // SAFETY: every image kind is at least 16 bytes long (the caller's contract).
    let head = unsafe { std::slice::from_raw_parts(p, 16) };
    if u32::from_le_bytes([head[0], head[1], head[2], head[3]]) == FATBIN_MAGIC {
        let hsize = u16::from_le_bytes([head[6], head[7]]) as usize;
        let fsize = u64::from_le_bytes(head[8..16].try_into().ok()?) as usize;
        return Some((ImageKind::Cubin, hsize.checked_add(fsize)?));
    }
    if head[..4] == *b"\x7fELF" {
        // SAFETY: a 64-bit ELF header is 64 bytes long.
        let eh = unsafe { std::slice::from_raw_parts(p, 64) };
        let shoff = u64::from_le_bytes(eh[0x28..0x30].try_into().ok()?) as usize;
        let shentsize = u16::from_le_bytes([eh[0x3a], eh[0x3b]]) as usize;
        let shnum = u16::from_le_bytes([eh[0x3c], eh[0x3d]]) as usize;
        return Some((
            ImageKind::Cubin,
            shoff.checked_add(shentsize.checked_mul(shnum)?)?,
        ));
    }
    // PTX: text up to the terminating NUL.
    // SAFETY: PTX passed to the driver is NUL-terminated (the caller's contract).
    let len = unsafe { libc::strnlen(p as *const libc::c_char, MAX_PTX) };
    Some((ImageKind::Ptx, len))
}
