//! FairGV's evaluation scenarios and the two figures it reports for each.
//!
//! A VM's *normalized throughput* n_i is its iterations in the shared run
//! over its iterations when it runs alone (its own core, the GPU to itself)
//! for the same time. Its *entitlement* e_i is what weighted fair sharing of
//! the GPU promises it: time fractions by water-filling with weights w_i and
//! demands d_i (the fraction of time it is not asleep when alone), so a VM
//! that needs less than its share gets what it needs and the rest is split
//! by weight. Then x_i = n_i / e_i,
//!
//! - MMR (Min-Max Ratio) = min_i x_i / max_i x_i (1 is perfectly fair);
//! - overhead = sum_i e_i / sum_i n_i (ideal aggregate throughput over the
//!   measured one; 1 loses nothing, below 1 means the VMs overlapped
//!   better than pure time sharing would).

use std::collections::HashMap;

use sched::mmr;

use super::{run, Machine, Policy, RunStats, VmSpec, Workload};
use crate::SimError;

/// A named set of VMs on a number of cores.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name for tables.
    pub name: String,
    /// Physical cores.
    pub cores: usize,
    /// The VMs.
    pub vms: Vec<VmSpec>,
    /// Policies that only make sense here (ablations), run besides the
    /// standard ones.
    pub extra_policies: Vec<Policy>,
}

fn vm(workload: Workload, weight: f64, core: usize) -> VmSpec {
    VmSpec {
        workload,
        weight,
        core,
    }
}

/// The paper's scenarios (FairGV section 5, profiles of its Table 3).
pub fn paper_scenarios() -> Vec<Scenario> {
    let mut out: Vec<Scenario> = Vec::new();
    for (name, w) in [
        ("MM", Workload::mm()),
        ("HS", Workload::hs()),
        ("BS", Workload::bs()),
        ("SRD1", Workload::srd1()),
    ] {
        out.push(Scenario {
            name: format!("3 VMs 1 core {name} 1:2:3"),
            cores: 1,
            vms: vec![vm(w.clone(), 1.0, 0), vm(w.clone(), 2.0, 0), vm(w, 3.0, 0)],
            extra_policies: vec![],
        });
    }
    for (name, w) in [("BS", Workload::bs()), ("SRD1", Workload::srd1())] {
        let weights = [1.0, 2.0, 2.0, 3.0, 3.0, 4.0];
        out.push(Scenario {
            name: format!("6 VMs 3 cores {name} 1:2:2:3:3:4"),
            cores: 3,
            vms: weights
                .iter()
                .enumerate()
                .map(|(i, &wt)| vm(w.clone(), wt, i % 3))
                .collect(),
            extra_policies: vec![],
        });
    }
    for (name, fg) in [("MM", Workload::mm()), ("HS", Workload::hs())] {
        for bg_us in [21, 405, 1605] {
            out.push(Scenario {
                name: format!("fg {name} vs bg MM {bg_us}us 1:1"),
                cores: 2,
                vms: vec![
                    vm(fg.clone(), 1.0, 0),
                    vm(Workload::mm_kernel(bg_us * 1000), 1.0, 1),
                ],
                extra_policies: vec![],
            });
        }
    }
    for sleep in [50, 80] {
        out.push(Scenario {
            name: format!("MM {sleep}% asleep + BS 1:1"),
            cores: 2,
            vms: vec![
                vm(Workload::mm_sleeping(sleep), 1.0, 0),
                vm(Workload::bs(), 1.0, 1),
            ],
            extra_policies: vec![Policy::FairGvNoWc],
        });
    }
    for s in &mut out {
        s.extra_policies.push(Policy::FairGvGpuCharge);
    }
    out
}

/// The policies every scenario runs, baselines first.
pub const POLICIES: [Policy; 5] = [
    Policy::None,
    Policy::CreditPoll,
    Policy::CreditHs,
    Policy::Strict,
    Policy::FairGv,
];

/// Weighted water-filling of a capacity of 1 over `demand` (each in 0..=1).
pub fn entitlements(weights: &[f64], demand: &[f64]) -> Vec<f64> {
    let n = weights.len();
    let mut e = vec![0.0; n];
    let mut open: Vec<usize> = (0..n).collect();
    let mut capacity = 1.0f64;
    loop {
        let wsum: f64 = open.iter().map(|&i| weights[i]).sum();
        if open.is_empty() || wsum <= 0.0 {
            return e;
        }
        // Whoever needs less than its share of what is left gets its demand.
        let satisfied: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&i| demand[i] <= capacity * weights[i] / wsum)
            .collect();
        if satisfied.is_empty() {
            for &i in &open {
                e[i] = capacity * weights[i] / wsum;
            }
            return e;
        }
        for &i in &satisfied {
            e[i] = demand[i];
            capacity -= demand[i];
        }
        open.retain(|i| !satisfied.contains(i));
    }
}

