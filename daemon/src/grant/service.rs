//! The grant service's thread: its state as a [`Service`], one method per
//! message a worker sends and per event (a new connection, a command from
//! the daemon, a grant overdue), and a loop that polls and dispatches.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use sched::GpuScheduler;
use wire::grant::*;

use super::conn::{Conn, Heard};
use super::group::Group;
use super::{corun, hold_limit, Usage, VgpuLive, HELLO_WAIT};
use crate::hostcpu::lift::Holders;
use transport::EventFdBell;

mod revoke;
mod share;

/// How long the service sleeps while no vGPU holds or wants its GPU, at
/// most: a worker's message, a new worker and the daemon's commands (which
/// ring its wake-up eventfd) end the sleep at once.
const QUIET_WAIT_MS: u8 = 250;

/// What the daemon asks of a running service (see [`super::GrantService`]).
pub(super) enum Command {
    SetShare {
        vgpu: u32,
        tenant: String,
        weight: f64,
        tenant_weight: Option<f64>,
    },
    /// Whether a vGPU's VM opted in to co-running (see `corun.rs`).
    SetCorun { vgpu: u32, ok: bool },
    /// How far ahead of virtual time a vGPU is (it is leaving this GPU).
    Lag {
        vgpu: u32,
        reply: Sender<Option<u128>>,
    },
    /// A vGPU arriving from another GPU: place it this far ahead.
    Expect { vgpu: u32, lag: u128 },
    /// The daemon ended a vGPU's worker: forget its connection now.
    Forget { vgpu: u32 },
}

/// What the service knows of a vGPU's place among the tenants.
#[derive(Debug, Clone)]
struct Share {
    tenant: String,
    weight: f64,
    tenant_weight: Option<f64>,
}

/// A connection whose HELLO has not all arrived.
struct Pending {
    s: UnixStream,
    since: Instant,
    m: [u8; 24],
    got: usize,
}

/// One GPU's grant service: everything its loop keeps between turns.
pub(super) struct Service {
    listener: UnixListener,
    /// Zero of the scheduler's clock.
    epoch: Instant,
    slice_ns: u64,
    slice: Duration,
    hold_limit: Duration,
    usage: Usage,
    /// Where the holders go each time they change (the vCPU lift).
    lift: Option<Sender<Holders>>,
    /// What the vCPU lift was last told (see `hostcpu::lift`).
    lifted: Holders,
    sched: GpuScheduler,
    conns: HashMap<u32, Conn>,
    /// The counters of vGPUs whose groups have no member now (see
    /// `group::Counters`), carried into their next.
    counters: HashMap<u32, super::group::Counters>,
    holder: Option<u32>,
    held_since: Instant,
    /// When the holder's slice ends, extensions included.
    deadline: Instant,
    /// Whether no vGPU has waited beside those holding since it was
    /// granted.
    alone: bool,
    /// What a vGPU's worker does is up to its guests: rate-limited, per vGPU.
    logs: HashMap<u32, transport::LogLimiter>,
    pending: Vec<Pending>,
    shares: HashMap<u32, Share>,
    co: corun::CoRun,
    /// vGPUs that want or hold the GPU.
    active: HashSet<u32>,
    /// vGPUs on their way here from another GPU, and their lag.
    arriving: HashMap<u32, u128>,
    last_tick: Instant,
    /// When the last release freed the GPU while some vGPU waited for it
    /// (the hand-off the next grant completes).
    freed: Option<Instant>,
    /// Since when the holder has been draining (see `DRAINING`).
    draining_since: Option<Instant>,
    /// Under MPS, a holder that drains while the next vGPU holds the GPU
    /// already, and since when it held it (see `DRAINING`).
    drainer: Option<(u32, Instant)>,
    /// How the vGPUs hold the GPU (see `share.rs`).
    sharing: sched::Sharing,
    /// Holders of a shared GPU told to end their grant at its slice's end
    /// (`CONTENDED`): they ran ahead of their share.
    stopping: HashSet<u32>,
    /// What sharing the GPU at once keeps of each vGPU (`share.rs`).
    shared: share::Shared,
}

