//! The claim protocol and the region's header, end to end: claiming,
//! serving, closing, reclaiming, adopting and taking over a region.

use std::sync::atomic::Ordering;

use super::*;
use crate::error::Error;
use crate::layout::{ctl, LayoutParams};
use crate::ring::Descriptor;

fn small() -> LayoutParams {
    LayoutParams {
        channels: 3,
        ring_entries: 8,
        arena_size: 8192,
        vectors: 2,
        pinned_size: 0,
    }
}

#[test]
#[cfg_attr(miri, ignore = "memfd_create is a system call Miri does not model")]
fn adopted_region_loses_claimed_channels_until_their_owners_let_go() {
    let (old, fd) = Region::create("adopt-test", small()).unwrap();
    let epoch = old.host_epoch().unwrap();
    let g = old.claim(5, 100, 0).unwrap();
    old.host_channel(0).unwrap().mark_serving().unwrap();
    let idle = old.claim(5, 101, 0).unwrap();
    drop(idle); // CLOSING: the new host reclaims it as usual.
    let unserved = old.claim(5, 102, 0).unwrap();
    let new = Region::adopt(fd, small()).unwrap();
    assert_eq!(new.host_epoch().unwrap(), epoch + 1);
    assert_eq!(new.claim_state(0).unwrap(), ClaimState::Lost);
    // Claimed while no host served: nothing was lost.
    assert_eq!(new.claim_state(2).unwrap(), ClaimState::Claimed);
    assert!(unserved.check_alive().is_ok());
    drop(unserved);
    assert!(
        !ClaimState::Lost.needs_reclaim(),
        "reserved until the owner lets go"
    );
    assert!(matches!(
        g.check_alive(),
        Err(Error::HostRestarted { channel: 0 })
    ));
    // Nobody else is handed the lost channel.
    assert!(matches!(new.claim(6, 103, 0), Err(Error::NoFreeChannel)));
    drop(g);
    assert_eq!(new.claim_state(0).unwrap(), ClaimState::Closing);
    new.host_channel(0).unwrap().reclaim().unwrap();
    assert_eq!(new.claim_state(0).unwrap(), ClaimState::Free);
    // A wrong layout is refused.
    let (_r, fd2) = Region::create("adopt-test-2", small()).unwrap();
    let bigger = LayoutParams {
        channels: 4,
        ..small()
    };
    assert!(Region::adopt(fd2, bigger).is_err());
}

#[test]
#[cfg_attr(miri, ignore = "memfd_create is a system call Miri does not model")]
fn a_standby_host_maps_the_region_untouched_until_it_takes_over() {
    let (old, fd) = Region::create("standby-test", small()).unwrap();
    let epoch = old.host_epoch().unwrap();
    let g = old.claim(5, 100, 0).unwrap();
    old.host_channel(0).unwrap().mark_serving().unwrap();
    let standby = Region::map_existing(fd, small()).unwrap();
    // The old host still serves: nothing changed for it or its guest.
    assert_eq!(old.host_epoch().unwrap(), epoch);
    assert_eq!(standby.claim_state(0).unwrap(), ClaimState::Claimed);
    assert!(g.check_alive().is_ok());
    standby.take_over().unwrap();
    assert_eq!(old.host_epoch().unwrap(), epoch + 1);
    assert_eq!(standby.claim_state(0).unwrap(), ClaimState::Lost);
    assert!(matches!(
        g.check_alive(),
        Err(Error::HostRestarted { channel: 0 })
    ));
}

#[test]
fn lost_channel_of_a_vanished_owner_is_abandoned() {
    let region = Region::create_in_heap(small()).unwrap();
    let g = region.claim(5, 100, 0).unwrap();
    assert!(region.host_channel(0).unwrap().mark_lost().unwrap());
    // The owner dies without letting go: the kernel module (or the
    // daemon, for a native peer) marks it.
    region.mark_abandoned(0).unwrap();
    assert!(region.claim_state(0).unwrap().needs_reclaim());
    drop(g); // a late release changes nothing
    assert_eq!(region.claim_state(0).unwrap(), ClaimState::Abandoned);
}

