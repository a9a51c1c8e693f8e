//! The identity a vGPU shows its guests under a real `fairvgpu serve` (sim
//! executor), two VMs: each vGPU has its own UUID, derived from the host id
//! the daemon keeps in run_dir and the VM's name; it is the same after the
//! VM's worker is killed and restarted; the driver release and CUDA version
//! are the host's (the sim's).

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
fn each_vm_has_its_own_uuid_kept_across_a_worker_restart() {
    let bin = cargo_build("cli").join("fairvgpu");
    // One worker per vGPU, restarted on its region (with a worker per
    // process, the default, each process's worker reports the same id).
    let vms = [VmSpec::new("vm1", 256), VmSpec::new("vm2", 256)].map(|v| VmSpec {
        process_slots: 0,
        ..v
    });
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

    let pid = d.worker_pid("vm1").expect("vm1's worker process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    d.wait("vm1's worker restart", Duration::from_secs(60), |d| {
        d.vgpu("vm1")
            .is_ok_and(|v| v["worker_restarts"].as_u64() == Some(1))
    })
    .unwrap();
    assert_ne!(d.worker_pid("vm1"), Some(pid), "a new worker");
    assert_eq!(
        info(&d, "vm1").uuid,
        a.uuid,
        "the UUID changed with the worker"
    );
    assert_eq!(info(&d, "vm2").uuid, b.uuid);
}
