//! Single-producer single-consumer descriptor rings with a data arena.
//!
//! Each side keeps its own index in private memory and only *publishes* it;
//! it never reads its own index back from the shared page, where the peer
//! could have changed it. The peer's index is read with acquire ordering and
//! validated before use: a value that cannot be right is an error for this
//! channel, never a panic and never an access outside the channel.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use vm_memory::VolatileSlice;

use crate::error::{Error, Result};
use crate::layout::{desc, ringctl, RingParts, DESC_SIZE, INLINE_SIZE};
use crate::shm::SharedMemory;
use crate::usize_from;

/// The message continues in the next descriptor (a chunk of a larger payload).
pub const FLAG_MORE: u32 = 1;
/// The sender expects no response (asynchronous call).
pub const FLAG_NO_REPLY: u32 = 2;

/// One message header, as copied out of (or into) the ring.
#[derive(Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Request tag; a response carries its request's tag.
    pub tag: u64,
    /// Message kind (defined by the protocol crate, opaque here).
    pub opcode: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// vCPU of the sender.
    pub vcpu: u32,
    /// Status of a response.
    pub status: u32,
    /// Fixed-size inline payload.
    pub inline: [u8; INLINE_SIZE],
    /// Arena offset of the data (set by the ring).
    pub data_off: u32,
    /// Length of the data (set by the ring).
    pub data_len: u32,
    data_end: u64,
}

impl std::fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Descriptor")
            .field("tag", &self.tag)
            .field("opcode", &self.opcode)
            .field("flags", &self.flags)
            .field("status", &self.status)
            .field("data_len", &self.data_len)
            .finish_non_exhaustive()
    }
}

impl Descriptor {
    /// A descriptor with the given tag and opcode and everything else zero.
    pub fn new(tag: u64, opcode: u32) -> Descriptor {
        Descriptor {
            tag,
            opcode,
            flags: 0,
            vcpu: 0,
            status: 0,
            inline: [0; INLINE_SIZE],
            data_off: 0,
            data_len: 0,
            data_end: 0,
        }
    }

    fn encode(&self) -> [u8; DESC_SIZE] {
        let mut b = [0u8; DESC_SIZE];
        b[desc::TAG..desc::TAG + 8].copy_from_slice(&self.tag.to_le_bytes());
        b[desc::DATA_END..desc::DATA_END + 8].copy_from_slice(&self.data_end.to_le_bytes());
        for (off, v) in [
            (desc::OPCODE, self.opcode),
            (desc::FLAGS, self.flags),
            (desc::DATA_OFF, self.data_off),
            (desc::DATA_LEN, self.data_len),
            (desc::VCPU, self.vcpu),
            (desc::STATUS, self.status),
        ] {
            b[off..off + 4].copy_from_slice(&v.to_le_bytes());
        }
        b[desc::INLINE..].copy_from_slice(&self.inline);
        b
    }

    fn decode(b: &[u8; DESC_SIZE]) -> Descriptor {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
        let mut inline = [0u8; INLINE_SIZE];
        inline.copy_from_slice(&b[desc::INLINE..]);
        Descriptor {
            tag: u64_at(desc::TAG),
            data_end: u64_at(desc::DATA_END),
            opcode: u32_at(desc::OPCODE),
            flags: u32_at(desc::FLAGS),
            data_off: u32_at(desc::DATA_OFF),
            data_len: u32_at(desc::DATA_LEN),
            vcpu: u32_at(desc::VCPU),
            status: u32_at(desc::STATUS),
            inline,
        }
    }
}

/// Shared state common to both ends of one ring.
#[derive(Debug, Clone)]
struct RingMem {
    mem: Arc<SharedMemory>,
    channel: u32,
    /// Absolute offsets.
    ctl: usize,
    descs: usize,
    arena: usize,
    entries: u32,
    arena_size: u64,
}

impl RingMem {
    fn new(
        mem: Arc<SharedMemory>,
        channel: u32,
        base: usize,
        parts: RingParts,
        entries: u32,
        arena_size: u64,
    ) -> Self {
        RingMem {
            mem,
            channel,
            ctl: base + parts.ctl,
            descs: base + parts.descs,
            arena: base + parts.arena,
            entries,
            arena_size,
        }
    }

