//! The region as a whole and its channels: header, claim protocol, and the
//! guest's and host's end of each channel.
//!
//! Claim protocol (all words in the channel control block):
//! ```text
//!   FREE --guest CAS--> CLAIMING --guest writes owner--> CLAIMED
//!   CLAIMED --guest exits cleanly--> CLOSING
//!   CLAIMED --kernel module / host sees the owner gone--> ABANDONED
//!   CLAIMED --a new host (worker restarted) adopts the region--> LOST
//!   LOST --guest lets go--> CLOSING;  LOST --owner gone--> ABANDONED
//!   CLOSING | ABANDONED | any unknown value --host frees, resets rings, bumps generation--> FREE
//! ```
//! Only the guest moves a channel out of FREE, only the host moves it back.
//! A LOST channel stays reserved to its owner (whose GPU state died with the
//! old host) until the owner lets go, so no other guest can be handed rings
//! that the old owner may still write.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::layout::{ctl, hdr, Direction, Layout, LayoutParams, LAYOUT_VERSION, MAGIC};
use crate::ring::{ends, Consumer, Producer};
use crate::shm::{create_memfd, SharedMemory};

/// A channel's claim state as the host interprets the word the guest wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimState {
    /// Nobody holds it.
    Free,
    /// A guest is taking it.
    Claiming,
    /// A guest process holds it.
    Claimed,
    /// Its owner let go.
    Closing,
    /// Its owner went away without letting go.
    Abandoned,
    /// The host that served it is gone (its GPU state with it); the owner
    /// must let go and claim again.
    Lost,
    /// A value no honest guest writes; treated like `Abandoned`.
    Invalid(u32),
}

const FREE: u32 = 0;
const CLAIMING: u32 = 1;
const CLAIMED: u32 = 2;
const CLOSING: u32 = 3;
const ABANDONED: u32 = 4;
const LOST: u32 = 5;

impl ClaimState {
    fn from_word(w: u32) -> ClaimState {
        match w {
            FREE => ClaimState::Free,
            CLAIMING => ClaimState::Claiming,
            CLAIMED => ClaimState::Claimed,
            CLOSING => ClaimState::Closing,
            ABANDONED => ClaimState::Abandoned,
            LOST => ClaimState::Lost,
            v => ClaimState::Invalid(v),
        }
    }

    /// Whether the host should tear the channel down and free it.
    pub fn needs_reclaim(self) -> bool {
        matches!(
            self,
            ClaimState::Closing | ClaimState::Abandoned | ClaimState::Invalid(_)
        )
    }

    fn name(self) -> &'static str {
        match self {
            ClaimState::Free => "free",
            ClaimState::Claiming => "being claimed",
            ClaimState::Claimed => "claimed",
            ClaimState::Closing => "closing",
            ClaimState::Abandoned => "abandoned",
            ClaimState::Lost => "lost (its host restarted)",
            ClaimState::Invalid(_) => "invalid",
        }
    }
}

/// A mapped region with a validated layout.
#[derive(Debug, Clone)]
pub struct Region {
    mem: Arc<SharedMemory>,
    layout: Layout,
}

impl Region {
    /// Host: creates a sealed memfd of the layout's size, maps it and writes
    /// the header. Returns the region and the fd to hand to peers.
    pub fn create(name: &str, params: LayoutParams) -> Result<(Region, OwnedFd)> {
        let layout = Layout::new(params)?;
        let fd = create_memfd(name, layout.region_size)?;
        let dup = fd.try_clone().map_err(|e| Error::io("dup of memfd", e))?;
        let mem = Arc::new(SharedMemory::map(dup, layout.region_size)?);
        let region = Region { mem, layout };
        region.write_header()?;
        Ok((region, fd))
    }

    /// Host: takes over a region created earlier (by [`Region::create`], in
    /// this or another process) after the host that served it went away.
    /// The layout is ours, not what the header says (guests can write the
    /// header); the header is rewritten and the host epoch bumped. Channels
    /// claimed and served by the old host become LOST: their owners' GPU
    /// state died with it. The caller wakes their owners.
    pub fn adopt(fd: OwnedFd, params: LayoutParams) -> Result<Region> {
        let region = Self::map_existing(fd, params)?;
        region.take_over()?;
        Ok(region)
    }

