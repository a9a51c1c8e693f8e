//! A vGPU served by several worker processes, one per guest process (see
//! docs/design.md, "Isolation between a VM's processes"), is one place in
//! its GPU's fair queue: its workers register as members of it (`HELLO`
//! with `b` = [`MEMBER`]), and a [`Group`] makes them one worker to the
//! service.
//!
//! - A member that asks (`WANT`) while the vGPU holds the GPU is granted
//!   at once what is left of the slice, if at least [`MIN_LEFT`] is; else
//!   the vGPU asks the service, once.
//! - The service's `GRANT` goes to every member waiting for it; its
//!   `EXTEND` and `CONTENDED` to every member holding.
//! - The vGPU gives the GPU back when its last holding member does: one
//!   `RELEASE`, still wanting it if any of them does; `DRAINING` once
//!   every holding member drains. It is charged what its members used
//!   together, and never more than the time it held the GPU: members run
//!   side by side under one grant, as a process's streams do, and the
//!   vGPU had the GPU for that time, not for the sum of their times.
//! - A member that keeps the grant past [`super::hold_limit`] loses it as
//!   a worker loses it at the service (charged what it held, its late
//!   release ignored), so that its group's other members are not held up.
//! - Figures are the sum over the members of what each reported last (the
//!   share of copies: the largest); counters (requests served, launches,
//!   contexts made...) keep what members that ended had counted.
//! - On a GPU shared at once (`SHARED` grants), a holding member's `CHARGE`
//!   is the vGPU's as it comes; the vGPU is `IDLE` once every holding
//!   member said it is, and wants the GPU again (`WANT`) when one of them
//!   has work again or another member asks.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use wire::grant::*;

/// How much of the vGPU's slice must be left for a member that asks while
/// the vGPU holds the GPU to be granted it at once; with less, it waits for
/// the vGPU's next grant.
pub(super) const MIN_LEFT: Duration = Duration::from_millis(1);

/// Members a group takes at most (a VM's guest processes using its vGPU at
/// once, as many as its region has peers).
pub(super) const MAX_MEMBERS: usize = 64;

/// The kinds of figures a member reports, in the order kept.
const FIGURES: [u32; 9] = [
    REPORT, QUEUE, SERVED, PROCESS, OCCUPANCY, SLICED, LOGS, CONTEXTS, COPIES,
];

/// Which of each kind's two figures count up for the worker's life (sync
/// calls, launches, requests served and refused, sliced launches, log
/// lines suppressed, contexts made and reused), as [`FIGURES`]: a member
/// that ends keeps adding its last ones to the vGPU's. The others (memory
/// in use, queue depth, resident memory, occupancy, copy share) are what
/// the live members have now.
const COUNTERS: [(bool, bool); 9] = [
    (false, true),
    (false, true),
    (true, true),
    (false, false),
    (false, false),
    (true, true),
    (true, true),
    (true, true),
    (false, false),
];

/// The counters of a vGPU's members (see [`COUNTERS`]), by kind as
/// [`FIGURES`]: kept by the service while the vGPU has no member, so that
/// they count on across its processes.
pub(super) type Counters = [(u64, u64); FIGURES.len()];

/// A message for the service to take as the vGPU's: `(kind, a, b)`.
pub(super) type Up = (u32, u64, u64);

/// Where a member stands with the grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Wanting,
    /// Holding since then.
    Holding(Instant),
    /// Holding since then, its last work finishing.
    Draining(Instant),
}

impl State {
    fn held_since(self) -> Option<Instant> {
        match self {
            State::Holding(t) | State::Draining(t) => Some(t),
            _ => None,
        }
    }
}

/// One member: a worker process of the vGPU.
#[derive(Debug)]
struct Member {
    s: UnixStream,
    state: State,
    /// Holding a shared grant with nothing to run (it said `IDLE`).
    idle: bool,
    /// What it reported last, by kind (as [`FIGURES`]).
    figures: Counters,
    /// Its socket failed: removed at the next [`Group::tick`].
    dead: bool,
}

