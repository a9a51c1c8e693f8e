//! The CPU side: vCPUs on cores under the CFS-like scheduler (vruntime,
//! slices, wake-up preemption, GPU-centric kicks), each guest's program
//! interpreted step by step, and replies reaching spinning or blocked
//! guests.

use super::{Act, Engine, Ev, Inst, VState};
use crate::time::Policy;

impl Engine {
    /// Brings the running vCPU of `c` up to now: vruntime and progress.
    fn settle(&mut self, c: usize) {
        let now = self.now;
        let core = &mut self.cores[c];
        let dt = now - core.last;
        core.last = now;
        if let Some(v) = core.cur {
            let vm = &mut self.vms[v];
            vm.vruntime += dt;
            match &mut vm.act {
                Act::Compute(left) => *left -= dt.min(*left),
                Act::Spin(Some(left)) => *left -= dt.min(*left),
                _ => {}
            }
            let cur_vr = vm.vruntime;
            let min_rq = core.runq.iter().map(|&r| self.vms[r].vruntime).min();
            let lowest = min_rq.map_or(cur_vr, |r| r.min(cur_vr));
            core.min_vruntime = core.min_vruntime.max(lowest);
        }
    }

    /// Arms the next event of core `c`: its running vCPU's work or spin
    /// budget running out, or its slice ending while others wait.
    pub(super) fn arm(&mut self, c: usize) {
        let core = &mut self.cores[c];
        core.gen += 1;
        let Some(v) = core.cur else { return };
        let mut t = if core.runq.is_empty() {
            u64::MAX
        } else {
            core.slice_end
        };
        match self.vms[v].act {
            Act::Compute(left) => t = t.min(self.now + left),
            Act::Spin(Some(left)) => t = t.min(self.now + left),
            _ => {}
        }
        if t != u64::MAX {
            let gen = core.gen;
            self.at(t.max(self.now), Ev::Core { core: c, gen });
        }
    }

    /// Puts the lowest-vruntime runnable vCPU on the idle core `c` (and the
    /// next one if that one blocks at once).
    pub(super) fn dispatch(&mut self, c: usize) {
        while self.cores[c].cur.is_none() {
            let core = &self.cores[c];
            let Some(&v) = core.runq.iter().min_by_key(|&&r| (self.vms[r].vruntime, r)) else {
                return;
            };
            self.run_on(c, v);
        }
    }

    /// Runs runnable vCPU `v` on the idle core `c`.
    fn run_on(&mut self, c: usize, v: usize) {
        let core = &mut self.cores[c];
        debug_assert!(core.cur.is_none());
        let nr = core.runq.len() as u64;
        core.runq.retain(|&r| r != v);
        let slice = (self.m.cfs_latency_ns / nr.max(1)).max(self.m.cfs_min_gran_ns);
        core.cur = Some(v);
        core.last = self.now;
        core.slice_end = self.now + slice;
        self.pump_needed |= self.policy == Policy::Strict;
        let vm = &mut self.vms[v];
        vm.vstate = VState::Running;
        if matches!(vm.act, Act::Spin(_)) && vm.reply_ready {
            vm.act = Act::Ready;
        }
        if vm.act == Act::Ready {
            self.proceed(v);
        }
    }

    /// Takes the running vCPU off core `c` (it stays runnable).
    fn preempt(&mut self, c: usize) {
        if let Some(v) = self.cores[c].cur.take() {
            self.vms[v].vstate = VState::Runnable;
            self.cores[c].runq.push(v);
            self.pump_needed |= self.policy == Policy::Strict;
        }
    }

    pub(super) fn core_event(&mut self, c: usize) {
        self.settle(c);
        if let Some(v) = self.cores[c].cur {
            match self.vms[v].act {
                Act::Compute(0) => {
                    self.vms[v].pc += 1;
                    self.vms[v].act = Act::Ready;
                    self.proceed(v);
                }
                Act::Spin(Some(0)) => self.block(v, Act::Waiting),
                _ => {}
            }
        }
        let core = &self.cores[c];
        if core.cur.is_some() && self.now >= core.slice_end && !core.runq.is_empty() {
            self.preempt(c);
        }
        if self.cores[c].cur.is_none() {
            self.dispatch(c);
        }
        self.arm(c);
    }

    /// The running vCPU `v` stops running until woken.
    fn block(&mut self, v: usize, act: Act) {
        let c = self.vms[v].core;
        debug_assert_eq!(self.cores[c].cur, Some(v));
        self.cores[c].cur = None;
        self.vms[v].vstate = VState::Blocked;
        self.vms[v].act = act;
        self.pump_needed |= self.policy == Policy::Strict;
    }

