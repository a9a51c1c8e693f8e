//! Simulators of the scheduling policies in `sched`, for its tests and the
//! benches: nothing in the product runs them.
//!
//! - [`time`]: a deterministic discrete-event simulator of one
//!   non-preemptive GPU shared in time between VMs, with their vCPUs under a
//!   CFS-like CPU scheduler, and FairGV's scenarios on it
//!   ([`time::scenario`]);
//! - [`space`]: one GPU of many SMs and copy engines shared in space
//!   (co-running, MPS) as well as in time, and the figures of issue 20
//!   ([`space::report`]);
//! - [`placement`]: DCUDA's placement experiment on simulated GPUs;
//! - [`credit`]: the Xen-style credit scheduler, the baseline the time
//!   simulator compares fairvgpu against.

#![warn(missing_docs)]

pub mod credit;
pub mod placement;
pub mod space;
pub mod time;

/// Errors in a scenario description.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// A VM names a core the scenario does not have.
    #[error("VM {vm} is pinned to core {core} but there are {cores} cores")]
    NoSuchCore {
        /// The VM.
        vm: usize,
        /// Its core.
        core: usize,
        /// Cores in the scenario.
        cores: usize,
    },
    /// A workload whose loop takes no time.
    #[error("workload {0} has an empty loop")]
    EmptyLoop(String),
    /// A weight that is not positive.
    #[error("VM {0} has a weight that is not a positive number")]
    BadWeight(usize),
    /// No VMs.
    #[error("a scenario needs at least one VM")]
    NoVms,
}
