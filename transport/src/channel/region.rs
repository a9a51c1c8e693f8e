//! The region as a whole: creating or adopting it, mapping an existing one,
//! taking it over, validating its header, and each channel's rings.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::claim::{CLAIMED, LOST};
use crate::error::{Error, Result};
use crate::layout::{ctl, hdr, Direction, Layout, LayoutParams, LAYOUT_VERSION, MAGIC};
use crate::ring::{ends, Consumer, Producer};
use crate::shm::{create_memfd, SharedMemory};
use crate::usize_from;

/// A mapped region with a validated layout.
#[derive(Debug, Clone)]
pub struct Region {
    pub(super) mem: Arc<SharedMemory>,
    pub(super) layout: Layout,
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
    /// process slot's worker does while others serve their slots (it may
    /// register the memory with the device meanwhile).
    /// [`Region::take_over_channels`] then makes its slot's channels its
    /// own, [`Region::take_over`] the whole region.
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
        self.take_over_channels(0..self.channels())
    }

    /// [`Region::take_over`] for the channels `chans` alone: a process
    /// slot's worker (see [`LayoutParams::partitions`]) takes over its own
    /// slot, leaving the others' claims to their workers.
    pub fn take_over_channels(&self, chans: std::ops::Range<u32>) -> Result<()> {
        self.write_header()?;
        for ch in chans.start..chans.end.min(self.channels()) {
            // A claim no host served yet (its guest came while no worker
            // ran) lost nothing: the new host serves it from the start.
            if !self.host_served(ch)? {
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
            usize_from(self.layout.params.pinned_size),
        )?)
    }

    /// Maps the pinned pool a second time, at `addr` if that address is
    /// free in this process (else where the kernel puts it).
    pub fn map_pinned_at(&self, addr: usize) -> Result<crate::shm::FixedMapping> {
        self.mem.map_part(
            self.layout.pinned_offset,
            usize_from(self.layout.params.pinned_size),
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
                self.layout.pinned_offset + usize_from(off),
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
        m.atomic_u32(hdr::PARTITIONS)?
            .store(p.partitions, Ordering::Relaxed);
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
            partitions: m.atomic_u32(hdr::PARTITIONS)?.load(Ordering::Relaxed),
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

    /// Guest on the host itself, its calls held: copies all of this region
    /// into `to`, another host's region for the same VM (what QEMU's
    /// migration does for a VM's region). The layouts must agree.
    pub fn copy_to(&self, to: &Region) -> Result<()> {
        self.same_layout(to)?;
        self.mem.slice().copy_to_volatile_slice(to.mem.slice());
        Ok(())
    }

    /// Guest on the host itself: makes every mapping of this region's memory
    /// in the process `to`'s memory, at the same addresses (see
    /// [`SharedMemory::follow`]). Returns how many mappings moved.
    ///
    /// # Safety
    /// As [`SharedMemory::follow`]: no thread touches the region's memory
    /// meanwhile, and `to` holds what it should read.
    pub unsafe fn follow(&self, to: &Region) -> Result<usize> {
        self.same_layout(to)?;
        // SAFETY: per this function's contract.
        unsafe { self.mem.follow(&to.mem) }
    }

    /// Refuses another host's region of another layout.
    pub fn same_layout(&self, to: &Region) -> Result<()> {
        if self.layout != to.layout {
            return Err(Error::BadHeader(format!(
                "the other region has another layout ({:?}, this one {:?})",
                to.layout.params, self.layout.params
            )));
        }
        Ok(())
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

    /// The host-sleeping word a guest of channel `ch` reads before it
    /// rings the host: its process slot's.
    pub fn host_sleeping_for(&self, ch: u32) -> Result<&AtomicU32> {
        self.slot_sleeping(self.layout.partition_of(ch))
    }

    /// The host-sleeping word of process slot `k` (see
    /// [`LayoutParams::partitions`]): set by that slot's worker.
    pub fn slot_sleeping(&self, k: u32) -> Result<&AtomicU32> {
        if k >= self.layout.params.partitions {
            return Err(Error::NoSuchChannel(k));
        }
        self.mem
            .atomic_u32(hdr::HOST_SLEEPING + k as usize * crate::layout::LINE)
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
            .subslice(off, usize_from(self.layout.params.arena_size))?)
    }

    pub(super) fn ring_ends(&self, ch: u32, dir: Direction) -> (Producer, Consumer) {
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
}
