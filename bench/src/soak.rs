//! `fairvgpu bench soak --sim --minutes M`: a real daemon (sim executor)
//! with 32 guest processes (4 per VM) making random call mixes, bad inputs
//! among them, for M minutes; every second or so a random guest is killed
//! (SIGKILL) and another started in its place. At the end every guest stops
//! and the host must be back where it started: no device memory allocated,
//! no more open fds in the daemon and its workers (the GPU's spare, each
//! guest process's worker having ended with it) than before the first
//! guest came, no worker ended by a fault, and resident memory flat under
//! load.
//!
//! Each guest process writes its counters to a file twice a second (the
//! killed ones lose at most that half second of counts).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use guest::{Gpu, GuestError};
use protocol::{Dim3, ImageKind, Status};
use serde::{Deserialize, Serialize};
use transport::SpinPolicy;

use super::fixture::{DaemonProc, VmSpec};
use super::procfs::{children, live_children, open_fds, proc_use};
use daemon::config::ExecutorKind;

/// Guests per VM.
const PER_VM: usize = 4;
const MEM_LIMIT_MIB: u64 = 256;
const GUEST_SPIN: SpinPolicy = SpinPolicy {
    spins: 500,
    max_block_us: 2_000,
};

/// What a guest process counted.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Counts {
    /// Calls made to the vGPU.
    pub calls: u64,
    /// Operations of the mix completed.
    pub ops: u64,
    /// Bad inputs sent and refused with the expected error.
    pub bad_inputs: u64,
    /// Anything unexpected, by kind (must stay empty).
    pub unexpected: BTreeMap<String, u64>,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.calls += o.calls;
        self.ops += o.ops;
        self.bad_inputs += o.bad_inputs;
        for (k, v) in &o.unexpected {
            *self.unexpected.entry(k.clone()).or_default() += v;
        }
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Guest {
    gpu: Gpu,
    module: u64,
    vector_add: guest::Function,
    saxpy: guest::Function,
    c: Counts,
    rng: Rng,
}

/// The kind of an error, for counting.
fn kind(e: &GuestError) -> String {
    match e {
        GuestError::Cuda(s) => format!("cuda_{s:?}"),
        GuestError::Transport(_) => "transport".into(),
        GuestError::Protocol(_) => "protocol".into(),
        GuestError::VgpuReset => "vgpu_reset".into(),
        GuestError::Device { .. } => "device".into(),
        GuestError::NoVgpu => "no_vgpu".into(),
    }
}

