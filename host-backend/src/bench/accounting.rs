//! `fairvgpu bench accounting`: how accurate and how cheap sampled
//! accounting is. The same guest workload runs three times through a
//! worker: with no scheduler (nothing accounted), with the scheduler
//! measuring one launch in `SAMPLE_EVERY` of each function with CUDA events
//! and charging the others the last measurement, and with every launch
//! measured by events (the reference). The error is the sampled charge per
//! launch against the reference's; the overheads are time per kernel
//! against the unaccounted run.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use qemu_ivshmem::SpinPolicy;

use super::fairness::{run_guests, GuestBody, Round, Setup, ONE};
use crate::config::ExecutorKind;
use crate::worker::SAMPLE_EVERY;

/// The workloads: (name, body).
fn workloads() -> Vec<(&'static str, Arc<GuestBody>)> {
    let batch = |name: &'static str, per_sync: usize, dur: fn(u64) -> u64| {
        let body: Arc<GuestBody> = Arc::new(move |_, gpu, f, end| {
            let mut n = 0u64;
            while Instant::now() < end {
                for _ in 0..per_sync {
                    let ns = dur(n).to_le_bytes();
                    gpu.launch(f, ONE, ONE, 0, 0, &[&ns])?;
                    n += 1;
                }
                gpu.synchronize()?;
            }
            Ok(n)
        });
        (name, body)
    };
    vec![
        batch("20us x64 async", 64, |_| 20_000),
        // Durations 10..200 us from a fixed sequence: one function whose
        // time depends on its arguments, the hard case for sampling.
        batch("10-200us x16 async", 16, |n| {
            10_000 + (n.wrapping_mul(2_654_435_761) >> 7) % 190_000
        }),
        batch("400us sync", 1, |_| 400_000),
    ]
}

fn per_launch(r: &Round) -> (f64, f64) {
    let s = &r.stats[0];
    let launches = s.launches.load(Ordering::Relaxed).max(1) as f64;
    let charged = s.charged_ns.load(Ordering::Relaxed) as f64;
    (charged / launches, r.secs / r.kernels[0].max(1) as f64)
}

/// Runs the bench; the last line is machine-readable.
pub fn run(kind: ExecutorKind, secs: f64, spin: SpinPolicy) -> Result<()> {
    println!(
        "sampled accounting ({kind:?} executor): one launch in {SAMPLE_EVERY} measured vs every launch, {secs} s per run"
    );
    println!(
        "{:<20} {:>12} {:>12} {:>8} {:>10} {:>10}",
        "workload", "sampled_us", "events_us", "err_%", "t_sampled", "t_every"
    );
    let (mut worst_err, mut worst_sampled, mut worst_every) = (0f64, 0f64, 0f64);
    for (name, body) in workloads() {
        let go = |fair, sample_every| {
            let setup = Setup {
                kind,
                weights: &[1.0],
                fair,
                sample_every,
                secs,
                spin,
            };
            run_guests(setup, &[0], body.clone())
        };
        let none = go(false, SAMPLE_EVERY)?;
        let sampled = go(true, SAMPLE_EVERY)?;
        let every = go(true, 1)?;
        let (_, t_none) = per_launch(&none);
        let (c_s, t_s) = per_launch(&sampled);
        let (c_e, t_e) = per_launch(&every);
        let err = 100.0 * (c_s - c_e).abs() / c_e.max(1.0);
        let (o_s, o_e) = (t_s / t_none, t_e / t_none);
        println!(
            "{name:<20} {:>12.3} {:>12.3} {:>8.3} {:>10.3} {:>10.3}",
            c_s / 1e3,
            c_e / 1e3,
            err,
            o_s,
            o_e
        );
        worst_err = worst_err.max(err);
        worst_sampled = worst_sampled.max(o_s);
        worst_every = worst_every.max(o_e);
    }
    println!("t_*: time per kernel relative to the same workload with no scheduler");
    println!(
        "accounting_error_pct={worst_err:.3} sampling_overhead={worst_sampled:.3} every_request_overhead={worst_every:.3}"
    );
    Ok(())
}
