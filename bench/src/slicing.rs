//! `fairvgpu bench slicing --executor cuda|sim`: what kernel slicing buys a
//! small tenant beside one that launches long kernels.
//!
//! Two VMs of equal weight on one GPU. `big` loops a kernel of 16,384
//! blocks that each spin for a while (about 50 ms in all on an H100-sized
//! GPU), and checks that every block wrote its own index; `small` loops a
//! 50 µs kernel and a synchronize, timing each round. The same run is made
//! twice, in the same process run: with launches whole (`slice_blocks = 0`)
//! and sliced (`slice_blocks = 4096`, about one wave of the GPU per
//! sub-grid). A non-preemptive GPU cannot take the GPU from a kernel; with
//! slicing, the scheduler can hand it over between sub-grids.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use guest::Gpu;
use protocol::{Dim3, ImageKind};
use transport::SpinPolicy;

use super::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;

const BLOCKS: u32 = 16_384;
const SPIN: SpinPolicy = SpinPolicy {
    spins: 20_000,
    max_block_us: 1_000,
};

/// One configuration's figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    /// The small tenant's round (launch + synchronize), ms: median, p99, max.
    pub small_ms: (f64, f64, f64),
    /// Big kernels completed per second.
    pub big_per_s: f64,
    /// Launches the worker ran as sub-grids.
    pub sliced: u64,
}

fn run_one(
    bin: &std::path::Path,
    executor: ExecutorKind,
    slice_blocks: u64,
    secs: f64,
) -> Result<Outcome> {
    let vm = |name: &str| VmSpec::new(name, 512);
    let d = DaemonProc::start_full(
        bin,
        &format!("slicing-{slice_blocks}"),
        executor,
        &[vm("big"), vm("small")],
        &format!("slice_blocks = {slice_blocks}"),
        "",
    )?;
    // Per-block spin: 4 waves of 132 x 32 one-thread blocks make ~50 ms.
    let block_ns: u64 = 12_000_000;
    let stop = Arc::new(AtomicBool::new(false));
    let big_done = Arc::new(AtomicU64::new(0));
    let failure: Arc<Mutex<Option<String>>> = Arc::default();
    let big = {
        let (stop, done, failure, sock) = (
            stop.clone(),
            big_done.clone(),
            failure.clone(),
            d.socket("big"),
        );
        std::thread::spawn(move || {
            let r = (|| -> Result<()> {
                let mut gpu = Gpu::connect_with(&sock, SPIN)?;
                let m = gpu.module_load(ImageKind::Ptx, worker::KERNELS_PTX.as_bytes())?;
                let f = gpu.get_function(m, "spin_blocks")?;
                let out = gpu.mem_alloc(u64::from(BLOCKS) * 4)?;
                let one = Dim3 { x: 1, y: 1, z: 1 };
                let grid = Dim3 {
                    x: BLOCKS,
                    y: 1,
                    z: 1,
                };
                let mut buf = vec![0u8; BLOCKS as usize * 4];
                while !stop.load(Ordering::Relaxed) {
                    gpu.memset_async(out, 0xff, 1, u64::from(BLOCKS) * 4, 0)?;
                    gpu.launch(
                        &f,
                        grid,
                        one,
                        0,
                        0,
                        &[&out.to_le_bytes(), &block_ns.to_le_bytes()],
                    )?;
                    gpu.memcpy_dtoh(&mut buf, out, 0)?;
                    for (i, c) in buf.chunks_exact(4).enumerate() {
                        let v = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        if v != i as u32 {
                            bail!("block {i} wrote {v}");
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })();
            if let Err(e) = r {
                *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
            }
        })
    };
    let mut gpu = Gpu::connect_with(&d.socket("small"), SPIN)?;
    let m = gpu.module_load(ImageKind::Ptx, worker::KERNELS_PTX.as_bytes())?;
    let f = gpu.get_function(m, "spin_ns")?;
    let one = Dim3 { x: 1, y: 1, z: 1 };
    // Let the big tenant get going.
    let t = Instant::now();
    while big_done.load(Ordering::Relaxed) < 1 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut rounds = Vec::new();
    let (t0, b0) = (Instant::now(), big_done.load(Ordering::Relaxed));
    while t0.elapsed().as_secs_f64() < secs {
        let r = Instant::now();
        gpu.launch(&f, one, one, 0, 0, &[&50_000u64.to_le_bytes()])?;
        gpu.synchronize()?;
        rounds.push(r.elapsed().as_secs_f64() * 1e3);
    }
    let big_per_s = (big_done.load(Ordering::Relaxed) - b0) as f64 / t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = big.join();
    if let Some(e) = failure.lock().unwrap_or_else(|e| e.into_inner()).take() {
        bail!("the big tenant failed: {e}");
    }
    rounds.sort_by(f64::total_cmp);
    let pct = |p: f64| rounds[((rounds.len() - 1) as f64 * p) as usize];
    let sliced = d.vgpu("big")?["sliced_launches"].as_u64().unwrap_or(0);
    Ok(Outcome {
        small_ms: (pct(0.5), pct(0.99), *rounds.last().unwrap_or(&0.0)),
        big_per_s,
        sliced,
    })
}

/// Both configurations, side by side.
pub fn run(executor: ExecutorKind, secs: f64) -> Result<()> {
    let bin = std::env::current_exe()?;
    println!(
        "slicing ({executor:?} executor): big loops {BLOCKS}-block kernels (~50 ms), small loops 50 us kernels; launches whole vs sliced"
    );
    let off = run_one(&bin, executor, 0, secs)?;
    let on = run_one(&bin, executor, 4096, secs)?;
    if on.sliced == 0 {
        bail!("no launch was sliced");
    }
    println!(
        "{:<22} {:>10} {:>10} {:>10} {:>12} {:>8}",
        "", "small p50", "small p99", "small max", "big kern/s", "sliced"
    );
    for (name, o) in [("whole (slice_blocks=0)", off), ("sliced (4096)", on)] {
        println!(
            "{name:<22} {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>12.2} {:>8}",
            o.small_ms.0, o.small_ms.1, o.small_ms.2, o.big_per_s, o.sliced
        );
    }
    println!(
        "small_p99_ms_whole={:.2} small_p99_ms_sliced={:.2} big_rate_ratio={:.3} results_checked=true",
        off.small_ms.1,
        on.small_ms.1,
        on.big_per_s / off.big_per_s.max(1e-9)
    );
    Ok(())
}