fn le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl Guest {
    fn open(socket: &Path, seed: u64) -> Result<Guest, GuestError> {
        let mut gpu = Gpu::connect_with(socket, GUEST_SPIN)?;
        let module = gpu.module_load(ImageKind::Ptx, worker::KERNELS_PTX.as_bytes())?;
        let vector_add = gpu.get_function(module, "vector_add")?;
        let saxpy = gpu.get_function(module, "saxpy")?;
        Ok(Guest {
            gpu,
            module,
            vector_add,
            saxpy,
            c: Counts {
                calls: 3,
                ..Counts::default()
            },
            rng: Rng(seed | 1),
        })
    }

    fn wrong(&mut self, what: &str) {
        *self.c.unexpected.entry(what.to_owned()).or_default() += 1;
    }

    /// A bad input that must be refused with `want`.
    fn expect_refused<T>(&mut self, r: Result<T, GuestError>, want: Status) {
        self.c.calls += 1;
        match r {
            Err(GuestError::Cuda(s)) if s == want => self.c.bad_inputs += 1,
            Err(e) => self.wrong(&format!("bad_input_got_{}", kind(&e))),
            Ok(_) => self.wrong("bad_input_accepted"),
        }
    }

    /// One operation of the mix.
    fn step(&mut self) -> Result<(), GuestError> {
        match self.rng.below(10) {
            0..=2 => self.copies(),
            3..=5 => self.kernel(false),
            6 => self.kernel(true),
            7 => self.streams_events(),
            8 => self.memset_dtod(),
            _ => {
                self.bad_input();
                Ok(())
            }
        }?;
        self.c.ops += 1;
        Ok(())
    }

    fn copies(&mut self) -> Result<(), GuestError> {
        let len = 4096 + self.rng.below(4 << 20) as usize;
        let byte = self.rng.next() as u8;
        let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
        let p = self.gpu.mem_alloc(len as u64)?;
        self.gpu.memcpy_htod(p, &data)?;
        let mut back = vec![0u8; len];
        self.gpu.memcpy_dtoh(&mut back, p, 0)?;
        self.gpu.mem_free(p)?;
        self.c.calls += 4;
        if back != data {
            self.wrong("copy_mismatch");
        }
        Ok(())
    }

    fn kernel(&mut self, saxpy: bool) -> Result<(), GuestError> {
        let n = 256 * (1 + self.rng.below(256)) as u32;
        let s = self.rng.below(1000) as f32;
        let x: Vec<f32> = (0..n).map(|i| (i % 97) as f32 + s).collect();
        let y: Vec<f32> = (0..n).map(|i| (i % 13) as f32).collect();
        let bytes = u64::from(n) * 4;
        let (dx, dy) = (self.gpu.mem_alloc(bytes)?, self.gpu.mem_alloc(bytes)?);
        self.gpu.memcpy_htod(dx, &le(&x))?;
        self.gpu.memcpy_htod(dy, &le(&y))?;
        let grid = Dim3 {
            x: n / 256,
            y: 1,
            z: 1,
        };
        let block = Dim3 { x: 256, y: 1, z: 1 };
        let want: Vec<f32>;
        let out;
        if saxpy {
            let a = 2.5f32;
            self.gpu.launch(
                &self.saxpy,
                grid,
                block,
                0,
                0,
                &[
                    &a.to_le_bytes(),
                    &dx.to_le_bytes(),
                    &dy.to_le_bytes(),
                    &n.to_le_bytes(),
                ],
            )?;
            want = x.iter().zip(&y).map(|(x, y)| a.mul_add(*x, *y)).collect();
            out = dy;
        } else {
            let dz = self.gpu.mem_alloc(bytes)?;
            self.gpu.launch(
                &self.vector_add,
                grid,
                block,
                0,
                0,
                &[
                    &dx.to_le_bytes(),
                    &dy.to_le_bytes(),
                    &dz.to_le_bytes(),
                    &n.to_le_bytes(),
                ],
            )?;
            want = x.iter().zip(&y).map(|(x, y)| x + y).collect();
            out = dz;
            self.c.calls += 1;
        }
        let mut got = vec![0u8; bytes as usize];
        self.gpu.memcpy_dtoh(&mut got, out, 0)?;
        if f32s(&got) != want {
            self.wrong("kernel_result_mismatch");
        }
        for p in [dx, dy] {
            self.gpu.mem_free(p)?;
        }
        if out != dy {
            self.gpu.mem_free(out)?;
        }
        self.c.calls += 8;
        Ok(())
    }

    fn streams_events(&mut self) -> Result<(), GuestError> {
        let s = self.gpu.stream_create(0, 0)?;
        let (a, b) = (self.gpu.event_create(0)?, self.gpu.event_create(0)?);
        self.gpu.event_record(a, s)?;
        let p = self.gpu.mem_alloc(1 << 16)?;
        self.gpu.memset_async(p, 7, 1, 1 << 16, s)?;
        self.gpu.event_record(b, s)?;
        self.gpu.event_synchronize(b)?;
        let ms = self.gpu.event_elapsed_ms(a, b)?;
        if ms.is_nan() || ms < 0.0 {
            self.wrong("negative_elapsed");
        }
        self.gpu.stream_synchronize(s)?;
        for e in [a, b] {
            self.gpu.event_destroy(e)?;
        }
        self.gpu.stream_destroy(s)?;
        self.gpu.mem_free(p)?;
        self.c.calls += 13;
        Ok(())
    }

    fn memset_dtod(&mut self) -> Result<(), GuestError> {
        let len = 1 + self.rng.below(1 << 20);
        let v = self.rng.next() as u8;
        let (a, b) = (self.gpu.mem_alloc(len)?, self.gpu.mem_alloc(len)?);
        self.gpu.memset_async(a, u32::from(v), 1, len, 0)?;
        self.gpu.memcpy_dtod_async(b, a, len, 0)?;
        let mut got = vec![0u8; len as usize];
        self.gpu.memcpy_dtoh(&mut got, b, 0)?;
        if got.iter().any(|&x| x != v) {
            self.wrong("memset_dtod_mismatch");
        }
        self.gpu.mem_free(a)?;
        self.gpu.mem_free(b)?;
        self.c.calls += 7;
        Ok(())
    }

    fn bad_input(&mut self) {
        let mut buf = [0u8; 64];
        match self.rng.below(7) {
            0 => {
                let forged = 0x7f00_0000_0000 + (self.rng.next() & 0xffff_ffff);
                let r = self.gpu.memcpy_dtoh(&mut buf, forged, 0);
                self.expect_refused(r, Status::InvalidValue);
            }
            1 => {
                // Double free.
                if let Ok(p) = self.gpu.mem_alloc(64) {
                    let _ = self.gpu.mem_free(p);
                    self.c.calls += 2;
                    let r = self.gpu.mem_free(p);
                    self.expect_refused(r, Status::InvalidValue);
                }
            }
            2 => {
                // Use after free.
                if let Ok(p) = self.gpu.mem_alloc(64) {
                    let _ = self.gpu.mem_free(p);
                    self.c.calls += 2;
                    let r = self.gpu.memcpy_dtoh(&mut buf, p, 0);
                    self.expect_refused(r, Status::InvalidValue);
                }
            }
            3 => {
                let r = self
                    .gpu
                    .stream_synchronize(0xdead_0000 + self.rng.below(1000));
                self.expect_refused(r, Status::InvalidHandle);
            }
            4 => {
                let r = self.gpu.module_unload(0xbeef_0000 + self.rng.below(1000));
                self.expect_refused(r, Status::InvalidHandle);
            }
            5 => {
                let r = self.gpu.mem_alloc((MEM_LIMIT_MIB + 1) << 20);
                self.expect_refused(r, Status::OutOfMemory);
            }
            _ => {
                let r = self.gpu.module_load(ImageKind::Ptx, b"not ptx at all");
                self.expect_refused(r, Status::InvalidPtx);
            }
        }
    }
}

