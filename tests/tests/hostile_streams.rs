//! Stream attributes end to end on the sim worker: what a guest sets
//! reaches the executor and reads back from it; a guest that names another
//! process's stream, or sends values the driver would misread, is refused
//! and changes nothing (part of the hostile-guest suite, beside
//! `hostile_rings.rs`).

use std::sync::atomic::Ordering;

use guest::GuestError;
use protocol::stream_attr::{id, AccessPolicyWindow, StreamAttr};
use protocol::{Request, Status};
use tests::Host;

fn window(base: u64, bytes: u64, ratio: f32) -> AccessPolicyWindow {
    AccessPolicyWindow {
        base,
        bytes,
        hit_ratio_bits: ratio.to_bits(),
        hit_prop: 2,
        miss_prop: 1,
    }
}

#[test]
fn a_stream_attribute_set_by_the_guest_reaches_the_executor() {
    let host = Host::start("stream-attrs", 64 << 20);
    let mut g = host.guest();
    let p = g.mem_alloc(4 << 20).unwrap();
    // Out-of-range priorities are clamped, as the driver does.
    let st = g.stream_create(0, -9).unwrap();
    assert_eq!(
        g.stream_attribute(st, id::PRIORITY).unwrap(),
        StreamAttr::Priority(-5)
    );
    // Unset: the executor's default (no window).
    assert_eq!(
        g.stream_attribute(st, id::ACCESS_POLICY_WINDOW).unwrap(),
        StreamAttr::AccessPolicyWindow(AccessPolicyWindow::default())
    );
    let w = StreamAttr::AccessPolicyWindow(window(p, 1 << 20, 0.6));
    g.stream_set_attribute(st, w).unwrap();
    g.stream_set_attribute(st, StreamAttr::Priority(-2))
        .unwrap();
    g.stream_set_attribute(0, StreamAttr::MemSyncDomain(1))
        .unwrap();
    assert_eq!(g.stream_attribute(st, id::ACCESS_POLICY_WINDOW).unwrap(), w);
    assert_eq!(
        g.stream_attribute(st, id::PRIORITY).unwrap(),
        StreamAttr::Priority(-2)
    );
    assert_eq!(
        g.stream_attribute(0, id::MEM_SYNC_DOMAIN).unwrap(),
        StreamAttr::MemSyncDomain(1)
    );
    // A destroyed stream's attributes go with it.
    g.stream_destroy(st).unwrap();
    let e = g.stream_attribute(st, id::PRIORITY).unwrap_err();
    assert!(
        matches!(e, GuestError::Cuda(Status::InvalidHandle)),
        "{e:?}"
    );
}

#[test]
fn stream_attributes_reach_only_the_callers_streams_and_bad_values_are_refused() {
    let host = Host::start("hostile-stream-attrs", 64 << 20);
    let mut victim = host.guest();
    let mut evil = host.guest();
    let theirs = victim.stream_create(0, 0).unwrap();
    let w = StreamAttr::AccessPolicyWindow(window(0x7f00_0000_0000, 1 << 20, 0.5));
    victim.stream_set_attribute(theirs, w).unwrap();
    let refused = host.stats().refused.load(Ordering::Relaxed);

    // The victim's stream, and handles that were never streams.
    for st in [theirs, theirs + 1, u64::MAX] {
        let e = evil
            .stream_set_attribute(st, StreamAttr::Priority(-5))
            .unwrap_err();
        assert!(
            matches!(e, GuestError::Cuda(Status::InvalidHandle)),
            "{e:?}"
        );
        let e = evil.stream_attribute(st, id::PRIORITY).unwrap_err();
        assert!(
            matches!(e, GuestError::Cuda(Status::InvalidHandle)),
            "{e:?}"
        );
    }
    // Values the host's decode refuses (the encoder writes them as given).
    let mine = evil.stream_create(0, 0).unwrap();
    let bad = [
        StreamAttr::AccessPolicyWindow(window(0, 1 << 20, 2.0)),
        StreamAttr::AccessPolicyWindow(window(0, 1 << 20, f32::NAN)),
        StreamAttr::AccessPolicyWindow(AccessPolicyWindow {
            hit_prop: 9,
            ..window(0, 1 << 20, 0.5)
        }),
        StreamAttr::AccessPolicyWindow(window(u64::MAX - 4096, 1 << 20, 0.5)),
        StreamAttr::SyncPolicy(0),
        StreamAttr::Priority(1 << 20),
        StreamAttr::MemSyncDomainMap {
            default: 200,
            remote: 0,
        },
        StreamAttr::MemSyncDomain(7),
    ];
    for attr in bad {
        let e = evil
            .request(&Request::StreamSetAttribute { stream: mine, attr })
            .unwrap_err();
        assert!(
            matches!(e, GuestError::Cuda(Status::InvalidValue)),
            "{attr:?}: {e:?}"
        );
    }
    for attr in [0, 2, 11, u32::MAX] {
        let e = evil
            .request(&Request::StreamGetAttribute { stream: mine, attr })
            .unwrap_err();
        assert!(
            matches!(e, GuestError::Cuda(Status::InvalidValue)),
            "{attr}: {e:?}"
        );
    }
    assert!(host.stats().refused.load(Ordering::Relaxed) >= refused + 12);
    // Nothing of it reached the victim: its window stands, its default
    // stream keeps its own values.
    evil.stream_set_attribute(0, StreamAttr::Priority(-4))
        .unwrap();
    assert_eq!(
        victim
            .stream_attribute(theirs, id::ACCESS_POLICY_WINDOW)
            .unwrap(),
        w
    );
    assert_eq!(
        victim.stream_attribute(0, id::PRIORITY).unwrap(),
        StreamAttr::Priority(0)
    );
    // Both channels still answer.
    assert_eq!(
        evil.stream_attribute(0, id::PRIORITY).unwrap(),
        StreamAttr::Priority(-4)
    );
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
}
