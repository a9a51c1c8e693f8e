//! IPC memory handles between the processes of one VM (`cuIpcGetMemHandle`,
//! `cuIpcOpenMemHandle`, `cuIpcCloseMemHandle`) and event handles
//! (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`).
//!
//! Every guest process of a VM is a context of the VM's one worker process,
//! and on a GPU every context of a process reaches every device address
//! (measured on an H100, `scripts/gpu/ipc.sh`: a copy and a kernel of one
//! context on another's `cuMemAlloc` and VMM memory). So an opened handle
//! is the exporter's own range at the exporter's own address, and what the
//! host adds is the bookkeeping that lets the opener's requests name it.
//!
//! - An exporter names one of its allocations or mappings with a token
//!   (random, the same for the same memory while it lives). The worker
//!   keeps the tokens in an [`Exports`] table.
//! - An opener of a token gets the range added to what its requests may
//!   name ([`Imports`]), counted per open, until it closes it as often.
//! - The memory stays the exporter's and counts against the vGPU's limit
//!   as before. When the exporter frees it while another process has it
//!   open, it stays, out of the exporter's reach, until the last opener
//!   closes it (as the driver keeps it: [`Orphans`]); then it is freed.
//!   When the exporter ends, its context and all its memory go with it,
//!   and every export of it is revoked (the driver would keep the memory
//!   for the openers): openers' requests naming it are refused from then
//!   on, and a kernel of theirs that still touches it faults, as a use
//!   after free does. A process never opens its own export (the driver
//!   says `CUDA_ERROR_INVALID_CONTEXT`).
//!
//! Where each process of the VM has a worker of its own (process slots),
//! an export is also published in the VM's export table
//! (`exports.rs`, [`VmLink`]) and another worker opens it through the
//! driver's own inter-process handles, at an address of its own
//! (`serve/requests/ipc_across.rs`). There the opener keeps what it opened
//! after the exporter ends, as the driver keeps it, and the memory stays
//! counted to the vGPU until it closes it.
//!
//! Events are exported the same way, from a table of their own: the opener
//! gets a handle of its own for the exporter's event (the driver's event,
//! which every context of the process can use; [`OpenedEvents`]). An event
//! the exporter destroys while opened stays until the last opener lets go
//! of its handle; the handles are revoked when the exporter ends, and when
//! the vGPU migrates (the events are made anew on the other GPU).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use protocol::Status;

use crate::executor::SharedMem;
use crate::exports::VmExports;

/// An export's entry in the VM's export table (a VM whose processes each
/// have a worker of their own, `exports.rs`): the exporter's, or an
/// opener's (`opener`: its slot).
#[derive(Debug)]
pub struct VmLink {
    /// The table.
    pub table: Arc<VmExports>,
    /// The entry's index.
    pub index: u16,
    /// Its generation.
    pub gen: u32,
    /// The opener's slot, for an opener's link.
    pub opener: Option<u32>,
}

/// Exports a worker keeps at most (live ones; each names an allocation or
/// mapping of a live process).
pub const MAX_EXPORTS: usize = 4096;

/// Opens of one range a process may hold at once.
const MAX_OPENS: u32 = 1 << 16;

/// One export: whose memory, where, and whether it still lives.
#[derive(Debug)]
pub struct Export {
    /// The exporting session's id.
    pub owner: u64,
    /// Its start.
    pub base: u64,
    /// Its length.
    pub size: u64,
    /// What another context needs to reach it (see `Ipc::share_mem`).
    pub mem: SharedMem,
    alive: AtomicBool,
    /// Sessions that have it open.
    opens: AtomicU32,
    /// The token of the pool it was exported from (0: none; see
    /// `session::share`).
    tag: AtomicU64,
    /// Its entry in the VM's export table, if published there.
    vm: std::sync::OnceLock<VmLink>,
}