    fn head(&self) -> Result<&AtomicU32> {
        self.mem.atomic_u32(self.ctl + ringctl::HEAD)
    }
    fn tail(&self) -> Result<&AtomicU32> {
        self.mem.atomic_u32(self.ctl + ringctl::TAIL)
    }
    fn released(&self) -> Result<&AtomicU64> {
        self.mem.atomic_u64(self.ctl + ringctl::RELEASED)
    }
    fn sleeping(&self) -> Result<&AtomicU32> {
        self.mem.atomic_u32(self.ctl + ringctl::CONSUMER_SLEEPING)
    }
    fn slot(&self, index: u32) -> Result<VolatileSlice<'_>> {
        let i = (index & (self.entries - 1)) as usize;
        Ok(self
            .mem
            .slice()
            .subslice(self.descs + i * DESC_SIZE, DESC_SIZE)?)
    }
    fn arena_slice(&self, off: u64, len: u64) -> Result<VolatileSlice<'_>> {
        Ok(self
            .mem
            .slice()
            .subslice(self.arena + usize_from(off), usize_from(len))?)
    }
    fn corrupt(&self, what: &'static str, value: u64) -> Error {
        Error::CorruptIndex {
            channel: self.channel,
            what,
            value,
        }
    }

    /// Zeroes the ring's control words (host only, while the channel is reset).
    fn reset(&self) -> Result<()> {
        self.head()?.store(0, Ordering::Relaxed);
        self.tail()?.store(0, Ordering::Relaxed);
        self.released()?.store(0, Ordering::Relaxed);
        self.sleeping()?.store(0, Ordering::Relaxed);
        Ok(())
    }
}

/// The producing end of a ring.
#[derive(Debug)]
pub struct Producer {
    ring: RingMem,
    head: u32,
    data_head: u64,
    /// Last consumer tail seen; re-read only when the ring looks full, so a
    /// busy producer does not pull the consumer's cache line on every send.
    cached_tail: u32,
    /// Last arena release seen, likewise.
    cached_released: u64,
}

/// The consuming end of a ring.
#[derive(Debug)]
pub struct Consumer {
    ring: RingMem,
    tail: u32,
    released: u64,
}

/// Creates both ends over the same memory (tests, and the two halves of a
/// channel on their respective sides).
pub(crate) fn ends(
    mem: Arc<SharedMemory>,
    channel: u32,
    base: usize,
    parts: RingParts,
    entries: u32,
    arena_size: u64,
) -> (Producer, Consumer) {
    let ring = RingMem::new(mem, channel, base, parts, entries, arena_size);
    (
        Producer {
            ring: ring.clone(),
            head: 0,
            data_head: 0,
            cached_tail: 0,
            cached_released: 0,
        },
        Consumer {
            ring,
            tail: 0,
            released: 0,
        },
    )
}

impl Producer {
    /// Largest payload one descriptor can carry.
    pub fn max_data(&self) -> usize {
        usize_from(self.ring.arena_size)
    }

    /// The flag the consumer sets before it blocks.
    pub fn consumer_sleeping(&self) -> Result<&AtomicU32> {
        self.ring.sleeping()
    }

    /// Number of messages published that the consumer has not taken yet
    /// (its tail re-read and validated). The host asks this of a reply
    /// ring: a guest that has not taken its reply has not run since.
    pub fn unread(&self) -> Result<u32> {
        let tail = self.ring.tail()?.load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > self.ring.entries {
            return Err(self.ring.corrupt("consumer tail", u64::from(tail)));
        }
        Ok(used)
    }

    /// Whether a slot is free, re-reading (and validating) the consumer's
    /// tail only when the cached one says the ring is full.
    fn has_slot(&mut self) -> Result<bool> {
        if self.head.wrapping_sub(self.cached_tail) < self.ring.entries {
            return Ok(true);
        }
        let used = self.unread()?;
        self.cached_tail = self.head.wrapping_sub(used);
        Ok(used < self.ring.entries)
    }

