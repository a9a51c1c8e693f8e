//! The operator's side against a real `fairvgpu serve` (sim executor) with
//! three busy guests of weights 1:2:3: status and shares over the API,
//! weight changes, reloads that are refused and keep the running config,
//! the token on TCP, the metrics, and the dashboard in headless Chromium.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use daemon::control::{client_call, ApiTarget};
use guest::Gpu;
use protocol::{Dim3, ImageKind};
use serde_json::Value;
use tests::{cargo_build, chromium, dashboard_dom, TEST_SPIN};

const TOKEN: &str = "operator-test-token-0123456789";

// The two tests each run a daemon with three busy guests: one at a time
// (`tests::one_at_a_time`), so that on a 2-core machine neither starves the other's shares.

fn fairvgpu_bin() -> PathBuf {
    cargo_build("cli").join("fairvgpu")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn config(dir: &Path, port: u16, weights: [&str; 3]) -> String {
    let mut s = format!(
        "[daemon]\nrun_dir = {:?}\nexecutor = \"sim\"\n\n[spin]\nspins = 2000\nmax_block_us = 2000\n\n\
         [api]\ntcp = \"127.0.0.1:{port}\"\ntoken_file = {:?}\n",
        dir.display().to_string(),
        dir.join("token").display().to_string()
    );
    for (i, w) in weights.iter().enumerate() {
        s.push_str(&format!(
            "\n[[vm]]\nname = \"vm{}\"\ntenant = \"t{}\"\nweight = {w}\nmemory_limit_mib = 1024\n",
            i + 1,
            i + 1
        ));
    }
    s
}

struct Daemon {
    child: Child,
    dir: PathBuf,
    port: u16,
    stop: Arc<AtomicBool>,
    guests: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for g in self.guests.drain(..) {
            let _ = g.join();
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A daemon with three guests running 2 ms kernels, eight per synchronize.
fn start(name: &str) -> Daemon {
    let bin = fairvgpu_bin();
    let dir = scratch::dir(&format!("fvg-op-{name}"));
    std::fs::write(dir.join("token"), TOKEN).unwrap();
    let port = free_port();
    std::fs::write(dir.join("host.toml"), config(&dir, port, ["1", "2", "3"])).unwrap();
    let child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(dir.join("host.toml"))
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("daemon starts");
    let stop = Arc::new(AtomicBool::new(false));
    let mut d = Daemon {
        child,
        dir: dir.clone(),
        port,
        stop: stop.clone(),
        guests: Vec::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    for s in ["api.sock", "vm1.sock", "vm2.sock", "vm3.sock"] {
        while !dir.join(s).exists() {
            assert!(Instant::now() < deadline, "{s} did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for i in 1..=3 {
        let sock = dir.join(format!("vm{i}.sock"));
        let stop = stop.clone();
        d.guests.push(std::thread::spawn(move || {
            let mut gpu = Gpu::connect_with(&sock, TEST_SPIN).expect("guest attaches");
            let m = gpu
                .module_load(ImageKind::Ptx, worker::KERNELS_PTX.as_bytes())
                .unwrap();
            let f = gpu.get_function(m, "spin_ns").unwrap();
            let one = Dim3 { x: 1, y: 1, z: 1 };
            let ns = 2_000_000u64.to_le_bytes();
            let _buf = gpu.mem_alloc(64 << 20).unwrap();
            // Eight kernels per synchronize: see `tests::spin_guest`
            // on why a shares test does not synchronize after each one.
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..8 {
                    gpu.launch(&f, one, one, 0, 0, &[&ns]).unwrap();
                }
                gpu.synchronize().unwrap();
            }
        }));
    }
    d
}

fn unix(d: &Daemon) -> ApiTarget {
    ApiTarget::Unix(d.dir.join("api.sock"))
}

fn tcp(d: &Daemon, token: Option<&str>) -> ApiTarget {
    ApiTarget::Tcp {
        addr: format!("127.0.0.1:{}", d.port),
        token: token.map(str::to_owned),
    }
}

fn call(t: &ApiTarget, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, body) = client_call(t, method, path, body.as_bytes()).expect("API answers");
    let v = serde_json::from_slice(&body)
        .unwrap_or(Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, v)
}

fn shares(d: &Daemon) -> Vec<f64> {
    let (st, v) = call(&unix(d), "GET", "/api/v1/status", "");
    assert_eq!(st, 200);
    v["gpus"][0]["vgpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["share"].as_f64().unwrap())
        .collect()
}

/// Waits for the shares over a full window to settle near `want`.
fn wait_shares(d: &Daemon, want: [f64; 3], tol: f64) -> Vec<f64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut s;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        s = shares(d);
        if s.iter().zip(want).all(|(a, b)| (a - b).abs() <= tol) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "shares {s:?} never came near {want:?}"
        );
    }
}

#[test]
fn operator_api_shares_weights_reload_token_metrics() {
    let _serial = tests::one_at_a_time();
    let d = start("api");
    // Shares follow 1:2:3.
    let s = wait_shares(&d, [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0], 0.07);
    eprintln!("shares at 1:2:3: {s:?}");
    // Shares within 0.07 of 1/6 can still be an MMR of 0.6 while the
    // start-up (equal shares) is in the 5 s window: wait for it to leave.
    let deadline = Instant::now() + Duration::from_secs(20);
    let st = loop {
        let (_, st) = call(&unix(&d), "GET", "/api/v1/status", "");
        if st["gpus"][0]["mmr"].as_f64().unwrap_or(0.0) > 0.8 {
            break st;
        }
        assert!(Instant::now() < deadline, "MMR stayed low: {st}");
        std::thread::sleep(Duration::from_millis(250));
    };
    // The host CPU options: each on or off, with what it does or why not.
    for opt in ["priority", "vcpu_lift", "cpus", "cgroup"] {
        let o = &st["host_cpu"][opt];
        assert!(o["on"].is_boolean(), "{opt}: {}", st["host_cpu"]);
        assert!(!o["detail"].as_str().unwrap_or("").is_empty(), "{opt}: {o}");
    }
    assert_eq!(st["host_cpu"]["cpus"]["on"], false, "no [daemon] cpus here");
    let g = &st["gpus"][0];
    let vm1 = &g["vgpus"][0];
    assert_eq!(vm1["memory_used_bytes"], 64 << 20, "{vm1}");
    assert_eq!(vm1["memory_limit_bytes"], 1024 << 20);

    // Changing a weight through the API changes the shares: 3:2:3.
    let (code, _) = call(
        &unix(&d),
        "POST",
        "/api/v1/vgpus/vm1/weight",
        r#"{"weight": 3}"#,
    );
    assert_eq!(code, 200);
    let s = wait_shares(&d, [3.0 / 8.0, 2.0 / 8.0, 3.0 / 8.0], 0.07);
    eprintln!("shares at 3:2:3: {s:?}");
    let (code, e) = call(
        &unix(&d),
        "POST",
        "/api/v1/vgpus/vm1/weight",
        r#"{"weight": -1}"#,
    );
    assert_eq!(code, 400, "{e}");
    let (code, _) = call(
        &unix(&d),
        "POST",
        "/api/v1/vgpus/nope/weight",
        r#"{"weight": 1}"#,
    );
    assert_eq!(code, 404);

    // Attach and detach: bad requests are refused with a reason (the real
    // hot-plug is tests/vm.rs).
    let (code, e) = call(&unix(&d), "POST", "/api/v1/vgpus/vm1/attach", "{}");
    assert_eq!(code, 400, "{e}");
    let (code, _) = call(
        &unix(&d),
        "POST",
        "/api/v1/vgpus/nope/attach",
        r#"{"qmp": "/nonexistent.qmp"}"#,
    );
    assert_eq!(code, 404);
    let (code, e) = call(
        &unix(&d),
        "POST",
        "/api/v1/vgpus/vm1/detach",
        r#"{"qmp": "/nonexistent.qmp"}"#,
    );
    assert_eq!(code, 409, "{e}");
    assert!(e["error"].as_str().unwrap_or("").contains("QMP"), "{e}");
    let (code, e) = call(
        &unix(&d),
        "POST",
        "/api/v1/vgpus/vm1/vcpus",
        r#"{"threads": [1, "x"]}"#,
    );
    assert_eq!(code, 400, "{e}");

    // TCP: no token, a wrong token: refused; the right one: served.
    for token in [None, Some("wrong-token-wrong-token-wrong")] {
        let (code, _) = call(&tcp(&d, token), "GET", "/api/v1/status", "");
        assert_eq!(code, 401, "token {token:?}");
        let (code, _) = call(
            &tcp(&d, token),
            "POST",
            "/api/v1/vgpus/vm1/weight",
            r#"{"weight": 9}"#,
        );
        assert_eq!(code, 401);
    }
    let (code, _) = call(&tcp(&d, Some(TOKEN)), "GET", "/api/v1/status", "");
    assert_eq!(code, 200);

    // Metrics.
    let (code, m) = call(&unix(&d), "GET", "/metrics", "");
    assert_eq!(code, 200);
    let m = m.as_str().unwrap().to_owned();
    for needle in [
        "# TYPE fairvgpu_vgpu_gpu_seconds_total counter",
        "fairvgpu_vgpu_share{gpu=\"0\",vm=\"vm1\",tenant=\"t1\"}",
        "fairvgpu_vgpu_memory_limit_bytes{gpu=\"0\",vm=\"vm2\",tenant=\"t2\"} 1073741824",
        "fairvgpu_gpu_mmr{gpu=\"0\"}",
    ] {
        assert!(m.contains(needle), "{needle} missing from\n{m}");
    }

    // Reloads that must be refused keep the running config.
    let path = d.dir.join("host.toml");
    let good = std::fs::read_to_string(&path).unwrap();
    for (bad, why) in [
        (good.replace("weight = 2", "weight = -2"), "weight"),
        (
            good.replace("tenant = \"t2\"", "tenant = \"t2\"\ncolour = \"red\""),
            "colour",
        ),
        (
            good.replace("memory_limit_mib = 1024", "memory_limit_mib = 99999999"),
            "exceeds",
        ),
        // A GPU's slice is fixed when its grant service starts.
        (
            format!("{good}\n[[gpu]]\nindex = 0\nslice_us = 3000\n"),
            "[[gpu]] entries change only with a restart",
        ),
    ] {
        std::fs::write(&path, bad).unwrap();
        let (code, e) = call(&unix(&d), "POST", "/api/v1/reload", "");
        assert_eq!(code, 400);
        assert!(
            e["error"].as_str().unwrap().contains(why),
            "{e} should name {why}"
        );
    }
    let (_, st) = call(&unix(&d), "GET", "/api/v1/status", "");
    assert_eq!(st["gpus"][0]["vgpus"][1]["weight"], 2.0, "old config kept");
    // The sim cannot preempt a kernel: docs/design.md's non-preemptive 6 ms.
    assert_eq!(st["gpus"][0]["slice_us"], 6000, "{st}");
    // A good reload (the file's 1:2:3 again, vm3 at 1) applies: 1:2:1.
    std::fs::write(&path, good.replace("weight = 3", "weight = 1")).unwrap();
    let (code, r) = call(&unix(&d), "POST", "/api/v1/reload", "");
    assert_eq!(code, 200, "{r}");
    let s = wait_shares(&d, [0.25, 0.5, 0.25], 0.07);
    eprintln!("shares at 1:2:1 after reload: {s:?}");
    // SIGHUP reloads too: back to 1:2:3.
    std::fs::write(&path, &good).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_shares(&d, [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0], 0.07);
}

/// The shares the page shows: `data-share` of each vGPU row, in order.
fn page_shares(dom: &str) -> Vec<f64> {
    (1..=3)
        .map(|i| {
            let row = dom
                .find(&format!("id=\"row-vm{i}\""))
                .unwrap_or_else(|| panic!("row of vm{i} missing from the page:\n{dom}"));
            let tag_end = dom[row..].find('>').unwrap() + row;
            let tag = &dom[row..tag_end];
            let at = tag.find("data-share=\"").expect("data-share") + 12;
            let end = tag[at..].find('"').unwrap() + at;
            tag[at..end].parse().unwrap()
        })
        .collect()
}

#[test]
fn dashboard_in_headless_chromium() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("FAIRVGPU_REQUIRE_CHROMIUM").is_none(),
            "FAIRVGPU_REQUIRE_CHROMIUM is set but no chromium was found"
        );
        eprintln!("skipped: no chromium (apt-get install chromium)");
        return;
    };
    let _serial = tests::one_at_a_time();
    let d = start("dash");
    wait_shares(&d, [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0], 0.07);
    // Over TCP, as an operator's browser would, with the token in the fragment.
    let base = format!("http://127.0.0.1:{}/", d.port);
    let dom = dashboard_dom(&browser, &format!("{base}#token={TOKEN}"), None);
    let s = page_shares(&dom);
    eprintln!("page shares at 1:2:3: {s:?}");
    // Chromium itself competes for the 2 cores the sim guests run on while
    // the page loads, so the page's window is checked loosely: the order the
    // weights give, and near the ideal.
    assert!(s[0] < s[1] && s[1] < s[2], "page shows {s:?}");
    for (got, want) in s.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
        assert!((got - want).abs() < 0.1, "page shows {s:?}");
    }
    assert!(dom.contains("class=\"mmr\""), "MMR shown");
    // Without the token the page gets no data.
    let dom = dashboard_dom(&browser, &base, None);
    assert!(!dom.contains("id=\"row-vm1\""), "no token, no data");
    // Change vm1's weight to 3 through the page's weight control.
    dashboard_dom(&browser, &format!("{base}#token={TOKEN}&set=vm1:3"), None);
    wait_shares(&d, [3.0 / 8.0, 2.0 / 8.0, 3.0 / 8.0], 0.07);
    let dom = dashboard_dom(&browser, &format!("{base}#token={TOKEN}"), None);
    let s = page_shares(&dom);
    eprintln!("page shares after setting vm1 to 3 in the page: {s:?}");
    assert!(
        s[0] > s[1] && (s[0] - 3.0 / 8.0).abs() < 0.1,
        "page shows {s:?}"
    );
    assert!(
        dom.contains("weight set to 3"),
        "the change is listed as an event"
    );
    // The screenshot, kept as a test artifact.
    let shot = cargo_build("cli")
        .parent()
        .expect("target folder")
        .join("test-artifacts/dashboard.png");
    std::fs::create_dir_all(shot.parent().unwrap()).unwrap();
    dashboard_dom(&browser, &format!("{base}#token={TOKEN}"), Some(&shot));
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot"
    );
    eprintln!("screenshot: {}", shot.display());
}
