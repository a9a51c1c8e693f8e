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
//! - `sandbox`, `priority`, `procfs`, `sealed`, `ptx`: the process's
//!   confinement, thread priorities and vCPU boost, own usage, sealed
//!   memfds, PTX text.

#![warn(missing_docs)]

pub mod executor;
pub mod feed;
pub mod gate;
pub mod image_client;
pub mod priority;
pub mod process;
pub mod procfs;
pub mod ptx;
pub mod sandbox;
pub mod sealed;
pub mod serve;
pub mod session;

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
    /// A standby was promoted to a VM that uses the grant service but
    /// was handed no connection to it.
    #[error("config: promoted without a connection to the grant service")]
    PromotedWithoutGrant,
    /// The worker's seccomp filter could not be made or installed.
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
    /// The daemon's feed said something it should not, or closed.
    #[error(transparent)]
    Feed(#[from] feed::FeedError),
    /// A module image another process handed over (see the daemon's image store) was
    /// refused.
    #[error("image: {0}")]
    Image(#[from] ImageError),
    /// No driver, no such GPU, or a driver call failing while finding or
    /// opening GPUs (`executor/cuda/device.rs`).
    #[error("config: {0}")]
    Cuda(#[from] executor::cuda::CudaError),
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
