//! A guest late to take its reply because its vCPU thread waits for a CPU
//! is the host's lateness, not its vGPU's: the worker reads how long the
//! VM's vCPU threads waited on a run queue during the wait
//! (`/proc/<tid>/schedstat`) and leaves that part uncharged
//! (`Worker::late_guest_came`). Here the guest's thread shares a CPU with a
//! busy thread, its worker has another CPU, and the waits for it are
//! mostly the guest's waits for its CPU. Sim workers under a real grant
//! service; skipped on one CPU or a kernel without schedstats.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use daemon::grant::GrantService;
use transport::SpinPolicy;

const SLICE_NS: u64 = 6_000_000;

#[test]
fn a_guest_waiting_for_its_cpu_is_late_on_the_hosts_account() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let me = u32::try_from(nix::unistd::gettid().as_raw()).unwrap();
    if cpus < 2 || worker::priority::run_delays(&[me]).is_none() {
        eprintln!("skipped: needs two CPUs and schedstats");
        return;
    }
    let dir = scratch::dir("late-guest-cpu");
    let svc = GrantService::start(&dir.join("grant.sock"), SLICE_NS).unwrap();
    let spin = SpinPolicy {
        spins: 2_000,
        ..SpinPolicy::default()
    };
    // The worker on CPU 1; the guest and a busy thread on CPU 0.
    let (workers, sockets) = tests::granted_sim_workers_on(&dir, svc.path(), 1, spin, Some(1));
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            daemon::hostcpu::cpus::pin_current_thread(&[0]).unwrap();
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let guest = {
        let (socket, stop, vcpus) = (sockets[0].clone(), stop.clone(), tests::vcpus_file(&dir, 0));
        std::thread::spawn(move || {
            daemon::hostcpu::cpus::pin_current_thread(&[0]).unwrap();
            let tid = u32::try_from(nix::unistd::gettid().as_raw()).unwrap();
            wire::vcpus::write_vcpus(&vcpus, &[tid]).unwrap();
            tests::memset_loop(&socket, &stop)
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let rounds = guest.join().unwrap();
    busy.join().unwrap();
    let stats = workers[0].stats.clone();
    for w in workers {
        w.shutdown().unwrap();
    }
    let late = stats.handoff.figures();
    println!("guest rounds {rounds}; its worker: {}", late.line());
    assert!(rounds > 10, "the guest ran");
    assert!(
        late.late_guests >= 10,
        "the worker waited for the guest too seldom to tell: {}",
        late.line()
    );
    assert!(
        late.late_guest_cpu_ns * 100 >= late.late_guest_ns * 15,
        "the guest's waits for its CPU were not seen as the host's: {}",
        late.line()
    );
}
