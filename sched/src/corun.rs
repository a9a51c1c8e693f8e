//! Co-running: which vGPUs may hold one GPU at the same time, and what
//! each is charged for it.
//!
//! Mechanism (the daemon's side): co-holders are clients of one MPS
//! control daemon per GPU, so their kernels run side by side on the SMs and
//! their copies on the copy engines, with no context switch between them.
//! MPS clients share fault fate, so only tenants that opted in
//! ([`Demand::corun_ok`]) ever co-hold; a vGPU that did not holds the GPU
//! alone, as with time slices.
//!
//! **Who.** [`plan`] walks the candidates in the policy's order (the fair
//! queue's, so weights still decide who goes first) and admits each while
//! the whole set fits; it stops at the first that does not fit or did not
//! opt in, and admits nobody behind it, so a large vGPU at the head of the
//! queue is never overtaken for ever by small ones filling the gaps: it
//! waits for the GPU to drain instead. A set fits when, with a capacity of
//! `1 - headroom` per resource:
//! - the summed SM fraction of its compute-phase members fits,
//! - the summed memory-bandwidth fraction of all members fits,
//! - the summed copy fraction of all members fits (the copy engines),
//!
//! where a resource used by one member only always fits (a vGPU alone may
//! use the whole GPU). Without phase selection every member is in a
//! compute phase, so two full-GPU tenants never co-hold.
//!
//! **Phase selection** (Strings): under [`CorunConfig::phase_selection`] a
//! member whose copy fraction is at least
//! [`CorunConfig::copy_phase_threshold`] is in a copy phase: its SM
//! fraction is not counted against the compute-phase members, because
//! copy engines and SMs are different resources; its few kernels queue for
//! SMs like anyone's. Two copy-heavy members still do not co-hold when
//! their copy fractions do not fit together: the copy engines are a
//! resource like the SMs, and they are shared fairly by the same charge.
//!
//! **Charge.** A vGPU holding the GPU alone is charged its whole held time,
//! as with time slices. While it co-holds, it is charged the share of the
//! GPU it held: held time × [`Demand::share`], its dominant share of SMs
//! (SM fraction × the time it computes) and copy engines (its copy
//! fraction). For a tenant that only computes that is held time × SM
//! fraction: SM-time. Its SM fraction is what its kernels occupy
//! (occupancy × grid), so filling the GPU with idle blocks raises the
//! charge and stops it co-running with others: it gains nothing.
//!
//! **Use** (the grant service of one GPU, with [`crate::GpuScheduler`]):
//! whenever the set of holders changes (a grant, a release, a request),
//! take `sched.candidates(now, &holding_ids)`, pair each with its latest
//! measured [`Demand`] ([`Demand::exclusive`] when none), and grant the GPU
//! to every id [`plan`] returns, each for one slice, with the settings of
//! `sched.corun_config()`. Count each holder's time held alone and held
//! with others; at its release call
//! `sched.release(id, charge_ns(alone, shared, &demand))`. Use
//! `sched.grant(now)` only for its vCPU kick (it names the same first
//! candidate). With every demand exclusive this is exactly today's time
//! slicing.

use crate::sfq::VgpuId;

/// The smallest share a co-holder is charged per ns held (a vGPU holding
/// the GPU costs something even when its measured demand is tiny).
pub const MIN_SHARE: f64 = 0.01;

/// What a vGPU's current work needs of the GPU, as measured by its worker.
/// Fractions are of the whole GPU, in 0..=1; values out of range are
/// clamped and a NaN counts as the whole GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Share of the GPU's SMs its kernels occupy (occupancy × grid).
    pub sm_fraction: f64,
    /// Share of the GPU's memory bandwidth its kernels use.
    pub mem_bw_fraction: f64,
    /// Share of its GPU time that is copies.
    pub copy_fraction: f64,
    /// The tenant opted in to co-running (and its shared fault fate).
    pub corun_ok: bool,
}

