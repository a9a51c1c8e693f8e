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
    /// What the worker was asked to do cannot be done (no such GPU).
    #[error("config: {0}")]
    Config(String),
    /// A module image another process handed over (see the daemon's image store) was
    /// refused.
    #[error("image: {0}")]
    Image(String),
    /// No driver, no such GPU, or a driver call failing while finding or
    /// opening GPUs (`executor/cuda/device.rs`).
    #[error("config: {0}")]
    Cuda(#[from] executor::cuda::CudaError),
    /// A sticky CUDA error left every GPU context of the worker unusable.
    #[error("a CUDA error ({0:?}) poisoned the worker's GPU contexts")]
    Poisoned(protocol::Status),
}
