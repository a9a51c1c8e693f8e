//! A VM's vCPU file: the daemon writes its vCPU thread ids there (from
//! QMP), the worker reads them to lift the vCPU it waits on.

use std::path::Path;

/// Writes a vCPU file (one thread id per line, vCPU order; none: empty)
/// whole or not at all: through a file beside it, renamed over it, so
/// that a worker reading it meanwhile sees the old list or the new one.
pub fn write_vcpus(path: &Path, threads: &[u32]) -> std::io::Result<()> {
    let text: String = threads.iter().map(|t| format!("{t}\n")).collect();
    let tmp = path.with_extension("vcpus.tmp");
    std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path))
}

/// Reads a vCPU file (one thread id per line, vCPU order); empty if absent
/// or malformed.
pub fn read_vcpus(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map_while(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back_and_a_rewrite_replaces_it() {
        let f = scratch::dir("wire-vcpus").join("vm.vcpus");
        write_vcpus(&f, &[101, 102]).unwrap();
        assert_eq!(read_vcpus(&f), [101, 102]);
        write_vcpus(&f, &[]).unwrap();
        assert!(read_vcpus(&f).is_empty());
        assert!(!f.with_extension("vcpus.tmp").exists());
    }
}
