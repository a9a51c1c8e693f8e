//! `fairvgpu bench recovery`: a guest's kernel reads out of bounds on a
//! real daemon (two VMs on one GPU) while the other VM's guest runs vector
//! adds checked element by element. The fault poisons the faulting
//! process's worker, which ends: that process is told `VgpuReset`, a
//! process of the same VM holding memory beside it computes on, and the
//! VM's next process computes on a new worker. Then a process's worker is
//! killed outright. Reports how long the VM took to compute again after
//! each, and whether anything else (the bystander, the other VM's guest)
//! ever saw an error or a wrong result.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use guest::{Gpu, GuestError};
use protocol::{Dim3, ImageKind};
use transport::SpinPolicy;

use super::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;

const N: u32 = 1 << 16;
const SPIN: SpinPolicy = SpinPolicy {
    spins: 2_000,
    max_block_us: 2_000,
};

/// What one run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The error the faulting guest got for its kernel.
    pub fault: String,
    /// Whether the faulting process, and then the one whose worker was
    /// killed, were told `VgpuReset`.
    pub reset_seen: bool,
    /// Whether the faulting process's bystander in its VM computed on
    /// (its memory intact) after the fault.
    pub bystander_ok: bool,
    /// From the fault reported to the VM computing correctly again, ms.
    pub poison_recovery_ms: f64,
    /// From SIGKILL of the worker to the VM computing correctly again, ms.
    pub kill_recovery_ms: f64,
    /// Vector adds the other VM's guest completed (all checked).
    pub other_rounds: u64,
    /// Of them, from each fault to its VM computing again.
    pub other_rounds_during_faults: u64,
    /// Errors or wrong results the other VM's guest saw (must be 0).
    pub other_errors: u64,
    /// The first of them, if any.
    pub other_first_error: Option<String>,
    /// Workers that ended by a fault, of the faulting VM (2 expected) and
    /// of the other (0).
    pub faults: (u64, u64),
    /// Device memory still allocated to the faulting VM at the end.
    pub leaked_bytes: u64,
    /// The daemon's log, when [`measure`] was asked to keep it.
    pub daemon_log: Option<String>,
}

fn grid() -> (Dim3, Dim3) {
    (
        Dim3 {
            x: N / 256,
            y: 1,
            z: 1,
        },
        Dim3 { x: 256, y: 1, z: 1 },
    )
}

/// Launches a vector add that reads nobody's memory (the kernel faults,
/// reported at the next synchronizing call).
pub(crate) fn launch_out_of_bounds(gpu: &mut Gpu) -> Result<(), GuestError> {
    let m = gpu.module_load(ImageKind::Ptx, worker::KERNELS_PTX.as_bytes())?;
    let f = gpu.get_function(m, "vector_add")?;
    let own = gpu.mem_alloc(u64::from(N) * 4)?;
    let (g, blk) = grid();
    let wild = 0x10u64;
    let o = own.to_le_bytes();
    gpu.launch(
        &f,
        g,
        blk,
        0,
        0,
        &[&wild.to_le_bytes(), &o, &o, &N.to_le_bytes()],
    )
}

/// One vector add of `N` elements, checked element by element.
pub fn vector_add(gpu: &mut Gpu, seed: f32) -> Result<(), GuestError> {
    let m = gpu.module_load(ImageKind::Ptx, worker::KERNELS_PTX.as_bytes())?;
    let f = gpu.get_function(m, "vector_add")?;
    let a: Vec<f32> = (0..N).map(|i| (i % 1000) as f32 + seed).collect();
    let b: Vec<f32> = (0..N).map(|i| 2.0 * (i % 777) as f32).collect();
    let bytes = u64::from(N) * 4;
    let (da, db, dc) = (
        gpu.mem_alloc(bytes)?,
        gpu.mem_alloc(bytes)?,
        gpu.mem_alloc(bytes)?,
    );
    let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    gpu.memcpy_htod(da, &le(&a))?;
    gpu.memcpy_htod(db, &le(&b))?;
    let (g, blk) = grid();
    gpu.launch(
        &f,
        g,
        blk,
        0,
        0,
        &[
            &da.to_le_bytes(),
            &db.to_le_bytes(),
            &dc.to_le_bytes(),
            &N.to_le_bytes(),
        ],
    )?;
    let mut out = vec![0u8; bytes as usize];
    gpu.memcpy_dtoh(&mut out, dc, 0)?;
    for (i, c) in out.chunks_exact(4).enumerate() {
        let got = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        if got != a[i] + b[i] {
            return Err(GuestError::Protocol(format!(
                "element {i}: {got} != {}",
                a[i] + b[i]
            )));
        }
    }
    for p in [da, db, dc] {
        gpu.mem_free(p)?;
    }
    gpu.module_unload(m)?;
    Ok(())
}

