//! The identity a vGPU shows its guests under a real `fairvgpu serve` (sim
//! executor), two VMs: each vGPU has its own UUID, derived from the host id
//! the daemon keeps in run_dir and the VM's name; it is the same after the
//! process's worker is killed and the VM's next process has a new one;
//! the driver release and CUDA version are the host's (the sim's).

use std::time::{Duration, Instant};

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use guest::Gpu;
use tests::{cargo_build, TEST_SPIN};
use wire::identity;

/// The description a guest of `vm` gets, waiting for its worker to serve.
fn info(d: &DaemonProc, vm: &str) -> protocol::DeviceInfo {
    let t = Instant::now();
    loop {
        if let Ok(g) = Gpu::connect_with(&d.socket(vm), TEST_SPIN) {
            return g.device_info().clone();
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{vm} never served");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn each_vm_has_its_own_uuid_kept_across_its_processes_workers() {
    let bin = cargo_build("cli").join("fairvgpu");
    let vms = [VmSpec::new("vm1", 256), VmSpec::new("vm2", 256)];
    let d = DaemonProc::start(&bin, "identity", ExecutorKind::Sim, &vms).unwrap();
    let run_dir = d.socket("vm1").parent().unwrap().to_owned();
    let host = identity::host_id(&run_dir).expect("the daemon made the host id");

    let (a, b) = (info(&d, "vm1"), info(&d, "vm2"));
    assert_eq!(a.uuid, Some(identity::vgpu_uuid(&host, "vm1")));
    assert_eq!(b.uuid, Some(identity::vgpu_uuid(&host, "vm2")));
    assert_ne!(a.uuid, b.uuid, "two VMs of one daemon share a UUID");
    for i in [&a, &b] {
        assert_eq!(i.driver_version, worker::executor::sim::SIM_DRIVER_RELEASE);
        assert_eq!(i.cuda_version, 13000);
    }

    // A process of vm1 whose worker is killed, then the VM's next process
    // on a new worker: the same UUID.
    let held = Gpu::connect_with(&d.socket("vm1"), TEST_SPIN).expect("vm1 attaches");
    d.wait("vm1's worker", Duration::from_secs(20), |d| {
        d.worker_pids("vm1").len() == 1
    })
    .unwrap();
    let pid = d.worker_pids("vm1")[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    d.wait_worker_faults("vm1", 1, Duration::from_secs(60))
        .unwrap();
    drop(held);
    let next = info(&d, "vm1");
    assert!(!d.worker_pids("vm1").contains(&pid), "a new worker");
    assert_eq!(next.uuid, a.uuid, "the UUID changed with the worker");
    assert_eq!(info(&d, "vm2").uuid, b.uuid);
}
