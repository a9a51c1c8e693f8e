//! The fairvgpu transport, knowing nothing of CUDA.
//!
//! A guest and the host share one region (QEMU's ivshmem BAR2, a sealed
//! memfd on the host). The region holds a header and a fixed number of
//! [channels](channel): each a request ring and a response ring of 128-byte
//! descriptors, with a data arena per direction. Both sides poll; a side
//! blocks on a [doorbell](wait) only after a bounded spin, and its peer rings
//! only when told that it sleeps. The [server] speaks the ivshmem-server
//! protocol so that QEMU's `ivshmem-doorbell` device attaches to the host.
//!
//! Everything the peer writes is validated before use; see [`ring`].

#![warn(missing_docs)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

// Offsets are computed in u64 and used as usize: the host is 64-bit only.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("fairvgpu supports 64-bit hosts and guests only");

/// `x` as a `usize`, for sizes and offsets kept in `u64`.
#[allow(clippy::cast_possible_truncation)] // lossless: usize is 64 bits (see above)
pub(crate) const fn usize_from(x: u64) -> usize {
    x as usize
}

pub mod channel;
pub mod error;
pub mod layout;
pub mod qmp;
pub mod ratelimit;
pub mod ring;
pub mod server;
pub mod shm;
pub mod wait;

pub use channel::{ClaimState, GuestChannel, HostChannel, HostPosition, Region};
pub use error::{Error, Result};
pub use layout::{Layout, LayoutParams, INLINE_SIZE};
pub use ratelimit::LogLimiter;
pub use ring::{Consumer, Descriptor, Producer, FLAG_MORE, FLAG_NO_REPLY};
pub use wait::{Bell, EventFdBell, PollingBell, SpinPolicy};
