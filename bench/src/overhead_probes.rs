//! Probes of `bench overhead` that real programs showed wanting: kernels
//! on many streams at once (as `simpleHyperQ`: natively they overlap) and
//! copies of 64 MiB and 1 GiB each way from pageable and from pinned
//! (page-locked) memory, each measured natively and remoted in the same
//! run (see `overhead.rs`).

use std::time::Instant;

use anyhow::Result;
use guest::{Function, Gpu};
use protocol::Dim3;
use vm_memory::VolatileSlice;

use worker::executor::{Context, Handle};

use super::median;

const ONE: Dim3 = Dim3 { x: 1, y: 1, z: 1 };
/// Streams of the concurrency probe, and kernels each.
pub(super) const STREAMS: usize = 32;
const PER_STREAM: usize = 2;
/// Each kernel's time (`simpleHyperQ`'s are about 10 ms).
const SPIN_NS: u64 = 10_000_000;
/// The copy sizes.
pub(super) const COPY_SIZES: [(&str, usize); 2] = [("64m", 64 << 20), ("1g", 1 << 30)];
/// Pinned memory the pinned copies need: the largest copy size.
pub(super) const PINNED_POOL: u64 = 1 << 30;

/// Seconds, the median of `reps` runs of the concurrency probe.
pub(super) fn hyperq_native(ctx: &mut dyn Context, spin: Handle, reps: usize) -> Result<f64> {
    let e = |s: protocol::Status| anyhow::anyhow!("hyperq: {s:?}");
    let streams = (0..STREAMS)
        .map(|_| ctx.stream_create(0, 0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(e)?;
    let p = SPIN_NS.to_le_bytes();
    let mut t = Vec::new();
    for _ in 0..reps.max(1) + 1 {
        ctx.synchronize().map_err(e)?;
        let s = Instant::now();
        for &st in &streams {
            for _ in 0..PER_STREAM {
                ctx.launch(spin, ONE, ONE, 0, st, &p).map_err(e)?;
            }
        }
        ctx.synchronize().map_err(e)?;
        t.push(s.elapsed().as_secs_f64());
    }
    for st in streams {
        ctx.stream_destroy(st).map_err(e)?;
    }
    // The first run warms up.
    Ok(median(&mut t[1..]))
}

/// As [`hyperq_native`], through the guest client.
pub(super) fn hyperq_remote(gpu: &mut Gpu, spin: &Function, reps: usize) -> Result<f64> {
    let streams = (0..STREAMS)
        .map(|_| gpu.stream_create(0, 0))
        .collect::<Result<Vec<_>, _>>()?;
    let p = SPIN_NS.to_le_bytes();
    let mut t = Vec::new();
    for _ in 0..reps.max(1) + 1 {
        gpu.synchronize()?;
        let s = Instant::now();
        for &st in &streams {
            for _ in 0..PER_STREAM {
                gpu.launch(spin, ONE, ONE, 0, st, &[&p])?;
            }
        }
        gpu.synchronize()?;
        t.push(s.elapsed().as_secs_f64());
    }
    for st in streams {
        gpu.stream_destroy(st)?;
    }
    Ok(median(&mut t[1..]))
}

/// One copy: host to device (`true`) or back, between a device address
/// and host bytes, complete when it returns.
type Copy<'a> = dyn FnMut(bool, u64, &mut [u8]) -> Result<()> + 'a;

/// Medians (htod, dtoh) in seconds of `reps` copies of each of
/// [`COPY_SIZES`] from and to pageable memory, through `copy` (`true`:
/// host to device), checked.
fn copies(
    reps: usize,
    alloc: &mut dyn FnMut(u64) -> Result<u64>,
    copy: &mut Copy<'_>,
) -> Result<Vec<(f64, f64)>> {
    let mut out = Vec::new();
    for (name, size) in COPY_SIZES {
        let d = alloc(size as u64)?;
        let mut host: Vec<u8> = (0..size).map(|i| (i * 29 % 241) as u8).collect();
        let mut back = vec![0u8; size];
        let (mut h, mut b) = (Vec::new(), Vec::new());
        for _ in 0..reps.max(1) {
            let s = Instant::now();
            copy(true, d, &mut host)?;
            h.push(s.elapsed().as_secs_f64());
            let s = Instant::now();
            copy(false, d, &mut back)?;
            b.push(s.elapsed().as_secs_f64());
        }
        anyhow::ensure!(back == host, "{name} copy came back different");
        out.push((median(&mut h), median(&mut b)));
    }
    Ok(out)
}

/// [`copies`] natively, each copy complete when it returns.
pub(super) fn copies_native(ctx: &mut dyn Context, reps: usize) -> Result<Vec<(f64, f64)>> {
    let ctx = std::cell::RefCell::new(ctx);
    copies(
        reps,
        &mut |n| {
            ctx.borrow_mut()
                .alloc(n)
                .map_err(|e| anyhow::anyhow!("alloc: {e:?}"))
        },
        &mut |htod, d, buf| {
            let mut c = ctx.borrow_mut();
            let s = VolatileSlice::from(buf);
            let r = if htod {
                c.htod(d, &s, 0).and_then(|()| c.synchronize())
            } else {
                c.dtoh(&s, d, 0)
            };
            r.map_err(|e| anyhow::anyhow!("copy: {e:?}"))
        },
    )
}

/// [`copies`] through the guest client.
pub(super) fn copies_remote(gpu: &mut Gpu, reps: usize) -> Result<Vec<(f64, f64)>> {
    let gpu = std::cell::RefCell::new(gpu);
    copies(
        reps,
        &mut |n| Ok(gpu.borrow_mut().mem_alloc(n)?),
        &mut |htod, d, buf| {
            let mut g = gpu.borrow_mut();
            if htod {
                g.memcpy_htod(d, buf)?;
            } else {
                g.memcpy_dtoh(buf, d, 0)?;
            }
            Ok(())
        },
    )
}

/// One copy between a device address and the first `len` bytes of
/// pinned memory: host to device (`true`) or back, complete when it
/// returns.
type PinnedCopy<'a> = dyn FnMut(bool, u64, usize) -> Result<()> + 'a;

/// Medians (htod, dtoh) in seconds of `reps` copies of each of
/// [`COPY_SIZES`] from and to `pinned` (page-locked memory the device
/// reaches, at least [`PINNED_POOL`] bytes), through `copy`, checked.
fn pinned_copies(
    reps: usize,
    pinned: &VolatileSlice<'_>,
    alloc: &mut dyn FnMut(u64) -> Result<u64>,
    copy: &mut PinnedCopy<'_>,
) -> Result<Vec<(f64, f64)>> {
    let mut out = Vec::new();
    for (name, size) in COPY_SIZES {
        let d = alloc(size as u64)?;
        let host: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let (mut h, mut b) = (Vec::new(), Vec::new());
        for _ in 0..reps.max(1) {
            pinned.subslice(0, size)?.copy_from(&host);
            let s = Instant::now();
            copy(true, d, size)?;
            h.push(s.elapsed().as_secs_f64());
            pinned.subslice(0, 4096)?.copy_from(&[0u8; 4096]);
            let s = Instant::now();
            copy(false, d, size)?;
            b.push(s.elapsed().as_secs_f64());
        }
        let mut back = vec![0u8; size];
        pinned.subslice(0, size)?.copy_to(&mut back);
        anyhow::ensure!(back == host, "{name} pinned copy came back different");
        out.push((median(&mut h), median(&mut b)));
    }
    Ok(out)
}

/// [`pinned_copies`] natively: `pinned` was registered with the executor
/// (its device address, as the driver maps it, is the host address).
pub(super) fn pinned_copies_native(
    ctx: &mut dyn Context,
    pinned: &VolatileSlice<'_>,
    reps: usize,
) -> Result<Vec<(f64, f64)>> {
    let ctx = std::cell::RefCell::new(ctx);
    pinned_copies(
        reps,
        pinned,
        &mut |n| {
            ctx.borrow_mut()
                .alloc(n)
                .map_err(|e| anyhow::anyhow!("alloc: {e:?}"))
        },
        &mut |htod, d, len| {
            let mut c = ctx.borrow_mut();
            let s = pinned.subslice(0, len)?;
            let r = if htod {
                c.htod(d, &s, 0)
            } else {
                c.dtoh_async(&s, d, 0)
            };
            r.and_then(|()| c.synchronize())
                .map_err(|e| anyhow::anyhow!("pinned copy: {e:?}"))
        },
    )
}

/// [`pinned_copies`] through the guest client, from the region's pinned
/// pool (DMA straight from the pages the guest wrote).
pub(super) fn pinned_copies_remote(gpu: &mut Gpu, reps: usize) -> Result<Vec<(f64, f64)>> {
    let offset = gpu.pinned_alloc(PINNED_POOL)?;
    let region = gpu.region().clone();
    let pool = region.pinned()?;
    let pinned = pool.subslice(offset as usize, PINNED_POOL as usize)?;
    let gpu = std::cell::RefCell::new(gpu);
    let out = pinned_copies(
        reps,
        &pinned,
        &mut |n| Ok(gpu.borrow_mut().mem_alloc(n)?),
        &mut |htod, d, len| {
            let mut g = gpu.borrow_mut();
            if htod {
                g.memcpy_htod_pinned(d, offset, len as u64, 0)?;
            } else {
                g.memcpy_dtoh_pinned(d, offset, len as u64, 0)?;
            }
            g.synchronize()?;
            Ok(())
        },
    );
    gpu.borrow_mut().pinned_free(offset)?;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_the_runs_after_the_first() {
        let mut t = [9.0, 1.0, 3.0, 2.0];
        assert_eq!(median(&mut t[1..]), 2.0);
        assert!(median(&mut []).is_nan());
    }
}