/// The members of one vGPU and the one grant they share.
#[derive(Debug)]
pub(super) struct Group {
    vgpu: u32,
    members: Vec<Member>,
    /// The service's grant, while held: when it came.
    granted_at: Option<Instant>,
    /// Its slice, extensions included.
    slice: Duration,
    /// The grant's bits as the service gave them (`LONE`, `SHARED`,
    /// `ALONE`), `LONE` as its `EXTEND` and `CONTENDED` have it since.
    bits: u64,
    /// The vGPU said `IDLE` (every holding member did) and no `WANT` since.
    idle_said: bool,
    /// `WANT` said and no grant yet.
    wanted: bool,
    /// What the members used of the grant so far, and whether any said it
    /// was still busy as it gave its part back.
    used_ns: u64,
    busy: bool,
    draining_said: bool,
    /// A member's grant is taken back after this.
    hold_limit: Duration,
    /// The counters (see [`COUNTERS`]) of members that ended.
    ended: Counters,
}

impl Group {
    /// A group of vGPU `vgpu` at a service whose grants are taken back
    /// after `hold_limit`.
    pub fn new(vgpu: u32, hold_limit: Duration) -> Group {
        Group {
            vgpu,
            members: Vec::new(),
            granted_at: None,
            slice: Duration::ZERO,
            bits: 0,
            idle_said: false,
            wanted: false,
            used_ns: 0,
            busy: false,
            draining_said: false,
            hold_limit,
            ended: [(0, 0); FIGURES.len()],
        }
    }

    /// Adds a member (its `HELLO` read); false if the group is full.
    pub fn add(&mut self, s: UnixStream) -> bool {
        if self.members.len() >= MAX_MEMBERS {
            return false;
        }
        self.members.push(Member {
            s,
            state: State::Idle,
            idle: false,
            figures: [(0, 0); FIGURES.len()],
            dead: false,
        });
        true
    }

    /// Its counters (see [`COUNTERS`]): those of the members that ended
    /// and of those still here.
    pub fn counters(&self) -> Counters {
        let mut c = self.ended;
        for m in &self.members {
            add_counters(&mut c, &m.figures);
        }
        c
    }

    /// Counts `c` (an earlier group's [`Group::counters`]) as its own.
    pub fn carry(&mut self, c: &Counters) {
        for (e, x) in self.ended.iter_mut().zip(c) {
            *e = (e.0.saturating_add(x.0), e.1.saturating_add(x.1));
        }
    }

