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
//! - A vGPU whose start tag is more than [`LEAD_SLICES`] of the lightest
//!   runnable vGPU's slices ahead of the smallest start tag among the
//!   backlogged vGPUs (holders not idle, and those waiting) is ahead of its
//!   share: it is not granted, and a holder that gets there is told
//!   `CONTENDED`, so it gives the grant back at its slice's end and waits
//!   until the others catch up; those behind run alone meanwhile. A guest
//!   slowed by the others' work beside its own stays backlogged through its
//!   short pauses between calls, so it gets its share back this way; one
//!   whose guest computes between calls is not backlogged then, and the
//!   others are not held back for it.
//! - A heavy vGPU (long stretches of device work: [`HEAVY_BURST_NS`]) keeps
//!   the GPU busy by itself; beside it, others' work would only wait and
//!   slow it. It holds the GPU alone, for a slice, in its turn by the fair
//!   queue's order, as under exclusive sharing; light ones hold it
//!   together. Holders in the way of a waiting vGPU end their grants at
//!   their slices' ends (`CONTENDED`).
//! - Every other holder gets one slice more (`EXTEND`) whenever less than
//!   one is left: nothing drains at slice ends while no one waits.

use std::time::{Duration, Instant};

use wire::grant::{ALONE, CONTENDED, EXTEND, GRANT, LONE, SHARED};

use super::Service;

/// How far ahead of the backlogged vGPUs a vGPU may run before it waits,
/// in slices of the lightest runnable vGPU.
pub(super) const LEAD_SLICES: u128 = 4;

/// A holder idle this long, in base slices, is not backlogged.
pub(super) const IDLE_SLICES: f64 = 0.25;

/// A vGPU whose stretches of device work (a busy period between two
/// synchronizations; a chunk of a copy out) last this long on average is
/// heavy: it keeps the GPU busy by itself, and work beside its own would
/// only wait behind it and slow it. It holds the GPU alone; light ones
/// hold it together (below half of this one is light again).
pub(super) const HEAVY_BURST_NS: u64 = 250_000;

impl Service {
    /// One pass: holders ahead are told to stop, runnable vGPUs not ahead
    /// are granted in the fair queue's order (light ones together, a heavy
    /// one alone), and holders no one waits for are extended.
    pub(super) fn share(&mut self) {
        let now_ns = self.now_ns();
        let holding: Vec<u32> = self.co.holders.keys().copied().collect();
        let heavy_holds = holding.iter().any(|id| self.heavy.contains(id));
        // Who may run now, in the queue's order: lights while no heavy
        // holds or waits before them; a heavy one once nobody holds. One
        // found heavy while it held beside others has them end their grants.
        let mut waiting = heavy_holds && holding.len() > 1;
        let mut grant = Vec::new();
        let candidates = self.sched.candidates(now_ns, &holding);
        let others = candidates.len() > 1;
        for id in candidates {
            if self.ahead(id) {
                continue;
            }
            let heavy = self.heavy.contains(&id);
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
            grant.push(id);
        }
        for id in grant {
            let slice = self.sched.slice_for(id);
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            // A heavy one holds alone: lone only while no other wants it.
            let bits = if self.heavy.contains(&id) {
                SHARED | ALONE | if others { 0 } else { LONE }
            } else {
                SHARED | LONE
            };
            if c.send(id, GRANT, slice, bits) {
                self.co
                    .holders
                    .insert(id, Instant::now() + Duration::from_nanos(slice));
                self.live(|u| u.entry(id).or_default().holding = true);
            }
        }
        let now = Instant::now();
        for id in holding {
            // Ahead of its share, or in the way of one waiting: it ends
            // its grant at its slice's end.
            if waiting || self.ahead(id) {
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

    /// Whether `id`'s start tag is more than [`LEAD_SLICES`] of the
    /// lightest runnable vGPU's slices ahead of the backlogged vGPUs.
    fn ahead(&mut self, id: u32) -> bool {
        let idle_for = Duration::from_secs_f64(self.slice.as_secs_f64() * IDLE_SLICES);
        let q = self.sched.queue();
        let lightest = q
            .runnable_ids()
            .filter_map(|v| q.weight(v))
            .fold(f64::INFINITY, f64::min);
        let backlogged = q
            .runnable_ids()
            .filter(|v| {
                self.idle_since
                    .get(v)
                    .is_none_or(|t| t.elapsed() < idle_for)
            })
            .filter_map(|v| q.start_tag(v))
            .min();
        let (Some(floor), true) = (backlogged, lightest.is_finite()) else {
            return false;
        };
        let per_slice = self.slice_ns as f64 * sched::sfq::TAG_SCALE / lightest;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        // positive, far below u128::MAX
        let bound = LEAD_SLICES * per_slice.round() as u128;
        q.start_tag(id)
            .is_some_and(|s| s.saturating_sub(floor) > bound)
    }

    /// `IDLE`: a shared holder has nothing to run; it keeps its grant.
    pub(super) fn on_idle(&mut self, id: u32) {
        if self.co.holders.contains_key(&id) {
            self.idle_since.entry(id).or_insert_with(Instant::now);
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
        if let Some(mean) = used.checked_div(bursts) {
            // A slow moving mean: a few long stretches (a busy host's CPU
            // late, a setup copy) make no vGPU heavy.
            let burst = self.burst_ns.entry(id).or_default();
            *burst += (mean as f64 - *burst) / 16.0;
            if *burst >= HEAVY_BURST_NS as f64 {
                self.heavy.insert(id);
            } else if *burst < HEAVY_BURST_NS as f64 / 2.0 {
                self.heavy.remove(&id);
            }
        }
        let _ = self.sched.release(id, used);
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
    fn a_vgpu_far_ahead_of_its_share_waits_while_the_other_catches_up() {
        let svc = shared("ahead");
        let mut a = Gate::connect(svc.path(), 1, 1.0).unwrap();
        let mut b = Gate::connect(svc.path(), 2, 1.0).unwrap();
        assert!(granted_within(&mut a, Duration::from_secs(5)));
        assert!(granted_within(&mut b, Duration::from_secs(1)));
        // a used five slices in short stretches (light), b nothing: a gives
        // its grant back and is not granted again while b has not caught up.
        for _ in 0..50 {
            a.charge(SLICE_NS / 10, 40).unwrap();
        }
        a.release(0, true).unwrap();
        assert!(!granted_within(&mut a, Duration::from_millis(50)));
        // b charges as much: a is granted again.
        for _ in 0..50 {
            b.charge(SLICE_NS / 10, 40).unwrap();
        }
        assert!(granted_within(&mut a, Duration::from_secs(1)));
    }
}
