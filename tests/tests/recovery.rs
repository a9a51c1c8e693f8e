//! Worker faults under a real `fairvgpu serve` (sim executor), two VMs: a
//! guest process's kernel fault poisons its own worker, then another
//! process's worker is killed outright. Each time that process alone gets
//! `VgpuReset`, a process of the same VM beside it computes on, the VM's
//! next process computes on a new worker, and the other VM's guest runs
//! on, checked element by element, without one error. (The same scenario
//! is `fairvgpu bench recovery`, which runs it on a real GPU with
//! `--executor cuda`.) When the daemon is killed, every worker frees what
//! it held and exits.

use bench::recovery::measure;
use daemon::config::ExecutorKind;
use tests::cargo_build;

#[test]
fn a_poisoned_or_killed_worker_is_its_process_alone() {
    let bin = cargo_build("cli").join("fairvgpu");
    // The daemon's log is kept, not printed: its fault and restarts are
    // expected, and asserted below.
    let r = measure(&bin, ExecutorKind::Sim, Some("warn")).expect("scenario runs");
    assert_eq!(r.fault, "IllegalAddress");
    assert!(
        r.reset_seen,
        "vm1's faulting and killed processes were told VgpuReset"
    );
    assert!(r.bystander_ok, "vm1's bystander computed on");
    assert_eq!(
        r.faults,
        (2, 0),
        "two of vm1's workers ended, none of vm2's"
    );
    assert_eq!(
        r.other_errors, 0,
        "vm2 undisturbed: {:?}",
        r.other_first_error
    );
    assert!(
        r.other_rounds_during_faults > 0,
        "vm2 ran while vm1 recovered"
    );
    assert_eq!(r.leaked_bytes, 0, "vm1's memory freed");
    let log = r.daemon_log.expect("log kept");
    assert!(
        log.lines().any(|l| l.contains("ERROR")
            && l.contains("IllegalAddress poisoned this worker's GPU contexts")),
        "the poisoning is logged as an error:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|l| (l.contains("WARN") || l.contains("ERROR")) && l.contains("vm2")),
        "nothing went wrong for vm2:\n{log}"
    );
}

#[test]
fn workers_free_everything_and_exit_when_the_daemon_is_killed() {
    use bench::fixture::{DaemonProc, VmSpec};
    use std::time::{Duration, Instant};
    let bin = cargo_build("cli").join("fairvgpu");
    let vms = [VmSpec::new("vm1", 256)];
    let mut d = DaemonProc::start(&bin, "daemon-kill", ExecutorKind::Sim, &vms).unwrap();
    let mut gpu =
        guest::Gpu::connect_with(&d.socket("vm1"), tests::TEST_SPIN).expect("guest attaches");
    gpu.mem_alloc(64 << 20).unwrap();
    // The guest's worker, and the GPU's spare started after it was bound.
    tests::wait_for_workers(&d, 2, "the guest's worker and the spare");
    let pids = tests::worker_pids(&d);
    d.kill_hard();
    // Each worker sees its feed (a spare, its socket) close, frees its
    // contexts and exits.
    for pid in pids {
        wait_gone(pid);
    }
    // The guest finds out instead of hanging: the worker gave its channel
    // up (LOST) on the way out, whatever ended it.
    let t = Instant::now();
    let r = gpu.mem_alloc(16);
    assert!(matches!(r, Err(guest::GuestError::VgpuReset)), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
}

/// Waits up to 10 s for process `pid` to exit (a zombie has).
fn wait_gone(pid: i32) {
    use std::time::{Duration, Instant};
    let t = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        });
        if zombie {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "worker {pid} outlived its daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
