//! Declarations of vGPUs over the control API (`PUT` and `DELETE
//! /api/v1/vgpus/{vm}`, what libvirt's hook sends) from a caller that gets
//! them wrong or means harm: each bad body or name is a 4xx naming what is
//! wrong, and leaves no vGPU, socket or worker behind; a good one serves a
//! guest at once, survives a SIGHUP reload of host.toml, and its DELETE
//! frees its socket and memory.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use daemon::control::{client_call, ApiTarget};
use guest::Gpu;
use serde_json::Value;
use tests::cargo_build;

struct Daemon {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn call(run: &Path, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let (code, body) =
        client_call(&ApiTarget::Unix(run.join("api.sock")), method, path, body).expect("API");
    (code, String::from_utf8_lossy(&body).into_owned())
}

/// The names of the vGPUs the status shows.
fn vgpus(run: &Path) -> Vec<String> {
    let (code, body) = call(run, "GET", "/api/v1/status", b"");
    assert_eq!(code, 200, "{body}");
    let st: Value = serde_json::from_str(&body).unwrap();
    let mut names: Vec<String> = st["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["vgpus"].as_array().cloned().unwrap_or_default())
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

fn sockets(run: &Path) -> Vec<String> {
    let mut s: Vec<String> = std::fs::read_dir(run)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sock") && !n.starts_with("grant-"))
        .collect();
    s.sort();
    s
}

fn wait(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bad_declarations_leave_nothing_and_a_good_one_serves_until_deleted() {
    let bin = cargo_build("cli").join("fairvgpu");
    let dir = scratch::dir("hostile-declarations");
    let run = dir.join("run");
    let config = dir.join("host.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nrun_dir = {:?}\nexecutor = \"sim\"\n\n[sim]\nmemory = 1073741824\n\n\
             [[vm]]\nname = \"vm1\"\ntenant = \"t1\"\nmemory_limit_mib = 64\n",
            run.display().to_string()
        ),
    )
    .unwrap();
    let child = Command::new(&bin)
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let d = Daemon { child, dir };
    wait("the daemon", || {
        run.join("vm1.sock").exists() && run.join("api.sock").exists()
    });
    let before = (vgpus(&run), sockets(&run));

    let deep = "[".repeat(20_000) + &"]".repeat(20_000);
    let huge_name = "x".repeat(10_000);
    let cases: Vec<(String, String, &str)> = vec![
        ("dom1".into(), "not json".into(), "not JSON"),
        ("dom1".into(), deep, "not JSON"),
        ("dom1".into(), "[1, 2]".into(), "expected an object"),
        (
            "dom1".into(),
            r#"{"tenant": "a"}"#.into(),
            "memory_limit_mib",
        ),
        (
            "dom1".into(),
            r#"{"tenant": 5, "memory_limit_mib": 64}"#.into(),
            "tenant",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": 64, "weight": 0}"#.into(),
            "weight",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": 64, "weight": -1}"#.into(),
            "weight",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": 64, "weight": 1e999}"#.into(),
            "not JSON",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": 64, "weight": "2"}"#.into(),
            "weight",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": 4096}"#.into(),
            "memory_limit_mib",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": -1}"#.into(),
            "memory_limit_mib",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": 18446744073709551615}"#.into(),
            "memory_limit_mib",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": 64, "gpu": 1}"#.into(),
            "gpu 1 does not exist",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": 64, "gpu": 4294967296}"#.into(),
            "gpu",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": 64, "pinned_mib": 2}"#.into(),
            "pinned_mib",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "../../etc", "memory_limit_mib": 64}"#.into(),
            "tenant",
        ),
        (
            "dom1".into(),
            r#"{"tenant": "a", "memory_limit_mib": 64, "owner": "x y"}"#.into(),
            "owner",
        ),
        (
            "..".into(),
            r#"{"tenant": "a", "memory_limit_mib": 64}"#.into(),
            "vm name",
        ),
        (
            "a%2F..%2Fx".into(),
            r#"{"tenant": "a", "memory_limit_mib": 64}"#.into(),
            "vm name",
        ),
        (
            huge_name,
            r#"{"tenant": "a", "memory_limit_mib": 64}"#.into(),
            "vm name",
        ),
    ];
    for (vm, body, needle) in &cases {
        let (code, answer) = call(&run, "PUT", &format!("/api/v1/vgpus/{vm}"), body.as_bytes());
        assert!(
            (400..500).contains(&code),
            "{vm}: {body:.80}: {code} {answer}"
        );
        assert!(
            answer.contains(needle),
            "{body:.80}: {answer} does not say {needle:?}"
        );
    }
    // host.toml's VM is neither re-declared nor deleted through the API.
    let good = br#"{"tenant": "acme", "weight": 2, "memory_limit_mib": 256, "owner": "libvirt"}"#;
    assert_eq!(call(&run, "PUT", "/api/v1/vgpus/vm1", good).0, 409);
    assert_eq!(call(&run, "DELETE", "/api/v1/vgpus/vm1", b"").0, 409);
    assert_eq!(call(&run, "DELETE", "/api/v1/vgpus/nobody", b"").0, 404);
    assert_eq!(
        (vgpus(&run), sockets(&run)),
        before,
        "something was left behind"
    );

    // A good one serves a guest at once.
    let (code, answer) = call(&run, "PUT", "/api/v1/vgpus/dom1", good);
    assert_eq!(code, 201, "{answer}");
    wait("dom1's socket", || run.join("dom1.sock").exists());
    let mut gpu = Gpu::connect(&run.join("dom1.sock")).expect("a guest attaches");
    let p = gpu.mem_alloc(1 << 20).expect("allocates");
    gpu.memcpy_htod(p, &[7u8; 4096]).unwrap();
    let mut back = [0u8; 4096];
    gpu.memcpy_dtoh(&mut back, p, 0).unwrap();
    assert_eq!(back, [7u8; 4096]);
    // Above its limit, refused as a GPU would.
    assert!(gpu.mem_alloc(300 << 20).is_err(), "256 MiB limit not kept");
    drop(gpu);
    // A SIGHUP reload of host.toml keeps it.
    let pid = nix::unistd::Pid::from_raw(d.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(vgpus(&run), ["dom1", "vm1"]);
    // DELETE frees it: status and socket.
    assert_eq!(call(&run, "DELETE", "/api/v1/vgpus/dom1", b"").0, 200);
    wait("dom1's socket to go", || !run.join("dom1.sock").exists());
    assert_eq!((vgpus(&run), sockets(&run)), before);
}
