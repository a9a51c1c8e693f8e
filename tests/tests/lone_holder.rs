//! A vGPU alone on its GPU keeps the grant through its guest's short CPU
//! pauses (up to 100 ms: `worker/src/serve/serving.rs`, `Worker::keep_alone`),
//! so that its next call does not wait for the grant service to grant it
//! again; and it gives the grant back at once when another vGPU asks, even
//! asleep. Sim workers under a real grant service.

use std::time::{Duration, Instant};

use daemon::grant::GrantService;
use guest::Gpu;
use transport::SpinPolicy;

/// The grant service's base slice.
const SLICE_NS: u64 = 6_000_000;

/// A call that needs the GPU, complete when it returns.
fn gpu_call(gpu: &mut Gpu, p: u64) {
    gpu.memset_async(p, 3, 1, 4096, 0).unwrap();
    gpu.synchronize().unwrap();
}

#[test]
fn a_lone_vgpu_keeps_its_grant_through_short_pauses_and_gives_it_up_when_asked() {
    let dir = scratch::dir("lone-holder");
    let svc = GrantService::start(&dir.join("grant.sock"), SLICE_NS).unwrap();
    // A short idle spin, so that each pause outlasts it; and long sleeps,
    // so that only the grant's socket can wake a sleeping holder in time
    // for the other vGPU.
    let spin = SpinPolicy {
        spins: 2_000,
        max_block_us: 500_000,
    };
    let (workers, sockets) = tests::granted_sim_workers(&dir, svc.path(), 2, spin);
    let mut a = Gpu::connect(&sockets[0]).unwrap();
    let pa = a.mem_alloc(1 << 20).unwrap();
    for _ in 0..6 {
        gpu_call(&mut a, pa);
        std::thread::sleep(Duration::from_millis(20));
    }
    let alone = workers[0].stats.handoff.figures();
    // Now the other vGPU asks while the first holds the GPU with nothing
    // to run, its worker asleep.
    gpu_call(&mut a, pa);
    let mut b = Gpu::connect(&sockets[1]).unwrap();
    let pb = b.mem_alloc(1 << 20).unwrap();
    let t = Instant::now();
    gpu_call(&mut b, pb);
    let waited = t.elapsed();
    let shared = workers[0].stats.handoff.figures();
    drop((a, b));
    for w in workers {
        w.shutdown().unwrap();
    }
    println!(
        "alone: {}; the other vGPU's first call took {waited:?}; then: {}",
        alone.line(),
        shared.line()
    );
    assert_eq!(
        alone.idle_releases, 0,
        "a lone vGPU gave its grant back in its guest's 20 ms pauses"
    );
    assert!(
        shared.idle_releases >= 1,
        "the lone holder gave the grant back when the other vGPU asked"
    );
    assert!(
        waited < Duration::from_millis(200),
        "the other vGPU waited {waited:?} for a holder with nothing to run \
         (its worker asleep for up to 500 ms)"
    );
}
