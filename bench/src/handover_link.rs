//! `fairvgpu bench handover-link`: the daemons' handover path against the
//! bare link, on this host. A lane of `mib` MiB of data goes from one
//! thread to another over a loopback TCP connection as a save file under a
//! key, written and read as `handover.rs` sends and takes a vGPU
//! (`save_file::write_to` into a 1 MiB buffered writer, `read_from` from a
//! 1 MiB buffered reader into a new memfd, its tag checked). As many bytes
//! go through a bare connection of the same kind (`link_rate`, as `bench
//! checkpoint` measures its link), in turn with it, every round. Reported: each one's rate, and the handover's over the link's:
//! the part of a live move's pause that the daemons' own work adds to the
//! bytes' crossing. Then each side's work without the link (see [`parts`]):
//! which of them bounds the handover. `--zeros` makes blocks of the lane
//! zero pages, which the sender reads and sends as one byte.

use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use daemon::save_file::{self, FileLimits, Lane, Saved};

const KEY: &[u8] = b"bench handover link key";
const NONCE: &[u8] = b"bench handover link nonce";

/// `mib` MiB of bytes, `zeros` of every 5 blocks of 64 KiB all zero, the
/// others with no zero block (a lane's data blocks).
fn data(mib: usize, zeros: u8) -> Vec<u8> {
    let mut v = vec![0u8; mib << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for (i, block) in v.chunks_mut(64 << 10).enumerate() {
        if i % 5 < usize::from(zeros) {
            continue;
        }
        for c in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
        }
    }
    v
}

/// `lane` as a handover's save file: how long until the reader had it in
/// a memfd, its tag checked; the memfd.
fn handover(lane: &Lane) -> Result<(Duration, Lane)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let limits = limits_of(lane);
    let t = Instant::now();
    let reader = std::thread::spawn(move || -> Result<Saved> {
        let (s, _) = l.accept()?;
        // As the daemon reads it (`handover::receive`): not buffered.
        Ok(save_file::read_from(
            s,
            Path::new("bench peer"),
            Some(KEY),
            NONCE,
            &|_| Some(limits),
        )?)
    });
    let saved = saved_of(lane)?;
    // As the daemon writes it (`handover::send`): not buffered.
    save_file::write_to(TcpStream::connect(addr)?, &saved, Some(KEY), NONCE)?;
    let mut got = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    let took = t.elapsed();
    let Some(back) = got.lanes.pop() else {
        bail!("no lane came");
    };
    Ok((took, back))
}

/// What the reading side takes: one lane of `lane`'s length, no region.
fn limits_of(lane: &Lane) -> FileLimits {
    FileLimits {
        slots: 1,
        lane_bytes: lane.len,
        region: 0,
    }
}

/// A save file's contents of one lane, `lane`'s stream shared.
fn saved_of(lane: &Lane) -> Result<Saved> {
    Ok(Saved {
        vm: "bench".into(),
        region: None,
        lanes: vec![Lane {
            slot: 0,
            stream: lane.stream.try_clone()?,
            len: lane.len,
        }],
    })
}

/// Whether memfd `lane` holds `bytes`.
fn holds(lane: &Lane, bytes: &[u8]) -> Result<bool> {
    let f = std::fs::File::from(lane.stream.try_clone()?);
    let mut back = vec![0u8; bytes.len()];
    f.read_exact_at(&mut back, 0)?;
    Ok(lane.len == bytes.len() as u64 && back == bytes)
}

/// A lane (slot 0) holding `bytes`, in a memfd.
fn lane_of(bytes: &[u8]) -> Result<Lane> {
    let stream = save_file::memfd("bench-handover-lane")?;
    std::fs::File::from(stream.try_clone()?)
        .write_all_at(bytes, 0)
        .context("filling the lane")?;
    Ok(Lane {
        slot: 0,
        stream,
        len: bytes.len() as u64,
    })
}

/// Each side's own work without the link, for `lane` (whose save file is
/// `file`): the sender's (`write_to` into nothing: blocks read, zeros
/// told, every byte tagged), the tag's alone, and the receiver's
/// (`read_from` out of memory: blocks into a new memfd, every byte
/// tagged, the tag checked). What bounds the handover where the link
/// does not.
fn parts(lane: &Lane, file: &[u8]) -> Result<[Duration; 3]> {
    let saved = saved_of(lane)?;
    let t = Instant::now();
    save_file::write_to(std::io::sink(), &saved, Some(KEY), NONCE)?;
    let send = t.elapsed();
    let t = Instant::now();
    let _ = save_file::tag_of(Some(KEY), NONCE, file);
    let tag = t.elapsed();
    let limits = limits_of(lane);
    let t = Instant::now();
    save_file::read_from(file, Path::new("bench file"), Some(KEY), NONCE, &|_| {
        Some(limits)
    })?;
    Ok([send, tag, t.elapsed()])
}

/// Runs `rounds` rounds of `mib` MiB each: the bare link, then the
/// handover path, then each side's part alone.
pub fn run(mib: usize, rounds: usize, zeros: u8) -> Result<()> {
    ensure!(
        mib > 0 && rounds > 0,
        "--mib and --rounds must be at least 1"
    );
    let bytes = data(mib, zeros);
    let lane = lane_of(&bytes)?;
    println!(
        "handover link: {mib} MiB a round ({zeros} in 5 blocks zero pages), loopback TCP, {} CPUs",
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    );
    let gib_s =
        |d: Duration| bytes.len() as f64 / d.as_secs_f64().max(1e-9) / f64::from(1u32 << 30);
    let mut file = Vec::new();
    save_file::write_to(&mut file, &saved_of(&lane)?, Some(KEY), NONCE)?;
    let (mut links, mut handovers) = (Vec::new(), Vec::new());
    let mut alone: [Vec<f64>; 3] = Default::default();
    for round in 1..=rounds {
        let link = crate::link_rate(bytes.len() as u64)?;
        let (took, back) = handover(&lane)?;
        ensure!(
            holds(&back, &bytes)?,
            "round {round}: the lane came back otherwise"
        );
        println!(
            "round {round}: link {link:.2} GiB/s, handover {:.2} GiB/s ({} ms)",
            gib_s(took),
            took.as_millis()
        );
        let p = parts(&lane, &file)?;
        println!(
            "round {round}: alone, sending {:.2} GiB/s, tagging {:.2}, taking {:.2}",
            gib_s(p[0]),
            gib_s(p[1]),
            gib_s(p[2])
        );
        for (a, d) in alone.iter_mut().zip(p) {
            a.push(gib_s(d));
        }
        links.push(link);
        handovers.push(gib_s(took));
    }
    let [s, t, k] = alone.map(|mut a| crate::median(&mut a));
    println!("send_alone_gib_s={s:.2} tag_alone_gib_s={t:.2} take_alone_gib_s={k:.2}");
    let (h, l) = (crate::median(&mut handovers), crate::median(&mut links));
    println!(
        "handover_gib_s={h:.2} link_gib_s={l:.2} handover_vs_link={:.3}",
        h / l.max(1e-9)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_crosses_the_handover_path_whole() {
        let bytes = data(2, 3);
        let lane = lane_of(&bytes).unwrap();
        let (_, back) = handover(&lane).unwrap();
        assert!(holds(&back, &bytes).unwrap());
        // Another byte anywhere, or another length, is told apart.
        let mut other = bytes.clone();
        other[12345] ^= 1;
        assert!(!holds(&back, &other).unwrap());
        assert!(!holds(&back, &bytes[..bytes.len() - 1]).unwrap());
    }
}