    /// Host: maps a region created earlier without touching it, as a
    /// standby host does while another still serves it (it may register
    /// the memory with the device meanwhile). [`Region::take_over`] makes
    /// it the serving host's.
    pub fn map_existing(fd: OwnedFd, params: LayoutParams) -> Result<Region> {
        let layout = Layout::new(params)?;
        let size = std::fs::File::from(fd.try_clone().map_err(|e| Error::io("dup", e))?)
            .metadata()
            .map_err(|e| Error::io("fstat of shared memory", e))?
            .len();
        if size != layout.region_size as u64 {
            return Err(Error::BadHeader(format!(
                "region of {size} bytes, this layout needs {}",
                layout.region_size
            )));
        }
        let mem = Arc::new(SharedMemory::map(fd, layout.region_size)?);
        Ok(Region { mem, layout })
    }

    /// Host: becomes the region's serving host (see [`Region::adopt`]):
    /// rewrites the header, bumps the host epoch, and marks LOST the
    /// channels the previous host served.
    pub fn take_over(&self) -> Result<()> {
        self.write_header()?;
        for ch in 0..self.channels() {
            // A claim no host served yet (its guest came while no worker
            // ran) lost nothing: the new host serves it from the start.
            if self
                .ctl_word(ch, ctl::HOST_SERVING)?
                .load(Ordering::Acquire)
                == 0
            {
                continue;
            }
            let _ = self.ctl_word(ch, ctl::STATE)?.compare_exchange(
                CLAIMED,
                LOST,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        Ok(())
    }

    /// The pinned pool (empty if the layout has none).
    pub fn pinned(&self) -> Result<vm_memory::VolatileSlice<'_>> {
        Ok(self.mem.slice().subslice(
            self.layout.pinned_offset,
            self.layout.params.pinned_size as usize,
        )?)
    }

    /// Maps the pinned pool a second time, at `addr` if that address is
    /// free in this process (else where the kernel puts it).
    pub fn map_pinned_at(&self, addr: usize) -> Result<crate::shm::FixedMapping> {
        self.mem.map_part(
            self.layout.pinned_offset,
            self.layout.params.pinned_size as usize,
            addr,
        )
    }

    /// Replaces `len` bytes of this process's memory at `addr` with pinned
    /// pool memory from pool offset `off` (registering memory: the
    /// process's pages become pool pages the GPU reaches), copying the
    /// pages' bytes first to `copy_to`, the caller's mapping of that part of
    /// the pool, with nothing written to the caller's stack in between (see
    /// [`crate::shm::SharedMemory::copy_and_map_part_over`]).
    ///
    /// # Safety
    /// As that function: the range may be replaced, and is page-aligned.
    pub unsafe fn copy_and_map_pinned_over(
        &self,
        off: u64,
        len: usize,
        addr: usize,
        copy_to: usize,
    ) -> Result<()> {
        let size = self.layout.params.pinned_size;
        if off.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(Error::BadLayout(format!("pool part {off}+{len} of {size}")));
        }
        // SAFETY: per this function's contract.
        unsafe {
            self.mem.copy_and_map_part_over(
                self.layout.pinned_offset + off as usize,
                len,
                addr,
                copy_to,
            )
        }
    }

    /// The host epoch: bumped every time a host creates or adopts the region.
    pub fn host_epoch(&self) -> Result<u32> {
        Ok(self
            .mem
            .atomic_u32(hdr::HOST_EPOCH)?
            .load(Ordering::Acquire))
    }

    /// Host: a region on the heap (tests; nothing can be shared with another process).
    pub fn create_in_heap(params: LayoutParams) -> Result<Region> {
        let layout = Layout::new(params)?;
        let region = Region {
            mem: Arc::new(SharedMemory::heap(layout.region_size)),
            layout,
        };
        region.write_header()?;
        Ok(region)
    }

