//! The scenarios of issue 20 in the space simulator, their figures, and
//! the device-level policies side by side on FairGV's scenarios.
//!
//! A guest's *normalized throughput* n_i is its iterations in the shared
//! run over its iterations alone (the GPU to itself, same time). Its
//! *entitlement* is weighted water-filling ([`entitlements`]) of the GPU's
//! capacity over the guests' demands, where a demand is counted in what the
//! sharing charges: under time slices a busy guest holds the whole GPU
//! (demand 1); co-running, it holds its [`Demand::share`] (SM-time). Then
//! x_i = n_i / (e_i / d_i), MMR = min x / max x, and the aggregate
//! throughput is the sum of the n_i.

use std::fmt::Write as _;

use sched::corun::Demand;
use sched::{mmr, DevicePolicy};

use super::{run, Gpu, Guest, Op, Setup, Sharing, Stats};
use crate::time::scenario::{self, entitlements, paper_scenarios, SoloCache};
use crate::time::{Machine, Policy};
use crate::SimError;

/// One setup on one scenario.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Per-guest normalized throughput.
    pub normalized: Vec<f64>,
    /// Per-guest ideal normalized throughput (entitlement over demand).
    pub ideal: Vec<f64>,
    /// Sum of the normalized throughputs.
    pub aggregate: f64,
    /// Min-Max Ratio of throughput over entitlement.
    pub mmr: f64,
    /// The raw run.
    pub stats: Stats,
}

/// Runs `setup` on `guests` and computes its figures.
pub fn evaluate(
    guests: &[Guest],
    gpu: &Gpu,
    setup: Setup,
    duration_ns: u64,
) -> Result<Outcome, SimError> {
    let stats = run(guests, gpu, setup, duration_ns)?;
    let alone = Setup::new(DevicePolicy::FairQueue, Sharing::TimeSliced);
    let mut normalized = Vec::new();
    let mut demand = Vec::new();
    for (i, g) in guests.iter().enumerate() {
        let solo = run(std::slice::from_ref(g), gpu, alone, duration_ns)?;
        normalized.push(stats.iters[i] as f64 / solo.iters[0].max(1) as f64);
        let d: Demand = g.demand(gpu);
        demand.push(match setup.sharing {
            Sharing::CoRun if d.corun_ok => d.share(),
            _ => 1.0,
        });
    }
    let weights: Vec<f64> = guests.iter().map(|g| g.weight).collect();
    let e = entitlements(&weights, &demand);
    let ideal: Vec<f64> = e.iter().zip(&demand).map(|(e, d)| e / d).collect();
    let x: Vec<f64> = normalized.iter().zip(&ideal).map(|(n, t)| n / t).collect();
    Ok(Outcome {
        aggregate: normalized.iter().sum(),
        mmr: mmr(&x),
        normalized,
        ideal,
        stats,
    })
}

/// A loop of one kernel of `sms` SMs and `ns`.
fn kernel_loop(sms: u32, ns: u64) -> Vec<Op> {
    vec![Op::Kernel {
        sms,
        ns,
        mem_bw: 0.02 * f64::from(sms) / 8.0,
    }]
}

/// Guests of `weights` all running `ops`.
fn same(ops: &[Op], weights: &[f64]) -> Vec<Guest> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| Guest::new(&format!("g{i}"), ops.to_vec(), w))
        .collect()
}

/// Four guests launching 1 ms kernels of 8 blocks (one per SM: 8 SMs) at
/// weights 1:1:2:4, the H100 experiment of issue 20.
pub fn small_kernels() -> Vec<Guest> {
    same(&kernel_loop(8, 1_000_000), &[1.0, 1.0, 2.0, 4.0])
}

/// Three guests launching 1 ms kernels that fill all 132 SMs, 1:2:3.
pub fn full_gpu_kernels() -> Vec<Guest> {
    let ops = [Op::Kernel {
        sms: 132,
        ns: 1_000_000,
        mem_bw: 0.3,
    }];
    same(&ops, &[1.0, 2.0, 3.0])
}

