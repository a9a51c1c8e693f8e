//! Sharing a GPU at once (`sched::Sharing::Concurrent`, the default).
//!
//! An exclusive grant leaves the GPU idle whenever its holder's guest is
//! between calls, while the others' work waits: eight VMs of a launch-and-
//! read-back loop did together what one did alone. Here every vGPU with
//! work holds the GPU at the same time, and the driver interleaves their
//! contexts as it does natively; the fair queue decides only who must
//! wait, so the GPU idles only when no vGPU may run.
//!
//! - Each holder charges the GPU time its own busy periods took as it goes
//!   (`CHARGE`, at least every eighth of its slice), so start tags advance
//!   while it holds.
//! - A holder with nothing to run keeps its grant through its guests'
//!   pauses (up to 100 ms, as a lone holder does), so that its next call
//!   needs no round trip; it says so (`IDLE`, then `WANT` when it has work
//!   again), and one idle for more than [`IDLE_SLICES`] of a slice is not
//!   backlogged: it does not want the GPU now.
//! - A backlogged vGPU (a holder not idle, or one waiting) is *short*
//!   while its own GPU time (a moving rate of its charges, less the
//!   stretching of its work by the others' beside it) is below its
//!   entitlement: its weight over the backlogged vGPUs' weights, of the
//!   whole GPU. A vGPU whose start tag is more than [`LEAD_SLICES`] of the
//!   lightest runnable vGPU's slices ahead of a short vGPU's is ahead of
//!   its share: it is not granted, and a holder that gets there is told
//!   `CONTENDED`, so it gives the grant back at its slice's end and waits
//!   until the short ones have their share. No vGPU is held back for one
//!   that gets its entitlement already: a latency-bound guest that cannot
//!   use more costs the others nothing (max-min fairness, work-conserving).
//! - A heavy vGPU (long stretches of device work of its own:
//!   [`HEAVY_OWN_NS`]; or long and [`HEAVY_APART`] times the others':
//!   [`HEAVY_BURST_NS`]) keeps the GPU busy by itself; beside it, others'
//!   work would only wait and slow it. It holds the GPU alone, for a
//!   slice, in its turn by the fair queue's order, as under exclusive
//!   sharing; light ones hold it together. Holders in the way of a
//!   waiting vGPU end their grants at their slices' ends (`CONTENDED`).
//! - At most [`LIGHT_AT_ONCE`] light vGPUs with work hold at once; the
//!   others wait in the queue's order, and a holder more than a slice of a
//!   backlogged vGPU's share ahead of the first one waiting ends its grant
//!   at its slice's end (`CONTENDED`).
//! - Every other holder gets one slice more (`EXTEND`) whenever less than
//!   one is left: nothing drains at slice ends while no one waits.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use wire::grant::{ALONE, CONTENDED, EXTEND, GRANT, LONE, SHARED};

use super::Service;

/// How far ahead of the backlogged vGPUs a vGPU may run before it waits,
/// in slices of the lightest runnable vGPU.
pub(super) const LEAD_SLICES: u128 = 4;

/// A holder idle this long, in base slices, is not backlogged.
pub(super) const IDLE_SLICES: f64 = 0.25;

/// A backlogged vGPU whose own GPU time is below this much of its
/// entitlement is short, until it passes [`CAUGHT_UP`] of it (hysteresis:
/// holding others back for it takes effect a slice late).
pub(super) const SHORT: f64 = 1.0;
pub(super) const CAUGHT_UP: f64 = 1.1;

/// The moving rates' time constant, in base slices.
pub(super) const RATE_SLICES: f64 = 4.0;

/// What sharing the GPU at once keeps of each vGPU.
#[derive(Debug)]
pub(super) struct Shared {
    /// Holders that said they have nothing to run, and since when.
    pub idle_since: HashMap<u32, Instant>,
    /// vGPUs that hold the GPU alone.
    pub heavy: HashSet<u32>,
    /// The stretches of each vGPU's device work.
    bursts: HashMap<u32, Bursts>,
    /// vGPUs found short (see [`SHORT`]) and not yet past [`CAUGHT_UP`].
    short: HashSet<u32>,
    /// Each vGPU's GPU time a second lately, and when it was last updated.
    rate: HashMap<u32, (f64, Instant)>,
    /// The rates' time constant.
    rate_tau: Duration,
    /// A holder idle this long is not backlogged ([`IDLE_SLICES`]).
    idle_for: Duration,
}

