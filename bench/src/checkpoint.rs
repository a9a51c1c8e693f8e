//! `fairvgpu bench checkpoint --executor sim|cuda`: a running vGPU's
//! checkpoint sent over a TCP connection to another worker, on another GPU
//! where there is one, which serves on from it over the same region: the
//! step a move between hosts makes, without QEMU.
//!
//! The guest holds `mib` MiB of device memory (64 MiB allocations, each set
//! to its own byte) and loops: a kernel adds one to a vector, the vector is
//! copied back and checked. The bench holds the vGPU, takes its checkpoint,
//! sends it through a loopback TCP connection (tagged under a key, read
//! back and checked as a peer host would), hands the region over and starts
//! the second worker from what it read. The guest then checks every
//! allocation. Reported: the guest's pause (its longest round), each phase,
//! the bytes moved, and the same bytes through the same kind of connection
//! alone (the link's rate), in the same run.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use guest::Gpu;
use protocol::{Dim3, ImageKind};
use transport::SpinPolicy;
use worker::checkpoint::{Limits, VgpuImage};
use worker::executor::sim::{SimExecutor, SimParams};
use worker::executor::{Executor, ExecutorKind, GraphLaunches};
use worker::serve::{spawn, spawn_over, WorkerConfig};

const CHUNK: u64 = 64 << 20;
/// Elements of the vector the guest adds to, each round.
const N: usize = 1 << 20;
const SPIN: SpinPolicy = SpinPolicy {
    spins: 20_000,
    max_block_us: 2_000,
};
const KEY: &[u8] = b"bench checkpoint key";

/// What the guest saw.
struct Seen {
    rounds: u64,
    longest_round: Duration,
    memory_ok: bool,
}

/// The guest: `mib` MiB set chunk by chunk, then rounds until `stop`.
fn guest(
    socket: std::path::PathBuf,
    mib: u64,
    rounds: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<Seen>> {
    std::thread::spawn(move || {
        let mut gpu = Gpu::connect_with(&socket, SPIN).context("guest attaches")?;
        let chunks: Vec<u64> = (0..(mib << 20).div_ceil(CHUNK))
            .map(|_| gpu.mem_alloc(CHUNK))
            .collect::<Result<_, _>>()?;
        for (i, &c) in chunks.iter().enumerate() {
            gpu.memset_async(c, (i as u32 % 250) + 1, 1, CHUNK, 0)?;
        }
        let m = gpu.module_load(ImageKind::Ptx, worker::KERNELS_PTX.as_bytes())?;
        let add = gpu.get_function(m, "vector_add")?;
        let len = (N * 4) as u64;
        let (a, b) = (gpu.mem_alloc(len)?, gpu.mem_alloc(len)?);
        gpu.memset_async(a, 0, 4, N as u64, 0)?;
        let ones: Vec<u8> = (0..N).flat_map(|_| 1.0f32.to_le_bytes()).collect();
        gpu.memcpy_htod(b, &ones)?;
        let n = N as u32;
        let (grid, block) = (
            Dim3 {
                x: n / 256,
                y: 1,
                z: 1,
            },
            Dim3 { x: 256, y: 1, z: 1 },
        );
        let mut out = vec![0u8; N * 4];
        let mut longest = Duration::ZERO;
        let mut r = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let p: [&[u8]; 4] = [
                &a.to_le_bytes(),
                &b.to_le_bytes(),
                &a.to_le_bytes(),
                &n.to_le_bytes(),
            ];
            gpu.launch(&add, grid, block, 0, 0, &p)?;
            gpu.memcpy_dtoh(&mut out, a, 0)?;
            r += 1;
            let want = (r as f32).to_le_bytes();
            if out.chunks_exact(4).any(|x| x != want) {
                bail!("round {r}: the vector is not {r} everywhere");
            }
            longest = longest.max(t.elapsed());
            rounds.store(r, Ordering::Relaxed);
        }
        // Every allocation's first and last bytes still its own.
        let mut memory_ok = true;
        let mut probe = [0u8; 1];
        for (i, &c) in chunks.iter().enumerate() {
            for at in [c, c + CHUNK - 1] {
                gpu.memcpy_dtoh(&mut probe, at, 0)?;
                memory_ok &= probe[0] == (i % 250) as u8 + 1;
            }
        }
        Ok(Seen {
            rounds: r,
            longest_round: longest,
            memory_ok,
        })
    })
}

/// An executor on GPU `gpu`.
fn executor(kind: ExecutorKind, gpu: u32, mib: u64) -> Result<Box<dyn Executor>> {
    Ok(match kind {
        ExecutorKind::Sim => Box::new(SimExecutor::new(SimParams {
            memory: (mib + 1024) << 20,
            ..SimParams::default()
        })),
        ExecutorKind::Cuda => worker::executor::cuda::open(gpu, GraphLaunches::default())?,
    })
}

