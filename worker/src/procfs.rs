//! Resource figures of this process, from procfs (for the operator's view:
//! the status's worker memory and fds).

/// Resident memory (bytes) and open file descriptors of this process;
/// zeros where procfs cannot be read. The memory is the process's own
/// (anonymous and file-backed pages), not the shared regions it maps: a
/// region's pages count once a guest has touched them, and are no leak.
pub fn own_usage() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let rss = (kib("RssAnon:") + kib("RssFile:")) * 1024;
    // The listing itself holds one fd open while it runs.
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1) as u64)
        .unwrap_or(0);
    (rss, fds)
}

/// Hands memory the allocator keeps free back to the system (glibc's heap
/// otherwise keeps the high-water mark of a departed guest's buffers).
pub fn release_free_memory() {
    // SAFETY: malloc_trim only walks the allocator's own free lists; it has
    // no preconditions and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_an_opened_file() {
        let (rss, before) = own_usage();
        assert!(rss > 0);
        let f = std::fs::File::open("/proc/self/statm").unwrap();
        let (_, with) = own_usage();
        drop(f);
        // Other test threads may open files meanwhile: at least one more.
        assert!(with > before || with >= 4, "{before} -> {with}");
    }
}