impl Shared {
    /// Nothing kept yet, on a GPU of base slices `slice`.
    pub fn new(slice: Duration) -> Shared {
        Shared {
            idle_since: HashMap::new(),
            heavy: HashSet::new(),
            bursts: HashMap::new(),
            short: HashSet::new(),
            rate: HashMap::new(),
            rate_tau: slice.mul_f64(RATE_SLICES),
            idle_for: slice.mul_f64(IDLE_SLICES),
        }
    }

    /// Whether `id` is backlogged: it has not said it has nothing to run,
    /// or said so less than [`IDLE_SLICES`] of a slice ago.
    fn has_work(&self, id: u32) -> bool {
        self.idle_since
            .get(&id)
            .is_none_or(|t| t.elapsed() < self.idle_for)
    }

    /// Whether `id` is light and backlogged.
    fn busy_light(&self, id: u32) -> bool {
        !self.heavy.contains(&id) && self.has_work(id)
    }

    /// `id` used `ns` of GPU time (a charge or a release): its rate grows,
    /// and it is not idle.
    pub fn used(&mut self, id: u32, ns: u64) {
        self.idle_since.remove(&id);
        self.add(id, ns, Instant::now());
    }

    fn add(&mut self, id: u32, ns: u64, now: Instant) {
        let tau = self.rate_tau;
        let r = self.rate.entry(id).or_insert((0.0, now));
        r.0 = decayed(*r, now, tau) + ns as f64 / tau.as_nanos() as f64;
        r.1 = now;
    }

    /// `id`'s GPU time a second lately.
    fn rate(&self, id: u32, now: Instant) -> f64 {
        self.rate
            .get(&id)
            .map_or(0.0, |&r| decayed(r, now, self.rate_tau))
    }

    /// `id`'s own GPU time a second lately: its rate, less the stretching
    /// of its work by the others' work beside it (its stretches now
    /// against its shortest lately, see [`Bursts`]).
    fn own_rate(&self, id: u32, now: Instant) -> f64 {
        let stretch = self.bursts.get(&id).map_or(1.0, Bursts::stretch);
        self.rate(id, now) / stretch
    }

    /// Whether backlogged `id`, entitled to `share` of the GPU, is short
    /// of it: below [`SHORT`] of it, until past [`CAUGHT_UP`] again.
    fn is_short(&mut self, id: u32, share: f64, now: Instant) -> bool {
        let own = self.own_rate(id, now);
        if own < SHORT * share {
            self.short.insert(id);
        } else if own >= CAUGHT_UP * share {
            self.short.remove(&id);
        }
        self.short.contains(&id)
    }

    /// `id`'s mean stretch, once it has charged enough to trust it.
    fn settled_mean(&self, id: u32) -> Option<f64> {
        self.bursts
            .get(&id)
            .filter(|b| b.charges >= Bursts::MEAN_SETTLED)
            .map(|b| b.mean)
    }

    /// A charge of `used` ns in `n` stretches, made while `beside` vGPUs
    /// with work held the GPU with it: whether `id` is heavy now, against
    /// `others`, the other runnable vGPUs' typical mean stretch (their
    /// lower median; `None` while none has charged enough).
    fn stretches(
        &mut self,
        id: u32,
        used: u64,
        n: u64,
        beside: usize,
        others: Option<f64>,
    ) -> bool {
        let b = self.bursts.entry(id).or_default();
        if let Some(mean) = used.checked_div(n) {
            b.add(mean as f64, beside);
        }
        let (heavy, own) = (HEAVY_BURST_NS as f64, HEAVY_OWN_NS as f64);
        let apart = |factor: f64| others.is_none_or(|o| b.mean >= factor * o);
        let long_alone = b.own >= own;
        let long_apart = b.mean >= heavy && apart(HEAVY_APART);
        let changed = if long_alone || long_apart {
            self.heavy.insert(id)
        } else if b.own < own / 2.0 && (b.mean < heavy / 2.0 || !apart(HEAVY_APART / 2.0)) {
            self.heavy.remove(&id)
        } else {
            false
        };
        let is = self.heavy.contains(&id);
        if changed {
            tracing::debug!(
                vgpu = id,
                heavy = is,
                mean_us = b.mean / 1e3,
                own_us = b.own / 1e3,
                others_us = others.map(|o| o / 1e3),
                "a vGPU's heavy verdict changed"
            );
        }
        is
    }

