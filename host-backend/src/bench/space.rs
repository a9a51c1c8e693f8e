//! `fairvgpu bench space --executor E`: four guests of small kernels (8
//! blocks, a few of the GPU's SMs each) at weights 1:1:2:4 on one GPU,
//! through a real daemon, time-sliced against co-running (`[[gpu]] mps =
//! true`, every VM `corun = true`; on a GPU the workers are then clients of
//! the daemon's MPS control daemon).
//!
//! Each guest's throughput is normalized by its rate alone on the GPU
//! (measured first, in the same run); the aggregate is their sum (1.0:
//! the GPU passed from one to the next with nothing lost). Time-sliced,
//! the weights decide: the MMR of normalized throughput over weight share.
//! Co-running, every guest whose kernels fit beside the others' runs at
//! its own speed: their smallest normalized throughput says how close.
//! On the sim each worker process runs its own model of the GPU, so what
//! keeps vGPUs apart there is the grant alone: co-running grants let every
//! guest run at once, as MPS would if nothing they share (SMs, memory
//! bandwidth, caches) slowed them. The sim's figure is that upper bound and
//! a test of the plumbing (grants, charges, opt-in), not evidence; the GPU's
//! is `scripts/gpu/space.sh`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use guest_frontend::Gpu;
use protocol::{Dim3, ImageKind};

use super::fixture::{DaemonProc, VmSpec};
use crate::config::ExecutorKind;

const WEIGHTS: [f64; 4] = [1.0, 1.0, 2.0, 4.0];
/// Blocks of each kernel: 8 of an H100's 132 SMs.
const BLOCKS: u32 = 8;
/// Each kernel's time, ns.
const KERNEL_NS: u64 = 1_000_000;

/// One guest: kernels of `BLOCKS` blocks of `KERNEL_NS`, eight per
/// synchronize, until `stop`; how many ran.
fn guest(socket: &Path, stop: &AtomicBool, go: Instant) -> Result<u64> {
    let mut gpu = Gpu::connect(socket).context("attaching")?;
    let m = gpu.module_load(ImageKind::Ptx, crate::demo::KERNELS_PTX.as_bytes())?;
    let f = gpu.get_function(m, "spin_blocks")?;
    let out = gpu.mem_alloc(u64::from(BLOCKS) * 4)?;
    let (grid, block) = (
        Dim3 {
            x: BLOCKS,
            y: 1,
            z: 1,
        },
        Dim3 { x: 1, y: 1, z: 1 },
    );
    let (o, ns) = (out.to_le_bytes(), KERNEL_NS.to_le_bytes());
    while Instant::now() < go {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..8 {
            gpu.launch(&f, grid, block, 0, 0, &[&o, &ns])?;
        }
        gpu.synchronize()?;
        n += 8;
    }
    Ok(n)
}

/// Kernels per second of each guest of `vms`, all running `secs` at once.
fn rates(
    bin: &Path,
    executor: ExecutorKind,
    vms: &[VmSpec],
    mps: bool,
    secs: f64,
) -> Result<Vec<f64>> {
    let extra = if mps {
        "\n[[gpu]]\nindex = 0\nmps = true\n"
    } else {
        ""
    };
    let d = DaemonProc::start_with(bin, "space", executor, vms, extra)?;
    let stop = Arc::new(AtomicBool::new(false));
    let go = Instant::now() + Duration::from_millis(500);
    let threads: Vec<_> = vms
        .iter()
        .map(|v| {
            let (socket, stop) = (d.socket(&v.name), stop.clone());
            std::thread::spawn(move || guest(&socket, &stop, go))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500) + Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    threads
        .into_iter()
        .map(|t| {
            let n = t
                .join()
                .map_err(|_| anyhow::anyhow!("a guest panicked"))??;
            Ok(n as f64 / secs)
        })
        .collect()
}

fn vms(corun: bool) -> Vec<VmSpec> {
    WEIGHTS
        .iter()
        .enumerate()
        .map(|(i, &w)| VmSpec {
            weight: w,
            corun,
            ..VmSpec::new(&format!("g{i}"), 1024)
        })
        .collect()
}

/// Runs the bench; the last line is machine-readable.
pub fn run(executor: ExecutorKind, secs: f64) -> Result<()> {
    let bin = std::env::current_exe()?;
    println!(
        "space ({executor:?} executor): 4 guests of {BLOCKS}-block {} ms kernels at weights 1:1:2:4, {secs} s per phase",
        KERNEL_NS / 1_000_000
    );
    let alone = rates(&bin, executor, &vms(false)[..1], false, secs)?[0];
    println!("alone: {alone:.1} kernels/s");
    let wsum: f64 = WEIGHTS.iter().sum();
    let mut agg = [0.0; 2];
    let mut figure = [0.0; 2];
    for (k, (name, corun)) in [("time-sliced", false), ("co-running", true)]
        .iter()
        .enumerate()
    {
        let r = rates(&bin, executor, &vms(*corun), *corun, secs)?;
        let n: Vec<f64> = r.iter().map(|x| x / alone).collect();
        agg[k] = n.iter().sum();
        let x: Vec<f64> = n.iter().zip(WEIGHTS).map(|(n, w)| n / (w / wsum)).collect();
        figure[k] = if *corun {
            n.iter().cloned().fold(f64::INFINITY, f64::min)
        } else {
            scheduler::mmr(&x)
        };
        println!(
            "{name:<12} normalized {} aggregate {:.3} {}",
            n.iter()
                .map(|v| format!("{v:.3}"))
                .collect::<Vec<_>>()
                .join(" "),
            agg[k],
            if *corun {
                format!("slowest {:.3}", figure[k])
            } else {
                format!("MMR {:.3}", figure[k])
            }
        );
    }
    println!(
        "corun_speedup={:.3} sliced_mmr={:.3} corun_slowest={:.3}",
        agg[1] / agg[0].max(1e-9),
        figure[0],
        figure[1]
    );
    Ok(())
}
