//! A synchronize of a stream the process's own calls prove idle answers at
//! once, without a round trip (`guest/src/numbering.rs`): after a copy back
//! or a synchronize of it returned without error, with nothing requested
//! since. Anything requested since, another stream, or an error sends it
//! to the host as before. A sim worker, its served requests counted.

use std::sync::atomic::Ordering;

use guest::{Gpu, GuestError};
use protocol::Status;
use worker::executor::sim::SimExecutor;
use worker::serve::{spawn, WorkerConfig};

#[test]
fn synchronizes_of_a_proven_idle_stream_stay_in_the_guest() {
    let dir = scratch::dir("idle-streams");
    let socket = dir.join("vm.sock");
    let wc = WorkerConfig::new("vm", socket.clone(), bench::fairness::GUEST_LAYOUT, 1 << 30);
    let w = spawn(&wc, Box::new(SimExecutor::new(Default::default()))).unwrap();
    let served = || w.stats.requests.load(Ordering::Relaxed);
    let mut gpu = Gpu::connect(&socket).unwrap();
    let p = gpu.mem_alloc(1 << 16).unwrap();
    let (s, s2) = (
        gpu.stream_create(1, 0).unwrap(),
        gpu.stream_create(1, 0).unwrap(),
    );

    // A memset and the copy back on `s`: the copy proves `s` idle.
    gpu.memset_async(p, 7, 1, 4096, s).unwrap();
    let mut back = vec![0u8; 4096];
    gpu.memcpy_dtoh(&mut back, p, s).unwrap();
    assert!(back.iter().all(|&b| b == 7), "the copy came back");
    let n = served();
    gpu.stream_synchronize(s).unwrap();
    gpu.stream_synchronize(s).unwrap();
    assert!(gpu.stream_query(s).unwrap());
    assert_eq!(served(), n, "answered in the guest");

    // Another stream is not proven by it; the context's synchronize is,
    // and covers every stream.
    gpu.stream_synchronize(s2).unwrap();
    assert_eq!(
        served(),
        n + 1,
        "another stream's synchronize reached the host"
    );
    gpu.synchronize().unwrap();
    assert_eq!(served(), n + 2);
    gpu.synchronize().unwrap();
    gpu.stream_synchronize(s2).unwrap();
    assert_eq!(served(), n + 2, "covered by the context's");

    // Work requested since: the host answers again.
    gpu.memset_async(p, 9, 1, 4096, s).unwrap();
    gpu.stream_synchronize(s).unwrap();
    assert_eq!(served(), n + 4, "the memset and its synchronize");

    // A refused request's error comes at the next synchronize, which the
    // host answers; after an error nothing is proven.
    gpu.memset_async(p + (1 << 20), 1, 1, 4096, s).unwrap();
    let e = gpu.stream_synchronize(s).unwrap_err();
    assert!(
        matches!(e, GuestError::Cuda(st) if st != Status::Success),
        "the memset outside the allocation is reported: {e:?}"
    );
    let m = served();
    let _ = gpu.stream_synchronize(s);
    assert_eq!(served(), m + 1, "no proof from a call that failed");
    drop(gpu);
    w.shutdown().unwrap();
}