    fn write_header(&self) -> Result<()> {
        let m = &self.mem;
        let p = self.layout.params;
        m.atomic_u64(hdr::MAGIC)?.store(MAGIC, Ordering::Relaxed);
        m.atomic_u32(hdr::CHANNELS)?
            .store(p.channels, Ordering::Relaxed);
        m.atomic_u32(hdr::RING_ENTRIES)?
            .store(p.ring_entries, Ordering::Relaxed);
        m.atomic_u32(hdr::VECTORS)?
            .store(p.vectors, Ordering::Relaxed);
        m.atomic_u64(hdr::ARENA_SIZE)?
            .store(p.arena_size, Ordering::Relaxed);
        m.atomic_u64(hdr::CHANNEL_STRIDE)?
            .store(self.layout.channel_stride as u64, Ordering::Relaxed);
        m.atomic_u64(hdr::CHANNELS_OFFSET)?
            .store(self.layout.channels_offset as u64, Ordering::Relaxed);
        m.atomic_u64(hdr::REGION_SIZE)?
            .store(self.layout.region_size as u64, Ordering::Relaxed);
        m.atomic_u64(hdr::PINNED_SIZE)?
            .store(p.pinned_size, Ordering::Relaxed);
        m.atomic_u64(hdr::PINNED_OFFSET)?
            .store(self.layout.pinned_offset as u64, Ordering::Relaxed);
        let epoch = m.atomic_u32(hdr::HOST_EPOCH)?;
        epoch.store(
            epoch.load(Ordering::Relaxed).wrapping_add(1).max(1),
            Ordering::Relaxed,
        );
        // The version is written last: a reader that sees it sees the rest.
        m.atomic_u32(hdr::VERSION)?
            .store(LAYOUT_VERSION, Ordering::Release);
        Ok(())
    }

    /// Guest: maps a region received from the host and validates its header.
    pub fn open(fd: OwnedFd) -> Result<Region> {
        let size = std::fs::File::from(fd.try_clone().map_err(|e| Error::io("dup", e))?)
            .metadata()
            .map_err(|e| Error::io("fstat of shared memory", e))?
            .len();
        let probe = SharedMemory::map(fd.try_clone().map_err(|e| Error::io("dup", e))?, 4096)?;
        let layout = Self::read_header(&probe, size)?;
        drop(probe);
        let mem = Arc::new(SharedMemory::map(fd, layout.region_size)?);
        Ok(Region { mem, layout })
    }

    /// Guest in a VM: maps the region through the kernel module's device,
    /// whose BAR holds `size` bytes, and validates its header.
    pub fn open_device(fd: OwnedFd, size: u64) -> Result<Region> {
        let len = usize::try_from(size)
            .map_err(|_| Error::BadHeader(format!("region of {size} bytes")))?;
        if len < crate::layout::HEADER_SIZE {
            return Err(Error::BadHeader(format!("region of {size} bytes")));
        }
        let mem = SharedMemory::map_device(fd, len)?;
        let layout = Self::read_header(&mem, size)?;
        Ok(Region {
            mem: Arc::new(mem),
            layout,
        })
    }

    /// Validates a header: ours, this version, and sizes that agree with
    /// each other and with the real size of the memory.
    fn read_header(m: &SharedMemory, actual_size: u64) -> Result<Layout> {
        let bad = |s: String| Err(Error::BadHeader(s));
        let magic = m.atomic_u64(hdr::MAGIC)?.load(Ordering::Relaxed);
        if magic != MAGIC {
            return bad(format!("magic {magic:#x}, expected {MAGIC:#x}"));
        }
        let version = m.atomic_u32(hdr::VERSION)?.load(Ordering::Acquire);
        if version != LAYOUT_VERSION {
            return bad(format!(
                "layout version {version}, this build speaks {LAYOUT_VERSION}"
            ));
        }
        let params = LayoutParams {
            channels: m.atomic_u32(hdr::CHANNELS)?.load(Ordering::Relaxed),
            ring_entries: m.atomic_u32(hdr::RING_ENTRIES)?.load(Ordering::Relaxed),
            arena_size: m.atomic_u64(hdr::ARENA_SIZE)?.load(Ordering::Relaxed),
            vectors: m.atomic_u32(hdr::VECTORS)?.load(Ordering::Relaxed),
            pinned_size: m.atomic_u64(hdr::PINNED_SIZE)?.load(Ordering::Relaxed),
        };
        let layout = Layout::new(params).map_err(|e| Error::BadHeader(e.to_string()))?;
        let stride = m.atomic_u64(hdr::CHANNEL_STRIDE)?.load(Ordering::Relaxed);
        let size = m.atomic_u64(hdr::REGION_SIZE)?.load(Ordering::Relaxed);
        let pinned = m.atomic_u64(hdr::PINNED_OFFSET)?.load(Ordering::Relaxed);
        if stride != layout.channel_stride as u64
            || size != layout.region_size as u64
            || pinned != layout.pinned_offset as u64
        {
            return bad(format!(
                "stride {stride} / size {size} disagree with the parameters"
            ));
        }
        if size > actual_size {
            return bad(format!(
                "header claims {size} bytes, memory has {actual_size}"
            ));
        }
        Ok(layout)
    }