impl Export {
    fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Whether some other session has it open (of this worker, or of
    /// another worker of the VM).
    pub fn opened(&self) -> bool {
        self.opens.load(Ordering::Acquire) > 0
            || self
                .vm
                .get()
                .is_some_and(|l| l.opener.is_none() && l.table.opened(l.index, l.gen))
    }

    fn revoke(&self) {
        self.alive.store(false, Ordering::Release);
        if let Some(l) = self.vm.get().filter(|l| l.opener.is_none()) {
            l.table.revoke(l.index, l.gen);
        }
    }

    /// Its memory is freed while opened: no other worker opens it anew (as
    /// the driver refuses the handle of freed memory); those that have it
    /// keep it.
    pub fn withdraw(&self) {
        if let Some(l) = self.vm.get().filter(|l| l.opener.is_none()) {
            l.table.revoke(l.index, l.gen);
        }
    }

    /// Records its entry in the VM's export table (once).
    pub fn link(&self, l: VmLink) {
        let _ = self.vm.set(l);
    }

    /// Its entry in the VM's export table, if any.
    pub fn vm_link(&self) -> Option<&VmLink> {
        self.vm.get()
    }

    /// Memory another worker of the VM exported, opened by this one at
    /// `base` (`link`: the opener's).
    pub fn opened_remote(base: u64, size: u64, link: VmLink) -> Arc<Export> {
        let e = Export {
            owner: u64::MAX,
            base,
            size,
            mem: SharedMem::default(),
            alive: AtomicBool::new(true),
            opens: AtomicU32::new(0),
            tag: AtomicU64::new(0),
            vm: std::sync::OnceLock::new(),
        };
        let _ = e.vm.set(link);
        Arc::new(e)
    }

    /// Whether it is another worker's memory opened here.
    pub fn is_remote(&self) -> bool {
        self.vm.get().is_some_and(|l| l.opener.is_some())
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        match self.vm.get() {
            Some(
                l @ VmLink {
                    opener: Some(slot), ..
                },
            ) => l.table.close(l.index, l.gen, *slot),
            Some(l) => l.table.revoke(l.index, l.gen),
            None => {}
        }
    }
}

impl Export {
    /// Whether its token still names it.
    pub fn is_alive(&self) -> bool {
        self.alive()
    }

    /// Another session holds it once more (a shareable handle imported).
    pub fn hold(&self) {
        self.opens.fetch_add(1, Ordering::AcqRel);
    }

    /// Another session lets go of what [`Export::hold`] counted.
    pub fn let_go(&self) {
        self.opens.fetch_sub(1, Ordering::AcqRel);
    }

    /// The token of the pool it was exported from (0: none).
    pub fn tag(&self) -> u64 {
        self.tag.load(Ordering::Acquire)
    }

    /// Records the pool it was exported from.
    pub fn set_tag(&self, pool: u64) {
        self.tag.store(pool, Ordering::Release);
    }
}

/// The worker's exports by token.
#[derive(Debug, Default)]
pub struct Exports {
    by_token: HashMap<u64, Arc<Export>>,
    keys: std::collections::hash_map::RandomState,
    next: u64,
}

impl Exports {
    /// Adds an export of `[base, base + size)` by session `owner` and
    /// answers its token; the caller records it in the owner's
    /// [`Exported`] too.
    pub fn add(
        &mut self,
        owner: u64,
        base: u64,
        size: u64,
        mem: SharedMem,
    ) -> Result<(u64, Arc<Export>), Status> {
        self.by_token.retain(|_, e| e.alive());
        if self.by_token.len() >= MAX_EXPORTS {
            return Err(Status::OutOfMemory);
        }
        let token = loop {
            // Unguessable: a keyed hash of a counter (never 0).
            let mut h = self.keys.build_hasher();
            h.write_u64(self.next);
            self.next += 1;
            let t = h.finish();
            if t != 0 && !self.by_token.contains_key(&t) {
                break t;
            }
        };
        let e = Arc::new(Export {
            owner,
            base,
            size,
            mem,
            alive: AtomicBool::new(true),
            opens: AtomicU32::new(0),
            tag: AtomicU64::new(0),
            vm: std::sync::OnceLock::new(),
        });
        self.by_token.insert(token, e.clone());
        Ok((token, e))
    }

    /// Revokes every export (a migration remakes what they name).
    pub fn revoke_all(&mut self) {
        for e in self.by_token.values() {
            e.alive.store(false, Ordering::Release);
        }
        self.by_token.clear();
    }

