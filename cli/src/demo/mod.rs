//! `fairvgpu demo`: what fairvgpu is for, in one command. A daemon (the sim
//! executor by default, no root) serves three tenants' vGPUs at weights
//! 1:2:3; a tenant on each, an unmodified CUDA program in its own process
//! loaded through the stand-in libcuda.so.1 (`tenants.rs`), keeps its vGPU
//! busy with 2 ms kernels; their
//! shares of GPU time are printed live as they converge, the dashboard is
//! served (its URL printed) while it runs, a weight is changed midway
//! through the control API (as `fairvgpu set-weight` does) and the shares
//! follow; a summary gives entitlement against share per tenant and the
//! MMR of each phase. Ctrl-C ends it early, cleanly.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use serde_json::Value;

mod tenants;
use tenants::Tenant;

use daemon::control::{client_call, ApiTarget};

use worker::KERNELS_PTX;

/// The tenants' weights at the start, and vm1's weight after the change.
const WEIGHTS: [f64; 3] = [1.0, 2.0, 3.0];
const NEW_WEIGHT: f64 = 4.0;
/// The workers' spin budget: they share a small machine with the tenants.
const SPIN: transport::SpinPolicy = transport::SpinPolicy {
    spins: 2_000,
    max_block_us: 2_000,
};

