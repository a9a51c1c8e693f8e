//! A vGPU served by several workers (a worker per guest process): its
//! memory limit holds over all of them (the ledger they share) and they
//! take one place in the GPU's fair queue (their gates register as
//! members). Each worker here serves its own socket, as each guest
//! process's worker would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use guest::{Gpu, GuestError};
use protocol::Status;
use tests::{worker_config, TEST_SPIN};
use worker::executor::sim::{SimExecutor, SimParams};
use worker::ledger::Ledger;
use worker::serve::spawn;

const MIB: u64 = 1 << 20;

fn oom(r: Result<u64, GuestError>) -> bool {
    matches!(r, Err(GuestError::Cuda(Status::OutOfMemory)))
}

#[test]
fn a_vgpus_workers_share_its_memory_limit_and_its_place_in_the_queue() {
    let dir = scratch::dir("fvg-vgpu-workers");
    let grant = daemon::grant::GrantService::start(&dir.join("g.sock"), 2_000_000).unwrap();
    let ledger = Arc::new(Ledger::create("fvg-vgpu-workers").unwrap());
    let dev = SimExecutor::new(SimParams::default());
    let workers: Vec<_> = (0..2)
        .map(|i| {
            let mut cfg = worker_config(&format!("p{i}"), dir.join(format!("p{i}.sock")), 64 * MIB);
            cfg.grant = Some((grant.path().to_owned(), 7, 1.0));
            cfg.shared_vgpu = Some(ledger.clone());
            spawn(&cfg, Box::new(dev.clone())).unwrap()
        })
        .collect();
    let mut a = Gpu::connect_with(&dir.join("p0.sock"), TEST_SPIN).unwrap();
    let mut b = Gpu::connect_with(&dir.join("p1.sock"), TEST_SPIN).unwrap();

    // One limit over both workers.
    let big = a.mem_alloc(40 * MIB).unwrap();
    assert!(oom(b.mem_alloc(40 * MIB)), "40 + 40 MiB > 64 MiB");
    let small = b.mem_alloc(20 * MIB).unwrap();
    let (free, total) = b.mem_get_info().unwrap();
    assert_eq!(total, 64 * MIB);
    assert!(
        free <= 4 * MIB,
        "free counts the other worker's too: {free}"
    );
    a.mem_free(big).unwrap();
    let again = b.mem_alloc(40 * MIB).unwrap();
    b.mem_free(again).unwrap();
    b.mem_free(small).unwrap();

    // One place in the queue: both computed under the vGPU's grants,
    // which the service counts as one vGPU's.
    for g in [&mut a, &mut b] {
        let p = g.mem_alloc(MIB).unwrap();
        g.memcpy_htod(p, &vec![1u8; MIB as usize]).unwrap();
        g.synchronize().unwrap();
        g.mem_free(p).unwrap();
    }
    let t = Instant::now();
    let live = loop {
        let live = grant.live();
        if live.get(&7).is_some_and(|v| v.charged_ns > 0) || t.elapsed() > Duration::from_secs(5) {
            break live;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(live.len(), 1, "one vGPU at the service: {live:?}");
    assert!(live[&7].connected && live[&7].charged_ns > 0, "{live:?}");
    drop((a, b));
    for w in workers {
        w.shutdown().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
