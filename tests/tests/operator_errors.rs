//! The operator's path without traps: a run_dir in use is refused with the
//! first daemon still answering, SIGTERM leaves nothing behind, and bad
//! inputs give one line each, with no backtrace even where RUST_BACKTRACE
//! is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use tests::cargo_build;

fn fairvgpu_bin() -> PathBuf {
    cargo_build("cli").join("fairvgpu")
}

fn scratch(name: &str) -> PathBuf {
    scratch::dir(&format!("fvg-operr-{name}"))
}

fn config(run_dir: &Path) -> String {
    format!(
        "[daemon]\nrun_dir = {:?}\nexecutor = \"sim\"\n\n[[vm]]\nname = \"vm1\"\ntenant = \"t1\"\nweight = 1\nmemory_limit_mib = 64\n",
        run_dir.display().to_string()
    )
}

/// Runs `fairvgpu ARGS` as a user would, with RUST_BACKTRACE=1 and no
/// RUST_LOG, to its end.
fn fairvgpu(args: &[&str], config: &Path) -> Output {
    Command::new(fairvgpu_bin())
        .args(args)
        .arg("--config")
        .arg(config)
        .env("RUST_BACKTRACE", "1")
        .env_remove("RUST_LOG")
        .output()
        .expect("fairvgpu runs")
}

/// The command failed and said so in exactly one line holding `needle`.
fn one_line_error(out: &Output, needle: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "should fail: {err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line, got:\n{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(needle), "{err} should say {needle:?}");
    assert!(
        !err.contains("acktrace") && !err.contains("Caused by"),
        "{err}"
    );
    // No part of the message said twice.
    assert_eq!(
        err.matches("config:").count(),
        usize::from(err.contains("config:")),
        "{err}"
    );
    lines[0].to_owned()
}

#[test]
fn a_second_serve_is_refused_and_sigterm_leaves_no_socket() {
    let dir = scratch("lock");
    let run_dir = dir.join("run");
    let cfg = dir.join("host.toml");
    std::fs::write(&cfg, config(&run_dir)).unwrap();
    let first = Command::new(fairvgpu_bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("daemon starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    for s in ["api.sock", "vm1.sock", "grant-gpu0.sock"] {
        while !run_dir.join(s).exists() {
            assert!(Instant::now() < deadline, "{s} did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let cfg_s = cfg.to_str().unwrap();
    let second = fairvgpu(&["serve"], &cfg);
    let line = one_line_error(&second, "is in use by another fairvgpu serve");
    assert!(
        line.contains(&format!("(pid {})", first.id())),
        "names the first daemon: {line}"
    );
    assert!(line.contains("[daemon] run_dir"), "says what to do: {line}");
    // The first daemon still has its sockets and answers.
    let st = Command::new(fairvgpu_bin())
        .args(["status", "--json", "--config", cfg_s])
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "status: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert!(String::from_utf8_lossy(&st.stdout).contains("\"vm1\""));

    // SIGTERM: logged, workers ended, nothing left in run_dir.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = first.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("stopping"), "{log}");
    assert!(log.contains("stopped: workers ended"), "{log}");
    let left: Vec<String> = std::fs::read_dir(&run_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        // The host's id stays: the vGPUs' UUIDs derive from it and must
        // survive a restart (see `identity.rs`). Sockets and the lock go.
        .filter(|name| name != "host-id")
        .collect();
    assert!(left.is_empty(), "left behind in run_dir: {left:?}");
    // And the run_dir is free again.
    let mut again = Command::new(fairvgpu_bin())
        .args(["serve", "--config", cfg_s])
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    while !run_dir.join("api.sock").exists() {
        assert!(
            Instant::now() < deadline + Duration::from_secs(30),
            "no restart"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(again.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert!(again.wait().unwrap().success());
    assert!(!run_dir.join("api.sock").exists(), "SIGINT cleans up too");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_inputs_give_one_line_without_backtrace() {
    let dir = scratch("bad");
    // A config that is not TOML.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[daemon]\nrun_dir = 5\n").unwrap();
    let line = one_line_error(&fairvgpu(&["serve"], &bad), "bad.toml: line 2");
    assert!(line.contains("run_dir"), "{line}");
    // A config that is not there (for serve and for status).
    let missing = dir.join("missing.toml");
    for cmd in ["serve", "status"] {
        one_line_error(
            &fairvgpu(&[cmd], &missing),
            "missing.toml: no such file; pass --config",
        );
    }
    // A run_dir that cannot be made.
    let unwritable = if euid() == 0 {
        // root may write anywhere: a run_dir below a plain file.
        std::fs::write(dir.join("file"), "").unwrap();
        dir.join("file/run")
    } else {
        let ro = dir.join("ro");
        std::fs::create_dir_all(&ro).unwrap();
        let ro_mode = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o555);
        std::fs::set_permissions(&ro, ro_mode).unwrap();
        ro.join("run")
    };
    let cfg = dir.join("host.toml");
    std::fs::write(&cfg, config(&unwritable)).unwrap();
    let line = one_line_error(
        &fairvgpu(&["serve"], &cfg),
        &format!("run_dir {}", unwritable.display()),
    );
    assert!(line.contains("set [daemon] run_dir"), "{line}");
    if euid() != 0 {
        assert!(line.contains("permission denied; run as root"), "{line}");
    }
    // A daemon that is not running.
    std::fs::write(&cfg, config(&dir.join("nobody-serves"))).unwrap();
    one_line_error(&fairvgpu(&["status"], &cfg), "api.sock");
    let _ = std::fs::remove_dir_all(&dir);
}

/// This process's effective uid (from /proc: no unsafe, no extra nix feature).
fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse().ok())
        .expect("Uid line")
}
