//! The feed and lanes of `link`, against workers in-process.

use super::*;
use transport::server::Client;
use transport::ClaimState;
use worker::feed::{Feed, PeerLink};

fn layout() -> LayoutParams {
    LayoutParams {
        channels: 2,
        ring_entries: 8,
        arena_size: 8192,
        vectors: 2,
        pinned_size: 0,
        partitions: 1,
    }
}

/// A VM's host side for one test: its folder (removed at the test's
/// end), the socket guests attach to, and the `VmHost`.
fn vm_host(name: &str) -> (std::path::PathBuf, std::path::PathBuf, VmHost) {
    let dir = scratch::dir(&format!("fvg-{name}"));
    let sock = dir.join("vm.sock");
    let host = VmHost::start(name, &sock, layout()).unwrap();
    (dir, sock, host)
}

/// A worker fed by `host`: the region it adopted, and its link.
fn fed_worker(host: &VmHost) -> (Region, PeerLink) {
    let (fd, fed) = Feed::receive(host.feed_slot(0).unwrap()).unwrap();
    (Region::adopt(fd, layout()).unwrap(), PeerLink::Feed(fed))
}

/// A channel `client` claims and the worker of `region` serves.
fn served_claim(client: &Client, region: &Region) -> transport::GuestChannel {
    let g = client.region.claim(u32::from(client.id), 1, 0).unwrap();
    region
        .host_channel(g.index())
        .unwrap()
        .mark_serving()
        .unwrap();
    g
}

#[test]
fn feed_carries_region_bells_and_peer_changes_to_successive_workers() {
    let (dir, sock, host) = vm_host("link-test");
    let client = Client::connect(&sock, Duration::from_secs(5)).unwrap();

    let (region, link) = fed_worker(&host);
    assert_eq!(link.host_bells().len(), 2);
    // The worker can ring the peer that was there before it started...
    link.ring_peer(client.id, 1).unwrap();
    assert!(wait_readable(&client.own_bells[1]));
    // ...and the guest rings the worker's bell.
    client.host_bells[0].ring().unwrap();
    assert!(wait_readable(&link.host_bells()[0]));

    // A guest claims a channel; the worker dies; a second worker adopts.
    let g = served_claim(&client, &region);
    drop(link);
    let (region2, link2) = fed_worker(&host);
    assert_eq!(region2.claim_state(g.index()).unwrap(), ClaimState::Lost);
    link2.ring_peer(client.id, 0).unwrap();
    assert!(wait_readable(&client.own_bells[0]));

    // A peer that leaves: the daemon marks its channels abandoned.
    let idx = g.index();
    std::mem::forget(g);
    drop(client);
    eventually("not abandoned", || {
        region2.claim_state(idx).unwrap().needs_reclaim()
    });
    assert!(!link2.orphaned());
    // A limit set while running reaches the worker, and its successors.
    assert_eq!(link2.memory_limit(), None);
    host.set_memory_limit(300).unwrap();
    eventually("limit not fed", || link2.memory_limit() == Some(300 << 20));
    // A worker whose contexts are poisoned says so before it exits.
    assert!(!host.take_poisoned());
    link2.report_poisoned();
    eventually("poison not heard", || host.take_poisoned());
    assert!(!host.take_poisoned(), "heard once");
    let (_fd3, fed3) = Feed::receive(host.feed_slot(0).unwrap()).unwrap();
    assert_eq!(PeerLink::Feed(fed3).memory_limit(), Some(300 << 20));
    drop(region);
    drop(host);
    eventually("feed not closed", || link2.orphaned());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_that_does_not_read_its_feed_holds_up_nobody() {
    let (dir, sock, host) = vm_host("link-stuck");
    // A worker that never reads its feed.
    let stuck = UnixStream::from(host.feed_slot(0).unwrap());
    // Peers come and go: more news than its socket holds.
    for _ in 0..200 {
        drop(Client::connect(&sock, Duration::from_secs(5)).unwrap());
    }
    // The daemon's calls never wait on it...
    let t = std::time::Instant::now();
    host.set_memory_limit(100).unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // ...and its feed is closed once it has not read for a while.
    while !host.lanes().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the stuck feed stays open"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    stuck
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    while let Some(_m) = recv_msg(&stuck).expect("the stuck feed ends, not times out") {}
    // The next worker gets its snapshot.
    let (_fd, fed) = Feed::receive(host.feed_slot(0).unwrap()).unwrap();
    assert_eq!(PeerLink::Feed(fed).memory_limit(), Some(100 << 20));
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits up to 5 s for `f` to hold; fails naming `what` if it does not.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(5), "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_readable(b: &EventFdBell) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(b.fd().as_fd(), PollFlags::POLLIN)];
    let ok = poll(&mut fds, PollTimeout::from(2000u16)).unwrap_or(0) == 1;
    let mut buf = [0u8; 8];
    let _ = nix::unistd::read(b.fd().as_fd(), &mut buf);
    ok
}

#[test]
fn feed_messages_round_trip() {
    for (k, p, v) in [(REGION, 0, 0), (PEER_BELL, 65535, 31), (PEER_GONE, 7, 0)] {
        assert_eq!(decode(encode(k, p, v)), (k, p, v));
    }
}
