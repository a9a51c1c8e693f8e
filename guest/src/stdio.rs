//! Kernel output written where the process's own C stdio writes.
//!
//! The driver writes a kernel's printf text through the process's C
//! `stdout` and flushes it (natively, a program's own buffered `printf`
//! output comes out before the kernel's lines, in order: measured with
//! NVIDIA's simplePrintf on an H200), and assert messages through
//! `stderr`. The stand-in writes what the host sends the same way, so that
//! a program's output keeps its native order whatever its buffering.

extern "C" {
    // glibc's standard streams, made before any of the process's code runs
    // and kept for its life.
    static stdout: *mut libc::FILE;
    static stderr: *mut libc::FILE;
}

/// Writes `text` to the process's C `stdout` (stream 1) or `stderr`
/// (stream 2) and flushes it; another stream is ignored. A failed write is
/// the process's own descriptor's business, as natively.
pub(crate) fn write(stream: u64, text: &[u8]) {
    let f = match stream {
        // SAFETY: reads the pointer glibc keeps in its exported `stdout`
        // (never written by this crate).
        1 => unsafe { stdout },
        // SAFETY: as above, `stderr`.
        2 => unsafe { stderr },
        _ => return,
    };
    if f.is_null() || text.is_empty() {
        return;
    }
    // SAFETY: `f` is a live FILE of this process; fwrite takes the FILE's
    // own lock and reads `text.len()` bytes of `text`.
    unsafe { libc::fwrite(text.as_ptr().cast(), 1, text.len(), f) };
    // SAFETY: as above.
    unsafe { libc::fflush(f) };
}
