//! Grants taken back: from a worker that keeps the GPU far past its
//! slice (stuck, or busy with something that never ends), which every
//! other vGPU would wait on otherwise.

use std::time::{Duration, Instant};

use super::Service;

impl Service {
    /// A worker that keeps the GPU far past its slice (stuck, or busy with
    /// something that never ends) loses it: every other vGPU would wait on
    /// it otherwise; so does a co-holder past the round's end, and a
    /// drainer that never releases.
    pub(super) fn revoke_overdue(&mut self) {
        // (vGPU, its charge as at a release, how long past its grant's end)
        let mut revoked: Vec<(u32, u64, Duration)> = Vec::new();
        let now = Instant::now();
        let overrun = now.saturating_duration_since(self.deadline);
        if let Some(id) = self
            .holder
            .filter(|_| overrun + self.slice > self.hold_limit)
        {
            revoked.push((id, crate::nanos(self.held_since.elapsed()), overrun));
            self.holder = None;
        }
        for id in self.co.overdue(self.hold_limit.saturating_sub(self.slice)) {
            // A shared holder's time is charged as it goes (`CHARGE`); a
            // co-runner's, by its round's split.
            let past = self
                .co
                .holders
                .get(&id)
                .map_or(Duration::ZERO, |&end| now.saturating_duration_since(end));
            revoked.push((id, self.co.held_ns(id), past));
        }
        // A drainer that went away, or never releases.
        self.drainer = self.drainer.filter(|d| self.conns.contains_key(&d.0));
        if let Some((id, since)) = self.drainer.filter(|d| d.1.elapsed() > self.hold_limit) {
            revoked.push((id, crate::nanos(since.elapsed()), since.elapsed()));
            self.drainer = None;
        }
        for (id, held, past) in revoked {
            self.revoke(id, held, past);
        }
    }

    /// Takes the GPU back from `id`, which kept it `past` beyond its
    /// grant's end: it is charged `held` ns (as at a release) and counts as
    /// idle until it asks again; its late release is ignored.
    fn revoke(&mut self, id: u32, held: u64, past: Duration) {
        let charge = self.co.charge(
            id,
            held,
            &self.usage.lock().unwrap_or_else(|e| e.into_inner()),
        );
        self.co.forget(id);
        self.stopping.remove(&id);
        let now = self.now_ns();
        let _ = self.sched.release(id, charge);
        let _ = self.sched.idle(id, now);
        if self.active.remove(&id) {
            self.apply_shares();
        }
        self.live(|u| {
            let v = u.entry(id).or_default();
            v.charged_ns = v.charged_ns.saturating_add(charge);
            v.holding = false;
            v.revoked += 1;
        });
        transport::rate_limited!(
            self.logs.entry(id).or_default(),
            warn,
            vgpu = id,
            past_ms = crate::nanos(past) / 1_000_000,
            charged_ms = charge / 1_000_000,
            "grant taken back from a worker that kept it past its slice"
        );
    }
}