fn write_counts(path: &Path, c: &Counts) {
    let tmp = path.with_extension("tmp");
    if let Ok(s) = serde_json::to_string(c) {
        if std::fs::write(&tmp, s).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}

/// `fairvgpu __soak-guest`: one guest process of the soak.
pub fn guest(socket: &Path, seed: u64, out: &Path, stop: &Path) -> Result<()> {
    let mut total = Counts::default();
    let mut last_write = Instant::now();
    'outer: while !stop.exists() {
        let mut g = match Guest::open(socket, seed ^ total.ops) {
            Ok(g) => g,
            Err(e) => {
                *total
                    .unexpected
                    .entry(format!("open_{}", kind(&e)))
                    .or_default() += 1;
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        loop {
            if stop.exists() {
                let _ = g.gpu.module_unload(g.module);
                total.add(&g.c);
                break 'outer;
            }
            if let Err(e) = g.step() {
                let k = kind(&e);
                *g.c.unexpected.entry(k).or_default() += 1;
                total.add(&g.c);
                continue 'outer; // open again
            }
            if last_write.elapsed() > Duration::from_millis(500) {
                let mut now = total.clone();
                now.add(&g.c);
                write_counts(out, &now);
                last_write = Instant::now();
            }
        }
    }
    write_counts(out, &total);
    Ok(())
}

struct GuestProc {
    child: Child,
    out: PathBuf,
}

fn spawn_guest(bin: &Path, dir: &Path, socket: &Path, seed: u64) -> Result<GuestProc> {
    let out = dir.join(format!("guest-{seed}.json"));
    let child = Command::new(bin)
        .arg("__soak-guest")
        .arg("--socket")
        .arg(socket)
        .args(["--seed", &seed.to_string(), "--out"])
        .arg(&out)
        .arg("--stop")
        .arg(dir.join("stop"))
        .env("RUST_LOG", "error")
        .spawn()
        .context("starting a soak guest")?;
    Ok(GuestProc { child, out })
}

fn read_counts(path: &Path) -> Counts {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default()
}

/// The host's figures from `/proc`: the daemon's resident memory and
/// open fds, and those of its worker processes together.
fn host_figures(d: &DaemonProc) -> Result<(u64, u64, u64, u64)> {
    let pid = d.pid();
    let workers = children(pid);
    Ok((
        proc_use(pid).rss,
        open_fds(pid),
        workers.iter().map(|&w| proc_use(w).rss).sum(),
        workers.iter().map(|&w| open_fds(w)).sum(),
    ))
}

/// Of each VM's memory limit, what a new process of it cannot allocate in
/// one piece (a whole limit where it cannot), summed over the VMs.
fn unavailable(d: &DaemonProc, specs: &[VmSpec]) -> Result<u64> {
    let mut missing = 0;
    for v in specs {
        let mut g = Gpu::connect_with(&d.socket(&v.name), GUEST_SPIN)
            .with_context(|| format!("a new process of {}", v.name))?;
        match g.mem_alloc(v.memory_limit_mib << 20) {
            Ok(p) => g.mem_free(p)?,
            Err(_) => missing += v.memory_limit_mib << 20,
        }
    }
    Ok(missing)
}

/// Waits until the daemon's only worker process is the GPU's spare (no
/// guest process attached, or every guest's worker ended with it).
fn spare_alone(d: &DaemonProc, what: &str) -> Result<()> {
    d.wait(what, Duration::from_secs(30), |d| {
        live_children(d.pid()).len() == 1
    })
}

/// Waits for two fresh rounds of worker reports (every 200 ms).
fn settle() {
    std::thread::sleep(Duration::from_millis(700));
}

/// Runs the soak; prints progress and the summary line; fails if the host
/// leaked, crashed, or a guest saw anything unexpected.
pub fn run(minutes: f64, guests: usize) -> Result<()> {
    let bin = std::env::current_exe()?;
    let vms = guests.div_ceil(PER_VM).max(1);
    let specs: Vec<VmSpec> = (0..vms)
        .map(|i| VmSpec {
            name: format!("soak{i}"),
            weight: 1.0 + (i % 3) as f64,
            memory_limit_mib: MEM_LIMIT_MIB,
            tenant: None,
            corun: false,
            process_slots: daemon::config::DEFAULT_PROCESS_SLOTS,
            gpu: None,
        })
        .collect();
    let total_time = Duration::from_secs_f64((minutes * 60.0).max(5.0));
    println!(
        "soak: {guests} guest processes on {vms} VMs (sim executor) for {:.1} min; a random guest killed and replaced every 0.5-2 s",
        total_time.as_secs_f64() / 60.0
    );
    let mut d = DaemonProc::start(&bin, "soak", ExecutorKind::Sim, &specs)?;
    spare_alone(&d, "the GPU's spare worker")?;
    settle();
    let cold = host_figures(&d)?;
    let dir = d.dir.join("soak");
    std::fs::create_dir_all(&dir)?;
    let mut rng = Rng(0x5eed_f00d);
    let mut seed = 1u64;
    let mut procs: Vec<GuestProc> = Vec::new();
    for i in 0..guests {
        procs.push(spawn_guest(
            &bin,
            &dir,
            &d.socket(&specs[i % vms].name),
            seed,
        )?);
        seed += 1;
    }
    let mut done = Counts::default();
    let mut kills = 0u64;
    let start = Instant::now();
    let warm_at = start + total_time / 10;
    let mut warm: Option<(u64, u64, u64, u64)> = None;
    let mut next_kill = start + Duration::from_millis(500 + rng.below(1500));
    let mut next_print = start + total_time / 10;
    while start.elapsed() < total_time {
        std::thread::sleep(Duration::from_millis(50));
        let now = Instant::now();
        if warm.is_none() && now >= warm_at {
            warm = Some(host_figures(&d)?);
        }
        if now >= next_kill {
            let i = rng.below(procs.len() as u64) as usize;
            let vm = &specs[i % vms].name;
            let _ = procs[i].child.kill();
            let _ = procs[i].child.wait();
            done.add(&read_counts(&procs[i].out));
            procs[i] = spawn_guest(&bin, &dir, &d.socket(vm), seed)?;
            seed += 1;
            kills += 1;
            next_kill = now + Duration::from_millis(500 + rng.below(1500));
        }
        if now >= next_print {
            let mut c = done.clone();
            for p in &procs {
                c.add(&read_counts(&p.out));
            }
            let f = host_figures(&d)?;
            println!(
                "  {:>5.0} s: calls={} bad_inputs={} guests_killed={} daemon_rss={:.1}MiB workers_rss={:.1}MiB",
                start.elapsed().as_secs_f64(),
                c.calls,
                c.bad_inputs,
                kills,
                f.0 as f64 / 1048576.0,
                f.2 as f64 / 1048576.0
            );
            next_print = now + total_time / 10;
        }
    }
    let late = host_figures(&d)?;
    stop_guests(&dir, &mut procs, &mut done)?;
    // The host frees what the last guests held.
    let leaked = |d: &DaemonProc| -> u64 {
        d.vgpus()
            .map(|v| {
                v.iter()
                    .map(|v| v["memory_used_bytes"].as_u64().unwrap_or(0))
                    .sum()
            })
            .unwrap_or(u64::MAX)
    };
    let _ = d.wait("memory freed", Duration::from_secs(20), |d| leaked(d) == 0);
    spare_alone(&d, "every guest's worker ended")?;
    // What the ended processes left counted against their VMs' limits:
    // each VM's next process must have the whole limit.
    let unavailable = unavailable(&d, &specs)?;
    spare_alone(&d, "the checking processes' workers ended")?;
    settle();
    let leaked_bytes = leaked(&d) + unavailable;
    let end = host_figures(&d)?;
    let vg = d.vgpus()?;
    let faults: u64 = vg
        .iter()
        .map(|v| v["worker_faults"].as_u64().unwrap_or(0))
        .sum();
    let served: u64 = vg.iter().map(|v| v["requests"].as_u64().unwrap_or(0)).sum();
    let refused: u64 = vg.iter().map(|v| v["refused"].as_u64().unwrap_or(0)).sum();
    let host_crashes = faults + u64::from(!d.alive());
    let leaked_fds = (end.1 + end.3) as i64 - (cold.1 + cold.3) as i64;
    let warm = warm.unwrap_or(cold);
    let rss = |f: (u64, u64, u64, u64)| (f.0 + f.2) as f64;
    // Start and end both without guests: what the host keeps for itself.
    // (Under load the workers also hold the sim's device memory, which
    // moves with whatever the guests have allocated at that instant.)
    let growth = (rss(end) / rss(cold).max(1.0) - 1.0) * 100.0;
    let load_growth = (rss(late) / rss(warm).max(1.0) - 1.0) * 100.0;
    print_figures([cold, warm, late, end]);
    println!(
        "guests killed and replaced: {kills}; operations: {}; requests served by workers: {served} (refused {refused})",
        done.ops
    );
    let unexpected: u64 = done.unexpected.values().sum();
    println!(
        "errors by kind: bad inputs refused as expected {}; unexpected {}",
        done.bad_inputs,
        if done.unexpected.is_empty() {
            "none".to_owned()
        } else {
            format!("{:?}", done.unexpected)
        }
    );
    println!(
        "resident memory, daemon and workers: {growth:+.1}% from start to end (no guests either time); {load_growth:+.1}% under load, from 10% in to the end"
    );
    println!(
        "calls={} bad_inputs={} host_crashes={host_crashes} leaked_bytes={leaked_bytes} leaked_fds={} rss_growth_pct={growth:.1}",
        done.calls,
        done.bad_inputs,
        leaked_fds.max(0)
    );
    if host_crashes > 0 || leaked_bytes > 0 || leaked_fds > 0 || unexpected > 0 {
        bail!("soak failed: host_crashes={host_crashes} leaked_bytes={leaked_bytes} leaked_fds={leaked_fds} unexpected={unexpected}");
    }
    Ok(())
}

/// Has every guest stop cleanly (killing one that takes over a minute) and
/// adds up what each did.
fn stop_guests(dir: &std::path::Path, procs: &mut [GuestProc], done: &mut Counts) -> Result<()> {
    std::fs::write(dir.join("stop"), b"")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    for p in procs {
        while matches!(p.child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = p.child.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        done.add(&read_counts(&p.out));
    }
    Ok(())
}

/// The host's figures (daemon rss and fds, workers' rss and fds) at the
/// start, 10% in, the end of the load and after it.
fn print_figures([cold, warm, late, end]: [(u64, u64, u64, u64); 4]) {
    let mib = |b: u64| b as f64 / 1048576.0;
    println!(
        "{:<34} {:>12} {:>12} {:>12} {:>12}",
        "", "daemon rss", "daemon fds", "workers rss", "workers fds"
    );
    for (name, f) in [
        ("start (no guests)", cold),
        ("warm (10% in, under load)", warm),
        ("late (end of load)", late),
        ("end (guests gone)", end),
    ] {
        println!(
            "{name:<34} {:>9.1}MiB {:>12} {:>9.1}MiB {:>12}",
            mib(f.0),
            f.1,
            mib(f.2),
            f.3
        );
    }
}
