//! The export table of a VM whose processes each have a worker of their
//! own (process slots): what one worker exported (IPC memory and event
//! handles) for another to open, in a memfd the daemon makes per VM and
//! feeds to each of its workers (the feed's `IPC_TABLE`; the guest never
//! sees it). See `session/ipc.rs` for how the requests use it.
//!
//! An entry holds the guest's token (random, never the driver's handle),
//! the export's kind, size and owner slot, the driver's handle bytes in
//! the exporter's worker (`cuIpcGetMemHandle`'s, `cuIpcGetEventHandle`'s)
//! and whether an opener needs an fd the daemon keeps (a memfd of the
//! sim's, a POSIX-fd shareable handle). Its state word is changed by
//! compare-and-swap alone: a generation (bumped at every reuse), a state
//! (free, being written, live, held) and a bit per slot whose worker has
//! it open. Another worker wrote every entry: what is read is checked
//! (sizes, kinds, slots, generation unchanged across the read).
//!
//! - A live entry is opened by token; a held one (its exporter freed it
//!   or ended while others have it open) is not, and becomes free when
//!   its last opener closes it.
//! - The daemon revokes the entries of a worker whose feed ends and clears
//!   its open bits ([`VmExports::lane_ended`]).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use transport::shm::SharedMemory;

use crate::Error;

/// Entries of a table.
pub const ENTRIES: usize = 512;

/// Bytes of an entry (16 words).
const ENTRY: usize = 128;

/// Bytes of a table.
pub const EXPORTS_SIZE: usize = ENTRIES * ENTRY;

/// The largest export an entry may name (what a GPU's memory could hold).
pub const MAX_SIZE: u64 = 1 << 44;

const FREE: u64 = 0;
const WRITING: u64 = 1;
const LIVE: u64 = 2;
const HELD: u64 = 3;

/// Open bits: one per process slot.
const MASK: u64 = 0xffff;

/// Entry `i`'s index as the feed names it (every index of the table fits).
fn idx(i: usize) -> u16 {
    u16::try_from(i).unwrap_or(u16::MAX)
}

fn state_of(w: u64) -> u64 {
    (w >> 16) & 0xff
}

fn gen_of(w: u64) -> u32 {
    ((w >> 24) & 0xff_ffff) as u32
}

fn word(gen: u32, state: u64, mask: u64) -> u64 {
    (u64::from(gen & 0xff_ffff) << 24) | (state << 16) | (mask & MASK)
}

/// What an entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Device memory (`cuIpcGetMemHandle`, a pool's pointer).
    Mem = 1,
    /// An event (`cuIpcGetEventHandle`).
    Event = 2,
    /// Physical VMM memory (`cuMemExportToShareableHandle`).
    Phys = 3,
    /// A memory pool (`cuMemPoolExportToShareableHandle`): its token alone.
    Pool = 4,
}

impl Kind {
    fn from_code(c: u64) -> Option<Kind> {
        match c {
            1 => Some(Kind::Mem),
            2 => Some(Kind::Event),
            3 => Some(Kind::Phys),
            4 => Some(Kind::Pool),
            _ => None,
        }
    }
}

/// One entry as read (and checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its index in the table.
    pub index: u16,
    /// Its generation (24 bits).
    pub gen: u32,
    /// What it names.
    pub kind: Kind,
    /// The exporter's process slot.
    pub owner: u32,
    /// Bytes (0 for an event).
    pub size: u64,
    /// The token of the pool it was exported from (0: none).
    pub tag: u64,
    /// The driver's handle bytes in the exporter's worker.
    pub handle: [u8; 64],
    /// Whether an opener needs the fd the daemon keeps for it.
    pub has_fd: bool,
}

/// What an exporter publishes.
#[derive(Debug, Clone)]
pub struct Publish {
    /// The guest's token (never 0).
    pub token: u64,
    /// What it names.
    pub kind: Kind,
    /// The exporter's process slot.
    pub owner: u32,
    /// Bytes.
    pub size: u64,
    /// The driver's handle bytes.
    pub handle: [u8; 64],
    /// Whether an opener needs an fd.
    pub has_fd: bool,
}

/// A VM's export table, mapped.
#[derive(Debug)]
pub struct VmExports {
    page: SharedMemory,
}

