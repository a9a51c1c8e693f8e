//! `fairvgpu bench placement --sim`: DCUDA's experiment on simulated GPUs.
//!
//! The workload, the model and the policies are in
//! [`sched_sim::placement`]: four GPUs, twenty applications of about
//! 30 s arriving one every 5 s, 50 random orders, a core-intensive and a
//! memory-intensive mix. Printed: one table per mix (overloaded
//! GPU-seconds, mean execution time, utilization of the GPUs in use, GPUs
//! in use, migrations per application, peak memory of any GPU), a sweep of
//! the core-demand scale that sets how much of the overload is imbalance
//! rather than excess, and the summary line as DCUDA reports its figures:
//! overloaded time reduced on average over the two mixes (pooled), execution
//! time reduced by up to (the better mix), both against least-loaded static.

use anyhow::Result;
use sched_sim::placement::{self as sim, Mix, Outcome, Policy, Setup};

const SEED: u64 = 2019;

fn table(mix: Mix, rows: &[Outcome]) {
    println!(
        "{:<30} {:>12} {:>8} {:>11} {:>9} {:>9} {:>9}",
        "policy", "overloaded s", "exec s", "utilization", "GPUs used", "migr/app", "peak mem"
    );
    for (p, o) in Policy::ALL.iter().zip(rows) {
        println!(
            "{:<30} {:>12.1} {:>8.1} {:>10.1}% {:>9.2} {:>9.2} {:>8.0}%",
            p.name(),
            o.overloaded_s,
            o.exec_s,
            o.utilization * 100.0,
            o.gpus_in_use,
            o.migrations_per_app,
            o.peak_memory * 100.0
        );
    }
    let (st, ours) = (rows[0], rows[Policy::ALL.len() - 1]);
    println!(
        "{mix:?} mix: overloaded time -{:.1}%, execution time -{:.1}% (fairvgpu vs least-loaded static)",
        sim::reduction(st.overloaded_s, ours.overloaded_s),
        sim::reduction(st.exec_s, ours.exec_s)
    );
}

/// Prints the comparison, the sweep and the summary line.
pub fn run(orders: usize) -> Result<()> {
    let setup = Setup::default();
    println!(
        "placement ({} simulated GPUs of {} GiB, {} applications of ~30 s arriving every {} s, {orders} random orders)",
        sim::GPUS,
        sim::GPU_MEMORY >> 30,
        sim::APPS,
        sim::ARRIVAL_S
    );
    let mut all = Vec::new();
    for mix in [Mix::Core, Mix::Memory] {
        println!();
        let alone = sim::workload(mix, SEED, 1.0)
            .iter()
            .map(|a| a.work_s)
            .sum::<f64>()
            / sim::APPS as f64;
        println!("{mix:?}-intensive mix (mean execution time alone: {alone:.1} s)");
        let rows = sim::measure(mix, orders, SEED, 1.0, setup);
        table(mix, &rows);
        all.push(rows);
    }
    println!();
    println!("sweep: core demand scale (core mix; static vs fairvgpu)");
    println!(
        "{:>6} {:>12} {:>12} {:>10} {:>10} {:>9}",
        "scale", "static ovl s", "ours ovl s", "ovl red.", "exec red.", "migr/app"
    );
    for scale in [0.6, 0.8, 1.0, 1.2, 1.4, 1.6] {
        let r = sim::measure(Mix::Core, orders.min(20), SEED, scale, setup);
        let (st, ours) = (r[0], r[Policy::ALL.len() - 1]);
        println!(
            "{scale:>6.1} {:>12.1} {:>12.1} {:>9.1}% {:>9.1}% {:>9.2}",
            st.overloaded_s,
            ours.overloaded_s,
            sim::reduction(st.overloaded_s, ours.overloaded_s),
            sim::reduction(st.exec_s, ours.exec_s),
            ours.migrations_per_app
        );
    }
    println!();
    println!(
        "sweep: unified-memory thrashing per 100% oversubscribed (memory mix; static vs fairvgpu)"
    );
    println!(
        "{:>6} {:>12} {:>12} {:>10}",
        "thrash", "static exec", "ours exec", "exec red."
    );
    for thrash in [2.0, 5.0, 10.0, 20.0, 40.0] {
        let s = Setup { thrash, ..setup };
        let r = sim::measure(Mix::Memory, orders.min(20), SEED, 1.0, s);
        let (st, ours) = (r[0], r[Policy::ALL.len() - 1]);
        println!(
            "{thrash:>6.0} {:>12.1} {:>12.1} {:>9.1}%",
            st.exec_s,
            ours.exec_s,
            sim::reduction(st.exec_s, ours.exec_s)
        );
    }
    println!();
    println!("sweep: kernel occupancy, contexts time-sliced (core mix; static vs fairvgpu)");
    println!(
        "{:>9} {:>12} {:>12} {:>10} {:>10}",
        "occupancy", "static exec", "ours exec", "exec red.", "ovl red."
    );
    for occupancy in [1.0, 0.75, 0.5] {
        let s = Setup { occupancy, ..setup };
        let r = sim::measure(Mix::Core, orders.min(20), SEED, 1.0, s);
        let (st, ours) = (r[0], r[Policy::ALL.len() - 1]);
        println!(
            "{occupancy:>9.2} {:>12.1} {:>12.1} {:>9.1}% {:>9.1}%",
            st.exec_s,
            ours.exec_s,
            sim::reduction(st.exec_s, ours.exec_s),
            sim::reduction(st.overloaded_s, ours.overloaded_s)
        );
    }
    let last = Policy::ALL.len() - 1;
    let st_ovl: f64 = all.iter().map(|r| r[0].overloaded_s).sum();
    let our_ovl: f64 = all.iter().map(|r| r[last].overloaded_s).sum();
    let exec_best = all
        .iter()
        .map(|r| sim::reduction(r[0].exec_s, r[last].exec_s))
        .fold(f64::MIN, f64::max);
    let migr = all.iter().map(|r| r[last].migrations_per_app).sum::<f64>() / all.len() as f64;
    println!();
    println!(
        "overloaded_time_reduction={:.1}% exec_time_reduction={:.1}% migrations_per_app={:.2}",
        sim::reduction(st_ovl, our_ovl),
        exec_best,
        migr
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_runs_on_a_few_orders() {
        run(2).unwrap();
    }
}
