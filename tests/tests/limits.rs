//! A VM's device-memory limit changed in host.toml applies on reload to
//! the running guest's next allocations, without restarting anything.

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use guest::{Gpu, GuestError};
use protocol::Status;
use tests::{cargo_build, TEST_SPIN};

fn set_limit_and_reload(d: &DaemonProc, mib: u64) {
    let path = d.dir.join("host.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("memory_limit_mib"))
        .unwrap()
        .to_owned();
    std::fs::write(
        &path,
        text.replace(&line, &format!("memory_limit_mib = {mib}")),
    )
    .unwrap();
    let (code, body) = d.post("/api/v1/reload", "").unwrap();
    assert_eq!(code, 200, "{body}");
    // The daemon applies it on its next supervision turn (20 ms).
    std::thread::sleep(std::time::Duration::from_millis(300));
}

#[test]
fn memory_limit_changes_apply_to_the_running_guest() {
    let bin = cargo_build("cli").join("fairvgpu");
    let vms = [VmSpec::new("vm1", 256)];
    let d = DaemonProc::start(&bin, "limits", ExecutorKind::Sim, &vms).unwrap();
    let mut gpu = Gpu::connect_with(&d.socket("vm1"), TEST_SPIN).unwrap();
    let big = gpu.mem_alloc(200 << 20).unwrap();
    let oom = |r: Result<u64, GuestError>| matches!(r, Err(GuestError::Cuda(Status::OutOfMemory)));

    // Lowered below what is held: what is held stays, nothing more fits.
    set_limit_and_reload(&d, 128);
    assert!(oom(gpu.mem_alloc(1 << 20)), "over the new limit");
    assert_eq!(
        gpu.mem_get_info().unwrap().1,
        128 << 20,
        "total is the limit"
    );
    gpu.mem_free(big).unwrap();
    let a = gpu.mem_alloc(100 << 20).unwrap();
    assert!(oom(gpu.mem_alloc(64 << 20)), "100 + 64 > 128");

    // Raised: more fits at once.
    set_limit_and_reload(&d, 512);
    let b = gpu.mem_alloc(300 << 20).unwrap();
    gpu.mem_free(a).unwrap();
    gpu.mem_free(b).unwrap();
    let v = d.vgpu("vm1").unwrap();
    assert_eq!(v["memory_limit_bytes"], 512u64 << 20);

    // Through the API: lowered again, at once.
    let (code, body) = d
        .post("/api/v1/vgpus/vm1/memory_limit", "{\"mib\": 64}")
        .unwrap();
    assert_eq!(code, 200, "{body}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(oom(gpu.mem_alloc(65 << 20)), "over the API's limit");
    let small = gpu.mem_alloc(32 << 20).unwrap();
    gpu.mem_free(small).unwrap();
    let v = d.vgpu("vm1").unwrap();
    assert_eq!(v["memory_limit_bytes"], 64u64 << 20);
    assert_eq!(v["worker_faults"], 0, "nothing restarted");
}
