//! `fairvgpu bench scale`: the host side at cloud density. A daemon
//! (`fairvgpu serve`, as an operator runs it) serves N VMs spread over G
//! GPUs, in three phases of the same length:
//!
//! 1. *empty*: no guest attached (the daemon runs only a spare worker per
//!    GPU);
//! 2. *idle*: each VM's guest attached (a worker of its own, a module
//!    loaded, 12 MiB allocated) and doing nothing, as most VMs of a cloud
//!    do most of the time;
//! 3. *busy*: every guest running the latency-bound loop of the density
//!    scenario (a kernel, a synchronous copy back, checked).
//!
//! Per phase: the CPU of the daemon and of all workers (per cent of one
//! CPU, from `/proc`), their memory (resident set), and busy, the daemon's
//! CPU per grant it sent. On the cuda executor each worker's GPU memory
//! comes from `nvidia-smi` while the guests idle.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use daemon::config::ExecutorKind;
use guest::Gpu;
use protocol::ImageKind;
use worker::KERNELS_PTX;

use super::density::latency_loop;
use super::fixture::{DaemonProc, VmSpec};
use super::procfs::{children, proc_use, threads_cpu_ns, ProcUse};

/// What the scale bench is run with.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub kind: ExecutorKind,
    pub vms: usize,
    pub gpus: u32,
    /// Seconds per phase.
    pub secs: f64,
}

/// The daemon and its workers, sampled together.
struct Sample {
    at: Instant,
    daemon: ProcUse,
    workers: Vec<ProcUse>,
    /// The daemon's grant services' threads' CPU time, ns.
    service_ns: u64,
    grants: u64,
}

/// The daemon under test and what is sampled of it.
struct Daemon(DaemonProc);

impl Daemon {
    fn start(o: &Options) -> Result<Daemon> {
        let vms: Vec<VmSpec> = (0..o.vms)
            .map(|i| VmSpec {
                gpu: Some(i as u32 % o.gpus),
                ..VmSpec::new(&format!("vm{i}"), 256)
            })
            .collect();
        let extra = format!(
            "\n[sim]\ngpus = {}\n\n[placement]\nenabled = false\n",
            o.gpus
        );
        let d = DaemonProc::start_with(&std::env::current_exe()?, "scale", o.kind, &vms, &extra)?;
        Ok(Daemon(d))
    }

    fn sock(&self, vm: usize) -> PathBuf {
        self.0.socket(&format!("vm{vm}"))
    }

    /// Grants sent to all vGPUs so far, from the daemon's status.
    fn grants(&self) -> Result<u64> {
        Ok(self
            .0
            .vgpus()?
            .iter()
            .filter_map(|u| u["grants"].as_u64())
            .sum())
    }

    /// Waits until the workers have set up (a CUDA worker makes its
    /// contexts ahead, some seconds of CPU): their CPU together under 5%
    /// of a CPU over a second, 60 s at most; how long it took.
    fn settle(&self) -> Result<f64> {
        let t = Instant::now();
        let mut a = self.sample()?;
        while t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_secs(1));
            let b = self.sample()?;
            let sum = |s: &Sample| s.workers.iter().map(|w| w.cpu_ns).sum::<u64>();
            if (sum(&b).saturating_sub(sum(&a)) as f64) < 0.05e9 {
                break;
            }
            a = b;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    fn sample(&self) -> Result<Sample> {
        let pid = self.0.pid();
        Ok(Sample {
            at: Instant::now(),
            daemon: proc_use(pid),
            workers: children(pid).into_iter().map(proc_use).collect(),
            service_ns: threads_cpu_ns(pid, "grant-service"),
            grants: self.grants()?,
        })
    }
}

/// What a phase cost: CPU per cent of one CPU of the daemon and of all
/// workers, their memory, and the grants sent.
fn report(phase: &str, a: &Sample, b: &Sample) -> (f64, f64, f64) {
    let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-9);
    let sum = |s: &Sample| s.workers.iter().map(|w| w.cpu_ns).sum::<u64>();
    let daemon_pct = b.daemon.cpu_ns.saturating_sub(a.daemon.cpu_ns) as f64 / 1e9 / secs * 100.0;
    let workers_pct = sum(b).saturating_sub(sum(a)) as f64 / 1e9 / secs * 100.0;
    let rss: Vec<u64> = b.workers.iter().map(|w| w.rss).collect();
    let mean_rss = rss.iter().sum::<u64>() as f64 / rss.len().max(1) as f64;
    let grants = b.grants.saturating_sub(a.grants);
    println!(
        "{phase}: daemon {daemon_pct:.2}% of a CPU, {:.1} MiB; {} workers {workers_pct:.2}% of a CPU together ({:.3}% each), {:.1} MiB each (max {:.1}); grants {grants} ({:.0}/s)",
        b.daemon.rss as f64 / 1048576.0,
        b.workers.len(),
        workers_pct / b.workers.len().max(1) as f64,
        mean_rss / 1048576.0,
        rss.iter().max().copied().unwrap_or(0) as f64 / 1048576.0,
        grants as f64 / secs,
    );
    (daemon_pct, workers_pct, mean_rss)
}

/// Each worker's GPU memory (MiB) by `nvidia-smi`, where it runs.
fn worker_gpu_mib(workers: &[u32]) -> Option<Vec<u64>> {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut mib = Vec::new();
    for line in text.lines() {
        let mut f = line.split(',').map(str::trim);
        let (Some(pid), Some(m)) = (f.next(), f.next()) else {
            continue;
        };
        if pid.parse::<u32>().is_ok_and(|p| workers.contains(&p)) {
            mib.push(m.parse().ok()?);
        }
    }
    Some(mib)
}

