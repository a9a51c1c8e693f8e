//! A deterministic discrete-event simulator of GPU sharing between VMs.
//!
//! Modeled: physical cores running vCPUs under a CFS-like fair CPU scheduler
//! (vruntime, a 6 ms latency target, 0.75 ms minimum granularity, wake-up
//! preemption); one vCPU per VM running its [`Workload`] loop: host code,
//! asynchronous launches and synchronous calls, each call costing the guest
//! CPU time and a ring crossing; a guest waiting on a reply spins (using its
//! vCPU) and, under hybrid spinning, blocks after a budget and is woken by an
//! interrupt; one host worker per vGPU; one non-preemptive GPU executing
//! operations in submission order. A [`Policy`] decides which worker may
//! submit. Everything is integer nanoseconds and the event queue breaks ties
//! by insertion order, so a run is a pure function of its inputs.
//!
//! The policies: [`Policy::None`] (every worker submits at once: the
//! driver's first come first served), the credit baselines with polling or
//! hybrid spinning, strict CPU-GPU coscheduling (Pegasus: a vGPU may use the
//! GPU only while its vCPU runs, with the credit check), and fairvgpu's
//! [`sched::GpuScheduler`] with collaborative accounting, work conservation and
//! GPU-centric coscheduling (with an ablation without work conservation).

mod engine;
pub mod scenario;
pub mod workload;

use sched::DevicePolicy;

use crate::credit;
use crate::SimError;
pub use workload::{Step, Workload};

/// GPU scheduling policies the simulator can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// No scheduler: first come first served on the GPU queue.
    None,
    /// Credit scheduler; guests poll for replies and the holder polls its
    /// ring for its whole slice.
    CreditPoll,
    /// Credit scheduler with hybrid spinning on both sides.
    CreditHs,
    /// Strict coscheduling (Pegasus): only a vGPU whose vCPU is running may
    /// hold the GPU; credit check; hybrid spinning.
    Strict,
    /// fairvgpu: start-tag fair queuing, 6 ms slices charged by measured GPU
    /// time, work-conserving hybrid spinning, GPU-centric coscheduling.
    FairGv,
    /// fairvgpu without work conservation: an idle holder keeps its slice.
    FairGvNoWc,
    /// fairvgpu charging only the GPU time of the work (not the holder's
    /// own gaps while it holds the GPU): an ablation of the charge.
    FairGvGpuCharge,
    /// fairvgpu's machinery with Strings' least-attained-service order
    /// ([`sched::DevicePolicy::Las`]) instead of start tags.
    FairGvLas,
    /// fairvgpu's machinery with Strings' true-fair-share order
    /// ([`sched::DevicePolicy::Tfs`]).
    FairGvTfs,
}

impl Policy {
    /// Name used in tables.
    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::CreditPoll => "credit-poll",
            Policy::CreditHs => "credit-hs",
            Policy::Strict => "strict-cosched",
            Policy::FairGv => "fairvgpu",
            Policy::FairGvNoWc => "fairvgpu-no-wc",
            Policy::FairGvGpuCharge => "fairvgpu-gpu-charge",
            Policy::FairGvLas => "fairvgpu-las",
            Policy::FairGvTfs => "fairvgpu-tfs",
        }
    }

    /// Guests wait by polling (no budget) rather than spin-then-block.
    /// (Strict coscheduling needs it: a vCPU blocked on its reply would
    /// never run again to let its vGPU be scheduled.)
    fn guest_polls(self) -> bool {
        matches!(self, Policy::CreditPoll | Policy::Strict)
    }

    /// An idle holder gives the GPU back after a short spin.
    fn work_conserving(self) -> bool {
        !matches!(self, Policy::CreditPoll | Policy::FairGvNoWc)
    }

    fn fairgv(self) -> bool {
        matches!(
            self,
            Policy::FairGv
                | Policy::FairGvNoWc
                | Policy::FairGvGpuCharge
                | Policy::FairGvLas
                | Policy::FairGvTfs
        )
    }

    /// The device-level order of the fairvgpu policies.
    fn device_policy(self) -> DevicePolicy {
        match self {
            Policy::FairGvLas => DevicePolicy::Las,
            Policy::FairGvTfs => DevicePolicy::Tfs,
            _ => DevicePolicy::FairQueue,
        }
    }
}

