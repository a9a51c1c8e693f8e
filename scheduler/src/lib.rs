//! Scheduling policy for one physical GPU, with no I/O: the host daemon feeds
//! it events (a vGPU has work, blocked, used the GPU for so long) and acts on
//! its decisions (grant the GPU to this vGPU for this slice, kick this vCPU).
//!
//! Follows FairGV (section 3.2-3.3): start-tag fair queuing over vGPUs kept
//! in a red-black tree ([`sfq`]), interactivity classification for
//! GPU-centric coscheduling ([`classify`]), collaborative scheduling of a
//! non-preemptive GPU with sampled accounting ([`accounting`]), and kernel
//! slicing ([`slicing`]). [`credit`] is the Xen-style baseline and [`sim`] a
//! discrete-event simulator that runs any of the policies on described
//! workloads. [`GpuScheduler`] ties them together.

#![warn(missing_docs)]

pub mod accounting;
pub mod classify;
pub mod credit;
pub mod placement;
pub mod sfq;
pub mod sim;
pub mod slicing;
pub mod tenants;

use std::collections::HashMap;

pub use sfq::{StartTagQueue, VgpuId};

/// Errors of the scheduler.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchedError {
    /// A weight must be a positive, finite number.
    #[error("weight {0} is not a positive finite number")]
    BadWeight(f64),
    /// The vGPU is not known to this scheduler.
    #[error("no vGPU {0}")]
    NoSuchVgpu(VgpuId),
    /// The vGPU was added twice.
    #[error("vGPU {0} already exists")]
    Duplicate(VgpuId),
}

/// Min-Max Ratio of `x` (min over max; 0 if every value is 0): FairGV's
/// fairness figure, where x_i is what vGPU i got over what it should get.
pub fn mmr(x: &[f64]) -> f64 {
    let max = x.iter().cloned().fold(0.0, f64::max);
    let min = x.iter().cloned().fold(f64::INFINITY, f64::min);
    if max > 0.0 {
        min / max
    } else {
        0.0
    }
}

/// MMR of amounts `used` (GPU time, say) against `weights`: x_i = the
/// share of the total used by i over its share of the weights.
pub fn weighted_mmr(used: &[f64], weights: &[f64]) -> f64 {
    let total: f64 = used.iter().sum();
    let wsum: f64 = weights.iter().sum();
    let x: Vec<f64> = used
        .iter()
        .zip(weights)
        .map(|(u, w)| (u / total) / (w / wsum))
        .collect();
    mmr(&x)
}

/// Time slices of FairGV (configurable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slices {
    /// Slice on a non-preemptive GPU (FairGV: 6 ms).
    pub non_preemptive_ns: u64,
    /// Slice on a preemptive GPU (FairGV: 30 ms).
    pub preemptive_ns: u64,
}

impl Default for Slices {
    fn default() -> Self {
        Slices {
            non_preemptive_ns: 6_000_000,
            preemptive_ns: 30_000_000,
        }
    }
}

/// What the scheduler decided when the GPU became free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Who gets the GPU.
    pub vgpu: VgpuId,
    /// For how long (then it must give the GPU back).
    pub slice_ns: u64,
    /// The vCPU to kick: set when the vGPU is CPU-GPU interactive and one of
    /// its vCPUs waits on a synchronous call (GPU-centric coscheduling).
    pub kick_vcpu: Option<u32>,
}

/// The policy for one GPU: fair queue, classification, coscheduling decisions.
#[derive(Debug)]
pub struct GpuScheduler {
    queue: StartTagQueue,
    classes: HashMap<VgpuId, classify::Interactivity>,
    waiting_vcpu: HashMap<VgpuId, u32>,
    slice_ns: u64,
}

impl GpuScheduler {
    /// A scheduler handing out slices of `slice_ns`.
    pub fn new(slice_ns: u64) -> Self {
        GpuScheduler {
            queue: StartTagQueue::new(),
            classes: HashMap::new(),
            waiting_vcpu: HashMap::new(),
            slice_ns,
        }
    }

    /// The fair queue (for inspection and weight changes).
    pub fn queue(&mut self) -> &mut StartTagQueue {
        &mut self.queue
    }

    /// Adds a vGPU (not yet runnable).
    pub fn add(&mut self, id: VgpuId, weight: f64) -> Result<(), SchedError> {
        self.queue.add(id, weight)?;
        self.classes.insert(id, classify::Interactivity::default());
        Ok(())
    }

    /// Removes a vGPU.
    pub fn remove(&mut self, id: VgpuId) -> Result<(), SchedError> {
        self.queue.remove(id)?;
        self.classes.remove(&id);
        self.waiting_vcpu.remove(&id);
        Ok(())
    }

    /// The vGPU has requests: it becomes runnable. `sync_vcpu` is the vCPU
    /// waiting on it when the request is synchronous.
    pub fn request(
        &mut self,
        id: VgpuId,
        now_ns: u64,
        sync_vcpu: Option<u32>,
    ) -> Result<(), SchedError> {
        self.queue.wake(id)?;
        if let Some(v) = sync_vcpu {
            self.classes.entry(id).or_default().record_sync(now_ns);
            self.waiting_vcpu.insert(id, v);
        }
        Ok(())
    }

    /// The vGPU has nothing left to run (after its bounded spin).
    pub fn idle(&mut self, id: VgpuId) -> Result<(), SchedError> {
        self.waiting_vcpu.remove(&id);
        self.queue.block(id)
    }

    /// Picks who runs next.
    pub fn grant(&mut self, now_ns: u64) -> Option<Grant> {
        let vgpu = self.queue.pick()?;
        let interactive = self
            .classes
            .get_mut(&vgpu)
            .is_some_and(|c| c.is_interactive(now_ns));
        let kick_vcpu = if interactive {
            self.waiting_vcpu.get(&vgpu).copied()
        } else {
            None
        };
        Some(Grant {
            vgpu,
            slice_ns: self.slice_ns,
            kick_vcpu,
        })
    }

    /// Whether the vGPU is CPU-GPU interactive now.
    pub fn is_interactive(&mut self, id: VgpuId, now_ns: u64) -> bool {
        self.classes
            .get_mut(&id)
            .is_some_and(|c| c.is_interactive(now_ns))
    }

    /// The vGPU gave the GPU back after using it for `used_ns` (measured,
    /// overruns included).
    pub fn release(&mut self, id: VgpuId, used_ns: u64) -> Result<(), SchedError> {
        self.queue.charge(id, used_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_interactive_vgpus_get_their_vcpu_kicked() {
        let mut s = GpuScheduler::new(6_000_000);
        s.add(1, 1.0).unwrap();
        s.add(2, 1.0).unwrap();
        // vGPU 1: many synchronous calls per 10 ms; vGPU 2: one.
        for i in 0..20 {
            s.request(1, i * 400_000, Some(3)).unwrap();
        }
        s.request(2, 0, Some(5)).unwrap();
        let now = 8_000_000;
        let g = s.grant(now).unwrap();
        assert_eq!(g.vgpu, 1, "equal tags: lowest id first");
        assert_eq!(g.kick_vcpu, Some(3));
        s.release(1, 1_000_000).unwrap();
        let g = s.grant(now).unwrap();
        assert_eq!(g.vgpu, 2);
        assert_eq!(g.kick_vcpu, None, "not interactive, not coscheduled");
    }
}
