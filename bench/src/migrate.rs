//! `fairvgpu bench migrate --executor cuda|sim`: a running guest moved
//! between two GPUs of a real daemon.
//!
//! The guest holds `gib` GiB of device memory (256 MiB allocations, each
//! filled with its own byte), plus a linked list whose nodes point across
//! allocations, and keeps launching a kernel that walks the list. The bench
//! moves the vGPU GPU 0 -> 1 -> 0 through the API while it runs, then the
//! guest checks the list's sum (every launch counted once) and a sample of
//! every allocation. Reported per move: the pause (the worker serves no
//! request from the moment it starts the move until the vGPU runs on the
//! target: the time from the last work on the source to the first on the
//! target) and the copy rate (bytes moved over the pause), against the
//! peer-to-peer copy bandwidth measured in the same run.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use guest::Gpu;
use protocol::{Dim3, ImageKind};
use serde_json::Value;
use transport::SpinPolicy;

use super::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use daemon::control::{client_call, ApiTarget};

const CHUNK: u64 = 256 << 20;
const NODES: u32 = 4096;
const SPIN: SpinPolicy = SpinPolicy {
    spins: 20_000,
    max_block_us: 2_000,
};

/// One move as measured.
#[derive(Debug, Clone, Copy)]
pub struct MoveResult {
    /// Target GPU.
    pub to: u32,
    /// Pause, ms.
    pub pause_ms: f64,
    /// Bytes copied.
    pub bytes: u64,
}

/// Runs the scenario with `gib` GiB; returns the moves and the number of
/// list walks the guest launched.
pub fn measure(bin: &Path, executor: ExecutorKind, gib: u64) -> Result<(Vec<MoveResult>, u64)> {
    let limit_mib = gib * 1024 + 1024;
    let vms = [VmSpec::new("mover", limit_mib)];
    let extra = format!(
        "\n[sim]\ngpus = 2\nmemory = {}\n\n[placement]\nenabled = false\n",
        (limit_mib + 1024) << 20
    );
    let extra = if executor == ExecutorKind::Sim {
        extra
    } else {
        "\n[placement]\nenabled = false\n".to_owned()
    };
    let d = DaemonProc::start_with(bin, "migrate", executor, &vms, &extra)?;
    let mut gpu = Gpu::connect_with(&d.socket("mover"), SPIN).context("guest attaches")?;
    let m = gpu.module_load(ImageKind::Ptx, worker::KERNELS_PTX.as_bytes())?;
    let inc = gpu.get_function(m, "list_inc")?;
    let sum = gpu.get_function(m, "list_sum")?;
    // The memory: `gib` GiB in 256 MiB allocations, each set to its own byte.
    let chunks: Vec<u64> = (0..gib * 4)
        .map(|_| gpu.mem_alloc(CHUNK))
        .collect::<Result<_, _>>()?;
    for (i, &c) in chunks.iter().enumerate() {
        gpu.memset_async(c, (i as u32 % 250) + 1, 1, CHUNK, 0)?;
    }
    // The list: its nodes spread over 16 small allocations, each node
    // pointing into another one.
    let blocks: Vec<u64> = (0..16)
        .map(|_| gpu.mem_alloc(u64::from(NODES / 16) * 16))
        .collect::<Result<_, _>>()?;
    let addr = |k: u32| blocks[(k % 16) as usize] + u64::from(k / 16) * 16;
    let mut images = vec![vec![0u8; (NODES / 16) as usize * 16]; 16];
    for k in 0..NODES {
        let next = if k + 1 < NODES { addr(k + 1) } else { 0 };
        let img = &mut images[(k % 16) as usize];
        let off = (k / 16) as usize * 16;
        img[off..off + 8].copy_from_slice(&next.to_le_bytes());
        img[off + 8..off + 12].copy_from_slice(&((k % 100) as f32).to_le_bytes());
    }
    for (b, img) in blocks.iter().zip(&images) {
        gpu.memcpy_htod(*b, img)?;
    }
    gpu.synchronize()?;
    let (head, out) = (addr(0), gpu.mem_alloc(4)?);
    let one = Dim3 { x: 1, y: 1, z: 1 };

    // Moves from another thread while the guest keeps launching.
    let launched = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mover = {
        let (launched, done, dir) = (launched.clone(), done.clone(), d.dir.clone());
        std::thread::spawn(move || -> Result<Vec<MoveResult>> {
            let api = ApiTarget::Unix(dir.join("api.sock"));
            let mut moves = Vec::new();
            for (i, to) in [1u32, 0].into_iter().enumerate() {
                while launched.load(Ordering::Relaxed) < 50 * (i as u64 + 1) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let (code, body) = client_call(
                    &api,
                    "POST",
                    "/api/v1/vgpus/mover/migrate",
                    format!("{{\"gpu\": {to}}}").as_bytes(),
                )?;
                let v: Value = serde_json::from_slice(&body)?;
                if code != 200 {
                    done.store(true, Ordering::Relaxed);
                    bail!("migration to GPU {to} refused ({code}): {v}");
                }
                moves.push(MoveResult {
                    to,
                    pause_ms: v["pause_ms"].as_f64().unwrap_or(0.0),
                    bytes: v["copied_bytes"].as_u64().unwrap_or(0),
                });
            }
            done.store(true, Ordering::Relaxed);
            Ok(moves)
        })
    };
    let mut k = 0u64;
    let t = Instant::now();
    while !done.load(Ordering::Relaxed) || k < 150 {
        gpu.launch(
            &inc,
            one,
            one,
            0,
            0,
            &[&head.to_le_bytes(), &NODES.to_le_bytes()],
        )?;
        k += 1;
        launched.store(k, Ordering::Relaxed);
        if k.is_multiple_of(8) {
            gpu.synchronize()?;
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!("the moves did not finish");
        }
    }
    let moves = mover
        .join()
        .map_err(|_| anyhow::anyhow!("mover panicked"))??;
    // The list: every launch counted once, wherever it ran.
    gpu.launch(
        &sum,
        one,
        one,
        0,
        0,
        &[
            &head.to_le_bytes(),
            &out.to_le_bytes(),
            &NODES.to_le_bytes(),
        ],
    )?;
    let mut four = [0u8; 4];
    gpu.memcpy_dtoh(&mut four, out, 0)?;
    let want: f64 =
        (0..NODES).map(|k| f64::from(k % 100)).sum::<f64>() + k as f64 * f64::from(NODES);
    let got = f64::from(f32::from_le_bytes(four));
    if got != want {
        bail!("list sum {got} after {k} launches, expected {want}");
    }
    // The memory: the first, a middle and the last MiB of every allocation.
    let mut buf = vec![0u8; 1 << 20];
    for (i, &c) in chunks.iter().enumerate() {
        let byte = (i as u32 % 250 + 1) as u8;
        for off in [0, CHUNK / 2, CHUNK - (1 << 20)] {
            gpu.memcpy_dtoh(&mut buf, c + off, 0)?;
            if buf.iter().any(|&b| b != byte) {
                bail!("allocation {i} at {off}: contents changed");
            }
        }
    }
    Ok((moves, k))
}