fn unit(x: f64) -> f64 {
    if x.is_nan() {
        1.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

impl Demand {
    /// A demand of the whole GPU by a tenant that did not opt in: what to
    /// assume when nothing was measured.
    pub fn exclusive() -> Self {
        Demand {
            sm_fraction: 1.0,
            mem_bw_fraction: 1.0,
            copy_fraction: 0.0,
            corun_ok: false,
        }
    }

    fn clamped(&self) -> Demand {
        Demand {
            sm_fraction: unit(self.sm_fraction),
            mem_bw_fraction: unit(self.mem_bw_fraction),
            copy_fraction: unit(self.copy_fraction),
            corun_ok: self.corun_ok,
        }
    }

    /// Whether it is in a copy phase under `cfg`.
    pub fn in_copy_phase(&self, cfg: &CorunConfig) -> bool {
        cfg.phase_selection && unit(self.copy_fraction) >= cfg.copy_phase_threshold
    }

    /// The share of the GPU it holds per ns while co-holding: the larger of
    /// its SM use (SM fraction × the part of its time that is not copies)
    /// and its copy engine use (copy fraction), at least [`MIN_SHARE`].
    pub fn share(&self) -> f64 {
        let d = self.clamped();
        (d.sm_fraction * (1.0 - d.copy_fraction))
            .max(d.copy_fraction)
            .clamp(MIN_SHARE, 1.0)
    }
}

/// Settings of co-running decisions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CorunConfig {
    /// Capacity kept free per resource: a set fits when each summed
    /// fraction is at most `1 - headroom` (measurement error, interference).
    pub headroom: f64,
    /// Strings' phase selection: a copying vGPU's SMs are not counted
    /// against computing ones.
    pub phase_selection: bool,
    /// Copy fraction from which a vGPU is in a copy phase.
    pub copy_phase_threshold: f64,
}

impl Default for CorunConfig {
    fn default() -> Self {
        CorunConfig {
            headroom: 0.05,
            phase_selection: false,
            copy_phase_threshold: 0.5,
        }
    }
}

/// Whether `set` may hold the GPU together under `cfg`.
pub fn fits(set: &[Demand], cfg: &CorunConfig) -> bool {
    let cap = 1.0 - cfg.headroom.clamp(0.0, 1.0);
    let ok = |xs: Vec<f64>| {
        let users = xs.iter().filter(|&&x| x > 0.0).count();
        users <= 1 || xs.iter().sum::<f64>() <= cap + 1e-12
    };
    let d: Vec<Demand> = set.iter().map(Demand::clamped).collect();
    ok(d.iter()
        .filter(|x| !x.in_copy_phase(cfg))
        .map(|x| x.sm_fraction)
        .collect())
        && ok(d.iter().map(|x| x.mem_bw_fraction).collect())
        && ok(d.iter().map(|x| x.copy_fraction).collect())
}

/// Which `candidates` (in the policy's order, see
/// [`crate::GpuScheduler::candidates`]) may join the vGPUs `holding` the
/// GPU now. With nobody holding, the first candidate is always admitted (it
/// runs alone if it must). Nobody joins a holder that did not opt in, and
/// the walk stops at the first candidate that did not opt in or does not
/// fit: it keeps its place and waits for the GPU to drain.
pub fn plan(
    holding: &[(VgpuId, Demand)],
    candidates: &[(VgpuId, Demand)],
    cfg: &CorunConfig,
) -> Vec<VgpuId> {
    let mut set: Vec<Demand> = holding.iter().map(|h| h.1).collect();
    let mut out = Vec::new();
    let mut rest = candidates.iter();
    if set.is_empty() {
        let Some(&(id, d)) = rest.next() else {
            return out;
        };
        out.push(id);
        set.push(d);
    }
    if set.iter().any(|d| !d.corun_ok) {
        return out;
    }
    for &(id, d) in rest {
        set.push(d);
        if !d.corun_ok || !fits(&set, cfg) {
            break;
        }
        out.push(id);
    }
    out
}

/// The charge for one hold: `alone_ns` held alone in full, `shared_ns` held
/// with others at the vGPU's [`Demand::share`]. Pass it to
/// [`crate::GpuScheduler::release`].
pub fn charge_ns(alone_ns: u64, shared_ns: u64, demand: &Demand) -> u64 {
    alone_ns.saturating_add(crate::round_ns(shared_ns as f64 * demand.share()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(sm: f64, bw: f64, copy: f64) -> Demand {
        Demand {
            sm_fraction: sm,
            mem_bw_fraction: bw,
            copy_fraction: copy,
            corun_ok: true,
        }
    }

    fn cands(ds: &[Demand]) -> Vec<(VgpuId, Demand)> {
        ds.iter()
            .enumerate()
            .map(|(i, &x)| (u32::try_from(i).unwrap(), x))
            .collect()
    }

    #[test]
    fn small_kernels_all_fit_and_full_gpu_kernels_never_do() {
        let cfg = CorunConfig::default();
        let small = d(8.0 / 132.0, 0.05, 0.0);
        assert_eq!(plan(&[], &cands(&[small; 4]), &cfg), vec![0, 1, 2, 3]);
        let full = d(1.0, 0.3, 0.0);
        assert_eq!(plan(&[], &cands(&[full; 3]), &cfg), vec![0]);
        assert!(plan(&[(9, full)], &cands(&[small]), &cfg).is_empty());
    }

    #[test]
    fn the_walk_stops_at_the_first_that_does_not_fit_or_opted_out() {
        let cfg = CorunConfig::default();
        let half = d(0.5, 0.1, 0.0);
        let big = d(0.6, 0.1, 0.0);
        let small = d(0.1, 0.1, 0.0);
        // 1 does not fit next to 0: 2 may not overtake it.
        assert_eq!(plan(&[], &cands(&[half, big, small]), &cfg), vec![0]);
        let out = Demand {
            corun_ok: false,
            ..small
        };
        assert_eq!(plan(&[], &cands(&[small, out, small]), &cfg), vec![0]);
        // One that opted out holds alone.
        assert_eq!(plan(&[], &cands(&[out, small]), &cfg), vec![0]);
        assert!(plan(&[(7, out)], &cands(&[small]), &cfg).is_empty());
        // Memory bandwidth counts as SMs do.
        let hungry = d(0.1, 0.6, 0.0);
        assert_eq!(plan(&[], &cands(&[hungry, hungry]), &cfg), vec![0]);
        // Headroom: 0.5 + 0.48 fits in 1 but not in 0.95.
        assert_eq!(plan(&[], &cands(&[half, d(0.48, 0.1, 0.0)]), &cfg), vec![0]);
        let none = CorunConfig {
            headroom: 0.0,
            ..cfg
        };
        assert_eq!(
            plan(&[], &cands(&[half, d(0.48, 0.1, 0.0)]), &none),
            vec![0, 1]
        );
    }

    #[test]
    fn phase_selection_pairs_a_copier_with_a_computer_but_not_two_copiers() {
        let copier = d(1.0, 0.02, 0.8);
        let computer = d(1.0, 0.3, 0.0);
        let plain = CorunConfig::default();
        let phase = CorunConfig {
            phase_selection: true,
            ..plain
        };
        assert_eq!(plan(&[], &cands(&[copier, computer]), &plain), vec![0]);
        assert_eq!(plan(&[], &cands(&[copier, computer]), &phase), vec![0, 1]);
        assert_eq!(plan(&[], &cands(&[computer, copier]), &phase), vec![0, 1]);
        assert_eq!(plan(&[], &cands(&[copier, copier]), &phase), vec![0]);
        // Two computers still do not fit, phase selection or not.
        assert_eq!(
            plan(&[], &cands(&[copier, computer, computer]), &phase),
            vec![0, 1]
        );
    }

    #[test]
    fn charges_are_sm_time_when_shared_and_held_time_alone() {
        let small = d(0.25, 0.1, 0.0);
        assert_eq!(charge_ns(0, 1_000_000, &small), 250_000);
        assert_eq!(charge_ns(1_000_000, 0, &small), 1_000_000);
        // Idle blocks raise the SM fraction and with it the charge.
        let padded = d(1.0, 0.1, 0.0);
        assert_eq!(charge_ns(0, 1_000_000, &padded), 1_000_000);
        // Times past any real hold saturate instead of wrapping or panicking.
        assert_eq!(charge_ns(u64::MAX - 10, 1_000_000, &small), u64::MAX);
        assert_eq!(charge_ns(0, u64::MAX, &padded), u64::MAX);
        // A copier is charged its copy engine share.
        assert!((d(1.0, 0.0, 0.8).share() - 0.8).abs() < 1e-12);
        assert_eq!(d(0.0, 0.0, 0.0).share(), MIN_SHARE);
        // Garbage measurements count as the whole GPU.
        assert_eq!(d(f64::NAN, 0.0, 0.0).share(), 1.0);
        assert_eq!(d(7.0, 0.0, -3.0).share(), 1.0);
        assert!(!fits(
            &[d(f64::NAN, 0.0, 0.0), small],
            &CorunConfig::default()
        ));
    }
}
