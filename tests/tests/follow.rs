//! A guest process on the host itself moved with its vGPU to a second
//! daemon standing for another host, mid-loop, as QEMU moves a VM: paused
//! through its control socket (`FAIRVGPU_CONTROL`), the source daemon hands
//! the vGPU (its region too) over TCP under the hosts' key, the
//! destination serves on from what it received (by its GPU's spare
//! worker), the process switches and goes on. The source daemon is then stopped: the program
//! finishes every round's check on the destination alone. Before that, a
//! destination with another key refuses and the process goes on at the
//! source; commands out of order change nothing; a checkpoint sent ahead
//! while the process runs has the destination's spare load its module,
//! which the restore takes. A spare so staged and not bound within
//! `ahead_keep_s` is ended with its module, and a later handover still
//! serves on.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use tests::{build_c_standin, cargo_build, standin, PTX};

const ROUNDS: u64 = 60;
/// Elements of the program's vector (`tests/c/follow.c`).
const N: u64 = 64 * 1024;
const STEP: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn daemon(tag: &str, keys: &str) -> DaemonProc {
    let bin = cargo_build("cli").join("fairvgpu");
    let vms = [VmSpec::new("vm1", 256)];
    DaemonProc::start_full_logged(&bin, tag, ExecutorKind::Sim, &vms, keys, "info").unwrap()
}

/// `fairvgpu ARGS --config` of daemon `d`: whether it succeeded, and what
/// it said.
fn fairvgpu(d: &DaemonProc, args: &[&str]) -> (bool, String) {
    let out = Command::new(cargo_build("cli").join("fairvgpu"))
        .args(args)
        .arg("--config")
        .arg(d.dir.join("host.toml"))
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), said)
}

/// `fairvgpu handover` of vm1 from daemon `d` to the one taking handovers
/// on loopback port `port`.
fn handover(d: &DaemonProc, port: u16) -> (bool, String) {
    let to = format!("127.0.0.1:{port}");
    fairvgpu(d, &["handover", "--vm", "vm1", "--to", &to])
}

/// The program's control socket: one command, its answer.
struct Control(BufReader<UnixStream>);

impl Control {
    fn say(&mut self, line: &str) -> String {
        writeln!(self.0.get_mut(), "{line}").unwrap();
        let mut answer = String::new();
        self.0.read_line(&mut answer).unwrap();
        answer.trim().to_owned()
    }
}

/// The program's lines, as they come.
fn lines(child: &mut Child) -> Receiver<String> {
    let (tx, rx) = channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// The next round the program reports.
fn round(rx: &Receiver<String>) -> u64 {
    let l = rx.recv_timeout(STEP).expect("the program goes on");
    assert!(!l.starts_with("FAILED"), "{l}");
    l.strip_prefix("round ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a round: {l}"))
}

fn key_file(dir: &Path, key: &str) -> String {
    let p = dir.join(format!("key-{}", key.len()));
    std::fs::write(&p, key).unwrap();
    p.display().to_string()
}

/// A scratch folder `name` with the stand-in, `tests/c/follow.c` built
/// over it and the kernel's PTX: the folder, the program, the stand-in's
/// folder, and a key file both hosts share.
fn built(name: &str) -> (PathBuf, PathBuf, PathBuf, String) {
    let dir = scratch::dir(name);
    let lib = standin(&dir);
    let exe = build_c_standin("follow", &dir, &lib, &["-lpthread"]);
    std::fs::write(dir.join("k.ptx"), PTX).unwrap();
    let key = key_file(&dir, "a key both hosts share, 0123456789");
    (dir, exe, lib, key)
}

/// A daemon's `[daemon]` lines to take handovers on loopback `port` under
/// the key in file `key`.
fn listen(port: u16, key: &str) -> String {
    format!("handover_listen = \"127.0.0.1:{port}\"\ncheckpoint_key_file = \"{key}\"")
}

