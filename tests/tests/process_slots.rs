//! A VM with process slots (`[[vm]] process_slots`), each guest process
//! served by a worker process of its own, against a real `fairvgpu serve`
//! on the sim: one process's sticky faults (a failed assert, a trap) and
//! its kernels' stray pointers stay its own. A checked process computing
//! throughout sees no error, the VM's next process computes at once after
//! each fault, and a kernel given another process's buffer by address
//! faults in its own process alone. (The sim gives each context addresses
//! of its own, so the read fails here with one worker for the VM too; on
//! a GPU the contexts of one process share their addresses, and only
//! process slots keep the read out: `scripts/gpu/faults.sh`. With one
//! worker for the VM, the checked process here sees the faults' errors.)

use std::process::{Child, Stdio};

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use tests::faults::{text, Rig};
use tests::{cargo_build, workspace};

/// The address a `hold` process holds its buffer at, and its process.
fn holder(r: &Rig, secs: &str) -> (Child, String) {
    let (child, line) = r.started("hold", &[secs]);
    let addr = line
        .trim()
        .strip_prefix("holding ")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_owned();
    (child, addr)
}

/// What a process reading `addr` by kernel (`peek`) got.
fn peek(r: &Rig, addr: &str) -> String {
    let kernels = workspace().join("worker/kernels/fairvgpu.ptx");
    let kernels = kernels.to_str().expect("a path in UTF-8");
    text(&r.run("peek", &[addr, kernels]).stdout)
}

#[test]
fn each_process_of_a_vm_with_slots_keeps_its_faults_and_memory_to_itself() {
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 4;
    let r = Rig::start("process-slots", vm);

    // The checked process computes for the whole sequence.
    let checked = r
        .program("loop", &["8"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();

    // Another process's buffer, read by address from a kernel: not there.
    let (mut held, addr) = holder(&r, "3");
    let seen = peek(&r, &addr);
    assert!(seen.starts_with("peek: "), "{seen}");
    assert!(
        !seen.contains("1234.5"),
        "read another process's memory: {seen}"
    );
    assert!(held.wait().unwrap().success());

    // Faults, in turn: each its own process's error; the next process
    // computes at once (another slot's worker serves it).
    let after_assert = r.fault_then_next("assert", "assert sync: CUDA_ERROR_ASSERT");
    let after_trap = r.fault_then_next("trap", "trap sync: CUDA_ERROR_LAUNCH_FAILED");
    eprintln!(
        "next process computed {} ms after an assert, {} ms after a trap",
        after_assert.as_millis(),
        after_trap.as_millis()
    );

    let out = checked.wait_with_output().unwrap();
    let line = text(&out.stdout);
    assert!(
        line.contains(" 0 errors"),
        "the checked process saw: {line}"
    );
    let rounds: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(rounds > 10, "{line}");
    let log = std::fs::read_to_string(r.d.log_path()).unwrap();
    assert!(log.contains("poisoned"), "the faults were not seen:\n{log}");
}

/// A monitor (`nvidia-smi` in the guest, through the NVML stand-in) sees
/// every process of a VM with process slots, each served by another worker,
/// with the memory it holds, and the VM's memory over all of them.
#[test]
fn a_monitor_sees_the_processes_of_every_slot() {
    use guest::Gpu;
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 3;
    let d = DaemonProc::start(
        &cargo_build("cli").join("fairvgpu"),
        "slot-monitor",
        ExecutorKind::Sim,
        &[vm],
    )
    .unwrap();
    let sock = d.socket("vm1");
    let mut a = Gpu::connect_with(&sock, tests::TEST_SPIN).unwrap();
    let mut b = Gpu::connect_with(&sock, tests::TEST_SPIN).unwrap();
    a.mem_alloc(8 << 20).unwrap();
    b.mem_alloc(16 << 20).unwrap();
    let mut monitor = Gpu::monitor(&sock, tests::TEST_SPIN).unwrap();
    // Each slot's worker publishes its process when it next looks at the
    // clock (within milliseconds).
    let t = std::time::Instant::now();
    let report = loop {
        let r = monitor.vgpu_status().unwrap();
        let mut held: Vec<u64> = r.processes.iter().map(|p| p.mem_used).collect();
        held.sort_unstable();
        if held.len() == 2 && held[0] >= 8 << 20 && held[1] >= 16 << 20 {
            break r;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "{r:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(report.mem_used >= 24 << 20, "{report:?}");
    drop((a, b));
}
