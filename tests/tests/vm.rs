//! A real guest: a Debian kernel with the fairvgpu module, booted under QEMU
//! (TCG: timing means nothing here, only correctness), against `fairvgpu
//! serve` with the sim executor.
//!
//! Needs qemu-system-x86_64, Debian's linux-headers-amd64, busybox-static and
//! cpio (scripts/check installs them). Skips without them, unless
//! FAIRVGPU_REQUIRE_VM=1 (CI), where their absence fails.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use daemon::control::{client_call, ApiTarget};
use serde_json::Value;
use tests::{cargo_build, workspace};

// One VM at a time (`tests::one_at_a_time`): TCG on two cores is slow enough already.

fn prerequisites() -> bool {
    let mut missing = Vec::new();
    if !Path::new("/usr/bin/qemu-system-x86_64").exists() {
        missing.push("qemu-system-x86");
    }
    let headers = std::fs::read_dir("/usr/src")
        .map(|d| {
            d.flatten().any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("linux-headers-") && n.ends_with("-amd64")
            })
        })
        .unwrap_or(false);
    if !headers {
        missing.push("linux-headers-amd64");
    }
    for (bin, pkg) in [("busybox", "busybox-static"), ("cpio", "cpio")] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).exists()))
            .unwrap_or(false);
        if !found {
            missing.push(pkg);
        }
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("FAIRVGPU_REQUIRE_VM").is_none(),
        "FAIRVGPU_REQUIRE_VM is set but these are missing: {missing:?}"
    );
    eprintln!("skipping: missing {missing:?}");
    false
}

/// Builds the guest image once per test run, from this build's library and programs.
fn image() -> &'static PathBuf {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let lib = cargo_build("libcuda");
        let bins = Path::new(env!("CARGO_BIN_EXE_vm-probe"))
            .parent()
            .unwrap()
            .to_owned();
        let out = lib.join("vm-image");
        let st = Command::new(workspace().join("vm-images/build.sh"))
            .arg(&out)
            .env("LIBCUDA", lib.join("libcuda.so"))
            .env("GUEST_BIN", &bins)
            .status()
            .expect("vm-images/build.sh runs");
        assert!(st.success(), "building the guest image failed");
        out
    })
}

/// `fairvgpu serve` with one VM on the sim executor.
struct Daemon {
    child: Child,
    dir: PathBuf,
    config: PathBuf,
    bin: PathBuf,
}

impl Daemon {
    fn start(name: &str) -> Daemon {
        Self::start_with(name, "")
    }

    /// As [`Daemon::start`], vm1 with the further keys `vm_keys`.
    fn start_with(name: &str, vm_keys: &str) -> Daemon {
        Self::start_keys(name, "", vm_keys)
    }

