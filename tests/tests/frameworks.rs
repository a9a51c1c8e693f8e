//! A framework's own API paths through the stand-in on the sim: CuPy (the
//! `cupy-cuda13x` wheel and numpy in `FAIRVGPU_PYTHONPATH`, which
//! `scripts/check` installs) finds the vGPU, takes the vGPU's memory limit
//! as its device's memory, copies, and reports an allocation over the
//! limit as its own out-of-memory error. Skipped where CuPy or the CUDA
//! wheels are missing, unless `FAIRVGPU_REQUIRE_CUPY` is set.

use std::path::PathBuf;

use tests::{assert_lines, run_program, standin, workspace, Host};

fn cupy_path() -> Option<PathBuf> {
    let p = std::env::var_os("FAIRVGPU_PYTHONPATH").map(PathBuf::from);
    let found = p.as_ref().is_some_and(|p| p.join("cupy").is_dir());
    if !found {
        assert!(
            std::env::var_os("FAIRVGPU_REQUIRE_CUPY").is_none(),
            "FAIRVGPU_REQUIRE_CUPY is set but FAIRVGPU_PYTHONPATH has no cupy"
        );
        eprintln!("skipped: no CuPy in FAIRVGPU_PYTHONPATH");
        return None;
    }
    p
}

#[test]
fn cupy_runs_its_memory_paths_through_the_standin() {
    let Some(py) = cupy_path() else { return };
    let Some(cuda) = std::env::var_os("FAIRVGPU_CUDA_ROOT").map(PathBuf::from) else {
        assert!(
            std::env::var_os("FAIRVGPU_REQUIRE_CUPY").is_none(),
            "no FAIRVGPU_CUDA_ROOT"
        );
        return;
    };
    let limit: u64 = 256 << 20;
    let host = Host::start("cupy", limit);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let path = format!("{}:{}", lib.display(), cuda.join("lib").display());
    let script = workspace().join("tests/py/cupy_probe.py");
    let (py, cuda_path) = (py.display().to_string(), cuda.display().to_string());
    let stdout = run_program(
        std::path::Path::new("python3"),
        &[script.display().to_string(), limit.to_string()],
        &path,
        &host.socket,
        &[
            ("PYTHONPATH", py.as_str()),
            ("CUDA_PATH", cuda_path.as_str()),
        ],
    );
    assert_lines(
        &stdout,
        &[
            "cupy: device fairvgpu sim GPU 132 SMs",
            "cupy: copies, memset and a stream correct",
            "cupy: an allocation over the vGPU's limit is CuPy's OutOfMemoryError",
            "cupy: all checks passed",
        ],
    );
}