/// One policy on one scenario.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The policy.
    pub policy: Policy,
    /// Min-Max Ratio of throughput over entitlement.
    pub mmr: f64,
    /// Ideal aggregate throughput over measured.
    pub overhead: f64,
    /// GPU busy fraction.
    pub gpu_util: f64,
    /// Per-VM normalized throughput.
    pub normalized: Vec<f64>,
    /// Per-VM ideal normalized throughput (entitlement over demand).
    pub ideal: Vec<f64>,
    /// Raw counts.
    pub stats: RunStats,
}

/// Solo runs, kept per workload so each runs once per duration.
#[derive(Debug, Default)]
pub struct SoloCache {
    runs: HashMap<(Vec<super::Step>, u64), RunStats>,
}

impl SoloCache {
    /// A workload alone on its own core with the GPU to itself.
    pub fn solo(
        &mut self,
        w: &Workload,
        m: &Machine,
        duration_ns: u64,
    ) -> Result<RunStats, SimError> {
        let key = (w.steps.clone(), duration_ns);
        if let Some(s) = self.runs.get(&key) {
            return Ok(s.clone());
        }
        let spec = [VmSpec {
            workload: w.clone(),
            weight: 1.0,
            core: 0,
        }];
        let s = run(&spec, 1, Policy::None, m, duration_ns)?;
        self.runs.insert(key, s.clone());
        Ok(s)
    }
}