/// The modeled machine's constants.
#[derive(Debug, Clone, Copy)]
pub struct Machine {
    /// Guest CPU time to issue one call (marshal, write the descriptor).
    pub call_cpu_ns: u64,
    /// Guest to host ring crossing.
    pub ring_ns: u64,
    /// Host to guest reply crossing.
    pub reply_ns: u64,
    /// Interrupt + wake-up of a blocked vCPU.
    pub wake_ns: u64,
    /// Guest spin budget before blocking (hybrid spinning).
    pub guest_spin_ns: u64,
    /// Host worker spin budget before an idle holder yields.
    pub host_spin_ns: u64,
    /// CFS latency target.
    pub cfs_latency_ns: u64,
    /// CFS minimum granularity.
    pub cfs_min_gran_ns: u64,
    /// CFS wake-up preemption granularity.
    pub cfs_wakeup_gran_ns: u64,
    /// fairvgpu's slice on a non-preemptive GPU.
    pub fairgv_slice_ns: u64,
    /// The credit baselines' slice.
    pub credit_slice_ns: u64,
}

impl Default for Machine {
    fn default() -> Self {
        Machine {
            call_cpu_ns: 1_000,
            ring_ns: 1_000,
            reply_ns: 1_000,
            wake_ns: 5_000,
            guest_spin_ns: 50_000,
            host_spin_ns: 50_000,
            cfs_latency_ns: 6_000_000,
            cfs_min_gran_ns: 750_000,
            cfs_wakeup_gran_ns: 1_000_000,
            fairgv_slice_ns: 6_000_000,
            credit_slice_ns: credit::PERIOD_NS,
        }
    }
}

/// One VM of a scenario.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// What its guest runs.
    pub workload: Workload,
    /// Its GPU weight.
    pub weight: f64,
    /// The physical core its vCPU is pinned to.
    pub core: usize,
}

/// What happened in one run, counted after a warm-up of a tenth of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStats {
    /// Length of the measured window.
    pub window_ns: u64,
    /// Loop iterations completed per VM.
    pub iters: Vec<u64>,
    /// GPU time used per VM.
    pub gpu_ns: Vec<u64>,
    /// Time each VM's guest slept (periodic workloads).
    pub sleep_ns: Vec<u64>,
    /// Synchronous calls made per VM.
    pub sync_calls: Vec<u64>,
    /// Asynchronous calls made per VM.
    pub async_calls: Vec<u64>,
    /// Grants handed out (scheduled policies).
    pub grants: u64,
    /// Events processed (a cost figure for the simulator itself).
    pub events: u64,
}

impl RunStats {
    /// Fraction of the window the GPU was busy.
    pub fn gpu_util(&self) -> f64 {
        self.gpu_ns.iter().sum::<u64>() as f64 / self.window_ns as f64
    }
}

/// Runs `vms` on `cores` cores under `policy` for `duration_ns` of
/// simulated time.
pub fn run(
    vms: &[VmSpec],
    cores: usize,
    policy: Policy,
    m: &Machine,
    duration_ns: u64,
) -> Result<RunStats, SimError> {
    validate(vms, cores)?;
    Ok(engine::run(vms, cores, policy, m, duration_ns))
}

/// Checks a scenario: at least one VM, each on an existing core, with a
/// loop that takes time and a positive weight.
fn validate(vms: &[VmSpec], cores: usize) -> Result<(), SimError> {
    if vms.is_empty() {
        return Err(SimError::NoVms);
    }
    for (i, v) in vms.iter().enumerate() {
        if v.core >= cores {
            return Err(SimError::NoSuchCore {
                vm: i,
                core: v.core,
                cores,
            });
        }
        if !v.workload.is_well_formed() {
            return Err(SimError::EmptyLoop(v.workload.name.clone()));
        }
        if !(v.weight.is_finite() && v.weight > 0.0) {
            return Err(SimError::BadWeight(i));
        }
    }
    Ok(())
}
