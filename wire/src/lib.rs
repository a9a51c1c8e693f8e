//! What fairvgpu's processes say to each other.
//!
//! The daemon and a vGPU's worker are separate processes (the worker is
//! sandboxed); this crate is all they share: the feed that carries a VM's
//! region and doorbells to its worker (`feed`), the grant service's
//! messages (`grant`), the module image store's (`image`), a vGPU's
//! identity (`identity`), what keeps a vGPU on its GPU (`keeper`), a VM's
//! vCPU file (`vcpus`), and the termination signals both handle alike
//! (`signals`). And what a manager of VMs sends the daemon: a vGPU's
//! declaration (`declaration`), and the libvirt domain XML it is read from
//! (`libvirt_xml`).

#![warn(missing_docs)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

pub mod declaration;
pub mod feed;
pub mod grant;
pub mod identity;
pub mod image;
pub mod keeper;
pub mod libvirt_xml;
pub mod signals;
pub mod vcpus;

pub use keeper::Keeper;

/// What can go wrong in this crate's helpers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `run_dir/host-id` holds something other than a host id.
    #[error(
        "{} is not a host id (32 hex digits); remove it and a new one is made \
         (the VMs' vGPU UUIDs change with it)",
        path.display()
    )]
    BadHostId {
        /// The file.
        path: std::path::PathBuf,
    },
}
