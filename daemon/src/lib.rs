//! The fairvgpu daemon (`fairvgpu serve`): it owns each VM's region and
//! ivshmem-server socket, supervises one worker process per vGPU, runs a
//! grant service per GPU, places and migrates vGPUs, and serves the
//! control API and dashboard.
//!
//! - `setup`: what the config makes of each GPU and worker (executor,
//!   slice, sockets, a worker's `Spec`),
//! - `supervisor`: the serving loop: workers started, restarted, migrated;
//!   reloads,
//! - `config`: host.toml, validated,
//! - `link`: each VM's region and socket, and the feed to its worker,
//! - `grant/`: a GPU's grant service (the fair queue behind a socket) and
//!   co-running,
//! - `control/`: the API, dashboard, metrics, status, placement,
//! - `hostcpu/`: the host CPU options (priorities, vCPU lift, CPU sets,
//!   cgroups),
//! - `attach`, `mps`, `image_store`, `run_lock`: QEMU hot-plug, MPS
//!   servers, the shared module image store, the run_dir lock.

#![warn(missing_docs)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

pub mod attach;
pub mod config;
pub mod control;
pub mod grant;
pub mod hostcpu;
pub mod image_store;
pub mod link;
pub mod mps;
pub mod run_lock;
pub mod setup;
pub mod supervisor;

/// `d` in whole nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What can go wrong in the daemon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The transport failed.
    #[error(transparent)]
    Transport(#[from] transport::Error),
    /// A worker (or the executor it would run) failed.
    #[error(transparent)]
    Worker(#[from] worker::Error),
    /// A file the daemon keeps could not be used.
    #[error(transparent)]
    Wire(#[from] wire::Error),
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
    /// A module image a worker handed over was refused.
    #[error("image: {0}")]
    Image(String),
}
