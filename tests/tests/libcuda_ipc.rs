//! IPC memory and event handles between two processes of one VM, through
//! the stand-in against a sim worker (`tests/c/ipc.c`): one process exports
//! memory and an event, the other opens both, waits on the event, reads the
//! exporter's bytes and writes its own, which the exporter sees; memory the
//! exporter frees stays while the opener has it open, and is freed once it
//! closes it; then the handles open nothing; all the memory comes back.
//! Then the same where each process has a worker of its own (process
//! slots), the stand-in unchanged.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use tests::{assert_lines, build_c_standin, cargo_build, run_program, standin, Host};

/// A program of `tests/c/ipc.c` running with its stdin and stdout piped.
struct Driven {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    seen: String,
}

impl Driven {
    fn start(exe: &Path, args: &[&str], lib: &Path, socket: &Path) -> Driven {
        let mut child = Command::new(exe)
            .args(args)
            .env("LD_LIBRARY_PATH", lib)
            .env("FAIRVGPU_SOCKET", socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the program starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Driven {
            child,
            stdin,
            stdout,
            seen: String::new(),
        }
    }

    /// Reads lines until one starts with `prefix`; answers its rest.
    fn until(&mut self, prefix: &str) -> String {
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "ended before {prefix:?}:\n{}", self.seen);
            self.seen.push_str(&line);
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
        }
    }

    fn say(&mut self, word: &str) {
        writeln!(self.stdin, "{word}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for it to end well; answers all it printed.
    fn finish(mut self) -> String {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        self.seen.push_str(&rest);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "failed:\n{}", self.seen);
        assert!(!self.seen.contains("FAILED"), "{}", self.seen);
        self.seen
    }
}

#[test]
fn ipc_handles_share_memory_between_processes_of_a_vm() {
    let host = Host::start("ipc", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    sequence(&dir, &host.socket);
    host.wait_program_freed();
}

/// The same programs where each process of the VM has a worker of its own
/// (process slots): the handles cross worker processes (`ipc_across.rs`).
#[test]
fn ipc_handles_share_memory_between_processes_of_a_vm_with_process_slots() {
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 3;
    let d = DaemonProc::start(
        &cargo_build("cli").join("fairvgpu"),
        "ipc-slots",
        ExecutorKind::Sim,
        &[vm],
    )
    .unwrap();
    let socket = d.socket("vm1");
    let dir = socket.parent().unwrap().to_owned();
    sequence(&dir, &socket);
}

/// Runs `tests/c/ipc.c`'s exporter, importer and stale-handle programs on
/// the VM at `socket` and checks what each printed.
fn sequence(dir: &Path, socket: &Path) {
    let lib = standin(dir);
    let exe = build_c_standin("ipc", dir, &lib, &[]);

    let mut exporter = Driven::start(&exe, &["export"], &lib, socket);
    let handle = exporter.until("handle ");
    let event = exporter.until("event ");
    let mut importer = Driven::start(&exe, &["import", &handle, &event], &lib, socket);
    importer.until("written");
    exporter.say("check");
    exporter.until("freed");
    importer.say("after-free");
    let imported = importer.finish();
    let stale = run_program(
        &exe,
        &["stale", handle.as_str()],
        &lib.to_string_lossy(),
        socket,
        &[],
    );
    exporter.say("exit");
    let exported = exporter.finish();
    println!("{exported}\n{imported}\n{stale}");
    assert_lines(
        &exported,
        &[
            "ok: the same allocation has one handle",
            "ok: a process cannot open its own handle",
            "ok: no handle for an event made without CU_EVENT_INTERPROCESS",
            "ok: a process cannot open its own event handle",
            "ok: no handle for host memory",
            "ok: the exporter sees the importer's writes",
            "ipc export: all checks passed",
        ],
    );
    assert_lines(
        &imported,
        &[
            "ok: an open without the lazy peer access flag refused",
            "ok: a second open gives the same address",
            "ok: an opened event is waited on, synchronized and queried",
            "ok: the importer reads the exporter's bytes, after its event",
            "ok: opened memory is device memory to pointer queries",
            "ok: and has the exporter's range",
            "ok: a copy of inferred direction from opened memory",
            "ok: opened memory is not freed by the importer",
            "ok: memory its exporter freed stays while opened, as the driver keeps it",
            "ok: a handle of a destroyed event opens nothing",
            "ok: one close too many refused",
            "ipc import: all checks passed",
        ],
    );
    assert_lines(
        &stale,
        &[
            "ok: a handle of freed memory opens nothing",
            "ok: a forged handle opens nothing",
            "ipc stale: all checks passed",
        ],
    );
}