    /// As [`Daemon::start`], with the further `[daemon]` keys
    /// `daemon_keys` and vm1's `vm_keys`.
    fn start_keys(name: &str, daemon_keys: &str, vm_keys: &str) -> Daemon {
        let bin = cargo_build("cli").join("fairvgpu");
        let dir = scratch::dir(&format!("fvg-vm-{name}"));
        let config = dir.join("host.toml");
        std::fs::write(
            &config,
            format!(
                r#"[daemon]
run_dir = "{run}"
executor = "sim"
{daemon_keys}

[layout]
channels = 8
ring_entries = 64
arena_size = 1048576
vectors = 2

[[vm]]
name = "vm1"
tenant = "acme"
{limit}
{vm_keys}
"#,
                run = dir.join("run").display(),
                limit = if vm_keys.contains("memory_limit_mib") {
                    ""
                } else {
                    "memory_limit_mib = 512"
                }
            ),
        )
        .unwrap();
        let child = Command::new(&bin)
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("fairvgpu serve starts");
        let d = Daemon {
            child,
            dir,
            config,
            bin,
        };
        let start = Instant::now();
        while !(d.dir.join("run/vm1.sock").exists() && d.dir.join("run/api.sock").exists()) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "daemon did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    /// vm1's row of the status.
    fn vm1(&self) -> Value {
        let (code, body) = client_call(
            &ApiTarget::Unix(self.dir.join("run/api.sock")),
            "GET",
            "/api/v1/status",
            b"",
        )
        .expect("status");
        assert_eq!(code, 200);
        let v: Value = serde_json::from_slice(&body).unwrap();
        v["gpus"][0]["vgpus"][0].clone()
    }

    fn wait_vm1(&self, what: &str, timeout: Duration, f: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let v = self.vm1();
            if f(&v) {
                return v;
            }
            assert!(
                start.elapsed() < timeout,
                "timed out waiting for {what}; vm1: {v}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `fairvgpu ARGS` against this daemon, which must succeed: what it said.
    fn fairvgpu_ok(&self, args: &[&str]) -> String {
        let out = self.fairvgpu(args);
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "fairvgpu {args:?} failed: {said}");
        said
    }

    /// `fairvgpu ARGS` against this daemon, which must fail saying `why`.
    fn fairvgpu_refused(&self, args: &[&str], why: &str) {
        let out = self.fairvgpu(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "fairvgpu {args:?}: {err}"
        );
    }

    fn fairvgpu(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.bin)
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .output()
            .expect("fairvgpu runs")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM: the daemon stops its workers and removes its sockets.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A guest under QEMU; its console lines arrive on a channel.
struct Guest {
    child: Child,
    console: Receiver<String>,
    stdin: Option<ChildStdin>,
    seen: Vec<String>,
}

impl Guest {
    fn boot(d: &Daemon, mode: &str, extra: &[&str]) -> Guest {
        let mut child = Command::new(workspace().join("vm-images/run-vm.sh"))
            .args(["--config"])
            .arg(&d.config)
            .args(["--vm", "vm1", "--accel", "tcg", "--mode", mode])
            .arg("--image")
            .arg(image())
            .arg("--fairvgpu")
            .arg(&d.bin)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("QEMU starts");
        let out = child.stdout.take().unwrap();
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                eprintln!("guest| {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Guest {
            child,
            console: rx,
            stdin,
            seen: Vec::new(),
        }
    }

    /// Waits for a console line starting with `prefix`; returns it.
    /// Boots the guest in `mode` without its vGPU, with QMP (and the run-vm
    /// options `more`), and hot-plugs the vGPU once the guest waits for it:
    /// the guest, the QMP socket, and what `fairvgpu attach` printed.
    /// The guest's `compute` mode (`rounds`: `fairvgpu.rounds=N`) with its
    /// vGPU attached to `d` and QMP at `d`'s `qmp.sock`; where `incoming`
    /// is given, a QEMU that loads the VM from there and stays paused
    /// (`-incoming URI -S`). The guest, and QMP once QEMU serves it.
    fn compute(d: &Daemon, rounds: &str, incoming: Option<&str>) -> (Guest, transport::qmp::Qmp) {
        let qmp = d.dir.join("qmp.sock");
        let mut args = vec!["--qmp", qmp.to_str().unwrap(), "--append", rounds];
        if let Some(uri) = incoming {
            args.extend(["--", "-incoming", uri, "-S"]);
        }
        let g = Guest::boot(d, "compute", &args);
        (g, qmp_at(&qmp))
    }

    fn hot_plugged(d: &Daemon, mode: &str, more: &[&str]) -> (Guest, String, String) {
        let qmp = d.dir.join("qmp.sock").to_string_lossy().into_owned();
        let mut args = vec!["--no-vgpu", "--qmp", &qmp];
        args.extend_from_slice(more);
        let mut g = Guest::boot(d, mode, &args);
        g.expect("FVG waiting for hot-plug", BOOT);
        let out = d.fairvgpu(&["attach", "--vm", "vm1", "--qmp", &qmp]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "attach failed: {text}");
        (g, qmp, text)
    }

    fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.console.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                    if l.starts_with("FVG-FAIL") {
                        // Its output follows, indented.
                        while let Ok(more) = self.console.recv_timeout(Duration::from_secs(3)) {
                            self.seen.push(more);
                        }
                        panic!("guest check failed: {l}\n{}", self.seen.join("\n"));
                    }
                }
                Err(_) => panic!(
                    "no `{prefix}` from the guest within {timeout:?}; console so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    fn say(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("console input");
        writeln!(s, "{line}").unwrap();
        s.flush().unwrap();
    }

    fn finish(mut self, timeout: Duration) -> Vec<String> {
        self.expect("FVG done", timeout);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "QEMU did not exit after power-off"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const BOOT: Duration = Duration::from_secs(120);
const STEP: Duration = Duration::from_secs(240);

#[test]
fn guest_programs_run_through_the_module_and_a_killed_one_gives_back_its_memory() {
    if !prerequisites() {
        return;
    }
    let _one = tests::one_at_a_time();
    // The default: a worker per guest process, eight at once, each slot
    // with a doorbell vector of its own (the layout's two grow to eight).
    guest_checks(&Daemon::start("boot"), 8);
}

/// The same checks with each guest process served by a worker of its own
/// (`process_slots`), bound when it attaches: the module's doorbells reach
/// each slot's worker on its own vector (and the daemon, for a slot
/// without one), a waiting process is woken by its own worker, and a
/// killed process's slot and memory come back.
#[test]
fn with_process_slots_guest_programs_run_and_a_killed_one_gives_back_its_memory() {
    if !prerequisites() {
        return;
    }
    let _one = tests::one_at_a_time();
    let d = Daemon::start_with("slots", "process_slots = 2");
    // No worker serves the VM before a process attaches: the GPU's spare
    // alone waits (each process's worker is bound to its slot from it).
    let spares = |d: &Daemon| {
        let w = worker_args(d.child.id());
        (
            w.len(),
            w.iter().filter(|a| a.contains("\0--spare-fd\0")).count(),
        )
    };
    let start = Instant::now();
    while spares(&d) != (1, 1) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(spares(&d), (1, 1), "the daemon's workers, and its spares");
    guest_checks(&d, 2);
}

/// The command lines (arguments joined by NULs) of the child processes of
/// `pid` that are workers.
fn worker_args(pid: u32) -> Vec<String> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|c| std::fs::read(format!("/proc/{c}/cmdline")).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .filter(|a| a.contains("\0worker\0"))
        .collect()
}

/// Boots the test guest against `d` and runs its checks
/// (`vm-images/guest-tests.sh`); its processes have workers of their own,
/// which end with them, and the device has `vectors` doorbell vectors.
fn guest_checks(d: &Daemon, vectors: u32) {
    let mut g = Guest::boot(d, "tests", &[]);
    g.expect("FVG module loaded", BOOT);
    let dev = g.expect("FVG device", STEP);
    assert!(dev.contains(&format!("vectors={vectors}")), "{dev}");
    g.expect("FVG-PASS driver_api", STEP);
    g.expect("FVG-PASS cudarc", STEP);
    // Blocking: every wait slept in the module and an interrupt woke it.
    g.expect("FVG-PASS blocking", STEP);
    let block = g.expect("    blocking: block: 50 synchronizations", STEP);
    assert!(block.contains("wake-ups"), "{block}");
    g.expect("FVG-PASS two_at_once", STEP);

    // Kill mid-copy: the host sees the memory held, then freed, while the
    // VM (the ivshmem peer) stays attached: the module gave the channel back.
    g.expect("FVG copying", STEP);
    d.wait_vm1(
        "the copying process's 64 MiB",
        Duration::from_secs(15),
        |v| v["memory_used_bytes"].as_u64().unwrap_or(0) >= 64 << 20,
    );
    g.say("kill");
    g.expect("FVG killed", STEP);
    // With a worker per process, the killed one's ended with it: none is
    // connected to the grant service then.
    d.wait_vm1("its memory to be freed", Duration::from_secs(30), |v| {
        v["memory_used_bytes"] == 0
    });
    g.expect("FVG-PASS kill_mid_copy", STEP);
    let seen = g.finish(STEP);
    assert!(
        seen.iter()
            .any(|l| l.contains("abandoned by an exiting process")),
        "the module did not report the abandoned channel"
    );
    assert!(!seen.iter().any(|l| l.starts_with("FVG-FAIL")), "{seen:?}");
}

#[test]
fn hot_plug_into_a_running_guest_and_unplug_again() {
    if !prerequisites() {
        return;
    }
    let _one = tests::one_at_a_time();
    let d = Daemon::start("hotplug");
    let (mut g, qmp_arg, text) = Guest::hot_plugged(&d, "hotplug", &[]);
    assert!(text.contains("vCPU threads"), "{text}");
    assert!(!text.contains("warning"), "{text}");
    g.expect("FVG appeared", STEP);
    g.expect("FVG-PASS hotplug_driver_api", STEP);
    g.expect("FVG waiting for unplug", STEP);
    // The daemon got the vCPU threads from attach.
    let v = d.vm1();
    let threads = v["vcpu_threads"].as_array().cloned().unwrap_or_default();
    assert_eq!(threads.len(), 2, "two vCPUs expected: {v}");

    let out = d.fairvgpu(&["detach", "--vm", "vm1", "--qmp", &qmp_arg]);
    assert!(
        out.status.success(),
        "detach failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    g.expect("FVG gone", STEP);
    let v = d.vm1();
    assert_eq!(v["vcpu_threads"], serde_json::json!([]), "{v}");
    g.finish(STEP);
}

/// The guest's `loop` mode, as `scripts/vm-fairness.py` runs it: once its
/// vGPU is hot-plugged, a kernel loop for the given seconds, its count on
/// the console every 250 ms, the count growing.
#[test]
fn a_hot_plugged_guest_runs_its_kernel_loop_and_counts_on_the_console() {
    if !prerequisites() {
        return;
    }
    let _one = tests::one_at_a_time();
    let d = Daemon::start("loop");
    let (mut g, _, _) = Guest::hot_plugged(&d, "loop", &["--append", "fairvgpu.loop=400,2"]);
    let count = |l: String| -> u64 { l["FVG-LOOP ".len()..].trim().parse().unwrap() };
    let first = count(g.expect("FVG-LOOP ", STEP));
    let mut last = first;
    // Two seconds of loop: about eight lines, the last when it ends.
    for _ in 0..4 {
        last = count(g.expect("FVG-LOOP ", STEP));
    }
    assert!(last > first, "the count did not grow: {first} then {last}");
    g.finish(STEP);
}

/// QEMU's QMP at `path`, once QEMU serves it.
fn qmp_at(path: &Path) -> transport::qmp::Qmp {
    let start = Instant::now();
    loop {
        match transport::qmp::Qmp::connect(path, Duration::from_secs(10)) {
            Ok(q) => return q,
            Err(e) if start.elapsed() > BOOT => panic!("QMP at {}: {e}", path.display()),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A QMP command on `qmp`, its `return` (panics on an error).
fn qmp_do(qmp: &mut transport::qmp::Qmp, cmd: &str, args: Value) -> Value {
    qmp.execute(cmd, args)
        .unwrap_or_else(|e| panic!("QMP {cmd}: {e}"))
}

/// Waits for QEMU's migration on `qmp` to reach `status` (not to fail).
fn migration_reaches(qmp: &mut transport::qmp::Qmp, status: &str) {
    let m = qmp_until(qmp, "query-migrate", STEP, |v| {
        v["status"] == status || v["status"] == "failed"
    });
    assert_eq!(m["status"], status, "QEMU's migration: {m}");
}

/// Polls `query` on `qmp` until `done` holds of its answer.
fn qmp_until(
    qmp: &mut transport::qmp::Qmp,
    query: &str,
    timeout: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let start = Instant::now();
    loop {
        let v = qmp_do(qmp, query, serde_json::json!({}));
        if done(&v) {
            return v;
        }
        assert!(start.elapsed() < timeout, "{query} after {timeout:?}: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A VM saved to a file mid-loop (its vGPU checkpointed by its daemon,
/// then QEMU's own migration to a file), and restored on a second daemon
/// standing for another host into a new QEMU (`-incoming`, paused): the
/// program finishes with every round's check passing. A damaged file and
/// a missing one are refused first, and the VM still restores.
#[test]
fn a_vm_saved_mid_loop_is_restored_on_another_daemon_and_its_program_finishes() {
    if !prerequisites() {
        return;
    }
    let _one = tests::one_at_a_time();
    const ROUNDS: &str = "fairvgpu.rounds=40";
    let a = Daemon::start("save-a");
    let (mut g, mut qmp) = Guest::compute(&a, ROUNDS, None);
    g.expect("FVG module loaded", BOOT);
    g.expect("FVG-ROUND 3", STEP);

    let said = a.fairvgpu_ok(&["checkpoint", "--vm", "vm1", "--file", "vm1.fvgpu"]);
    assert!(said.contains("1 processes' checkpoint"), "{said}");
    let state = a.dir.join("vm1.state");
    qmp_do(&mut qmp, "stop", serde_json::json!({}));
    qmp_do(
        &mut qmp,
        "migrate",
        serde_json::json!({ "uri": format!("exec:cat > {}", state.display()) }),
    );
    migration_reaches(&mut qmp, "completed");
    let _ = qmp.execute("quit", serde_json::json!({}));
    drop(g);

    let b = Daemon::start("save-b");
    let dir_b = b.dir.join("run/checkpoints");
    std::fs::create_dir_all(&dir_b).unwrap();
    let file = std::fs::read(a.dir.join("run/checkpoints/vm1.fvgpu")).unwrap();
    std::fs::write(dir_b.join("vm1.fvgpu"), &file).unwrap();
    let mut bad = file.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 1;
    std::fs::write(dir_b.join("bad.fvgpu"), &bad).unwrap();

    let incoming = format!("exec:cat {}", state.display());
    let (mut g, mut qmp) = Guest::compute(&b, ROUNDS, Some(&incoming));
    qmp_until(&mut qmp, "query-status", STEP, |v| v["status"] == "paused");

    for (name, want) in [
        ("bad.fvgpu", "tag does not match"),
        ("none.fvgpu", "No such file"),
    ] {
        b.fairvgpu_refused(&["restore", "--vm", "vm1", "--file", name], want);
    }
    b.fairvgpu_ok(&["restore", "--vm", "vm1", "--file", "vm1.fvgpu"]);
    qmp_do(&mut qmp, "cont", serde_json::json!({}));
    let done = g.expect("FVG-COMPUTE", STEP);
    assert!(done.starts_with("FVG-COMPUTE ok rounds=40"), "{done}");
    g.finish(STEP);
}

/// A free TCP port on loopback (free when asked).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A key file of `key` in `dir`.
fn key_file(dir: &Path, key: &str) -> PathBuf {
    let p = dir.join(format!("key-{}", key.len()));
    std::fs::write(&p, key).unwrap();
    p
}

/// QEMU's live migration of a VM to a second daemon standing for another
/// host, mid-loop: QEMU waits before its switch-over, the source daemon
/// hands the vGPU (checkpoint and region) to the destination's over TCP
/// under their shared key, QEMU goes on, the destination serves on once
/// QEMU there has loaded the VM. First a destination with another key
/// refuses: the guest goes on computing on the source, QEMU's migration
/// cancelled; before it, one where it does not fit (a smaller memory limit)
/// refuses while the guest runs. The taken move is preceded by a
/// checkpoint sent ahead, whose module the destination's restore takes
/// loaded. The program finishes with every round's check passing.
#[test]
fn a_vm_migrated_live_to_another_daemon_mid_loop_finishes_its_program() {
    if !prerequisites() {
        return;
    }
    let _one = tests::one_at_a_time();
    const ROUNDS: &str = "fairvgpu.rounds=60";
    let keys = scratch::dir("fvg-vm-keys");
    let key = key_file(&keys, "a key both hosts share, 0123456789");
    let other = key_file(&keys, "another host's key, 0123456789");
    let (port_b, port_c) = (free_port(), free_port());
    let listen = |port: u16, k: &Path| {
        format!(
            "handover_listen = \"127.0.0.1:{port}\"\ncheckpoint_key_file = \"{}\"",
            k.display()
        )
    };
    let a = Daemon::start_keys(
        "live-a",
        &format!("checkpoint_key_file = \"{}\"", key.display()),
        "",
    );
    let b = Daemon::start_keys("live-b", &listen(port_b, &key), "");
    let c = Daemon::start_keys("live-c", &listen(port_c, &other), "");
    let port_d = free_port();
    let _d = Daemon::start_keys("live-d", &listen(port_d, &key), "memory_limit_mib = 1");
    let (mut g, mut qa) = Guest::compute(&a, ROUNDS, None);
    g.expect("FVG module loaded", BOOT);
    g.expect("FVG-ROUND 3", STEP);
    qmp_do(
        &mut qa,
        "migrate-set-capabilities",
        serde_json::json!({"capabilities": [{"capability": "pause-before-switchover", "state": true}]}),
    );
    let boot_incoming =
        |d: &Daemon, port: u16| Guest::compute(d, ROUNDS, Some(&format!("tcp:127.0.0.1:{port}")));
    let migrate_to_switchover = |qa: &mut transport::qmp::Qmp, port: u16| {
        qmp_do(
            qa,
            "migrate",
            serde_json::json!({ "uri": format!("tcp:127.0.0.1:{port}") }),
        );
        migration_reaches(qa, "pre-switchover");
    };

    // Refused by a destination where it does not fit, while the guest
    // runs: the vGPU goes on at once.
    let to_d = format!("127.0.0.1:{port_d}");
    a.fairvgpu_refused(
        &["handover", "--vm", "vm1", "--to", &to_d],
        "its limit here is 1 MiB",
    );
    let round = |l: String| -> u64 { l["FVG-ROUND ".len()..].trim().parse().unwrap() };
    let before = round(g.expect("FVG-ROUND ", STEP));
    assert!(round(g.expect("FVG-ROUND ", STEP)) > before);

    // Refused by one with another key, QEMU's migration under way: the
    // guest goes on on the source, QEMU's migration cancelled.
    let qport = free_port();
    let (_refused, _) = boot_incoming(&c, qport);
    migrate_to_switchover(&mut qa, qport);
    let to_c = format!("127.0.0.1:{port_c}");
    a.fairvgpu_refused(
        &["handover", "--vm", "vm1", "--to", &to_c],
        "proof does not match",
    );
    qmp_do(&mut qa, "migrate_cancel", serde_json::json!({}));
    qmp_until(&mut qa, "query-status", STEP, |v| v["status"] == "running");
    let before = round(g.expect("FVG-ROUND ", STEP));
    assert!(round(g.expect("FVG-ROUND ", STEP)) > before);

    // Taken: a checkpoint sent ahead while the guest runs (the
    // destination's spare loads its module), then the guest finishes on
    // the destination.
    let qport = free_port();
    let (mut g_b, mut qb) = boot_incoming(&b, qport);
    let to_b = format!("127.0.0.1:{port_b}");
    let said = a.fairvgpu_ok(&["handover", "--vm", "vm1", "--to", &to_b, "--ahead"]);
    assert!(
        said.contains("vm1: 1 modules loaded ahead on GPU 0 in "),
        "{said}"
    );
    let before = round(g.expect("FVG-ROUND ", STEP));
    assert!(round(g.expect("FVG-ROUND ", STEP)) > before);
    migrate_to_switchover(&mut qa, qport);
    a.fairvgpu_ok(&["handover", "--vm", "vm1", "--to", &to_b]);
    qmp_do(
        &mut qa,
        "migrate-continue",
        serde_json::json!({ "state": "pre-switchover" }),
    );
    migration_reaches(&mut qa, "completed");
    qmp_until(&mut qb, "query-status", STEP, |v| v["status"] == "paused");
    let said = b.fairvgpu_ok(&["restore", "--vm", "vm1", "--received"]);
    assert!(said.contains("(1 modules loaded ahead)"), "{said}");
    qmp_do(&mut qb, "cont", serde_json::json!({}));
    let _ = qa.execute("quit", serde_json::json!({}));
    drop(g);
    let done = g_b.expect("FVG-COMPUTE", STEP);
    assert!(done.starts_with("FVG-COMPUTE ok rounds=60"), "{done}");
    g_b.finish(STEP);
}
