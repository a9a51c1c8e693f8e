//! The real-time lift end to end (`[daemon] realtime`): the daemon's grant
//! service and vCPU lift, two workers' gates contending for the GPU, and a
//! thread of this test as the holder's vCPU thread; each thread's class
//! read back from the kernel. Skipped where this process may not use
//! `SCHED_FIFO` (the report says why).
//!
//! - Alone on the GPU, the holder's threads are lifted in nice only.
//! - Once another vGPU waits, its vCPU thread and the holding gate's thread
//!   (a worker's serving thread) are in `SCHED_FIFO`.
//! - A holder that never gives the GPU back keeps its vCPU thread real-time
//!   only to the round's deadline; its own thread leaves at its slice's
//!   end; the next holder's grant puts the nice back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use daemon::grant::GrantService;
use daemon::hostcpu::{lift::SysPriority, HostCpu};
use worker::gate::Gate;
use worker::priority::{fifo_priority, get_nice, REALTIME_VCPU, REALTIME_WORKER};

const SLICE: Duration = Duration::from_millis(20);
const NICE: i32 = -5;

/// Polls `what` every millisecond for up to 5 s; its last answer.
fn eventually(mut what: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while !what() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    what()
}

/// The calling thread's id.
fn own_tid() -> u32 {
    u32::try_from(nix::unistd::gettid().as_raw()).unwrap()
}

/// A thread standing in for a vCPU: sleeps a millisecond at a time until
/// told to stop; its id.
fn vcpu(stop: &Arc<AtomicBool>) -> (u32, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let stop = stop.clone();
    let h = std::thread::spawn(move || {
        tx.send(own_tid()).unwrap();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    (rx.recv().unwrap(), h)
}

#[test]
fn a_contended_holders_threads_are_real_time_until_the_rounds_deadline_only() {
    let host = HostCpu::lifts(NICE, true, SysPriority, true);
    let report = host.report();
    if !report.realtime.on {
        eprintln!("skipped: {}", report.realtime.detail);
        return;
    }
    let dir = scratch::dir("fvg-realtime-lift");
    let slice_ns = u64::try_from(SLICE.as_nanos()).unwrap();
    let policy = sched::DevicePolicy::default();
    let svc = GrantService::start_lifted(
        &dir.join("g.sock"),
        slice_ns,
        policy,
        false,
        sched::Sharing::Exclusive,
        host.service_lift(),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (vcpu1, h) = vcpu(&stop);
    let before = get_nice(vcpu1).unwrap();
    host.registry.set_vcpus(1, vec![vcpu1]);
    let me = own_tid();

    // Alone: the nice lift, no real-time class.
    let mut a = Gate::connect(svc.path(), 1, 1.0)
        .unwrap()
        .with_realtime(true);
    assert!(eventually(|| a.acquire(Duration::from_millis(5)).unwrap()));
    assert!(eventually(|| get_nice(vcpu1) == Some(NICE)));
    assert_eq!(fifo_priority(vcpu1), Ok(None));
    assert_eq!(fifo_priority(me), Ok(None));

    // Another vGPU waits: the holder's threads go real-time.
    let mut b = Gate::connect(svc.path(), 2, 1.0).unwrap();
    assert!(!b.acquire(Duration::from_millis(1)).unwrap());
    assert!(eventually(|| {
        a.extended();
        !a.alone()
    }));
    let contended = Instant::now();
    assert_eq!(fifo_priority(me), Ok(Some(REALTIME_WORKER)));
    assert_eq!(a.realtime_entries(), 1);
    assert!(eventually(
        || fifo_priority(vcpu1) == Ok(Some(REALTIME_VCPU))
    ));

    // Holder 1 never gives the GPU back: its vCPU thread leaves SCHED_FIFO
    // at the round's deadline all the same (at most two slices after the
    // contention began: a lone holder's round is one slice longer at
    // most), its nice lift kept.
    assert!(eventually(|| fifo_priority(vcpu1) == Ok(None)));
    let out = contended.elapsed();
    assert!(out <= SLICE * 2 + Duration::from_millis(10), "{out:?}");
    assert_eq!(get_nice(vcpu1), Some(NICE));
    // Its gate's thread leaves at the slice's end.
    assert!(eventually(|| a.slice_over()));
    assert_eq!(fifo_priority(me), Ok(None));
    let st = host.lift_state().unwrap();
    assert_eq!((st.fifo_entries, st.deadlines_passed), (1, 1));

    // The grant moves on: vCPU 1's nice is its own again.
    let used = a.held_ns();
    a.release(used, false).unwrap();
    assert!(eventually(|| b.acquire(Duration::from_millis(5)).unwrap()));
    assert!(eventually(|| get_nice(vcpu1) == Some(before)));
    assert_eq!(fifo_priority(vcpu1), Ok(None));

    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    drop((a, b, svc));
    let _ = std::fs::remove_dir_all(&dir);
}
