//! A VM's vCPU file: the daemon writes its vCPU thread ids there (from
//! QMP), the worker reads them to lift the vCPU it waits on.

use std::path::Path;

/// Reads a vCPU file (one thread id per line, vCPU order); empty if absent
/// or malformed.
pub fn read_vcpus(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map_while(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}