impl Service {
    /// A service accepting workers on `listener`, with slices of
    /// `slice_ns` under `policy`; `corun`: see [`super::GrantService::start_with`].
    pub fn new(
        listener: UnixListener,
        slice_ns: u64,
        policy: sched::DevicePolicy,
        corun: bool,
        usage: Usage,
        lift: Option<Sender<Holders>>,
    ) -> Service {
        let now = Instant::now();
        Service {
            listener,
            epoch: now,
            slice_ns,
            slice: Duration::from_nanos(slice_ns),
            hold_limit: hold_limit(slice_ns),
            usage,
            lift,
            lifted: Holders::default(),
            sched: GpuScheduler::with_policy(slice_ns, policy),
            conns: HashMap::new(),
            counters: HashMap::new(),
            holder: None,
            held_since: now,
            deadline: now,
            alone: false,
            logs: HashMap::new(),
            pending: Vec::new(),
            shares: HashMap::new(),
            co: corun::CoRun::new(corun),
            active: HashSet::new(),
            arriving: HashMap::new(),
            last_tick: now,
            freed: None,
            draining_since: None,
            drainer: None,
            sharing: sched::Sharing::Exclusive,
            stopping: HashSet::new(),
            shared: share::Shared::new(Duration::from_nanos(slice_ns)),
        }
    }

    /// The service with its vGPUs holding the GPU under `sharing`.
    pub fn sharing(mut self, sharing: sched::Sharing) -> Service {
        if sharing == sched::Sharing::Concurrent {
            // Co-holding by fit (MPS) is the exclusive mode's.
            self.co = corun::CoRun::new(false);
        }
        self.sharing = sharing;
        self
    }

    /// Serves until `stop`: each turn takes the daemon's commands, new
    /// connections and the workers' messages, takes back overdue grants,
    /// and grants the GPU as the fair queue says.
    pub fn run(mut self, stop: &AtomicBool, commands: &Receiver<Command>, wake: &EventFdBell) {
        while !stop.load(Ordering::Relaxed) {
            let mut changed = false;
            while let Ok(cmd) = commands.try_recv() {
                changed |= self.on_command(cmd);
            }
            if changed {
                self.apply_shares();
            }
            self.on_tick();
            self.accept();
            for (id, i) in self.readable(wake) {
                self.read_from(id, i);
            }
            // Groups' members gone or overdue (a worker alone has none).
            let groups: Vec<u32> = self
                .conns
                .iter()
                .filter(|(_, c)| matches!(c, Conn::Group(_)))
                .map(|(&id, _)| id)
                .collect();
            for id in groups {
                let heard = self.conns.get_mut(&id).map_or(Vec::new(), Conn::tick);
                self.on_heard(id, heard);
            }
            self.revoke_overdue();
            if self.sharing == sched::Sharing::Concurrent {
                self.share();
            } else {
                self.pass_round();
                self.admit_co_holders();
                self.extend_or_contend();
                self.grant_next();
            }
            self.tell_lift();
        }
    }

