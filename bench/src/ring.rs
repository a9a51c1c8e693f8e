//! `fairvgpu bench ring`: a null call round trip through a channel between two
//! processes, both polling, against the same round trip over a unix domain
//! socket and over TCP loopback; and payload throughput through the arena
//! against an in-process memcpy of the same size.
//!
//! The peer process is this binary re-executed with the hidden `__echo`
//! subcommand; for the ring it attaches through the ivshmem-server socket
//! exactly as a native guest does.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use transport::server::{serve, Client};
use transport::{Descriptor, LayoutParams, Region};

use super::percentile;

/// Size of one null call message on the socket transports (one descriptor).
const MSG: usize = 128;
/// Payload size of the throughput mode.
const PAYLOAD: usize = 1 << 20;

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Null-call round-trip latency: ring vs unix socket vs TCP.
    Latency,
    /// 1 MiB payload throughput through the arena vs memcpy.
    Throughput,
}

fn spawn_echo(kind: &str, target: &str) -> Result<Child> {
    let exe = std::env::current_exe().context("finding own executable")?;
    Command::new(exe)
        .args(["__echo", kind, target])
        .spawn()
        .context("spawning echo peer")
}

fn tmpdir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("fairvgpu-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// Runs the bench and prints its report; the last line is machine-readable.
pub fn run(mode: Mode, iters: usize) -> Result<()> {
    match mode {
        Mode::Latency => latency(iters),
        Mode::Throughput => throughput(iters.clamp(1, 20_000)),
    }
}

fn ring_setup(
    params: LayoutParams,
    dir: &Path,
) -> Result<(Region, transport::server::ServerHandle, Child)> {
    let sock = dir.join("ring.sock");
    let (region, fd) = Region::create("bench", params)?;
    let server = serve(&sock, fd, &region)?;
    let child = spawn_echo("ring", sock.to_str().context("socket path")?)?;
    Ok((region, server, child))
}

fn latency(iters: usize) -> Result<()> {
    let dir = tmpdir()?;
    let warm = iters / 10 + 100;

    // Ring: we are the guest; the child is the host side and echoes.
    let params = LayoutParams {
        channels: 1,
        ring_entries: 64,
        arena_size: 64 << 10,
        vectors: 1,
        pinned_size: 0,
        partitions: 1,
    };
    let (region, _server, mut child) = ring_setup(params, &dir)?;
    let mut g = region.claim(0, std::process::id(), 0)?;
    let mut ring = Vec::with_capacity(iters);
    let mut buf = Vec::new();
    for i in 0..(warm + iters) {
        let t = Instant::now();
        let d = Descriptor::new(i as u64, 1);
        while !g.req.try_send(&d, &[])? {
            std::hint::spin_loop();
        }
        loop {
            if let Some(r) = g.resp.try_recv(&mut buf)? {
                if r.tag != i as u64 {
                    bail!("echo out of order: {} != {i}", r.tag);
                }
                break;
            }
            std::hint::spin_loop();
        }
        if i >= warm {
            ring.push(t.elapsed().as_nanos() as u64);
        }
    }
    // Tag u64::MAX tells the echo to stop.
    while !g.req.try_send(&Descriptor::new(u64::MAX, 1), &[])? {}
    child.wait()?;

    // Unix domain socket.
    let uds_path = dir.join("uds.sock");
    let _ = std::fs::remove_file(&uds_path);
    let l = UnixListener::bind(&uds_path)?;
    let mut child = spawn_echo("uds", uds_path.to_str().context("path")?)?;
    let (mut s, _) = l.accept()?;
    let uds = socket_rtt(&mut s, warm, iters)?;
    drop(s);
    child.wait()?;

    // TCP loopback.
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?.to_string();
    let mut child = spawn_echo("tcp", &addr)?;
    let (mut s, _) = l.accept()?;
    s.set_nodelay(true)?;
    let tcp = socket_rtt(&mut s, warm, iters)?;
    drop(s);
    child.wait()?;
    let _ = std::fs::remove_dir_all(&dir);

    let (mut uds, mut tcp) = (uds, tcp);
    ring.sort_unstable();
    uds.sort_unstable();
    tcp.sort_unstable();
    let (rp50, rp99) = (percentile(&ring, 50.0), percentile(&ring, 99.0));
    let (up50, up99) = (percentile(&uds, 50.0), percentile(&uds, 99.0));
    let (tp50, tp99) = (percentile(&tcp, 50.0), percentile(&tcp, 99.0));
    println!("null-call round trip between two processes, {iters} iterations each");
    println!("{:<10} {:>10} {:>10}", "transport", "p50_ns", "p99_ns");
    println!("{:<10} {:>10} {:>10}", "ring", rp50, rp99);
    println!("{:<10} {:>10} {:>10}", "uds", up50, up99);
    println!("{:<10} {:>10} {:>10}", "tcp", tp50, tp99);
    println!(
        "ring_p50_ns={rp50} ring_p99_ns={rp99} uds_p50_ns={up50} tcp_p50_ns={tp50} ratio_uds={:.4}",
        rp50 as f64 / up50.max(1) as f64
    );
    Ok(())
}

fn socket_rtt(s: &mut (impl Read + Write), warm: usize, iters: usize) -> Result<Vec<u64>> {
    let mut msg = [0u8; MSG];
    let mut out = Vec::with_capacity(iters);
    for i in 0..(warm + iters) {
        msg[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let t = Instant::now();
        s.write_all(&msg)?;
        s.read_exact(&mut msg)?;
        if i >= warm {
            out.push(t.elapsed().as_nanos() as u64);
        }
    }
    Ok(out)
}

fn throughput(iters: usize) -> Result<()> {
    let dir = tmpdir()?;
    let params = LayoutParams {
        channels: 1,
        ring_entries: 64,
        arena_size: 4 * PAYLOAD as u64,
        vectors: 1,
        pinned_size: 0,
        partitions: 1,
    };
    let (region, _server, mut child) = ring_setup(params, &dir)?;
    let mut g = region.claim(0, std::process::id(), 0)?;
    let payload: Vec<u8> = (0..PAYLOAD).map(|i| (i * 31 % 251) as u8).collect();
    let warm = iters / 10 + 10;
    let mut buf = Vec::new();
    let mut t0 = Instant::now();
    for i in 0..(warm + iters) {
        if i == warm {
            // Wait until the warm-up messages are consumed, then start the clock.
            while !g.req.try_send(&Descriptor::new(u64::MAX - 1, 2), &[])? {
                std::hint::spin_loop();
            }
            loop {
                if g.resp.try_recv(&mut buf)?.is_some() {
                    break;
                }
                std::hint::spin_loop();
            }
            t0 = Instant::now();
        }
        let d = Descriptor::new(i as u64, 2);
        while !g.req.try_send(&d, &payload)? {
            std::hint::spin_loop();
        }
    }
    // Ask for an acknowledgement once everything was consumed.
    while !g.req.try_send(&Descriptor::new(u64::MAX - 1, 2), &[])? {}
    let ack = loop {
        if let Some(d) = g.resp.try_recv(&mut buf)? {
            break d;
        }
        std::hint::spin_loop();
    };
    let elapsed = t0.elapsed();
    // The echo reports a checksum of the last payload it received.
    let sum = u64::from_le_bytes(ack.inline[..8].try_into()?);
    let expect = checksum(&payload);
    while !g.req.try_send(&Descriptor::new(u64::MAX, 1), &[])? {}
    child.wait()?;
    if sum != expect {
        bail!("payload corrupted in transit: checksum {sum} != {expect}");
    }
    let ring_gbps = (iters * PAYLOAD) as f64 / elapsed.as_secs_f64() / 1e9;

    // Baseline: an in-process copy of the same size, into rotating buffers.
    let mut dsts = vec![vec![0u8; PAYLOAD]; 4];
    let t = Instant::now();
    for i in 0..(iters * 2) {
        let d = &mut dsts[i % 4];
        d.copy_from_slice(&payload);
        std::hint::black_box(&d);
    }
    let memcpy_gbps = (2 * iters * PAYLOAD) as f64 / t.elapsed().as_secs_f64() / 1e9;
    let _ = std::fs::remove_dir_all(&dir);
    println!("1 MiB messages through the arena, {iters} messages, checksum verified");
    println!(
        "ring_gbps={ring_gbps:.2} memcpy_gbps={memcpy_gbps:.2} ratio={:.3}",
        ring_gbps / memcpy_gbps
    );
    Ok(())
}

/// Position-sensitive checksum (catches reordered as well as corrupted bytes).
fn checksum(b: &[u8]) -> u64 {
    b.iter().enumerate().fold(0u64, |acc, (i, &x)| {
        acc.wrapping_mul(31).wrapping_add(u64::from(x) ^ i as u64)
    })
}

/// The peer side (`fairvgpu __echo KIND TARGET`).
pub fn echo(kind: &str, target: &str) -> Result<()> {
    match kind {
        "ring" => echo_ring(Path::new(target)),
        "uds" => echo_stream(UnixStream::connect(target)?),
        "tcp" => {
            let s = TcpStream::connect(target)?;
            s.set_nodelay(true)?;
            echo_stream(s)
        }
        other => bail!("unknown echo kind {other}"),
    }
}

fn echo_stream(mut s: impl Read + Write) -> Result<()> {
    let mut msg = [0u8; MSG];
    while s.read_exact(&mut msg).is_ok() {
        s.write_all(&msg)?;
    }
    Ok(())
}

fn echo_ring(sock: &Path) -> Result<()> {
    let client = Client::connect(sock, Duration::from_secs(10))?;
    let mut h = client.region.host_channel(0)?;
    let mut sink = vec![0u8; PAYLOAD];
    let mut last_len = 0;
    let parent = nix::unistd::getppid();
    let mut idle: u32 = 0;
    loop {
        let Some(d) = h.req.peek()? else {
            idle = idle.wrapping_add(1);
            // Never outlive the bench that started us (it may have failed).
            if idle.is_multiple_of(1 << 20) && nix::unistd::getppid() != parent {
                bail!("bench process went away");
            }
            std::hint::spin_loop();
            continue;
        };
        let len = d.data_len as usize;
        if len > 0 {
            // The host's copy out of the arena, as a worker does for a copy.
            h.req.data(&d)?.copy_to(&mut sink[..len]);
            last_len = len;
        }
        h.req.consume(&d)?;
        match d.tag {
            u64::MAX => return Ok(()),
            t if t == u64::MAX - 1 => {
                let mut r = Descriptor::new(t, d.opcode);
                r.inline[..8].copy_from_slice(&checksum(&sink[..last_len]).to_le_bytes());
                while !h.resp.try_send(&r, &[])? {}
            }
            t if d.opcode == 1 => while !h.resp.try_send(&Descriptor::new(t, 1), &[])? {},
            _ => {}
        }
    }
}