/// `image` through a loopback TCP connection, tagged under [`KEY`], read
/// back and checked on the other side; the image read and the bytes sent.
fn send(image: &VgpuImage) -> Result<(VgpuImage, u64)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let reader = std::thread::spawn(move || -> Result<VgpuImage> {
        let (s, _) = l.accept()?;
        let mut r = std::io::BufReader::with_capacity(1 << 20, s);
        Ok(worker::checkpoint::read(
            &mut r,
            worker::checkpoint::Check::Own(Some(KEY)),
            &Limits::default(),
        )?)
    });
    let mut w = std::io::BufWriter::with_capacity(1 << 20, TcpStream::connect(addr)?);
    let n = worker::checkpoint::write(&mut w, image, Some(KEY))?;
    drop(w);
    let read = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    Ok((read, n))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs the scenario with `mib` MiB of device memory.
pub fn run(kind: ExecutorKind, mib: u64) -> Result<()> {
    let dir = scratch::dir("fvg-bench-checkpoint");
    let mut cfg = WorkerConfig::new(
        "ckpt",
        dir.join("vgpu.sock"),
        worker::serve::default_layout(),
        (mib + 512) << 20,
    );
    cfg.spin = SPIN;
    let gpus = match kind {
        ExecutorKind::Sim => 2,
        ExecutorKind::Cuda => worker::executor::cuda::device_count()?,
    };
    let target = u32::from(gpus > 1);
    let first = spawn(&cfg, executor(kind, 0, mib)?)?;
    let (rounds, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let g = guest(cfg.socket.clone(), mib, rounds.clone(), stop.clone());
    let t = Instant::now();
    while rounds.load(Ordering::Relaxed) < 20 {
        if g.is_finished() || t.elapsed() > Duration::from_secs(120) {
            stop.store(true, Ordering::Relaxed);
            return Err(g
                .join()
                .map_err(|_| anyhow::anyhow!("guest panicked"))?
                .err()
                .unwrap_or_else(|| anyhow::anyhow!("the guest did not start its rounds")));
        }
        std::thread::sleep(Duration::from_millis(1));
    }

    let t0 = Instant::now();
    let image = first.checkpoint(Duration::from_secs(10))?;
    let taken = t0.elapsed();
    let (read, sent) = send(&image)?;
    let sent_at = t0.elapsed();
    // Where it lands is checked before the first worker lets go.
    let there = executor(kind, target, mib)?;
    if let Err(e) = worker::serve::fits(&cfg, there.as_ref(), &read) {
        first.resume();
        stop.store(true, Ordering::Relaxed);
        let _ = g.join();
        bail!("the checkpoint does not fit where it would land: {e}");
    }
    let handover = first.hand_over()?;
    let handed = t0.elapsed();
    let second = spawn_over(&cfg, there, handover, &read)?;
    let restored = t0.elapsed();
    let at = rounds.load(Ordering::Relaxed);
    let t = Instant::now();
    while rounds.load(Ordering::Relaxed) < at + 20 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let seen = g.join().map_err(|_| anyhow::anyhow!("guest panicked"))??;
    second.shutdown()?;
    let link = crate::link_rate(sent)?;
    let device_bytes = image.memory_bytes();
    let ok = seen.memory_ok && seen.rounds >= at + 20;
    println!(
        "checkpoint of {} MiB on {kind:?}, GPU 0 -> {target}: taken {:.1} ms, sent and checked {:.1} ms ({} bytes), \
         handed over {:.1} ms, restored {:.1} ms",
        mib,
        ms(taken),
        ms(sent_at - taken),
        sent,
        ms(handed - sent_at),
        ms(restored - handed),
    );
    println!(
        "guest: {} rounds, its longest {:.1} ms; every allocation's bytes its own: {}",
        seen.rounds,
        ms(seen.longest_round),
        seen.memory_ok
    );
    println!(
        "the same bytes through a loopback TCP connection alone: {link:.2} GiB/s; the stream's rate: {:.2} GiB/s",
        sent as f64 / (sent_at - taken).as_secs_f64() / f64::from(1u32 << 30)
    );
    println!(
        "checkpoint_ok={} pause_ms={:.1} device_mib_moved={} link_gib_s={link:.2}",
        u8::from(ok),
        ms(seen.longest_round),
        device_bytes >> 20,
    );
    if !ok {
        bail!("the guest did not go on with its memory intact");
    }
    Ok(())
}