#[test]
fn a_process_moved_to_another_daemon_mid_loop_finishes_there_alone() {
    // Alone: its program's 60 rounds must outlast its steps, and the
    // other test's daemons and program share the CPUs.
    let _one = tests::one_at_a_time();
    let (dir, exe, lib, key) = built("fvg-follow");
    let other = key_file(&dir, "another host's key, 0123456789");
    let (port_b, port_c) = (free_port(), free_port());
    let a = daemon("follow-a", &format!("checkpoint_key_file = \"{key}\""));
    let b = daemon("follow-b", &listen(port_b, &key));
    let c = daemon("follow-c", &listen(port_c, &other));
    let (mut child, rx, mut ctl) = program(&dir, (&exe, &lib), &a, ROUNDS, 20);

    // Out of order: refused, nothing changes.
    assert!(ctl.say("copy /nowhere").starts_with("error: not paused"));
    assert!(ctl.say("jump").starts_with("error: unknown command"));
    assert_eq!(ctl.say("pause"), "paused");
    let nowhere = ctl.say("switch /nowhere");
    assert!(nowhere.starts_with("error: channel 0: "), "{nowhere}");

    // Refused by a host with another key: the process goes on at the source.
    let (ok, said) = handover(&a, port_c);
    assert!(!ok && said.contains("proof does not match"), "{said}");
    // (Its region may get a copy, as QEMU's would, for nothing.)
    let copied = ctl.say(&format!("copy {}", c.socket("vm1").display()));
    assert_eq!(copied, "copied");
    assert_eq!(ctl.say("go"), "going");
    let r = round(&rx);
    assert!(round(&rx) > r);

    // Sent ahead while the process runs: the destination's spare loads its
    // module then; refused under another key; the process goes on.
    let ahead = |d: &DaemonProc, port: u16| {
        let to = format!("127.0.0.1:{port}");
        fairvgpu(d, &["handover", "--vm", "vm1", "--to", &to, "--ahead"])
    };
    let (ok, said) = ahead(&a, port_c);
    assert!(!ok && said.contains("proof does not match"), "{said}");
    let (ok, said) = ahead(&a, port_b);
    assert!(
        ok && said.contains("sent ahead")
            && said.contains("vm1: 1 modules loaded ahead on GPU 0 in "),
        "{said}"
    );
    let r = round(&rx);
    assert!(round(&rx) > r, "it goes on at the source");

    // Taken: pause, hand over (the region with it), restore there, switch,
    // go on.
    assert_eq!(ctl.say("pause"), "paused");
    let (ok, said) = handover(&a, port_b);
    assert!(ok, "{said}");
    let there = b.socket("vm1");
    let (ok, said) = fairvgpu(&b, &["restore", "--vm", "vm1", "--received"]);
    assert!(ok, "{said}");
    assert!(
        said.contains("(1 modules loaded ahead)"),
        "the module staged ahead was taken: {said}"
    );
    // Written into the memory of the checkpoint sent ahead.
    let log = std::fs::read_to_string(a.log_path()).unwrap();
    assert!(
        log.contains(
            "vm1: held; its 1 workers take checkpoints (1 into the memory of the one sent ahead)"
        ),
        "the handover reused the memfd sent ahead:\n{log}"
    );
    // Served on by the GPU's spare, its context made before the pause.
    let log = std::fs::read_to_string(b.log_path()).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("spare worker bound to a slot") && l.contains("restore=true")),
        "the restore bound the spare:\n{log}"
    );
    let switched = ctl.say(&format!("switch {}", there.display()));
    assert!(switched.starts_with("switched "), "{switched}");
    assert!(
        switched != "switched 0" && switched != "switched 1",
        "both threads' channels: {switched}"
    );
    assert_eq!(ctl.say("go"), "going");
    let r = round(&rx);
    assert!(round(&rx) > r);

    // The source host goes away; the program finishes on the destination.
    drop(a);
    finishes(&rx, &mut child, ROUNDS);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tests/c/follow.c` (`exe` over the stand-in in `lib`) on daemon `a`'s
/// vm1: `rounds` rounds, `pause_ms` apart, its first one done; its lines and
/// its control socket.
fn program(
    dir: &Path,
    (exe, lib): (&Path, &Path),
    a: &DaemonProc,
    rounds: u64,
    pause_ms: u64,
) -> (Child, Receiver<String>, Control) {
    let control = dir.join("control.sock");
    let mut child = Command::new(exe)
        .arg(dir.join("k.ptx"))
        .args([rounds.to_string(), pause_ms.to_string()])
        .env("LD_LIBRARY_PATH", lib)
        .env("FAIRVGPU_SOCKET", a.socket("vm1"))
        .env("FAIRVGPU_CONTROL", &control)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines(&mut child);
    assert_eq!(round(&rx), 1);
    let ctl = Control(BufReader::new(UnixStream::connect(&control).unwrap()));
    (child, rx, ctl)
}

/// The program ends with every one of its `rounds` checked and the sum
/// they make.
fn finishes(rx: &Receiver<String>, child: &mut Child, rounds: u64) {
    let mut last = String::new();
    while let Ok(l) = rx.recv_timeout(STEP) {
        assert!(!l.starts_with("FAILED"), "{l}");
        last = l;
        if last.starts_with("follow ") {
            break;
        }
    }
    let sum = N * (N - 1) / 2 + N * rounds;
    assert!(
        last.starts_with(&format!("follow ok rounds={rounds} sum={sum} ")),
        "{last}"
    );
    assert!(child.wait().unwrap().success());
}

/// A checkpoint sent ahead with no handover within `ahead_keep_s`: the
/// destination's spare is ended with the module it loaded (its GPU memory
/// given back), a fresh one takes its place, and a handover after that
/// still serves on, loading the module in the pause.
#[test]
fn a_spare_staged_and_not_bound_in_time_is_ended_with_its_modules() {
    const KEEP_ROUNDS: u64 = 600;
    let _one = tests::one_at_a_time();
    let (dir, exe, lib, key) = built("fvg-follow-keep");
    let port = free_port();
    let a = daemon("keep-a", &format!("checkpoint_key_file = \"{key}\""));
    let b = daemon(
        "keep-b",
        &format!("{}\nahead_keep_s = 3", listen(port, &key)),
    );
    let (mut child, rx, mut ctl) = program(&dir, (&exe, &lib), &a, KEEP_ROUNDS, 10);
    let to = format!("127.0.0.1:{port}");
    let (ok, said) = fairvgpu(&a, &["handover", "--vm", "vm1", "--to", &to, "--ahead"]);
    assert!(
        ok && said.contains("vm1: 1 modules loaded ahead on GPU 0 in "),
        "{said}"
    );
    let ended = "a spare staged 3 s ago and not bound since: ended";
    b.wait("the staged spare ended", STEP, |d| {
        std::fs::read_to_string(d.log_path()).is_ok_and(|l| l.contains(ended))
    })
    .unwrap();
    let r = round(&rx);
    assert!(round(&rx) > r, "it goes on at the source");

    assert_eq!(ctl.say("pause"), "paused");
    let (ok, said) = handover(&a, port);
    assert!(ok, "{said}");
    let (ok, said) = fairvgpu(&b, &["restore", "--vm", "vm1", "--received"]);
    assert!(
        ok && said.contains("(0 modules loaded ahead)"),
        "nothing staged is left to take: {said}"
    );
    let switched = ctl.say(&format!("switch {}", b.socket("vm1").display()));
    assert!(switched.starts_with("switched "), "{switched}");
    assert_eq!(ctl.say("go"), "going");
    drop(a);
    finishes(&rx, &mut child, KEEP_ROUNDS);
    let _ = std::fs::remove_dir_all(&dir);
}
