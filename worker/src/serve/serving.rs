//! The serving loop: every channel polled in turn, the grant taken and
//! given back, migrations and reports looked at between turns, and the
//! doorbells slept on when every channel is idle.

use std::os::fd::AsFd;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::time::TimeSpec;

use super::channel::{retire, service, ChannelState};
use super::handoff::Handoff;
use super::shared::LateWait;
use super::{pin_current_thread, Worker};
use crate::Error;

/// How often a worker whose guests wait on the device (and that has
/// nothing else to do) looks whether it is there.
const WAITING_POLL: Duration = Duration::from_micros(20);

/// The serving thread's timer slack: how much later than asked the kernel
/// may end its sleeps. The default (50 us) would make each
/// [`WAITING_POLL`] look 70 us apart, and a guest waiting on the device
/// (a copy of 64 MiB takes 1.3 ms) learn it was done up to that late.
pub const TIMER_SLACK_NS: u64 = 1_000;

/// How often a holder whose predicted work fills its slice looks whether
/// the device has in fact run it all (see [`Worker::recheck_budget`]).
const BUDGET_CHECK: Duration = Duration::from_micros(50);

/// How long a holder with nothing to run keeps the grant for a guest that
/// has not yet taken its reply (see [`Worker::late_guest`]): a scheduler
/// tick at 250 Hz, about the longest a woken thread that does not preempt
/// the busy one beside it waits for its CPU (0.45 ms on average on a 16-CPU
/// H100 host beside 12 busy loops). The kernel counts a run-queue wait
/// only once the thread runs, so a wait cut short before the guest ran
/// cannot be told to be the host's: with 2 ms, 10-44 waits a round ran out
/// on two CPUs beside two hogs and made most of what the lightest guest
/// was charged for late waits (`results/2026-11-27-sim-late-look.md`).
const LATE_GUEST: Duration = Duration::from_millis(4);

/// How long after its last call a guest whose reply was taken is still
/// between calls (see [`Worker::late_guest`]): a holder with nothing to run
/// keeps the grant that long for its next call. A guest thread the host
/// preempted between a reply and its next call otherwise lost the grant
/// for another vGPU's slice: beside 12 hogs on an H200 the lightest of
/// three guests gave its grant back idle in 49 of 106 grants and got 0.147
/// of the GPU against its 0.167 (`results/2026-11-28-h200-between-calls.md`).
const NEXT_CALL: Duration = Duration::from_millis(1);

/// Of each grant's slice, the part (one in this many) a holder may wait
/// for its late guests uncharged (see [`Worker::late_guest_came`]).
const LATE_GUEST_FREE_PART: u64 = 8;

/// How long a holder that no other vGPU waits beside keeps the grant with
/// nothing to run (see [`Worker::keep_alone`]). A program that computes on
/// the CPU between short bursts of GPU work (a size of a sort, an
/// iteration of a solver, a request of an inference server) finds it held
/// when it comes back within this; after it, an idle VM's worker gives the
/// grant back and sleeps until a guest rings.
const LONE_IDLE_KEEP: Duration = Duration::from_millis(100);

/// How long a worker sleeps at a time while its guests were active within
/// [`LONE_IDLE_KEEP`] and no other vGPU waits for the GPU (see
/// [`Worker::light_sleep`]). A sleep the timer ends this soon keeps the
/// worker's CPU out of a deep idle state: after a 10 ms sleep a doorbell
/// took 49-60 us to wake the thread on an H100 host (a virtual machine
/// whose idle CPUs halt), after sleeps of 50 us 10-14 us
/// (`scripts/gpu/wake.c`).
const LIGHT_SLEEP: Duration = Duration::from_micros(50);

/// A worker whose sleeps have ended by their timeout alone for this
/// long sleeps [`DEEP_IDLE_SLEEP`] at a time: an idle VM's worker wakes
/// once a second instead of every `max_block_us`.
const DEEP_IDLE_AFTER: Duration = Duration::from_secs(1);
const DEEP_IDLE_SLEEP: Duration = Duration::from_secs(1);

