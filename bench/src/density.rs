//! `fairvgpu bench fairness --density`: VMs packed onto one GPU, each
//! running an ordinary latency-bound loop (a small kernel over a 4 MiB
//! buffer, then a synchronous 4 MiB copy back, checked every round: the
//! shape of a small inference server), under fairvgpu's scheduler and
//! under none, in one run; then the mix: weights 1:2:3 among three such
//! loops, and one GPU-bound guest (long kernels, no pauses) among seven.
//!
//! Throughput is the VMs' rounds together against the same VMs without a
//! scheduler in the same run. MMR is the weighted max-min ratio of the
//! rounds. A guest's share in the mix is its GPU time (rounds, or kernels,
//! times its own device time per round measured alone) over the round's
//! length, against its max-min fair share: the GPU split by weight, no
//! guest getting more than it asks for alone (water-filling).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Result};
use guest::DevPtr;
use protocol::{Dim3, ImageKind};

use daemon::config::{ExecutorKind, GraphLaunches};
use transport::SpinPolicy;
use worker::KERNELS_PTX;

use super::fairness::{run_guests, GuestBody, Round, Setup, ONE};

/// Floats in a loop's buffer on a GPU (4 MiB).
const N_GPU: u32 = 1 << 20;
/// On the sim, whose kernels compute on the worker's CPU: 64 KiB, and a
/// spin kernel of [`SIM_KERNEL_NS`] after the sum stands for the device
/// time the larger one would take.
const N_SIM: u32 = 1 << 14;
const SIM_KERNEL_NS: u64 = 100_000;
/// Waiting for a reply, guests and workers poll this long before they
/// sleep: many VMs share the host's CPUs, as VMs do (the demo's policy).
pub(crate) const SPIN: SpinPolicy = SpinPolicy {
    spins: 2_000,
    max_block_us: 2_000,
};
/// The GPU-bound guest's kernel, ns.
const LONG_KERNEL_NS: u64 = 1_600_000;

/// What the density and mix scenarios are run with.
#[derive(Debug, Clone, Copy)]
pub struct Options<'a> {
    pub kind: ExecutorKind,
    /// Seconds per round.
    pub secs: f64,
    pub graphs: GraphLaunches,
    pub slice_ns: u64,
    /// VM counts of the density scenario.
    pub vms: &'a [usize],
    pub sharing: sched::Sharing,
}

/// What the scenarios found (the last line's figures).
#[derive(Debug, Clone, Copy, Default)]
pub struct Figures {
    pub vms: usize,
    pub throughput: f64,
    pub mmr: f64,
    pub mix_throughput: f64,
    pub mix_min_share: f64,
}

/// The latency-bound loop: `vector_add` over 4 MiB (on the sim 64 KiB and
/// a spin kernel), the result copied back and checked, each round; guest
/// `g`'s rounds.
pub fn latency_loop(kind: ExecutorKind) -> Arc<GuestBody> {
    let sim = kind == ExecutorKind::Sim;
    let n: u32 = if sim { N_SIM } else { N_GPU };
    Arc::new(move |g, gpu, spin, end| {
        let m = gpu.module_load(ImageKind::Ptx, KERNELS_PTX.as_bytes())?;
        let add = gpu.get_function(m, "vector_add")?;
        let bytes = u64::from(n) * 4;
        let (a, b, c) = (
            gpu.mem_alloc(bytes)?,
            gpu.mem_alloc(bytes)?,
            gpu.mem_alloc(bytes)?,
        );
        let av: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let bv: Vec<u8> = (0..n)
            .flat_map(|i| ((g as u32 + 1) as f32 * (i % 7) as f32).to_le_bytes())
            .collect();
        gpu.memcpy_htod(a, &av)?;
        gpu.memcpy_htod(b, &bv)?;
        let mut out = vec![0u8; bytes as usize];
        let grid = Dim3 {
            x: n.div_ceil(256),
            y: 1,
            z: 1,
        };
        let block = Dim3 { x: 256, y: 1, z: 1 };
        let mut rounds = 0u64;
        while Instant::now() < end {
            let p = |d: DevPtr| d.to_le_bytes();
            gpu.launch(
                &add,
                grid,
                block,
                0,
                0,
                &[&p(a), &p(b), &p(c), &n.to_le_bytes()],
            )?;
            if sim {
                gpu.launch(spin, ONE, ONE, 0, 0, &[&SIM_KERNEL_NS.to_le_bytes()])?;
            }
            gpu.memcpy_dtoh(&mut out, c, 0)?;
            // Check one element a round, a different one each time.
            let i = (rounds.wrapping_mul(7919) % u64::from(n)) as usize;
            let got = f32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap_or([0; 4]));
            let want = i as f32 + (g as u32 + 1) as f32 * (i % 7) as f32;
            ensure!(got == want, "guest {g}: element {i} is {got}, not {want}");
            rounds += 1;
        }
        Ok(rounds)
    })
}