    /// The live export named `token`.
    pub fn get(&self, token: u64) -> Option<Arc<Export>> {
        self.by_token.get(&token).filter(|e| e.alive()).cloned()
    }
}

/// What one session exported: start -> (token, export). Dropping it (the
/// session ends) revokes them all.
#[derive(Debug, Default)]
pub struct Exported(BTreeMap<u64, (u64, Arc<Export>)>);

impl Exported {
    /// The token of the export of memory starting at `base`, if any.
    pub fn token(&self, base: u64) -> Option<u64> {
        self.0
            .get(&base)
            .filter(|(_, e)| e.alive())
            .map(|&(t, _)| t)
    }

    /// Records an export made by [`Exports::add`].
    pub fn insert(&mut self, token: u64, e: Arc<Export>) {
        self.0.insert(e.base, (token, e));
    }

    /// Takes the live export of the memory at `base` out of the table
    /// without revoking it, if another session has it open: the memory is
    /// being freed and waits for its openers ([`Orphans`]).
    pub fn take_opened(&mut self, base: u64) -> Option<Arc<Export>> {
        match self.0.get(&base) {
            Some((_, e)) if e.alive() && e.opened() => self.0.remove(&base).map(|(_, e)| e),
            _ => None,
        }
    }

    /// Takes every live export some other session holds out of the table,
    /// revoked (its owner ends: the token names nothing any more), for
    /// what they hold to stay counted until they let go.
    pub fn take_all_opened(&mut self) -> Vec<Arc<Export>> {
        let held: Vec<u64> = self
            .0
            .iter()
            .filter(|(_, (_, e))| e.alive() && e.opened())
            .map(|(&b, _)| b)
            .collect();
        let out: Vec<Arc<Export>> = held
            .into_iter()
            .filter_map(|b| self.0.remove(&b).map(|(_, e)| e))
            .collect();
        for e in &out {
            e.revoke();
        }
        out
    }

    /// How many it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether another worker of the VM has one of them open.
    pub fn any_opened_across(&self) -> bool {
        self.0.values().any(|(_, e)| {
            e.vm_link()
                .is_some_and(|l| l.opener.is_none() && l.table.opened(l.index, l.gen))
        })
    }

    /// The memory at `[start, end)` is gone: revokes every export in it.
    pub fn revoke(&mut self, start: u64, end: u64) {
        let gone: Vec<u64> = self.0.range(start..end).map(|(&b, _)| b).collect();
        for b in gone {
            if let Some((_, e)) = self.0.remove(&b) {
                e.revoke();
            }
        }
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        self.revoke(0, u64::MAX);
    }
}

/// Allocations a session freed while other sessions had them open:
/// (start, what it takes of the limit, its export). Each is freed once
/// nobody has it open ([`Orphans::closed`]); dropping the table (the
/// session ends, its context frees them all) revokes the exports.
#[derive(Debug, Default)]
pub struct Orphans(Vec<(u64, u64, Arc<Export>)>);

impl Orphans {
    /// Keeps `base` (taking `charge`) until `e`'s openers close it.
    pub fn push(&mut self, base: u64, charge: u64, e: Arc<Export>) {
        self.0.push((base, charge, e));
    }

    /// The ones nobody has open any more, taken out, their exports revoked:
    /// (start, charge) of each, to be freed.
    pub fn closed(&mut self) -> Vec<(u64, u64)> {
        if self.0.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        self.0.retain(|(b, c, e)| {
            if e.opened() {
                return true;
            }
            e.revoke();
            out.push((*b, *c));
            false
        });
        out
    }
}

impl Orphans {
    /// Whether another worker of the VM still has one of them open.
    pub fn any_opened_across(&self) -> bool {
        self.0.iter().any(|(_, _, e)| {
            e.vm_link()
                .is_some_and(|l| l.opener.is_none() && l.table.opened(l.index, l.gen))
        })
    }