    /// Any u32 of the region, bounds- and alignment-checked: what a guest can
    /// write anywhere in its region, for tests that play a hostile guest.
    ///
    /// # Panics
    /// If `off` is out of range or misaligned.
    #[doc(hidden)]
    pub fn raw_u32_for_tests(&self, off: usize) -> &AtomicU32 {
        self.mem.atomic_u32(off).expect("offset inside the region")
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Number of channels.
    pub fn channels(&self) -> u32 {
        self.layout.params.channels
    }

    /// The word the host worker sets before blocking on its doorbell.
    pub fn host_sleeping(&self) -> Result<&AtomicU32> {
        self.mem.atomic_u32(hdr::HOST_SLEEPING)
    }

    fn ctl_word(&self, ch: u32, off: usize) -> Result<&AtomicU32> {
        if ch >= self.channels() {
            return Err(Error::NoSuchChannel(ch));
        }
        self.mem.atomic_u32(self.layout.channel_offset(ch) + off)
    }

    /// The claim state of channel `ch`.
    pub fn claim_state(&self, ch: u32) -> Result<ClaimState> {
        Ok(ClaimState::from_word(
            self.ctl_word(ch, ctl::STATE)?.load(Ordering::Acquire),
        ))
    }

    /// The owner peer id a guest wrote (unverified: informational and for
    /// reclaiming a disconnected native peer's channels).
    pub fn owner_peer(&self, ch: u32) -> Result<u32> {
        Ok(self.ctl_word(ch, ctl::OWNER_PEER)?.load(Ordering::Relaxed))
    }

    /// The process id a guest wrote when it claimed channel `ch`
    /// (unverified: its own numbering, for showing back to the same guest).
    pub fn owner_pid(&self, ch: u32) -> Result<u32> {
        Ok(self.ctl_word(ch, ctl::OWNER_PID)?.load(Ordering::Relaxed))
    }

    /// The doorbell vector the guest of channel `ch` waits on, reduced into range.
    pub fn guest_vector(&self, ch: u32) -> Result<u32> {
        Ok(self
            .ctl_word(ch, ctl::GUEST_VECTOR)?
            .load(Ordering::Relaxed)
            % self.layout.params.vectors)
    }

    /// The generation of channel `ch`.
    pub fn generation(&self, ch: u32) -> Result<u32> {
        Ok(self.ctl_word(ch, ctl::GENERATION)?.load(Ordering::Acquire))
    }

    /// The "consumer sleeps" word of one ring of channel `ch`.
    pub fn ring_sleeping(&self, ch: u32, dir: Direction) -> Result<&AtomicU32> {
        if ch >= self.channels() {
            return Err(Error::NoSuchChannel(ch));
        }
        let off = self.layout.channel_offset(ch) + self.layout.ring_parts(dir).ctl;
        self.mem
            .atomic_u32(off + crate::layout::ringctl::CONSUMER_SLEEPING)
    }

    /// The data arena of one direction of channel `ch` (for registering it
    /// with a DMA engine; all access still goes through volatile copies).
    pub fn arena(&self, ch: u32, dir: Direction) -> Result<vm_memory::VolatileSlice<'_>> {
        if ch >= self.channels() {
            return Err(Error::NoSuchChannel(ch));
        }
        let off = self.layout.channel_offset(ch) + self.layout.ring_parts(dir).arena;
        Ok(self
            .mem
            .slice()
            .subslice(off, self.layout.params.arena_size as usize)?)
    }

    /// Records the doorbell vector the owner of channel `ch` waits on (the
    /// guest writes it before it blocks; the host reads it when it rings).
    pub fn set_guest_vector(&self, ch: u32, vector: u32) -> Result<()> {
        self.ctl_word(ch, ctl::GUEST_VECTOR)?
            .store(vector, Ordering::Relaxed);
        Ok(())
    }

