//! Co-running on a GPU whose vGPUs are MPS clients (`[[gpu]] mps = true`):
//! while the fair queue's holder of a slice is a vGPU whose VM opted in
//! (`[[vm]] corun = true`), the next vGPUs in the queue's order that also
//! opted in and fit beside it ([`sched::corun::plan`]: their measured
//! SM occupancy together within the GPU) hold the GPU with it until its
//! slice ends, their kernels side by side on the SMs. Each is charged its
//! time held alone in full and its time held with others at its share of
//! the GPU (SM-time, [`sched::corun::charge_ns`]), so weights hold
//! when tenants co-run and a tenant gains nothing by filling the GPU with
//! idle blocks. Under `[[gpu]] policy = "phase"`, a vGPU whose recent
//! device work is half or more copies (its worker reports the share)
//! counts no SMs against those computing: copy engines and SMs are
//! different resources (phase selection). A round ends when the holder and every co-holder gave the
//! GPU back; then the fair queue picks again. Without opted-in vGPUs, or on
//! a GPU without MPS, nothing here changes the time slices.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use sched::corun::{self, Demand};
use sched::GpuScheduler;

use super::VgpuLive;

/// The co-running state of one GPU's grant service.
#[derive(Debug, Default)]
pub(super) struct CoRun {
    /// This GPU's vGPUs are MPS clients: they may co-hold.
    pub enabled: bool,
    /// vGPUs whose VMs opted in.
    pub ok: HashSet<u32>,
    /// Co-holders of the current round, and when their grant ends.
    pub holders: HashMap<u32, Instant>,
    /// Each holder's time this round, held alone and held with others (ns).
    split: HashMap<u32, (u64, u64)>,
}

impl CoRun {
    /// The state of a GPU that co-runs (`enabled`) or does not.
    pub fn new(enabled: bool) -> CoRun {
        CoRun {
            enabled,
            ..Default::default()
        }
    }

    /// What `id`'s current work needs of the GPU, from its worker's last
    /// report: its kernels' occupancy as its SM fraction (the whole GPU
    /// while nothing is measured), and the share of its device work that
    /// was copies.
    pub fn demand(&self, id: u32, live: &HashMap<u32, VgpuLive>) -> Demand {
        let (ppm, copy) = live
            .get(&id)
            .map_or((0, 0), |v| (v.report.occupancy_ppm, v.report.copy_ppm));
        let mut d = Demand::exclusive();
        if ppm > 0 {
            d.sm_fraction = ppm as f64 / 1e6;
            d.mem_bw_fraction = 0.0;
            d.copy_fraction = 0.0;
        }
        if copy > 0 {
            d.copy_fraction = copy as f64 / 1e6;
        }
        d.corun_ok = self.ok.contains(&id);
        d
    }

    /// Counts `dt` ns of the round for every holder: alone if it holds the
    /// GPU by itself, with others otherwise.
    pub fn tick(&mut self, primary: Option<u32>, dt: u64) {
        if !self.enabled {
            return;
        }
        let ids: Vec<u32> = primary
            .into_iter()
            .chain(self.holders.keys().copied())
            .collect();
        let shared = ids.len() > 1;
        for id in ids {
            let e = self.split.entry(id).or_default();
            if shared {
                e.1 += dt;
            } else {
                e.0 += dt;
            }
        }
    }

    /// The charge of `id` giving the GPU back, its worker having measured
    /// `measured` ns of GPU time: that, if it never held with others this
    /// round; else its time alone plus its share of the time with others.
    pub fn charge(&mut self, id: u32, measured: u64, live: &HashMap<u32, VgpuLive>) -> u64 {
        match self.split.remove(&id) {
            Some((alone, shared)) if shared > 0 => {
                corun::charge_ns(alone, shared, &self.demand(id, live))
            }
            _ => measured,
        }
    }

    /// Who else may hold the GPU now beside `primary` (holding until
    /// `deadline`): the fair queue's next vGPUs that opted in and fit.
    pub fn admit(
        &mut self,
        sched: &mut GpuScheduler,
        primary: u32,
        now_ns: u64,
        live: &HashMap<u32, VgpuLive>,
    ) -> Vec<u32> {
        if !self.enabled || !self.ok.contains(&primary) {
            return Vec::new();
        }
        let holding: Vec<(u32, Demand)> = std::iter::once(primary)
            .chain(self.holders.keys().copied())
            .map(|id| (id, self.demand(id, live)))
            .collect();
        let ids: Vec<u32> = holding.iter().map(|h| h.0).collect();
        let candidates: Vec<(u32, Demand)> = sched
            .candidates(now_ns, &ids)
            .into_iter()
            .map(|id| (id, self.demand(id, live)))
            .collect();
        corun::plan(&holding, &candidates, &sched.corun_config())
    }

