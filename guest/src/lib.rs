//! The guest side: a CUDA client over one channel of the shared region.
//!
//! [`Gpu`] owns one claimed channel (one guest process, one host context).
//! Synchronous calls send a request and poll for the reply (spinning, then
//! blocking on the doorbell); asynchronous calls (launches, host-to-device
//! copies, memsets, event records) only enqueue a descriptor. Their errors,
//! like CUDA's, come back at the next synchronizing call.
//!
//! Natively (a process on the host, tests, benches) [`Gpu::connect`] attaches
//! through the ivshmem-server socket; inside a VM the same code runs over the
//! PCI BAR mapped by the kernel module.
//!
//! Here the types; `connect.rs` finds and attaches the vGPU, `call.rs`
//! sends requests and waits for replies, and one file per API family makes
//! the calls: `memory.rs`, `module.rs`, `stream.rs` (launches, streams,
//! events, host functions, synchronization), `status.rs` (what a monitor
//! such as the NVML stand-in asks: the vGPU's memory, share, processes).

#![warn(missing_docs)]

mod call;
pub use call::descriptor;
mod connect;
pub mod copy;
pub mod device;
mod follow;
mod memory;
mod module;
mod numbering;
mod status;
mod stdio;
mod stream;

use std::sync::Arc;
use std::time::Duration;

use protocol::{DeviceInfo, Status};

pub use status::{
    cuda_version, driver_release, uuid_string, vgpu_uuid, VgpuReport, CUDA_DRIVER_VERSION,
    FALLBACK_DRIVER_RELEASE, PCI_BUS_ID,
};
use transport::server::Client;
use transport::{Bell, GuestChannel, SpinPolicy};

/// What a call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The host ran the call and it failed.
    #[error("CUDA error {0:?}")]
    Cuda(Status),
    /// The transport failed (host gone, channel reclaimed, ...).
    #[error("transport: {0}")]
    Transport(transport::Error),
    /// The vGPU's host worker restarted (it crashed, or a kernel fault
    /// poisoned its GPU contexts): everything this connection held on the
    /// GPU is gone. Drop this `Gpu` and open a new one to go on.
    #[error("the vGPU was reset (its host worker restarted); open the GPU again")]
    VgpuReset,
    /// The host answered something malformed.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The vGPU device of the kernel module failed.
    #[error("{what} on {}: {source}", path.display())]
    Device {
        /// The operation.
        what: &'static str,
        /// The device file.
        path: std::path::PathBuf,
        /// The system error.
        source: std::io::Error,
    },
    /// No vGPU is configured for this process.
    #[error("no vGPU: set FAIRVGPU_SOCKET (a host socket) or FAIRVGPU_DEVICE, or load the fairvgpu module in a VM with a vGPU attached")]
    NoVgpu,
}

impl From<transport::Error> for GuestError {
    fn from(e: transport::Error) -> Self {
        match e {
            transport::Error::HostRestarted { .. } => GuestError::VgpuReset,
            e => GuestError::Transport(e),
        }
    }
}

/// Result of a guest call.
pub type Result<T> = std::result::Result<T, GuestError>;

/// A device pointer (a number the host issued; meaningful only to the host).
pub type DevPtr = u64;

/// A loaded kernel.
#[derive(Debug, Clone)]
pub struct Function {
    /// Host handle.
    pub handle: u64,
    /// Size in bytes of each parameter, from the module's metadata.
    pub param_sizes: Vec<u32>,
    /// Offset of each parameter in the kernel's parameter buffer.
    pub param_offsets: Vec<u32>,
}

/// One guest process's connection to its vGPU.
pub struct Gpu {
    ch: GuestChannel,
    host_bell: Arc<dyn Bell>,
    own_bell: Arc<dyn Bell>,
    policy: SpinPolicy,
    /// The process's request numbering, shared by all its channels.
    seq: Arc<numbering::Numbering>,
    /// The session's token (for further channels to join it).
    token: [u64; 2],
    /// Where the vGPU was found (for further channels).
    origin: Origin,
    info: DeviceInfo,
    buf: Vec<u8>,
    copier: copy::Copier,
    transport: Transport,
    /// Whether a reply that says kernel output is held makes the process
    /// take it at once (the default; see [`Gpu::set_take_output`]).
    take_output: bool,
    /// The session's first channel: where the region's channels are split
    /// into process slots, further channels come from its slot.
    first: u32,
}

/// Where a process found its vGPU: a host socket or a VM's device.
#[derive(Debug, Clone)]
enum Origin {
    Socket(std::path::PathBuf),
    Device(std::path::PathBuf),
}

/// Opens further channels to a process's session (see [`Gpu::join`]).
#[derive(Debug, Clone)]
pub struct Joiner {
    origin: Origin,
    policy: SpinPolicy,
    seq: Arc<numbering::Numbering>,
    token: [u64; 2],
    info: DeviceInfo,
    first: u32,
}

/// How a new channel starts: a process's first (`Hello`), a further one
/// of its session, or a monitor's (no session).
enum Opening {
    Hello,
    Join(Joining),
    Monitor,
}

/// What a further channel of a process takes from its first.
struct Joining {
    seq: Arc<numbering::Numbering>,
    token: [u64; 2],
    info: DeviceInfo,
    /// The session's first channel.
    first: u32,
}

/// What keeps the channel reachable: the host socket (native) or the kernel
/// module's device (in a VM).
#[derive(Debug)]
enum Transport {
    /// Held for its socket: dropping it tells the host we left.
    Native(Client),
    Device(Arc<device::Device>),
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("channel", &self.ch.index())
            .field("device", &self.info.name)
            .finish()
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // A forked child that inherited this connection (and drops it, say
        // in an atexit handler) must leave its parent's channel alone.
        if !self.ch.claimed_here() {
            return;
        }
        // Let go first, then tell the module: a death between the two finds
        // the channel already closing, which the module leaves alone.
        self.ch.release();
        if let Transport::Device(d) = &self.transport {
            let _ = d.unbind(self.ch.index());
        }
    }
}

/// How long a synchronous call may wait for the host before giving up.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);

pub(crate) fn current_cpu() -> u32 {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).unwrap_or(0)
}

impl Gpu {
    /// The kernel module's counters for this process's vGPU device (None
    /// when attached natively).
    pub fn device_counters(&self) -> Option<device::DeviceInfo> {
        match &self.transport {
            Transport::Device(d) => d.info().ok(),
            Transport::Native(_) => None,
        }
    }

    /// How many threads copy large transfers through the arenas (1 or 2;
    /// the default is 2 where this process may run on four CPUs or more, or
    /// what `FAIRVGPU_COPY_THREADS` says: [`copy::default_threads`]).
    pub fn set_copy_threads(&mut self, threads: usize) {
        self.copier.set_threads(threads);
    }

    /// Large chunks split between two threads so far, and how many of their
    /// second halves the helper thread copied (the caller copied the rest,
    /// the helper not having started on them in time).
    pub fn copy_split_counts(&self) -> (u64, u64) {
        self.copier.split_counts()
    }

    /// How many threads copy large transfers.
    pub fn copy_threads(&self) -> usize {
        self.copier.threads()
    }

    /// The device as the host describes it (answered without a round trip).
    pub fn device_info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The channel number in the region.
    pub fn channel(&self) -> u32 {
        self.ch.index()
    }
}
