//! The server against native peers: ids, doorbells, departures, peers
//! that never read.

use super::*;
use crate::channel::ClaimState;
use crate::layout::LayoutParams;
use crate::ring::Descriptor;

/// A small region of `channels` channels and `vectors` doorbell vectors.
fn small_region(channels: u32, vectors: u32) -> (Region, OwnedFd) {
    let params = LayoutParams {
        channels,
        ring_entries: 8,
        arena_size: 8192,
        vectors,
        pinned_size: 0,
        partitions: 1,
    };
    Region::create("t", params).unwrap()
}

#[test]
fn native_peers_get_region_and_bells_and_departures_are_reported() {
    let dir = scratch::dir("fvg-srv");
    let sock = dir.join("s");
    let (region, fd) = small_region(2, 2);
    let server = serve(&sock, fd, &region).unwrap();
    let a = Client::connect(&sock, Duration::from_secs(5)).unwrap();
    let b = Client::connect(&sock, Duration::from_secs(5)).unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(a.own_bells.len(), 2);
    assert_eq!(
        server.events.recv_timeout(Duration::from_secs(5)).unwrap(),
        PeerEvent::Connected(a.id)
    );
    assert_eq!(
        server.events.recv_timeout(Duration::from_secs(5)).unwrap(),
        PeerEvent::Connected(b.id)
    );
    // Both peers are this process, as the kernel says.
    let me = std::process::id();
    let pids = server.peer_pids.lock().unwrap().clone();
    assert_eq!(pids.get(&a.id), Some(&me));
    assert_eq!(pids.get(&b.id), Some(&me));

    // Same memory on both sides.
    let mut g = a.region.claim(u32::from(a.id), 1, 1).unwrap();
    let mut h = region.host_channel(g.index()).unwrap();
    assert!(g.req.try_send(&Descriptor::new(3, 4), b"abc").unwrap());
    let mut buf = Vec::new();
    assert_eq!(h.req.try_recv(&mut buf).unwrap().unwrap().tag, 3);
    // The host's bell reaches the host; the host rings the guest's bell.
    a.host_bells[1].ring().unwrap();
    assert!(server.host_bells[1].wait(Duration::from_secs(5)).unwrap());
    server.ring_peer(a.id, 1).unwrap();
    assert!(a.own_bells[1].wait(Duration::from_secs(5)).unwrap());

    drop(g);
    assert!(h.reclaim(h.state().unwrap()).unwrap());
    let gone = a.id;
    drop(a);
    assert_eq!(
        server.events.recv_timeout(Duration::from_secs(5)).unwrap(),
        PeerEvent::Gone(gone)
    );
    assert!(!server.peer_pids.lock().unwrap().contains_key(&gone));
    drop(b);
    drop(server);
    assert!(!sock.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_vm_gets_peer_0_again_and_never_the_hosts_id_or_a_departed_peers_claims() {
    let dir = scratch::dir("fvg-srv-ids");
    let sock = dir.join("s");
    let (region, fd) = small_region(4, 1);
    let server = serve(&sock, fd, &region).unwrap();
    // A `master=on` QEMU needs 0; the host is 1; later peers rotate.
    let vm = Client::connect(&sock, Duration::from_secs(5)).unwrap();
    let other = Client::connect(&sock, Duration::from_secs(5)).unwrap();
    assert_eq!((vm.id, other.id), (FIRST_PEER, HOST_PEER + 1));
    assert_eq!(
        vm.host_bells.len(),
        1,
        "the host's bells, announced as peer 1"
    );
    let held = vm.region.claim(u32::from(vm.id), 1, 0).unwrap();
    let ch = held.index();
    std::mem::forget(held); // the process dies holding it
    drop(vm);
    let mut events = Vec::new();
    while !events.contains(&PeerEvent::Gone(FIRST_PEER)) {
        events.push(server.events.recv_timeout(Duration::from_secs(5)).unwrap());
    }
    // Marked before the departure was announced.
    assert_eq!(region.claim_state(ch).unwrap(), ClaimState::Abandoned);
    // The VM's next QEMU gets 0 again; its claim is its own.
    let again = Client::connect(&sock, Duration::from_secs(5)).unwrap();
    assert_eq!(again.id, FIRST_PEER);
    let mine = again.region.claim(u32::from(again.id), 2, 0).unwrap();
    assert_ne!(mine.index(), ch);
    assert_eq!(
        region.claim_state(mine.index()).unwrap(),
        ClaimState::Claimed
    );
    // Rotation goes on past the departed ids, never through the host's.
    let third = Client::connect(&sock, Duration::from_secs(5)).unwrap();
    assert_eq!(third.id, HOST_PEER + 2);
    drop((mine, again, other, third, server));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_peer_that_never_reads_holds_up_nobody_and_is_dropped() {
    let dir = scratch::dir("fvg-srv-silent");
    let sock = dir.join("s");
    let (region, fd) = small_region(2, 4);
    let (tx, rx) = channel();
    let server = serve_to(&sock, fd, &region, 8, move |ev| {
        let _ = tx.send(ev);
    })
    .unwrap();
    // Connects, and never reads a byte.
    let silent = UnixStream::connect(&sock).unwrap();
    let Ok(PeerEvent::Connected(silent_id)) = rx.recv_timeout(Duration::from_secs(5)) else {
        panic!("the silent peer was not taken");
    };
    // Every arrival is news for the silent peer; its socket fills, then
    // its queue; the others come and go all the same.
    let mut dropped = false;
    for _ in 0..400 {
        let c = Client::connect(&sock, Duration::from_secs(5)).expect("a new peer attaches");
        assert_eq!(c.own_bells.len(), 4);
        drop(c);
        while let Ok(ev) = rx.try_recv() {
            dropped |= ev == PeerEvent::Gone(silent_id);
        }
        if dropped {
            break;
        }
    }
    assert!(dropped, "the peer that never reads was never dropped");
    // More peers than allowed: the ninth is closed at once.
    let peers: Vec<Client> = (0..8)
        .map(|_| Client::connect(&sock, Duration::from_secs(5)).unwrap())
        .collect();
    assert!(Client::connect(&sock, Duration::from_secs(5)).is_err());
    drop(peers);
    drop(silent);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_native_peer_follows_its_vgpu_to_another_hosts_region_at_the_same_address() {
    let dir = scratch::dir("fvg-srv-follow");
    let (here_sock, there_sock) = (dir.join("a"), dir.join("b"));
    let (here, here_fd) = small_region(2, 2);
    let (there, there_fd) = small_region(2, 2);
    let from = serve(&here_sock, here_fd, &here).unwrap();
    let to = serve(&there_sock, there_fd, &there).unwrap();
    let mut c = Client::connect(&here_sock, Duration::from_secs(5)).unwrap();
    let _ = from.events.recv_timeout(Duration::from_secs(5));
    let mut g = c.region.claim(u32::from(c.id), 1, 1).unwrap();
    assert!(g.req.try_send(&Descriptor::new(7, 0), b"").unwrap());

    // What QEMU's migration does: the other host's region gets a copy.
    let copier = Client::connect(&there_sock, Duration::from_secs(5)).unwrap();
    c.region.copy_to(&copier.region).unwrap();
    // SAFETY: nothing else in this test touches the region or the bells.
    // (In this one process the first host's own mapping follows too.)
    let id = unsafe {
        c.follow(&there_sock, Duration::from_secs(5), |id| {
            g.set_owner_peer(u32::from(id))
        })
    }
    .unwrap();
    drop(copier);

    // The same channel at the same address is the other host's now: its
    // host takes the request sent before, and a new one.
    let mut h = there.host_channel(g.index()).unwrap();
    assert!(g.req.try_send(&Descriptor::new(8, 0), b"").unwrap());
    let mut buf = Vec::new();
    assert_eq!(h.req.try_recv(&mut buf).unwrap().unwrap().tag, 7);
    assert_eq!(h.req.try_recv(&mut buf).unwrap().unwrap().tag, 8);
    assert_eq!(there.owner_peer(g.index()).unwrap(), u32::from(id));
    assert_eq!(there.claim_state(g.index()).unwrap(), ClaimState::Claimed);
    // The first host lost this peer; the second host's bells are ours.
    assert_eq!(
        from.events.recv_timeout(Duration::from_secs(5)).unwrap(),
        PeerEvent::Gone(0)
    );
    c.host_bells[1].ring().unwrap();
    assert!(to.host_bells[1].wait(Duration::from_secs(5)).unwrap());
    to.ring_peer(id, 1).unwrap();
    assert!(c.own_bells[1].wait(Duration::from_secs(5)).unwrap());

    // A region of another layout is refused, and nothing moves.
    let (other, other_fd) = small_region(4, 2);
    let other_sock = dir.join("c");
    let _o = serve(&other_sock, other_fd, &other).unwrap();
    // SAFETY: as above.
    assert!(unsafe { c.follow(&other_sock, Duration::from_secs(5), |_| Ok(())) }.is_err());
    assert!(g.req.try_send(&Descriptor::new(9, 0), b"").unwrap());
    assert_eq!(h.req.try_recv(&mut buf).unwrap().unwrap().tag, 9);
    drop(g);
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_peer_that_cannot_reach_the_other_server_leaves_every_connection_here() {
    let dir = scratch::dir("fvg-srv-reach");
    let (here_sock, there_sock) = (dir.join("a"), dir.join("b"));
    let (here, here_fd) = small_region(2, 2);
    let (there, there_fd) = small_region(2, 2);
    let _from = serve(&here_sock, here_fd, &here).unwrap();
    // Room there for one peer: a process's second connection is refused.
    let _to = serve_to(&there_sock, there_fd, &there, 1, |_| ()).unwrap();
    let a = Client::connect(&here_sock, Duration::from_secs(5)).unwrap();
    let b = Client::connect(&here_sock, Duration::from_secs(5)).unwrap();
    let mut ga = a.region.claim(u32::from(a.id), 1, 1).unwrap();
    let reached = a.reach(&there_sock, Duration::from_secs(5)).unwrap();
    assert!(b.reach(&there_sock, Duration::from_secs(5)).is_err());
    drop(reached);
    // Reaching changed nothing here: the channel is this host's, its
    // owner this peer.
    let mut h = here.host_channel(ga.index()).unwrap();
    assert!(ga.req.try_send(&Descriptor::new(5, 0), b"").unwrap());
    let mut buf = Vec::new();
    assert_eq!(h.req.try_recv(&mut buf).unwrap().unwrap().tag, 5);
    assert_eq!(here.owner_peer(ga.index()).unwrap(), u32::from(a.id));
    // The connection that reached left the other server: a new one fits.
    let t = std::time::Instant::now();
    while Client::connect(&there_sock, Duration::from_secs(5)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the reached peer never left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop((ga, a, b));
    let _ = std::fs::remove_dir_all(&dir);
}
