//! `fairvgpu bench placement --sim`: DCUDA's experiment on simulated GPUs.
//!
//! Four GPUs of 16 GiB; twenty applications of varied core demand (10-60%
//! of a GPU, alternating between a heavy phase and a light one at 40% of
//! it, as programs do) and memory demand (1-6 GiB), arriving one every
//! 5 s; each needs 30-120 s of GPU time at full speed. Where the cores
//! demanded on a GPU exceed 100%, every application there slows down in
//! proportion. An application that finds no GPU with room for its memory
//! waits. A migration pauses its application for 10 ms plus its memory at
//! 20 GB/s (peer copy).
//!
//! Policies, on the same 50 random arrival orders: least-loaded static
//! placement (placed once, memory-aware) and fairvgpu's
//! ([`scheduler::placement`]: the same placement, then hysteresis balancing
//! and compaction every 100 ms). Reported: overloaded time (GPU-seconds
//! with demand over 100%), average execution time, utilization of the GPUs
//! in use, migrations per application.

use anyhow::Result;
use scheduler::placement::{Demand, Params, Placer};

const GPUS: usize = 4;
const GIB: u64 = 1 << 30;
const APPS: usize = 20;
const ARRIVAL_S: f64 = 5.0;
const DT: f64 = 0.1;
const PEER_GBPS: f64 = 20.0;

/// One application of the experiment.
#[derive(Debug, Clone, Copy)]
struct App {
    cores: f64,
    memory: u64,
    work_s: f64,
    phase_s: f64,
}

fn apps(seed: u64) -> Vec<App> {
    let mut rng = Lcg(seed);
    (0..APPS)
        .map(|_| App {
            cores: 0.1 + 0.5 * rng.unit(),
            memory: (1 + (rng.unit() * 6.0) as u64).min(6) * GIB,
            work_s: 30.0 + 90.0 * rng.unit(),
            phase_s: 10.0 + 20.0 * rng.unit(),
        })
        .collect()
}

struct Lcg(u64);

impl Lcg {
    fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What one run of one policy gave.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    /// GPU-seconds during which a GPU's demand was over 100%.
    pub overloaded_s: f64,
    /// Mean of (finish - arrival), s.
    pub exec_s: f64,
    /// Mean over time of the busy fraction of the GPUs that had work.
    pub utilization: f64,
    /// Mean number of GPUs with work, while any had.
    pub gpus_in_use: f64,
    /// Migrations per application.
    pub migrations_per_app: f64,
}

/// The policies compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Least-loaded, memory-aware placement at arrival; never moved.
    Static,
    /// The same, then hysteresis balancing every 100 ms.
    BalanceOnly,
    /// Balancing and energy compaction (fairvgpu's default).
    Dcuda,
}

/// Simulates one arrival order under one policy.
fn simulate(apps: &[App], order: &[usize], policy: Policy) -> Outcome {
    let params = Params {
        compaction: policy == Policy::Dcuda,
        ..Params::default()
    };
    let mut placer = Placer::new(params, vec![16 * GIB; GPUS]);
    let balance = policy != Policy::Static;
    let n = apps.len();
    let arrival: Vec<f64> = {
        let mut a = vec![0.0; n];
        for (k, &i) in order.iter().enumerate() {
            a[i] = k as f64 * ARRIVAL_S;
        }
        a
    };
    let mut started: Vec<Option<f64>> = vec![None; n];
    let mut left: Vec<f64> = apps.iter().map(|a| a.work_s).collect();
    let mut pause = vec![0.0f64; n];
    let mut finish: Vec<Option<f64>> = vec![None; n];
    let mut waiting: Vec<usize> = Vec::new();
    let mut next_arrival = 0;
    let (mut overloaded, mut util_sum, mut util_n, mut in_use_sum) = (0.0, 0.0, 0usize, 0.0);
    let mut migrations = 0usize;
    let demand = |i: usize, t: f64, started: &[Option<f64>]| -> Demand {
        let a = apps[i];
        let since = t - started[i].unwrap_or(t);
        let heavy = ((since / a.phase_s) as u64).is_multiple_of(2);
        Demand {
            cores: if heavy { a.cores } else { 0.4 * a.cores },
            memory: a.memory,
        }
    };
    let mut t = 0.0;
    let mut step: u64 = 0;
    while finish.iter().any(Option::is_none) {
        // Arrivals, then those waiting for memory, in arrival order.
        while next_arrival < n && arrival[order[next_arrival]] <= t + 1e-9 {
            waiting.push(order[next_arrival]);
            next_arrival += 1;
        }
        waiting.retain(|&i| {
            let d = Demand {
                cores: apps[i].cores,
                memory: apps[i].memory,
            };
            if placer.place(i as u32, d).is_some() {
                started[i] = Some(t);
                false
            } else {
                true
            }
        });
        // Demands as the monitor sees them.
        for i in 0..n {
            if started[i].is_some() && finish[i].is_none() {
                placer.update(i as u32, demand(i, t, &started));
            }
        }
        if balance {
            for m in placer.balance((t * 1e9) as u64) {
                let i = m.vgpu as usize;
                pause[i] += 0.010 + apps[i].memory as f64 / (PEER_GBPS * 1e9);
                migrations += 1;
            }
        }
        // Progress over one interval.
        let mut busy_gpus = 0;
        let mut util = 0.0;
        for g in 0..GPUS {
            let on = placer.on(g);
            if on.is_empty() {
                continue;
            }
            let load = placer.load(g);
            busy_gpus += 1;
            util += load.min(1.0);
            if load > 1.0 + 1e-9 {
                overloaded += DT;
            }
            let rate = if load > 1.0 { 1.0 / load } else { 1.0 };
            for v in on {
                let i = v as usize;
                let mut dt = DT;
                if pause[i] > 0.0 {
                    let p = pause[i].min(dt);
                    pause[i] -= p;
                    dt -= p;
                }
                // An application progresses at its phase's pace: the light
                // phase has as much work per second as the heavy one.
                left[i] -= dt * rate;
                if left[i] <= 0.0 && finish[i].is_none() {
                    finish[i] = Some(t + DT);
                    placer.remove(v);
                }
            }
        }
        if busy_gpus > 0 {
            util_sum += util / busy_gpus as f64;
            in_use_sum += busy_gpus as f64;
            util_n += 1;
        }
        t += DT;
        step += 1;
        if step > 10_000_000 {
            break;
        }
    }
    let exec: f64 = (0..n)
        .map(|i| finish[i].unwrap_or(t) - arrival[i])
        .sum::<f64>()
        / n as f64;
    Outcome {
        overloaded_s: overloaded,
        exec_s: exec,
        utilization: util_sum / util_n.max(1) as f64,
        gpus_in_use: in_use_sum / util_n.max(1) as f64,
        migrations_per_app: migrations as f64 / n as f64,
    }
}

