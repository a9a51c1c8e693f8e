//! The faults program (`tests/c/faults.c`, kernels of
//! `worker/kernels/faults.ptx`) run through the stand-in, for the tests of
//! a process's faults, output and memory (`faults.rs`, `process_slots.rs`).

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::workspace;

/// The program `exe` in `mode` with `args`, through the stand-in in `lib`
/// on the vGPU at `socket`.
pub fn program(exe: &Path, lib: &Path, socket: &Path, mode: &str, args: &[&str]) -> Command {
    let mut c = Command::new(exe);
    c.arg(workspace().join("worker/kernels/faults.ptx"))
        .arg(mode)
        .args(args)
        .env("LD_LIBRARY_PATH", lib)
        .env("FAIRVGPU_SOCKET", socket)
        .stdin(Stdio::null());
    c
}

/// Runs it to its end.
pub fn run(exe: &Path, lib: &Path, socket: &Path, mode: &str, args: &[&str]) -> Output {
    program(exe, lib, socket, mode, args)
        .output()
        .expect("program runs")
}

/// Starts it, and reads its first line.
pub fn started(
    exe: &Path,
    lib: &Path,
    socket: &Path,
    mode: &str,
    args: &[&str],
) -> (Child, String) {
    let mut child = program(exe, lib, socket, mode, args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("program starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("a line");
    (child, line)
}

/// Output as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `compute` until a process computes; how long that took (at most
/// 20 s, or it panics).
pub fn next_process_computes(exe: &Path, lib: &Path, socket: &Path) -> Duration {
    let t0 = Instant::now();
    loop {
        let out = run(exe, lib, socket, "compute", &[]);
        if text(&out.stdout).contains("compute sync: CUDA_SUCCESS") {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no process computed after the fault: {}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