/// How long a poisoned worker goes on serving so that its processes can
/// take the kernel output (see `output.rs`) and the fault's error they
/// are owed; it ends as soon as none is owed. At 200 ms a faulting process
/// on a loaded 2-CPU host now and then asked too late and got
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED` instead of its fault's error.
const POISON_GRACE: Duration = Duration::from_secs(1);

impl Worker {
    /// Serves until the stop flag is set. Everything guests held is freed on return.
    pub fn run(mut self) -> Result<(), Error> {
        let served = self.serve();
        if let Some(to) = self.handing_over.take() {
            // Its guests' channels stay claimed: the next worker serves
            // them on from the checkpoint.
            let _ = to.send(self.into_handover());
            return served;
        }
        // However serving ended (stopped, orphaned, poisoned, or an error
        // such as the grant service gone with the daemon), guests still
        // holding channels lose their GPU state: their channels become LOST
        // (not FREE, which would let another guest claim rings the owner may
        // still write), and their owners are woken to see it.
        for c in &mut self.chans {
            retire(&mut self.sh, c, &mut self.sessions);
        }
        if let (Some(k), Some(l)) = (self.sh.port.slot, &self.sh.mem.ledger) {
            l.publish(k, 0, 0);
        }
        match self.sh.port.poisoned.get() {
            Some(status) => Err(Error::Poisoned(status)),
            None => served,
        }
    }

    /// The serving loop of [`Worker::run`].
    fn serve(&mut self) -> Result<(), Error> {
        if let Some(cpu) = self.cpu {
            pin_current_thread(cpu)?;
        }
        // Refused (it is not, on Linux): sleeps end as late as by default.
        if let Err(e) = nix::sys::prctl::set_timerslack(TIMER_SLACK_NS as _) {
            tracing::warn!("worker: timer slack: {e}");
        }
        if let Some(nice) = self.lift_nice {
            // Refused (no CAP_SYS_NICE): it serves as it was started.
            if let Err(e) = crate::priority::lift_current_thread(nice) {
                tracing::warn!("worker: priority lift refused: {e}");
            }
        }
        let mut idle: u32 = 0;
        let mut last_report = Instant::now();
        let mut turns: u32 = 0;
        let mut poisoned_at = None::<Instant>;
        while !self.stop.load(Ordering::Relaxed) && !self.sh.port.link.orphaned() {
            if self.sh.port.poisoned.get().is_some() {
                // The fault's process may still take what its kernels
                // printed (the failed assert's message) and the error of
                // its launch that faulted, which it gets at its next call:
                // a moment for it, no more (every other request now fails).
                let since = *poisoned_at.get_or_insert_with(Instant::now);
                let owed = self.sh.port.output.borrow().any_held() || self.sessions.fault_owed();
                if !owed || since.elapsed() > POISON_GRACE {
                    self.sh.port.link.report_poisoned();
                    break;
                }
            }
            self.migrations()?;
            if self.checkpoints() {
                // Handing over: the region goes on to the next worker.
                return Ok(());
            }
            self.peer_events();
            // Reading the clock on every turn of the polling loop would cost
            // more than the reports themselves: look every 256 turns (and
            // after blocking, below).
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(256) {
                self.periodic(&mut last_report)?;
            }
            let mut busy = false;
            for c in &mut self.chans {
                busy |= service(&mut self.sh, c, &mut self.sessions);
            }
            self.recheck_budget();
            if self.releasing.is_some() {
                if self.poll_release()? {
                    idle = 0;
                    continue;
                }
            } else if self.sh.slice.slice_ended() {
                self.sh.slice.budget_spent = false;
                // A vGPU whose slice ran out while it was running work stays
                // runnable even if its ring is momentarily empty (its guest is
                // between a reply and its next call): reporting it idle would
                // reset its start tag and forfeit the credit it has.
                let active = self.sh.slice.worked;
                self.begin_release(active)?;
                idle = 0;
                continue;
            }
            self.charge_shared(false)?;
            if busy {
                self.late_guest_came();
                self.last_call = Some(Instant::now());
                self.lone_idle_since = None;
                if let Some(g) = self.sh.slice.gate.as_mut() {
                    g.busy()?;
                }
                idle = 0;
                continue;
            }
            // A grant can arrive while there is nothing to run (the vGPU was
            // still queued): take it, so that the idle spin above returns it.
            if let Some(g) = self.sh.slice.gate.as_mut() {
                if !g.holding() && g.wanted() && idle.is_multiple_of(64) {
                    g.acquire(Duration::ZERO)?;
                }
            }
            idle += 1;
            if idle < self.spin.spins / 16 {
                std::hint::spin_loop();
                continue;
            }
            if self.releasing.is_some()
                || self.sh.slice.budget_spent
                || self.chans.iter().any(ChannelState::waiting)
                || self.sessions.host_fn_pending()
            {
                // A guest waits for the device, which still runs its work:
                // the vGPU keeps the GPU, and the worker looks again soon
                // (without spinning the core through a long kernel).
                if self.releasing.is_some() {
                    Handoff::add(&self.sh.port.stats.handoff.drain_sleeps, 1);
                }
                std::thread::sleep(WAITING_POLL);
                if idle.is_multiple_of(256) {
                    self.periodic(&mut last_report)?;
                }
                continue;
            }
            if self.ends_with_process && self.leave_if_unclaimed()? {
                break;
            }
            if let Some(g) = self.sh.slice.gate.as_mut().filter(|g| g.holding()) {
                // What the service said meanwhile (`CONTENDED`, `EXTEND`):
                // both choices below follow from it.
                g.extended();
                if self.late_guest() {
                    // Its CPU, not this one's spin, is what the guest needs.
                    std::thread::sleep(WAITING_POLL);
                    continue;
                }
                if !self.keep_alone() {
                    // Work-conserving: a holder with nothing to run yields
                    // after its spin while another vGPU wants the GPU.
                    Handoff::add(&self.sh.port.stats.handoff.idle_releases, 1);
                    self.release_grant(false)?;
                    idle = 0;
                    continue;
                }
                // Alone, it sleeps with the grant as an idle worker does
                // without: a guest's call, or another vGPU wanting the GPU
                // (the grant's socket), wakes it. On a shared GPU it
                // charges first what it used, and says it has nothing to run.
                self.charge_shared(true)?;
                if let Some(g) = self.sh.slice.gate.as_mut() {
                    g.idle()?;
                }
            }
            let light = self.light_sleep();
            let rung = self.block(light)?;
            self.periodic(&mut last_report)?;
            // Rung (a guest's doorbell, a grant): more requests tend to
            // follow, so spin for them. Woken by the timeout alone (an idle
            // VM): back to sleep at once, so that an idle worker takes no
            // CPU from the host's busy threads.
            idle = if rung { 0 } else { self.spin.spins / 16 };
        }
        if self.sh.slice.gate.as_ref().is_some_and(|g| g.holding()) {
            self.release_grant(false)?;
        }
        Ok(())
    }

    /// A worker that ends with its process (`ends_with_process`), idle:
    /// true if no session is open and its slot's channels are all free,
    /// after it marked its host end asleep and looked once more, so that a
    /// process claiming the slot from then on rings the slot's doorbell,
    /// which the daemon watches once this worker is gone.
    fn leave_if_unclaimed(&mut self) -> Result<bool, Error> {
        // Memory of its ended process that another worker still has open
        // stays with it (and counted) until that one lets go.
        if !self.sessions.is_empty() || self.sh.tables.shares.keeps_any() || !self.all_free()? {
            return Ok(false);
        }
        let Some(k) = self.sh.port.slot else {
            return Ok(false);
        };
        let sleeping = self.sh.port.region.slot_sleeping(k)?;
        sleeping.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.all_free()? {
            tracing::debug!(slot = k, "its process is gone; the slot's worker ends");
            return Ok(true);
        }
        sleeping.store(0, Ordering::SeqCst);
        Ok(false)
    }

    /// Whether every channel this worker serves is free.
    fn all_free(&self) -> Result<bool, Error> {
        for c in &self.chans {
            if c.host.state()? != transport::ClaimState::Free {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether a holder with nothing to run keeps the grant while no other
    /// vGPU wants the GPU, for up to [`LONE_IDLE_KEEP`]: given back, the
    /// guest's next call would wait for the grant service to grant it again
    /// (a worker and a service woken from sleep: 0.17-0.25 ms on an H100
    /// host after a 10 ms pause, where the call takes 0.012 ms natively,
    /// `results/2026-11-26-h100-burst-after-pause.md`). Nothing is charged
    /// for it: a vGPU is charged the GPU time its work takes. The grant's
    /// socket wakes the sleeping holder when another vGPU wants the GPU
    /// (`CONTENDED`), and it gives the grant back at once. The caller has
    /// read what the service said meanwhile (`Gate::extended`), as for
    /// [`Worker::late_guest`].
    fn keep_alone(&mut self) -> bool {
        let Some(g) = self.sh.slice.gate.as_mut() else {
            return false;
        };
        if !g.alone() {
            self.lone_idle_since = None;
            return false;
        }
        let since = *self.lone_idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < LONE_IDLE_KEEP {
            return true;
        }
        self.lone_idle_since = None;
        false
    }

    /// Whether the worker sleeps [`LIGHT_SLEEP`] at a time rather than up
    /// to `max_block_us`: while it keeps the grant alone through its
    /// guests' pause ([`Worker::keep_alone`] decided so just before), or,
    /// with no scheduler, for [`LONE_IDLE_KEEP`] after its last work. A
    /// program that computes on the CPU between short bursts of GPU work
    /// then finds it awake sooner, for a few microseconds of CPU per sleep;
    /// an idle VM's worker sleeps long again after it.
    fn light_sleep(&mut self) -> bool {
        match self.sh.slice.gate.as_ref() {
            Some(g) => g.holding() && self.lone_idle_since.is_some(),
            None => {
                let since = *self.lone_idle_since.get_or_insert_with(Instant::now);
                since.elapsed() < LONE_IDLE_KEEP
            }
        }
    }

    /// Whether a holder with nothing to run keeps the grant a little
    /// longer, because a guest has not taken its reply, or took it less
    /// than [`NEXT_CALL`] after its last call: it has not run since the
    /// reply came (or not to its next call), so it is not idle but waiting
    /// for a CPU (a busy host: the hogs, other VMs' vCPUs), and giving the
    /// grant back would cost its vGPU the rest of its slice and a hand-off
    /// for the host's lateness. Kept for at most [`LATE_GUEST`] from the first time
    /// it is seen, however many replies are unread (a guest that never
    /// takes its replies keeps a grant no more than that past its work),
    /// and never past the slice's end, which the loop still looks for.
    fn late_guest(&mut self) -> bool {
        if self
            .sh
            .slice
            .gate
            .as_ref()
            .is_some_and(|g| !g.keeps_others_off())
        {
            // A grant that keeps no vGPU off the GPU (held beside others,
            // none waiting): nothing to keep it for (the guest's next call
            // finds it held anyway).
            return false;
        }
        let unread = self
            .chans
            .iter()
            .any(|c| c.host.resp.unread().is_ok_and(|n| n > 0));
        // Its reply taken, the guest is between calls for a moment: as
        // late, if late, as one that has not taken it (the same bound and
        // the same charge).
        let between = self.last_call.is_some_and(|t| t.elapsed() < NEXT_CALL);
        if !unread && !between {
            self.late_guest_came();
            return false;
        }
        let now = Instant::now();
        let booster = &self.sh.port.booster;
        let late = self.sh.slice.late.get_or_insert_with(|| LateWait {
            since: now,
            seen: now,
            run_delays: crate::priority::run_delays(booster.borrow().threads()),
        });
        late.seen = now;
        if now.duration_since(late.since) < LATE_GUEST {
            return true;
        }
        self.late_guest_came();
        false
    }

    /// The late guest took its reply (or the wait ended: given up, or the
    /// grant is being given back, see `begin_release`): counts the wait
    /// and decides who pays for it, under the grant it was waited in. The
    /// host's CPUs made the guest late, not its vGPU: charged, the wait
    /// costs most the vGPU whose guest the host runs least (beside 12 hogs
    /// on an H100, MMR 0.862-0.974 charged against 0.976-0.994 free,
    /// `results/2026-11-26-h100-late-guest.md`). The wait counts to the
    /// last look that still saw the reply unread ([`LateWait::seen`]):
    /// what came after it up to the look that found the reply taken was
    /// this worker's own lateness, its sleep between looks and its wait
    /// for a CPU after it (on two CPUs beside two hogs, waits of 0.7-1.0 ms
    /// to the look that found the reply taken read 20-134 us to the last
    /// that saw it unread, `results/2026-11-27-sim-late-look.md`).
    /// Never charged, though, a guest that never takes its replies would
    /// hold the GPU idle for nothing. So the part of the wait that one of
    /// the VM's vCPU threads spent waiting for a CPU (the kernel's count of
    /// its run-queue waits, where the VM's vCPU threads are known) is the
    /// host's and free; the rest is free up to an eighth of each grant's
    /// slice and charged past that. One thread's wait, not their sum: a VM
    /// cannot make its replies' lateness look like the host's by keeping
    /// many vCPUs runnable.
    pub(super) fn late_guest_came(&mut self) {
        let Some(late) = self.sh.slice.late.take() else {
            return;
        };
        let ns = crate::nanos(late.seen.duration_since(late.since));
        let host_ns = late.run_delays.map_or(0, |before| {
            crate::priority::run_delays(self.sh.port.booster.borrow().threads())
                .map_or(0, |after| {
                    crate::priority::longest_run_wait(&before, &after)
                })
                .min(ns)
        });
        let h = &self.sh.port.stats.handoff;
        Handoff::add(&h.late_guests, 1);
        Handoff::add(&h.late_guest_ns, ns);
        Handoff::add(&h.late_guest_cpu_ns, host_ns);
        let slice = &mut self.sh.slice;
        // No vGPU waited for the grant (held beside others): nothing to pay.
        let Some(g) = slice.gate.as_ref().filter(|g| g.keeps_others_off()) else {
            return;
        };
        let free = late_wait_free(ns - host_ns, g.slice_ns(), slice.late_free_ns);
        slice.late_free_ns += free;
        slice.charged_ns = slice.charged_ns.saturating_add(ns - host_ns - free);
    }

    /// On a shared GPU (`wire::grant::SHARED`), charges what the holder's
    /// drained busy periods used since its last charge, keeping the grant:
    /// `now`, whatever it is, else once it reaches an eighth of the slice,
    /// so that the fair queue sees a holder's use within its slice and can
    /// hold back one that runs ahead of its share.
    fn charge_shared(&mut self, now: bool) -> Result<(), Error> {
        let slice = &mut self.sh.slice;
        let Some(g) = slice.gate.as_mut().filter(|g| g.shared()) else {
            return Ok(());
        };
        if slice.releasing || slice.charged_ns == 0 {
            return Ok(());
        }
        if !now && slice.charged_ns < g.slice_ns() / 8 {
            return Ok(());
        }
        let ns = std::mem::take(&mut slice.charged_ns);
        let bursts = std::mem::take(&mut slice.bursts);
        self.sh
            .port
            .stats
            .charged_ns
            .fetch_add(ns, Ordering::Relaxed);
        g.charge(ns, bursts)
    }

    /// What the serving loop does when it looks at the clock: report, and
    /// let the coscheduling booster undo boosts and re-read its vCPU file.
    fn periodic(&mut self, last_report: &mut Instant) -> Result<(), Error> {
        if self.confine_when_filled && self.sh.gpu.contexts.filled() {
            crate::sandbox::confine()?;
            self.confine_when_filled = false;
            tracing::info!("contexts made ahead; every thread confined");
        }
        self.maybe_report(last_report)?;
        // Memory of ended processes that other workers held, let go since.
        super::requests::share::settle_kept(&mut self.sh.mem, &mut self.sh.tables);
        if let (Some(k), Some(l)) = (self.sh.port.slot, &self.sh.mem.ledger) {
            // Its process, for the VM's monitors (see `status.rs`).
            // The bytes are what the worker holds (`Memory::held` keeps
            // them exact, for the daemon to give back if it dies).
            let pid = self.sessions.first_process().map_or(0, |p| p.pid);
            l.publish(k, pid, self.sh.mem.used);
        }
        let sync = self.sh.port.stats.sync_calls.load(Ordering::Relaxed);
        self.sh.port.booster.borrow_mut().tick(sync);
        // A handover that never followed: the daemon let the memfd go.
        if self.kept_map.as_ref().is_some_and(|k| k.stale()) {
            self.kept_map = None;
        }
        Ok(())
    }

    fn peer_events(&mut self) {
        // A native guest process (or a whole VM) that went away: the server
        // marked its channels abandoned before it said so (marked here, the
        // mark could land on a claim of the next peer given its id), and the
        // channels' scan reclaims them.
        for peer in self.sh.port.link.departed() {
            tracing::debug!(peer, "ivshmem peer gone: its channels are reclaimed");
        }
    }

    /// What the holder issued is predicted from its kernels' estimated
    /// times (`Shared::slice_filled`), and an estimate can run ahead of the
    /// device (matrixMul's did on an H100: its 300 launches waited for an
    /// extension while the device idled, 0.71 of native). Once the device
    /// has run everything while the prediction says the slice is full,
    /// nothing is queued ahead, so the slice's budget is what the clock
    /// leaves: a lone holder issues on instead of its device idling until
    /// the extension. (A contended holder gives the GPU back in the turn
    /// its prediction fills the slice, so this rarely reaches it.)
    fn recheck_budget(&mut self) {
        if !self.sh.slice.budget_spent || self.budget_checked.elapsed() < BUDGET_CHECK {
            return;
        }
        self.budget_checked = Instant::now();
        let Some(held) = self
            .sh
            .slice
            .gate
            .as_ref()
            .filter(|g| g.holding())
            .map(|g| g.held_ns())
        else {
            return;
        };
        if self.sessions.device_idle() {
            self.sh.slice.issued_ns = held;
            self.sh.slice.budget_spent = false;
        }
    }

    /// Sleeps until a doorbell rings or a grant arrives, or `max_block_us`
    /// passes ([`LIGHT_SLEEP`] if `light`); whether something rang (or a
    /// channel had work before it slept).
    fn block(&mut self, light: bool) -> Result<bool, Error> {
        let region = self.sh.port.region.clone();
        let flag = region.slot_sleeping(self.sh.port.slot.unwrap_or(0))?;
        flag.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let mut busy = false;
        for c in &mut self.chans {
            busy |= service(&mut self.sh, c, &mut self.sessions);
        }
        if !busy {
            let all = self.sh.port.link.host_bells();
            // A process slot's worker waits on its own vector alone.
            let bells = match self.sh.port.slot {
                Some(k) => all.get(k as usize..=k as usize).unwrap_or_default(),
                None => all,
            };
            let mut fds: Vec<PollFd<'_>> = bells
                .iter()
                .map(|b| PollFd::new(b.fd().as_fd(), PollFlags::POLLIN))
                .collect();
            // A grant arriving wakes the worker too, and so does what the
            // service tells a holder (another vGPU wants the GPU).
            let gate = self.sh.slice.gate.as_ref();
            let wanted = gate.is_some_and(|g| g.wanted());
            if let Some(g) = gate.filter(|g| g.wanted() || g.holding()) {
                fds.push(PollFd::new(g.fd(), PollFlags::POLLIN));
            }
            // Quiet for a while (no doorbell, no grant, no guest waiting):
            // a long sleep, so that idle VMs cost the host no CPU. What
            // could need the worker rings a bell: a guest's call, the
            // daemon's feed (a migration, a peer gone, closing), the stop.
            let deep = !wanted
                && gate.is_none_or(|g| !g.holding())
                && self.moving.is_none()
                && self.sh.port.link.wakes_on_feed()
                && self
                    .quiet_since
                    .is_some_and(|t| t.elapsed() >= DEEP_IDLE_AFTER);
            let timeout = if light {
                TimeSpec::from_duration(LIGHT_SLEEP)
            } else if deep {
                TimeSpec::from_duration(DEEP_IDLE_SLEEP)
            } else {
                let us = self.spin.max_block_us.clamp(1_000, 1_000_000);
                TimeSpec::from_duration(Duration::from_micros(us))
            };
            // A holder's messages are read by `keep_alone` before it
            // sleeps again; only a grant counts as rung.
            let _ = ppoll(&mut fds, Some(timeout), None);
            let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
            let rang = fds.iter().take(bells.len()).any(ready);
            let said = fds.len() > bells.len() && fds.last().is_some_and(ready);
            busy = rang || (said && wanted);
            if !busy && !light {
                self.quiet_since.get_or_insert_with(Instant::now);
            }
            drop(fds);
            for b in bells {
                let mut buf = [0u8; 8];
                let _ = nix::unistd::read(b.fd().as_fd(), &mut buf);
            }
        }
        if busy || light {
            self.quiet_since = None;
        }
        flag.store(0, Ordering::Relaxed);
        Ok(busy)
    }
}

/// Of a wait of `ns` for a late guest, the part left uncharged under a
/// grant of `slice_ns` whose earlier waits were `free_so_far` uncharged.
fn late_wait_free(ns: u64, slice_ns: u64, free_so_far: u64) -> u64 {
    let allowance = slice_ns / LATE_GUEST_FREE_PART;
    ns.min(allowance.saturating_sub(free_so_far))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_waits_are_free_up_to_an_eighth_of_the_slice_per_grant() {
        let slice = 30_000_000; // allowance 3.75 ms
        assert_eq!(late_wait_free(1_000_000, slice, 0), 1_000_000);
        assert_eq!(late_wait_free(1_000_000, slice, 3_000_000), 750_000);
        assert_eq!(late_wait_free(1_000_000, slice, 3_750_000), 0);
        // More than the allowance already free (a shorter slice after an
        // extension's end): nothing more, no underflow.
        assert_eq!(late_wait_free(5, 8, 9), 0);
        assert_eq!(late_wait_free(u64::MAX, u64::MAX, 0), u64::MAX / 8);
    }
}
