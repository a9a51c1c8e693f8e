//! A vGPU's checkpoint: what its worker holds for the guest, taken between
//! two requests, that another worker (on another host, or from a file)
//! serves on from. Each guest process is a [`SessionImage`]: the channels
//! it is bound to, where its request numbering stands, and its context's
//! [`ContextImage`]. The region itself (rings, arenas, claims) is not in
//! it: QEMU carries the region with the VM.
//!
//! `format.rs` writes and reads it as a stream (a file, a connection):
//! its description, then the bytes of module images, device memory and
//! graphs, then a digest that a reader checks before it trusts anything
//! (or, for a stream the daemon carries, none: the carrier's is checked).

use serde::{Deserialize, Serialize};

use crate::executor::ContextImage;

pub mod answer;
mod format;
mod in_place;
mod mapped;

pub use format::{
    describe, read, read_mapped, stream_tag, write, Check, FormatError, Limits, Tag, MAGIC, VERSION,
};
pub use in_place::write_in_place;
pub use mapped::{Blob, KeptMap, Mapped};

/// The device a checkpoint was taken on, as a restore compares it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFacts {
    /// The device's name (`cuDeviceGetName`).
    pub name: String,
    /// The host driver's release.
    pub driver: String,
    /// Compute capability (major, minor).
    pub cc: (u32, u32),
}

impl DeviceFacts {
    /// The facts of a device as an executor describes it.
    pub fn of(info: &protocol::DeviceInfo) -> DeviceFacts {
        DeviceFacts {
            name: info.name.clone(),
            driver: info.driver_version.clone(),
            cc: info.cc,
        }
    }
}

impl std::fmt::Display for DeviceFacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (compute capability {}.{}, driver {})",
            self.name, self.cc.0, self.cc.1, self.driver
        )
    }
}

/// A vGPU's checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VgpuImage {
    /// Where it was taken.
    pub device: DeviceFacts,
    /// Device memory the vGPU may allocate, bytes (its limit).
    pub mem_limit: u64,
    /// Its guest processes.
    pub sessions: Vec<SessionImage>,
}

/// One guest process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionImage {
    /// The process id its guest gave.
    pub pid: u32,
    /// The channels bound to it.
    pub channels: Vec<ChannelImage>,
    /// The number its next request carries.
    pub next_seq: u64,
    /// What a further thread's channel presents to join it.
    pub token: [u64; 2],
    /// The asynchronous error it is owed at its next synchronous call
    /// (`CUresult`), if any.
    pub pending_error: Option<u32>,
    /// Its context.
    pub context: ContextImage,
    /// Its blocks of the VM's pinned pool, `(offset, length)` in bytes;
    /// their bytes are in the region.
    #[serde(default)]
    pub pinned: Vec<(u64, u64)>,
}

/// A channel bound to a guest process: its number in the region, and where
/// the host's end stands in its rings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelImage {
    /// Its number.
    pub index: u32,
    /// The host end's position.
    pub position: transport::HostPosition,
}

impl VgpuImage {
    /// Device memory its contexts hold, bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.sessions.iter().map(|s| s.context.memory_bytes()).sum()
    }
}