pub fn run(o: Options) -> Result<()> {
    ensure!(
        o.vms > 0 && o.gpus > 0,
        "--vms and --gpus must be at least 1"
    );
    println!(
        "scale ({:?} executor): {} VMs over {} GPUs, equal weights, {} s a phase",
        o.kind, o.vms, o.gpus, o.secs
    );
    let t = Instant::now();
    let d = Daemon::start(&o)?;
    println!(
        "daemon up with {} VMs in {:.1} s",
        o.vms,
        t.elapsed().as_secs_f64()
    );
    let settled = d.settle()?;
    println!(
        "workers settled (their CPU under 5% of a CPU together over a second) after {settled:.1} s"
    );
    let phase = Duration::from_secs_f64(o.secs);
    let s0 = d.sample()?;
    std::thread::sleep(phase);
    let s1 = d.sample()?;
    report("empty (no guest attached)", &s0, &s1);

    // The guests: attached, a module loaded and 12 MiB allocated, then idle
    // until told to run.
    let attached = Arc::new(Barrier::new(o.vms + 1));
    let go = Arc::new(Barrier::new(o.vms + 1));
    let end = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let body = latency_loop(o.kind);
    let guests: Vec<_> = (0..o.vms)
        .map(|g| {
            let (sock, attached, go, end, body) = (
                d.sock(g),
                attached.clone(),
                go.clone(),
                end.clone(),
                body.clone(),
            );
            std::thread::Builder::new()
                .name(format!("guest-{g}"))
                .spawn(move || -> Result<u64> {
                    // Both waits are passed whatever fails: the others
                    // (and the bench) wait on them.
                    let r = guest_attach(&sock);
                    attached.wait();
                    go.wait();
                    let (mut gpu, f) = r?;
                    let until = end
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .unwrap_or_else(Instant::now);
                    body(g, &mut gpu, &f, until)
                })
                .context("starting a guest thread")
        })
        .collect::<Result<_>>()?;
    attached.wait();
    // The workers' quiet sleeps begin a second after their last call.
    std::thread::sleep(Duration::from_secs(2));
    let s2 = d.sample()?;
    std::thread::sleep(phase);
    let s3 = d.sample()?;
    let (daemon_idle, workers_idle, _) = report("idle (guests attached, no calls)", &s2, &s3);
    let pids = children(d.0.pid());
    let gpu_mib = match o.kind {
        ExecutorKind::Cuda => worker_gpu_mib(&pids),
        ExecutorKind::Sim => None,
    };
    if let Some(m) = &gpu_mib {
        println!(
            "GPU memory of each idle worker (nvidia-smi): mean {:.0} MiB, max {} MiB, over {} workers",
            m.iter().sum::<u64>() as f64 / m.len().max(1) as f64,
            m.iter().max().copied().unwrap_or(0),
            m.len()
        );
    }

    if let Ok(mut e) = end.lock() {
        *e = Some(Instant::now() + phase + Duration::from_millis(200));
    }
    let s4 = d.sample()?;
    go.wait();
    let mut rounds = 0u64;
    let mut failed = Vec::new();
    for (g, h) in guests.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(n)) => rounds += n,
            Ok(Err(e)) => failed.push(format!("guest {g}: {e:#}")),
            Err(_) => failed.push(format!("guest {g} panicked")),
        }
    }
    let s5 = d.sample()?;
    ensure!(failed.is_empty(), "{}", failed.join("; "));
    let (daemon_busy, _, _) = report("busy (every guest in the loop)", &s4, &s5);
    let secs = s5.at.duration_since(s4.at).as_secs_f64();
    let grants = s5.grants.saturating_sub(s4.grants).max(1);
    let per_grant_us = daemon_busy / 100.0 * secs * 1e6 / grants as f64;
    let service_us = s5.service_ns.saturating_sub(s4.service_ns) as f64 / 1e3 / grants as f64;
    println!(
        "grant services: {:.2}% of a CPU busy ({service_us:.1} us a grant, with the charges and idle notes between), {:.2}% idle",
        s5.service_ns.saturating_sub(s4.service_ns) as f64 / 1e7 / secs,
        s3.service_ns.saturating_sub(s2.service_ns) as f64 / 1e7 / s3.at.duration_since(s2.at).as_secs_f64(),
    );
    println!(
        "vms={} gpus={} rounds_per_s={:.0} service_cpu_us_per_grant={service_us:.1} daemon_cpu_us_per_grant={per_grant_us:.1} idle_daemon_cpu_pct={daemon_idle:.2} idle_worker_cpu_pct_each={:.3} daemon_rss_mib={:.1} worker_rss_mib={:.1} worker_gpu_mib={}",
        o.vms,
        o.gpus,
        rounds as f64 / secs,
        workers_idle / s3.workers.len().max(1) as f64,
        s3.daemon.rss as f64 / 1048576.0,
        s3.workers.iter().map(|w| w.rss).sum::<u64>() as f64 / s3.workers.len().max(1) as f64 / 1048576.0,
        gpu_mib.map_or("n/a".into(), |m| format!(
            "{:.0}",
            m.iter().sum::<u64>() as f64 / m.len().max(1) as f64
        )),
    );
    Ok(())
}

/// A guest attached to its vGPU, with the bench's module loaded and
/// 12 MiB of device memory in use; the module's spin kernel.
fn guest_attach(sock: &Path) -> Result<(Gpu, guest::Function)> {
    let mut gpu = Gpu::connect_with(sock, super::density::SPIN).context("guest attach")?;
    for _ in 0..3 {
        gpu.mem_alloc(4 << 20)?;
    }
    let m = gpu.module_load(ImageKind::Ptx, KERNELS_PTX.as_bytes())?;
    let f = gpu.get_function(m, "spin_ns")?;
    Ok((gpu, f))
}