/// Runs `policy` on `scn` and computes its figures.
pub fn evaluate(
    scn: &Scenario,
    policy: Policy,
    m: &Machine,
    duration_ns: u64,
    solos: &mut SoloCache,
) -> Result<Outcome, SimError> {
    let stats = run(&scn.vms, scn.cores, policy, m, duration_ns)?;
    let mut normalized = Vec::new();
    let mut demand = Vec::new();
    for (i, v) in scn.vms.iter().enumerate() {
        let solo = solos.solo(&v.workload, m, duration_ns)?;
        normalized.push(stats.iters[i] as f64 / solo.iters[0].max(1) as f64);
        demand.push(1.0 - solo.sleep_ns[0] as f64 / solo.window_ns as f64);
    }
    let weights: Vec<f64> = scn.vms.iter().map(|v| v.weight).collect();
    let entitlement = entitlements(&weights, &demand);
    let ideal: Vec<f64> = entitlement
        .iter()
        .zip(&demand)
        .map(|(e, d)| e / d.max(1e-9))
        .collect();
    let x: Vec<f64> = normalized.iter().zip(&ideal).map(|(n, t)| n / t).collect();
    let measured: f64 = normalized.iter().zip(&demand).map(|(n, d)| n * d).sum();
    let ideal_sum: f64 = entitlement.iter().sum();
    Ok(Outcome {
        policy,
        mmr: mmr(&x),
        overhead: if measured > 0.0 {
            ideal_sum / measured
        } else {
            f64::INFINITY
        },
        gpu_util: stats.gpu_util(),
        normalized,
        ideal,
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_filling_gives_the_small_demand_its_need() {
        let e = entitlements(&[1.0, 1.0], &[0.2, 1.0]);
        assert!((e[0] - 0.2).abs() < 1e-12 && (e[1] - 0.8).abs() < 1e-12);
        let e = entitlements(&[1.0, 2.0, 3.0], &[1.0, 1.0, 1.0]);
        assert!((e[0] - 1.0 / 6.0).abs() < 1e-12 && (e[2] - 0.5).abs() < 1e-12);
        let e = entitlements(&[1.0, 1.0], &[0.3, 0.4]);
        assert_eq!(
            e,
            vec![0.3, 0.4],
            "under-committed: everyone gets its demand"
        );
    }

    #[test]
    fn profiles_match_table_3() {
        // Solo rates per 10 ms of the Table 3 profiles: BS about 26 sync
        // calls, SRD1 about 644.
        let m = Machine::default();
        let mut solos = SoloCache::default();
        let dur = 200_000_000;
        let per_10ms = |s: &RunStats| s.sync_calls[0] as f64 * 1e7 / s.window_ns as f64;
        let bs = solos.solo(&Workload::bs(), &m, dur).unwrap();
        let srd = solos.solo(&Workload::srd1(), &m, dur).unwrap();
        assert!((24.0..28.0).contains(&per_10ms(&bs)), "{}", per_10ms(&bs));
        assert!(
            (600.0..700.0).contains(&per_10ms(&srd)),
            "{}",
            per_10ms(&srd)
        );
        let mm = solos.solo(&Workload::mm(), &m, dur).unwrap();
        assert!(mm.gpu_util() > 0.95, "MM is GPU-bound: {}", mm.gpu_util());
        let sl = solos.solo(&Workload::mm_sleeping(80), &m, dur).unwrap();
        let asleep = sl.sleep_ns[0] as f64 / sl.window_ns as f64;
        assert!((0.75..0.85).contains(&asleep), "{asleep}");
    }

    #[test]
    fn runs_are_deterministic() {
        let m = Machine::default();
        let scn = &paper_scenarios()[3];
        let a = run(&scn.vms, scn.cores, Policy::FairGv, &m, 50_000_000).unwrap();
        let b = run(&scn.vms, scn.cores, Policy::FairGv, &m, 50_000_000).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn no_scheduler_ignores_weights_and_fairvgpu_follows_them() {
        let m = Machine::default();
        let mut solos = SoloCache::default();
        let scn = &paper_scenarios()[0]; // 3 x MM, 1:2:3
        let dur = 1_500_000_000;
        let none = evaluate(scn, Policy::None, &m, dur, &mut solos).unwrap();
        let fair = evaluate(scn, Policy::FairGv, &m, dur, &mut solos).unwrap();
        assert!(none.mmr < 0.5, "none: {:?}", none.normalized);
        assert!(fair.mmr > 0.97, "fairvgpu: {:?}", fair.normalized);
        assert!(fair.overhead < 1.02, "overhead {}", fair.overhead);
    }

    #[test]
    fn fairvgpu_is_fair_in_every_paper_scenario_and_a_baseline_is_not() {
        let m = Machine::default();
        let mut solos = SoloCache::default();
        let dur = 4_000_000_000;
        let mut worst_baseline: f64 = 1.0;
        for scn in paper_scenarios() {
            let o = evaluate(&scn, Policy::FairGv, &m, dur, &mut solos).unwrap();
            assert!(
                o.mmr >= 0.98,
                "{}: MMR {} {:?}",
                scn.name,
                o.mmr,
                o.normalized
            );
            assert!(o.overhead <= 1.01, "{}: overhead {}", scn.name, o.overhead);
            let b = evaluate(&scn, Policy::CreditHs, &m, dur, &mut solos).unwrap();
            worst_baseline = worst_baseline.min(b.mmr);
        }
        assert!(worst_baseline < 0.5, "credit-hs worst MMR {worst_baseline}");
    }

    #[test]
    fn without_work_conservation_the_gpu_idles_while_the_sleeper_holds_it() {
        let m = Machine::default();
        let scn = paper_scenarios()
            .into_iter()
            .find(|s| s.name.starts_with("MM 80%"))
            .unwrap();
        let dur = 2_000_000_000;
        let wc = run(&scn.vms, scn.cores, Policy::FairGv, &m, dur).unwrap();
        let no = run(&scn.vms, scn.cores, Policy::FairGvNoWc, &m, dur).unwrap();
        assert!(
            wc.gpu_util() > no.gpu_util() + 0.05,
            "{} vs {}",
            wc.gpu_util(),
            no.gpu_util()
        );
    }

    #[test]
    fn bad_scenarios_are_refused() {
        let m = Machine::default();
        let w = Workload::mm();
        let bad_core = [VmSpec {
            workload: w.clone(),
            weight: 1.0,
            core: 3,
        }];
        assert!(matches!(
            run(&bad_core, 1, Policy::None, &m, 1_000_000),
            Err(SimError::NoSuchCore { .. })
        ));
        let empty = [VmSpec {
            workload: Workload::new("nothing", vec![]),
            weight: 1.0,
            core: 0,
        }];
        assert!(matches!(
            run(&empty, 1, Policy::None, &m, 1_000_000),
            Err(SimError::EmptyLoop(_))
        ));
        assert_eq!(run(&[], 1, Policy::None, &m, 1), Err(SimError::NoVms));
    }
}
