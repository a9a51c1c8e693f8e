//! Executors run validated calls on a device. The worker has already checked
//! every handle and every device-pointer range against the caller's own
//! tables, so an executor only does the work.
//!
//! A context's calls come in families, one trait each, in the file of the
//! same name as the request family in `serve/requests/` that calls them:
//! `memory` (allocations, copies), `ipc` (memory shared between contexts),
//! `module` (modules, kernels, occupancy), `launch`, `timing` (timed
//! launches, busy periods), `stream` (streams, marks), `stream_attrs`,
//! `event`, `graph`, `conditional` (conditional graph nodes), `vmm`,
//! `arrays`, `migrate`, `checkpoint` (a context's image, for another
//! worker), `limits` (limits, recycling). [`Context`] is every
//! family at once; the `cuda` and `sim` executors implement each family in
//! their file of that family.

use protocol::{DeviceInfo, Status};
use vm_memory::VolatileSlice;

mod arrays;
pub mod checkpoint;
mod conditional;
pub mod cuda;
mod event;
mod graph;
mod ipc;
mod launch;
mod limits;
mod memory;
mod migrate;
mod module;
pub mod sim;
mod staged;
mod stream;
mod stream_attrs;
mod timing;
mod vmm;

pub use arrays::{ArrayOp, Arrays};
pub use checkpoint::{Checkpoint, ContextImage};
pub use conditional::Conditionals;
pub use event::Events;
pub use graph::Graphs;
pub use ipc::{Ipc, Portable, SharedMem};
pub use launch::{launch_each, Launch, Launches, Queued};
pub use limits::Limits;
pub use memory::Memory;
pub use migrate::{Migration, Moved, PrepareJob, Prepared};
pub use module::Modules;
pub use stream::{Marker, Streams};
pub use stream_attrs::StreamAttributes;
pub use timing::Timing;
pub use vmm::Vmm;
pub use wire::Keeper;

/// Handle of a stream, event, module or function inside an executor.
pub type Handle = u64;

/// Hashes handles with one multiply instead of SipHash: they are looked up
/// on every launch, and the keys stored are numbers this process assigned
/// (a guest can look up any number, but cannot choose what is inserted).
#[derive(Debug, Default, Clone, Copy)]
pub struct HandleHasher(u64);

impl std::hash::Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// A map keyed by handles.
pub type HandleMap<V> =
    std::collections::HashMap<Handle, V, std::hash::BuildHasherDefault<HandleHasher>>;
/// A set of handles.
pub type HandleSet = std::collections::HashSet<Handle, std::hash::BuildHasherDefault<HandleHasher>>;

/// One device, shared by all contexts of a worker.
pub trait Executor: Send {
    /// The device as guests see it (before the vGPU's memory limit is applied).
    fn info(&self) -> DeviceInfo;
    /// A fresh context (one per guest process).
    fn open(&mut self) -> Result<Box<dyn Context>, Status>;
    /// Where the executor can make contexts on another thread: what makes
    /// one there, as [`Executor::open`] would (a worker then makes the
    /// contexts it makes ahead while it already serves; see
    /// `serve/contexts.rs`). None: only `open`, on the worker's thread.
    fn opener(&self) -> Option<Opener> {
        None
    }
    /// Makes `ranges` of the shared region (the response arenas, alive as
    /// long as the executor) direct DMA targets of device-to-host copies,
    /// where the device can.
    fn register_host_memory(&mut self, _ranges: &[VolatileSlice<'_>]) -> Result<(), Status> {
        Ok(())
    }
    /// Makes the region's pinned pool (alive as long as the executor)
    /// page-locked and reachable by the device; returns the device address
    /// of its first byte.
    fn register_pinned(&mut self, pool: &VolatileSlice<'_>) -> Result<u64, Status> {
        Ok(pool.ptr_guard().as_ptr() as u64)
    }
    /// Whether blocks of the region's pinned pool (alive as long as the
    /// executor) can be registered with the device one by one as they are
    /// handed out ([`Executor::register_pinned_block`]), each reached by
    /// the device at its host address. False: the pool is registered whole
    /// ([`Executor::register_pinned`]).
    fn pinned_blocks(&mut self, _pool: &VolatileSlice<'_>) -> Result<bool, Status> {
        Ok(false)
    }
    /// Makes `block` of the pinned pool page-locked and reachable by the
    /// device at its host address, until [`Executor::unregister_pinned_block`].
    fn register_pinned_block(&mut self, _block: &VolatileSlice<'_>) -> Result<(), Status> {
        Ok(())
    }
    /// Undoes [`Executor::register_pinned_block`] of `block` (the same
    /// range): the device reaches it no more.
    fn unregister_pinned_block(&mut self, _block: &VolatileSlice<'_>) -> Result<(), Status> {
        Ok(())
    }
    /// GPUs this executor can run on (migration targets).
    fn devices(&self) -> u32 {
        1
    }
    /// The GPU new contexts open on.
    fn device(&self) -> u32 {
        0
    }
    /// A context opened and made again from `image`
    /// ([`Checkpoint::restore_into`]).
    fn restore(&mut self, image: &ContextImage) -> Result<Box<dyn Context>, Status> {
        let mut ctx = self.open()?;
        ctx.restore_into(image)?;
        Ok(ctx)
    }
    /// Opens new contexts on `device` from now on (after a migration).
    fn set_device(&mut self, device: u32) -> Result<(), Status> {
        if device == self.device() {
            Ok(())
        } else {
            Err(Status::NotSupported)
        }
    }
}

/// Makes one context, on whatever thread calls it ([`Executor::opener`]).
pub type Opener = Box<dyn FnMut() -> Result<Box<dyn Context>, Status> + Send>;

/// The per-guest-process context: every family of calls. Dropping it frees
/// everything it holds. A type with every family is a `Context`.
pub trait Context:
    Memory
    + Ipc
    + Modules
    + Launches
    + Timing
    + Streams
    + StreamAttributes
    + Events
    + Graphs
    + Conditionals
    + Vmm
    + Arrays
    + Migration
    + Checkpoint
    + Limits
    + Send
{
}

impl<T> Context for T where
    T: Memory
        + Ipc
        + Modules
        + Launches
        + Timing
        + Streams
        + StreamAttributes
        + Events
        + Graphs
        + Conditionals
        + Vmm
        + Arrays
        + Migration
        + Checkpoint
        + Limits
        + Send
{
}

/// Which executor runs the calls.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    Default,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// The CPU model of a non-preemptive GPU.
    #[default]
    Sim,
    /// A real GPU through the CUDA driver API.
    Cuda,
}

/// Which kernel launches the cuda executor submits as CUDA graph launches
/// (see `executor/cuda/batch.rs`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    Default,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum GraphLaunches {
    /// None: one `cuLaunchKernel` per launch, as the guest called it.
    Off,
    /// Runs of two or more launches the worker found queued behind one
    /// another: one graph launch per run instead of a driver call per launch;
    /// single launches go through `cuLaunchKernel`.
    Runs,
    /// Every launch, single ones as one-node graphs: they cost the host about
    /// half a `cuLaunchKernel` and start sooner, so synchronous round trips
    /// are shorter (results/2026-11-22-h100-wake-credit.md).
    #[default]
    All,
}
