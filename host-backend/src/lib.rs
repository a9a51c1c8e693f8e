//! The fairvgpu host: daemon, per-vGPU workers, executors, benches.

#![warn(missing_docs)]

pub mod attach;
pub mod bench;
pub mod cli;
pub mod config;
pub mod control;
pub mod cosched;
pub mod daemon;
pub mod demo;
pub mod executor;
pub mod grant;
pub mod hostcpu;
pub mod identity;
pub mod image_store;
pub mod link;
pub mod mps;
pub mod procfs;
pub mod ptx;
pub mod run_lock;
pub mod sandbox;
pub mod sealed;
pub mod session;
pub mod signals;
pub mod worker;

/// Errors of the host crate.
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
    /// The daemon cannot start as configured (its run_dir is in use or
    /// cannot be written): the message names the thing and what to do.
    #[error("{0}")]
    Setup(String),
    /// The configuration is invalid.
    #[error("config: {0}")]
    Config(String),
    /// Attaching a vGPU to QEMU (or detaching it) failed.
    #[error("attach: {0}")]
    Attach(String),
    /// A module image another process handed over (see `image_store`) was
    /// refused.
    #[error("image: {0}")]
    Image(String),
    /// A sticky CUDA error left every GPU context of the worker unusable.
    #[error("a CUDA error ({0:?}) poisoned the worker's GPU contexts")]
    Poisoned(protocol::Status),
}