fn mean(v: &[Outcome]) -> Outcome {
    let k = v.len().max(1) as f64;
    let s = |f: fn(&Outcome) -> f64| v.iter().map(f).sum::<f64>() / k;
    Outcome {
        overloaded_s: s(|o| o.overloaded_s),
        exec_s: s(|o| o.exec_s),
        utilization: s(|o| o.utilization),
        gpus_in_use: s(|o| o.gpus_in_use),
        migrations_per_app: s(|o| o.migrations_per_app),
    }
}

/// Runs `orders` random arrival orders; returns the mean outcome of each
/// policy: (static, balancing only, balancing and compaction).
pub fn measure(orders: usize, seed: u64) -> (Outcome, Outcome, Outcome) {
    let set = apps(seed);
    let mut rng = Lcg(seed ^ 0x9e37_79b9_7f4a_7c15);
    let (mut st, mut bal, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..orders {
        let mut order: Vec<usize> = (0..APPS).collect();
        for i in (1..order.len()).rev() {
            let j = (rng.unit() * (i + 1) as f64) as usize;
            order.swap(i, j.min(i));
        }
        st.push(simulate(&set, &order, Policy::Static));
        bal.push(simulate(&set, &order, Policy::BalanceOnly));
        ours.push(simulate(&set, &order, Policy::Dcuda));
    }
    (mean(&st), mean(&bal), mean(&ours))
}

/// Prints the comparison and the summary line.
pub fn run(orders: usize) -> Result<()> {
    println!(
        "placement ({GPUS} simulated GPUs of 16 GiB, {APPS} applications arriving every {ARRIVAL_S} s, {orders} random orders)"
    );
    let (st, bal, ours) = measure(orders, 2019);
    println!(
        "{:<28} {:>14} {:>12} {:>12} {:>10} {:>12}",
        "policy", "overloaded s", "exec s", "utilization", "GPUs used", "migr/app"
    );
    for (name, o) in [
        ("least-loaded static", st),
        ("balancing, no compaction", bal),
        ("fairvgpu (DCUDA)", ours),
    ] {
        println!(
            "{name:<28} {:>14.1} {:>12.1} {:>11.1}% {:>10.2} {:>12.2}",
            o.overloaded_s,
            o.exec_s,
            o.utilization * 100.0,
            o.gpus_in_use,
            o.migrations_per_app
        );
    }
    let red = |a: f64, b: f64| if a > 0.0 { (a - b) / a * 100.0 } else { 0.0 };
    println!(
        "overloaded_time_reduction={:.1}% exec_time_reduction={:.1}% migrations_per_app={:.2}",
        red(st.overloaded_s, ours.overloaded_s),
        red(st.exec_s, ours.exec_s),
        ours.migrations_per_app
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balancing_cuts_overload_and_execution_time() {
        let (st, _, ours) = measure(6, 7);
        assert!(
            st.overloaded_s > 0.0,
            "the scenario overloads static placement"
        );
        assert!(
            ours.overloaded_s < 0.75 * st.overloaded_s,
            "{st:?} {ours:?}"
        );
        assert!(ours.exec_s < st.exec_s, "{st:?} {ours:?}");
        assert!(ours.migrations_per_app > 0.0 && ours.migrations_per_app < 10.0);
    }
}