/// The GPU-bound guest: long kernels launched and synchronized back to back.
fn gpu_bound_loop() -> Arc<GuestBody> {
    super::fairness::spin_sync_loop(|_| LONG_KERNEL_NS)
}

fn setup<'a>(o: &Options<'a>, weights: &'a [f64], fair: bool, secs: f64) -> Setup<'a> {
    Setup {
        kind: o.kind,
        weights,
        fair,
        sample_every: worker::serve::SAMPLE_EVERY,
        time_launches: false,
        slice_ns: o.slice_ns,
        secs,
        spin: SPIN,
        graphs: o.graphs,
        mps: false,
        sharing: o.sharing,
        lift: None,
        guest_cpus: None,
    }
}

/// Rounds per second of each guest.
fn rates(r: &Round) -> Vec<f64> {
    r.kernels
        .iter()
        .zip(&r.loop_secs)
        .map(|(&n, &s)| n as f64 / s.max(1e-9))
        .collect()
}

/// The GPU time one unit of each guest's work takes (ns), from its own
/// worker's charges alone.
fn unit_ns(r: &Round, g: usize) -> f64 {
    r.stats[g].charged_ns.load(Ordering::Relaxed) as f64 / r.kernels[g].max(1) as f64
}

/// Max-min fair shares of the GPU: split by weight, none above its demand
/// (water-filling).
pub fn max_min_shares(demand: &[f64], weights: &[f64]) -> Vec<f64> {
    let mut share = vec![0.0; demand.len()];
    let mut open: Vec<usize> = (0..demand.len()).collect();
    let mut left = 1.0f64;
    while !open.is_empty() && left > 1e-12 {
        let w: f64 = open.iter().map(|&i| weights[i]).sum();
        let capped: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&i| demand[i] - share[i] <= left * weights[i] / w)
            .collect();
        if capped.is_empty() {
            for &i in &open {
                share[i] += left * weights[i] / w;
            }
            break;
        }
        for &i in &capped {
            left -= demand[i] - share[i];
            share[i] = demand[i];
        }
        open.retain(|i| !capped.contains(i));
    }
    share
}

/// N latency-bound VMs, equal weights, scheduled and not: (throughput
/// against unscheduled, weighted MMR of the rounds).
pub fn density(o: &Options<'_>, n: usize) -> Result<(f64, f64)> {
    let weights = vec![1.0; n];
    let which: Vec<usize> = (0..n).collect();
    let fair = run_guests(
        setup(o, &weights, true, o.secs),
        &which,
        latency_loop(o.kind),
    )?;
    let none = run_guests(
        setup(o, &weights, false, o.secs),
        &which,
        latency_loop(o.kind),
    )?;
    let (f, u) = (rates(&fair), rates(&none));
    let (fs, us): (f64, f64) = (f.iter().sum(), u.iter().sum());
    let mmr = sched::weighted_mmr(&f, &weights);
    println!(
        "density vms={n}: rounds/s fairvgpu {fs:.0} none {us:.0}; throughput_vs_unscheduled={:.3} mmr={mmr:.3} (none {:.3}); per VM fairvgpu {}",
        fs / us.max(1e-9),
        sched::weighted_mmr(&u, &weights),
        f.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(" ")
    );
    print_charges(&fair, n);
    Ok((fs / us.max(1e-9), mmr))
}

/// What the grant service charged each VM of a density round and its
/// grants: equal charges with unequal rounds point at the charge per
/// round (how a VM's device time is found), unequal charges at the queue.
fn print_charges(fair: &Round, n: usize) {
    let per_vm = |f: &dyn Fn(&daemon::grant::VgpuLive) -> String| {
        (0..n)
            .map(|g| fair.service.get(&(g as u32)).map_or("-".into(), f))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "density vms={n}: charged ms per VM {}",
        per_vm(&|v| format!("{:.0}", v.charged_ns as f64 / 1e6))
    );
    println!(
        "density vms={n}: charged us a round per VM {}",
        (0..n)
            .map(|g| format!("{:.0}", unit_ns(fair, g) / 1e3))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "density vms={n}: grants per VM {}",
        per_vm(&|v| v.grants.to_string())
    );
}

