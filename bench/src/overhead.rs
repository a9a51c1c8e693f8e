//! `fairvgpu bench overhead`: the same workload run natively (the executor's
//! driver calls made directly by this process) and remoted (guest client ->
//! ring -> worker -> executor), in one process run, so each ratio compares
//! numbers taken minutes apart on the same device.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use guest::{Function, Gpu};
use protocol::{Dim3, ImageKind};
use transport::LayoutParams;
use vm_memory::VolatileSlice;

use daemon::config::{Config, ExecutorKind, GraphLaunches};
use daemon::setup::build_executor;
use worker::executor::{Context, Handle, Launch, Queued};
use worker::serve::{spawn, WorkerConfig};
use worker::KERNELS_PTX;

use super::overhead_probes as probes;
use super::{median, percentile};

const ONE: Dim3 = Dim3 { x: 1, y: 1, z: 1 };
const KERNEL_NS: u64 = 20_000;
const COPY: usize = 64 << 20;

/// Iteration counts.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Empty launch + sync iterations.
    pub sync_empty: usize,
    /// 20 us launch + sync iterations.
    pub sync_20us: usize,
    /// Async launches before one sync.
    pub async_launches: usize,
    /// 64 MiB copy repetitions (each way).
    pub copies: usize,
    /// Runs of the 32-stream probe, and repetitions of each copy of
    /// `overhead_probes` (each way).
    pub probes: usize,
}

