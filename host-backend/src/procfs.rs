//! Resource figures of this process, from procfs (for the operator's view
//! and the soak bench's leak checks).

/// Resident memory (bytes) and open file descriptors of this process;
/// zeros where procfs cannot be read.
pub fn own_usage() -> (u64, u64) {
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024);
    // The listing itself holds one fd open while it runs.
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1) as u64)
        .unwrap_or(0);
    (rss, fds)
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