    /// Takes out every one someone still has open, revoked: (charge,
    /// export).
    pub fn take_opened(&mut self) -> Vec<(u64, Arc<Export>)> {
        let mut out = Vec::new();
        self.0.retain(|(_, c, e)| {
            if e.opened() {
                e.revoke();
                out.push((*c, e.clone()));
                return false;
            }
            true
        });
        out
    }
}

impl Drop for Orphans {
    fn drop(&mut self) {
        for (_, _, e) in &self.0 {
            e.revoke();
        }
    }
}

/// One range a session opened.
#[derive(Debug)]
struct Import {
    export: Arc<Export>,
    opens: u32,
}

/// What one session opened, by start.
#[derive(Debug, Default)]
pub struct Imports(BTreeMap<u64, Import>);

impl Imports {
    /// Opens `e` once more; true if this is its first open (the context
    /// must be told).
    pub fn open(&mut self, e: Arc<Export>) -> Result<bool, Status> {
        match self.0.get_mut(&e.base) {
            Some(i) if Arc::ptr_eq(&i.export, &e) => {
                if i.opens >= MAX_OPENS {
                    return Err(Status::OutOfMemory);
                }
                i.opens += 1;
                Ok(false)
            }
            // An earlier export at that address, revoked since: replaced.
            _ => {
                e.opens.fetch_add(1, Ordering::AcqRel);
                let base = e.base;
                let new = Import {
                    export: e,
                    opens: 1,
                };
                if let Some(old) = self.0.insert(base, new) {
                    old.export.opens.fetch_sub(1, Ordering::AcqRel);
                }
                Ok(true)
            }
        }
    }

    /// Opens the range opened at `base` once more.
    pub fn open_again(&mut self, base: u64) -> Result<(), Status> {
        let i = self.0.get_mut(&base).ok_or(Status::InvalidValue)?;
        if i.opens >= MAX_OPENS {
            return Err(Status::OutOfMemory);
        }
        i.opens += 1;
        Ok(())
    }

    /// Closes the range opened at `base` once; true if that was its last
    /// open (the context must forget it).
    pub fn close(&mut self, base: u64) -> Result<bool, Status> {
        let i = self.0.get_mut(&base).ok_or(Status::InvalidValue)?;
        i.opens -= 1;
        if i.opens > 0 {
            return Ok(false);
        }
        if let Some(i) = self.0.remove(&base) {
            i.export.opens.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(true)
    }

    /// The start of this session's open of another worker's entry
    /// (`index`, `gen`), if it has one.
    pub fn remote_base(&self, index: u16, gen: u32) -> Option<u64> {
        self.0.iter().find_map(|(&b, i)| {
            i.export
                .vm_link()
                .filter(|l| l.opener.is_some() && l.index == index && l.gen == gen)
                .map(|_| b)
        })
    }

    /// Whether the range opened at `base` is another worker's memory.
    pub fn is_remote(&self, base: u64) -> bool {
        self.0.get(&base).is_some_and(|i| i.export.is_remote())
    }

    /// The starts of every range of another worker's it has open.
    pub fn remote(&self) -> Vec<u64> {
        self.0
            .iter()
            .filter(|(_, i)| i.export.is_remote())
            .map(|(&b, _)| b)
            .collect()
    }

    /// Whether `[ptr, end)` lies in one range opened and still exported.
    pub fn covers(&self, ptr: u64, end: u64) -> bool {
        self.0
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, i)| i.export.alive() && end <= b.saturating_add(i.export.size))
    }
}

