//! The messages between the guest library and the host worker.
//!
//! A message is a descriptor's opcode plus its 88-byte inline payload, in a
//! fixed little-endian layout, plus optional bulk data in the arena (a PTX
//! image, kernel parameters, the bytes of a copy). [`Request::decode`] is the
//! only way the host turns guest bytes into a request: it checks the opcode,
//! every enum value, every length and every launch dimension, and refuses
//! anything else with a [`ProtoError`] — it never panics on any input.
//!
//! Here: the limits and the error type; `array.rs` (CUDA arrays, their
//! copies, texture parameters); `request/` (the requests: `table.rs`, one
//! row per request, from which the enum, the encoding, the checked
//! decoding and the flags are made), `reply.rs`, `values.rs` (what
//! requests carry), `op.rs` (opcodes), `codec.rs` (the little-endian reader
//! and writer).

#![warn(missing_docs)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

pub mod array;
mod codec;
pub mod fatbin;
pub mod graph;
pub mod op;
mod reply;
mod request;
pub mod status;
pub mod stream_attr;
pub mod tensor_map;
mod values;

pub use codec::{Reader, Writer};
pub use reply::{DeviceInfo, Reply, VgpuProcess, VgpuStatus, MAX_DRIVER_VERSION};
pub use request::{Family, Request};
pub use status::Status;
pub use values::{link_records, Dim3, ImageKind, Param};

/// Size of the inline payload (must equal the transport's `INLINE_SIZE`).
pub const INLINE: usize = 88;
/// Version of this message set, exchanged in `Hello`.
pub const PROTOCOL_VERSION: u32 = 4;
/// Largest single allocation or copy the host accepts (1 TiB).
pub const MAX_LEN: u64 = 1 << 40;
/// Largest module image or kernel name.
pub const MAX_IMAGE: u64 = 256 << 20;
/// Highest `CUfunction_attribute` forwarded (MAX_THREADS_PER_BLOCK ..
/// CLUSTER_SCHEDULING_POLICY_PREFERENCE).
pub const MAX_FUNC_ATTRIBUTE: u32 = 15;
/// A reply's flag (its descriptor's `flags`): the process has kernel
/// output waiting on the host; the guest takes it with
/// [`Request::TakeOutput`] and writes it to its own standard output and
/// error. (The transport's own flags are the low bits.)
pub const REPLY_OUTPUT: u32 = 1 << 16;
/// Kernel output the host holds for one process at most, whatever its
/// printf FIFO size: what a guest does not take is dropped, and counted.
pub const MAX_HELD_OUTPUT: usize = 16 << 20;
/// Highest `CUlimit` forwarded (STACK_SIZE .. PERSISTING_L2_CACHE_SIZE).
pub const MAX_LIMIT: u32 = 6;
/// Most blocks in a thread block cluster (Hopper's non-portable limit).
pub const MAX_CLUSTER_BLOCKS: u64 = 16;
/// Most processes a `VgpuStatus` lists from (one per channel of the
/// largest region).
pub const MAX_STATUS_PROCESSES: u32 = 1024;
/// `Launch` flags.
pub mod launch_flags {
    /// A cooperative launch: every block resident at once (grid-wide sync).
    pub const COOPERATIVE: u32 = 1;
}
/// Input types of `Link` records (`CUjitInputType`).
pub mod link_input {
    #![allow(missing_docs)]
    pub const CUBIN: u32 = 0;
    pub const PTX: u32 = 1;
    pub const FATBINARY: u32 = 2;
}

/// Size and address granularity of the virtual memory management requests
/// (`Vmm*`: the driver's minimum granularity for device memory, 2 MiB).
pub const VMM_GRANULARITY: u64 = 2 << 20;
/// `CU_MEM_ALLOCATION_COMP_GENERIC`: VMM memory made compressible
/// (`VmmCreate`'s `compression`); `CU_MEM_ALLOCATION_COMP_NONE` is 0, and
/// the driver defines no other.
pub const VMM_COMPRESSION_GENERIC: u8 = 1;

/// Largest kernel parameter buffer (CUDA's limit is 32,764 bytes).
pub const MAX_PARAMS: u64 = 32_764;

/// Why bytes from a guest are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The opcode is not one we know.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u32),
    /// A field has a value the protocol does not allow.
    #[error("field {field}: {why}")]
    BadField {
        /// Field name.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Reading past the inline payload.
    #[error("message truncated")]
    Truncated,
}

fn bad(field: &'static str, why: impl Into<String>) -> ProtoError {
    ProtoError::BadField {
        field,
        why: why.into(),
    }
}

/// Module images this large or larger are cached on the host and asked for
/// by hash first (`ModuleLoadCached`); smaller ones cost less to send than
/// to ask for.
pub const CACHED_IMAGE: u64 = 64 << 10;

/// The content hash a module image is cached by on the host (SHA-256).
pub fn image_hash(image: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(image).into()
}
