//! A hostile guest process in a VM with process slots (`[[vm]]
//! process_slots`): one that claims a channel in another process's slot
//! itself and says `Hello` there is turned away, so that no process shares
//! another's worker process (its faults and its address space); one that
//! names another process's pinned blocks by their offsets reaches none; one
//! that rings the slots' doorbells without claiming starts no worker.

use std::time::{Duration, Instant};

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use tests::cargo_build;

/// A guest process that forces its way into another's slot (claiming a
/// channel there itself and saying `Hello` on it) is turned away: a slot's
/// worker serves one process, so none shares another's worker process.
#[test]
fn a_second_process_in_a_slot_is_turned_away() {
    use guest::{descriptor, Gpu};
    use protocol::{Request, Status};
    use transport::server::Client;

    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 2;
    let d = DaemonProc::start(
        &cargo_build("cli").join("fairvgpu"),
        "slot-intruder",
        ExecutorKind::Sim,
        &[vm],
    )
    .unwrap();
    let sock = d.socket("vm1");
    let mut owner = Gpu::connect_with(&sock, tests::TEST_SPIN).unwrap();
    let p = owner.mem_alloc(1 << 20).unwrap();

    let client = Client::connect(&sock, Duration::from_secs(5)).unwrap();
    let mut ch = client
        .region
        .claim_in_slot(0, u32::from(client.id), 1, 0)
        .unwrap();
    assert_eq!(ch.index(), 1, "a channel of the owner's slot");
    let hello = Request::Hello {
        version: protocol::PROTOCOL_VERSION,
    };
    assert!(ch.req.try_send(&descriptor(&hello, 1), &[]).unwrap());
    let mut buf = Vec::new();
    let t = Instant::now();
    let reply = loop {
        if let Some(r) = ch.resp.try_recv(&mut buf).unwrap() {
            break r;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no reply");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(Status::from_code(reply.status), Status::NotPermitted);
    // The owner is served on.
    owner.mem_free(p).unwrap();
}

/// A guest that rings every slot's host doorbell in a loop without
/// claiming a channel gets no worker started: the daemon binds one only
/// for a claimed channel (and one per slot at most). A process that
/// attaches afterwards still computes.
#[test]
fn ringing_the_slots_doorbells_without_claiming_starts_no_worker() {
    use guest::Gpu;
    use transport::server::Client;
    use transport::Bell as _;

    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 4;
    let d = DaemonProc::start(
        &cargo_build("cli").join("fairvgpu"),
        "slot-ringer",
        ExecutorKind::Sim,
        &[vm],
    )
    .unwrap();
    let sock = d.socket("vm1");
    tests::wait_for_workers(&d, 1, "the GPU's spare");
    let client = Client::connect(&sock, Duration::from_secs(5)).unwrap();
    let t = Instant::now();
    let mut rings = 0u64;
    while t.elapsed() < Duration::from_millis(500) {
        for b in &client.host_bells {
            b.ring().unwrap();
            rings += 1;
        }
        assert!(
            tests::worker_processes(&d) <= 1,
            "a worker started for a ring without a claim"
        );
    }
    assert!(rings > 100, "{rings}");
    assert_eq!(tests::worker_processes(&d), 1, "the spare alone");
    // Claimed slots get at most one worker each, however they ring.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut g = Gpu::connect_with(&sock, tests::TEST_SPIN).unwrap();
        let p = g.mem_alloc(1 << 20).unwrap();
        held.push((g, p));
    }
    for _ in 0..1000 {
        for b in &client.host_bells {
            b.ring().unwrap();
        }
    }
    assert!(
        tests::worker_processes(&d) <= 5,
        "four slots' workers and a spare at most: {}",
        tests::worker_processes(&d)
    );
    for (g, p) in &mut held {
        g.mem_free(*p).unwrap();
    }
}

/// A process in another slot naming a process's pinned blocks by their
/// offsets (copies into and out of them, a memset through their device
/// address, a free, offsets past the pool) is refused by its own worker,
/// which holds none of them; the owner's bytes stay as they were and its
/// block serves it on.
#[test]
fn another_slots_process_reaches_none_of_a_processs_pinned_blocks() {
    use guest::{Gpu, GuestError};
    use protocol::Status;

    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 2;
    let d = DaemonProc::start(
        &cargo_build("cli").join("fairvgpu"),
        "slot-pinned",
        ExecutorKind::Sim,
        &[vm],
    )
    .unwrap();
    let sock = d.socket("vm1");
    let mut owner = Gpu::connect_with(&sock, tests::TEST_SPIN).unwrap();
    let block = owner.pinned_alloc(1 << 20).unwrap();
    let pool = owner.region().pinned().unwrap();
    let mine = pool.subslice(block as usize, 1 << 20).unwrap();
    mine.copy_from(&vec![0x3cu8; 1 << 20]);

    let mut evil = Gpu::connect_with(&sock, tests::TEST_SPIN).unwrap();
    let dev = evil.mem_alloc(1 << 20).unwrap();
    evil.memset_async(dev, 0xee, 1, 1 << 20, 0).unwrap();
    evil.synchronize().unwrap();
    let size = evil.device_info().pinned_size;
    let base = evil.device_info().pinned_base;
    for (offset, len) in [
        (block, 1 << 20),
        (block + 4096, 4096),
        (size - 4096, 8192),
        (u64::MAX - 10, 20),
    ] {
        evil.memcpy_dtoh_pinned(dev, offset, len, 0).unwrap();
        let e = evil.synchronize().unwrap_err();
        assert!(matches!(e, GuestError::Cuda(Status::InvalidValue)), "{e:?}");
        evil.memcpy_htod_pinned(dev, offset, len, 0).unwrap();
        assert!(evil.synchronize().is_err());
    }
    evil.memset_async(base + block, 0xee, 1, 4096, 0).unwrap();
    assert!(evil.synchronize().is_err());
    assert!(evil.pinned_free(block).is_err());

    let mut seen = vec![0u8; 1 << 20];
    mine.copy_to(&mut seen[..]);
    assert!(seen.iter().all(|&b| b == 0x3c), "the owner's bytes changed");
    let back = owner.mem_alloc(1 << 20).unwrap();
    owner.memcpy_htod_pinned(back, block, 1 << 20, 0).unwrap();
    let mut out = vec![0u8; 1 << 20];
    owner.memcpy_dtoh(&mut out, back, 0).unwrap();
    assert!(out.iter().all(|&b| b == 0x3c));
    owner.pinned_free(block).unwrap();
}
