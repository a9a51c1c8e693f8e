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
        partitions: 1,
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
    assert!(new
        .host_channel(0)
        .unwrap()
        .reclaim(ClaimState::Closing)
        .unwrap());
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
fn a_second_host_maps_the_region_untouched_until_it_takes_over() {
    let (old, fd) = Region::create("second-host-test", small()).unwrap();
    let epoch = old.host_epoch().unwrap();
    let g = old.claim(5, 100, 0).unwrap();
    old.host_channel(0).unwrap().mark_serving().unwrap();
    let second = Region::map_existing(fd, small()).unwrap();
    // The old host still serves: nothing changed for it or its guest.
    assert_eq!(old.host_epoch().unwrap(), epoch);
    assert_eq!(second.claim_state(0).unwrap(), ClaimState::Claimed);
    assert!(g.check_alive().is_ok());
    second.take_over().unwrap();
    assert_eq!(old.host_epoch().unwrap(), epoch + 1);
    assert_eq!(second.claim_state(0).unwrap(), ClaimState::Lost);
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
    assert!(hosts[0].reclaim(ClaimState::Closing).unwrap());
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
    assert!(h.reclaim(ClaimState::Abandoned).unwrap());
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
    assert!(h.reclaim(ClaimState::Invalid(0xdead)).unwrap());
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
fn a_stale_reclaim_leaves_a_new_claim_alone() {
    // Two host ends see the first owner's channel closing; one frees it,
    // a new guest claims it, then the other acts on what it saw.
    let region = Region::create_in_heap(small()).unwrap();
    let (mut first, mut late) = (
        region.host_channel(0).unwrap(),
        region.host_channel(0).unwrap(),
    );
    drop(region.claim(1, 1, 0).unwrap());
    let seen = late.state().unwrap();
    assert_eq!(seen, ClaimState::Closing);
    assert!(first.reclaim(first.state().unwrap()).unwrap());
    let g = region.claim(2, 2, 0).unwrap();
    assert_eq!(g.index(), 0);
    assert!(
        !late.reclaim(seen).unwrap(),
        "freed a channel claimed since"
    );
    assert!(g.check_alive().is_ok());
    // What a guest takes or is taking is never freed, seen so or not.
    assert!(!late.reclaim(ClaimState::Free).unwrap());
    assert!(!late.reclaim(ClaimState::Claiming).unwrap());
    assert!(g.check_alive().is_ok());
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

/// Channels split into process slots: a process's first channel is a
/// whole free slot's first, its threads' come from the same slot, a
/// monitor's from no slot's first; each slot has its own host doorbell
/// vector and host-sleeping word; the header carries the split.
#[test]
#[cfg_attr(miri, ignore = "memfd_create is a system call Miri does not model")]
fn process_slots_keep_each_process_in_its_own_run_of_channels() {
    let p = LayoutParams {
        channels: 6,
        vectors: 3,
        partitions: 3,
        ..small()
    };
    let (host, fd) = Region::create("slots-test", p).unwrap();
    let guest = Region::open(fd).unwrap();
    assert_eq!(guest.layout().params.partitions, 3);
    let a = guest.claim_process(1, 100, 0).unwrap();
    let b = guest.claim_process(1, 200, 0).unwrap();
    assert_eq!((a.index(), b.index()), (0, 2));
    let a2 = guest.claim_in_slot(a.index(), 1, 100, 0).unwrap();
    assert_eq!(a2.index(), 1);
    assert!(
        matches!(
            guest.claim_in_slot(a.index(), 1, 100, 0),
            Err(Error::NoFreeChannel)
        ),
        "slot 0 is full"
    );
    let m = guest.claim_monitor(1, 300, 0).unwrap();
    assert_eq!(m.index(), 3, "a monitor takes no slot's first channel");
    // Slot 1 is not all free (the monitor holds one): the next process
    // takes slot 2; then none is left.
    let c = guest.claim_process(1, 400, 0).unwrap();
    assert_eq!(c.index(), 4);
    assert!(matches!(
        guest.claim_process(1, 500, 0),
        Err(Error::NoFreeChannel)
    ));
    let l = guest.layout();
    let vectors: Vec<u32> = (0..6).map(|ch| l.host_vector(ch)).collect();
    assert_eq!(vectors, [0, 0, 1, 1, 2, 2]);
    host.slot_sleeping(1).unwrap().store(1, Ordering::Relaxed);
    assert_eq!(
        guest.host_sleeping_for(2).unwrap().load(Ordering::Relaxed),
        1
    );
    assert_eq!(
        guest.host_sleeping_for(0).unwrap().load(Ordering::Relaxed),
        0
    );
    assert!(host.slot_sleeping(3).is_err());
}

#[test]
fn a_split_must_divide_the_channels_and_fit_the_vectors() {
    for (channels, vectors, partitions) in [(6, 3, 4), (6, 2, 3), (6, 8, 0), (32, 32, 32)] {
        let p = LayoutParams {
            channels,
            vectors,
            partitions,
            ..small()
        };
        assert!(
            matches!(Region::create_in_heap(p), Err(Error::BadLayout(_))),
            "{p:?}"
        );
    }
}
