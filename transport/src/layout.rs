//! Where everything lives in the shared region.
//!
//! ```text
//! offset 0            header (one page): magic, version, sizes, host state
//! channels_offset     channel 0 .. channel N-1, `channel_stride` bytes each:
//!   +0                control block: claim state, owner, generation  (256 B)
//!   +256              request ring control: head | tail+released | consumer_sleeping
//!   +640              response ring control (same shape)
//!   +1024             request descriptors  (ring_entries * 128 B)
//!   ...               response descriptors (ring_entries * 128 B)
//!   page aligned      request arena  (arena_size bytes, guest -> host data)
//!   ...               response arena (arena_size bytes, host -> guest data)
//! pinned_offset       pinned pool (pinned_size bytes, 2 MiB aligned): page-locked
//!                     host memory the GPU reaches directly, handed out by the host
//! ```
//!
//! Every index is a free-running `u32` (ring slots) or `u64` (arena bytes),
//! each on its own 128-byte line so that producer and consumer never share
//! a cache line (128 rather than 64 to defeat the adjacent-line prefetcher).

use crate::error::{Error, Result};
use crate::usize_from;

/// "FVGPUSHM", little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"FVGPUSHM");
/// Bumped on every incompatible change of this file or of the peer ids
/// (`server.rs`: guests rang the host at peer 0 up to version 3).
pub const LAYOUT_VERSION: u32 = 4;
/// Alignment (and size unit) of the pinned pool: a huge page.
pub const PINNED_ALIGN: u64 = 2 << 20;
/// Size of the header page.
pub const HEADER_SIZE: usize = 4096;
/// Size of one descriptor.
pub const DESC_SIZE: usize = 128;
/// Size of the inline payload of a descriptor.
pub const INLINE_SIZE: usize = DESC_SIZE - 40;
/// Cache line size used for padding (two lines: adjacent-line prefetch).
pub const LINE: usize = 128;

/// Header field offsets.
pub mod hdr {
    /// u64 magic.
    pub const MAGIC: usize = 0;
    /// u32 layout version.
    pub const VERSION: usize = 8;
    /// u32 number of channels.
    pub const CHANNELS: usize = 12;
    /// u32 descriptors per ring.
    pub const RING_ENTRIES: usize = 16;
    /// u32 doorbell vectors per peer.
    pub const VECTORS: usize = 20;
    /// u64 arena bytes per direction.
    pub const ARENA_SIZE: usize = 24;
    /// u64 bytes per channel.
    pub const CHANNEL_STRIDE: usize = 32;
    /// u64 offset of channel 0.
    pub const CHANNELS_OFFSET: usize = 40;
    /// u64 total region size.
    pub const REGION_SIZE: usize = 48;
    /// u64 bytes of the pinned pool.
    pub const PINNED_SIZE: usize = 56;
    /// u64 offset of the pinned pool.
    pub const PINNED_OFFSET: usize = 64;
    /// u32 process slots the channels are split into (see
    /// [`super::LayoutParams::partitions`]).
    pub const PARTITIONS: usize = 72;
    /// u32 host epoch, bumped by every host start; 0 while no host serves.
    pub const HOST_EPOCH: usize = 128;
    /// u32 set by the host worker before it blocks on its doorbell: one
    /// per process slot, [`super::LINE`] apart (the first is the only one
    /// where the channels are not split).
    pub const HOST_SLEEPING: usize = 256;
}

/// Channel control block offsets (relative to the channel start).
pub mod ctl {
    /// u32 claim state, see [`crate::channel::ClaimState`].
    pub const STATE: usize = 0;
    /// u32 ivshmem peer id of the owner.
    pub const OWNER_PEER: usize = 4;
    /// u32 generation, bumped by the host on every reclaim.
    pub const GENERATION: usize = 8;
    /// u32 process id of the owner inside its VM (informational).
    pub const OWNER_PID: usize = 12;
    /// u32 doorbell vector the guest waits on.
    pub const GUEST_VECTOR: usize = 16;
    /// u32 host epoch under which a host began serving the current claim
    /// (0: not served yet). Written by the host; a host that adopts the
    /// region marks only served claims LOST.
    pub const HOST_SERVING: usize = 20;
    /// Size of the control block.
    pub const SIZE: usize = 256;
}

/// Ring control offsets (relative to the ring control start).
pub mod ringctl {
    /// u32 producer index (slots ever published).
    pub const HEAD: usize = 0;
    /// u32 consumer index (slots ever consumed).
    pub const TAIL: usize = super::LINE;
    /// u64 arena bytes the consumer released (free-running).
    pub const RELEASED: usize = super::LINE + 8;
    /// u32 set while the consumer is blocked on its doorbell.
    pub const CONSUMER_SLEEPING: usize = 2 * super::LINE;
    /// Size of a ring control block.
    pub const SIZE: usize = 3 * super::LINE;
}