    /// Marks a channel abandoned (what the kernel module does when a guest
    /// process dies; the host does it for a native peer that disconnected).
    pub fn mark_abandoned(&self, ch: u32) -> Result<()> {
        let w = self.ctl_word(ch, ctl::STATE)?;
        let _ = w.compare_exchange(CLAIMED, ABANDONED, Ordering::AcqRel, Ordering::Relaxed);
        let _ = w.compare_exchange(CLAIMING, ABANDONED, Ordering::AcqRel, Ordering::Relaxed);
        let _ = w.compare_exchange(LOST, ABANDONED, Ordering::AcqRel, Ordering::Relaxed);
        Ok(())
    }

    fn ring_ends(&self, ch: u32, dir: Direction) -> (Producer, Consumer) {
        let p = self.layout.params;
        ends(
            self.mem.clone(),
            ch,
            self.layout.channel_offset(ch),
            self.layout.ring_parts(dir),
            p.ring_entries,
            p.arena_size,
        )
    }

    /// Guest: claims the first free channel for `peer` (its ivshmem peer id),
    /// process `pid`, waiting on doorbell vector `vector`.
    pub fn claim(&self, peer: u32, pid: u32, vector: u32) -> Result<GuestChannel> {
        for ch in 0..self.channels() {
            let state = self.ctl_word(ch, ctl::STATE)?;
            if state
                .compare_exchange(FREE, CLAIMING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.ctl_word(ch, ctl::OWNER_PEER)?
                    .store(peer, Ordering::Relaxed);
                self.ctl_word(ch, ctl::OWNER_PID)?
                    .store(pid, Ordering::Relaxed);
                self.ctl_word(ch, ctl::GUEST_VECTOR)?
                    .store(vector, Ordering::Relaxed);
                let generation = self.generation(ch)?;
                state.store(CLAIMED, Ordering::Release);
                let (req, _) = self.ring_ends(ch, Direction::ToHost);
                let (_, resp) = self.ring_ends(ch, Direction::ToGuest);
                return Ok(GuestChannel {
                    region: self.clone(),
                    index: ch,
                    generation,
                    claimed_in: std::process::id(),
                    req,
                    resp,
                });
            }
        }
        Err(Error::NoFreeChannel)
    }

    /// Host: the host's end of channel `ch`. The host keeps one per channel for
    /// the region's life and calls [`HostChannel::reclaim`] between owners.
    pub fn host_channel(&self, ch: u32) -> Result<HostChannel> {
        if ch >= self.channels() {
            return Err(Error::NoSuchChannel(ch));
        }
        let (_, req) = self.ring_ends(ch, Direction::ToHost);
        let (resp, _) = self.ring_ends(ch, Direction::ToGuest);
        Ok(HostChannel {
            region: self.clone(),
            index: ch,
            req,
            resp,
        })
    }
}

/// The guest's end of a claimed channel: it produces requests and consumes responses.
#[derive(Debug)]
pub struct GuestChannel {
    region: Region,
    index: u32,
    generation: u32,
    /// The process that claimed it: a forked child inherits this end but
    /// not the claim.
    claimed_in: u32,
    /// Requests to the host.
    pub req: Producer,
    /// Responses from the host.
    pub resp: Consumer,
}

impl GuestChannel {
    /// The channel number.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The region this channel lives in.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Records the doorbell vector this guest waits on.
    pub fn set_guest_vector(&self, vector: u32) -> Result<()> {
        self.region.set_guest_vector(self.index, vector)
    }

    /// The generation of the claim (the host bumps it on every reclaim).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Whether this process claimed the channel (false in a forked child
    /// that inherited this end).
    pub fn claimed_here(&self) -> bool {
        std::process::id() == self.claimed_in
    }