    /// Finds room for `len` bytes; returns (offset, new data head).
    fn alloc(&mut self, len: usize) -> Result<Option<(u64, u64)>> {
        let size = self.ring.arena_size;
        if len as u64 > size {
            return Err(Error::TooLarge {
                len,
                arena: usize_from(size),
            });
        }
        if len == 0 {
            return Ok(Some((0, self.data_head)));
        }
        let pos = self.data_head % size;
        let start = if pos + len as u64 <= size {
            self.data_head
        } else {
            self.data_head + (size - pos)
        };
        let end = start + len as u64;
        if end - self.cached_released > size {
            let released = self.ring.released()?.load(Ordering::Acquire);
            if released > self.data_head || self.data_head - released > size {
                return Err(self.ring.corrupt("arena released", released));
            }
            self.cached_released = released;
            if end - released > size {
                return Ok(None);
            }
        }
        Ok(Some((start % size, end)))
    }

    /// Publishes one message whose `len` data bytes are written by `fill`
    /// straight into the arena. Returns false (and does nothing) when the
    /// ring or the arena is full.
    /// `fill` may also adjust the descriptor (say, its status) before it is published.
    pub fn try_send_with(
        &mut self,
        d: &Descriptor,
        len: usize,
        fill: impl FnOnce(&mut Descriptor, VolatileSlice<'_>) -> Result<()>,
    ) -> Result<bool> {
        if !self.has_slot()? {
            return Ok(false);
        }
        let Some((off, end)) = self.alloc(len)? else {
            return Ok(false);
        };
        // Both below the arena size, which a layout bounds to 1 GiB; checked
        // all the same, as the descriptor carries them in 32 bits.
        let (Ok(data_off), Ok(data_len)) = (u32::try_from(off), u32::try_from(len)) else {
            return Err(Error::TooLarge {
                len,
                arena: usize_from(self.ring.arena_size),
            });
        };
        let mut out = d.clone();
        fill(&mut out, self.ring.arena_slice(off, len as u64)?)?;
        out.data_off = data_off;
        out.data_len = data_len;
        out.data_end = end;
        self.ring.slot(self.head)?.copy_from(&out.encode());
        self.head = self.head.wrapping_add(1);
        self.data_head = end;
        self.ring.head()?.store(self.head, Ordering::Release);
        Ok(true)
    }

    /// Publishes one message with `data` copied into the arena.
    pub fn try_send(&mut self, d: &Descriptor, data: &[u8]) -> Result<bool> {
        self.try_send_with(d, data.len(), |_, s| {
            s.copy_from(data);
            Ok(())
        })
    }

    /// Where this end stands: messages published, and its arena's head.
    pub fn position(&self) -> (u32, u64) {
        (self.head, self.data_head)
    }

    /// Goes on from `position` (another end's [`Producer::position`] over
    /// the same ring's bytes); the consumer's counters are read afresh.
    pub fn resume_at(&mut self, (head, data_head): (u32, u64)) {
        self.head = head;
        self.data_head = data_head;
        // Both make the next send read the consumer's counters.
        self.cached_tail = head.wrapping_sub(self.ring.entries);
        self.cached_released = data_head.saturating_sub(self.ring.arena_size);
    }

    /// Host only: forget all state after the channel was reset.
    pub(crate) fn reset(&mut self) -> Result<()> {
        self.head = 0;
        self.data_head = 0;
        self.cached_tail = 0;
        self.cached_released = 0;
        self.ring.reset()
    }
}

impl Consumer {
    /// The flag this consumer sets before it blocks.
    pub fn sleeping(&self) -> Result<&AtomicU32> {
        self.ring.sleeping()
    }

    /// Number of messages waiting (validated).
    pub fn pending(&self) -> Result<u32> {
        let head = self.ring.head()?.load(Ordering::Acquire);
        let avail = head.wrapping_sub(self.tail);
        if avail > self.ring.entries {
            return Err(self.ring.corrupt("producer head", u64::from(head)));
        }
        Ok(avail)
    }

    /// Copies out the next descriptor without consuming it, validated.
    pub fn peek(&self) -> Result<Option<Descriptor>> {
        if self.pending()? == 0 {
            return Ok(None);
        }
        let mut raw = [0u8; DESC_SIZE];
        self.ring.slot(self.tail)?.copy_to(&mut raw[..]);
        let d = Descriptor::decode(&raw);
        let (off, len) = (u64::from(d.data_off), u64::from(d.data_len));
        if len > 0 && off + len > self.ring.arena_size {
            return Err(Error::CorruptDescriptor {
                channel: self.ring.channel,
                offset: off,
                len,
                arena: self.ring.arena_size,
            });
        }
        Ok(Some(d))
    }