    /// Time `id` has held the GPU this round, alone and with others (ns).
    pub fn held_ns(&self, id: u32) -> u64 {
        self.split.get(&id).map_or(0, |&(a, s)| a + s)
    }

    /// Co-holders past their grant by more than `grace`.
    pub fn overdue(&self, grace: Duration) -> Vec<u32> {
        let now = Instant::now();
        self.holders
            .iter()
            .filter(|(_, &end)| now.saturating_duration_since(end) > grace)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Forgets `id` as a holder of this round.
    pub fn forget(&mut self, id: u32) {
        self.holders.remove(&id);
        self.split.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    use super::super::tests::busy_until;
    use super::super::{GrantService, Report};
    use super::*;
    use worker::gate::Gate;

    /// Four workers at weights 1:1:2:4 whose kernels occupy `occupancy` of
    /// the GPU, all opted in but the ones in `out`, hold slices of 2 ms for
    /// 1.2 s on a co-running GPU. Returns each one's time held, its charge,
    /// and the most that held the GPU at once.
    fn round(name: &str, occupancy: f64, out: &[u32]) -> (Vec<u64>, Vec<u64>, usize) {
        round_with(
            name,
            occupancy,
            &[0; 4],
            out,
            sched::DevicePolicy::default(),
        )
    }

    /// [`round`] with each worker's copy share (ppm) and a device policy.
    fn round_with(
        name: &str,
        occupancy: f64,
        copy_ppm: &[u64; 4],
        out: &[u32],
        policy: sched::DevicePolicy,
    ) -> (Vec<u64>, Vec<u64>, usize) {
        let dir = scratch::dir(&format!("fvg-corun-{name}"));
        let svc = GrantService::start_with(&dir.join("g.sock"), 2_000_000, policy, true).unwrap();
        let weights = [1.0, 1.0, 2.0, 4.0];
        for id in 0..4u32 {
            svc.set_corun(id, !out.contains(&id)).unwrap();
        }
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let all = Arc::new(Barrier::new(weights.len()));
        let threads: Vec<_> = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                let (path, now, most, all) = (
                    svc.path().to_owned(),
                    now.clone(),
                    most.clone(),
                    all.clone(),
                );
                let copy = copy_ppm[i];
                std::thread::spawn(move || {
                    let mut g = Gate::connect(&path, u32::try_from(i).unwrap(), w).unwrap();
                    // A fraction in [0, 1]: a million at most.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let ppm = (occupancy * 1e6) as u64;
                    g.report(&Report {
                        occupancy_ppm: ppm,
                        copy_ppm: copy,
                        ..Report::default()
                    })
                    .unwrap();
                    all.wait();
                    std::thread::sleep(Duration::from_millis(30));
                    let end = Instant::now() + Duration::from_millis(1200);
                    busy_until(&mut g, end, |taken| {
                        if taken {
                            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(n, Ordering::SeqCst);
                        } else {
                            now.fetch_sub(1, Ordering::SeqCst);
                        }
                    })
                })
            })
            .collect();
        let held: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        std::thread::sleep(Duration::from_millis(20));
        let live = svc.live();
        let charged = (0..4u32).map(|i| live[&i].charged_ns).collect();
        drop(svc);
        let _ = std::fs::remove_dir_all(&dir);
        (held, charged, most.load(Ordering::SeqCst))
    }

    #[test]
    fn small_kernels_co_hold_and_are_charged_their_share() {
        // 8 blocks of 132 SMs each: all four fit at once.
        let (held, charged, most) = round("small", 0.06, &[]);
        assert_eq!(most, 4, "all four held the GPU at once");
        // Each held most of the run, not a quarter of it...
        for h in &held {
            assert!(*h > 700_000_000, "held {held:?}");
        }
        // ...and was charged about its 6% of the GPU for the time shared.
        for (h, c) in held.iter().zip(&charged) {
            let share = *c as f64 / *h as f64;
            assert!(share < 0.3, "charged {charged:?} for {held:?}");
        }
    }

    #[test]
    fn large_kernels_take_turns_and_keep_the_weights() {
        // Each fills 60% of the GPU: no two fit; time slices as before.
        let (held, _, most) = round("large", 0.6, &[]);
        assert_eq!(most, 1, "never two at once");
        let total: u64 = held.iter().sum();
        let x: Vec<f64> = held
            .iter()
            .zip([1.0, 1.0, 2.0, 4.0])
            .map(|(&h, w)| h as f64 / total as f64 / (w / 8.0))
            .collect();
        let mmr = sched::mmr(&x);
        assert!(mmr > 0.8, "MMR {mmr}, held {held:?}");
    }