impl VmExports {
    /// A new table's memfd, empty (the daemon makes one per VM).
    pub fn create(name: &str) -> Result<OwnedFd, Error> {
        Ok(transport::shm::create_memfd(name, EXPORTS_SIZE)?)
    }

    /// The table in memfd `fd` ([`EXPORTS_SIZE`] bytes).
    pub fn shared(fd: OwnedFd) -> Result<VmExports, Error> {
        let page = SharedMemory::map(fd, EXPORTS_SIZE)?;
        page.atomic_u64(EXPORTS_SIZE - 8)?;
        Ok(VmExports { page })
    }

    /// Word `w` of entry `i` (mapped and checked at [`VmExports::shared`]:
    /// every word of the table is in bounds and aligned).
    fn at(&self, i: usize, w: usize) -> &AtomicU64 {
        static NONE: AtomicU64 = AtomicU64::new(0);
        self.page.atomic_u64(i * ENTRY + w * 8).unwrap_or(&NONE)
    }

    fn state(&self, i: usize) -> &AtomicU64 {
        self.at(i, 0)
    }

    /// Changes entry `i`'s state word by `f` (None: leave it), atomically;
    /// the word it changed from, if it did.
    fn update(&self, i: usize, f: impl FnMut(u64) -> Option<u64>) -> Option<u64> {
        self.state(i)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, f)
            .ok()
    }

    /// Publishes an export in a free entry: its index and generation, or
    /// None if the table is full or the token is taken.
    pub fn publish(&self, p: &Publish) -> Option<(u16, u32)> {
        if p.token == 0 || p.size > MAX_SIZE || self.find(p.token).is_some() {
            return None;
        }
        for i in 0..ENTRIES {
            let Some(old) = self.update(i, |w| {
                (state_of(w) == FREE && w & MASK == 0)
                    .then(|| word(gen_of(w).wrapping_add(1), WRITING, 0))
            }) else {
                continue;
            };
            let gen = gen_of(old).wrapping_add(1) & 0xff_ffff;
            self.at(i, 1).store(p.token, Ordering::Relaxed);
            let meta =
                (p.kind as u64) | (u64::from(p.owner & 0xff) << 8) | (u64::from(p.has_fd) << 16);
            self.at(i, 2).store(meta, Ordering::Relaxed);
            self.at(i, 3).store(p.size, Ordering::Relaxed);
            self.at(i, 4).store(0, Ordering::Relaxed);
            for (k, c) in p.handle.chunks_exact(8).enumerate() {
                let v = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                self.at(i, 6 + k).store(v, Ordering::Relaxed);
            }
            self.state(i).store(word(gen, LIVE, 0), Ordering::Release);
            return Some((idx(i), gen));
        }
        None
    }

    /// Entry `i` read whole, if it is live or held and did not change
    /// while read, and what it holds is sound.
    fn read(&self, i: usize) -> Option<(Entry, u64, u64)> {
        let w = self.state(i).load(Ordering::Acquire);
        if !matches!(state_of(w), LIVE | HELD) {
            return None;
        }
        let token = self.at(i, 1).load(Ordering::Relaxed);
        let meta = self.at(i, 2).load(Ordering::Relaxed);
        let size = self.at(i, 3).load(Ordering::Relaxed);
        let tag = self.at(i, 4).load(Ordering::Relaxed);
        let mut handle = [0u8; 64];
        for (k, c) in handle.chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&self.at(i, 6 + k).load(Ordering::Relaxed).to_le_bytes());
        }
        let after = self.state(i).load(Ordering::Acquire);
        if gen_of(after) != gen_of(w) || !matches!(state_of(after), LIVE | HELD) {
            return None;
        }
        let kind = Kind::from_code(meta & 0xff)?;
        let owner = ((meta >> 8) & 0xff) as u32;
        if token == 0 || size > MAX_SIZE || owner >= transport::layout::MAX_PARTITIONS {
            return None;
        }
        let e = Entry {
            index: idx(i),
            gen: gen_of(w),
            kind,
            owner,
            size,
            tag,
            handle,
            has_fd: meta & (1 << 16) != 0,
        };
        Some((e, token, after))
    }

    /// Entry `index` of generation `gen`, live or held.
    pub fn entry(&self, index: u16, gen: u32) -> Option<Entry> {
        let i = usize::from(index);
        if i >= ENTRIES {
            return None;
        }
        self.read(i).map(|r| r.0).filter(|e| e.gen == gen)
    }

    /// The live entry `token` names, if any.
    pub fn find(&self, token: u64) -> Option<Entry> {
        if token == 0 {
            return None;
        }
        (0..ENTRIES).find_map(|i| match self.read(i) {
            Some((e, t, w)) if t == token && state_of(w) == LIVE => Some(e),
            _ => None,
        })
    }

    /// Slot `slot`'s worker opens entry (`index`, `gen`): false if it is
    /// not live any more.
    pub fn open(&self, index: u16, gen: u32, slot: u32) -> bool {
        let (i, bit) = (usize::from(index), 1u64 << (slot & 15));
        i < ENTRIES
            && self
                .update(i, |w| {
                    (gen_of(w) == gen && state_of(w) == LIVE).then_some(w | bit)
                })
                .is_some()
    }

    /// Slot `slot`'s worker closes entry (`index`, `gen`) (its last open):
    /// a held entry nobody has open any more is free.
    pub fn close(&self, index: u16, gen: u32, slot: u32) {
        let (i, bit) = (usize::from(index), 1u64 << (slot & 15));
        if i >= ENTRIES {
            return;
        }
        self.update(i, |w| {
            if gen_of(w) != gen || w & bit == 0 {
                return None;
            }
            let mask = w & MASK & !bit;
            let state = match state_of(w) {
                HELD if mask == 0 => FREE,
                s => s,
            };
            Some(word(gen, state, mask))
        });
    }

    /// The exporter lets go of entry (`index`, `gen`): no new opens; free
    /// at once if nobody has it open, else once its last opener closes it.
    pub fn revoke(&self, index: u16, gen: u32) {
        let i = usize::from(index);
        if i >= ENTRIES {
            return;
        }
        self.update(i, |w| {
            if gen_of(w) != gen || !matches!(state_of(w), LIVE | HELD) {
                return None;
            }
            let state = if w & MASK == 0 { FREE } else { HELD };
            Some(word(gen, state, w & MASK))
        });
    }

    /// Whether another worker has entry (`index`, `gen`) open.
    pub fn opened(&self, index: u16, gen: u32) -> bool {
        let i = usize::from(index);
        if i >= ENTRIES {
            return false;
        }
        let w = self.state(i).load(Ordering::Acquire);
        gen_of(w) == gen && matches!(state_of(w), LIVE | HELD) && w & MASK != 0
    }

    /// Whether entry (`index`, `gen`) may still be opened.
    pub fn live(&self, index: u16, gen: u32) -> bool {
        let i = usize::from(index);
        i < ENTRIES && {
            let w = self.state(i).load(Ordering::Acquire);
            gen_of(w) == gen && state_of(w) == LIVE
        }
    }

    /// Tags live entry (`index`, `gen`) with the pool it was exported from.
    pub fn set_tag(&self, index: u16, gen: u32, tag: u64) {
        if self.live(index, gen) {
            self.at(usize::from(index), 4).store(tag, Ordering::Release);
        }
    }

    /// Lane (process slot) `lane`'s worker is gone: the entries it
    /// exported (`exported`, and any other its slot owns: it may have
    /// gone between publishing one and saying so) are revoked and its open
    /// bits cleared everywhere.
    pub fn lane_ended(&self, lane: u32, exported: &[(u16, u32)]) {
        for &(index, gen) in exported {
            self.revoke(index, gen);
        }
        if lane >= transport::layout::MAX_PARTITIONS {
            return;
        }
        for i in 0..ENTRIES {
            if let Some((e, _, _)) = self.read(i).filter(|r| r.0.owner == lane) {
                self.revoke(e.index, e.gen);
            }
        }
        for i in 0..ENTRIES {
            let w = self.state(i).load(Ordering::Acquire);
            if matches!(state_of(w), LIVE | HELD) && w & (1 << lane) != 0 {
                self.close(idx(i), gen_of(w), lane);
            }
        }
    }
}