    /// `id` left the GPU.
    pub fn forget(&mut self, id: u32) {
        self.idle_since.remove(&id);
        self.heavy.remove(&id);
        self.bursts.remove(&id);
        self.short.remove(&id);
        self.rate.remove(&id);
    }
}

/// The stretches of a vGPU's device work (a busy period between two
/// synchronizations; a chunk of a copy out): a slow moving mean, and the
/// smallest that mean was lately, which rises back slowly. Work beside
/// its own on the GPU (contexts interleaved) stretches them; their mean
/// over the smallest is how much, what its charges hold of the others'.
#[derive(Debug, Default)]
struct Bursts {
    mean: f64,
    floor: f64,
    charges: u32,
    /// A slow moving mean of the stretches over the number of vGPUs with
    /// work holding the GPU beside it, plus one: the length its own work
    /// would have, were its context given the GPU in turn with theirs.
    own: f64,
}

impl Bursts {
    /// Charges before the floor is trusted (the mean starts at 0).
    const SETTLED: u32 = 64;
    /// Charges before the mean is compared with another vGPU's.
    const MEAN_SETTLED: u32 = 16;

    /// A stretch of `burst` ns, made while `beside` vGPUs with work held
    /// the GPU with it.
    fn add(&mut self, burst: f64, beside: usize) {
        // Slow: a few long stretches (a busy host's CPU late, a setup
        // copy) make no vGPU heavy.
        self.mean += (burst - self.mean) / 16.0;
        // Interleaved with the others' work, a stretch is at most that
        // many times its own length.
        self.own += (burst / (beside + 1) as f64 - self.own) / 16.0;
        self.charges = self.charges.saturating_add(1);
        if self.charges == Self::SETTLED {
            self.floor = self.mean;
        } else if self.charges > Self::SETTLED {
            self.floor = self.floor.min(self.mean);
            self.floor += (self.mean - self.floor) / 256.0;
        }
    }

    /// How much longer its stretches are now than lately at their
    /// shortest (1 until settled; at most 4).
    fn stretch(&self) -> f64 {
        if self.charges <= Self::SETTLED || self.floor <= 0.0 {
            return 1.0;
        }
        (self.mean / self.floor).clamp(1.0, 4.0)
    }
}

/// The short vGPUs' two smallest start tags (a vGPU is never held back
/// for itself) and the lead allowed over them, for one pass.
#[derive(Debug, Default)]
pub(super) struct Lead {
    shortest: [Option<(u32, u128)>; 2],
    bound: u128,
}

impl Lead {
    fn add_short(&mut self, id: u32, tag: u128) {
        let e = Some((id, tag));
        match self.shortest {
            [None, _] => self.shortest[0] = e,
            [Some(a), _] if tag < a.1 => self.shortest = [e, Some(a)],
            [_, None] => self.shortest[1] = e,
            [_, Some(b)] if tag < b.1 => self.shortest[1] = e,
            _ => {}
        }
    }

    /// Whether `id` is ahead of its share: more than the bound ahead of a
    /// short vGPU other than itself.
    fn ahead(&self, svc: &mut Service, id: u32) -> bool {
        let floor = self.shortest.iter().flatten().find(|s| s.0 != id);
        let (Some(&(_, floor)), Some(tag)) = (floor, svc.sched.queue().start_tag(id)) else {
            return false;
        };
        tag.saturating_sub(floor) > self.bound
    }
}

/// A moving rate `(value, at)` decayed to `now` with time constant `tau`.
fn decayed((value, at): (f64, Instant), now: Instant, tau: Duration) -> f64 {
    let dt = now.saturating_duration_since(at).as_secs_f64();
    value * (-dt / tau.as_secs_f64().max(1e-9)).exp()
}