    /// Whether no member is left.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The members' sockets, in member order (see [`Group::read`]).
    pub fn fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.members.iter().map(|m| m.s.as_fd())
    }

    /// Whether the vGPU holds the service's grant.
    pub fn holding(&self) -> bool {
        self.granted_at.is_some()
    }

    /// Reads one message of member `i` (its socket readable) and acts on
    /// it; what the service is to take as the vGPU's, in order.
    pub fn read(&mut self, i: usize, now: Instant) -> Vec<Up> {
        let mut up = Vec::new();
        let Some(m) = self.members.get_mut(i) else {
            return up;
        };
        let mut b = [0u8; 24];
        match m.s.read_exact(&mut b) {
            Ok(()) => {
                let (kind, _, a, bb) = decode(&b);
                self.on_member(i, kind, a, bb, now, &mut up);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => m.dead = true,
        }
        self.reap(now, &mut up);
        up
    }

    /// What the service sends the vGPU (`GRANT`, `EXTEND`, `CONTENDED`);
    /// false for a message it does not take. A grant no member takes (the
    /// one that asked went away) is given back at the next [`Group::tick`].
    pub fn on_service(&mut self, kind: u32, a: u64, b: u64, now: Instant) -> bool {
        match kind {
            GRANT => {
                self.granted_at = Some(now);
                self.slice = Duration::from_nanos(a);
                self.bits = b;
                self.idle_said = false;
                self.wanted = false;
                self.draining_said = false;
                for i in 0..self.members.len() {
                    if self.members[i].state == State::Wanting && self.send(i, GRANT, a, b) {
                        self.members[i].state = State::Holding(now);
                    }
                }
                true
            }
            EXTEND | CONTENDED if self.holding() => {
                if kind == EXTEND {
                    self.slice += Duration::from_nanos(a);
                    self.bits |= LONE;
                } else {
                    self.bits &= !LONE;
                }
                for i in 0..self.members.len() {
                    if self.members[i].state.held_since().is_some() {
                        self.send(i, kind, a, b);
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// Members gone or past the hold limit, and a grant none took: what
    /// the service is to take as the vGPU's.
    pub fn tick(&mut self, now: Instant) -> Vec<Up> {
        let mut up = Vec::new();
        // The grant's end, extended while the vGPU is alone on its GPU (a
        // lone holder keeps the GPU as long as it has work, and the service
        // extends it): a member is overdue past that end, as the service's
        // own holder is past its deadline.
        let end = self.granted_at.map(|g| g + self.slice);
        for m in &mut self.members {
            if let Some(since) = m.state.held_since() {
                let held = now.saturating_duration_since(since);
                let over = end.map_or(held, |e| now.saturating_duration_since(e.max(since)));
                if over > self.hold_limit {
                    tracing::warn!(
                        vgpu = self.vgpu,
                        held_ms = held.as_millis(),
                        "grant taken back from a member that kept it past the limit"
                    );
                    self.used_ns = self.used_ns.saturating_add(crate::nanos(held));
                    m.state = State::Idle;
                }
            }
        }
        self.reap(now, &mut up);
        up
    }

    /// One message of member `i`.
    fn on_member(&mut self, i: usize, kind: u32, a: u64, b: u64, now: Instant, up: &mut Vec<Up>) {
        let state = self.members[i].state;
        match kind {
            WANT => {
                if state.held_since().is_some() {
                    // A shared holder with work again.
                    self.members[i].idle = false;
                    self.busy_again(up);
                    return;
                }
                if state != State::Idle {
                    return;
                }
                self.members[i].state = State::Wanting;
                let left = self.left(now);
                if self.holding() && left >= MIN_LEFT {
                    self.send(i, GRANT, crate::nanos(left), self.bits);
                    if !self.members[i].dead {
                        self.members[i].state = State::Holding(now);
                        self.busy_again(up);
                    }
                } else if !self.holding() && !self.wanted {
                    self.wanted = true;
                    up.push((WANT, 0, 0));
                }
            }
            RELEASE => {
                if state.held_since().is_none() {
                    return;
                }
                self.used_ns = self.used_ns.saturating_add(a);
                self.busy |= b != 0;
                self.members[i].state = State::Idle;
                self.members[i].idle = false;
                self.settle(now, up);
                self.all_idle(up);
            }
            CHARGE if state.held_since().is_some() && self.holding() => {
                up.push((CHARGE, a, b));
            }
            IDLE if state.held_since().is_some() => {
                self.members[i].idle = true;
                self.all_idle(up);
            }
            DRAINING => {
                if let State::Holding(t) = state {
                    self.members[i].state = State::Draining(t);
                }
                let holders = self.members.iter().filter_map(|m| match m.state {
                    State::Holding(_) => Some(false),
                    State::Draining(_) => Some(true),
                    _ => None,
                });
                let mut all = true;
                let mut some = false;
                for d in holders {
                    all &= d;
                    some = true;
                }
                if all && some && !self.draining_said && self.holding() {
                    self.draining_said = true;
                    up.push((DRAINING, 0, 0));
                }
            }
            _ => {
                if let Some(k) = FIGURES.iter().position(|&f| f == kind) {
                    self.members[i].figures[k] = (a, b);
                    up.push(self.figure(k));
                }
            }
        }
    }

    /// The vGPU's figure of kind `FIGURES[k]`, over its members and, for
    /// counters, those that ended.
    fn figure(&self, k: usize) -> Up {
        let kind = FIGURES[k];
        let each = self.members.iter().map(|m| m.figures[k]);
        let (a, b) = if kind == COPIES {
            (each.map(|f| f.0).max().unwrap_or(0), 0)
        } else {
            each.fold((0u64, 0u64), |s, f| {
                (s.0.saturating_add(f.0), s.1.saturating_add(f.1))
            })
        };
        let a = if kind == OCCUPANCY {
            a.min(1_000_000)
        } else {
            a
        };
        let (ea, eb) = self.ended[k];
        (kind, a.saturating_add(ea), b.saturating_add(eb))
    }

    /// Members whose sockets failed are removed (charged what they held),
    /// and the grant given back if nobody holds it any more.
    fn reap(&mut self, now: Instant, up: &mut Vec<Up>) {
        let before = self.members.len();
        let mut held = 0u64;
        let ended = &mut self.ended;
        self.members.retain(|m| {
            if m.dead {
                if let Some(t) = m.state.held_since() {
                    held = held.saturating_add(crate::nanos(now.saturating_duration_since(t)));
                }
                add_counters(ended, &m.figures);
            }
            !m.dead
        });
        self.used_ns = self.used_ns.saturating_add(held);
        if self.members.len() != before {
            // Their figures leave the sums.
            for k in 0..FIGURES.len() {
                up.push(self.figure(k));
            }
        }
        self.settle(now, up);
        self.all_idle(up);
    }

    /// Gives the vGPU's grant back once no member holds it: what they used
    /// charged (at most the time it held the grant), still wanting it if
    /// one of them does (and asking again).
    fn settle(&mut self, now: Instant, up: &mut Vec<Up>) {
        let holders = self.members.iter().any(|m| m.state.held_since().is_some());
        if !self.holding() || holders {
            return;
        }
        let wanting = self.members.iter().any(|m| m.state == State::Wanting);
        let held = self
            .granted_at
            .take()
            .map_or(0, |t| crate::nanos(now.saturating_duration_since(t)));
        up.push((
            RELEASE,
            std::mem::take(&mut self.used_ns).min(held),
            u64::from(std::mem::take(&mut self.busy) || wanting),
        ));
        if wanting {
            self.wanted = true;
            up.push((WANT, 0, 0));
        }
    }

    /// A holding member has work: the vGPU wants the GPU again if it had
    /// said it was idle.
    fn busy_again(&mut self, up: &mut Vec<Up>) {
        if std::mem::take(&mut self.idle_said) {
            up.push((WANT, 0, 0));
        }
    }

    /// The vGPU is idle once every holding member is (and one holds).
    fn all_idle(&mut self, up: &mut Vec<Up>) {
        let mut holders = self
            .members
            .iter()
            .filter(|m| m.state.held_since().is_some())
            .peekable();
        if holders.peek().is_none() || !self.holding() || self.idle_said {
            return;
        }
        if holders.all(|m| m.idle) {
            self.idle_said = true;
            up.push((IDLE, 0, 0));
        }
    }

    /// What is left of the vGPU's slice.
    fn left(&self, now: Instant) -> Duration {
        self.granted_at.map_or(Duration::ZERO, |t| {
            (t + self.slice).saturating_duration_since(now)
        })
    }

    /// Sends member `i` a message; true if it was written (else the member
    /// is dropped at the next look).
    fn send(&mut self, i: usize, kind: u32, a: u64, b: u64) -> bool {
        let m = &mut self.members[i];
        let ok = m.s.write_all(&encode(kind, self.vgpu, a, b)).is_ok();
        m.dead |= !ok;
        ok
    }
}

/// Adds the counters among a member's `figures` (see [`COUNTERS`]) to `to`.
fn add_counters(to: &mut Counters, figures: &Counters) {
    for ((t, &(a, b)), &(ca, cb)) in to.iter_mut().zip(figures).zip(&COUNTERS) {
        if ca {
            t.0 = t.0.saturating_add(a);
        }
        if cb {
            t.1 = t.1.saturating_add(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group of `n` members with the far ends of their sockets.
    fn group(n: usize) -> (Group, Vec<UnixStream>) {
        let mut g = Group::new(7, Duration::from_secs(2));
        let mut far = Vec::new();
        for _ in 0..n {
            let (a, b) = UnixStream::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            assert!(g.add(a));
            far.push(b);
        }
        (g, far)
    }

    fn say(s: &mut UnixStream, kind: u32, a: u64, b: u64) {
        s.write_all(&encode(kind, 7, a, b)).unwrap();
    }

    fn heard(s: &mut UnixStream) -> (u32, u64, u64) {
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut m = [0u8; 24];
        s.read_exact(&mut m).unwrap();
        let (k, v, a, b) = decode(&m);
        assert_eq!(v, 7);
        (k, a, b)
    }

    fn nothing_heard(s: &mut UnixStream) {
        s.set_nonblocking(true).unwrap();
        let mut m = [0u8; 24];
        assert!(s.read(&mut m).is_err(), "a message was sent");
        s.set_nonblocking(false).unwrap();
    }

    /// On a GPU shared at once: members' charges are the vGPU's as they
    /// come; the vGPU is idle once every holder is, and wants the GPU
    /// again when one has work; a member granted at once gets the
    /// service's bits (`SHARED`).
    #[test]
    fn shared_grants_pass_charges_and_idle_for_the_whole_vgpu() {
        let (mut g, mut far) = group(3);
        let t = Instant::now();
        say(&mut far[0], WANT, 0, 0);
        assert_eq!(g.read(0, t), vec![(WANT, 0, 0)]);
        say(&mut far[1], WANT, 0, 0);
        assert_eq!(g.read(1, t), vec![]);
        assert!(g.on_service(GRANT, 30_000_000, SHARED | LONE, t));
        assert_eq!(heard(&mut far[0]), (GRANT, 30_000_000, SHARED | LONE));
        assert_eq!(heard(&mut far[1]), (GRANT, 30_000_000, SHARED | LONE));
        say(&mut far[0], CHARGE, 2_000_000, 8);
        assert_eq!(g.read(0, t), vec![(CHARGE, 2_000_000, 8)]);
        // Idle only once both holders are.
        say(&mut far[0], IDLE, 0, 0);
        assert_eq!(g.read(0, t), vec![]);
        say(&mut far[1], IDLE, 0, 0);
        assert_eq!(g.read(1, t), vec![(IDLE, 0, 0)]);
        // Work again: said once.
        say(&mut far[1], WANT, 0, 0);
        assert_eq!(g.read(1, t), vec![(WANT, 0, 0)]);
        say(&mut far[0], WANT, 0, 0);
        assert_eq!(g.read(0, t), vec![]);
        // Contended since: a member that asks now gets the bits without LONE.
        assert!(g.on_service(CONTENDED, 0, 0, t));
        assert_eq!(heard(&mut far[0]).0, CONTENDED);
        assert_eq!(heard(&mut far[1]).0, CONTENDED);
        say(&mut far[2], WANT, 0, 0);
        assert_eq!(g.read(2, t), vec![]);
        let (k, _, bits) = heard(&mut far[2]);
        assert_eq!((k, bits), (GRANT, SHARED));
        // A member that is not holding charges nothing.
        let (mut g2, mut far2) = group(1);
        say(&mut far2[0], CHARGE, 5, 1);
        assert_eq!(g2.read(0, t), vec![]);
        say(&mut far2[0], IDLE, 0, 0);
        assert_eq!(g2.read(0, t), vec![]);
    }

    /// The group asks once however many members want, grants them all,
    /// and gives the grant back once, when the last gives its part back,
    /// charging what they used together.
    #[test]
    fn members_share_one_grant_and_give_it_back_together() {
        let (mut g, mut far) = group(2);
        let t = Instant::now();
        say(&mut far[0], WANT, 0, 0);
        assert_eq!(g.read(0, t), vec![(WANT, 0, 0)]);
        say(&mut far[1], WANT, 0, 0);
        assert_eq!(g.read(1, t), vec![], "asked once");
        assert!(g.on_service(GRANT, 30_000_000, 0, t));
        assert_eq!(heard(&mut far[0]), (GRANT, 30_000_000, 0));
        assert_eq!(heard(&mut far[1]), (GRANT, 30_000_000, 0));
        let end = t + Duration::from_millis(10);
        say(&mut far[0], RELEASE, 4_000_000, 0);
        assert_eq!(g.read(0, end), vec![], "one still holds");
        assert!(g.holding());
        say(&mut far[1], RELEASE, 5_000_000, 1);
        assert_eq!(g.read(1, end), vec![(RELEASE, 9_000_000, 1)]);
        assert!(!g.holding());
        // Side by side for the whole grant: charged the grant's time.
        say(&mut far[0], WANT, 0, 0);
        g.read(0, end);
        g.on_service(GRANT, 30_000_000, 0, end);
        heard(&mut far[0]);
        say(&mut far[1], WANT, 0, 0);
        g.read(1, end);
        heard(&mut far[1]);
        let end2 = end + Duration::from_millis(30);
        say(&mut far[0], RELEASE, 30_000_000, 0);
        g.read(0, end2);
        say(&mut far[1], RELEASE, 30_000_000, 0);
        assert_eq!(g.read(1, end2), vec![(RELEASE, 30_000_000, 0)]);
    }

    /// A member asking while the vGPU holds the GPU gets what is left of
    /// the slice at once, told whether another vGPU waits; with less than
    /// `MIN_LEFT` left it waits for the next grant, which the group asks
    /// for as it gives this one back.
    #[test]
    fn a_member_asking_during_the_grant_joins_it_while_enough_is_left() {
        let (mut g, mut far) = group(3);
        let t = Instant::now();
        say(&mut far[0], WANT, 0, 0);
        g.read(0, t);
        g.on_service(GRANT, 10_000_000, 1, t);
        heard(&mut far[0]);
        assert!(g.on_service(CONTENDED, 0, 0, t));
        assert_eq!(heard(&mut far[0]), (CONTENDED, 0, 0));
        say(&mut far[1], WANT, 0, 0);
        assert_eq!(g.read(1, t + Duration::from_millis(4)), vec![]);
        assert_eq!(
            heard(&mut far[1]),
            (GRANT, 6_000_000, 0),
            "what is left, contended"
        );
        say(&mut far[2], WANT, 0, 0);
        let late = t + Duration::from_micros(9_500);
        assert_eq!(g.read(2, late), vec![]);
        nothing_heard(&mut far[2]);
        say(&mut far[0], RELEASE, 1, 0);
        g.read(0, late);
        say(&mut far[1], RELEASE, 2, 0);
        assert_eq!(
            g.read(1, late),
            vec![(RELEASE, 3, 1), (WANT, 0, 0)],
            "given back still wanted, and asked again for the waiting member"
        );
        assert!(g.on_service(GRANT, 10_000_000, 0, late));
        assert_eq!(heard(&mut far[2]), (GRANT, 10_000_000, 0));
    }

    /// Extensions reach the holding members; `DRAINING` goes up once every
    /// holder drains.
    #[test]
    fn extensions_reach_holders_and_draining_goes_up_when_all_drain() {
        let (mut g, mut far) = group(2);
        let t = Instant::now();
        for (i, f) in far.iter_mut().enumerate() {
            say(f, WANT, 0, 0);
            g.read(i, t);
        }
        g.on_service(GRANT, 2_000_000, 1, t);
        heard(&mut far[0]);
        heard(&mut far[1]);
        assert!(g.on_service(EXTEND, 2_000_000, 0, t));
        assert_eq!(heard(&mut far[0]), (EXTEND, 2_000_000, 0));
        assert_eq!(heard(&mut far[1]), (EXTEND, 2_000_000, 0));
        say(&mut far[0], DRAINING, 0, 0);
        assert_eq!(g.read(0, t), vec![]);
        say(&mut far[1], DRAINING, 0, 0);
        assert_eq!(g.read(1, t), vec![(DRAINING, 0, 0)]);
    }

    /// A member that goes away holding the grant is charged what it held;
    /// one that keeps it past the limit loses it and its late release is
    /// ignored; a grant no member takes is given back.
    #[test]
    fn a_member_gone_or_overdue_does_not_hold_the_others_up() {
        let (mut g, mut far) = group(2);
        let t = Instant::now();
        for (i, f) in far.iter_mut().enumerate() {
            say(f, WANT, 0, 0);
            g.read(i, t);
        }
        g.on_service(GRANT, 30_000_000, 0, t);
        drop(far.remove(0));
        let up = g.read(0, t + Duration::from_millis(3));
        assert!(!up.iter().any(|u| u.0 == RELEASE), "{up:?}");
        assert_eq!(g.members.len(), 1);
        let later = t + Duration::from_secs(3);
        let up = g.tick(later);
        let release = up.iter().find(|u| u.0 == RELEASE).copied();
        // 3 ms of the member gone and 3 s of the overdue one: at most the
        // 3 s the vGPU held the grant.
        assert_eq!(release, Some((RELEASE, 3_000_000_000, 0)), "{up:?}");
        say(&mut far[0], RELEASE, 5, 0);
        heard(&mut far[0]); // its grant
        assert_eq!(g.read(0, later), vec![], "its late release is ignored");
        assert!(g.on_service(GRANT, 1_000_000, 0, later));
        assert_eq!(g.tick(later), vec![(RELEASE, 0, 0)], "a grant none took");
    }

    /// A grant the service extends (the vGPU alone on its GPU) is not taken
    /// back from its members while the extensions last, only once one keeps
    /// it past the limit after the extended end.
    #[test]
    fn an_extended_grant_stays_with_its_members() {
        let (mut g, mut far) = group(1);
        let t = Instant::now();
        say(&mut far[0], WANT, 0, 0);
        g.read(0, t);
        g.on_service(GRANT, 100_000_000, 1, t);
        for k in 1..=50u64 {
            assert!(g.on_service(EXTEND, 100_000_000, 0, t + Duration::from_millis(100 * k)));
        }
        let up = g.tick(t + Duration::from_secs(4));
        assert!(
            !up.iter().any(|u| u.0 == RELEASE),
            "revoked while extended: {up:?}"
        );
        assert!(g.holding());
        let up = g.tick(t + Duration::from_millis(5_100 + 2_100));
        assert!(up.iter().any(|u| u.0 == RELEASE), "{up:?}");
    }

    /// Figures are summed over the members; the share of copies is the
    /// largest; a member gone leaves the sums, but not its counters.
    #[test]
    fn figures_are_summed_over_members() {
        let (mut g, mut far) = group(2);
        let t = Instant::now();
        say(&mut far[0], REPORT, 100, 3);
        assert_eq!(g.read(0, t), vec![(REPORT, 100, 3)]);
        say(&mut far[1], REPORT, 50, 4);
        assert_eq!(g.read(1, t), vec![(REPORT, 150, 7)]);
        say(&mut far[1], COPIES, 400_000, 0);
        assert_eq!(g.read(1, t), vec![(COPIES, 400_000, 0)]);
        say(&mut far[0], OCCUPANCY, 800_000, 0);
        g.read(0, t);
        say(&mut far[1], OCCUPANCY, 800_000, 0);
        assert_eq!(g.read(1, t), vec![(OCCUPANCY, 1_000_000, 0)]);
        say(&mut far[1], SERVED, 40, 2);
        assert_eq!(g.read(1, t), vec![(SERVED, 40, 2)]);
        drop(far.remove(1));
        let up = g.read(1, t);
        // Memory in use is the live members'; sync calls and requests
        // served count on.
        assert!(up.contains(&(REPORT, 100, 7)), "{up:?}");
        assert!(up.contains(&(SERVED, 40, 2)), "{up:?}");
    }

    /// A vGPU's counters go on across its groups (the service keeps them
    /// while it has no process): a later process's requests add to an
    /// earlier one's; memory in use does not.
    #[test]
    fn counters_carry_into_the_next_group() {
        let (mut g, mut far) = group(1);
        let t = Instant::now();
        say(&mut far[0], SERVED, 40, 2);
        g.read(0, t);
        say(&mut far[0], REPORT, 4096, 9);
        g.read(0, t);
        let c = g.counters();
        let (mut next, mut far) = group(1);
        next.carry(&c);
        say(&mut far[0], SERVED, 5, 1);
        assert_eq!(next.read(0, t), vec![(SERVED, 45, 3)]);
        say(&mut far[0], REPORT, 100, 1);
        assert_eq!(next.read(0, t), vec![(REPORT, 100, 10)]);
    }
}