/// Prints the moves for 1 GiB and 8 GiB (or `sizes`) and the summary.
pub fn run(executor: ExecutorKind, sizes: &[u64]) -> Result<()> {
    let bin = std::env::current_exe()?;
    let peer = match executor {
        ExecutorKind::Cuda => worker::executor::cuda::peer_bandwidth(0, 1, 1 << 30)
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        ExecutorKind::Sim => worker::executor::sim::SimParams::default().copy_gbps,
    };
    println!(
        "migrate ({executor:?} executor): a running guest moved GPU 0 -> 1 -> 0; peer copy {peer:.1} GB/s (same run)"
    );
    println!(
        "{:>6} {:>6} {:>10} {:>12} {:>10}",
        "GiB", "to", "pause ms", "copied GiB", "GB/s"
    );
    let mut worst_1g = 0.0f64;
    let mut rates = Vec::new();
    for &gib in sizes {
        let (moves, launches) = measure(&bin, executor, gib)?;
        for m in &moves {
            let rate = m.bytes as f64 / (m.pause_ms / 1e3).max(1e-9) / 1e9;
            println!(
                "{gib:>6} {:>6} {:>10.1} {:>12.2} {:>10.1}",
                m.to,
                m.pause_ms,
                m.bytes as f64 / f64::from(1u32 << 30),
                rate
            );
            if gib == 1 {
                worst_1g = worst_1g.max(m.pause_ms);
            }
            rates.push(rate);
        }
        println!("       ({gib} GiB: {launches} list walks checked, every allocation checked)");
    }
    let best_rate = rates.iter().copied().fold(0.0, f64::max);
    println!(
        "pause_1gib_ms_max={worst_1g:.1} copy_rate_gbps_max={best_rate:.1} peer_gbps={peer:.1} results_checked=true"
    );
    Ok(())
}
