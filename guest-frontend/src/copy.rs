//! Copying a device-to-host transfer out of the response arena.
//!
//! The worker's DMA fills the arena at 40+ GB/s; what bounds a large
//! device-to-host copy is this process copying each chunk out into the
//! caller's buffer. A plain `memcpy` first reads every destination line it
//! writes (the destination is large and not in cache): on an H100 host it
//! moved 7-9 GB/s, non-temporal stores, which write whole lines without
//! reading them, 10-12.5 GB/s (`scripts/gpu/copy_probe.c`,
//! `results/2026-11-22-h100-launch-batch.md`). Chunks of at least
//! [`STREAM_MIN`] bytes are copied with them on x86-64; smaller ones, and
//! other targets, with the ordinary copy.

use vm_memory::VolatileSlice;

/// The smallest chunk copied with non-temporal stores: below it the
/// destination may well stay in cache, where ordinary stores are faster.
pub const STREAM_MIN: usize = 64 << 10;

/// Copies `src` into `dst` (as many bytes as the shorter has).
pub fn copy_out(src: &VolatileSlice<'_>, dst: &mut [u8]) {
    let n = dst.len().min(src.len());
    #[cfg(target_arch = "x86_64")]
    if n >= STREAM_MIN {
        let guard = src.ptr_guard();
        // SAFETY: `guard` points to `src.len() >= n` readable bytes of the
        // shared mapping, alive while `guard` is; `dst` is `n` writable bytes
        // of our own memory, so the two do not overlap.
        unsafe { stream_copy(dst.as_mut_ptr(), guard.as_ptr(), n) };
        return;
    }
    src.copy_to(&mut dst[..n]);
}

/// Copies `n` bytes with SSE2 loads and non-temporal stores, then fences
/// them (so that they are ordered before whatever this thread does next).
///
/// # Safety
/// `src` must be readable and `dst` writable for `n` bytes, and the two
/// ranges must not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Up to the first 16-byte-aligned destination address the ordinary way.
    let head = dst.align_offset(16).min(n);
    // SAFETY: the first `head <= n` bytes of both ranges (the caller's promise).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut off = head;
    while n - off >= 16 {
        let s = src.wrapping_add(off) as *const __m128i;
        let d = dst.wrapping_add(off) as *mut __m128i;
        // SAFETY: [off, off + 16) lies inside `src` (the loop condition); an
        // unaligned load.
        let v = unsafe { _mm_loadu_si128(s) };
        // SAFETY: [off, off + 16) lies inside `dst`, 16-byte aligned there
        // (`off - head` is a multiple of 16).
        unsafe { _mm_stream_si128(d, v) };
        off += 16;
    }
    // SAFETY: the last `n - off` bytes of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.wrapping_add(off), dst.wrapping_add(off), n - off) };
    // SAFETY: a store fence (SSE, present on every x86-64): the streamed
    // stores are weakly ordered, this orders them before later ones.
    unsafe { _mm_sfence() };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the threshold and the 64-byte blocks, at every
    /// misalignment of either side: the bytes arrive, nothing past `n` is
    /// written.
    #[test]
    fn copies_every_byte_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..STREAM_MIN * 2 + 300)
            .map(|i| (i * 31 + 7) as u8)
            .collect();
        for len in [
            0,
            1,
            63,
            STREAM_MIN - 1,
            STREAM_MIN,
            STREAM_MIN + 1,
            STREAM_MIN + 63,
            STREAM_MIN + 64,
            STREAM_MIN * 2 + 17,
        ] {
            for s_off in [0usize, 1, 8, 15] {
                for d_off in [0usize, 3, 16, 33] {
                    let mut s = src[s_off..s_off + len].to_vec();
                    let vs = VolatileSlice::from(&mut s[..]);
                    let mut dst = vec![0xAAu8; len + d_off + 16];
                    copy_out(&vs, &mut dst[d_off..d_off + len]);
                    assert_eq!(&dst[d_off..d_off + len], &src[s_off..s_off + len]);
                    assert!(dst[..d_off].iter().all(|&b| b == 0xAA), "{len} {d_off}");
                    assert!(
                        dst[d_off + len..].iter().all(|&b| b == 0xAA),
                        "{len} {d_off}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_shorter_side_bounds_the_copy() {
        let mut s = vec![5u8; STREAM_MIN + 100];
        let vs = VolatileSlice::from(&mut s[..]);
        let mut dst = vec![0u8; STREAM_MIN + 200];
        copy_out(&vs, &mut dst);
        assert!(dst[..STREAM_MIN + 100].iter().all(|&b| b == 5));
        assert!(dst[STREAM_MIN + 100..].iter().all(|&b| b == 0));
    }
}
