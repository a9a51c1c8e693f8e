//! Benchmarks. Each prints ratios against a baseline measured in the same run.

pub mod accounting;
pub mod checkpoint;
pub mod cmd;
pub mod density;
pub mod fairness;
pub mod fairness_sim;
pub mod fixture;
pub mod handover_link;
pub mod hogs;
pub mod hostile;
pub mod migrate;
pub mod overhead;
mod overhead_probes;
pub mod placement;
pub mod procfs;
pub mod recovery;
pub mod ring;
pub mod scale;
pub mod slicing;
pub mod soak;
pub mod space;
pub mod threads;

use std::io::{Read, Write};
use std::time::Instant;

use anyhow::{bail, Result};

/// Percentile of a sorted slice (p in 0..=100).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// The middle of `x` (sorted in place; the upper middle for an even count;
/// NaN for none).
pub fn median(x: &mut [f64]) -> f64 {
    x.sort_by(f64::total_cmp);
    x.get(x.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `bytes` bytes through a loopback TCP connection alone: GiB/s.
pub fn link_rate(bytes: u64) -> Result<f64> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let reader = std::thread::spawn(move || -> Result<u64> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => return Ok(got),
                k => got += k as u64,
            }
        }
    });
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(addr)?;
    let buf = vec![7u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let k = left.min(buf.len() as u64) as usize;
        s.write_all(&buf[..k])?;
        left -= k as u64;
    }
    drop(s);
    let got = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    if got != bytes {
        bail!("the link carried {got} of {bytes} bytes");
    }
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / f64::from(1u32 << 30))
}