#[test]
fn claim_serve_close_reclaim_cycle() {
    let region = Region::create_in_heap(small()).unwrap();
    let mut hosts: Vec<_> = (0..3).map(|i| region.host_channel(i).unwrap()).collect();
    let mut g = region.claim(5, 100, 1).unwrap();
    assert_eq!(g.index(), 0);
    assert_eq!(region.claim_state(0).unwrap(), ClaimState::Claimed);
    assert_eq!(region.owner_peer(0).unwrap(), 5);
    let g2 = region.claim(5, 101, 0).unwrap();
    assert_eq!(g2.index(), 1);

    assert!(g.req.try_send(&Descriptor::new(1, 9), b"hello").unwrap());
    let mut buf = Vec::new();
    let d = hosts[0].req.try_recv(&mut buf).unwrap().unwrap();
    assert_eq!((d.tag, &buf[..]), (1, &b"hello"[..]));
    assert!(hosts[0]
        .resp
        .try_send(&Descriptor::new(1, 9), b"world")
        .unwrap());
    assert_eq!(g.resp.try_recv(&mut buf).unwrap().unwrap().tag, 1);
    assert_eq!(buf, b"world");

    drop(g);
    assert_eq!(region.claim_state(0).unwrap(), ClaimState::Closing);
    assert!(hosts[0].state().unwrap().needs_reclaim());
    hosts[0].reclaim().unwrap();
    assert_eq!(region.claim_state(0).unwrap(), ClaimState::Free);

    // The next owner starts with clean rings.
    let mut g3 = region.claim(6, 102, 0).unwrap();
    assert_eq!(g3.index(), 0);
    assert!(g3.req.try_send(&Descriptor::new(77, 1), b"x").unwrap());
    assert_eq!(hosts[0].req.try_recv(&mut buf).unwrap().unwrap().tag, 77);
    assert!(hosts[0].req.try_recv(&mut buf).unwrap().is_none());
    let _g4 = region.claim(6, 103, 0).unwrap();
    assert!(matches!(region.claim(6, 104, 0), Err(Error::NoFreeChannel)));
}

/// The end a forked child inherited (here: one claimed "in another
/// process") leaves the claim as it is when dropped or released.
#[test]
fn an_inherited_end_does_not_release_the_claim() {
    let region = Region::create_in_heap(small()).unwrap();
    let mut g = region.claim(5, 100, 0).unwrap();
    assert!(g.claimed_here());
    g.claimed_in = std::process::id().wrapping_add(1);
    assert!(!g.claimed_here());
    g.release();
    assert_eq!(region.claim_state(0).unwrap(), ClaimState::Claimed);
    drop(g);
    assert_eq!(region.claim_state(0).unwrap(), ClaimState::Claimed);
    // The claiming process's own end still lets go.
    let g2 = region.claim(5, 100, 0).unwrap();
    assert_eq!(g2.index(), 1);
    drop(g2);
    assert_eq!(region.claim_state(1).unwrap(), ClaimState::Closing);
}

#[test]
fn abandoned_and_garbage_states_are_reclaimed_and_stale_owner_notices() {
    let region = Region::create_in_heap(small()).unwrap();
    let mut h = region.host_channel(0).unwrap();
    let g = region.claim(1, 1, 0).unwrap();
    region.mark_abandoned(0).unwrap();
    assert_eq!(h.state().unwrap(), ClaimState::Abandoned);
    h.reclaim().unwrap();
    assert!(
        g.check_alive().is_err(),
        "the old owner must see it lost the channel"
    );
    drop(g); // must not disturb the freed channel
    assert_eq!(region.claim_state(0).unwrap(), ClaimState::Free);

    region
        .ctl_word(0, ctl::STATE)
        .unwrap()
        .store(0xdead, Ordering::Relaxed);
    assert_eq!(h.state().unwrap(), ClaimState::Invalid(0xdead));
    assert!(h.state().unwrap().needs_reclaim());
    h.reclaim().unwrap();
    assert_eq!(region.claim_state(0).unwrap(), ClaimState::Free);
    assert!(matches!(
        region.host_channel(3),
        Err(Error::NoSuchChannel(3))
    ));
    assert!(matches!(
        region.claim_state(99),
        Err(Error::NoSuchChannel(99))
    ));
}

#[test]
fn concurrent_claims_never_share_a_channel() {
    let region = Region::create_in_heap(LayoutParams {
        channels: 4,
        ..small()
    })
    .unwrap();
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let r = region.clone();
            std::thread::spawn(move || r.claim(i, i, 0))
        })
        .collect();
    let held: Vec<GuestChannel> = threads
        .into_iter()
        .filter_map(|t| t.join().unwrap().ok())
        .collect();
    let mut got: Vec<u32> = held.iter().map(GuestChannel::index).collect();
    got.sort();
    assert_eq!(got, vec![0, 1, 2, 3]);
}

#[cfg(not(miri))]
#[test]
fn header_is_validated_on_open() {
    use crate::layout::hdr;
    use crate::shm::SharedMemory;
    let (_r, fd) = Region::create("t", small()).unwrap();
    let g = Region::open(fd.try_clone().unwrap()).unwrap();
    assert_eq!(g.layout().params, small());
    let host = SharedMemory::map(fd.try_clone().unwrap(), 4096).unwrap();
    host.atomic_u32(hdr::RING_ENTRIES)
        .unwrap()
        .store(100, Ordering::Relaxed);
    assert!(matches!(
        Region::open(fd.try_clone().unwrap()),
        Err(Error::BadHeader(_))
    ));
    host.atomic_u32(hdr::RING_ENTRIES)
        .unwrap()
        .store(8, Ordering::Relaxed);
    host.atomic_u64(hdr::REGION_SIZE)
        .unwrap()
        .store(1 << 40, Ordering::Relaxed);
    assert!(matches!(
        Region::open(fd.try_clone().unwrap()),
        Err(Error::BadHeader(_))
    ));
    host.atomic_u64(hdr::MAGIC)
        .unwrap()
        .store(1, Ordering::Relaxed);
    assert!(matches!(Region::open(fd), Err(Error::BadHeader(_))));
}
