//! Variable-length payloads the host parses: link records and device info.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(records) = protocol::link_records(data) {
        let total: usize = records.iter().map(|(_, b)| b.len() + 8).sum();
        assert_eq!(total, data.len());
    }
    let _ = protocol::DeviceInfo::from_bytes(data);
});