/// Light vGPUs holding the GPU at once, at most, while they have work;
/// the others wait in the queue's order, and the holders furthest ahead
/// of them give their grants back at their slices' ends. More contexts at
/// once add only the driver's switching between them, and stretch each
/// other's busy periods unevenly, so that equal charges buy unequal work:
/// on an H200, 32 VMs of a latency-bound loop did 1.67-1.69 times their
/// unscheduled rounds at five at once (MMR 0.94-0.95), 1.31-1.52 at eight
/// (MMR 0.72-0.84); four at once left 8 VMs at 0.83 of unscheduled.
pub(super) const LIGHT_AT_ONCE: usize = 5;

/// How long a vGPU's stretches of device work (a busy period between two
/// synchronizations; a chunk of a copy out) last on average at least, to
/// count heavy by being [`HEAVY_APART`] times the others' (light again
/// below half of it): it keeps the GPU busy by itself, and work beside its
/// own would only wait behind it and slow it. A heavy vGPU holds the GPU
/// alone; light ones hold it together.
pub(super) const HEAVY_BURST_NS: u64 = 250_000;

/// A vGPU whose stretches of device work over the vGPUs with work holding
/// beside it, plus one, last this long on average is heavy whatever the
/// others' (light again below half of it): alike 2 ms kernels of three VMs
/// take turns by weight. Shorter, a light guest's stretches lengthened by
/// waits for a CPU on a busy host counted heavy (beside 12 CPU hogs, MMR
/// 0.78-0.95 at 250 us against 0.89-0.99 with no such test).
pub(super) const HEAVY_OWN_NS: u64 = 1_000_000;

/// A vGPU whose stretches are this many times the other runnable vGPUs'
/// typical one (their lower median) and [`HEAVY_BURST_NS`] long is heavy
/// too, however many hold beside it (light again below half of it): a
/// 400 us kernel's beside a 20 us kernel's.
pub(super) const HEAVY_APART: f64 = 4.0;