    /// Lets go of the channel now (CLAIMED or LOST -> CLOSING, only for our
    /// own claim); dropping does the same. In a forked child, which did not
    /// claim the channel (its parent did, and still uses it), this does
    /// nothing: a child that exits normally drops what it inherited.
    pub fn release(&self) {
        if !self.claimed_here() {
            return;
        }
        if let Ok(w) = self.region.ctl_word(self.index, ctl::STATE) {
            if self.region.generation(self.index).ok() == Some(self.generation) {
                for from in [CLAIMED, LOST] {
                    if w.compare_exchange(from, CLOSING, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
            }
        }
    }

    /// Fails if the host reclaimed the channel under us, or if the host that
    /// served it went away ([`Error::HostRestarted`]: claim a new channel).
    pub fn check_alive(&self) -> Result<()> {
        let state = self.region.claim_state(self.index)?;
        let generation = self.region.generation(self.index)?;
        if state == ClaimState::Lost && generation == self.generation {
            return Err(Error::HostRestarted {
                channel: self.index,
            });
        }
        if state != ClaimState::Claimed || generation != self.generation {
            return Err(Error::ChannelState {
                channel: self.index,
                state: state.name(),
            });
        }
        Ok(())
    }

    /// Lets go of the channel; the host frees everything it held.
    pub fn close(self) {
        drop(self)
    }
}

impl Drop for GuestChannel {
    fn drop(&mut self) {
        self.release();
    }
}

/// The host's end of a channel: it consumes requests and produces responses.
#[derive(Debug)]
pub struct HostChannel {
    region: Region,
    index: u32,
    /// Requests from the guest.
    pub req: Consumer,
    /// Responses to the guest.
    pub resp: Producer,
}

impl HostChannel {
    /// The channel number.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The claim state the guest left.
    pub fn state(&self) -> Result<ClaimState> {
        self.region.claim_state(self.index)
    }

    /// Records that this host now serves the channel's claim (it opened GPU
    /// state for it), so that a host adopting the region after this one
    /// marks it LOST.
    pub fn mark_serving(&self) -> Result<()> {
        let epoch = self.region.host_epoch()?.max(1);
        self.region
            .ctl_word(self.index, ctl::HOST_SERVING)?
            .store(epoch, Ordering::Release);
        Ok(())
    }

    /// Gives up a claimed channel whose GPU state this host lost (it is
    /// going away, or its GPU context is poisoned): CLAIMED -> LOST. The
    /// owner sees [`Error::HostRestarted`] and lets go; the rings are reset
    /// only then.
    pub fn mark_lost(&self) -> Result<bool> {
        let w = self.region.ctl_word(self.index, ctl::STATE)?;
        Ok(
            w.compare_exchange(CLAIMED, LOST, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok(),
        )
    }

    /// Resets the rings, bumps the generation and frees the channel. The
    /// caller has already released everything the owner held.
    pub fn reclaim(&mut self) -> Result<()> {
        let r = &self.region;
        let state = r.ctl_word(self.index, ctl::STATE)?;
        // Keep guests from claiming it while the rings are reset.
        state.store(ABANDONED, Ordering::Release);
        self.req.reset()?;
        self.resp.reset()?;
        for off in [
            ctl::OWNER_PEER,
            ctl::OWNER_PID,
            ctl::GUEST_VECTOR,
            ctl::HOST_SERVING,
        ] {
            r.ctl_word(self.index, off)?.store(0, Ordering::Relaxed);
        }
        let g = r.ctl_word(self.index, ctl::GENERATION)?;
        g.store(g.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        state.store(FREE, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::Descriptor;

    fn small() -> LayoutParams {
        LayoutParams {
            channels: 3,
            ring_entries: 8,
            arena_size: 8192,
            vectors: 2,
            pinned_size: 0,
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd_create is a system call Miri does not model")]
    fn adopted_region_loses_claimed_channels_until_their_owners_let_go() {
        let (old, fd) = Region::create("adopt-test", small()).unwrap();
        let epoch = old.host_epoch().unwrap();
        let g = old.claim(5, 100, 0).unwrap();
        old.host_channel(0).unwrap().mark_serving().unwrap();
        let idle = old.claim(5, 101, 0).unwrap();
        drop(idle); // CLOSING: the new host reclaims it as usual.
        let unserved = old.claim(5, 102, 0).unwrap();
        let new = Region::adopt(fd, small()).unwrap();
        assert_eq!(new.host_epoch().unwrap(), epoch + 1);
        assert_eq!(new.claim_state(0).unwrap(), ClaimState::Lost);
        // Claimed while no host served: nothing was lost.
        assert_eq!(new.claim_state(2).unwrap(), ClaimState::Claimed);
        assert!(unserved.check_alive().is_ok());
        drop(unserved);
        assert!(
            !ClaimState::Lost.needs_reclaim(),
            "reserved until the owner lets go"
        );
        assert!(matches!(
            g.check_alive(),
            Err(Error::HostRestarted { channel: 0 })
        ));
        // Nobody else is handed the lost channel.
        assert!(matches!(new.claim(6, 103, 0), Err(Error::NoFreeChannel)));
        drop(g);
        assert_eq!(new.claim_state(0).unwrap(), ClaimState::Closing);
        new.host_channel(0).unwrap().reclaim().unwrap();
        assert_eq!(new.claim_state(0).unwrap(), ClaimState::Free);
        // A wrong layout is refused.
        let (_r, fd2) = Region::create("adopt-test-2", small()).unwrap();
        let bigger = LayoutParams {
            channels: 4,
            ..small()
        };
        assert!(Region::adopt(fd2, bigger).is_err());
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd_create is a system call Miri does not model")]
    fn a_standby_host_maps_the_region_untouched_until_it_takes_over() {
        let (old, fd) = Region::create("standby-test", small()).unwrap();
        let epoch = old.host_epoch().unwrap();
        let g = old.claim(5, 100, 0).unwrap();
        old.host_channel(0).unwrap().mark_serving().unwrap();
        let standby = Region::map_existing(fd, small()).unwrap();
        // The old host still serves: nothing changed for it or its guest.
        assert_eq!(old.host_epoch().unwrap(), epoch);
        assert_eq!(standby.claim_state(0).unwrap(), ClaimState::Claimed);
        assert!(g.check_alive().is_ok());
        standby.take_over().unwrap();
        assert_eq!(old.host_epoch().unwrap(), epoch + 1);
        assert_eq!(standby.claim_state(0).unwrap(), ClaimState::Lost);
        assert!(matches!(
            g.check_alive(),
            Err(Error::HostRestarted { channel: 0 })
        ));
    }

    #[test]
    fn lost_channel_of_a_vanished_owner_is_abandoned() {
        let region = Region::create_in_heap(small()).unwrap();
        let g = region.claim(5, 100, 0).unwrap();
        assert!(region.host_channel(0).unwrap().mark_lost().unwrap());
        // The owner dies without letting go: the kernel module (or the
        // daemon, for a native peer) marks it.
        region.mark_abandoned(0).unwrap();
        assert!(region.claim_state(0).unwrap().needs_reclaim());
        drop(g); // a late release changes nothing
        assert_eq!(region.claim_state(0).unwrap(), ClaimState::Abandoned);
    }

    #[test]
    fn claim_serve_close_reclaim_cycle() {
        let region = Region::create_in_heap(small()).unwrap();
        let mut hosts: Vec<_> = (0..3).map(|i| region.host_channel(i).unwrap()).collect();
        let mut g = region.claim(5, 100, 1).unwrap();
        assert_eq!(g.index(), 0);
        assert_eq!(region.claim_state(0).unwrap(), ClaimState::Claimed);
        assert_eq!(region.owner_peer(0).unwrap(), 5);
        let g2 = region.claim(5, 101, 0).unwrap();
        assert_eq!(g2.index(), 1);

        assert!(g.req.try_send(&Descriptor::new(1, 9), b"hello").unwrap());
        let mut buf = Vec::new();
        let d = hosts[0].req.try_recv(&mut buf).unwrap().unwrap();
        assert_eq!((d.tag, &buf[..]), (1, &b"hello"[..]));
        assert!(hosts[0]
            .resp
            .try_send(&Descriptor::new(1, 9), b"world")
            .unwrap());
        assert_eq!(g.resp.try_recv(&mut buf).unwrap().unwrap().tag, 1);
        assert_eq!(buf, b"world");

        drop(g);
        assert_eq!(region.claim_state(0).unwrap(), ClaimState::Closing);
        assert!(hosts[0].state().unwrap().needs_reclaim());
        hosts[0].reclaim().unwrap();
        assert_eq!(region.claim_state(0).unwrap(), ClaimState::Free);

        // The next owner starts with clean rings.
        let mut g3 = region.claim(6, 102, 0).unwrap();
        assert_eq!(g3.index(), 0);
        assert!(g3.req.try_send(&Descriptor::new(77, 1), b"x").unwrap());
        assert_eq!(hosts[0].req.try_recv(&mut buf).unwrap().unwrap().tag, 77);
        assert!(hosts[0].req.try_recv(&mut buf).unwrap().is_none());
        let _g4 = region.claim(6, 103, 0).unwrap();
        assert!(matches!(region.claim(6, 104, 0), Err(Error::NoFreeChannel)));
    }

    /// The end a forked child inherited (here: one claimed "in another
    /// process") leaves the claim as it is when dropped or released.
    #[test]
    fn an_inherited_end_does_not_release_the_claim() {
        let region = Region::create_in_heap(small()).unwrap();
        let mut g = region.claim(5, 100, 0).unwrap();
        assert!(g.claimed_here());
        g.claimed_in = std::process::id().wrapping_add(1);
        assert!(!g.claimed_here());
        g.release();
        assert_eq!(region.claim_state(0).unwrap(), ClaimState::Claimed);
        drop(g);
        assert_eq!(region.claim_state(0).unwrap(), ClaimState::Claimed);
        // The claiming process's own end still lets go.
        let g2 = region.claim(5, 100, 0).unwrap();
        assert_eq!(g2.index(), 1);
        drop(g2);
        assert_eq!(region.claim_state(1).unwrap(), ClaimState::Closing);
    }

    #[test]
    fn abandoned_and_garbage_states_are_reclaimed_and_stale_owner_notices() {
        let region = Region::create_in_heap(small()).unwrap();
        let mut h = region.host_channel(0).unwrap();
        let g = region.claim(1, 1, 0).unwrap();
        region.mark_abandoned(0).unwrap();
        assert_eq!(h.state().unwrap(), ClaimState::Abandoned);
        h.reclaim().unwrap();
        assert!(
            g.check_alive().is_err(),
            "the old owner must see it lost the channel"
        );
        drop(g); // must not disturb the freed channel
        assert_eq!(region.claim_state(0).unwrap(), ClaimState::Free);

        region
            .ctl_word(0, ctl::STATE)
            .unwrap()
            .store(0xdead, Ordering::Relaxed);
        assert_eq!(h.state().unwrap(), ClaimState::Invalid(0xdead));
        assert!(h.state().unwrap().needs_reclaim());
        h.reclaim().unwrap();
        assert_eq!(region.claim_state(0).unwrap(), ClaimState::Free);
        assert!(matches!(
            region.host_channel(3),
            Err(Error::NoSuchChannel(3))
        ));
        assert!(matches!(
            region.claim_state(99),
            Err(Error::NoSuchChannel(99))
        ));
    }

    #[test]
    fn concurrent_claims_never_share_a_channel() {
        let region = Region::create_in_heap(LayoutParams {
            channels: 4,
            ..small()
        })
        .unwrap();
        let threads: Vec<_> = (0..6)
            .map(|i| {
                let r = region.clone();
                std::thread::spawn(move || r.claim(i, i, 0))
            })
            .collect();
        let held: Vec<GuestChannel> = threads
            .into_iter()
            .filter_map(|t| t.join().unwrap().ok())
            .collect();
        let mut got: Vec<u32> = held.iter().map(GuestChannel::index).collect();
        got.sort();
        assert_eq!(got, vec![0, 1, 2, 3]);
    }

    #[cfg(not(miri))]
    #[test]
    fn header_is_validated_on_open() {
        let (_r, fd) = Region::create("t", small()).unwrap();
        let g = Region::open(fd.try_clone().unwrap()).unwrap();
        assert_eq!(g.layout().params, small());
        let host = SharedMemory::map(fd.try_clone().unwrap(), 4096).unwrap();
        host.atomic_u32(hdr::RING_ENTRIES)
            .unwrap()
            .store(100, Ordering::Relaxed);
        assert!(matches!(
            Region::open(fd.try_clone().unwrap()),
            Err(Error::BadHeader(_))
        ));
        host.atomic_u32(hdr::RING_ENTRIES)
            .unwrap()
            .store(8, Ordering::Relaxed);
        host.atomic_u64(hdr::REGION_SIZE)
            .unwrap()
            .store(1 << 40, Ordering::Relaxed);
        assert!(matches!(
            Region::open(fd.try_clone().unwrap()),
            Err(Error::BadHeader(_))
        ));
        host.atomic_u64(hdr::MAGIC)
            .unwrap()
            .store(1, Ordering::Relaxed);
        assert!(matches!(Region::open(fd), Err(Error::BadHeader(_))));
    }
}