    /// Changes the live figures.
    fn live(&self, f: impl FnOnce(&mut HashMap<u32, VgpuLive>)) {
        f(&mut self.usage.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Scheduler time now (ns since the service started).
    fn now_ns(&self) -> u64 {
        crate::nanos(self.epoch.elapsed())
    }

    // --- Commands from the daemon -------------------------------------

    /// One command; whether the vGPUs' shares changed.
    fn on_command(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::SetShare {
                vgpu,
                tenant,
                weight,
                tenant_weight,
            } => {
                self.shares.insert(
                    vgpu,
                    Share {
                        tenant,
                        weight,
                        tenant_weight,
                    },
                );
                self.live(|u| u.entry(vgpu).or_default().weight = weight);
                return true;
            }
            Command::SetCorun { vgpu, ok } => {
                if ok {
                    self.co.ok.insert(vgpu);
                } else {
                    self.co.ok.remove(&vgpu);
                }
            }
            Command::Lag { vgpu, reply } => {
                let _ = reply.send(self.sched.queue().lag(vgpu));
            }
            Command::Expect { vgpu, lag } => {
                self.arriving.insert(vgpu, lag);
            }
            Command::Forget { vgpu } => {
                if self.conns.contains_key(&vgpu) {
                    self.forget_worker(vgpu);
                }
            }
        }
        false
    }

    /// Recomputes every connected vGPU's effective weight (see
    /// `sched::tenants`) and hands the changed ones to the fair queue.
    fn apply_shares(&mut self) {
        let ids: Vec<u32> = self.conns.keys().copied().collect();
        let members: Vec<sched::tenants::Member<'_>> = ids
            .iter()
            .map(|id| match self.shares.get(id) {
                Some(s) => sched::tenants::Member {
                    tenant: &s.tenant,
                    weight: s.weight,
                    tenant_weight: s.tenant_weight,
                    active: self.active.contains(id),
                },
                None => sched::tenants::Member {
                    tenant: "",
                    weight: self.sched.queue().weight(*id).unwrap_or(1.0),
                    tenant_weight: None,
                    active: self.active.contains(id),
                },
            })
            .collect();
        let eff = sched::tenants::effective_weights(&members);
        let mut u = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        for (id, w) in ids.iter().zip(eff) {
            if self.sched.queue().weight(*id) != Some(w) {
                let _ = self.sched.queue().set_weight(*id, w);
            }
            let v = u.entry(*id).or_default();
            v.effective_weight = w;
            if let Some(s) = self.shares.get(id) {
                v.weight = s.weight;
            }
        }
    }

    /// Forgets vGPU `id`'s worker (it went away, or the daemon ended it):
    /// its connection, its place in the queue, and its grant.
    fn forget_worker(&mut self, id: u32) {
        if let Some(Conn::Group(g)) = self.conns.remove(&id) {
            self.counters.insert(id, g.counters());
        }
        let _ = self.sched.remove(id);
        self.active.remove(&id);
        self.apply_shares();
        if self.holder == Some(id) {
            self.holder = None;
        }
        self.co.forget(id);
        self.stopping.remove(&id);
        self.shared.forget(id);
        self.live(|u| {
            let v = u.entry(id).or_default();
            v.connected = false;
            v.holding = false;
            v.report.queued = 0;
        });
    }

    /// Demand: time each vGPU spends wanting or holding the GPU.
    fn on_tick(&mut self) {
        let tick = crate::nanos(self.last_tick.elapsed());
        self.last_tick = Instant::now();
        self.co.tick(self.holder, tick);
        if !self.active.is_empty() {
            let active = &self.active;
            self.live(|u| {
                for id in active {
                    u.entry(*id).or_default().active_ns += tick;
                }
            });
        }
    }

    // --- New connections ----------------------------------------------

    /// Registration of new workers (their first message is HELLO), read
    /// without blocking: a connection that says nothing holds up no
    /// vGPU, and is refused after `HELLO_WAIT`.
    fn accept(&mut self) {
        while let Ok((s, _)) = self.listener.accept() {
            let _ = s.set_nonblocking(true);
            self.pending.push(Pending {
                s,
                since: Instant::now(),
                m: [0; 24],
                got: 0,
            });
        }
        for mut p in std::mem::take(&mut self.pending) {
            match p.s.read(&mut p.m[p.got..]) {
                Ok(n) if n > 0 => p.got += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // A peer that leaves without a word holds nothing and did
                // nothing wrong (a worker refused a move drops the
                // connection the daemon made for it); one that leaves
                // halfway through its HELLO is worth a warning.
                _ if p.got == 0 => {
                    tracing::debug!("grant service: a connection closed before saying anything");
                    continue;
                }
                _ => {
                    tracing::warn!("grant service: a connection closed before its HELLO");
                    continue;
                }
            }
            if p.got < p.m.len() {
                if p.since.elapsed() < HELLO_WAIT {
                    self.pending.push(p);
                } else {
                    tracing::warn!("grant service: refused a connection that sent no HELLO");
                }
                continue;
            }
            self.on_hello(p);
        }
    }

    /// A connection's first message, whole: a worker registers its vGPU,
    /// alone or as one of its members (`MEMBER`, see `group.rs`).
    fn on_hello(&mut self, p: Pending) {
        let (kind, vgpu, weight_milli, member) = decode(&p.m);
        let weight = self
            .shares
            .get(&vgpu)
            .map_or(weight_milli as f64 / 1000.0, |s| s.weight);
        let conn = match (kind, member, self.conns.get_mut(&vgpu)) {
            (HELLO, MEMBER, Some(Conn::Group(g))) => {
                if g.add(p.s) {
                    return;
                }
                None
            }
            (HELLO, MEMBER, None) => {
                let mut g = Group::new(vgpu, self.hold_limit);
                if let Some(c) = self.counters.remove(&vgpu) {
                    g.carry(&c);
                }
                g.add(p.s);
                Some(Conn::Group(Box::new(g)))
            }
            (HELLO, 0, None) => Some(Conn::Worker(p.s)),
            _ => None,
        };
        if let Some(conn) = conn.filter(|_| self.sched.add(vgpu, weight).is_ok()) {
            self.conns.insert(vgpu, conn);
            if let Some(lag) = self.arriving.remove(&vgpu) {
                let _ = self.sched.queue().set_lag(vgpu, lag);
            }
            self.live(|u| {
                let v = u.entry(vgpu).or_default();
                v.weight = weight;
                v.connected = true;
            });
            self.apply_shares();
            return;
        }
        tracing::warn!("grant service: refused a connection without a valid HELLO");
    }

    // --- Workers' messages --------------------------------------------

    /// The workers with something to read (or gone), waiting 1 ms at most
    /// while a vGPU holds or wants the GPU (deadlines and hand-offs are
    /// timed to the millisecond), else up to [`QUIET_WAIT_MS`], woken by a
    /// message, a connection or a command: an idle GPU costs no CPU.
    fn readable(&self, wake: &EventFdBell) -> Vec<(u32, usize)> {
        let mut ids: Vec<(u32, usize)> = Vec::new();
        let mut fds: Vec<PollFd<'_>> = Vec::new();
        for (&id, c) in &self.conns {
            for (i, fd) in c.fds().into_iter().enumerate() {
                ids.push((id, i));
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
            }
        }
        let quiet = self.holder.is_none()
            && self.drainer.is_none()
            && self.active.is_empty()
            && self.pending.is_empty();
        if quiet {
            fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
            fds.push(PollFd::new(wake.fd().as_fd(), PollFlags::POLLIN));
        }
        let wait = if quiet { QUIET_WAIT_MS } else { 1 };
        let _ = poll(&mut fds, PollTimeout::from(wait));
        if quiet {
            let _ = nix::unistd::read(wake.fd().as_fd(), &mut [0u8; 8]);
        }
        fds.iter()
            .zip(&ids)
            .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
            .map(|(_, &id)| id)
            .collect()
    }

    /// Reads one message from socket `i` of `id`'s connection and handles
    /// what the vGPU said.
    fn read_from(&mut self, id: u32, i: usize) {
        let heard = self.conns.get_mut(&id).map_or(Vec::new(), |c| c.read(i));
        self.on_heard(id, heard);
    }

    /// What vGPU `id` said, in order; gone, it is forgotten with its grant.
    fn on_heard(&mut self, id: u32, heard: Vec<Heard>) {
        for h in heard {
            let now = self.now_ns();
            match h {
                Heard::Said((WANT, _, _)) => self.on_want(id, now),
                Heard::Said((DRAINING, _, _)) => self.on_draining(id, now),
                Heard::Said((RELEASE, a, b)) => self.on_release(id, a, b, now),
                Heard::Said((IDLE, _, _)) => self.on_idle(id),
                Heard::Said((CHARGE, a, b)) => self.on_charge(id, a, b),
                Heard::Said((kind, a, b)) => self.on_report(id, kind, a, b),
                Heard::Gone => return self.forget_worker(id),
            }
        }
    }

    /// `WANT`: the vGPU has work for the GPU.
    fn on_want(&mut self, id: u32, now: u64) {
        self.shared.idle_since.remove(&id);
        if self.active.insert(id) {
            self.apply_shares();
        }
        let _ = self.sched.request(id, now, None);
    }

    /// `DRAINING`: the holder drains. Under MPS (one hardware context:
    /// nothing to switch) the next vGPU is granted at once, its first work
    /// running beside the drain: the GPU idles for no hand-off. The drainer
    /// is charged at its release as ever. Without MPS the next vGPU waits
    /// for the release as it waits for any grant, blocked: telling it to
    /// spin for the grant (and to wake its guests) took CPU time from busy
    /// hosts' guests and cost the lightest vGPU its share beside CPU hogs
    /// (MMR 0.80-0.83 against 0.97 on an H100,
    /// `results/2026-11-26-h100-busy-host-bisect.md`).
    fn on_draining(&mut self, id: u32, now: u64) {
        if !(self.holder == Some(id) && self.co.holders.is_empty() && self.draining_since.is_none())
        {
            return;
        }
        self.draining_since = Some(Instant::now());
        // One drainer at a time: a holder granted beside a drainer keeps
        // the GPU to its release.
        if self.co.enabled && self.drainer.is_none() {
            self.drainer = Some((id, self.held_since));
            self.holder = None;
            self.freed = (!self.sched.candidates(now, &[id]).is_empty()).then(Instant::now);
        }
    }

    /// `RELEASE`: a holder, co-holder or drainer gives the GPU back,
    /// having used `used` ns of it; `wants` 0: it has nothing more to do.
    fn on_release(&mut self, id: u32, used: u64, wants: u64, now: u64) {
        let holds = self.holder == Some(id)
            || self.co.holders.contains_key(&id)
            || self.drainer.is_some_and(|d| d.0 == id);
        if !holds {
            return;
        }
        self.drainer = self.drainer.filter(|d| d.0 != id);
        let a = self.co.charge(
            id,
            used,
            &self.usage.lock().unwrap_or_else(|e| e.into_inner()),
        );
        let _ = self.sched.release(id, a);
        self.shared.used(id, a);
        self.live(|u| {
            let v = u.entry(id).or_default();
            // `used` is the worker's word: a huge one saturates.
            v.charged_ns = v.charged_ns.saturating_add(a);
            v.holding = false;
        });
        if wants == 0 {
            let _ = self.sched.idle(id, now);
            if self.active.remove(&id) {
                self.apply_shares();
            }
        }
        if self.holder == Some(id) {
            self.holder = None;
        }
        self.co.forget(id);
        self.stopping.remove(&id);
        self.freed = (self.holder.is_none()
            && self.co.holders.is_empty()
            && self.sched.queue().runnable() > 0)
            .then(Instant::now);
    }

    /// The figures a worker reports (`REPORT`, `QUEUE`, ...); other kinds
    /// are ignored.
    fn on_report(&mut self, id: u32, kind: u32, a: u64, b: u64) {
        let known = [
            REPORT, QUEUE, SERVED, PROCESS, OCCUPANCY, SLICED, LOGS, COPIES, CONTEXTS,
        ];
        if !known.contains(&kind) {
            return;
        }
        self.live(|u| {
            let r = &mut u.entry(id).or_default().report;
            match kind {
                REPORT => (r.mem_used, r.sync_calls) = (a, b),
                QUEUE => (r.queued, r.launches) = (a, b),
                SERVED => (r.requests, r.refused) = (a, b),
                PROCESS => (r.rss_bytes, r.open_fds) = (a, b),
                OCCUPANCY => r.occupancy_ppm = a,
                SLICED => r.sliced_launches = a,
                LOGS => r.log_suppressed = a,
                COPIES => r.copy_ppm = a,
                CONTEXTS => (r.contexts_created, r.contexts_reused) = (a, b),
                _ => {}
            }
        });
    }

    // --- Grants -------------------------------------------------------

    /// A holder that gave the GPU back before its co-holders hands the
    /// round to one of them: vGPUs that fit can still join it, and the one
    /// that left can come back into it (without, it would wait for the
    /// round's end while the GPU has room).
    fn pass_round(&mut self) {
        if self.holder.is_some() {
            return;
        }
        if let Some(next) = self.co.holders.keys().next().copied() {
            self.co.holders.remove(&next);
            self.holder = Some(next);
            self.held_since = Instant::now()
                .checked_sub(Duration::from_nanos(self.co.held_ns(next)))
                .unwrap_or_else(Instant::now);
        }
    }

    /// Beside a holder that opted in, the next vGPUs that did and fit (see
    /// `corun.rs`), until the holder's slice ends.
    fn admit_co_holders(&mut self) {
        let Some(h) = self.holder else {
            return;
        };
        let left = self.deadline.saturating_duration_since(Instant::now());
        if !(self.co.enabled && self.drainer.is_none() && left > Duration::from_millis(1)) {
            return;
        }
        let now_ns = self.now_ns();
        let snapshot = self.usage.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for id in self.co.admit(&mut self.sched, h, now_ns, &snapshot) {
            if let Some(c) = self.conns.get_mut(&id) {
                if c.send(id, GRANT, crate::nanos(left), 0) {
                    self.co.holders.insert(id, self.deadline);
                    self.live(|u| {
                        let v = u.entry(id).or_default();
                        v.holding = true;
                        v.grants += 1;
                    });
                }
            }
        }
    }

    /// While no vGPU waits beside those holding the GPU (the holder and its
    /// co-holders), they get one slice more whenever less than a slice is
    /// left (`EXTEND`); once one waits, they are told so (`CONTENDED`) and
    /// the round ends at its deadline (see the module's doc).
    fn extend_or_contend(&mut self) {
        let (Some(id), true) = (self.holder, self.alone) else {
            return;
        };
        let q = self.sched.queue();
        let waiting = self
            .conns
            .keys()
            .filter(|&&v| v != id && !self.co.holders.contains_key(&v) && q.is_runnable(v))
            .count();
        let holding: Vec<u32> = std::iter::once(id)
            .chain(self.co.holders.keys().copied())
            .collect();
        if waiting > 0 {
            self.alone = false;
            for v in holding {
                if let Some(c) = self.conns.get_mut(&v) {
                    c.send(v, CONTENDED, 0, 0);
                }
            }
        } else if self.deadline.saturating_duration_since(Instant::now()) <= self.slice {
            self.deadline += self.slice;
            for v in holding {
                if let Some(c) = self.conns.get_mut(&v) {
                    c.send(v, EXTEND, self.slice_ns, 0);
                }
                if let Some(end) = self.co.holders.get_mut(&v) {
                    *end = self.deadline;
                }
            }
        }
    }

    /// A new round once the holder and every co-holder gave the GPU back.
    fn grant_next(&mut self) {
        if !(self.holder.is_none() && self.co.holders.is_empty()) {
            return;
        }
        let now = self.now_ns();
        // Not the drainer again: it has not been charged yet.
        // Heavier vGPUs hold longer slices (fewer hand-offs).
        let next = match self.drainer {
            Some((d, _)) => self
                .sched
                .candidates(now, &[d])
                .first()
                .map(|&v| (v, self.sched.slice_for(v))),
            None => self.sched.grant(now).map(|g| (g.vgpu, g.slice_ns)),
        };
        let Some((vgpu, granted)) = next else {
            return;
        };
        let q = self.sched.queue();
        let others = q.runnable() - usize::from(q.is_runnable(vgpu));
        let Some(c) = self.conns.get_mut(&vgpu) else {
            return;
        };
        let lone = u64::from(others == 0);
        if !c.send(vgpu, GRANT, granted, lone) {
            return;
        }
        self.holder = Some(vgpu);
        self.draining_since = None;
        self.alone = true;
        self.held_since = Instant::now();
        self.deadline = self.held_since + Duration::from_nanos(granted);
        let handoff = self.freed.take().map(|t| crate::nanos(t.elapsed()));
        self.live(|u| {
            let v = u.entry(vgpu).or_default();
            v.holding = true;
            v.grants += 1;
            if let Some(ns) = handoff {
                v.handoffs += 1;
                v.handoff_ns += ns;
            }
        });
    }

    /// The vCPU lift follows the holders: told only when they change (after
    /// the grant is sent), or whether another vGPU waits does, the
    /// syscalls on its own thread. While one waits the round ends at its
    /// deadline: the real-time lift's bound (see `hostcpu::lift`).
    fn tell_lift(&mut self) {
        let Some(tx) = &self.lift else {
            return;
        };
        // On a shared GPU: a heavy vGPU holding it alone while others wait.
        let contended = (self.holder.is_some() && !self.alone)
            || self
                .co
                .holders
                .keys()
                .any(|h| self.shared.heavy.contains(h) && self.stopping.contains(h));
        let realtime_until = contended.then(|| {
            self.co
                .holders
                .values()
                .fold(self.deadline, |a, &b| a.max(b))
        });
        let holders = || {
            self.holder
                .into_iter()
                .chain(self.co.holders.keys().copied())
        };
        let same = realtime_until == self.lifted.realtime_until
            && holders().count() == self.lifted.vgpus.len()
            && holders().all(|v| self.lifted.vgpus.contains(&v));
        if !same {
            let now = Holders {
                vgpus: holders().collect(),
                realtime_until,
            };
            let _ = tx.send(now.clone());
            self.lifted = now;
        }
    }
}
