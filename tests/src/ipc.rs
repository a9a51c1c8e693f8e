//! What the tests of IPC between a VM's processes share
//! (`ipc_across_workers.rs`, `hostile_ipc_across.rs`, `hostile_shareable.rs`):
//! a daemon on the sim with two VMs of process slots, its guests, their
//! requests and refusals, and VMM memory mapped.

use std::time::{Duration, Instant};

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use guest::{Gpu, GuestError};
use protocol::{Request, Status, VMM_GRANULARITY as G};

use crate::cargo_build;

/// A daemon on the sim with `vm1` (3 process slots) and `vm2` (2).
pub fn daemon(tag: &str) -> DaemonProc {
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 3;
    let mut other = VmSpec::new("vm2", 256);
    other.process_slots = 2;
    DaemonProc::start(
        &cargo_build("cli").join("fairvgpu"),
        tag,
        ExecutorKind::Sim,
        &[vm, other],
    )
    .unwrap()
}

/// A new guest process of `vm`.
pub fn guest(d: &DaemonProc, vm: &str) -> Gpu {
    Gpu::connect_with(&d.socket(vm), crate::TEST_SPIN).unwrap()
}

/// `r`'s reply values.
pub fn req(g: &mut Gpu, r: Request) -> Result<[u64; 4], GuestError> {
    g.request(&r).map(|x| x.vals)
}

/// `r` was refused as the driver refuses an invalid handle.
pub fn refused(r: Result<[u64; 4], GuestError>, what: &str) {
    assert!(
        matches!(
            r,
            Err(GuestError::Cuda(
                Status::InvalidValue | Status::InvalidContext
            ))
        ),
        "{what}: {r:?}"
    );
}

/// vm1's memory over all its workers, as a monitor sees it, once it is
/// what `ok` wants (within 10 s).
pub fn vm_memory(d: &DaemonProc, ok: impl Fn(u64) -> bool) -> u64 {
    let mut m = Gpu::monitor(&d.socket("vm1"), crate::TEST_SPIN).unwrap();
    let t = Instant::now();
    loop {
        let used = m.vgpu_status().unwrap().mem_used;
        if ok(used) || t.elapsed() > Duration::from_secs(10) {
            return used;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `len` bytes of device memory at `ptr`.
pub fn read(g: &mut Gpu, ptr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    g.memcpy_dtoh(&mut out, ptr, 0).unwrap();
    out
}

/// Reserves `2 * G` and maps `handle` (`G` bytes) at its start.
pub fn map(g: &mut Gpu, handle: u64) -> u64 {
    let va = req(
        g,
        Request::VmmReserve {
            size: 2 * G,
            align: 0,
            addr: 0,
        },
    )
    .unwrap()[0];
    req(
        g,
        Request::VmmMap {
            ptr: va,
            size: G,
            offset: 0,
            handle,
        },
    )
    .unwrap();
    va
}
