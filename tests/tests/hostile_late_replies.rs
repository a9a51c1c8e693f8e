//! A guest that leaves its replies unread while its vGPU holds the GPU, or
//! takes each at once and pauses just under 1 ms before its next call. To
//! the worker it looks like a guest late for a CPU on a busy host, for
//! which a holder with nothing to run keeps the grant up to 4 ms at a time
//! (`worker/src/serve/serving.rs`, `Worker::late_guest`: a reply unread,
//! or taken less than 1 ms after the last call). Such waits are
//! free only for the time the VM's vCPU thread waited for a CPU, and up to
//! an eighth of each grant's slice: a guest that hoards its replies on
//! purpose (its thread asleep) pays for the GPU time it holds idle past
//! that, so it cannot keep the GPU from the others for nothing. Sim workers under a
//! real grant service, the hoarder speaking the protocol by hand.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use daemon::grant::GrantService;
use guest::descriptor;
use protocol::Request;
use transport::server::Client;
use transport::SpinPolicy;

/// The grant service's base slice.
const SLICE_NS: u64 = 6_000_000;

/// How long the hoarder leaves each batch of replies unread: under the
/// worker's 4 ms, so that every wait ends with the guest taking them (the
/// most it can get for free).
const HOARD: Duration = Duration::from_micros(3500);

/// How long the pauser waits after taking a reply before its next call:
/// under the worker's 1 ms.
const PAUSE: Duration = Duration::from_micros(900);

/// The hoarder: opens a session and takes memory, then until `stop` puts
/// a memset and a synchronize on the GPU, leaves the synchronize's reply
/// unread for `unread`, takes it, waits `pause`, and goes on.
fn hoard(socket: &std::path::Path, stop: &AtomicBool, unread: Duration, pause: Duration) -> u64 {
    let client = Client::connect(socket, Duration::from_secs(5)).unwrap();
    let mut ch = client.region.claim(u32::from(client.id), 1, 0).unwrap();
    let mut buf = Vec::new();
    let mut tag = 1;
    let call = |ch: &mut transport::GuestChannel, req: Request, tag: &mut u64| {
        assert!(ch.req.try_send(&descriptor(&req, *tag), &[]).unwrap());
        *tag += 1;
    };
    let take = |ch: &mut transport::GuestChannel, buf: &mut Vec<u8>| loop {
        if let Some(d) = ch.resp.try_recv(buf).unwrap() {
            return d;
        }
        std::thread::sleep(Duration::from_micros(50));
    };
    call(
        &mut ch,
        Request::Hello {
            version: protocol::PROTOCOL_VERSION,
        },
        &mut tag,
    );
    take(&mut ch, &mut buf);
    call(&mut ch, Request::MemAlloc { size: 1 << 20 }, &mut tag);
    let reply = take(&mut ch, &mut buf);
    let dst = protocol::Reply::decode(&reply.inline).vals[0];
    assert_ne!(dst, 0, "the hoarder's allocation");
    let mut rounds = 0;
    while !stop.load(Ordering::Relaxed) {
        call(
            &mut ch,
            Request::Memset {
                dst,
                value: 7,
                width: 1,
                count: 4096,
                stream: 0,
            },
            &mut tag,
        );
        call(&mut ch, Request::CtxSynchronize, &mut tag);
        std::thread::sleep(unread);
        take(&mut ch, &mut buf);
        std::thread::sleep(pause);
        rounds += 1;
    }
    rounds
}

#[test]
fn a_guest_leaving_its_replies_unread_pays_for_the_idle_grant_past_an_eighth_of_each_slice() {
    pays_past_an_eighth("late-replies", HOARD, Duration::ZERO);
}

#[test]
fn a_guest_pausing_before_each_call_pays_for_the_idle_grant_past_an_eighth_of_each_slice() {
    pays_past_an_eighth("late-calls", Duration::ZERO, PAUSE);
}

/// A hoarder leaving its replies unread for `unread`, or pausing `pause`
/// after each, beside an honest guest: the waits its worker kept the grant
/// for are charged past an eighth of each grant's slice.
fn pays_past_an_eighth(name: &str, unread: Duration, pause: Duration) {
    // One at a time: on two CPUs the other's guests and workers would keep
    // the hoarder's woken thread waiting for a CPU, its waits the host's.
    let _one = tests::one_at_a_time();
    let dir = scratch::dir(name);
    let svc = GrantService::start(&dir.join("grant.sock"), SLICE_NS).unwrap();
    // A short idle spin (a debug build's default spin outlasts the
    // hoarder's gaps), so that the worker reaches its choice between
    // giving the grant back and waiting for the guest.
    let spin = SpinPolicy {
        spins: 2_000,
        ..SpinPolicy::default()
    };
    let (workers, sockets) = tests::granted_sim_workers(&dir, svc.path(), 2, spin);
    let stop = Arc::new(AtomicBool::new(false));
    // An honest guest on the other vGPU wants the GPU all along.
    let good = {
        let (socket, stop) = (sockets[1].clone(), stop.clone());
        std::thread::spawn(move || tests::memset_loop(&socket, &stop))
    };
    // The hoarder's thread is its VM's vCPU thread: the worker reads how
    // long it waited for a CPU, and a thread that sleeps on purpose waits
    // for none.
    let hoarder = {
        let (socket, stop) = (sockets[0].clone(), stop.clone());
        let vcpus = tests::vcpus_file(&dir, 0);
        std::thread::spawn(move || {
            let tid = u32::try_from(nix::unistd::gettid().as_raw()).unwrap();
            wire::vcpus::write_vcpus(&vcpus, &[tid]).unwrap();
            hoard(&socket, &stop, unread, pause)
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let (rounds, good_rounds) = (hoarder.join().unwrap(), good.join().unwrap());
    // Read once the workers are down: a grant's charge reaches the
    // counters when it is given back (at the latest as its worker stops),
    // its waits as they end.
    let stats = workers[0].stats.clone();
    for w in workers {
        w.shutdown().unwrap();
    }
    let late = stats.handoff.figures();
    let charged = stats.charged_ns.load(Ordering::Relaxed);
    println!(
        "hoarder rounds {rounds}, good rounds {good_rounds}; hoarder's worker: {}, charged {:.1} ms",
        late.line(),
        charged as f64 / 1e6
    );
    assert!(rounds > 10 && good_rounds > 10, "both guests ran");
    assert!(
        late.late_guests > 0,
        "the worker kept the grant for the late guest"
    );
    // What the hoarder's worker waited for free is at most an eighth of
    // each grant's slice, and what its thread spent waiting for a CPU
    // (little: it sleeps); the rest of its waits was charged.
    assert!(
        late.late_guest_cpu_ns * 2 < late.late_guest_ns,
        "a sleeping hoarder's waits passed for the host's: {}",
        late.line()
    );
    // An eighth of each grant's slice with its extensions (a grant no
    // other vGPU wanted when its slice ran out got another), and of the
    // slice of the grant held as the worker stopped.
    let free_at_most = late.slice_ns / 8 + SLICE_NS / 8 + late.late_guest_cpu_ns;
    assert!(
        charged + free_at_most >= late.late_guest_ns,
        "waited {} ns for a late guest over {} grants ({} ms of slices), charged only {charged} ns",
        late.late_guest_ns,
        late.grants,
        late.slice_ns / 1_000_000
    );
}
