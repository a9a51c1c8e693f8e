//! `fairvgpu bench space --executor E`: four guests of small kernels (8
//! blocks, a few of the GPU's SMs each) at weights 1:1:2:4 on one GPU,
//! through a real daemon, time-sliced against co-running (`[[gpu]] mps =
//! true`, every VM `corun = true`; on a GPU the workers are then clients of
//! the daemon's MPS control daemon); then three guests whose kernels fill
//! the GPU at weights 1:2:3, the same two ways (co-running must cost
//! nothing when nothing fits together); then one guest copying and one whose
//! kernels fill 60% of the GPU, co-running under the fair queue and under
//! phase selection (`policy = "phase"`); then one of four co-running
//! guests faults, and every VM must compute again.
//!
//! Each guest's throughput is normalized by its rate alone on the GPU
//! (measured first, in the same run); the aggregate is their sum (1.0:
//! the GPU passed from one to the next with nothing lost). Time-sliced,
//! the weights decide: the MMR of normalized throughput over weight share.
//! Co-running, every guest's kernels fit beside the others', so each is
//! entitled to all it asks for (weighted max-min fairness): the MMR of
//! normalized throughput itself (`corun_mmr` is the smaller of the two, as
//! in `bench space --sim`).
//! On the sim each worker process runs its own model of the GPU, so what
//! keeps vGPUs apart there is the grant alone: co-running grants let every
//! guest run at once, as MPS would if nothing they share (SMs, memory
//! bandwidth, caches) slowed them. The sim's figure is that upper bound and
//! a test of the plumbing (grants, charges, opt-in), not evidence; the GPU's
//! is `scripts/gpu/space.sh`. The copier of the phase experiment moves its
//! bytes through the rings with the host's CPUs, so on a small machine its
//! co-running with the computer contends for CPUs more than anything else.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use guest::Gpu;
use protocol::{Dim3, ImageKind};

use super::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;

const WEIGHTS: [f64; 4] = [1.0, 1.0, 2.0, 4.0];
/// Blocks of each kernel: 8 of an H100's 132 SMs.
const BLOCKS: u32 = 8;
/// Each kernel's time, ns.
const KERNEL_NS: u64 = 1_000_000;

/// What a guest does, round after round.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// `blocks` blocks of `threads` threads spinning `KERNEL_NS`, eight per
    /// synchronize (a round: one kernel).
    Kernels { blocks: u32, threads: u32 },
    /// 16 MiB to the device and back (a round: one such pair).
    Copies,
}

