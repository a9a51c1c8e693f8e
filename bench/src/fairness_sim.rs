//! `fairvgpu bench fairness --sim`: FairGV's scenarios in the discrete-event
//! simulator (`sched_sim::time`), every policy side by side. The ideal each
//! row is measured against (each VM alone, and weighted water-filling) is
//! computed in the same run; see `sched_sim::time::scenario` for the figures.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::Result;
use sched_sim::time::scenario::{
    evaluate, paper_scenarios, Outcome, Scenario, SoloCache, POLICIES,
};
use sched_sim::time::{Machine, Policy};

/// Runs every scenario under every policy for `seconds` of simulated time;
/// the last line is machine-readable.
pub fn run(seconds: f64) -> Result<()> {
    let duration = (seconds * 1e9) as u64;
    let m = Machine::default();
    let scenarios = paper_scenarios();
    let jobs: Vec<(usize, Policy)> = scenarios
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            POLICIES
                .iter()
                .chain(&s.extra_policies)
                .map(move |&p| (i, p))
        })
        .collect();
    let results: Mutex<Vec<Option<Outcome>>> = Mutex::new(vec![None; jobs.len()]);
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    let mut solos = SoloCache::default();
                    loop {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(scn, policy)) = jobs.get(j) else {
                            return Ok(());
                        };
                        let out = evaluate(&scenarios[scn], policy, &m, duration, &mut solos)?;
                        results.lock().map_err(|_| anyhow::anyhow!("poisoned"))?[j] = Some(out);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("simulation thread panicked"))??;
        }
        Ok(())
    })?;
    let results = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("poisoned"))?;
    print_table(&scenarios, &jobs, &results);
    Ok(())
}

fn print_table(scenarios: &[Scenario], jobs: &[(usize, Policy)], results: &[Option<Outcome>]) {
    println!(
        "simulated: {} scenarios x {} policies; MMR = min/max of throughput over entitlement, \
         overhead = ideal/measured aggregate throughput",
        scenarios.len(),
        POLICIES.len()
    );
    println!(
        "{:<20} {:<34} {:>6} {:>8} {:>8}  throughput/ideal per VM (fractions of solo)",
        "policy", "scenario", "MMR", "overhead", "gpu_util"
    );
    let mut fair_mmr_min = f64::INFINITY;
    let mut fair_over_max: f64 = 0.0;
    let mut baseline_min: Vec<(Policy, f64)> = Vec::new();
    for (&(scn, policy), out) in jobs.iter().zip(results) {
        let Some(o) = out else { continue };
        let per_vm: Vec<String> = o
            .normalized
            .iter()
            .zip(&o.ideal)
            .map(|(n, e)| format!("{n:.3}/{e:.3}"))
            .collect();
        println!(
            "{:<20} {:<34} {:>6.3} {:>8.3} {:>8.3}  {}",
            policy.name(),
            scenarios[scn].name,
            o.mmr,
            o.overhead,
            o.gpu_util,
            per_vm.join(" ")
        );
        match policy {
            Policy::FairGv => {
                fair_mmr_min = fair_mmr_min.min(o.mmr);
                fair_over_max = fair_over_max.max(o.overhead);
            }
            Policy::FairGvNoWc | Policy::FairGvGpuCharge => {}
            p => match baseline_min.iter_mut().find(|(q, _)| *q == p) {
                Some((_, m)) => *m = m.min(o.mmr),
                None => baseline_min.push((p, o.mmr)),
            },
        }
    }
    for (p, m) in &baseline_min {
        println!("{}: worst MMR {m:.3}", p.name());
    }
    let best_baseline = baseline_min.iter().map(|(_, m)| *m).fold(0.0, f64::max);
    println!(
        "fairgv_mmr_min={fair_mmr_min:.3} fairgv_overhead_max={fair_over_max:.3} \
         best_baseline_mmr_min={best_baseline:.3}"
    );
}
