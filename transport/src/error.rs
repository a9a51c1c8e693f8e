//! The transport's error type.

use std::io;

/// Everything that can go wrong in the transport. A hostile peer can cause the
/// `Corrupt*` variants; they end the affected channel, never the process.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The region header is not ours or not this layout version.
    #[error("region header invalid: {0}")]
    BadHeader(String),
    /// The requested layout does not fit or is not representable.
    #[error("invalid region layout: {0}")]
    BadLayout(String),
    /// The peer wrote a ring index that cannot be valid.
    #[error("channel {channel}: corrupt ring index ({what}: {value})")]
    CorruptIndex {
        /// Channel number.
        channel: u32,
        /// Which index.
        what: &'static str,
        /// The value read.
        value: u64,
    },
    /// The peer wrote a descriptor whose data reference is out of the arena.
    #[error("channel {channel}: descriptor data out of range (offset {offset}, length {len}, arena {arena})")]
    CorruptDescriptor {
        /// Channel number.
        channel: u32,
        /// Offset in the arena.
        offset: u64,
        /// Length.
        len: u64,
        /// Arena size.
        arena: u64,
    },
    /// A message is larger than the arena can ever hold at once.
    #[error("message of {len} bytes does not fit the arena of {arena} bytes")]
    TooLarge {
        /// Requested length.
        len: usize,
        /// Arena size.
        arena: usize,
    },
    /// A channel index beyond the region's channel count.
    #[error("no channel {0}")]
    NoSuchChannel(u32),
    /// Every channel is in use.
    #[error("no free channel in the region")]
    NoFreeChannel,
    /// The channel is not in the state the operation needs.
    #[error("channel {channel} is {state}")]
    ChannelState {
        /// Channel number.
        channel: u32,
        /// Its state, in words.
        state: &'static str,
    },
    /// The host serving the channel went away (its worker restarted) and
    /// the GPU state of the channel's owner with it: claim a new channel.
    #[error("channel {channel}: its host restarted; the GPU state it held is gone")]
    HostRestarted {
        /// Channel number.
        channel: u32,
    },
    /// Waiting ran past its deadline.
    #[error("timed out waiting for the peer")]
    Timeout,
    /// The peer went away.
    #[error("peer disconnected")]
    Disconnected,
    /// An ivshmem-server protocol violation.
    #[error("ivshmem protocol: {0}")]
    Protocol(String),
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Mapping the shared memory failed.
    #[error("mapping shared memory: {0}")]
    Mmap(#[from] vm_memory::mmap::MmapRegionError),
    /// A volatile access was out of range (a bug: every offset is validated first).
    #[error("shared memory access: {0}")]
    Volatile(#[from] vm_memory::VolatileMemoryError),
}

impl Error {
    pub(crate) fn io(what: &'static str, source: impl Into<io::Error>) -> Self {
        Error::Io {
            what,
            source: source.into(),
        }
    }
}

impl From<nix::Error> for Error {
    fn from(e: nix::Error) -> Self {
        Error::io("system call", io::Error::from(e))
    }
}

/// Result with the transport's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
