//! `fairvgpu demo`, the README's first command: three tenants at 1:2:3 on
//! the sim, each an unmodified CUDA program in its own process loaded
//! through the stand-in libcuda.so.1, a weight changed midway; its summary's shares must be within 5
//! points of entitlement in both phases, and its dashboard must answer
//! (checked here over HTTP, and in headless Chromium, while the demo
//! runs). Ctrl-C ends it cleanly.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use daemon::control::{client_call, ApiTarget};
use tests::{cargo_build, chromium, dashboard_dom};

// One demo at a time (`tests::one_at_a_time`): two would share the machine's cores and
// each other's shares.

fn fairvgpu_bin() -> PathBuf {
    cargo_build("cli").join("fairvgpu")
}

/// `(entitled, got)` pairs of a summary row, as fractions.
fn row_pairs(line: &str) -> Vec<(f64, f64)> {
    let t: Vec<&str> = line.split_whitespace().collect();
    let val = |s: &str| s.trim_end_matches('%').parse::<f64>().unwrap() / 100.0;
    t.windows(4)
        .filter(|w| w[0] == "entitled" && w[2] == "got")
        .map(|w| (val(w[1]), val(w[3])))
        .collect()
}

#[test]
fn demo_shares_follow_the_weights_and_its_dashboard_answers() {
    let _one = tests::one_at_a_time();
    let mut demo = Command::new(fairvgpu_bin())
        .args(["demo", "--seconds", "10"])
        .env("RUST_BACKTRACE", "1")
        .env("TMPDIR", scratch::child_tmpdir())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .spawn()
        .expect("demo starts");
    let out = std::io::BufReader::new(demo.stdout.take().unwrap());
    let mut lines = Vec::new();
    let mut dashboard_checked = false;
    let mut browser = None;
    for line in out.lines() {
        let line = line.unwrap();
        println!("{line}");
        if let Some(url) = line.strip_prefix("dashboard: http://") {
            // Over TCP, as a browser would: the page, then its data with
            // the token from the URL's fragment.
            let (addr, rest) = url.split_once('/').unwrap();
            let token = rest.split_whitespace().next().unwrap();
            let token = token.strip_prefix("#token=").expect("the token in the URL");
            let page = ApiTarget::Tcp {
                addr: addr.to_owned(),
                token: None,
            };
            let (code, body) = client_call(&page, "GET", "/", b"").unwrap();
            assert_eq!(code, 200);
            assert!(String::from_utf8_lossy(&body).contains("fairvgpu"));
            let data = ApiTarget::Tcp {
                addr: addr.to_owned(),
                token: Some(token.to_owned()),
            };
            let (code, body) = client_call(&data, "GET", "/api/v1/status", b"").unwrap();
            assert_eq!(code, 200);
            assert!(String::from_utf8_lossy(&body).contains("\"vm3\""));
            dashboard_checked = true;
            // In a browser, as the operator opens it: the page's script
            // fills a row per tenant from the live figures.
            if let Some(b) = chromium() {
                let url = format!("http://{}", url.split_whitespace().next().unwrap());
                browser = Some(std::thread::spawn(move || dashboard_dom(&b, &url, None)));
            } else {
                assert!(
                    std::env::var_os("FAIRVGPU_REQUIRE_CHROMIUM").is_none(),
                    "FAIRVGPU_REQUIRE_CHROMIUM is set but no chromium was found"
                );
            }
        }
        lines.push(line);
    }
    let st = demo.wait().unwrap();
    let all = lines.join("\n");
    assert!(st.success(), "demo failed:\n{all}");
    assert!(dashboard_checked, "no dashboard URL printed:\n{all}");
    if let Some(b) = browser {
        let dom = b.join().expect("chromium ran");
        for vm in ["vm1", "vm2", "vm3"] {
            assert!(
                dom.contains(&format!("id=\"row-{vm}\"")),
                "the dashboard in Chromium shows no row for {vm}:\n{dom}"
            );
        }
    }
    assert!(all.contains("dashboard answered: page HTTP 200"), "{all}");
    // The tenants are the C program, built by the demo against the
    // stand-in, and each ran to a clean stop on its own vGPU.
    assert!(
        all.contains("tenant program: ") && all.contains("cc -lcuda"),
        "{all}"
    );
    assert!(
        all.contains("vm1's tenant: vector_add: 1048576 elements, 0 wrong")
            && all.contains("vm1's tenant: saxpy: 1048576 elements, 0 wrong"),
        "{all}"
    );
    for vm in ["vm1", "vm2", "vm3"] {
        assert!(
            all.contains(&format!("{vm}'s tenant: device fairvgpu sim GPU")),
            "{all}"
        );
        let ran = lines
            .iter()
            .find_map(|l| {
                l.split_once(&format!("{vm}'s tenant: "))
                    .and_then(|(_, r)| r.split_once(" kernels of 2 ms"))
                    .and_then(|(n, _)| n.parse::<u64>().ok())
            })
            .unwrap_or_else(|| panic!("{vm}'s tenant's count:\n{all}"));
        assert!(ran > 0, "{vm}'s tenant ran no kernels:\n{all}");
    }
    assert!(all.contains("set-weight vm1 4"), "{all}");
    let live = lines.iter().filter(|l| l.contains(" s  vm1 ")).count();
    assert!(live >= 8, "live shares each second:\n{all}");
    let rows: Vec<Vec<(f64, f64)>> = lines
        .iter()
        .filter(|l| l.trim_start().starts_with("vm") && l.contains("(tenant"))
        .map(|l| row_pairs(l))
        .collect();
    assert_eq!(rows.len(), 3, "{all}");
    let want = [
        [1.0 / 6.0, 4.0 / 9.0],
        [2.0 / 6.0, 2.0 / 9.0],
        [3.0 / 6.0, 3.0 / 9.0],
    ];
    for (row, want) in rows.iter().zip(want) {
        assert_eq!(row.len(), 2, "two phases: {all}");
        for ((ent, got), w) in row.iter().zip(want) {
            assert!((ent - w).abs() < 0.001, "entitlement {ent} vs {w}:\n{all}");
            assert!((got - ent).abs() <= 0.05, "share {got} vs {ent}:\n{all}");
        }
    }
}

#[test]
fn ctrl_c_ends_the_demo_cleanly() {
    let _one = tests::one_at_a_time();
    let mut demo = Command::new(fairvgpu_bin())
        .args(["demo", "--seconds", "600"])
        .env("TMPDIR", scratch::child_tmpdir())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .spawn()
        .expect("demo starts");
    let pid = demo.id();
    let out = std::io::BufReader::new(demo.stdout.take().unwrap());
    let mut lines = Vec::new();
    for line in out.lines() {
        let line = line.unwrap();
        if line.contains(" s  vm1 ") && lines.iter().all(|l: &String| !l.contains(" s  vm1 ")) {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGINT,
            )
            .unwrap();
        }
        lines.push(line);
    }
    let t = Instant::now();
    let st = demo.wait().unwrap();
    let all = lines.join("\n");
    assert!(t.elapsed() < Duration::from_secs(30), "{all}");
    assert!(st.success(), "{all}");
    assert!(all.contains("interrupted: stopping"), "{all}");
    let dir = scratch::child_tmpdir().join(format!("fairvgpu-demo-{pid}"));
    assert!(!dir.exists(), "{} left behind", dir.display());
}
