//! Managed memory through the stand-in (`tests/c/managed.c`) against a sim
//! worker: on the device and migrating on touch, larger than the pinned
//! pool, exact with the CPU's and a kernel's atomics on one counter, and
//! from the pool where the program asks for it (`FAIRVGPU_MANAGED=pool`).

use tests::{assert_lines, build_c_standin, run_program, standin, workspace, Host};

#[test]
fn managed_memory_lives_on_the_device_and_migrates_on_touch() {
    let host = Host::start("managed", 512 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c_standin("managed", &dir, &lib, &[]);
    let ptx = workspace().join("worker/kernels/fairvgpu.ptx");
    let lp = lib.to_string_lossy().into_owned();
    let out = run_program(&exe, &[&ptx], &lp, &host.socket, &[]);
    assert_lines(
        &out,
        &[
            "ok: managed memory",
            "ok: concurrent managed access",
            "ok: no pageable memory access",
            "ok: no host-native atomics",
            "ok: managed memory counts against the vGPU's memory",
            "ok: a managed pointer is managed",
            "ok: its host pointer is itself",
            "ok: a new allocation reads as zeros",
            "ok: 64 MiB arrays filled on the CPU, a kernel over them, checked on the CPU",
            "ok: CPU writes after a kernel are seen by the next kernel",
            "ok: a CPU access while kernels are queued sees their result",
            "ok: freed managed memory is the vGPU's again",
            "ok: a kernel's and the CPU's atomics on one counter all count",
            "ok: host-attached memory set on the device reads so on the CPU",
            "ok: a copy out of managed memory",
            "ok: a device-to-host copy into managed memory",
            "ok: a host-to-device copy out of managed memory",
            "ok: prefetched to the device",
            "ok: prefetched to the CPU",
            "ok: advice kept",
            "ok: read-mostly kept",
            "ok: prefetch of memory that is not managed refused: CUDA_ERROR_INVALID_VALUE",
            "ok: prefetch to a device that is not there refused: CUDA_ERROR_INVALID_DEVICE",
            "ok: the program's own SIGSEGV handler still gets its faults",
            "managed: all checks passed",
        ],
    );
    host.wait_program_freed();

    let pool = std::ffi::OsString::from("pool");
    let out = run_program(
        &exe,
        &[ptx.as_os_str(), &pool],
        &lp,
        &host.socket,
        &[("FAIRVGPU_MANAGED", "pool")],
    );
    assert_lines(
        &out,
        &[
            "ok: a managed array larger than the pool refused: CUDA_ERROR_OUT_OF_MEMORY",
            "ok: pool memory is no device memory",
            "ok: pool managed memory copied to the device and back",
            "managed: all checks passed",
        ],
    );
    host.wait_program_freed();
}