/// Descriptor field offsets.
pub mod desc {
    /// u64 request tag, echoed in the response.
    pub const TAG: usize = 0;
    /// u64 producer's arena counter after this message's data.
    pub const DATA_END: usize = 8;
    /// u32 message opcode.
    pub const OPCODE: usize = 16;
    /// u32 flags.
    pub const FLAGS: usize = 20;
    /// u32 data offset in the arena.
    pub const DATA_OFF: usize = 24;
    /// u32 data length.
    pub const DATA_LEN: usize = 28;
    /// u32 vCPU the sender runs on (guest) / unused (host).
    pub const VCPU: usize = 32;
    /// u32 status (responses).
    pub const STATUS: usize = 36;
    /// Inline payload.
    pub const INLINE: usize = 40;
}

/// The sizes that define a region. Both sides compute every offset from
/// these, and the consumer of a header validates them before use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutParams {
    /// Number of channels (guest processes served at once).
    pub channels: u32,
    /// Descriptors per ring; a power of two.
    pub ring_entries: u32,
    /// Bytes of arena per direction and channel; a multiple of 4096.
    pub arena_size: u64,
    /// Doorbell vectors per peer (the `vectors=` of QEMU's device).
    pub vectors: u32,
    /// Bytes of pinned pool (page-locked host memory the GPU reaches
    /// directly: the guests' `cuMemHostAlloc`, registered and managed
    /// memory); a multiple of 2 MiB, 0 for none.
    #[serde(default = "default_pinned")]
    pub pinned_size: u64,
    /// Process slots: the channels split into this many equal runs, each
    /// served by a worker process of its own, a guest process's channels
    /// all in one run (its first channel, the run's first, held for the
    /// process's life); the guest rings the slot's own host doorbell
    /// vector and reads its own host-sleeping word. 1: one worker serves
    /// every channel. See docs/design.md, "Isolation between a VM's
    /// processes".
    #[serde(default = "one")]
    pub partitions: u32,
}

fn one() -> u32 {
    1
}

fn default_pinned() -> u64 {
    LayoutParams::default().pinned_size
}

impl Default for LayoutParams {
    fn default() -> Self {
        LayoutParams {
            channels: 8,
            ring_entries: 256,
            arena_size: 4 << 20,
            vectors: 4,
            pinned_size: 256 << 20,
            partitions: 1,
        }
    }
}

/// A validated layout with every derived offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The parameters.
    pub params: LayoutParams,
    /// Bytes per channel.
    pub channel_stride: usize,
    /// Offset of channel 0.
    pub channels_offset: usize,
    /// Offset of the pinned pool.
    pub pinned_offset: usize,
    /// Region size (a power of two, as a PCI BAR must be).
    pub region_size: usize,
}

/// Upper bounds that keep every computation far from overflow.
const MAX_CHANNELS: u32 = 1024;
const MAX_RING_ENTRIES: u32 = 1 << 16;
const MAX_ARENA: u64 = 1 << 30;
const MAX_VECTORS: u32 = 64;
const MAX_PINNED: u64 = 64 << 30;
/// Process slots at most: their host-sleeping words fit the header page.
pub const MAX_PARTITIONS: u32 = 16;

impl Layout {
    /// Computes and validates a layout.
    pub fn new(params: LayoutParams) -> Result<Layout> {
        let bad = |m: String| Err(Error::BadLayout(m));
        if params.channels == 0 || params.channels > MAX_CHANNELS {
            return bad(format!(
                "channels must be 1..={MAX_CHANNELS}, not {}",
                params.channels
            ));
        }
        if !params.ring_entries.is_power_of_two()
            || params.ring_entries < 2
            || params.ring_entries > MAX_RING_ENTRIES
        {
            return bad(format!(
                "ring_entries must be a power of two in 2..={MAX_RING_ENTRIES}, not {}",
                params.ring_entries
            ));
        }
        if params.arena_size == 0
            || !params.arena_size.is_multiple_of(4096)
            || params.arena_size > MAX_ARENA
        {
            return bad(format!(
                "arena_size must be a non-zero multiple of 4096 up to {MAX_ARENA}, not {}",
                params.arena_size
            ));
        }
        if params.vectors == 0 || params.vectors > MAX_VECTORS {
            return bad(format!(
                "vectors must be 1..={MAX_VECTORS}, not {}",
                params.vectors
            ));
        }
        if params.partitions == 0
            || params.partitions > MAX_PARTITIONS
            || !params.channels.is_multiple_of(params.partitions)
            || (params.partitions > 1 && params.vectors < params.partitions)
        {
            return bad(format!(
                "partitions must be 1..={MAX_PARTITIONS}, divide the {} channels and be at most the {} vectors, not {}",
                params.channels, params.vectors, params.partitions
            ));
        }
        if !params.pinned_size.is_multiple_of(PINNED_ALIGN) || params.pinned_size > MAX_PINNED {
            return bad(format!(
                "pinned_size must be a multiple of {PINNED_ALIGN} up to {MAX_PINNED}, not {}",
                params.pinned_size
            ));
        }
        // Bounded above, so plain arithmetic cannot overflow on 64-bit.
        let rings = 2 * params.ring_entries as usize * DESC_SIZE;
        let before_arena = align_up(ctl::SIZE + 2 * ringctl::SIZE + rings, 4096);
        let channel_stride = before_arena + 2 * usize_from(params.arena_size);
        let channels_offset = HEADER_SIZE;
        let channels_end = channels_offset + params.channels as usize * channel_stride;
        let pinned_offset = if params.pinned_size > 0 {
            align_up(channels_end, usize_from(PINNED_ALIGN))
        } else {
            channels_end
        };
        let needed = pinned_offset + usize_from(params.pinned_size);
        let region_size = needed.next_power_of_two();
        Ok(Layout {
            params,
            channel_stride,
            channels_offset,
            pinned_offset,
            region_size,
        })
    }

