//! Shareable handles between the processes of one VM: physical VMM memory
//! (`cuMemExportToShareableHandle` / `cuMemImportFromShareableHandle`) and
//! memory pools with their allocations (`cuMemPoolExportToShareableHandle`,
//! `cuMemPoolExportPointer` and their imports). In the guest a handle is a
//! file descriptor of the process that carries a token; on the host the
//! token names an export in one of the worker's tables (`Exports`, as
//! legacy IPC names memory, `session/ipc.rs`).
//!
//! Every guest process of a VM is a context of the VM's one worker, so an
//! importer's handle is the exporter's physical memory itself: the
//! executor hands it over (`Vmm::share_phys` / `import_phys`) and the
//! importer maps it like its own. What the host adds is the bookkeeping:
//!
//! - An exporter exports only memory it holds a handle of; a token of
//!   another VM or a made-up one names nothing here.
//! - An importer gets a handle of its own, held and released as its own
//!   (`session::vmm`), counted as one hold of the export. It never frees
//!   more than its own handle and its own mappings.
//! - The memory counts once, against the exporter, as legacy IPC memory
//!   does: when the exporter releases it while another process still
//!   holds an import, it stays counted to the exporter ([`Shares::orphans`])
//!   until they let go; when the exporter ends, its tokens are revoked (no
//!   new imports) and what importers still hold stays counted to the vGPU
//!   (`worker::share`) until they let go or end. Physical memory is freed
//!   when its last holder, exporter or importer, lets go.
//! - Where each process has a worker of its own (process slots), exports
//!   are also published in the VM's export table and opened by another
//!   worker through a POSIX fd of the driver's (`serve/requests/ipc_across.rs`).
//! - Pools live in the guest; the host keeps a token per exported pool
//!   and which pools a process imported, and a pool's allocation is
//!   exported as IPC memory tagged with its pool's token: it is imported
//!   only through that pool, then closed as IPC memory is.

use std::collections::HashMap;
use std::sync::Arc;

use protocol::Status;

use super::ipc::{Export, Exported, Orphans, MAX_EXPORTS};
use crate::executor::Handle;

/// A session's shareable handles.
#[derive(Debug, Default)]
pub struct Shares {
    /// Its physical memory it exported, by its handle.
    pub exported: Exported,
    /// Its handles for memory other sessions exported.
    imported: HashMap<Handle, Arc<Export>>,
    /// Its physical memory gone from its table while others hold it:
    /// counted until they let go.
    pub orphans: Orphans,
    /// Its pools it exported, by the guest's pool handle.
    pub pools: Exported,
    /// Pools of other sessions it imported, by token.
    pools_imported: HashMap<u64, Arc<Export>>,
}

impl Shares {
    /// Records `handle`, this session's import of `e` (one hold).
    pub fn imported(&mut self, handle: Handle, e: Arc<Export>) -> Result<(), Status> {
        if self.imported.len() >= MAX_EXPORTS {
            return Err(Status::OutOfMemory);
        }
        e.hold();
        if let Some(old) = self.imported.insert(handle, e) {
            old.let_go();
        }
        Ok(())
    }

    /// This session's handle for `e`, if it imported it before.
    pub fn import_of(&self, e: &Arc<Export>) -> Option<Handle> {
        self.imported
            .iter()
            .find(|(_, x)| Arc::ptr_eq(x, e))
            .map(|(&h, _)| h)
    }

    /// This session's handle for another worker's entry (`index`, `gen`),
    /// if it imported it before.
    pub fn remote_import(&self, index: u16, gen: u32) -> Option<Handle> {
        self.imported.iter().find_map(|(&h, e)| {
            e.vm_link()
                .filter(|l| l.opener.is_some() && l.index == index && l.gen == gen)
                .map(|_| h)
        })
    }

    /// Whether `handle` is an import.
    pub fn is_import(&self, handle: Handle) -> bool {
        self.imported.contains_key(&handle)
    }

    /// `handle` is gone from the session's table: if it was an import,
    /// its hold is let go of.
    pub fn forget(&mut self, handle: Handle) {
        if let Some(e) = self.imported.remove(&handle) {
            e.let_go();
        }
    }

    /// Records a pool of another session it imported.
    pub fn pool_imported(&mut self, token: u64, e: Arc<Export>) -> Result<(), Status> {
        if self.pools_imported.len() >= MAX_EXPORTS && !self.pools_imported.contains_key(&token) {
            return Err(Status::OutOfMemory);
        }
        self.pools_imported.insert(token, e);
        Ok(())
    }

    /// Whether it imported the pool `token` names and the pool is still
    /// exported.
    pub fn has_pool(&self, token: u64) -> bool {
        self.pools_imported
            .get(&token)
            .is_some_and(|e| e.is_alive())
    }

    /// Whether it holds any shareable handle, exported or imported (such
    /// memory cannot move to another GPU: see `Keeper::SharedHandle`).
    pub fn any(&self) -> bool {
        !self.exported.is_empty() || !self.imported.is_empty()
    }
}

impl Drop for Shares {
    fn drop(&mut self) {
        for e in self.imported.values() {
            e.let_go();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::SharedMem;
    use crate::session::ipc::Exports;

    #[test]
    fn imports_hold_the_export_until_forgotten_or_dropped() {
        let mut t = Exports::default();
        let mut owner = Shares::default();
        let (tok, e) = t.add(1, 7, 2 << 20, SharedMem::default()).unwrap();
        owner.exported.insert(tok, e);
        let mut a = Shares::default();
        let got = t.get(tok).unwrap();
        a.imported(100, got.clone()).unwrap();
        assert_eq!(a.import_of(&got), Some(100));
        assert!(a.is_import(100) && !a.is_import(7));
        assert!(got.opened(), "held");
        let mut b = Shares::default();
        b.imported(200, got.clone()).unwrap();
        a.forget(100);
        assert!(got.opened(), "b still holds it");
        assert_eq!(a.import_of(&got), None);
        // The owner ends: its token is revoked, what b holds stays to be
        // counted.
        let kept = owner.exported.take_all_opened();
        assert_eq!(kept.len(), 1);
        drop(owner);
        assert!(t.get(tok).is_none(), "no new imports");
        assert!(kept[0].opened());
        drop(b);
        assert!(!kept[0].opened(), "let go once b ends");
    }

    #[test]
    fn pools_are_known_only_while_exported() {
        let mut t = Exports::default();
        let mut owner = Shares::default();
        let (tok, e) = t.add(1, 0x5000, 0, SharedMem::default()).unwrap();
        owner.pools.insert(tok, e);
        let mut a = Shares::default();
        assert!(!a.has_pool(tok));
        a.pool_imported(tok, t.get(tok).unwrap()).unwrap();
        assert!(a.has_pool(tok));
        assert!(!a.has_pool(tok ^ 1));
        drop(owner);
        assert!(!a.has_pool(tok), "revoked with its owner");
    }
}