    /// The data of a descriptor returned by [`Consumer::peek`].
    pub fn data(&self, d: &Descriptor) -> Result<VolatileSlice<'_>> {
        self.ring
            .arena_slice(u64::from(d.data_off), u64::from(d.data_len))
    }

    /// Consumes the descriptor last peeked and releases its data.
    pub fn consume(&mut self, d: &Descriptor) -> Result<()> {
        self.tail = self.tail.wrapping_add(1);
        // The producer's own counter, written back; only the producer relies
        // on it, and it validates it against its private head.
        self.released = self.released.max(d.data_end);
        self.ring
            .released()?
            .store(self.released, Ordering::Release);
        self.ring.tail()?.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Peek, copy the data out and consume, in one step.
    pub fn try_recv(&mut self, buf: &mut Vec<u8>) -> Result<Option<Descriptor>> {
        let Some(d) = self.peek()? else {
            return Ok(None);
        };
        buf.clear();
        buf.resize(d.data_len as usize, 0);
        self.data(&d)?.copy_to(&mut buf[..]);
        self.consume(&d)?;
        Ok(Some(d))
    }

    /// Where this end stands: messages consumed, and the arena released.
    pub fn position(&self) -> (u32, u64) {
        (self.tail, self.released)
    }

    /// Goes on from `position` (another end's [`Consumer::position`] over
    /// the same ring's bytes).
    pub fn resume_at(&mut self, (tail, released): (u32, u64)) {
        self.tail = tail;
        self.released = released;
    }

    /// Host only: forget all state after the channel was reset.
    pub(crate) fn reset(&mut self) -> Result<()> {
        self.tail = 0;
        self.released = 0;
        self.ring.reset()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Direction, Layout, LayoutParams};

    fn ring(entries: u32, arena: u64) -> (Arc<SharedMemory>, Producer, Consumer, RingMem) {
        let l = Layout::new(LayoutParams {
            channels: 1,
            ring_entries: entries,
            arena_size: arena,
            vectors: 1,
            pinned_size: 0,
            partitions: 1,
        })
        .unwrap();
        let mem = Arc::new(SharedMemory::heap(l.channels_offset + l.channel_stride));
        let parts = l.ring_parts(Direction::ToHost);
        let (p, c) = ends(mem.clone(), 0, l.channel_offset(0), parts, entries, arena);
        let rm = RingMem::new(mem.clone(), 0, l.channel_offset(0), parts, entries, arena);
        (mem, p, c, rm)
    }

    #[test]
    fn messages_round_trip_in_order_with_wrap() {
        let (_m, mut p, mut c, _) = ring(4, 4096);
        let mut buf = Vec::new();
        for i in 0..50u8 {
            let mut d = Descriptor::new(u64::from(i), 7);
            d.inline[0] = i;
            let data = vec![i; (usize::from(i) * 97) % 1500];
            assert!(p.try_send(&d, &data).unwrap());
            let got = c.try_recv(&mut buf).unwrap().unwrap();
            assert_eq!(got.tag, u64::from(i));
            assert_eq!(got.inline[0], i);
            assert_eq!(buf, data);
        }
        assert!(c.try_recv(&mut buf).unwrap().is_none());
    }

    #[test]
    fn full_ring_and_full_arena_refuse_without_loss() {
        let (_m, mut p, mut c, _) = ring(4, 4096);
        for i in 0..4 {
            assert!(p.try_send(&Descriptor::new(i, 1), &[]).unwrap());
        }
        assert!(
            !p.try_send(&Descriptor::new(9, 1), &[]).unwrap(),
            "ring full"
        );
        let mut buf = Vec::new();
        for i in 0..4 {
            assert_eq!(c.try_recv(&mut buf).unwrap().unwrap().tag, i);
        }
        assert!(p.try_send(&Descriptor::new(10, 1), &[1; 3000]).unwrap());
        assert!(
            !p.try_send(&Descriptor::new(11, 1), &[2; 3000]).unwrap(),
            "arena full"
        );
        assert!(matches!(
            p.try_send(&Descriptor::new(12, 1), &[0; 5000]),
            Err(Error::TooLarge { .. })
        ));
        assert_eq!(c.try_recv(&mut buf).unwrap().unwrap().tag, 10);
        assert!(
            p.try_send(&Descriptor::new(11, 1), &[2; 3000]).unwrap(),
            "space after release"
        );
        assert_eq!(c.try_recv(&mut buf).unwrap().unwrap().tag, 11);
        assert_eq!(buf, vec![2; 3000]);
    }

    #[test]
    fn unread_counts_what_the_consumer_has_not_taken_and_checks_its_tail() {
        let (_m, mut p, mut c, rm) = ring(4, 4096);
        assert_eq!(p.unread().unwrap(), 0);
        for i in 0..3 {
            assert!(p.try_send(&Descriptor::new(i, 1), &[]).unwrap());
        }
        assert_eq!(p.unread().unwrap(), 3);
        let mut buf = Vec::new();
        c.try_recv(&mut buf).unwrap().unwrap();
        assert_eq!(p.unread().unwrap(), 2);
        c.try_recv(&mut buf).unwrap().unwrap();
        c.try_recv(&mut buf).unwrap().unwrap();
        assert_eq!(p.unread().unwrap(), 0);
        // A consumer tail ahead of the head (a hostile guest) is an error.
        rm.tail().unwrap().store(9, Ordering::Release);
        assert!(matches!(
            p.unread(),
            Err(Error::CorruptIndex {
                what: "consumer tail",
                ..
            })
        ));
    }

    #[test]
    fn hostile_head_is_an_error_not_a_panic() {
        let (_m, _p, c, rm) = ring(8, 4096);
        rm.head().unwrap().store(9, Ordering::Release);
        assert!(matches!(
            c.peek(),
            Err(Error::CorruptIndex {
                what: "producer head",
                ..
            })
        ));
        rm.head().unwrap().store(u32::MAX, Ordering::Release);
        assert!(matches!(c.pending(), Err(Error::CorruptIndex { .. })));
    }

    #[test]
    fn hostile_tail_and_released_are_errors() {
        // The producer reads the consumer's words only when its cached view
        // says it is out of room; fill the ring so that it has to.
        let (_m, mut p, _c, rm) = ring(8, 4096);
        for i in 0..8 {
            assert!(p.try_send(&Descriptor::new(i, 0), &[]).unwrap());
        }
        rm.tail().unwrap().store(100, Ordering::Release); // ahead of the head
        assert!(matches!(
            p.try_send(&Descriptor::new(0, 0), &[]),
            Err(Error::CorruptIndex { .. })
        ));

        let (_m, mut p, _c, rm) = ring(8, 4096);
        assert!(p.try_send(&Descriptor::new(0, 0), &[1; 4000]).unwrap());
        rm.released().unwrap().store(1 << 40, Ordering::Release); // beyond anything produced
        assert!(matches!(
            p.try_send(&Descriptor::new(1, 0), &[1; 200]),
            Err(Error::CorruptIndex { .. })
        ));
    }

    #[test]
    fn hostile_descriptor_out_of_arena_is_rejected() {
        let (_m, mut p, c, rm) = ring(8, 4096);
        assert!(p.try_send(&Descriptor::new(1, 1), &[5; 16]).unwrap());
        for (off, len) in [(4090u32, 16u32), (0, 4097), (u32::MAX, 1), (4096, 1)] {
            let slot = rm.slot(0).unwrap();
            slot.subslice(desc::DATA_OFF, 4)
                .unwrap()
                .copy_from(&off.to_le_bytes());
            slot.subslice(desc::DATA_LEN, 4)
                .unwrap()
                .copy_from(&len.to_le_bytes());
            assert!(
                matches!(c.peek(), Err(Error::CorruptDescriptor { .. })),
                "{off} {len}"
            );
        }
    }

    #[test]
    fn two_threads_stream_many_messages() {
        let (_m, mut p, mut c, _) = ring(16, 8192);
        let n: u64 = if cfg!(miri) { 200 } else { 20_000 };
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                let data = i.to_le_bytes().repeat((i % 7) as usize);
                if p.try_send(&Descriptor::new(i, 3), &data).unwrap() {
                    i += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        });
        let mut buf = Vec::new();
        let mut next = 0;
        while next < n {
            match c.try_recv(&mut buf).unwrap() {
                Some(d) => {
                    assert_eq!(d.tag, next);
                    assert_eq!(buf, next.to_le_bytes().repeat((next % 7) as usize));
                    next += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        t.join().unwrap();
    }
}