/// A copy-heavy guest (4 ms of copies, then a 1 ms full-GPU kernel) and a
/// compute-heavy one (1 ms full-GPU kernels), 1:1.
pub fn copy_and_compute() -> Vec<Guest> {
    let kernel = Op::Kernel {
        sms: 132,
        ns: 1_000_000,
        mem_bw: 0.3,
    };
    vec![
        Guest::new("copier", vec![Op::Copy { ns: 4_000_000 }, kernel], 1.0),
        Guest::new("computer", vec![kernel], 1.0),
    ]
}

fn row(out: &mut String, scn: &str, setup: &str, o: &Outcome) {
    let per: Vec<String> = o
        .normalized
        .iter()
        .zip(&o.ideal)
        .map(|(n, e)| format!("{n:.3}/{e:.3}"))
        .collect();
    let _ = writeln!(
        out,
        "{scn:<26} {setup:<18} {:>9.3} {:>6.3} {:>7}  {}",
        o.aggregate,
        o.mmr,
        o.stats.max_holders,
        per.join(" ")
    );
}

/// Runs every scenario and returns the table; its last line is
/// `corun_speedup=… corun_mmr=… phase_speedup=…`, where `corun_mmr` is the
/// smaller of the two MMRs of the small-kernel scenario (time-sliced and
/// co-running; the issue asks for both to be at least 0.95).
pub fn report() -> Result<String, SimError> {
    let gpu = Gpu::default();
    // Ten simulated seconds: a round of slices in proportion to weight
    // (6 + 6 + 12 + 24 ms at 1:1:2:4) ends mid-way at the window's edge,
    // which over 2 s moved the time-sliced MMR by up to 0.03.
    let dur = 10_000_000_000;
    let ts = Setup::new(DevicePolicy::FairQueue, Sharing::TimeSliced);
    let co = Setup::new(DevicePolicy::FairQueue, Sharing::CoRun);
    let phase = Setup::new(DevicePolicy::PhaseSelection, Sharing::CoRun);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "space sharing on a simulated H100 ({} SMs, {} copy engines, {} us context switch, {} ms slices)",
        gpu.sms,
        gpu.copy_engines,
        gpu.switch_ns / 1000,
        gpu.slice_ns / 1_000_000
    );
    let _ = writeln!(
        out,
        "{:<26} {:<18} {:>9} {:>6} {:>7}  normalized/ideal per guest",
        "scenario", "sharing", "aggregate", "MMR", "holders"
    );
    let small = small_kernels();
    let s_ts = evaluate(&small, &gpu, ts, dur)?;
    let s_co = evaluate(&small, &gpu, co, dur)?;
    row(&mut out, "4 x 8-block 1:1:2:4", "time-sliced", &s_ts);
    row(&mut out, "4 x 8-block 1:1:2:4", "co-run", &s_co);
    let full = full_gpu_kernels();
    let f_ts = evaluate(&full, &gpu, ts, dur)?;
    let f_co = evaluate(&full, &gpu, co, dur)?;
    row(&mut out, "3 x full-GPU 1:2:3", "time-sliced", &f_ts);
    row(&mut out, "3 x full-GPU 1:2:3", "co-run", &f_co);
    let cc = copy_and_compute();
    let p_ts = evaluate(&cc, &gpu, ts, dur)?;
    let p_co = evaluate(&cc, &gpu, co, dur)?;
    let p_ph = evaluate(&cc, &gpu, phase, dur)?;
    row(&mut out, "copier + computer 1:1", "time-sliced", &p_ts);
    row(&mut out, "copier + computer 1:1", "co-run", &p_co);
    row(&mut out, "copier + computer 1:1", "co-run + phase", &p_ph);
    let _ = writeln!(
        out,
        "full-GPU kernels: co-run / time-sliced = {:.3}",
        f_co.aggregate / f_ts.aggregate
    );
    out.push_str(&policies_side_by_side()?);
    let _ = writeln!(
        out,
        "corun_speedup={:.3} corun_mmr={:.3} phase_speedup={:.3}",
        s_co.aggregate / s_ts.aggregate,
        s_ts.mmr.min(s_co.mmr),
        p_ph.aggregate / p_ts.aggregate
    );
    Ok(out)
}

