//! Unmodified driver-API C programs, built with the system C compiler against
//! the stand-in libcuda.so.1 (no CUDA toolkit), run against a sim worker.

use std::path::{Path, PathBuf};
use std::process::Command;

use fairvgpu_tests::{cargo_build, workspace, Host};

/// Builds the stand-in and gives a directory holding it as libcuda.so.1.
fn standin(dir: &Path) -> PathBuf {
    let so = cargo_build("fairvgpu-libcuda").join("libcuda.so");
    assert!(so.exists(), "{} missing", so.display());
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        let _ = std::fs::remove_file(lib.join(name));
        std::fs::copy(&so, lib.join(name)).unwrap();
    }
    lib
}

/// Builds `tests/c/driver_api.c` with the system C compiler against the
/// stand-in in `lib`, into `dir`.
fn build_driver_api(dir: &Path, lib: &Path) -> PathBuf {
    let exe = dir.join("driver_api");
    let src = workspace().join("tests/c/driver_api.c");
    let out = Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", lib.display()))
        .args(["-lcuda", "-lm"])
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs the C program on `ptx` with `args` after it, through the stand-in
/// in `lib` on the host at `socket` with `env` set too; its standard output
/// (the test fails, showing both outputs, if it did not exit 0).
fn run_driver_api(
    exe: &Path,
    lib: &Path,
    socket: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> String {
    let ptx = workspace().join("host-backend/kernels/fairvgpu.ptx");
    let run = Command::new(exe)
        .arg(&ptx)
        .args(args)
        .env("LD_LIBRARY_PATH", lib)
        .env("FAIRVGPU_SOCKET", socket)
        .envs(env.iter().copied())
        .output()
        .expect("program runs");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "program failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

#[test]
fn c_driver_api_program_runs_against_the_standin() {
    let host = Host::start("capi", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_driver_api(&dir, &lib);
    let stdout = run_driver_api(&exe, &lib, &host.socket, &[], &[]);
    assert!(
        stdout.contains("vector_add: 1048576 elements correct"),
        "{stdout}"
    );
    assert!(
        stdout.contains("saxpy: 1048576 elements correct"),
        "{stdout}"
    );
    assert!(
        stdout.contains("bad copy refused: CUDA_ERROR_INVALID_VALUE"),
        "{stdout}"
    );
    assert!(stdout.contains("driver_api: all checks passed"), "{stdout}");
    // The program freed everything; the host agrees.
    host.wait_until(
        "the program's memory to be freed",
        std::time::Duration::from_secs(10),
        |s| s.mem_used.load(std::sync::atomic::Ordering::Relaxed) == 0,
    );
}

/// A child forked after the program attached, exiting normally without a
/// CUDA call, runs the atexit handlers it inherited: they must not let go
/// of the parent's channel (nor wait for the parent's copy thread), and the
/// parent goes on with every later check passing.
#[test]
fn a_forked_child_leaves_the_parents_vgpu_alone() {
    let host = Host::start("capi-fork", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_driver_api(&dir, &lib);
    // Two copy threads whatever this machine's CPUs, so the helper thread
    // exists in the parent when it forks.
    let copy_threads = [("FAIRVGPU_COPY_THREADS", "2")];
    let stdout = run_driver_api(&exe, &lib, &host.socket, &["fork"], &copy_threads);
    assert!(
        stdout.contains("fork: child exited, parent goes on"),
        "{stdout}"
    );
    assert!(stdout.contains("driver_api: all checks passed"), "{stdout}");
}

#[test]
fn without_a_vgpu_cuinit_reports_no_device() {
    let dir = std::env::temp_dir().join(format!("fvg-nodev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = standin(&dir);
    let exe = build_driver_api(&dir, &lib);
    let run = Command::new(&exe)
        .arg("/dev/null")
        .env("LD_LIBRARY_PATH", &lib)
        .env_remove("FAIRVGPU_SOCKET")
        .output()
        .unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("CUDA_ERROR_NO_DEVICE"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rust_cudarc_program_runs_against_the_standin() {
    let host = Host::start("cudarc", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let ptx = workspace().join("host-backend/kernels/fairvgpu.ptx");
    let run = Command::new(env!("CARGO_BIN_EXE_cudarc-guest"))
        .arg(&ptx)
        .env("LD_LIBRARY_PATH", &lib)
        .env("FAIRVGPU_SOCKET", &host.socket)
        .output()
        .expect("program runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "cudarc program failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("cudarc-guest: all checks passed"),
        "{stdout}"
    );
}
