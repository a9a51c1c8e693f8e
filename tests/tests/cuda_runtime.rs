//! Programs built on NVIDIA's CUDA runtime run against the stand-in on the
//! sim executor: a C program using `libcudart.so` (built with the system C
//! compiler against the runtime's headers), and a CUDA C++ program built
//! with `nvcc` as a tenant builds it (static runtime, registered fat
//! binary). NVIDIA's pieces come from PyPI's wheels (`nvidia-cuda-runtime`,
//! `nvidia-cuda-nvcc`, ...): `scripts/check` unpacks them and points
//! `FAIRVGPU_CUDA_ROOT` at them (`include/`, `lib/`, `bin/nvcc`). Without
//! it the tests skip, unless `FAIRVGPU_REQUIRE_CUDART=1` (CI), where its
//! absence fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use tests::{assert_lines, run_program, standin, workspace, Host};

/// The unpacked CUDA wheels, or `None` (the test skips).
fn cuda_root() -> Option<PathBuf> {
    let root = std::env::var_os("FAIRVGPU_CUDA_ROOT").map(PathBuf::from);
    let ok = root
        .as_ref()
        .is_some_and(|r| r.join("include/cuda_runtime_api.h").exists() && r.join("lib").exists());
    if !ok {
        assert!(
            std::env::var_os("FAIRVGPU_REQUIRE_CUDART").is_none(),
            "FAIRVGPU_REQUIRE_CUDART is set but FAIRVGPU_CUDA_ROOT ({root:?}) holds no CUDA runtime"
        );
        eprintln!(
            "skipped: FAIRVGPU_CUDA_ROOT does not name the CUDA wheels (scripts/check sets it)"
        );
        return None;
    }
    root
}

/// Runs `exe` with `args` through the stand-in in `lib` (NVIDIA's runtime
/// from `cuda`) on the host at `socket`.
fn run(exe: &Path, args: &[&Path], lib: &Path, cuda: &Path, socket: &Path) -> String {
    let path = format!("{}:{}", lib.display(), cuda.join("lib").display());
    run_program(exe, args, &path, socket, &[])
}

#[test]
fn a_c_program_on_nvidias_cuda_runtime_runs_against_the_standin() {
    let Some(cuda) = cuda_root() else { return };
    let host = Host::start("cudart", 1 << 30);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c("runtime_api", &dir, &cuda, &[]);
    let ptx = workspace().join("worker/kernels/fairvgpu.ptx");
    let stdout = run(&exe, &[&ptx], &lib, &cuda, &host.socket);
    assert_lines(
        &stdout,
        &[
            "device: fairvgpu sim GPU, sm 9.0, 132 SMs",
            "vector_add: 1048576 elements correct",
            "callbacks: 3 ran in stream order",
            "stream-ordered allocation: copy through it correct",
            "pinned: copies both ways through page-locked memory correct",
            "registered: copies both ways correct, contents kept after unregistering",
            "managed: host writes seen by the device",
            "threads: B made 400 calls in",
            "thread exit: a destructor freed the thread's memory",
            "runtime_api: all checks passed",
        ],
    );
    // The program freed everything; the host agrees.
    host.wait_program_freed();
}