/// One mix round: guests `which` of `weights`, guest 0 GPU-bound if
/// `gpu_bound`; prints each one's share against its max-min fair share and
/// returns (throughput against unscheduled, smallest of those ratios).
fn mix(o: &Options<'_>, name: &str, weights: &[f64], gpu_bound: bool) -> Result<(f64, f64)> {
    let which: Vec<usize> = (0..weights.len()).collect();
    let body = |g_bound: bool| -> Arc<GuestBody> {
        let (lat, gpu) = (latency_loop(o.kind), gpu_bound_loop());
        Arc::new(move |g, gp, f, end| {
            if g_bound && g == 0 {
                gpu(g, gp, f, end)
            } else {
                lat(g, gp, f, end)
            }
        })
    };
    // Each kind alone, for its demand and its GPU time per unit of work.
    let solo_lat = run_guests(setup(o, weights, true, o.secs / 2.0), &[1], body(gpu_bound))?;
    let lat_rate = rates(&solo_lat)[0];
    let lat_ns = unit_ns(&solo_lat, 0);
    let (bound_rate, bound_ns) = if gpu_bound {
        let s = run_guests(setup(o, weights, true, o.secs / 2.0), &[0], body(true))?;
        (rates(&s)[0], unit_ns(&s, 0))
    } else {
        (lat_rate, lat_ns)
    };
    let unit = |g: usize| {
        if gpu_bound && g == 0 {
            bound_ns
        } else {
            lat_ns
        }
    };
    let alone = |g: usize| {
        if gpu_bound && g == 0 {
            bound_rate
        } else {
            lat_rate
        }
    };
    let demand: Vec<f64> = which
        .iter()
        .map(|&g| (alone(g) * unit(g) / 1e9).min(1.0))
        .collect();
    let fair_share = max_min_shares(&demand, weights);
    let fair = run_guests(setup(o, weights, true, o.secs), &which, body(gpu_bound))?;
    let none = run_guests(setup(o, weights, false, o.secs), &which, body(gpu_bound))?;
    let mut worst = f64::INFINITY;
    let mut line = Vec::new();
    let mut work = (0.0, 0.0);
    for &g in &which {
        let got = |r: &Round| rates(r)[g] * unit(g) / 1e9;
        let (sf, sn) = (got(&fair), got(&none));
        let ratio = (sf / fair_share[g].max(1e-9)).min(1.0);
        worst = worst.min(ratio);
        work.0 += rates(&fair)[g] / alone(g);
        work.1 += rates(&none)[g] / alone(g);
        // What the scheduler saw: its charges a second.
        let charged = fair.stats[g].charged_ns.load(Ordering::Relaxed) as f64
            / 1e9
            / fair.loop_secs[g].max(1e-9);
        line.push(format!(
            "{g}(w{}) {sf:.3}/{:.3} none {sn:.3} charged {charged:.3}",
            weights[g], fair_share[g]
        ));
    }
    let throughput = work.0 / f64::max(work.1, 1e-9);
    println!(
        "mix {name}: GPU share fairvgpu/max-min fair: {}; throughput_vs_unscheduled={throughput:.3} min_share={worst:.3}",
        line.join(", ")
    );
    Ok((throughput, worst))
}

/// Runs the density scenario for each count and the two mixes; returns the
/// largest count's figures and the mixes' worst.
pub fn run(o: Options<'_>) -> Result<Figures> {
    println!(
        "density and mix ({:?} executor, {:?} sharing, {} s per round, {} ms slices): a kernel over 4 MiB and a synchronous 4 MiB copy back per round",
        o.kind,
        o.sharing,
        o.secs,
        o.slice_ns as f64 / 1e6
    );
    let mut fig = Figures::default();
    for &n in o.vms {
        let (t, m) = density(&o, n)?;
        fig = Figures {
            vms: n,
            throughput: t,
            mmr: m,
            ..fig
        };
    }
    (fig.mix_throughput, fig.mix_min_share) = mixes(&o)?;
    Ok(fig)
}

/// The two mixes: weights 1:2:3 among three latency-bound guests, and one
/// GPU-bound guest among seven latency-bound ones. Returns the worst of
/// their throughputs against unscheduled and of their shares against
/// max-min fair.
pub fn mixes(o: &Options<'_>) -> Result<(f64, f64)> {
    let (t1, s1) = mix(o, "weights 1:2:3", &[1.0, 2.0, 3.0], false)?;
    let (t2, s2) = mix(o, "1 GPU-bound among 7", &[1.0; 8], true)?;
    Ok((t1.min(t2), s1.min(s2)))
}

#[cfg(test)]
mod tests {
    use super::max_min_shares;

    #[test]
    fn water_filling_gives_the_leftover_to_those_that_want_more() {
        let s = max_min_shares(&[0.1, 0.1, 1.0], &[1.0, 1.0, 1.0]);
        assert!((s[0] - 0.1).abs() < 1e-9 && (s[1] - 0.1).abs() < 1e-9);
        assert!((s[2] - 0.8).abs() < 1e-9, "{s:?}");
        // Saturated by weight: 1:2:3.
        let s = max_min_shares(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]);
        assert!(
            (s[0] - 1.0 / 6.0).abs() < 1e-9 && (s[2] - 0.5).abs() < 1e-9,
            "{s:?}"
        );
        // Nobody saturates: each its demand.
        let s = max_min_shares(&[0.2, 0.3, 0.1], &[1.0, 2.0, 3.0]);
        assert_eq!(s, vec![0.2, 0.3, 0.1]);
    }
}
