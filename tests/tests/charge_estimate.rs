//! A vGPU's untimed busy periods of one kernel are charged that kernel's
//! mean device time from its timed periods (`sched::accounting::LaunchTime`),
//! not their host-clock time, which holds whatever delayed the worker (on a
//! busy host, its wait for a CPU). Sim worker under a real grant service,
//! one guest in a launch + synchronize loop of one kernel.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use daemon::grant::GrantService;
use guest::Gpu;
use protocol::{Dim3, ImageKind};
use transport::SpinPolicy;

const SLICE_NS: u64 = 6_000_000;
const KERNEL_NS: u64 = 20_000;

#[test]
fn untimed_periods_of_one_kernel_are_charged_its_timed_mean() {
    let dir = scratch::dir("charge-estimate");
    let svc = GrantService::start(&dir.join("grant.sock"), SLICE_NS).unwrap();
    let (workers, sockets) = tests::granted_sim_workers(&dir, svc.path(), 1, SpinPolicy::default());
    let mut gpu = Gpu::connect(&sockets[0]).unwrap();
    let m = gpu
        .module_load(ImageKind::Ptx, worker::KERNELS_PTX.as_bytes())
        .unwrap();
    let f = gpu.get_function(m, "spin_ns").unwrap();
    let ns = KERNEL_NS.to_le_bytes();
    let one = Dim3 { x: 1, y: 1, z: 1 };
    let end = Instant::now() + Duration::from_millis(1500);
    let mut n = 0u64;
    while Instant::now() < end {
        gpu.launch(&f, one, one, 0, 0, &[&ns]).unwrap();
        gpu.synchronize().unwrap();
        n += 1;
    }
    drop(gpu);
    let stats = workers[0].stats.clone();
    for w in workers {
        w.shutdown().unwrap();
    }
    let count = |k: usize| stats.periods[k].load(Ordering::Relaxed);
    let mean =
        |k: usize| stats.period_charges[k].load(Ordering::Relaxed) as f64 / count(k).max(1) as f64;
    println!(
        "{n} kernels; periods first / timed / host clock / estimated: {} / {} / {} / {}; \
         mean charges (us) {:.2} / {:.2} / {:.2} / {:.2}",
        count(0),
        count(1),
        count(2),
        count(3),
        mean(0) / 1e3,
        mean(1) / 1e3,
        mean(2) / 1e3,
        mean(3) / 1e3
    );
    assert!(n > 200, "only {n} kernels ran");
    // One in eight is timed; past the first few, every untimed period is
    // one launch of the one kernel, charged by the estimate.
    assert!(
        count(3) > count(2) * 10 && count(3) > count(1) * 3,
        "untimed periods charged on the host clock, not by the kernel's timed mean"
    );
    // Each untimed period is charged the mean learnt so far; where the
    // host's speed drifts during the run (a loaded CI machine: 3.4% once),
    // their mean strays from the timed periods' final one by as much.
    let (timed, estimated) = (mean(1), mean(3));
    assert!(
        (estimated - timed).abs() < 0.05 * timed,
        "estimated charges {estimated:.0} ns against timed {timed:.0} ns"
    );
}