/// Builds `tests/c/NAME.c` with gcc against NVIDIA's runtime into `dir`.
fn build_c(name: &str, dir: &Path, cuda: &Path, libs: &[&str]) -> std::path::PathBuf {
    let exe = dir.join(name);
    let cc = Command::new("cc")
        .args(["-O2", "-Wall", "-Wno-deprecated-declarations", "-o"])
        .arg(&exe)
        .arg(workspace().join(format!("tests/c/{name}.c")))
        .arg(format!("-I{}", cuda.join("include").display()))
        .arg(format!("-L{}", cuda.join("lib").display()))
        // What the libraries need in turn (cuSOLVER: cuBLAS, cuSPARSE,
        // nvJitLink) is found there too.
        .arg(format!("-Wl,-rpath-link,{}", cuda.join("lib").display()))
        .args(libs.iter().map(|l| format!("-l:{l}")))
        .args(["-l:libcudart.so.13", "-lpthread", "-lm"])
        .output()
        .expect("cc runs");
    assert!(
        cc.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    exe
}

/// Whether the CUDA wheels hold every library of `libs` (`scripts/cuda-wheels.sh
/// DIR libraries` adds them); if not, the test skips, unless
/// `FAIRVGPU_REQUIRE_CUDART` is set, where that fails.
fn has_libraries(cuda: &Path, libs: &[&str]) -> bool {
    let Some(missing) = libs.iter().find(|l| !cuda.join("lib").join(l).exists()) else {
        return true;
    };
    assert!(
        std::env::var_os("FAIRVGPU_REQUIRE_CUDART").is_none(),
        "FAIRVGPU_REQUIRE_CUDART is set but {} has no {missing} \
         (scripts/cuda-wheels.sh DIR libraries)",
        cuda.display()
    );
    eprintln!("skipped: no {missing} in FAIRVGPU_CUDA_ROOT");
    false
}

#[test]
fn graphs_stream_capture_and_pitched_copies_run_against_the_standin() {
    let Some(cuda) = cuda_root() else { return };
    let host = Host::start("graphs", 1 << 30);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c("graphs", &dir, &cuda, &[]);
    let ptx = workspace().join("worker/kernels/fairvgpu.ptx");
    let stdout = run(&exe, &[&ptx], &lib, &cuda, &host.socket);
    assert_lines(
        &stdout,
        &[
            "graph: 5 nodes built, 3 launches correct",
            "graph: kernel node parameters updated, clone has 5 nodes",
            "graph: device-only graph, 3 launches correct, a kernel node changed",
            "capture: two streams forked and joined, 4 nodes, 2 launches correct",
            "memory nodes: the graph's own buffer, 2 launches correct, given back with its executable",
            "memory nodes: captured cudaMallocAsync and cudaFreeAsync, 2 launches correct",
            "user objects: released with the last graph",
            "capture: a synchronize inside it is refused",
            "pitched: 2D copies both ways, 2D memset and 3D copy correct",
            "graphs: all checks passed",
        ],
    );
    host.wait_program_freed();
}

/// Conditional graph nodes (`tests/c/conditional.c`): IF, IF/ELSE, WHILE
/// (its body captured into it), SWITCH, a conditional nested in another's
/// body and one added to a stream capture, built on the host in the graph's
/// conditional scope and run by the sim, whose kernels set the handles.
#[test]
fn conditional_graph_nodes_run_against_the_standin() {
    let Some(cuda) = cuda_root() else { return };
    let host = Host::start("conditional", 1 << 30);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c("conditional", &dir, &cuda, &[]);
    let kernels = workspace().join("worker/kernels");
    let (base, cond) = (
        kernels.join("fairvgpu.ptx"),
        kernels.join("conditional.ptx"),
    );
    let stdout = run(&exe, &[&base, &cond], &lib, &cuda, &host.socket);
    assert_lines(
        &stdout,
        &[
            "if: body ran only when the kernel set non-zero (2 of 3 launches), else ran once",
            "while: 10 then 3 iterations until the kernel set 0",
            "switch: values 0, 1, 2 ran their body, 3 ran none",
            "nested: an IF inside a WHILE ran 4 times, then none",
            "captured: a WHILE added to a capture ran 0 then 6 times, the node after it ran each time",
            "errors: bad flags, a foreign handle, bad sizes and types refused",
            "conditional: all checks passed",
        ],
    );
    host.wait_program_freed();
}

#[test]
fn an_nvcc_built_program_runs_against_the_standin() {
    let Some(cuda) = cuda_root() else { return };
    let nvcc = cuda.join("bin/nvcc");
    if !nvcc.exists() {
        assert!(
            std::env::var_os("FAIRVGPU_REQUIRE_CUDART").is_none(),
            "FAIRVGPU_REQUIRE_CUDART is set but {} is missing",
            nvcc.display()
        );
        return;
    }
    let host = Host::start("nvcc", 1 << 30);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = dir.join("runtime_kernels");
    // As a tenant would: the defaults (static runtime, default architecture
    // with its PTX, which is what the sim runs).
    let build = Command::new(&nvcc)
        .arg("-o")
        .arg(&exe)
        .arg(workspace().join("tests/c/runtime_kernels.cu"))
        .arg(format!("-L{}", cuda.join("lib").display()))
        .output()
        .expect("nvcc runs");
    assert!(
        build.status.success(),
        "nvcc failed: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let stdout = run(&exe, &[], &lib, &cuda, &host.socket);
    assert!(
        stdout.contains("runtime_kernels: 1048576 elements correct, max 1024 threads per block"),
        "{stdout}"
    );
}

/// cuFFT (`libcufft.so.12`, from the `nvidia-cufft` wheel that
/// `scripts/cuda-wheels.sh DIR libraries` adds) plans and destroys
/// transforms through the stand-in. Planning loads cuFFT's kernels and
/// asks the driver's tools module table (`6e163fbe`) for each module's
/// function (slot 7); the sim runs none of them, so the transform itself
/// is checked on a GPU only (`tests/c/cufft.c exec`).
#[test]
fn cufft_plans_through_the_standin() {
    let Some(cuda) = cuda_root() else { return };
    let libs = ["libcufft.so.12"];
    if !has_libraries(&cuda, &libs) {
        return;
    }
    let host = Host::start("cufft", 1 << 30);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c("cufft", &dir, &cuda, &libs);
    let stdout = run(&exe, &[], &lib, &cuda, &host.socket);
    assert_lines(&stdout, &["cufft: plans made", "cufft: all checks passed"]);
    host.wait_program_freed();
}

/// NVIDIA's cuRAND, cuSPARSE, cuSOLVER and cuBLASLt (their wheels, with
/// `scripts/cuda-wheels.sh DIR libraries`) make their handles, bind them to
/// a stream, answer their workspace sizes and heuristics and let go through
/// the stand-in (`tests/c/libraries.c`); the sim runs none of their kernels.
#[test]
fn curand_cusparse_cusolver_and_cublaslt_make_their_handles_through_the_standin() {
    let Some(cuda) = cuda_root() else { return };
    let libs = [
        "libcurand.so.10",
        "libcusparse.so.12",
        "libcusolver.so.12",
        "libcublasLt.so.13",
    ];
    if !has_libraries(&cuda, &libs) {
        return;
    }
    let host = Host::start("cuda-libraries", 1 << 30);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c("libraries", &dir, &cuda, &libs);
    let stdout = run(&exe, &[], &lib, &cuda, &host.socket);
    assert!(
        stdout.contains("libraries: all checks passed"),
        "in\n{stdout}"
    );
    host.wait_program_freed();
}
