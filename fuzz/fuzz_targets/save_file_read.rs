//! A vGPU save file from anywhere: any frame, with its unkeyed tag
//! appended (so that the fuzzer also gets past the tag). No panic, no
//! stream past the limits, no slot twice or past the VM's.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut file = data.to_vec();
    file.extend_from_slice(&daemon::save_file::tag_of(None, b"", data));
    let limits = daemon::save_file::FileLimits {
        slots: 4,
        lane_bytes: 1 << 16,
        region: 1 << 12,
    };
    for bytes in [data, &file[..]] {
        let path = std::path::Path::new("fuzz");
        if let Ok(saved) = daemon::save_file::read_from(bytes, path, None, b"", &|vm| {
            (vm == "vm1").then_some(limits)
        }) {
            assert!(saved.region.is_none_or(|(_, len)| len == limits.region));
            let mut seen = Vec::new();
            for l in &saved.lanes {
                assert!(l.slot < limits.slots && !seen.contains(&l.slot));
                assert!(l.len <= limits.lane_bytes);
                seen.push(l.slot);
            }
        }
    }
});