impl Drop for Imports {
    fn drop(&mut self) {
        for i in self.0.values() {
            i.export.opens.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Events of other sessions a session opened: its handle -> the export.
/// Each counts as one open of its export until let go of or dropped.
#[derive(Debug, Default)]
pub struct OpenedEvents(HashMap<u64, Arc<Export>>);

impl OpenedEvents {
    /// Records `handle`, this session's for `e`.
    pub fn insert(&mut self, handle: u64, e: Arc<Export>) {
        e.opens.fetch_add(1, Ordering::AcqRel);
        if let Some(old) = self.0.insert(handle, e) {
            old.opens.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Lets go of `handle`; whether it was one.
    pub fn remove(&mut self, handle: u64) -> bool {
        match self.0.remove(&handle) {
            Some(e) => {
                e.opens.fetch_sub(1, Ordering::AcqRel);
                true
            }
            None => false,
        }
    }

    /// The export of another worker's entry (`index`, `gen`) it opened,
    /// if it holds a handle for it.
    pub fn remote(&self, index: u16, gen: u32) -> Option<Arc<Export>> {
        self.0
            .values()
            .find(|e| {
                e.vm_link()
                    .is_some_and(|l| l.opener.is_some() && l.index == index && l.gen == gen)
            })
            .cloned()
    }

    /// Whether it holds an event of another worker's.
    pub fn any_remote(&self) -> bool {
        self.0.values().any(|e| e.is_remote())
    }

    /// Whether `handle` names an event still exported.
    pub fn alive(&self, handle: u64) -> bool {
        self.0.get(&handle).is_some_and(|e| e.alive())
    }

    /// How many it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Drop for OpenedEvents {
    fn drop(&mut self) {
        for e in self.0.values() {
            e.opens.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(t: &mut Exports, owner: u64, base: u64) -> (u64, Arc<Export>) {
        t.add(owner, base, 4096, SharedMem::default()).unwrap()
    }

    #[test]
    fn tokens_are_distinct_and_name_live_exports_only() {
        let mut t = Exports::default();
        let mut mine = Exported::default();
        let (a, ea) = export(&mut t, 1, 0x1000_0000);
        let (b, eb) = export(&mut t, 1, 0x2000_0000);
        assert_ne!(a, b);
        assert_ne!(a, 0);
        mine.insert(a, ea);
        mine.insert(b, eb);
        assert_eq!(mine.token(0x1000_0000), Some(a));
        assert!(t.get(a).is_some());
        assert!(t.get(a ^ 1).is_none(), "a made-up token names nothing");
        mine.revoke(0x1000_0000, 0x1000_1000);
        assert!(t.get(a).is_none(), "revoked with its memory");
        assert!(t.get(b).is_some());
        drop(mine);
        assert!(t.get(b).is_none(), "revoked when its owner ends");
    }

    #[test]
    fn opens_are_counted_and_a_revoked_range_is_not_covered() {
        let mut t = Exports::default();
        let mut mine = Exported::default();
        let (a, ea) = export(&mut t, 1, 0x1000_0000);
        mine.insert(a, ea);
        let mut theirs = Imports::default();
        assert!(theirs.open(t.get(a).unwrap()).unwrap(), "first open");
        assert!(!theirs.open(t.get(a).unwrap()).unwrap());
        assert!(theirs.covers(0x1000_0000, 0x1000_1000));
        assert!(!theirs.covers(0x1000_0000, 0x1000_1001), "past its end");
        assert!(!theirs.covers(0xfff_ffff, 0x1000_0001), "before its start");
        assert!(!theirs.close(0x1000_0000).unwrap());
        assert!(theirs.covers(0x1000_0000, 0x1000_0010), "one open left");
        mine.revoke(0, u64::MAX);
        assert!(!theirs.covers(0x1000_0000, 0x1000_0010), "revoked");
        assert!(
            theirs.close(0x1000_0000).unwrap(),
            "still closed as often as opened"
        );
        assert_eq!(theirs.close(0x1000_0000), Err(Status::InvalidValue));
    }

    #[test]
    fn freed_memory_waits_for_its_openers() {
        let mut t = Exports::default();
        let mut mine = Exported::default();
        let (a, ea) = export(&mut t, 1, 0x1000_0000);
        mine.insert(a, ea);
        assert!(
            mine.take_opened(0x1000_0000).is_none(),
            "nobody has it open"
        );
        let mut theirs = Imports::default();
        theirs.open(t.get(a).unwrap()).unwrap();
        theirs.open(t.get(a).unwrap()).unwrap();
        let e = mine.take_opened(0x1000_0000).expect("opened: kept");
        assert_eq!(mine.token(0x1000_0000), None, "no longer the exporter's");
        let mut orphans = Orphans::default();
        orphans.push(0x1000_0000, 4096, e);
        assert!(orphans.closed().is_empty());
        assert!(theirs.covers(0x1000_0000, 0x1000_0100), "still reachable");
        theirs.close(0x1000_0000).unwrap();
        assert!(orphans.closed().is_empty(), "one open left");
        theirs.close(0x1000_0000).unwrap();
        assert_eq!(orphans.closed(), vec![(0x1000_0000, 4096)]);
        assert!(t.get(a).is_none(), "revoked once freed");

        // An opener that ends closes what it had open.
        let (b, eb) = export(&mut t, 1, 0x2000_0000);
        mine.insert(b, eb);
        let mut gone = Imports::default();
        gone.open(t.get(b).unwrap()).unwrap();
        orphans.push(0x2000_0000, 1, mine.take_opened(0x2000_0000).unwrap());
        drop(gone);
        assert_eq!(orphans.closed(), vec![(0x2000_0000, 1)]);
        // An exporter that ends revokes what still waits.
        let (c, ec) = export(&mut t, 1, 0x3000_0000);
        mine.insert(c, ec);
        let mut holder = Imports::default();
        holder.open(t.get(c).unwrap()).unwrap();
        orphans.push(0x3000_0000, 1, mine.take_opened(0x3000_0000).unwrap());
        drop(orphans);
        assert!(!holder.covers(0x3000_0000, 0x3000_0001));
    }

    /// An export published in the VM's table is opened by another
    /// worker (slot 2): it counts as opened for the exporter until that
    /// worker's proxy goes; freed meanwhile, it waits for it; the entry is
    /// free once both let go.
    #[test]
    fn an_export_opened_by_another_worker_waits_for_it() {
        use crate::exports::{Kind, Publish, VmExports};
        let fd = VmExports::create("fvg-ipc-across").unwrap();
        let here = Arc::new(VmExports::shared(fd.try_clone().unwrap()).unwrap());
        let there = Arc::new(VmExports::shared(fd).unwrap());
        let mut t = Exports::default();
        let mut mine = Exported::default();
        let (tok, e) = export(&mut t, 1, 0x1000_0000);
        let (index, gen) = here
            .publish(&Publish {
                token: tok,
                kind: Kind::Mem,
                owner: 1,
                size: 4096,
                handle: [0; 64],
                has_fd: true,
            })
            .unwrap();
        let link = |table: &Arc<VmExports>, opener| VmLink {
            table: table.clone(),
            index,
            gen,
            opener,
        };
        e.link(link(&here, None));
        mine.insert(tok, e);
        assert!(!mine.any_opened_across());
        // The other worker opens it (its bit, then its proxy).
        let found = there.find(tok).unwrap();
        assert!(there.open(found.index, found.gen, 2));
        let proxy = Export::opened_remote(0x7000_0000, 4096, link(&there, Some(2)));
        let mut theirs = Imports::default();
        assert!(theirs.open(proxy).unwrap());
        assert!(theirs.remote_base(index, gen) == Some(0x7000_0000));
        assert!(mine.any_opened_across());
        // Freed by its exporter: kept, no new opens, still opened.
        let kept = mine.take_opened(0x1000_0000).expect("opened elsewhere");
        kept.withdraw();
        assert!(there.find(tok).is_none(), "no new opens");
        let mut orphans = Orphans::default();
        orphans.push(0x1000_0000, 4096, kept);
        assert!(orphans.any_opened_across());
        assert!(orphans.closed().is_empty());
        // The other worker closes it: let go everywhere.
        assert!(theirs.close(0x7000_0000).unwrap());
        assert!(!orphans.any_opened_across());
        assert_eq!(orphans.closed(), vec![(0x1000_0000, 4096)]);
        assert!(here.entry(index, gen).is_none(), "the entry is free");
    }

    #[test]
    fn exports_are_bounded() {
        let mut t = Exports::default();
        let mut keep = Exported::default();
        for i in 0..MAX_EXPORTS as u64 {
            let (tok, e) = export(&mut t, 1, i << 21);
            keep.insert(tok, e);
        }
        assert_eq!(
            t.add(1, 1 << 50, 1, SharedMem::default()).map(|_| ()),
            Err(Status::OutOfMemory)
        );
        keep.revoke(0, 1 << 21);
        assert!(
            t.add(1, 1 << 50, 1, SharedMem::default()).is_ok(),
            "room once one is gone"
        );
    }
}