    /// Channels per process slot.
    pub fn slot_channels(&self) -> u32 {
        self.params.channels / self.params.partitions
    }

    /// The process slot of channel `ch`.
    pub fn partition_of(&self, ch: u32) -> u32 {
        ch / self.slot_channels()
    }

    /// The channels of process slot `k`.
    pub fn partition_channels(&self, k: u32) -> std::ops::Range<u32> {
        let n = self.slot_channels();
        let start = k.min(self.params.partitions) * n;
        start..start + n
    }

    /// The host doorbell vector a guest rings for channel `ch`: its slot's
    /// where the channels are split (each slot's worker waits on its own),
    /// else spread over the vectors.
    pub fn host_vector(&self, ch: u32) -> u32 {
        if self.params.partitions > 1 {
            self.partition_of(ch)
        } else {
            ch % self.params.vectors
        }
    }

    /// Offset of channel `i`'s start.
    pub fn channel_offset(&self, i: u32) -> usize {
        self.channels_offset + i as usize * self.channel_stride
    }

    /// Offsets inside a channel of (ring control, descriptors, arena) for one direction.
    pub fn ring_parts(&self, dir: Direction) -> RingParts {
        let entries = self.params.ring_entries as usize;
        let descs0 = ctl::SIZE + 2 * ringctl::SIZE;
        let arena0 = align_up(descs0 + 2 * entries * DESC_SIZE, 4096);
        let k = match dir {
            Direction::ToHost => 0,
            Direction::ToGuest => 1,
        };
        RingParts {
            ctl: ctl::SIZE + k * ringctl::SIZE,
            descs: descs0 + k * entries * DESC_SIZE,
            arena: arena0 + k * usize_from(self.params.arena_size),
        }
    }
}

/// Which way a ring carries messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Requests: the guest produces, the host consumes.
    ToHost,
    /// Responses: the host produces, the guest consumes.
    ToGuest,
}

/// Offsets of one ring's parts, relative to the channel start.
#[derive(Debug, Clone, Copy)]
pub struct RingParts {
    /// Ring control block.
    pub ctl: usize,
    /// Descriptor array.
    pub descs: usize,
    /// Data arena.
    pub arena: usize,
}

/// Rounds `v` up to a multiple of `a` (a power of two).
pub fn align_up(v: usize, a: usize) -> usize {
    (v + a - 1) & !(a - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_is_power_of_two_and_parts_do_not_overlap() {
        let l = Layout::new(LayoutParams::default()).unwrap();
        assert!(l.region_size.is_power_of_two());
        let up = l.ring_parts(Direction::ToHost);
        let down = l.ring_parts(Direction::ToGuest);
        assert!(up.ctl + ringctl::SIZE <= down.ctl);
        assert!(down.ctl + ringctl::SIZE <= up.descs);
        assert_eq!(up.descs + 256 * DESC_SIZE, down.descs);
        assert!(down.descs + 256 * DESC_SIZE <= up.arena);
        assert_eq!(up.arena % 4096, 0);
        assert_eq!(down.arena + (4 << 20), l.channel_stride);
        assert!(l.channel_offset(7) + l.channel_stride <= l.pinned_offset);
        assert_eq!(l.pinned_offset % (2 << 20), 0);
        assert!(l.pinned_offset + (256 << 20) <= l.region_size);
    }

    #[test]
    fn rejects_bad_params() {
        let base = LayoutParams::default();
        for p in [
            LayoutParams {
                channels: 0,
                ..base
            },
            LayoutParams {
                channels: 5000,
                ..base
            },
            LayoutParams {
                ring_entries: 100,
                ..base
            },
            LayoutParams {
                ring_entries: 1,
                ..base
            },
            LayoutParams {
                arena_size: 1000,
                ..base
            },
            LayoutParams {
                arena_size: 0,
                ..base
            },
            LayoutParams { vectors: 0, ..base },
            LayoutParams {
                pinned_size: 4096,
                ..base
            },
            LayoutParams {
                pinned_size: 1 << 40,
                ..base
            },
        ] {
            assert!(Layout::new(p).is_err(), "{p:?} accepted");
        }
    }
}
