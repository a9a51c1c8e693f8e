//! Guest claims, checks and releases, kernel-module abandonments, host
//! reclaims, a restarted host's LOST marks and raw writes to claim words,
//! in any order: no panic, and a reclaimed
//! channel is always free and claimable again.
#![no_main]
use libfuzzer_sys::fuzz_target;
use transport::{ClaimState, LayoutParams, Region};

fuzz_target!(|data: &[u8]| {
    let params = LayoutParams {
        channels: 3,
        ring_entries: 4,
        arena_size: 4096,
        vectors: 1,
        pinned_size: 0,
        partitions: 1,
    };
    let region = Region::create_in_heap(params).expect("region");
    let mut hosts: Vec<_> = (0..3)
        .map(|i| region.host_channel(i).expect("channel"))
        .collect();
    let mut guests = Vec::new();
    for pair in data.chunks_exact(2) {
        let ch = u32::from(pair[1] % 3);
        match pair[0] % 7 {
            0 => {
                if let Ok(g) = region.claim(1, 1, 0) {
                    guests.push(g);
                }
            }
            1 => {
                if !guests.is_empty() {
                    let g = guests.remove(usize::from(pair[1]) % guests.len());
                    let _ = g.check_alive();
                }
            }
            2 => {
                let _ = region.mark_abandoned(ch);
            }
            3 => {
                let h = &mut hosts[ch as usize];
                let seen = h.state().expect("state");
                if seen.needs_reclaim() {
                    assert!(h.reclaim(seen).expect("reclaim"));
                    assert_eq!(region.claim_state(ch).expect("state"), ClaimState::Free);
                }
            }
            4 => {
                let _ = hosts[ch as usize].mark_serving();
                let _ = hosts[ch as usize].mark_lost();
            }
            5 => {
                // A LOST channel is never handed to another guest.
                let lost = region.claim_state(ch).expect("state") == ClaimState::Lost;
                if let Ok(g) = region.claim(2, 2, 0) {
                    assert!(!(lost && g.index() == ch), "claimed a LOST channel");
                    guests.push(g);
                }
            }
            _ => {
                let off = region.layout().channel_offset(ch);
                region
                    .raw_u32_for_tests(off)
                    .store(u32::from(pair[1]), std::sync::atomic::Ordering::Release);
            }
        }
    }
});