impl Service {
    /// One pass: holders ahead are told to stop, runnable vGPUs not ahead
    /// are granted in the fair queue's order (light ones together, a heavy
    /// one alone), and holders no one waits for are extended.
    pub(super) fn share(&mut self) {
        let now_ns = self.now_ns();
        let holding: Vec<u32> = self.co.holders.keys().copied().collect();
        let heavy_holds = holding.iter().any(|id| self.shared.heavy.contains(id));
        // Who may run now, in the queue's order: lights while no heavy
        // holds or waits before them; a heavy one once nobody holds. One
        // found heavy while it held beside others has them end their grants.
        let mut waiting = heavy_holds && holding.len() > 1;
        let mut grant = Vec::new();
        let candidates = self.sched.candidates(now_ns, &holding);
        let others = candidates.len() > 1;
        let lead = self.lead();
        let mut lights = holding
            .iter()
            .filter(|&&h| self.shared.busy_light(h))
            .count();
        // Light ones past the most at once, in the queue's order.
        let mut capped = Vec::new();
        for id in candidates {
            if lead.ahead(self, id) {
                continue;
            }
            let heavy = self.shared.heavy.contains(&id);
            if heavy_holds || waiting {
                waiting = true;
                break;
            }
            if heavy {
                if holding.is_empty() && grant.is_empty() {
                    grant.push(id);
                } else {
                    waiting = true;
                }
                break;
            }
            if lights >= LIGHT_AT_ONCE {
                capped.push(id);
                continue;
            }
            lights += 1;
            grant.push(id);
        }
        let rotate = self.rotation(&holding, &capped);
        for id in grant {
            let slice = self.sched.slice_for(id);
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            // A heavy one holds alone: lone only while no other wants it.
            let bits = if self.shared.heavy.contains(&id) {
                SHARED | ALONE | if others { 0 } else { LONE }
            } else {
                SHARED | LONE
            };
            if c.send(id, GRANT, slice, bits) {
                self.co
                    .holders
                    .insert(id, Instant::now() + Duration::from_nanos(slice));
                self.live(|u| {
                    let v = u.entry(id).or_default();
                    v.holding = true;
                    v.grants += 1;
                });
            }
        }
        let now = Instant::now();
        for id in holding {
            // Ahead of its share, or in the way of one waiting: it ends
            // its grant at its slice's end.
            if waiting || lead.ahead(self, id) || rotate.contains(&id) {
                if self.stopping.insert(id) {
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.send(id, CONTENDED, 0, 0);
                    }
                }
                continue;
            }
            let Some(&end) = self.co.holders.get(&id) else {
                continue;
            };
            if self.stopping.contains(&id) || end.saturating_duration_since(now) > self.slice {
                continue;
            }
            let slice = self.sched.slice_for(id);
            if let Some(c) = self.conns.get_mut(&id) {
                if c.send(id, EXTEND, slice, 0) {
                    self.co
                        .holders
                        .insert(id, end.max(now) + Duration::from_nanos(slice));
                }
            }
        }
    }

    /// While light vGPUs wait for room (`capped`, in the queue's order),
    /// the busy light holders that are to end their grants at their
    /// slices' ends: those more than a slice of a backlogged vGPU's share
    /// ahead of the first one waiting, furthest ahead first, one for each
    /// waiting.
    fn rotation(&mut self, holding: &[u32], capped: &[u32]) -> HashSet<u32> {
        let q = self.sched.queue();
        let Some(first) = capped.first().and_then(|&c| q.start_tag(c)) else {
            return HashSet::new();
        };
        let weights: f64 = q.runnable_ids().filter_map(|v| q.weight(v)).sum();
        let per_slice = self.slice_ns as f64 * sched::sfq::TAG_SCALE / weights.max(1e-9);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        // positive, far below u128::MAX
        let bound = first.saturating_add(per_slice.round() as u128);
        let mut ahead: Vec<(u128, u32)> = holding
            .iter()
            .copied()
            .filter(|&h| !self.stopping.contains(&h) && self.shared.busy_light(h))
            .filter_map(|h| Some((q.start_tag(h)?, h)))
            .filter(|&(tag, _)| tag > bound)
            .collect();
        ahead.sort_unstable_by(|a, b| b.cmp(a));
        let already = holding.iter().filter(|h| self.stopping.contains(h)).count();
        ahead
            .into_iter()
            .take(capped.len().saturating_sub(already))
            .map(|(_, h)| h)
            .collect()
    }

    /// The bound on how far a vGPU may run ahead of the short ones, for
    /// one pass (see the module's comment).
    fn lead(&mut self) -> Lead {
        let now = Instant::now();
        let mut lead = Lead::default();
        let q = self.sched.queue();
        let backlogged: Vec<(u32, f64)> = q
            .runnable_ids()
            .filter(|&v| self.shared.has_work(v))
            .filter_map(|v| Some((v, q.weight(v)?)))
            .collect();
        let weights: f64 = backlogged.iter().map(|b| b.1).sum();
        let lightest = q
            .runnable_ids()
            .filter_map(|v| q.weight(v))
            .fold(f64::INFINITY, f64::min);
        if !lightest.is_finite() {
            return lead;
        }
        for &(v, w) in &backlogged {
            let Some(tag) = q.start_tag(v) else {
                continue;
            };
            if self.shared.is_short(v, w / weights, now) {
                lead.add_short(v, tag);
            }
        }
        let per_slice = self.slice_ns as f64 * sched::sfq::TAG_SCALE / lightest;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        // positive, far below u128::MAX
        let bound = LEAD_SLICES * per_slice.round() as u128;
        lead.bound = bound;
        lead
    }

    /// `IDLE`: a shared holder has nothing to run; it keeps its grant.
    pub(super) fn on_idle(&mut self, id: u32) {
        if self.co.holders.contains_key(&id) {
            self.shared
                .idle_since
                .entry(id)
                .or_insert_with(Instant::now);
        }
    }

    /// `CHARGE`: a shared holder used `used` ns of GPU time in `bursts`
    /// stretches of device work since its last charge; its start tag
    /// advances now, the grant kept. Whether it is heavy follows from the
    /// mean stretch (see [`HEAVY_BURST_NS`]).
    pub(super) fn on_charge(&mut self, id: u32, used: u64, bursts: u64) {
        if !self.co.holders.contains_key(&id) {
            return;
        }
        let beside = self
            .co
            .holders
            .keys()
            .filter(|&&h| h != id && self.shared.has_work(h))
            .count();
        let q = self.sched.queue();
        let mut settled: Vec<f64> = q
            .runnable_ids()
            .filter(|&v| v != id)
            .filter_map(|v| self.shared.settled_mean(v))
            .collect();
        settled.sort_by(f64::total_cmp);
        let typical = settled.get(settled.len().saturating_sub(1) / 2).copied();
        self.shared.stretches(id, used, bursts, beside, typical);
        let _ = self.sched.release(id, used);
        self.shared.add(id, used, Instant::now());
        self.live(|u| {
            let v = u.entry(id).or_default();
            // The worker's word: a huge one saturates.
            v.charged_ns = v.charged_ns.saturating_add(used);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use worker::gate::Gate;

    use super::LIGHT_AT_ONCE;
    use crate::grant::GrantService;

    const SLICE_NS: u64 = 4_000_000;

    fn shared(name: &str) -> GrantService {
        let dir = scratch::dir(&format!("fvg-share-{name}"));
        GrantService::start_sharing(&dir.join("g.sock"), SLICE_NS, sched::Sharing::Concurrent)
            .unwrap()
    }

    /// Whether `g` holds the grant within `wait`.
    fn granted_within(g: &mut Gate, wait: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < wait {
            if g.acquire(Duration::from_millis(1)).unwrap() {
                return true;
            }
        }
        false
    }

    #[test]
    fn light_vgpus_hold_the_gpu_at_once() {
        let svc = shared("light");
        let mut a = Gate::connect(svc.path(), 1, 1.0).unwrap();
        let mut b = Gate::connect(svc.path(), 2, 1.0).unwrap();
        assert!(granted_within(&mut a, Duration::from_secs(5)));
        // Under exclusive sharing b would wait for a's slice to end.
        assert!(granted_within(&mut b, Duration::from_secs(1)));
        assert!(a.holding() && a.shared() && b.shared() && !a.shared_alone());
    }

    #[test]
    fn past_the_cap_of_light_vgpus_one_waits_until_a_holder_ahead_gives_way() {
        let svc = shared("cap");
        let cap = u32::try_from(LIGHT_AT_ONCE).unwrap();
        let mut gates: Vec<Gate> = (1..=cap)
            .map(|id| Gate::connect(svc.path(), id, 1.0).unwrap())
            .collect();
        for g in &mut gates {
            assert!(granted_within(g, Duration::from_secs(5)));
        }
        let mut next = Gate::connect(svc.path(), cap + 1, 1.0).unwrap();
        assert!(!granted_within(&mut next, Duration::from_millis(50)));
        // The first runs far ahead; told so, it gives its grant back.
        gates[0].charge(10 * SLICE_NS, 100).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        gates[0].release(0, true).unwrap();
        assert!(granted_within(&mut next, Duration::from_secs(1)));
        // It is not granted again while the one waiting is behind it.
        assert!(!granted_within(&mut gates[0], Duration::from_millis(50)));
    }

    #[test]
    fn a_heavy_vgpu_holds_the_gpu_alone_and_others_wait_for_its_slice() {
        let svc = shared("heavy");
        let mut h = Gate::connect(svc.path(), 1, 1.0).unwrap();
        assert!(granted_within(&mut h, Duration::from_secs(5)));
        // Stretches of 1 ms: heavy once the moving mean passes 250 us.
        for _ in 0..32 {
            h.charge(1_000_000, 1).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        let mut l = Gate::connect(svc.path(), 2, 1.0).unwrap();
        assert!(!granted_within(&mut l, Duration::from_millis(2)));
        // The heavy holder is told to end its grant at its slice's end
        // (`CONTENDED`): it was alone when granted.
        let t = Instant::now();
        while h.alone() {
            h.extended();
            assert!(t.elapsed() < Duration::from_secs(1), "never told");
        }
        h.release(1_000_000, true).unwrap();
        assert!(granted_within(&mut l, Duration::from_secs(1)));
    }

    #[test]
    fn a_vgpu_far_ahead_of_a_short_one_waits_until_it_has_its_share() {
        let svc = shared("ahead");
        let mut a = Gate::connect(svc.path(), 1, 1.0).unwrap();
        let mut b = Gate::connect(svc.path(), 2, 1.0).unwrap();
        let mut c = Gate::connect(svc.path(), 3, 1.0).unwrap();
        for g in [&mut a, &mut b, &mut c] {
            assert!(granted_within(g, Duration::from_secs(5)));
        }
        // a used five slices in short stretches (light); c, backlogged,
        // nothing yet: c is short of its third.
        for _ in 0..50 {
            a.charge(SLICE_NS / 10, 40).unwrap();
        }
        a.release(0, true).unwrap();
        // b busy too (1 ms of GPU time each 1 ms or so): a waits for c.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            b.charge(1_000_000, 10).unwrap();
            assert!(!a.acquire(Duration::from_millis(1)).unwrap(), "a ran ahead");
        }
        // c charges as much as a did: a is granted again.
        for _ in 0..50 {
            c.charge(SLICE_NS / 10, 40).unwrap();
        }
        assert!(granted_within(&mut a, Duration::from_secs(1)));
    }

    #[test]
    fn a_vgpu_ahead_runs_on_beside_one_that_has_its_share() {
        let svc = shared("spare");
        let mut a = Gate::connect(svc.path(), 1, 1.0).unwrap();
        let mut b = Gate::connect(svc.path(), 2, 1.0).unwrap();
        assert!(granted_within(&mut a, Duration::from_secs(5)));
        assert!(granted_within(&mut b, Duration::from_secs(1)));
        // a far ahead (fifty slices), then b busy at the whole GPU's rate
        // for a while: b's start tag is still far behind a's, but b gets
        // more than its half now. Under a start-tag bound alone a would
        // wait for b; holding a back would only slow a.
        for _ in 0..500 {
            a.charge(SLICE_NS / 10, 40).unwrap();
        }
        a.release(0, true).unwrap();
        let t = Instant::now();
        let mut granted = false;
        while t.elapsed() < Duration::from_millis(80) {
            b.charge(3_000_000, 30).unwrap();
            granted |= t.elapsed() > Duration::from_millis(40)
                && a.acquire(Duration::from_millis(1)).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(granted, "a was held back for b, which had its share");
    }

    #[test]
    fn the_lead_keeps_the_two_smallest_short_tags() {
        let mut lead = super::Lead::default();
        for (id, tag) in [(1, 50), (2, 30), (3, 40), (4, 10), (5, 20)] {
            lead.add_short(id, tag);
        }
        assert_eq!(lead.shortest, [Some((4, 10)), Some((5, 20))]);
    }

    #[test]
    fn heavy_is_long_work_of_its_own_not_work_stretched_by_the_others() {
        use super::Shared;
        let mut s = Shared::new(Duration::from_millis(4));
        // Forty charges of one stretch each, `beside` others holding with
        // work, against the others' typical stretch.
        let mut heavy = |id, ns, beside, others: Option<f64>| {
            (0..40)
                .map(|_| s.stretches(id, ns, 1, beside, others))
                .last()
                .unwrap_or(false)
        };
        // Eight alike VMs stretching each other to 400 us: light.
        assert!(!heavy(1, 400_000, 7, Some(400_000.0)));
        // Three alike VMs of 2 ms kernels: heavy, each takes turns alone.
        assert!(heavy(2, 6_000_000, 2, Some(6_000_000.0)));
        // 400 us kernels beside 20 us ones: heavy.
        assert!(heavy(3, 500_000, 2, Some(50_000.0)));
        // Alone with long work: heavy; short work: light.
        assert!(heavy(4, 400_000, 0, None));
        assert!(!heavy(5, 100_000, 0, None));
        // A light guest's stretches lengthened by waits for a CPU, beside
        // others alike, holding alone between them: light.
        assert!(!heavy(6, 400_000, 0, Some(300_000.0)));
    }

    #[test]
    fn stretches_are_measured_against_the_shortest_lately() {
        let mut b = super::Bursts::default();
        for _ in 0..300 {
            b.add(100.0, 0);
        }
        assert!((b.stretch() - 1.0).abs() < 0.02, "{}", b.stretch());
        // Others' work beside its own: stretches of 150.
        for _ in 0..48 {
            b.add(150.0, 0);
        }
        assert!(b.stretch() > 1.3 && b.stretch() < 1.5, "{}", b.stretch());
        // For good: the floor rises to the new length in time.
        for _ in 0..4000 {
            b.add(150.0, 0);
        }
        assert!(b.stretch() < 1.05, "{}", b.stretch());
    }
}