/// Fds the daemon handed a worker for entries it opens, until taken:
/// (index, generation) -> the fd (None: the daemon kept none).
#[derive(Debug, Default)]
pub struct Mailbox(Mutex<HashMap<(u16, u32), Option<OwnedFd>>>);

/// Answers a mailbox holds at most (a worker asks for one at a time per
/// channel).
const MAILBOX: usize = 256;

impl Mailbox {
    /// The daemon's answer for (`index`, `gen`).
    pub fn put(&self, index: u16, gen: u32, fd: Option<OwnedFd>) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() < MAILBOX {
            m.insert((index, gen), fd);
        }
    }

    /// The answer for (`index`, `gen`), if it came: `Some(None)` when the
    /// daemon kept no fd.
    pub fn take(&self, index: u16, gen: u32) -> Option<Option<OwnedFd>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(index, gen & 0xff_ffff))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (VmExports, VmExports) {
        let fd = VmExports::create("fvg-exports-test").unwrap();
        (
            VmExports::shared(fd.try_clone().unwrap()).unwrap(),
            VmExports::shared(fd).unwrap(),
        )
    }

    fn mem(token: u64) -> Publish {
        Publish {
            token,
            kind: Kind::Mem,
            owner: 1,
            size: 4096,
            handle: [7; 64],
            has_fd: true,
        }
    }

    #[test]
    fn an_export_is_found_by_its_token_in_another_mapping_only() {
        let (a, b) = table();
        let (i, g) = a.publish(&mem(0xfeed)).unwrap();
        let e = b.find(0xfeed).expect("seen by the other worker");
        assert_eq!((e.index, e.gen, e.size, e.owner), (i, g, 4096, 1));
        assert_eq!(e.handle, [7; 64]);
        assert!(e.has_fd);
        assert!(b.find(0xfeee).is_none(), "a made-up token");
        assert!(b.find(0).is_none());
        assert!(a.publish(&mem(0xfeed)).is_none(), "a token once");
    }

    #[test]
    fn a_revoked_entry_waits_for_its_openers_then_is_free() {
        let (a, b) = table();
        let (i, g) = a.publish(&mem(1)).unwrap();
        assert!(b.open(i, g, 2));
        assert!(a.opened(i, g));
        a.revoke(i, g);
        assert!(b.find(1).is_none(), "no new opens once revoked");
        assert!(!b.open(i, g, 3));
        assert!(a.opened(i, g), "held for its opener");
        b.close(i, g, 2);
        assert!(!a.opened(i, g));
        let (i2, g2) = a.publish(&mem(2)).unwrap();
        assert_eq!(i2, i, "reused once free");
        assert_ne!(g2, g);
        assert!(!b.open(i, g, 2), "an old generation opens nothing");
    }

    #[test]
    fn a_gone_lane_revokes_its_exports_and_closes_its_opens() {
        let (a, b) = table();
        let (i, g) = a.publish(&mem(1)).unwrap();
        let (j, h) = b.publish(&mem(2)).unwrap();
        assert!(b.open(i, g, 2));
        assert!(a.open(j, h, 1));
        // Lane 2 (b) ends: its export is revoked (held: lane 1 has it
        // open) and its open of lane 1's is closed.
        a.lane_ended(2, &[(j, h)]);
        assert!(a.find(2).is_none());
        assert!(a.opened(j, h));
        assert!(!a.opened(i, g));
        a.close(j, h, 1);
        assert!(!a.opened(j, h));
        assert!(a.find(1).is_some(), "lane 1's own stays");
    }

    #[test]
    fn a_garbled_entry_names_nothing() {
        let (a, b) = table();
        let (i, _) = a.publish(&mem(9)).unwrap();
        // Another worker wrote nonsense into it.
        a.at(usize::from(i), 2).store(0xff, Ordering::Relaxed);
        assert!(b.find(9).is_none(), "unknown kind");
        a.at(usize::from(i), 2)
            .store(1 | (40 << 8), Ordering::Relaxed);
        assert!(b.find(9).is_none(), "slot past the last");
        a.at(usize::from(i), 2).store(1, Ordering::Relaxed);
        a.at(usize::from(i), 3).store(u64::MAX, Ordering::Relaxed);
        assert!(b.find(9).is_none(), "size past any GPU");
    }

    #[test]
    fn the_table_is_bounded_and_a_mailbox_answers_once() {
        let (a, _) = table();
        for t in 1..=ENTRIES as u64 {
            assert!(a.publish(&mem(t)).is_some());
        }
        assert!(a.publish(&mem(u64::MAX)).is_none(), "full");
        let m = Mailbox::default();
        m.put(3, 4, None);
        assert_eq!(m.take(3, 4).map(|f| f.is_none()), Some(true));
        assert!(m.take(3, 4).is_none(), "once");
    }
}
