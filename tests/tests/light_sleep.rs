//! A worker that keeps the grant alone through its guest's pause sleeps
//! `LIGHT_SLEEP` (50 us) at a time, so that its CPU stays out of a deep idle
//! state and the guest's next call wakes it sooner (after a 10 ms pause,
//! 38-74 us for a kernel and a synchronize through the stand-in on an H100
//! against 68-118 us with long sleeps, natively 17-58:
//! `results/2026-11-27-h100-light-sleep.md`); once it gives the grant back
//! (`LONE_IDLE_KEEP`, 100 ms), it sleeps long again, taking no CPU from
//! the host. Counted by the serving thread's voluntary context switches,
//! one per sleep.

use std::time::Duration;

use daemon::grant::GrantService;
use guest::Gpu;
use transport::SpinPolicy;

/// The voluntary context switches so far of this process's thread named
/// `name`.
fn switches_of(name: &str) -> u64 {
    let tid = tests::own_thread(name).unwrap_or_else(|| panic!("no thread named {name}"));
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no voluntary_ctxt_switches for {name}"))
}

#[test]
fn a_lone_holder_sleeps_lightly_through_a_pause_and_long_once_it_gives_the_grant_back() {
    let dir = scratch::dir("light-sleep");
    let svc = GrantService::start(&dir.join("grant.sock"), 6_000_000).unwrap();
    // A short idle spin, and long sleeps otherwise: a sleep of 500 ms is
    // one switch.
    let spin = SpinPolicy {
        spins: 2_000,
        max_block_us: 500_000,
    };
    let (workers, sockets) = tests::granted_sim_workers(&dir, svc.path(), 1, spin);
    let mut gpu = Gpu::connect(&sockets[0]).unwrap();
    let p = gpu.mem_alloc(1 << 20).unwrap();
    gpu.memset_async(p, 3, 1, 4096, 0).unwrap();
    gpu.synchronize().unwrap();
    // The guest pauses; its worker, alone, keeps the grant.
    std::thread::sleep(Duration::from_millis(5));
    let a = switches_of("worker-vm0");
    std::thread::sleep(Duration::from_millis(50));
    let in_pause = switches_of("worker-vm0") - a;
    // Past the keep, the grant is given back.
    std::thread::sleep(Duration::from_millis(150));
    let b = switches_of("worker-vm0");
    std::thread::sleep(Duration::from_millis(100));
    let idle = switches_of("worker-vm0") - b;
    let releases = workers[0].stats.handoff.figures().idle_releases;
    drop(gpu);
    for w in workers {
        w.shutdown().unwrap();
    }
    println!(
        "sleeps: {in_pause} in 50 ms of the pause, {idle} in 100 ms idle; idle releases {releases}"
    );
    // 1,000 at 50 us each; far fewer on a loaded machine, still many.
    assert!(
        in_pause >= 100,
        "{in_pause} sleeps in 50 ms of a kept pause"
    );
    assert_eq!(releases, 1, "the grant went back once, after the keep");
    assert!(idle <= 10, "{idle} sleeps in 100 ms once idle");
}
