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
//! - `link`: each VM's region and socket, the feed to its workers, and the
//!   watch over its process slots without a worker,
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
pub mod handover;
pub mod hostcpu;
pub mod image_store;
pub mod ipc_relay;
pub mod link;
pub mod mps;
pub mod run_lock;
pub mod save_file;
pub mod setup;
pub mod supervisor;

/// A libvirt domain's vGPU in its XML (kept in `wire`, with the
/// declaration it makes, for `fairvgpu-libvirt` and the fuzz targets).
pub use wire::libvirt_xml;

/// `d` in whole nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What can go wrong in the daemon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Taking vGPUs from other hosts could not start (the key).
    #[error("handover: {0}")]
    Handover(String),
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
    /// The daemon cannot take its run_dir (in use, or not writable).
    #[error(transparent)]
    RunLock(#[from] run_lock::RunLockError),
    /// The CLI cannot reach the control API's unix socket.
    #[error(
        "API socket {}: {source}; is `fairvgpu serve` running with this config (or pass --socket)?",
        path.display()
    )]
    ApiSocket {
        /// The socket.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// host.toml cannot be read or is invalid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The config has no VM of this name.
    #[error("config: no vm named {0:?}")]
    NoVm(String),
    /// A weight that is not a positive number.
    #[error("config: weight must be a positive number, not {0}")]
    BadWeight(f64),
    /// The control API's token file cannot be read.
    #[error("config: token file {}: {source}", path.display())]
    TokenFile {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The control API's token file holds no usable token.
    #[error(
        "config: token file {}: the token must be one word of at least 16 characters",
        path.display()
    )]
    BadToken {
        /// The file.
        path: std::path::PathBuf,
    },
    /// A GPU's grant service thread has ended.
    #[error("config: the grant service has stopped")]
    GrantStopped,
    /// A VM's feed thread has ended.
    #[error("config: the VM's feed thread has stopped")]
    FeedStopped,
    /// A migration was asked of a VM that no worker serves now.
    #[error("config: no worker serves this VM now")]
    NoWorker,
    /// A migration's target GPU does not fit the feed's 16 bits.
    #[error("config: GPU {0} is past the feed's 16 bits")]
    GpuPastFeed(u32),
    /// A GPU's MPS control daemon did not start.
    #[error(transparent)]
    Mps(#[from] mps::MpsError),
    /// Attaching a vGPU to QEMU (or detaching it) failed.
    #[error("attach: {0}")]
    Attach(#[from] attach::AttachError),
    /// A module image a worker handed over was refused.
    #[error("image: {0}")]
    Image(#[from] image_store::ImageRefused),
}
