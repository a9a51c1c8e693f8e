//! Worker faults under a real `fairvgpu serve` (sim executor), two VMs: a
//! guest's kernel fault poisons its vGPU's worker, then that worker is
//! killed outright. Each time the daemon restarts the worker on the same
//! region, the VM's guests get `VgpuReset` and recover by opening the GPU
//! again, and the other VM's guest runs on, checked element by element,
//! without one error. (The same scenario is `fairvgpu bench recovery`,
//! which runs it on a real GPU with `--executor cuda`.)

use bench::recovery::measure;
use daemon::config::ExecutorKind;
use tests::cargo_build;

#[test]
fn poisoned_or_killed_worker_is_replaced_and_only_its_guests_see_it() {
    let bin = cargo_build("cli").join("fairvgpu");
    // The daemon's log is kept, not printed: its fault and restarts are
    // expected, and asserted below.
    let r = measure(&bin, ExecutorKind::Sim, Some("warn")).expect("scenario runs");
    assert_eq!(r.fault, "IllegalAddress");
    assert!(r.reset_seen, "vm1's guests were told VgpuReset");
    assert_eq!(r.restarts, (2, 0), "vm1 restarted twice, vm2 never");
    assert_eq!(
        r.other_errors, 0,
        "vm2 undisturbed: {:?}",
        r.other_first_error
    );
    assert!(
        r.other_rounds_during_restarts > 0,
        "vm2 ran during the restarts"
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
    // A vGPU's one worker, restarted on its region (a worker per process,
    // the default, is not: `slots_on_demand.rs`).
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 0;
    let vms = [vm];
    let mut d = DaemonProc::start(&bin, "daemon-kill", ExecutorKind::Sim, &vms).unwrap();
    let mut gpu =
        guest::Gpu::connect_with(&d.socket("vm1"), tests::TEST_SPIN).expect("guest attaches");
    gpu.mem_alloc(64 << 20).unwrap();
    let pid = d.worker_pid("vm1").expect("worker runs");
    d.kill_hard();
    // The worker sees its feed close, frees its contexts and exits.
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
