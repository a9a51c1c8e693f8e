//! The faults program (`tests/c/faults.c`, kernels of
//! `worker/kernels/faults.ptx`) run through the stand-in on a daemon of
//! its own, for the tests of a process's faults, output and memory
//! (`faults.rs`, `process_slots.rs`, `pinned_budget.rs`).

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;

use crate::{build_c_standin, cargo_build, standin, workspace};

/// A daemon on the sim serving one VM, its log (at info, with all its
/// workers write) in a file, and the stand-in and the faults program built
/// beside it.
#[derive(Debug)]
pub struct Rig {
    /// The daemon.
    pub d: DaemonProc,
    /// The folder of the stand-in `libcuda.so.1`.
    pub lib: PathBuf,
    /// The faults program.
    pub exe: PathBuf,
    /// The VM's socket.
    pub sock: PathBuf,
}

impl Rig {
    /// A rig for the test `name`, serving `vm`.
    pub fn start(name: &str, vm: VmSpec) -> Rig {
        let vm_name = vm.name.clone();
        let d = DaemonProc::start_logged(
            &cargo_build("cli").join("fairvgpu"),
            name,
            ExecutorKind::Sim,
            &[vm],
            "info",
        )
        .expect("the daemon starts");
        let lib = standin(&d.dir);
        let exe = build_c_standin("faults", &d.dir, &lib, &[]);
        let sock = d.socket(&vm_name);
        Rig { d, lib, exe, sock }
    }

    /// The faults program in `mode` with `args`, through the stand-in on
    /// the VM.
    pub fn program(&self, mode: &str, args: &[&str]) -> Command {
        let mut c = Command::new(&self.exe);
        c.arg(workspace().join("worker/kernels/faults.ptx"))
            .arg(mode)
            .args(args)
            .env("LD_LIBRARY_PATH", &self.lib)
            .env("FAIRVGPU_SOCKET", &self.sock)
            .stdin(Stdio::null());
        c
    }

    /// Runs it to its end.
    pub fn run(&self, mode: &str, args: &[&str]) -> Output {
        self.program(mode, args).output().expect("program runs")
    }

    /// Starts it, and reads its first line.
    pub fn started(&self, mode: &str, args: &[&str]) -> (Child, String) {
        let mut child = self
            .program(mode, args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("program starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().expect("stdout"))
            .read_line(&mut line)
            .expect("a line");
        (child, line)
    }

    /// Runs it in `mode`, a fault of its own, and checks that it said
    /// `line` (the error its own call got); then how long until the VM's
    /// next process computed (see [`Rig::next_process_computes`]).
    pub fn fault_then_next(&self, mode: &str, line: &str) -> Duration {
        let out = self.run(mode, &[]);
        assert!(
            text(&out.stdout).contains(line),
            "{mode}: {}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        self.next_process_computes()
    }

    /// Runs `compute` until a process computes; how long that took (at
    /// most 20 s, or it panics).
    pub fn next_process_computes(&self) -> Duration {
        let t0 = Instant::now();
        loop {
            let out = self.run("compute", &[]);
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
}

/// Output as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