/// One guest doing `work` until `stop`; how many rounds it did.
fn guest(socket: &Path, work: Work, stop: &AtomicBool, go: Instant) -> Result<u64> {
    let mut gpu = Gpu::connect(socket).context("attaching")?;
    let wait_for_go = || {
        while Instant::now() < go {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let mut n = 0;
    match work {
        Work::Kernels { blocks, threads } => {
            let m = gpu.module_load(ImageKind::Ptx, worker::KERNELS_PTX.as_bytes())?;
            let f = gpu.get_function(m, "spin_blocks")?;
            let out = gpu.mem_alloc(u64::from(blocks) * 4)?;
            let grid = Dim3 {
                x: blocks,
                y: 1,
                z: 1,
            };
            let block = Dim3 {
                x: threads,
                y: 1,
                z: 1,
            };
            let (o, ns) = (out.to_le_bytes(), KERNEL_NS.to_le_bytes());
            wait_for_go();
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..8 {
                    gpu.launch(&f, grid, block, 0, 0, &[&o, &ns])?;
                }
                gpu.synchronize()?;
                n += 8;
            }
        }
        Work::Copies => {
            const BYTES: usize = 16 << 20;
            let dev = gpu.mem_alloc(BYTES as u64)?;
            let mut host = vec![7u8; BYTES];
            wait_for_go();
            while !stop.load(Ordering::Relaxed) {
                gpu.memcpy_htod(dev, &host)?;
                gpu.memcpy_dtoh(&mut host, dev, 0)?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Rounds per second of each guest of `vms` doing its `work`, all running
/// `secs` at once; `gpu`: a `[[gpu]]` table, if any.
fn rates(
    bin: &Path,
    executor: ExecutorKind,
    vms: &[VmSpec],
    work: &[Work],
    gpu: &str,
    secs: f64,
) -> Result<Vec<f64>> {
    let extra = format!("\n{gpu}\n");
    let d = DaemonProc::start_with(bin, "space", executor, vms, &extra)?;
    let stop = Arc::new(AtomicBool::new(false));
    let go = Instant::now() + Duration::from_millis(500);
    let threads: Vec<_> = vms
        .iter()
        .zip(work)
        .map(|(v, &w)| {
            let (socket, stop) = (d.socket(&v.name), stop.clone());
            std::thread::spawn(move || guest(&socket, w, &stop, go))
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

const MPS: &str = "[[gpu]]\nindex = 0\nmps = true";
const SMALL: Work = Work::Kernels {
    blocks: BLOCKS,
    threads: 1,
};

/// Kernels that fill an H100: two blocks of 1,024 threads on each of its
/// 132 SMs.
const FULL: Work = Work::Kernels {
    blocks: 264,
    threads: 1024,
};

/// Runs the bench; the last line is machine-readable.
pub fn run(executor: ExecutorKind, secs: f64) -> Result<()> {
    let bin = std::env::current_exe()?;
    println!(
        "space ({executor:?} executor): 4 guests of {BLOCKS}-block {} ms kernels at weights 1:1:2:4, {secs} s per phase",
        KERNEL_NS / 1_000_000
    );
    let cfg = super::fairness::config(executor, Default::default())?;
    println!(
        "time slices: {} ms base on GPU 0 (the daemon's, as for any GPU without its own)",
        daemon::setup::gpu_slice_ns(&cfg, 0) as f64 / 1e6
    );
    let alone = rates(&bin, executor, &vms(false)[..1], &[SMALL], "", secs)?[0];
    println!("alone: {alone:.1} kernels/s");
    let wsum: f64 = WEIGHTS.iter().sum();
    let mut agg = [0.0; 2];
    let mut figure = [0.0; 2];
    let both = sliced_and_corun(&bin, executor, vms, &[SMALL; 4], alone, secs)?;
    for (k, (name, n)) in ["time-sliced", "co-running"].iter().zip(&both).enumerate() {
        agg[k] = n.iter().sum();
        let x: Vec<f64> = n.iter().zip(WEIGHTS).map(|(n, w)| n / (w / wsum)).collect();
        figure[k] = sched::mmr(if k == 1 { n } else { &x });
        println!(
            "{name:<12} normalized {} aggregate {:.3} MMR {:.3}",
            fmt(n),
            agg[k],
            figure[k]
        );
    }
    let full = full_gpu_ratio(&bin, executor, secs)?;
    let phase = phase_speedup(&bin, executor, secs)?;
    let fault_ms = fault_recovery_ms(&bin, executor)?;
    println!(
        "corun_speedup={:.3} corun_mmr={:.3} phase_speedup={phase:.3} fault_recovery_ms={fault_ms:.0} sliced_mmr={:.3} full_gpu_ratio={full:.3}",
        agg[1] / agg[0].max(1e-9),
        figure[0].min(figure[1]),
        figure[0]
    );
    Ok(())
}

/// Four co-running guests; one launches a kernel that reads out of bounds.
/// Under MPS the fault can end every client on the GPU (each process whose
/// worker it was sees the error; each VM's next process gets a new
/// worker); on the sim it ends only the faulting process's worker. From
/// the fault reported to every VM computing a checked vector add again, ms.
fn fault_recovery_ms(bin: &Path, executor: ExecutorKind) -> Result<f64> {
    use super::recovery::{launch_out_of_bounds, until_working};
    let vms = vms(true);
    let d = DaemonProc::start_with_logged(
        bin,
        "space-fault",
        executor,
        &vms,
        &format!("\n{MPS}\n"),
        "info",
    )?;
    let sockets: Vec<_> = vms.iter().map(|v| d.socket(&v.name)).collect();
    for s in &sockets {
        until_working(s, Duration::from_secs(60))?;
    }
    let mut bad = Gpu::connect(&sockets[0]).context("attaching")?;
    launch_out_of_bounds(&mut bad)?;
    let fault = bad.synchronize();
    let t0 = Instant::now();
    let seen = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    anyhow::ensure!(fault.is_err(), "the out-of-bounds kernel did not fault");
    drop(bad);
    for s in &sockets {
        until_working(s, Duration::from_secs(60))?;
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    println!(
        "fault: one co-running guest's kernel read out of bounds ({:?}); every VM computed again after {ms:.0} ms",
        fault.err()
    );
    // The guest saw the fault at (UTC, as the log's times):
    let day = seen.as_secs_f64() % 86_400.0;
    println!(
        "  the guest saw the fault at {:02}:{:02}:{:09.6}Z",
        (day / 3600.0) as u32,
        (day % 3600.0 / 60.0) as u32,
        day % 60.0
    );
    // Where the time went: the workers' ends and starts, from the log.
    let log = std::fs::read_to_string(d.log_path()).unwrap_or_default();
    let steps = [
        "worker exited",
        "MPS clients",
        "spare worker bound",
        "no spare worker",
        "MPS control daemon started",
        "ended worker reaped",
        "slot's worker serving",
        "spare worker started",
    ];
    let lines: Vec<&str> = log.lines().collect();
    let first = lines
        .iter()
        .position(|l| steps[..4].iter().any(|s| l.contains(s)))
        .unwrap_or(lines.len());
    for line in lines[first..]
        .iter()
        .filter(|l| steps.iter().any(|s| l.contains(s)))
        .take(24)
    {
        println!("  log: {line}");
    }
    Ok(ms)
}

fn fmt(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Three guests whose kernels fill the GPU, at weights 1:2:3, time-sliced
/// and opted in to co-running: nothing fits together, so co-running must
/// change nothing. Aggregate normalized throughput co-running over
/// time-sliced.
fn full_gpu_ratio(bin: &Path, executor: ExecutorKind, secs: f64) -> Result<f64> {
    let three = |corun: bool| -> Vec<VmSpec> {
        [1.0, 2.0, 3.0]
            .iter()
            .enumerate()
            .map(|(i, &weight)| VmSpec {
                weight,
                corun,
                ..VmSpec::new(&format!("f{i}"), 1024)
            })
            .collect()
    };
    let alone = rates(bin, executor, &three(false)[..1], &[FULL], "", secs)?[0];
    let mut agg = [0.0; 2];
    let both = sliced_and_corun(bin, executor, three, &[FULL; 3], alone, secs)?;
    for (k, (name, n)) in ["time-sliced", "co-running"].iter().zip(&both).enumerate() {
        agg[k] = n.iter().sum();
        println!(
            "full-GPU 1:2:3, {name:<11} normalized {} aggregate {:.3}",
            fmt(n),
            agg[k]
        );
    }
    Ok(agg[1] / agg[0].max(1e-9))
}

/// Each guest's throughput over `alone` (its rate alone on the GPU),
/// time-sliced and then co-running (`[[gpu]] mps = true`): `vms(corun)` are
/// the VMs, each doing the matching `work`.
fn sliced_and_corun(
    bin: &Path,
    executor: ExecutorKind,
    vms: impl Fn(bool) -> Vec<VmSpec>,
    work: &[Work],
    alone: f64,
    secs: f64,
) -> Result<[Vec<f64>; 2]> {
    let mut out = [Vec::new(), Vec::new()];
    for (k, corun) in [false, true].into_iter().enumerate() {
        let gpu = if corun { MPS } else { "" };
        let r = rates(bin, executor, &vms(corun), work, gpu, secs)?;
        out[k] = r.iter().map(|x| x / alone.max(1e-9)).collect();
    }
    Ok(out)
}

/// One guest copying 16 MiB both ways and one whose kernels fill about 60%
/// of the GPU (large blocks), both opted in on an MPS GPU, under the fair
/// queue and under phase selection: aggregate normalized throughput with
/// phase selection over without.
fn phase_speedup(bin: &Path, executor: ExecutorKind, secs: f64) -> Result<f64> {
    // 160 blocks of 1,024 threads: two per SM at most, 60% of 132 SMs.
    let big = Work::Kernels {
        blocks: 160,
        threads: 1024,
    };
    let work = [Work::Copies, big];
    let two: Vec<VmSpec> = ["copier", "computer"]
        .iter()
        .map(|n| VmSpec {
            corun: true,
            ..VmSpec::new(n, 1024)
        })
        .collect();
    let alone: Vec<f64> = (0..2)
        .map(|i| rates(bin, executor, &two[i..=i], &work[i..=i], MPS, secs).map(|r| r[0]))
        .collect::<Result<_>>()?;
    let mut agg = [0.0; 2];
    for (k, policy) in ["fair", "phase"].iter().enumerate() {
        let gpu = format!("{MPS}\npolicy = \"{policy}\"");
        let r = rates(bin, executor, &two, &work, &gpu, secs)?;
        let n: Vec<f64> = r.iter().zip(&alone).map(|(x, a)| x / a.max(1e-9)).collect();
        agg[k] = n.iter().sum();
        println!(
            "copier + computer, policy {policy:<5} normalized {} aggregate {:.3}",
            fmt(&n),
            agg[k]
        );
    }
    Ok(agg[1] / agg[0].max(1e-9))
}
