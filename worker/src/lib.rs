//! A vGPU's worker: the process that serves one VM's region on a GPU.
//!
//! The daemon starts one worker process per VM (`fairvgpu worker`); once set
//! up it confines itself (`sandbox`) and from then on reads only what its
//! VM's guests write into the shared region and what the daemon feeds it.
//! This crate depends on nothing of the daemon: what the two say to each
//! other is the `wire` crate.
//!
//! - `serve/`: the serving loop and its phases (channels, requests,
//!   transfers, waits, sessions, kernel output, contexts),
//! - `session`: what one guest process holds and may touch,
//! - `executor/`: where the calls run: `cuda` (a real GPU) or `sim`,
//! - `process`: the worker process's start (executor, feed, sandbox),
//! - `feed`, `gate`, `image_client`: its ends of the feed, the grant
//!   service and the image store,
//! - `spare`: a spare worker's binding to a VM's process slot,
//! - `sandbox`, `priority`, `procfs`, `sealed`, `ptx`: the process's
//!   confinement, thread priorities and vCPU boost, own usage, sealed
//!   memfds, PTX text.

#![warn(missing_docs)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

// Offsets and lengths are kept in u64 and used as usize: the host is
// 64-bit only.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("fairvgpu supports 64-bit hosts only");

/// `x` as a `usize`, for sizes and offsets kept in `u64`.
#[allow(clippy::cast_possible_truncation)] // lossless: usize is 64 bits (see above)
pub(crate) const fn usize_from(x: u64) -> usize {
    x as usize
}

/// `d` in whole nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `d` in whole microseconds, saturating at `u64::MAX`.
pub(crate) fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// `d` in whole milliseconds, saturating at `u64::MAX`.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `x` truncated toward zero to a `u64`, saturating as Rust's `as` does:
/// negative and NaN give 0, anything past `u64::MAX` gives `u64::MAX`.
/// For figures and durations computed in f64.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // saturates, as said
pub(crate) fn sat_u64(x: f64) -> u64 {
    x as u64
}

pub mod checkpoint;
pub mod executor;
pub mod exports;
pub mod feed;
pub mod gate;
pub mod image_client;
pub mod ledger;
pub mod priority;
pub mod process;
pub mod procfs;
pub mod ptx;
pub mod sandbox;
pub mod sealed;
pub mod serve;
pub mod session;
pub mod spare;

/// The PTX of the kernels the sim executor implements (`kernels/`), which
/// the demo's tenants and the tests load.
pub const KERNELS_PTX: &str = include_str!("../kernels/fairvgpu.ptx");

/// What can go wrong in a worker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The transport failed.
    #[error(transparent)]
    Transport(#[from] transport::Error),
    /// An I/O operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The sim executor has no GPU of that number.
    #[error("config: no GPU {gpu}: [sim] gpus = {gpus}")]
    NoGpu {
        /// The GPU asked for.
        gpu: u32,
        /// How many the sim has.
        gpus: u32,
    },
    /// Making the GPU contexts ahead (`prefill_contexts`) failed.
    #[error("config: making GPU contexts ahead: {0:?}")]
    Prefill(protocol::Status),
    /// A spare worker was bound without a feed.
    #[error("config: a spare is bound to a process slot's feed alone")]
    SpareNotFed,
    /// A process slot the region does not have.
    #[error("config: no process slot {0}: the region has {1}")]
    NoSuchSlot(u32, u32),
    /// The worker's seccomp filter could not be made or installed.
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
    /// The daemon's feed said something it should not, or closed.
    #[error(transparent)]
    Feed(#[from] feed::FeedError),
    /// The daemon's binding of a spare worker said something it should
    /// not, or closed.
    #[error(transparent)]
    Spare(#[from] spare::SpareError),
    /// A module image another process handed over (see the daemon's image store) was
    /// refused.
    #[error("image: {0}")]
    Image(#[from] ImageError),
    /// No driver, no such GPU, or a driver call failing while finding or
    /// opening GPUs (`executor/cuda/device.rs`).
    #[error("config: {0}")]
    Cuda(#[from] executor::cuda::CudaError),
    /// A checkpoint was not taken, or not served on from.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] serve::CheckpointError),
    /// A sticky CUDA error left every GPU context of the worker unusable.
    #[error("a CUDA error ({0:?}) poisoned the worker's GPU contexts")]
    Poisoned(protocol::Status),
}

/// Why a module image handed over by another process (a sealed memfd, see
/// `sealed`) or the image store's answer was refused.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The fd is not sealed against writing, shrinking and growing.
    #[error("an image fd that is not sealed")]
    NotSealed,
    /// The fd is not of the length the sender gave.
    #[error("an image fd of {size} bytes, not {len}")]
    WrongSize {
        /// What fstat says.
        size: libc::off_t,
        /// What the sender said.
        len: usize,
    },
    /// An image of no bytes.
    #[error("an empty image")]
    Empty,
    /// The length the store gave does not fit this process.
    #[error("too long")]
    TooLong,
    /// The image store answered with a message it should not send.
    #[error("the image store answered nonsense")]
    Nonsense,
}