    /// Wakes a blocked vCPU (CFS wake-up placement and preemption); with
    /// `kick`, it runs at once whatever the CPU scheduler would choose.
    pub(super) fn wake(&mut self, v: usize, kick: bool) {
        let c = self.vms[v].core;
        match self.vms[v].vstate {
            VState::Running => return,
            VState::Blocked => {
                if self.vms[v].act == Act::Sleeping && kick {
                    return; // a kick never cuts a sleep short
                }
                self.vms[v].wake_gen += 1;
                let floor = self.cores[c]
                    .min_vruntime
                    .saturating_sub(self.m.cfs_latency_ns / 2);
                let budget = self.spin_budget();
                let vm = &mut self.vms[v];
                vm.vruntime = vm.vruntime.max(floor);
                vm.vstate = VState::Runnable;
                vm.act = if vm.reply_ready || vm.act == Act::Sleeping {
                    Act::Ready
                } else {
                    // Kicked before its reply: spin for it again.
                    Act::Spin(budget)
                };
                self.cores[c].runq.push(v);
            }
            VState::Runnable => {
                if !kick {
                    return;
                }
            }
        }
        self.settle(c);
        let preempt = match self.cores[c].cur {
            None => true,
            Some(cur) => {
                kick || self.vms[cur].vruntime > self.vms[v].vruntime + self.m.cfs_wakeup_gran_ns
            }
        };
        if preempt {
            self.preempt(c);
            if kick {
                // Run exactly this vCPU: GPU-centric coscheduling.
                self.run_on(c, v);
            }
            self.dispatch(c);
        }
        self.arm(c);
    }

    fn spin_budget(&self) -> Option<u64> {
        if self.policy.guest_polls() {
            None
        } else {
            Some(self.m.guest_spin_ns)
        }
    }

    /// Interprets `v`'s program from its pc until something takes time.
    fn proceed(&mut self, v: usize) {
        loop {
            let vm = &mut self.vms[v];
            if vm.pc == vm.prog.len() {
                vm.pc = 0;
                if self.now >= self.warm {
                    vm.iters += 1;
                }
            }
            match vm.prog[vm.pc] {
                Inst::Cpu(0) => vm.pc += 1,
                Inst::Cpu(ns) => {
                    vm.act = Act::Compute(ns);
                    return;
                }
                Inst::Send(op) => {
                    vm.pc += 1;
                    if self.now >= self.warm {
                        if op.sync {
                            vm.sync_calls += 1;
                        } else {
                            vm.async_calls += 1;
                        }
                    }
                    self.at(self.now + self.m.ring_ns, Ev::Request { vm: v, op });
                }
                Inst::Wait => {
                    if vm.reply_ready {
                        vm.reply_ready = false;
                        vm.pc += 1;
                        continue;
                    }
                    let budget = self.spin_budget();
                    if budget == Some(0) {
                        self.block(v, Act::Waiting);
                    } else {
                        self.vms[v].act = Act::Spin(budget);
                    }
                    return;
                }
                Inst::SleepUntil(p) => {
                    vm.pc += 1;
                    // Frame pacing: sleep until the end of this period; a
                    // late frame starts the next one at once, and one more
                    // than a period late drops the backlog.
                    if vm.period_end == 0 || self.now >= vm.period_end + p {
                        vm.period_end = (self.now / p + 1) * p;
                    }
                    let wake = vm.period_end;
                    vm.period_end += p;
                    if wake <= self.now {
                        continue;
                    }
                    let from = self.now.max(self.warm);
                    if wake > from {
                        vm.sleep_ns += wake.min(self.end) - from.min(self.end);
                    }
                    vm.wake_gen += 1;
                    let gen = vm.wake_gen;
                    self.block(v, Act::Sleeping);
                    self.at(wake, Ev::Wake { vm: v, gen });
                    return;
                }
            }
        }
    }

    /// A reply reached guest `v`.
    pub(super) fn reply(&mut self, v: usize) {
        self.vms[v].reply_ready = true;
        let coscheduled = self.policy.fairgv()
            && self.policy != Policy::FairGvNoWc
            && self.holder.is_some_and(|h| h.vm == v)
            && self.sfq.is_interactive(v as u32, self.now);
        match (self.vms[v].vstate, self.vms[v].act) {
            (VState::Running, Act::Spin(_)) => {
                let c = self.vms[v].core;
                self.settle(c);
                self.vms[v].act = Act::Ready;
                self.proceed(v);
                if self.cores[c].cur.is_none() {
                    self.dispatch(c);
                }
                self.arm(c);
            }
            (VState::Blocked, Act::Waiting) => {
                let gen = self.vms[v].wake_gen + 1;
                self.vms[v].wake_gen = gen;
                let ev = if coscheduled {
                    Ev::Kick { vm: v }
                } else {
                    Ev::Wake { vm: v, gen }
                };
                self.at(self.now + self.m.wake_ns, ev);
            }
            (VState::Runnable, _) if coscheduled => {
                self.at(self.now + self.m.wake_ns, Ev::Kick { vm: v });
            }
            _ => {}
        }
    }
}
