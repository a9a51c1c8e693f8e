//! Shareable handles (POSIX file descriptors) between two processes of one
//! VM, through the stand-in against a sim worker (`tests/c/shareable.c`):
//! the exporter's descriptors travel over a Unix socket (SCM_RIGHTS); the
//! importer maps the exporter's VMM memory and both see each other's
//! writes; a pool and one of its allocations are imported and read;
//! descriptors that are not handles are refused; once the exporter ends its
//! descriptors import nothing, and all the memory comes back. Then the same
//! where each process has a worker of its own (process slots).

use std::path::Path;

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use tests::{assert_lines, build_c_standin, cargo_build, run_program, standin, Host};

#[test]
fn shareable_handles_share_vmm_memory_and_pools_between_processes_of_a_vm() {
    let host = Host::start("shareable", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    run(&dir, &host.socket);
    host.wait_program_freed();
}

/// The same program where each process of the VM has a worker of its own
/// (process slots): the handles cross worker processes (`ipc_across.rs`).
#[test]
fn shareable_handles_pass_between_processes_of_a_vm_with_process_slots() {
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 3;
    let d = DaemonProc::start(
        &cargo_build("cli").join("fairvgpu"),
        "shareable-slots",
        ExecutorKind::Sim,
        &[vm],
    )
    .unwrap();
    let socket = d.socket("vm1");
    run(socket.parent().unwrap(), &socket);
}

/// Runs `tests/c/shareable.c` on the VM at `socket` and checks what it
/// printed.
fn run(dir: &Path, socket: &Path) {
    let lib = standin(dir);
    let exe = build_c_standin("shareable", dir, &lib, &[]);
    let out = run_program::<&str>(&exe, &[], &lib.to_string_lossy(), socket, &[]);
    assert_lines(
        &out,
        &[
            "ok: the device serves descriptors",
            "ok: a Windows handle refused: CUDA_ERROR_NOT_SUPPORTED",
            "ok: export of memory made without the descriptor type refused: CUDA_ERROR_INVALID_VALUE",
            "ok: the exported handle is a descriptor",
            "ok: a closed descriptor refused: CUDA_ERROR_INVALID_VALUE",
            "ok: a pipe refused: CUDA_ERROR_INVALID_VALUE",
            "ok: a pool's descriptor as memory refused: CUDA_ERROR_INVALID_VALUE",
            "ok: a forged descriptor refused: CUDA_ERROR_INVALID_VALUE",
            "ok: an imported handle's properties",
            "ok: the exporter's bytes",
            "ok: memory as a pool refused: CUDA_ERROR_INVALID_VALUE",
            "ok: read-write access to the imported pool",
            "ok: an allocation from an imported pool refused: CUDA_ERROR_INVALID_VALUE",
            "ok: a pointer through another pool refused: CUDA_ERROR_INVALID_VALUE",
            "ok: zeroed export data refused: CUDA_ERROR_INVALID_VALUE",
            "ok: the pointer at the exporter's address",
            "ok: the pool allocation's bytes",
            "ok: an imported pointer freed twice refused: CUDA_ERROR_INVALID_VALUE",
            "ok: the exporter sees the importer's writes",
            "ok: the exporter ended well",
            "ok: an ended exporter's descriptor imports nothing",
            "ok: an ended exporter's pool imports nothing",
            "ok: what the importer mapped stays until it unmaps it",
            "shareable: all checks passed",
        ],
    );
}
