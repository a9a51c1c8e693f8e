//! The host and GPU side: host workers submitting what the policy allows
//! (collaborative slicing under fairvgpu), the GPU executing in submission
//! order, and the GPU handed from one holder to the next.

use super::{Engine, Ev, GpuOp, Holder, VState};
use crate::time::Policy;

impl Engine {
    fn submit(&mut self, v: usize, op: GpuOp) {
        self.vms[v].outstanding += 1;
        self.gpu_tail = self.gpu_tail.max(self.now) + op.ns;
        self.gpu.push_back((v, op));
        if self.gpu.len() == 1 {
            self.at(self.now + op.ns, Ev::GpuDone);
        }
    }

    pub(super) fn gpu_done(&mut self) {
        let Some((v, op)) = self.gpu.pop_front() else {
            return;
        };
        if self.now >= self.warm {
            self.vms[v].gpu_ns += op.ns;
        }
        self.vms[v].outstanding -= 1;
        if op.sync {
            self.at(self.now + self.m.reply_ns, Ev::Reply { vm: v });
        }
        if let Some(&(_, next)) = self.gpu.front() {
            self.at(self.now + next.ns, Ev::GpuDone);
        }
        self.pump_needed = true;
    }

    /// Lets workers submit what the policy allows; hands the GPU on.
    pub(super) fn pump(&mut self) {
        if self.policy == Policy::None {
            for v in 0..self.vms.len() {
                while let Some(op) = self.vms[v].pending.pop_front() {
                    self.submit(v, op);
                }
            }
            return;
        }
        loop {
            let Some(mut h) = self.holder else {
                if !self.grant_next() {
                    return;
                }
                continue;
            };
            let v = h.vm;
            if self.policy == Policy::Strict && self.vms[v].vstate != VState::Running {
                h.releasing = true;
            }
            while !h.releasing {
                let Some(&op) = self.vms[v].pending.front() else {
                    break;
                };
                // Collaborative slicing: submit only what is predicted to
                // finish within the slice (at least one request per grant).
                let finish = self.gpu_tail.max(self.now) + op.ns;
                if self.policy.fairgv()
                    && h.submitted_ns > 0
                    && finish > h.start + self.m.fairgv_slice_ns
                {
                    h.releasing = true;
                    break;
                }
                self.vms[v].pending.pop_front();
                h.submitted_ns += op.ns;
                self.submit(v, op);
            }
            let empty = self.vms[v].pending.is_empty() && self.vms[v].outstanding == 0;
            if h.releasing && self.vms[v].outstanding == 0 {
                self.holder = None;
                self.release(h);
                continue;
            }
            if !h.releasing && empty {
                if !h.idle {
                    h.idle = true;
                    if self.policy.work_conserving() {
                        let gen = h.gen;
                        self.at(self.now + self.m.host_spin_ns, Ev::HostIdle { gen });
                    }
                }
            } else {
                h.idle = false;
            }
            self.holder = Some(h);
            return;
        }
    }

    fn release(&mut self, h: Holder) {
        let id = h.vm as u32;
        if self.policy.fairgv() {
            // Charged the time the GPU was reserved for it, from the grant
            // until its last work completed: its GPU time plus its own gaps
            // (which nobody else could fill), overruns included.
            let charge = if self.policy == Policy::FairGvGpuCharge {
                h.submitted_ns
            } else {
                self.now - h.start
            };
            let _ = self.sfq.release(id, charge);
            if self.vms[h.vm].pending.is_empty() {
                if h.submitted_ns == 0 || !self.policy.work_conserving() {
                    let _ = self.sfq.idle(id, self.now);
                } else {
                    // Hybrid spinning on the host: it stays in the run queue
                    // (keeping its place) for one spin budget, so a vGPU
                    // between two synchronous calls is not taken for idle.
                    let gen = self.vms[h.vm].block_gen;
                    let t = self.now + self.m.host_spin_ns;
                    self.at(t, Ev::SfqBlock { vm: h.vm, gen });
                }
            }
        } else {
            self.credit.rotate(id);
        }
    }

    /// Grants the GPU to the next vGPU; false if nobody wants it.
    fn grant_next(&mut self) -> bool {
        let (vm, kick) = if self.policy.fairgv() {
            let Some(g) = self.sfq.grant(self.now) else {
                return false;
            };
            (g.vgpu as usize, g.kick_vcpu.map(|k| k as usize))
        } else {
            let strict = self.policy == Policy::Strict;
            let vms = &self.vms;
            let pick = self.credit.pick(|id| {
                let vm = &vms[id as usize];
                !vm.pending.is_empty() && (!strict || vm.vstate == VState::Running)
            });
            let Some(id) = pick else { return false };
            (id as usize, None)
        };
        self.holder_gen += 1;
        self.grants += 1;
        let gen = self.holder_gen;
        self.holder = Some(Holder {
            vm,
            gen,
            start: self.now,
            submitted_ns: 0,
            releasing: false,
            idle: false,
        });
        let slice = match self.policy {
            Policy::FairGv | Policy::FairGvGpuCharge | Policy::FairGvLas | Policy::FairGvTfs => {
                None // by prediction, or idleness
            }
            Policy::FairGvNoWc => Some(self.m.fairgv_slice_ns),
            _ => Some(self.m.credit_slice_ns),
        };
        if let Some(s) = slice {
            self.at(self.now + s, Ev::SliceEnd { gen });
        }
        if let Some(k) = kick {
            if self.policy.fairgv() && self.vms[k].vstate != VState::Running {
                self.at(self.now + self.m.wake_ns, Ev::Kick { vm: k });
            }
        }
        true
    }
}