/// What `overhead_probes` measured on one path: the 32-stream probe's
/// seconds, and (htod, dtoh) seconds per copy size.
struct Probes {
    hyperq: f64,
    /// (htod, dtoh) seconds per size, pageable memory.
    copies: Vec<(f64, f64)>,
    /// The same from pinned memory.
    pinned: Vec<(f64, f64)>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Times {
    sync_empty_p50: f64,
    sync_empty_mean: f64,
    sync_20us_mean: f64,
    async_20us_total: f64,
    htod_med: f64,
    dtoh_med: f64,
}

/// What a workload needs from either path.
trait Target {
    fn launch(&mut self, k: Kernel, params: &[u8]) -> Result<()>;
    fn sync(&mut self) -> Result<()>;
    fn htod(&mut self, dst: u64, src: &mut [u8]) -> Result<()>;
    fn dtoh(&mut self, dst: &mut [u8], src: u64) -> Result<()>;
    fn alloc(&mut self, size: u64) -> Result<u64>;
}

#[derive(Clone, Copy)]
enum Kernel {
    Empty,
    Spin,
}

struct Native {
    ctx: Box<dyn Context>,
    empty: Handle,
    spin: Handle,
    /// Launch the way the worker submits (`Launches::launch_many`: on a GPU
    /// a graph launch) instead of the driver's launch call a program makes.
    as_worker: bool,
}

impl Target for Native {
    fn launch(&mut self, k: Kernel, params: &[u8]) -> Result<()> {
        let f = match k {
            Kernel::Empty => self.empty,
            Kernel::Spin => self.spin,
        };
        let r = if self.as_worker {
            let q = Queued {
                launch: Launch {
                    func: f,
                    grid: ONE,
                    block: ONE,
                    shared_mem: 0,
                },
                params: 0..params.len(),
            };
            self.ctx.launch_many(0, &[q], params)
        } else {
            self.ctx.launch(f, ONE, ONE, 0, 0, params)
        };
        r.map_err(|s| anyhow::anyhow!("launch: {s:?}"))
    }
    fn sync(&mut self) -> Result<()> {
        self.ctx
            .synchronize()
            .map_err(|s| anyhow::anyhow!("sync: {s:?}"))
    }
    fn htod(&mut self, dst: u64, src: &mut [u8]) -> Result<()> {
        let s = VolatileSlice::from(src);
        self.ctx
            .htod(dst, &s, 0)
            .map_err(|e| anyhow::anyhow!("htod: {e:?}"))?;
        self.sync()
    }
    fn dtoh(&mut self, dst: &mut [u8], src: u64) -> Result<()> {
        let s = VolatileSlice::from(dst);
        self.ctx
            .dtoh(&s, src, 0)
            .map_err(|e| anyhow::anyhow!("dtoh: {e:?}"))
    }
    fn alloc(&mut self, size: u64) -> Result<u64> {
        self.ctx
            .alloc(size)
            .map_err(|e| anyhow::anyhow!("alloc: {e:?}"))
    }
}

struct Remote {
    gpu: Gpu,
    empty: Function,
    spin: Function,
}

impl Target for Remote {
    fn launch(&mut self, k: Kernel, params: &[u8]) -> Result<()> {
        let f = match k {
            Kernel::Empty => &self.empty,
            Kernel::Spin => &self.spin,
        };
        let ps: Vec<&[u8]> = if params.is_empty() {
            vec![]
        } else {
            vec![params]
        };
        Ok(self.gpu.launch(f, ONE, ONE, 0, 0, &ps)?)
    }
    fn sync(&mut self) -> Result<()> {
        Ok(self.gpu.synchronize()?)
    }
    fn htod(&mut self, dst: u64, src: &mut [u8]) -> Result<()> {
        Ok(self.gpu.memcpy_htod(dst, src)?)
    }
    fn dtoh(&mut self, dst: &mut [u8], src: u64) -> Result<()> {
        Ok(self.gpu.memcpy_dtoh(dst, src, 0)?)
    }
    fn alloc(&mut self, size: u64) -> Result<u64> {
        Ok(self.gpu.mem_alloc(size)?)
    }
}

/// One line per (workload, native, remoted), with their ratio.
fn print_rows(rows: &[(&str, f64, f64)]) {
    for &(name, a, b) in rows {
        println!("{name:<28} {a:>14.3} {b:>14.3} {:>8.3}", b / a);
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Runs the workloads; `sync_only`: only the synchronous loops.
fn measure(t: &mut dyn Target, n: Sizes, sync_only: bool) -> Result<Times> {
    let spin = KERNEL_NS.to_le_bytes();
    // Warm up: module load and first launches stay out of the numbers.
    for _ in 0..200 {
        t.launch(Kernel::Empty, &[])?;
        t.sync()?;
    }
    let mut v = Vec::with_capacity(n.sync_empty);
    let all = Instant::now();
    for _ in 0..n.sync_empty {
        let s = Instant::now();
        t.launch(Kernel::Empty, &[])?;
        t.sync()?;
        v.push(s.elapsed().as_nanos() as u64);
    }
    let sync_empty_mean = secs(all.elapsed()) / n.sync_empty as f64;
    v.sort_unstable();
    let sync_empty_p50 = percentile(&v, 50.0) as f64 * 1e-9;

    let s = Instant::now();
    for _ in 0..n.sync_20us {
        t.launch(Kernel::Spin, &spin)?;
        t.sync()?;
    }
    let sync_20us_mean = secs(s.elapsed()) / n.sync_20us as f64;
    if sync_only {
        return Ok(Times {
            sync_empty_p50,
            sync_empty_mean,
            sync_20us_mean,
            ..Times::default()
        });
    }

    t.sync()?;
    let s = Instant::now();
    for _ in 0..n.async_launches {
        t.launch(Kernel::Spin, &spin)?;
    }
    t.sync()?;
    let async_20us_total = secs(s.elapsed());

    let d = t.alloc(COPY as u64)?;
    let mut host: Vec<u8> = (0..COPY).map(|i| (i * 13 % 251) as u8).collect();
    let expect = host.clone();
    let mut back = vec![0u8; COPY];
    let (mut h, mut b) = (Vec::new(), Vec::new());
    for _ in 0..n.copies {
        let s = Instant::now();
        t.htod(d, &mut host)?;
        h.push(secs(s.elapsed()));
        let s = Instant::now();
        t.dtoh(&mut back, d)?;
        b.push(secs(s.elapsed()));
    }
    anyhow::ensure!(back == expect, "64 MiB copy came back different");
    Ok(Times {
        sync_empty_p50,
        sync_empty_mean,
        sync_20us_mean,
        async_20us_total,
        htod_med: median(&mut h),
        dtoh_med: median(&mut b),
    })
}

/// 64 MiB copies each way through `gpu`, its copies made by one guest
/// thread and by two in turn, `reps` times each: the medians (htod, dtoh)
/// for one thread, then for two. Leaves the copier at its setting before.
fn copy_threads_ab(gpu: &mut Gpu, reps: usize) -> Result<[(f64, f64); 2]> {
    let before = gpu.copy_threads();
    let d = gpu.mem_alloc(COPY as u64)?;
    let host: Vec<u8> = (0..COPY).map(|i| (i * 7 % 253) as u8).collect();
    let mut back = vec![0u8; COPY];
    let mut t: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    for _ in 0..reps.max(1) {
        for (i, threads) in [1, 2].into_iter().enumerate() {
            gpu.set_copy_threads(threads);
            back.fill(0);
            let s = Instant::now();
            gpu.memcpy_htod(d, &host)?;
            t[i].0.push(secs(s.elapsed()));
            let s = Instant::now();
            gpu.memcpy_dtoh(&mut back, d, 0)?;
            t[i].1.push(secs(s.elapsed()));
            anyhow::ensure!(
                back == host,
                "64 MiB copy by {threads} thread(s) came back different"
            );
        }
    }
    gpu.set_copy_threads(before);
    gpu.mem_free(d)?;
    let [(a, b), (c, e)] = &mut t;
    Ok([(median(a), median(b)), (median(c), median(e))])
}

/// Runs the bench and prints the report; the last line is machine-readable.
/// With `pin = Some((guest, worker))` the native loop and the guest run on
/// CPU `guest` and the worker's thread on CPU `worker`.
/// `graphs`: which launches the executor submits as graph launches.
pub fn run(
    kind: ExecutorKind,
    n: Sizes,
    pin: Option<(usize, usize)>,
    graphs: GraphLaunches,
) -> Result<()> {
    if let Some((g, _)) = pin {
        worker::serve::pin_current_thread(g)?;
    }
    let mut cfg =
        Config::parse("[[vm]]\nname = \"bench\"\ntenant = \"bench\"\nmemory_limit_mib = 4096\n")?;
    cfg.daemon.executor = kind;
    cfg.daemon.graph_launches = graphs;

    // Native. Its pinned memory for the pinned copies: a region's pool,
    // registered with the driver as the worker registers a VM's (it lives
    // until the executor, which the worker later owns, is gone).
    let mut exec = build_executor(&cfg, 0)?;
    let info = exec.info();
    let (native_pinned, _fd) = transport::Region::create(
        "bench-pinned",
        LayoutParams {
            channels: 1,
            ring_entries: 64,
            arena_size: 1 << 20,
            vectors: 1,
            pinned_size: probes::PINNED_POOL,
            partitions: 1,
        },
    )?;
    let native_pool = native_pinned.pinned()?;
    exec.register_pinned(&native_pool)
        .map_err(|s| anyhow::anyhow!("registering pinned memory: {s:?}"))?;
    let native = {
        let mut ctx = exec.open().map_err(|s| anyhow::anyhow!("context: {s:?}"))?;
        let m = ctx
            .load_module(ImageKind::Ptx, KERNELS_PTX.as_bytes())
            .map_err(|s| anyhow::anyhow!("module: {s:?}"))?;
        let empty = ctx
            .function(m, "empty")
            .map_err(|s| anyhow::anyhow!("{s:?}"))?
            .0;
        let spin = ctx
            .function(m, "spin_ns")
            .map_err(|s| anyhow::anyhow!("{s:?}"))?
            .0;
        let mut t = Native {
            ctx,
            empty,
            spin,
            as_worker: false,
        };
        let native = measure(&mut t, n, false)?;
        t.as_worker = true;
        let as_worker = measure(&mut t, n, true)?;
        let probes = Probes {
            hyperq: probes::hyperq_native(&mut *t.ctx, spin, n.probes)?,
            copies: probes::copies_native(&mut *t.ctx, n.probes)?,
            pinned: probes::pinned_copies_native(&mut *t.ctx, &native_pool, n.probes)?,
        };
        (native, as_worker, probes)
    };
    let (native, as_worker, native_probes) = native;

    // Remoted, through a worker on its own thread of this process.
    let dir = std::env::temp_dir().join(format!("fairvgpu-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let layout = LayoutParams {
        channels: 2,
        ring_entries: 1024,
        arena_size: 16 << 20,
        vectors: 2,
        pinned_size: probes::PINNED_POOL,
        partitions: 1,
    };
    let wc = WorkerConfig {
        spin: cfg.spin,
        cpu: pin.map(|(_, w)| w),
        ..WorkerConfig::new("bench", dir.join("bench.sock"), layout, 4 << 30)
    };
    let running = spawn(&wc, exec)?;
    let remote = {
        let mut gpu = Gpu::connect(&wc.socket).context("guest attach")?;
        let m = gpu.module_load(ImageKind::Ptx, KERNELS_PTX.as_bytes())?;
        let empty = gpu.get_function(m, "empty")?;
        let spin = gpu.get_function(m, "spin_ns")?;
        let mut t = Remote { gpu, empty, spin };
        let times = measure(&mut t, n, false)?;
        let probes = Probes {
            hyperq: probes::hyperq_remote(&mut t.gpu, &t.spin, n.probes)?,
            copies: probes::copies_remote(&mut t.gpu, n.probes)?,
            pinned: probes::pinned_copies_remote(&mut t.gpu, n.probes)?,
        };
        let splits = t.gpu.copy_split_counts();
        let threads = t.gpu.copy_threads();
        (
            times,
            copy_threads_ab(&mut t.gpu, n.copies)?,
            splits,
            threads,
            probes,
        )
    };
    let (remote, ab, (splits, helped), copy_threads, remote_probes) = remote;
    let batched = running.stats.batched_launches.load(Ordering::Relaxed);
    let dtoh_gbps = running.stats.dtoh_bytes.load(Ordering::Relaxed) as f64
        / running.stats.dtoh_ns.load(Ordering::Relaxed).max(1) as f64;
    let launches = running.stats.launches.load(Ordering::Relaxed);
    running.shutdown()?;
    drop(native_pinned);
    let _ = std::fs::remove_dir_all(&dir);

    report(&Report {
        device: info.name,
        kind,
        pin,
        native,
        as_worker,
        remote,
        ab,
        splits,
        helped,
        copy_threads,
        batched,
        launches,
        dtoh_gbps,
        native_probes,
        remote_probes,
    });
    Ok(())
}

/// What one run measured, for [`report`].
struct Report {
    device: String,
    kind: ExecutorKind,
    pin: Option<(usize, usize)>,
    native: Times,
    as_worker: Times,
    remote: Times,
    ab: [(f64, f64); 2],
    splits: u64,
    helped: u64,
    copy_threads: usize,
    batched: u64,
    launches: u64,
    dtoh_gbps: f64,
    native_probes: Probes,
    remote_probes: Probes,
}

/// Prints a run's rows, native against remoted, and its last line.
fn report(m: &Report) {
    let Report {
        device,
        kind,
        pin,
        native,
        as_worker,
        remote,
        ab,
        splits,
        helped,
        copy_threads,
        batched,
        launches,
        dtoh_gbps,
        native_probes,
        remote_probes,
    } = m;
    println!(
        "device: {} ({:?} executor), pinned (guest, worker): {:?}",
        device, kind, pin
    );
    println!(
        "{:<28} {:>14} {:>14} {:>8}",
        "workload", "native", "remoted", "ratio"
    );
    let rows = [
        (
            "empty launch+sync p50 (us)",
            native.sync_empty_p50 * 1e6,
            remote.sync_empty_p50 * 1e6,
        ),
        (
            "empty launch+sync mean (us)",
            native.sync_empty_mean * 1e6,
            remote.sync_empty_mean * 1e6,
        ),
        (
            "20us launch+sync mean (us)",
            native.sync_20us_mean * 1e6,
            remote.sync_20us_mean * 1e6,
        ),
        (
            "10k async 20us total (ms)",
            native.async_20us_total * 1e3,
            remote.async_20us_total * 1e3,
        ),
        (
            "64MiB htod median (ms)",
            native.htod_med * 1e3,
            remote.htod_med * 1e3,
        ),
        (
            "64MiB dtoh median (ms)",
            native.dtoh_med * 1e3,
            remote.dtoh_med * 1e3,
        ),
    ];
    print_rows(&rows);
    // The transport's own cost: the same loops with this process submitting
    // its launches the way the worker does.
    println!("native, launches submitted the way the worker submits them:");
    print_rows(&[
        (
            "empty launch+sync mean (us)",
            as_worker.sync_empty_mean * 1e6,
            remote.sync_empty_mean * 1e6,
        ),
        (
            "20us launch+sync mean (us)",
            as_worker.sync_20us_mean * 1e6,
            remote.sync_20us_mean * 1e6,
        ),
    ]);
    println!("remoted launches submitted in runs of two or more: {batched} of {launches}");
    println!(
        "worker's device-to-host copies into the arena: {dtoh_gbps:.2} GB/s while copying; \
         the guest's 64 MiB took {:.2} GB/s end to end",
        COPY as f64 / remote.dtoh_med / 1e9
    );
    println!(
        "guest copy threads: {copy_threads}; the helper copied {helped} of the {splits} halves offered"
    );
    println!("remoted 64 MiB copies by one and by two guest threads, alternating:");
    print_rows(&[
        ("htod median (ms), 1 vs 2", ab[0].0 * 1e3, ab[1].0 * 1e3),
        ("dtoh median (ms), 1 vs 2", ab[0].1 * 1e3, ab[1].1 * 1e3),
    ]);
    let copy = (remote.htod_med + remote.dtoh_med) / (native.htod_med + native.dtoh_med);
    let (np, rp) = (&native_probes, &remote_probes);
    println!(
        "{} streams x 2 kernels of 10 ms, and copies from pageable and pinned memory (native, remoted, remoted over native time; the last line gives the copies as rates against native: native time over remoted):",
        probes::STREAMS
    );
    print_rows(&[("32-stream probe (ms)", np.hyperq * 1e3, rp.hyperq * 1e3)]);
    // Copies as a rate against native: >= 1 is at least native speed.
    let mut rates = String::new();
    for (i, (name, _)) in probes::COPY_SIZES.iter().enumerate() {
        for (kind, n, r) in [
            ("pageable", np.copies[i], rp.copies[i]),
            ("pinned", np.pinned[i], rp.pinned[i]),
        ] {
            print_rows(&[
                (&format!("{name} htod {kind} (ms)"), n.0 * 1e3, r.0 * 1e3),
                (&format!("{name} dtoh {kind} (ms)"), n.1 * 1e3, r.1 * 1e3),
            ]);
            rates += &format!(
                " h2d_{kind}_{name}={:.3} d2h_{kind}_{name}={:.3}",
                n.0 / r.0,
                n.1 / r.1
            );
        }
    }
    println!(
        "overhead_sync_empty={:.3} overhead_sync_20us={:.3} overhead_async_20us={:.3} overhead_copy={:.3} transport_sync_20us={:.3} hyperq_ratio={:.3}{rates}",
        remote.sync_empty_mean / native.sync_empty_mean,
        remote.sync_20us_mean / native.sync_20us_mean,
        remote.async_20us_total / native.async_20us_total,
        copy,
        remote.sync_20us_mean / as_worker.sync_20us_mean,
        rp.hyperq / np.hyperq,
    );
}
