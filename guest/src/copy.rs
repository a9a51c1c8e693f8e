//! Copying transfers between the caller's buffers and the arenas.
//!
//! The worker's DMA fills the response arena at about 20 GB/s; what bounds a
//! large device-to-host copy is this process copying each chunk out into the
//! caller's buffer. A plain `memcpy` first reads every destination line it
//! writes (the destination is large and not in cache): on an H100 host it
//! moved 7-9 GB/s, non-temporal stores, which write whole lines without
//! reading them, 10-12.5 GB/s (`scripts/gpu/copy_probe.c`,
//! `results/2026-11-22-h100-launch-batch.md`). Chunks of at least
//! [`STREAM_MIN`] bytes are copied with them on x86-64; smaller ones, and
//! other targets, with the ordinary copy.
//!
//! One thread's stores are still the slower stage, so a [`Copier`] splits
//! chunks of at least [`SPLIT_MIN`] bytes between the calling thread and a
//! helper thread.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vm_memory::VolatileSlice;

/// The smallest chunk copied with non-temporal stores: below it the
/// destination may well stay in cache, where ordinary stores are faster.
pub const STREAM_MIN: usize = 64 << 10;

/// Copies `src` into `dst` (as many bytes as the shorter has).
pub fn copy_out(src: &VolatileSlice<'_>, dst: &mut [u8]) {
    let n = dst.len().min(src.len());
    #[cfg(all(target_arch = "x86_64", not(miri)))]
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
// Miri runs no inline assembly: there the ordinary copy stands in.
#[cfg(all(target_arch = "x86_64", not(miri)))]
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

/// The smallest chunk split between the calling thread and the helper:
/// below it the hand-over costs more than half the copy saves.
pub const SPLIT_MIN: usize = 256 << 10;

/// How long the helper keeps looking for the next half after one, before it
/// parks: the next chunk of a large copy follows within tens of microseconds.
const HELPER_SPIN: Duration = Duration::from_micros(200);

/// States of the one job slot between the caller and the helper.
const EMPTY: u32 = 0;
const POSTED: u32 = 1;
const RUNNING: u32 = 2;
const DONE: u32 = 3;
const EXIT: u32 = 4;

/// Which way a job copies: out of the arena (non-temporal stores into our
/// memory) or into it (ordinary stores, so that the host reads it from cache).
const OUT: u32 = 0;
const IN: u32 = 1;

/// The job slot: a half of a chunk, as addresses, posted by the caller and
/// taken either by the helper or, if the helper has not started on it by the
/// time the caller finished its own half, back by the caller.
#[derive(Debug, Default)]
struct Slot {
    state: AtomicU32,
    dir: AtomicU32,
    src: AtomicPtr<u8>,
    dst: AtomicPtr<u8>,
    len: AtomicUsize,
    parked: AtomicBool,
}

/// Copies large chunks between the arena and the caller's buffers with the
/// calling thread and, where the machine has a second CPU for it, one helper
/// thread: one thread's stores move 10-12 GB/s on an H100 host, which is
/// what bounds a remoted device-to-host copy (the worker's DMA fills the
/// arena twice as fast).
///
/// The helper is started on the first chunk large enough to split. The
/// caller never waits for a helper that is not running: a half the helper
/// has not taken by the time the caller finished its own, the caller copies
/// itself (so a busy machine, or a forked child, whose helper did not come
/// along, costs nothing but the offer).
#[derive(Debug)]
pub struct Copier {
    threads: usize,
    /// The smallest chunk split ([`SPLIT_MIN`]; smaller in tests).
    split_min: usize,
    helper: Option<Helper>,
    /// Chunks split in two so far.
    splits: u64,
    /// Of those, the second halves the helper copied.
    helped: u64,
}

#[derive(Debug)]
struct Helper {
    slot: Arc<Slot>,
    thread: Option<JoinHandle<()>>,
    /// The process that started it (a forked child has no helper thread).
    pid: u32,
}

impl Default for Copier {
    fn default() -> Self {
        Copier::new(default_threads())
    }
}

/// Two threads where the process may run on four CPUs or more, else one
/// (on two CPUs shared with a host worker the helper only competes with
/// it: 1.3-1.7x slower copies with the `sim` executor on a 2-CPU machine);
/// `FAIRVGPU_COPY_THREADS` (1 or 2) overrides.
pub fn default_threads() -> usize {
    if let Some(n) = std::env::var("FAIRVGPU_COPY_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return n.clamp(1, 2);
    }
    match std::thread::available_parallelism() {
        Ok(n) if n.get() >= 4 => 2,
        _ => 1,
    }
}

impl Copier {
    /// A copier using `threads` threads (1 or 2; more count as 2).
    pub fn new(threads: usize) -> Copier {
        Copier {
            threads: threads.clamp(1, 2),
            split_min: SPLIT_MIN,
            helper: None,
            splits: 0,
            helped: 0,
        }
    }

    /// Uses `threads` threads from now on (1 or 2; a helper already
    /// started stays, idle, for a later change back).
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.clamp(1, 2);
    }

    /// How many threads copy a large chunk.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Chunks split between two threads so far, and how many of their
    /// second halves the helper copied (the rest the caller took back).
    pub fn split_counts(&self) -> (u64, u64) {
        (self.splits, self.helped)
    }

    /// Copies `src` (arena) into `dst` (as many bytes as the shorter has).
    pub fn copy_out(&mut self, src: &VolatileSlice<'_>, dst: &mut [u8]) {
        let n = dst.len().min(src.len());
        if n < self.split_min || self.threads < 2 {
            return copy_out(src, dst);
        }
        let guard = src.ptr_guard();
        // SAFETY: `guard` points to `src.len() >= n` readable bytes of the
        // shared mapping, alive while `guard` is (to the end of this
        // function, which returns only once both halves are done); `dst` is
        // `n` writable bytes of our own memory, borrowed mutably for as long,
        // so the two do not overlap.
        unsafe { self.split(OUT, guard.as_ptr(), dst.as_mut_ptr(), n) };
    }

    /// Copies `src` into `dst` (arena; as many bytes as the shorter has).
    pub fn copy_in(&mut self, src: &[u8], dst: &VolatileSlice<'_>) {
        let n = dst.len().min(src.len());
        if n < self.split_min || self.threads < 2 {
            dst.subslice(0, n)
                .expect("n <= dst.len()")
                .copy_from(&src[..n]);
            return;
        }
        let guard = dst.ptr_guard_mut();
        // SAFETY: `guard` points to `dst.len() >= n` writable bytes of the
        // shared mapping, alive to the end of this function (which returns
        // only once both halves are done); `src` is `n` readable bytes of
        // our own memory, which the mapping is not.
        unsafe { self.split(IN, src.as_ptr(), guard.as_ptr(), n) };
    }

    /// Copies `n` bytes in two halves, the second offered to the helper.
    ///
    /// # Safety
    /// `src` readable and `dst` writable for `n` bytes until this returns,
    /// not overlapping.
    unsafe fn split(&mut self, dir: u32, src: *const u8, dst: *mut u8, n: usize) {
        let Some(slot) = self.helper() else {
            // SAFETY: the caller's promise.
            return unsafe { copy_dir(dir, src, dst, n) };
        };
        // The first half a multiple of 4 KiB, so both start page aligned
        // when the whole does.
        let first = (n / 2) & !4095;
        self.splits += 1;
        let (s2, d2, n2) = (src.wrapping_add(first), dst.wrapping_add(first), n - first);
        slot.dir.store(dir, Ordering::Relaxed);
        slot.src.store(s2.cast_mut(), Ordering::Relaxed);
        slot.dst.store(d2, Ordering::Relaxed);
        slot.len.store(n2, Ordering::Relaxed);
        slot.state.store(POSTED, Ordering::SeqCst);
        if slot.parked.load(Ordering::SeqCst) {
            if let Some(t) = self.helper.as_ref().and_then(|h| h.thread.as_ref()) {
                t.thread().unpark();
            }
        }
        // SAFETY: the first `first <= n` bytes of both ranges.
        unsafe { copy_dir(dir, src, dst, first) };
        if slot
            .state
            .compare_exchange(POSTED, EMPTY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // Not taken: copy the second half here.
            // SAFETY: the last `n2` bytes of both ranges.
            unsafe { copy_dir(dir, s2, d2, n2) };
            return;
        }
        // The helper has it: wait for it (it is running, so not for long).
        self.helped += 1;
        let mut spins = 0u32;
        while slot.state.load(Ordering::Acquire) != DONE {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        slot.state.store(EMPTY, Ordering::Relaxed);
    }

    /// The helper's slot, starting the helper on first use; None if it
    /// cannot be started (then copies stay on one thread).
    fn helper(&mut self) -> Option<Arc<Slot>> {
        if self.helper.is_none() {
            let slot = Arc::new(Slot::default());
            let s = slot.clone();
            let thread = std::thread::Builder::new()
                .name("fairvgpu-copy".into())
                .spawn(move || helper_loop(&s))
                .ok();
            if thread.is_none() {
                self.threads = 1;
                return None;
            }
            self.helper = Some(Helper {
                slot,
                thread,
                pid: std::process::id(),
            });
        }
        self.helper.as_ref().map(|h| h.slot.clone())
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        if let Some(h) = self.helper.as_mut() {
            h.slot.state.store(EXIT, Ordering::SeqCst);
            if let Some(t) = h.thread.take() {
                if h.pid != std::process::id() {
                    // A forked child: the thread is its parent's.
                    std::mem::forget(t);
                    return;
                }
                t.thread().unpark();
                let _ = t.join();
            }
        }
    }
}

/// The helper: takes posted halves, spinning a little after each, parked
/// otherwise.
fn helper_loop(slot: &Slot) {
    let mut last = Instant::now();
    let mut turns = 0u32;
    loop {
        match slot.state.load(Ordering::Acquire) {
            EXIT => return,
            POSTED => {
                if slot
                    .state
                    .compare_exchange(POSTED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let dir = slot.dir.load(Ordering::Relaxed);
                    let src = slot.src.load(Ordering::Relaxed).cast_const();
                    let dst = slot.dst.load(Ordering::Relaxed);
                    let len = slot.len.load(Ordering::Relaxed);
                    // SAFETY: the caller posted these ranges and waits, in
                    // `Copier::split`, for DONE before it returns and the
                    // borrows they come from end; a job it took back is
                    // no longer POSTED, so the exchange above failed.
                    unsafe { copy_dir(dir, src, dst, len) };
                    slot.state.store(DONE, Ordering::Release);
                    last = Instant::now();
                }
                continue;
            }
            _ => {}
        }
        turns = turns.wrapping_add(1);
        if !turns.is_multiple_of(256) || last.elapsed() < HELPER_SPIN {
            std::hint::spin_loop();
            continue;
        }
        slot.parked.store(true, Ordering::SeqCst);
        if matches!(slot.state.load(Ordering::SeqCst), EMPTY | DONE) {
            std::thread::park();
        }
        slot.parked.store(false, Ordering::SeqCst);
        last = Instant::now();
    }
}

/// One direction's copy of `n` bytes.
///
/// # Safety
/// `src` readable and `dst` writable for `n` bytes, not overlapping.
unsafe fn copy_dir(dir: u32, src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if dir == OUT && n >= STREAM_MIN {
        // SAFETY: the caller's promise.
        return unsafe { stream_copy(dst, src, n) };
    }
    let _ = dir;
    // SAFETY: the caller's promise.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the threshold and the 64-byte blocks, at every
    /// misalignment of either side: the bytes arrive, nothing past `n` is
    /// written. (Not under Miri, which runs no non-temporal stores.)
    #[test]
    #[cfg_attr(miri, ignore)]
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
                    let what = format!("{len} {d_off}");
                    assert_copied(&dst, d_off, &src[s_off..s_off + len], 0xAA, &what);
                }
            }
        }
    }

    /// `buf` holds `want` at `at` and `fill` everywhere else.
    fn assert_copied(buf: &[u8], at: usize, want: &[u8], fill: u8, what: &str) {
        let end = at + want.len();
        assert_eq!(&buf[at..end], want, "{what}");
        assert!(buf[..at].iter().all(|&b| b == fill), "before: {what}");
        assert!(buf[end..].iter().all(|&b| b == fill), "after: {what}");
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

    fn pattern(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 131 + seed * 7 + 3) as u8).collect()
    }

    /// A copier that splits chunks from `split_min` bytes: small under
    /// Miri, which checks the hand-over but copies slowly.
    fn copier(threads: usize) -> (Copier, usize) {
        let mut c = Copier::new(threads);
        if cfg!(miri) {
            c.split_min = 8 << 10;
        }
        let m = c.split_min;
        (c, m)
    }

    /// Two threads, both directions: every size around the split threshold
    /// and odd ones, at misaligned offsets, many times over (so that the
    /// helper both takes halves and has them taken back, and parks between
    /// some): the bytes arrive, nothing outside is written.
    #[test]
    fn two_threads_copy_every_byte_both_ways() {
        let (mut c, min) = copier(2);
        assert_eq!(c.threads(), 2);
        let sizes = [min - 1, min, min + 1, min + 4095, 3 * min + 77, 4 * min];
        for round in 0..40 {
            let len = sizes[round % sizes.len()];
            let (s_off, d_off) = (round % 5, (round * 3) % 17);
            let src = pattern(len + s_off, round);
            let mut arena = vec![0x55u8; len + d_off + 64];
            // In: our buffer -> arena.
            {
                let vs = VolatileSlice::from(&mut arena[d_off..d_off + len]);
                c.copy_in(&src[s_off..], &vs);
            }
            let want = &src[s_off..s_off + len];
            assert_copied(&arena, d_off, want, 0x55, &format!("in {round}"));
            // Out: arena -> our buffer.
            let mut dst = vec![0xAAu8; len + 32];
            {
                let vs = VolatileSlice::from(&mut arena[d_off..d_off + len]);
                c.copy_out(&vs, &mut dst[s_off..s_off + len]);
            }
            assert_copied(&dst, s_off, want, 0xAA, &format!("out {round}"));
            if round % 7 == 6 {
                // Long enough for the helper to park.
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }

    /// One thread (or a helper never started) gives the same bytes, and a
    /// copier with a helper shuts it down when dropped.
    #[test]
    fn one_thread_copies_alike_and_drop_stops_the_helper() {
        for threads in [1, 2] {
            let (mut c, min) = copier(threads);
            let src = pattern(min * 2 + 5, 1);
            let mut arena = vec![0u8; src.len()];
            let vs = VolatileSlice::from(&mut arena[..]);
            c.copy_in(&src, &vs);
            let mut dst = vec![0u8; src.len()];
            c.copy_out(&vs, &mut dst);
            assert_eq!(dst, src);
            assert_eq!(c.helper.is_some(), threads == 2);
            let (splits, helped) = c.split_counts();
            assert_eq!(splits, if threads == 2 { 2 } else { 0 });
            assert!(helped <= splits);
            drop(c);
        }
        assert_eq!(Copier::new(0).threads(), 1);
        assert_eq!(Copier::new(9).threads(), 2);
    }
}