fn wait_for_socket(p: &Path, child: &mut Child, log: &Path) -> Result<()> {
    let start = Instant::now();
    while !p.exists() {
        if let Some(st) = child.try_wait()? {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            bail!("the daemon exited early ({st}): {}", log.trim());
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the daemon did not create {} in time", p.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A random token for the demo's TCP API (and its dashboard).
fn token() -> Result<String> {
    let mut b = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The daemon the demo started; SIGTERM and the demo's folder gone on drop.
struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One sample of the daemon's status: per vGPU (in config order) its
/// cumulative GPU seconds, live share and entitlement; the GPU's MMR.
struct Sample {
    at: f64,
    gpu_seconds: Vec<f64>,
    share: Vec<f64>,
    entitlement: Vec<f64>,
    mmr: f64,
}

fn sample(api: &ApiTarget, at: f64) -> Result<Sample> {
    let (code, body) = client_call(api, "GET", "/api/v1/status", b"")?;
    ensure!(code == 200, "status: HTTP {code}");
    let st: Value = serde_json::from_slice(&body)?;
    let g = &st["gpus"][0];
    let mut v: Vec<&Value> = g["vgpus"].as_array().into_iter().flatten().collect();
    v.sort_by_key(|x| x["name"].as_str().unwrap_or("").to_owned());
    ensure!(v.len() == 3, "status lists {} vGPUs, not 3", v.len());
    let f = |k: &str| v.iter().map(|x| x[k].as_f64().unwrap_or(0.0)).collect();
    Ok(Sample {
        at,
        gpu_seconds: f("gpu_seconds"),
        share: f("share"),
        entitlement: f("entitlement"),
        mmr: g["mmr"].as_f64().unwrap_or(0.0),
    })
}

/// Each vGPU's share of the GPU time charged between two samples.
fn shares_between(a: &Sample, b: &Sample) -> Vec<f64> {
    let d: Vec<f64> = (0..3)
        .map(|i| (b.gpu_seconds[i] - a.gpu_seconds[i]).max(0.0))
        .collect();
    let total: f64 = d.iter().sum();
    d.iter()
        .map(|x| if total > 0.0 { x / total } else { 0.0 })
        .collect()
}

/// Min over max of share/entitlement.
fn mmr(share: &[f64], ent: &[f64]) -> f64 {
    let r: Vec<f64> = share.iter().zip(ent).map(|(s, e)| s / e).collect();
    let max = r.iter().cloned().fold(0.0, f64::max);
    if max > 0.0 {
        r.iter().cloned().fold(f64::INFINITY, f64::min) / max
    } else {
        0.0
    }
}

fn entitlements(w: &[f64]) -> Vec<f64> {
    let sum: f64 = w.iter().sum();
    w.iter().map(|x| x / sum).collect()
}

/// Runs the demo for `seconds` of load; Ok only if the tenants' results
/// were right, each ended cleanly and the daemon answered throughout.
pub fn run(executor: daemon::config::ExecutorKind, seconds: f64) -> Result<()> {
    ensure!(
        (6.0..=3600.0).contains(&seconds),
        "--seconds {seconds}: give 6 to 3600 (two phases, each needs a few seconds)"
    );
    wire::signals::install();
    let dir = std::env::temp_dir().join(format!("fairvgpu-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
    let program = match tenants::build(&dir, KERNELS_PTX) {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let token = token()?;
    std::fs::write(dir.join("token"), &token)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut cfg = format!(
        "[daemon]\nrun_dir = {:?}\nexecutor = \"{}\"\n\n[spin]\nspins = {}\nmax_block_us = {}\n\n\
         [api]\ntcp = \"127.0.0.1:{port}\"\ntoken_file = {:?}\n\n\
         [placement]\nenabled = false\n",
        dir.display().to_string(),
        match executor {
            daemon::config::ExecutorKind::Sim => "sim",
            daemon::config::ExecutorKind::Cuda => "cuda",
        },
        SPIN.spins,
        SPIN.max_block_us,
        dir.join("token").display().to_string(),
    );
    // All three on GPU 0, where the placer leaves them: the demo shows
    // tenants sharing one GPU by weight, on a host of several GPUs too.
    for (i, w) in WEIGHTS.iter().enumerate() {
        cfg.push_str(&format!(
            "\n[[vm]]\nname = \"vm{n}\"\ntenant = \"tenant{n}\"\nweight = {w}\nmemory_limit_mib = 1024\ngpu = 0\n",
            n = i + 1
        ));
    }
    let cfg_path = dir.join("host.toml");
    std::fs::write(&cfg_path, cfg)?;
    // The log outlives the demo's folder: it is what to read if a run
    // looked wrong.
    let log = std::env::temp_dir().join(format!("fairvgpu-demo-{}.log", std::process::id()));
    println!(
        "config: {} (removed at the end); the daemon's log: {} (kept)",
        cfg_path.display(),
        log.display()
    );
    let child = Command::new(std::env::current_exe()?)
        .args(["serve", "--config"])
        .arg(&cfg_path)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        // Its own process group: a terminal's Ctrl-C reaches the demo only,
        // which stops the guests before the daemon.
        .process_group(0)
        .spawn()
        .context("starting the daemon")?;
    let mut daemon = Daemon {
        child,
        dir: dir.clone(),
    };
    for i in 1..=3 {
        wait_for_socket(&dir.join(format!("vm{i}.sock")), &mut daemon.child, &log)?;
    }
    let api = ApiTarget::Unix(dir.join("api.sock"));
    println!(
        "daemon up ({} executor): vm1, vm2, vm3 of tenant1..3 at weights 1:2:3, all on GPU 0",
        match executor {
            daemon::config::ExecutorKind::Sim => "sim",
            daemon::config::ExecutorKind::Cuda => "cuda",
        }
    );
    println!("dashboard: http://127.0.0.1:{port}/#token={token}   (open it while the demo runs)");
    dashboard_answers(port, &token)?;

    // The tenants: one process per vGPU, as a program in each VM would be.
    let ready = Arc::new(AtomicUsize::new(0));
    let mut tenants = Vec::new();
    let mut result = Ok(());
    for i in 1..=3 {
        let vm = format!("vm{i}");
        let sock = dir.join(format!("{vm}.sock"));
        // A bound on its own in case the demo dies without stopping it.
        match program.spawn(&vm, &sock, seconds + 120.0, i == 1, &ready) {
            Ok(t) => tenants.push(t),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let mut phases = Vec::new();
    if result.is_ok() {
        result = watch(&api, seconds, &ready, &mut tenants).map(|p| phases = p);
    }
    let mut tenant_errors = Vec::new();
    for t in &mut tenants {
        match t.stop(Duration::from_secs(10)) {
            Ok(st) if st.success() => {}
            Ok(st) => tenant_errors.push(format!("{}'s tenant ended {st}", t.name)),
            Err(e) => tenant_errors.push(format!("{}'s tenant: {e:#}", t.name)),
        }
    }
    drop(tenants);
    drop(daemon);
    result?;
    print_summary(&phases);
    if !tenant_errors.is_empty() {
        bail!("{}", tenant_errors.join("; "));
    }
    Ok(())
}

/// The dashboard's page and, with the token, its data, over TCP as a
/// browser gets them.
fn dashboard_answers(port: u16, token: &str) -> Result<()> {
    let addr = format!("127.0.0.1:{port}");
    let page = ApiTarget::Tcp {
        addr: addr.clone(),
        token: None,
    };
    let (code, body) = client_call(&page, "GET", "/", b"")?;
    ensure!(code == 200, "the dashboard answered HTTP {code}");
    let data = ApiTarget::Tcp {
        addr,
        token: Some(token.to_owned()),
    };
    let (code2, _) = client_call(&data, "GET", "/api/v1/status", b"")?;
    ensure!(code2 == 200, "the dashboard's data: HTTP {code2}");
    println!(
        "dashboard answered: page HTTP {code} ({} bytes), data HTTP {code2}",
        body.len()
    );
    Ok(())
}

fn pct(x: f64) -> String {
    format!("{:5.1}%", x * 100.0)
}

/// A phase of the run: its name, each tenant's entitlement, each one's
/// share of the GPU time charged in it.
type Phase = (String, Vec<f64>, Vec<f64>);

/// Prints the live shares each second and changes vm1's weight at 60% of
/// the run; the phases for the summary.
fn watch(
    api: &ApiTarget,
    seconds: f64,
    ready: &AtomicUsize,
    tenants: &mut [Tenant],
) -> Result<Vec<Phase>> {
    let t = Instant::now();
    while ready.load(Ordering::SeqCst) < 3 {
        for g in tenants.iter_mut() {
            g.check_running()?;
        }
        ensure!(
            t.elapsed() < Duration::from_secs(60),
            "the tenants did not start in time"
        );
        ensure!(!wire::signals::terminated(), "interrupted");
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "tenants running 2 ms kernels on vm1..vm3 for {seconds} s (Ctrl-C ends it); live shares over the last {} s:",
        daemon::control::WINDOW.as_secs()
    );
    let start = Instant::now();
    let now = || start.elapsed().as_secs_f64();
    let change_at = seconds * 0.6;
    let warm = 2.0_f64.min(change_at / 2.0);
    let (mut p1_start, mut p1_end, mut p2_start) = (None, None, None);
    let mut changed = false;
    let mut next = 1.0;
    while now() < seconds && !wire::signals::terminated() {
        for g in tenants.iter_mut() {
            g.check_running()?;
        }
        if p1_start.is_none() && now() >= warm {
            p1_start = Some(sample(api, now())?);
        }
        if !changed && now() >= change_at {
            p1_end = Some(sample(api, now())?);
            let body = serde_json::json!({ "weight": NEW_WEIGHT }).to_string();
            let (code, _) = client_call(api, "POST", "/api/v1/vgpus/vm1/weight", body.as_bytes())?;
            ensure!(code == 200, "set-weight: HTTP {code}");
            println!("  set-weight vm1 {NEW_WEIGHT} (as `fairvgpu set-weight vm1 {NEW_WEIGHT}` does): weights now 4:2:3");
            changed = true;
        }
        if changed && p2_start.is_none() && now() >= change_at + 1.0 {
            p2_start = Some(sample(api, now())?);
        }
        if now() >= next {
            let last = sample(api, now())?;
            let row: Vec<String> = (0..3)
                .map(|i| {
                    format!(
                        "vm{} {} (entitled {})",
                        i + 1,
                        pct(last.share[i]),
                        pct(last.entitlement[i])
                    )
                })
                .collect();
            println!(
                "  {:4.0} s  {}  MMR {:.3}",
                last.at,
                row.join("  "),
                last.mmr
            );
            next += 1.0;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let end = sample(api, now())?;
    let interrupted = wire::signals::terminated();
    if interrupted {
        println!("interrupted: stopping the tenants and the daemon");
    }
    // The summary: each phase's shares from the GPU time charged in it.
    let mut phases: Vec<Phase> = Vec::new();
    let w2 = [NEW_WEIGHT, WEIGHTS[1], WEIGHTS[2]];
    if let Some(a) = &p1_start {
        let b = p1_end.as_ref().unwrap_or(&end);
        phases.push((
            format!("1:2:3, {:.0}-{:.0} s", a.at, b.at),
            entitlements(&WEIGHTS),
            shares_between(a, b),
        ));
    }
    if let Some(a) = &p2_start {
        phases.push((
            format!("4:2:3, {:.0}-{:.0} s", a.at, end.at),
            entitlements(&w2),
            shares_between(a, &end),
        ));
    }
    Ok(phases)
}

/// The one-screen summary: entitlement against share per tenant and phase,
/// and each phase's MMR.
fn print_summary(phases: &[Phase]) {
    println!("\nsummary: each tenant's share of the GPU time charged in each phase");
    let mut head = format!("  {:<16}", "");
    for (name, _, _) in phases {
        head.push_str(&format!(" | {:<26}", format!("weights {name}")));
    }
    println!("{head}");
    let mut worst: f64 = 0.0;
    for i in 0..3 {
        let mut row = format!("  {:<16}", format!("vm{} (tenant{})", i + 1, i + 1));
        for (_, ent, got) in phases {
            row.push_str(&format!(" | entitled {} got {}", pct(ent[i]), pct(got[i])));
            worst = worst.max((got[i] - ent[i]).abs());
        }
        println!("{row}");
    }
    let mut row = format!("  {:<16}", "MMR");
    for (_, ent, got) in phases {
        row.push_str(&format!(" | {:<26.3}", mmr(got, ent)));
    }
    println!("{row}");
    if !phases.is_empty() {
        println!(
            "demo: shares within {:.1} points of entitlement ({})",
            worst * 100.0,
            if worst <= 0.05 {
                "within 5"
            } else {
                "NOT within 5: a busy machine?"
            }
        );
    }
}