/// The fair queue, LAS and TFS on FairGV's scenarios ([`crate::time`]).
fn policies_side_by_side() -> Result<String, SimError> {
    let m = Machine::default();
    let mut solos = SoloCache::default();
    let dur = 2_000_000_000;
    let policies = [Policy::FairGv, Policy::FairGvLas, Policy::FairGvTfs];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "device policies on FairGV's scenarios, 2 s simulated each (bench fairness --sim runs them longer): MMR / overhead\n{:<34} {:>15} {:>15} {:>15}",
        "scenario", "fair", "las", "tfs"
    );
    for scn in paper_scenarios() {
        let _ = write!(out, "{:<34}", scn.name);
        for p in policies {
            let o = scenario::evaluate(&scn, p, &m, dur, &mut solos)?;
            let _ = write!(out, " {:>7.3} / {:>5.3}", o.mmr, o.overhead);
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sched::weighted_mmr;

    const DUR: u64 = 1_000_000_000;

    fn ts() -> Setup {
        Setup::new(DevicePolicy::FairQueue, Sharing::TimeSliced)
    }

    fn co() -> Setup {
        Setup::new(DevicePolicy::FairQueue, Sharing::CoRun)
    }

    #[test]
    fn four_small_kernel_guests_corun_far_faster_and_keep_their_shares() {
        let gpu = Gpu::default();
        let g = small_kernels();
        let t = evaluate(&g, &gpu, ts(), DUR).unwrap();
        let c = evaluate(&g, &gpu, co(), DUR).unwrap();
        assert!(
            c.aggregate / t.aggregate >= 3.0,
            "{} vs {}",
            c.aggregate,
            t.aggregate
        );
        assert!(t.mmr >= 0.95, "time-sliced {:?}", t.normalized);
        assert!(c.mmr >= 0.95, "co-run {:?}", c.normalized);
        assert_eq!(c.stats.max_holders, 4);
        // Time-sliced, each gets its weight's share of the GPU.
        let iters: Vec<f64> = t.stats.iters.iter().map(|&i| i as f64).collect();
        assert!(weighted_mmr(&iters, &[1.0, 1.0, 2.0, 4.0]) >= 0.95);
    }

    #[test]
    fn full_gpu_kernels_never_co_hold_and_co_running_is_no_slower() {
        let gpu = Gpu::default();
        let g = full_gpu_kernels();
        let t = evaluate(&g, &gpu, ts(), DUR).unwrap();
        let c = evaluate(&g, &gpu, co(), DUR).unwrap();
        assert_eq!(c.stats.max_holders, 1);
        assert!(
            c.aggregate >= t.aggregate * 0.999,
            "{} < {}",
            c.aggregate,
            t.aggregate
        );
        assert!(c.mmr >= 0.95 && t.mmr >= 0.95, "{} {}", c.mmr, t.mmr);
    }

    #[test]
    fn sm_time_charging_keeps_1_1_2_4_shares_when_only_two_fit_at_once() {
        // 60 of 132 SMs each: two fit together, three do not.
        let gpu = Gpu::default();
        let w = [1.0, 1.0, 2.0, 4.0];
        let s = run(&same(&kernel_loop(60, 500_000), &w), &gpu, co(), DUR).unwrap();
        assert_eq!(s.max_holders, 2);
        let m = weighted_mmr(&s.sm_ns, &w);
        assert!(m >= 0.95, "SM-time {:?} MMR {m}", s.sm_ns);
        let charged: Vec<f64> = s.charged_ns.iter().map(|&c| c as f64).collect();
        assert!(weighted_mmr(&charged, &w) >= 0.95, "charged {charged:?}");
    }

    #[test]
    fn held_time_charging_would_favour_the_wide_kernels() {
        // One guest of 79 SMs, two of 40, equal weights: SM-time charges
        // keep their SM-time equal; held-time charges give the wide one
        // about twice the others'.
        let gpu = Gpu::default();
        let mut g = same(&kernel_loop(40, 500_000), &[1.0, 1.0]);
        g.insert(0, Guest::new("wide", kernel_loop(79, 500_000), 1.0));
        let fair = run(&g, &gpu, co(), DUR).unwrap();
        let held = Setup {
            charge_held_time: true,
            ..co()
        };
        let unfair = run(&g, &gpu, held, DUR).unwrap();
        let w = [1.0; 3];
        let (a, b) = (
            weighted_mmr(&fair.sm_ns, &w),
            weighted_mmr(&unfair.sm_ns, &w),
        );
        assert!(a >= 0.9, "SM-time charge: {:?} {a}", fair.sm_ns);
        assert!(b < 0.8, "held-time charge: {:?} {b}", unfair.sm_ns);
    }

    #[test]
    fn a_guest_launching_idle_blocks_gains_nothing() {
        let gpu = Gpu::default();
        let honest = same(&kernel_loop(8, 1_000_000), &[1.0, 1.0]);
        let mut padded = honest.clone();
        // Same work, a grid padded to fill the GPU with idle blocks.
        padded[1].ops = kernel_loop(132, 1_000_000);
        let h = run(&honest, &gpu, co(), DUR).unwrap();
        let p = run(&padded, &gpu, co(), DUR).unwrap();
        assert!(p.iters[1] <= h.iters[1], "{} > {}", p.iters[1], h.iters[1]);
        assert!(p.max_holders == 1 && h.max_holders == 2);
        // And it is charged the whole GPU for what it holds.
        assert!(p.charged_ns[1] as f64 >= 0.99 * p.sm_ns[1]);
    }

    #[test]
    fn phase_selection_overlaps_one_guests_copies_with_the_others_kernels() {
        let gpu = Gpu::default();
        let g = copy_and_compute();
        let t = evaluate(&g, &gpu, ts(), DUR).unwrap();
        let c = evaluate(&g, &gpu, co(), DUR).unwrap();
        let phase = Setup::new(DevicePolicy::PhaseSelection, Sharing::CoRun);
        let p = evaluate(&g, &gpu, phase, DUR).unwrap();
        assert_eq!(
            c.stats.max_holders, 1,
            "without phase selection they do not fit"
        );
        assert_eq!(p.stats.max_holders, 2);
        assert!(
            p.aggregate / t.aggregate >= 1.3,
            "{} vs {}",
            p.aggregate,
            t.aggregate
        );
        assert!(p.normalized.iter().all(|&n| n > 0.5), "{:?}", p.normalized);
    }

    #[test]
    fn las_and_tfs_are_fair_on_three_busy_vms() {
        let m = Machine::default();
        let mut solos = SoloCache::default();
        let scn = &paper_scenarios()[0]; // 3 x MM, 1:2:3
        for p in [Policy::FairGvLas, Policy::FairGvTfs] {
            let o = scenario::evaluate(scn, p, &m, 1_500_000_000, &mut solos).unwrap();
            assert!(o.mmr > 0.95, "{}: {:?}", p.name(), o.normalized);
        }
    }

    #[test]
    fn bad_scenarios_are_refused() {
        let gpu = Gpu::default();
        assert_eq!(run(&[], &gpu, ts(), 1), Err(SimError::NoVms));
        let empty = [Guest::new("e", vec![Op::Cpu { ns: 0 }], 1.0)];
        assert!(matches!(
            run(&empty, &gpu, ts(), 1),
            Err(SimError::EmptyLoop(_))
        ));
        let bad = same(&kernel_loop(8, 1), &[0.0]);
        assert_eq!(run(&bad, &gpu, ts(), 1), Err(SimError::BadWeight(0)));
    }
}
