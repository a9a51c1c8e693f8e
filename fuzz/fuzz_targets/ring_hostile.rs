//! A guest scribbles over its channel (indices, descriptors, sleeping words)
//! between host operations: the host's consume/produce calls return errors,
//! never panic, and never touch memory outside the region.
#![no_main]
use libfuzzer_sys::fuzz_target;
use transport::{Descriptor, LayoutParams, Region};

fuzz_target!(|data: &[u8]| {
    let params = LayoutParams {
        channels: 2,
        ring_entries: 8,
        arena_size: 4096,
        vectors: 1,
        pinned_size: 0,
        partitions: 1,
    };
    let region = Region::create_in_heap(params).expect("region");
    let l = *region.layout();
    let mut host = region.host_channel(0).expect("channel");
    let span = l.channel_stride as u64;
    let base = l.channel_offset(0) as u64;
    let mut buf = Vec::new();
    // Each 9-byte record: an offset into channel 0, a value, and which host operation to run.
    for rec in data.chunks_exact(9) {
        let off =
            base + (u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) as u64 % span) / 4 * 4;
        let val = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
        region
            .raw_u32_for_tests(off as usize)
            .store(val, std::sync::atomic::Ordering::Release);
        match rec[8] % 4 {
            0 => {
                let _ = host.req.try_recv(&mut buf);
            }
            1 => {
                let _ = host.resp.try_send(&Descriptor::new(1, 2), &[7u8; 100]);
            }
            2 => {
                if let Ok(Some(d)) = host.req.peek() {
                    let _ = host.req.data(&d).map(|s| s.len());
                    let _ = host.req.consume(&d);
                }
            }
            _ => {
                let _ = host.state();
            }
        }
    }
    // Channel 1 was never written: it must still work.
    let mut g = region.host_channel(1).expect("channel 1");
    assert!(g.req.try_recv(&mut buf).expect("clean channel").is_none());
    if let Ok(seen) = host.state() {
        let _ = host.reclaim(seen);
    }
});
