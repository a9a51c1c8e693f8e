//! What upstream programs (cuda-samples' p2pBandwidthLatencyTest,
//! graphMemoryNodes, systemWideAtomics, cudaCompressibleMemory,
//! streamOrderedAllocationIPC, memMapIPCDrv; Numba's
//! driver tests) ask of the driver, asked through the stand-in by
//! `tests/c/samples31.c` against a sim worker: each answer is the driver's
//! on a machine of one GPU without the features a vGPU lacks.

use tests::{assert_lines, build_c_standin, run_program, standin, workspace, Host};

#[test]
fn upstream_programs_get_the_drivers_answers() {
    let host = Host::start("samples31", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c_standin("samples31", &dir, &lib, &[]);
    let ptx = workspace().join("worker/kernels/fairvgpu.ptx");
    let out = run_program(&exe, &[ptx], &lib.to_string_lossy(), &host.socket, &[]);
    assert_lines(
        &out,
        &[
            "ok: a device is no peer of itself",
            "ok: peer access to a context of the same device refused: CUDA_ERROR_INVALID_DEVICE",
            "ok: disabling peer access never enabled refused: CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
            "ok: cuMemcpyPeer within the one device",
            "ok: cuMemcpyPeerAsync within the one device",
            "ok: a peer copy naming no context refused: CUDA_ERROR_INVALID_CONTEXT",
            "ok: graph memory freed outside its graph (cuMemFree)",
            "ok: graph memory freed outside its graph again after a launch (cuMemFreeAsync)",
            "ok: a second free before the graph runs again refused: CUDA_ERROR_INVALID_VALUE",
            "ok: graph memory given back with its executable",
            "ok: a block of 1025 threads refused: CUDA_ERROR_INVALID_VALUE",
            "ok: a block of 64x32 threads refused: CUDA_ERROR_INVALID_VALUE",
            "ok: a block 65 deep refused: CUDA_ERROR_INVALID_VALUE",
            "ok: an empty block refused: CUDA_ERROR_INVALID_VALUE",
            "ok: blocks within the limits launch, and nothing refused was left behind",
            "ok: a mapped allocation's address range",
            "ok: a managed allocation's address range",
            "ok: cuMemFreeAsync of a null pointer",
            "ok: cuMemFreeAsync of managed memory",
            "ok: managed memory freed once",
            "ok: managed memory",
            "ok: concurrent managed access",
            "ok: no host-native atomics",
            "ok: generic compression as the host's GPU has it",
            "ok: VMM handles as file descriptors",
            "ok: memory pools shareable as file descriptors only",
            "ok: no fabric handles",
            "ok: memory on the registering thread's stack registered, copied and intact",
            "ok: registered twice refused",
            "ok: the stack registration returned",
            "samples31: all checks passed",
        ],
    );
    host.wait_program_freed();
}
