//! Variable-length payloads the host parses: link records, device info,
//! tensor-map parameters, graphs.
#![no_main]
use libfuzzer_sys::fuzz_target;
use protocol::tensor_map::TensorMapParams;

fuzz_target!(|data: &[u8]| {
    if let Ok(records) = protocol::link_records(data) {
        let total: usize = records.iter().map(|(_, b)| b.len() + 8).sum();
        assert_eq!(total, data.len());
    }
    let _ = protocol::DeviceInfo::from_bytes(data);
    // What the host's extent check relies on: a decoded tensor's span is
    // computed without overflow, and it re-encodes to the same bytes.
    if let Ok(p) = TensorMapParams::decode(data) {
        assert!(p.span() < u64::MAX);
        assert_eq!(TensorMapParams::decode(&p.encode()), Ok(p));
    }
    // A decoded graph names only earlier nodes, and re-encodes to itself.
    if let Ok(nodes) = protocol::graph::decode_graph(data) {
        for (i, n) in nodes.iter().enumerate() {
            assert!(n.deps.iter().all(|&d| (d as usize) < i));
            let _ = n.op.ranges();
        }
        let again = protocol::graph::encode_graph(&nodes);
        assert_eq!(again, data);
    }
});