fn open(sock: &Path) -> Result<Gpu> {
    Gpu::connect_with(sock, SPIN).with_context(|| format!("attaching to {}", sock.display()))
}

/// Opens the VM's GPU until a vector add succeeds; returns when it did.
pub(crate) fn until_working(sock: &Path, timeout: Duration) -> Result<Gpu> {
    let t = Instant::now();
    loop {
        if let Ok(mut g) = open(sock) {
            if vector_add(&mut g, 3.0).is_ok() {
                return Ok(g);
            }
        }
        if t.elapsed() > timeout {
            bail!("the VM did not recover in {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs the scenario against `bin serve` with `executor`; with `log_level`
/// the daemon logs at that level into [`Report::daemon_log`] instead of our
/// standard error.
pub fn measure(bin: &Path, executor: ExecutorKind, log_level: Option<&str>) -> Result<Report> {
    let vms: Vec<VmSpec> = ["vm1", "vm2"]
        .iter()
        .map(|n| VmSpec::new(n, 1024))
        .collect();
    let d = match log_level {
        Some(level) => DaemonProc::start_logged(bin, "recovery", executor, &vms, level)?,
        None => DaemonProc::start(bin, "recovery", executor, &vms)?,
    };
    let (vm1, vm2): (PathBuf, PathBuf) = (d.socket("vm1"), d.socket("vm2"));
    let mut rep = Report::default();

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();
    let other = {
        let (stop, rounds, errors, first) = (
            stop.clone(),
            rounds.clone(),
            errors.clone(),
            first_error.clone(),
        );
        let mut gpu = open(&vm2)?;
        std::thread::spawn(move || {
            let mut seed = 0.0;
            while !stop.load(Ordering::Relaxed) {
                match vector_add(&mut gpu, seed) {
                    Ok(()) => {
                        rounds.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        first
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(e.to_string());
                    }
                }
                seed += 1.0;
            }
        })
    };
    // Both VMs are running before the fault.
    let mut warm = open(&vm1)?;
    vector_add(&mut warm, 1.0)?;
    drop(warm);
    while rounds.load(Ordering::Relaxed) < 3 {
        std::thread::sleep(Duration::from_millis(10));
    }

    // 1. The fault. A bystander process of the same VM holds memory.
    let mut bystander = open(&vm1)?;
    let held = bystander.mem_alloc(1 << 20)?;
    let mut bad = open(&vm1)?;
    launch_out_of_bounds(&mut bad)?;
    let before = rounds.load(Ordering::Relaxed);
    let fault = bad.synchronize();
    let t0 = Instant::now();
    rep.fault = match &fault {
        Err(GuestError::Cuda(s)) => format!("{s:?}"),
        other => format!("{other:?}"),
    };
    if !matches!(fault, Err(GuestError::Cuda(s)) if s.is_sticky()) {
        bail!("the out-of-bounds kernel did not fault: {}", rep.fault);
    }
    // The faulting process's worker ended.
    d.wait_worker_faults("vm1", 1, Duration::from_secs(60))?;
    rep.reset_seen = matches!(bad.mem_alloc(16), Err(GuestError::VgpuReset));
    drop(bad);
    let mut again = until_working(&vm1, Duration::from_secs(60))?;
    rep.poison_recovery_ms = t0.elapsed().as_secs_f64() * 1e3;
    // The status lists the workers of both of vm1's processes (it may lag
    // the binding of the new one), so that "one" below is the new one's.
    d.wait("vm1's two workers listed", Duration::from_secs(20), |d| {
        d.worker_pids("vm1").len() == 2
    })?;
    let mut during = rounds.load(Ordering::Relaxed) - before;
    // The bystander's memory and context are its own: it computes on.
    let mut back = [0u8; 16];
    rep.bystander_ok = bystander.memcpy_htod(held, &[7; 16]).is_ok()
        && bystander.memcpy_dtoh(&mut back, held, 0).is_ok()
        && back == [7; 16]
        && vector_add(&mut bystander, 4.0).is_ok();
    drop(bystander);

    // 2. A process's worker is killed outright while it holds memory: the
    // one left of vm1's, once the bystander's has ended with it.
    let _held = again.mem_alloc(1 << 20)?;
    d.wait("vm1 down to one worker", Duration::from_secs(20), |d| {
        d.worker_pids("vm1").len() == 1
    })?;
    let pid = d.worker_pids("vm1")[0];
    let before = rounds.load(Ordering::Relaxed);
    let t1 = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    // The killed worker's end noted.
    d.wait_worker_faults("vm1", 2, Duration::from_secs(60))?;
    if !matches!(again.mem_alloc(16), Err(GuestError::VgpuReset)) {
        rep.reset_seen = false;
    }
    drop(again);
    let fresh = until_working(&vm1, Duration::from_secs(60))?;
    rep.kill_recovery_ms = t1.elapsed().as_secs_f64() * 1e3;
    during += rounds.load(Ordering::Relaxed) - before;
    drop(fresh);

    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let _ = other.join();
    rep.other_rounds = rounds.load(Ordering::Relaxed);
    rep.other_rounds_during_faults = during;
    rep.other_errors = errors.load(Ordering::Relaxed);
    rep.other_first_error = first_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let (v1, v2) = (d.vgpu("vm1")?, d.vgpu("vm2")?);
    rep.faults = (
        v1["worker_faults"].as_u64().unwrap_or(0),
        v2["worker_faults"].as_u64().unwrap_or(0),
    );
    // Reports reach the status every 200 ms: wait for the last frees.
    let _ = d.wait("vm1's memory freed", Duration::from_secs(10), |d| {
        d.vgpu("vm1")
            .is_ok_and(|v| v["memory_used_bytes"].as_u64() == Some(0))
    });
    rep.leaked_bytes = d.vgpu("vm1")?["memory_used_bytes"].as_u64().unwrap_or(0);
    if log_level.is_some() {
        rep.daemon_log = Some(std::fs::read_to_string(d.log_path())?);
    }
    Ok(rep)
}

/// `fairvgpu bench recovery`: prints the report; fails if the other VM was
/// disturbed or the faulting one did not recover.
pub fn run(executor: ExecutorKind) -> Result<()> {
    let bin = std::env::current_exe()?;
    println!(
        "recovery ({executor:?} executor): a process of vm1 reads out of bounds beside another holding memory, later a vm1 process's worker is killed; vm2's guest runs checked vector adds of {N} elements throughout"
    );
    let r = measure(&bin, executor, None)?;
    println!("fault reported to the guest:       {}", r.fault);
    println!("VgpuReset seen by vm1's process:   {}", r.reset_seen);
    println!("vm1's bystander computed on:       {}", r.bystander_ok);
    println!(
        "vm1 computing again after fault:   {:.0} ms",
        r.poison_recovery_ms
    );
    println!(
        "vm1 computing again after kill:    {:.0} ms",
        r.kill_recovery_ms
    );
    println!(
        "vm2 vector adds (during faults):   {} ({})",
        r.other_rounds, r.other_rounds_during_faults
    );
    if let Some(e) = &r.other_first_error {
        println!("vm2's first error:                 {e}");
    }
    println!(
        "fault={} reset_seen={} bystander_ok={} poison_recovery_ms={:.0} kill_recovery_ms={:.0} other_rounds={} other_errors={} vm1_worker_faults={} vm2_worker_faults={} leaked_bytes={}",
        r.fault,
        r.reset_seen,
        r.bystander_ok,
        r.poison_recovery_ms,
        r.kill_recovery_ms,
        r.other_rounds,
        r.other_errors,
        r.faults.0,
        r.faults.1,
        r.leaked_bytes
    );
    if r.other_errors > 0
        || !r.reset_seen
        || !r.bystander_ok
        || r.faults != (2, 0)
        || r.leaked_bytes != 0
    {
        bail!("recovery check failed");
    }
    Ok(())
}