    #[test]
    fn with_phase_selection_a_copier_co_holds_with_those_computing() {
        // All fill 60% of the SMs; 90% of vGPU 3's device work is copies.
        // Fair queue: nobody co-holds. Phase selection:
        // the copier holds the GPU beside one that computes.
        let copies = [0, 0, 0, 900_000];
        let fair = sched::DevicePolicy::FairQueue;
        let (_, _, most) = round_with("phase-off", 0.6, &copies, &[], fair);
        assert_eq!(most, 1);
        let phase = sched::DevicePolicy::PhaseSelection;
        let (_, _, most) = round_with("phase-on", 0.6, &copies, &[], phase);
        assert_eq!(
            most, 2,
            "the copier beside one computing, never two computing"
        );
    }

    #[test]
    fn a_vgpu_that_did_not_opt_in_never_co_holds() {
        // vGPU 3 (weight 4) did not opt in: while it holds, nobody joins,
        // and it joins nobody.
        let (held, charged, most) = round("optout", 0.06, &[3]);
        assert!(most <= 3, "at most the three that opted in at once");
        // Its charge is its whole held time (it always held alone).
        let (h, c) = (held[3] as f64, charged[3] as f64);
        assert!((c / h) > 0.8, "charged {c} for {h} held alone");
    }

    #[test]
    fn co_holders_nobody_waits_beside_are_extended_together() {
        let dir = scratch::dir("fvg-corun-ext");
        // Slices long enough that a loaded machine's scheduling delays do
        // not end one before its extension arrives.
        let slice = Duration::from_millis(20);
        let policy = sched::DevicePolicy::default();
        let svc = GrantService::start_with(&dir.join("g.sock"), 20_000_000, policy, true).unwrap();
        for id in 0..3 {
            svc.set_corun(id, true).unwrap();
        }
        let small = Report {
            occupancy_ppm: 60_000,
            ..Report::default()
        };
        let mut gates: Vec<Gate> = (0..2)
            .map(|id| {
                let mut g = Gate::connect(svc.path(), id, 1.0).unwrap();
                g.report(&small).unwrap();
                g
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        for g in &mut gates {
            assert!(g.acquire(Duration::from_secs(5)).unwrap());
        }
        // Five slices' time, and neither's slice ended: both were extended.
        let t = Instant::now();
        while t.elapsed() < 5 * slice {
            for g in &mut gates {
                assert!(!g.slice_over(), "ended after {:?}", t.elapsed());
            }
            std::thread::sleep(Duration::from_micros(300));
        }
        for g in &gates {
            assert!(g.extensions() >= 4, "{} extensions", g.extensions());
            assert!(g.alone());
        }
        // A third that does not fit wants the GPU: both hear of it and
        // their slices end within the extension they had.
        let mut big = Gate::connect(svc.path(), 2, 1.0).unwrap();
        big.report(&Report {
            occupancy_ppm: 1_000_000,
            ..Report::default()
        })
        .unwrap();
        assert!(!big.acquire(Duration::from_millis(1)).unwrap());
        let t = Instant::now();
        for g in &mut gates {
            while !g.slice_over() {
                assert!(t.elapsed() < 3 * slice, "not over after {:?}", t.elapsed());
                std::thread::sleep(Duration::from_micros(300));
            }
            assert!(!g.alone());
            let held = g.held_ns();
            g.release(held, false).unwrap();
        }
        assert!(big.acquire(Duration::from_secs(5)).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_holder_that_leaves_early_can_come_back_into_the_round() {
        let dir = scratch::dir("fvg-corun-back");
        let policy = sched::DevicePolicy::default();
        let svc = GrantService::start_with(&dir.join("g.sock"), 200_000_000, policy, true).unwrap();
        let small = Report {
            occupancy_ppm: 60_000,
            ..Report::default()
        };
        let mut gates: Vec<Gate> = (0..2)
            .map(|id| {
                svc.set_corun(id, true).unwrap();
                let mut g = Gate::connect(svc.path(), id, 1.0).unwrap();
                g.report(&small).unwrap();
                g
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        // vGPU 0 holds the round; vGPU 1 joins it.
        assert!(gates[0].acquire(Duration::from_secs(5)).unwrap());
        assert!(gates[1].acquire(Duration::from_secs(5)).unwrap());
        // The holder leaves with work still to come, and asks again: it is
        // back beside vGPU 1 long before the 200 ms round could end.
        let held = gates[0].held_ns();
        gates[0].release(held, true).unwrap();
        // (An extension sent while it held is read and passed over first.)
        let t = Instant::now();
        while !gates[0].acquire(Duration::from_millis(5)).unwrap() {
            assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
        }
        assert!(!gates[1].slice_over(), "vGPU 1 held on");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
