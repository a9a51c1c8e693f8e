//! `fairvgpu bench handover-link`: the daemons' handover path against the
//! bare link, on this host. A lane of `mib` MiB of data goes from one
//! thread to another over a loopback TCP connection as a save file under a
//! key, written and read as `handover.rs` sends and takes a vGPU
//! (`save_file::write_to` into a 1 MiB buffered writer, `read_from` from a
//! 1 MiB buffered reader into a new memfd, its tag checked). The same bytes
//! go through a bare connection of the same kind, in turn with it, every
//! round. Reported: each one's rate, and the handover's over the link's:
//! the part of a live move's pause that the daemons' own work adds to the
//! bytes' crossing.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use daemon::save_file::{self, FileLimits, Lane, Saved};

const KEY: &[u8] = b"bench handover link key";
const NONCE: &[u8] = b"bench handover link nonce";

/// `mib` MiB of bytes no block of which is zeros (a lane's data blocks).
fn data(mib: usize) -> Vec<u8> {
    let mut v = vec![0u8; mib << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    v
}

/// The bytes through a bare loopback connection: how long until the
/// reader had them all.
fn bare(bytes: &[u8]) -> Result<Duration> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let n = bytes.len();
    let t = Instant::now();
    let reader = std::thread::spawn(move || -> std::io::Result<usize> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < n {
            match s.read(&mut buf)? {
                0 => break,
                k => got += k,
            }
        }
        Ok(got)
    });
    TcpStream::connect(addr)?.write_all(bytes)?;
    let got = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    ensure!(got == n, "the bare link carried {got} of {n} bytes");
    Ok(t.elapsed())
}

/// `lane` as a handover's save file: how long until the reader had it in
/// a memfd, its tag checked; the memfd.
fn handover(lane: &Lane) -> Result<(Duration, Lane)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let limits = FileLimits {
        slots: 1,
        lane_bytes: lane.len,
        region: 0,
    };
    let t = Instant::now();
    let reader = std::thread::spawn(move || -> Result<Saved> {
        let (s, _) = l.accept()?;
        let r = BufReader::with_capacity(1 << 20, s);
        Ok(save_file::read_from(
            r,
            Path::new("bench peer"),
            Some(KEY),
            NONCE,
            &|_| Some(limits),
        )?)
    });
    let saved = Saved {
        vm: "bench".into(),
        region: None,
        lanes: vec![Lane {
            slot: 0,
            stream: lane.stream.try_clone()?,
            len: lane.len,
        }],
    };
    let w = BufWriter::with_capacity(1 << 20, TcpStream::connect(addr)?);
    save_file::write_to(w, &saved, Some(KEY), NONCE)?;
    let mut got = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    let took = t.elapsed();
    let Some(back) = got.lanes.pop() else {
        bail!("no lane came");
    };
    Ok((took, back))
}

/// Whether memfd `lane` holds `bytes`.
fn holds(lane: &Lane, bytes: &[u8]) -> Result<bool> {
    let f = std::fs::File::from(lane.stream.try_clone()?);
    let mut back = vec![0u8; bytes.len()];
    f.read_exact_at(&mut back, 0)?;
    Ok(lane.len == bytes.len() as u64 && back == bytes)
}

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `rounds` rounds of `mib` MiB each: the bare link, then the
/// handover path.
pub fn run(mib: usize, rounds: usize) -> Result<()> {
    ensure!(
        mib > 0 && rounds > 0,
        "--mib and --rounds must be at least 1"
    );
    let bytes = data(mib);
    let stream = save_file::memfd("bench-handover-lane")?;
    std::fs::File::from(stream.try_clone()?)
        .write_all_at(&bytes, 0)
        .context("filling the lane")?;
    let lane = Lane {
        slot: 0,
        stream,
        len: bytes.len() as u64,
    };
    println!(
        "handover link: {mib} MiB of data a round, loopback TCP, {} CPUs",
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    );
    let gb_s = |d: Duration| bytes.len() as f64 / d.as_secs_f64().max(1e-9) / 1e9;
    let (mut links, mut handovers) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let link = bare(&bytes)?;
        let (took, back) = handover(&lane)?;
        ensure!(
            holds(&back, &bytes)?,
            "round {round}: the lane came back otherwise"
        );
        println!(
            "round {round}: link {:.2} GB/s ({} ms), handover {:.2} GB/s ({} ms)",
            gb_s(link),
            link.as_millis(),
            gb_s(took),
            took.as_millis()
        );
        links.push(gb_s(link));
        handovers.push(gb_s(took));
    }
    let (h, l) = (median(handovers), median(links));
    println!(
        "handover_gb_s={h:.2} link_gb_s={l:.2} handover_vs_link={:.3}",
        h / l.max(1e-9)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_crosses_the_handover_path_whole() {
        let bytes = data(2);
        let stream = save_file::memfd("t").unwrap();
        std::fs::File::from(stream.try_clone().unwrap())
            .write_all_at(&bytes, 0)
            .unwrap();
        let lane = Lane {
            slot: 0,
            stream,
            len: bytes.len() as u64,
        };
        let (_, back) = handover(&lane).unwrap();
        assert!(holds(&back, &bytes).unwrap());
        // Another byte anywhere, or another length, is told apart.
        let mut other = bytes.clone();
        other[12345] ^= 1;
        assert!(!holds(&back, &other).unwrap());
        assert!(!holds(&back, &bytes[..bytes.len() - 1]).unwrap());
        assert!(bare(&bytes).unwrap() > Duration::ZERO);
    }
}
