//! The shareable-handle requests (cuMemExportToShareableHandle,
//! cuMemImportFromShareableHandle, cuMemPoolExportToShareableHandle,
//! cuMemPoolImportFromShareableHandle, cuMemPoolExportPointer,
//! cuMemPoolImportPointer): each checked against the session's own tables
//! and the worker's exports (`session::share`), answered; and the count of
//! shared memory, which stays the exporter's until its last importer lets
//! go.

use std::sync::Arc;

use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::super::channel::{answer, ChannelState};
use super::super::shared::{Memory, Shared, Tables};
use super::ipc_across::{self as across, OpenKind};
use crate::session::ipc::{Export, Exports};
use crate::session::Session;
use crate::Error;

/// The worker's tables of shareable handles.
#[derive(Debug, Default)]
pub struct WorkerShares {
    /// Physical memory exported, by token.
    pub vmm: Exports,
    /// Pools exported, by token.
    pub pools: Exports,
    /// Memory of processes that ended while others held imports of it:
    /// (bytes counted, export), counted to the vGPU until they let go.
    kept: Vec<(u64, Arc<Export>)>,
}

impl WorkerShares {
    /// Whether memory of an ended process is still held by another worker
    /// (a worker that ends with its process stays until it is let go).
    pub fn keeps_any(&self) -> bool {
        !self.kept.is_empty()
    }
}

/// Runs a shareable-handle request of session `s` and replies.
pub(super) fn handle(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    // Where each process has a worker of its own, a token this worker
    // does not know may be another's (`ipc_across.rs`).
    let across = sh.tables.vm.is_some() && sh.port.slot.is_some();
    let (port, tables) = (&sh.port, &mut sh.tables);
    let (r, why) = match req {
        Request::VmmExport { handle } => (
            vmm_export(tables, s, handle)
                .and_then(|r| across::publish_phys(port, tables, s, handle, r)),
            "export of a handle it does not hold, or one export too many",
        ),
        Request::VmmImport { token } => match vmm_import(tables, s, token) {
            Err(Status::InvalidValue) if across => {
                return across::open(sh, c, s, d, token, (OpenKind::Phys, None));
            }
            r => (r, "import of a token no process of the VM exports"),
        },
        Request::PoolExport { pool } => (
            pool_export(tables, s, pool).and_then(|r| across::publish_pool(port, tables, r)),
            "one pool export too many",
        ),
        Request::PoolImport { token } => (
            match pool_import(tables, s, token) {
                Err(Status::InvalidValue) if across => across::pool_import(port, tables, s, token),
                r => r,
            },
            "import of a pool no other process of the VM exports",
        ),
        Request::PoolExportPointer { pool, ptr } => (
            pointer_export(tables, s, pool, ptr)
                .and_then(|r| across::publish_pointer(port, tables, s, pool, r)),
            "export of memory it does not own, or from a pool it did not export",
        ),
        Request::PoolImportPointer { pool, token } => {
            match pointer_import(tables, s, pool, token) {
                Err(Status::InvalidValue) if across && s.shares.has_pool(pool) => {
                    return across::open(sh, c, s, d, token, (OpenKind::Mem, Some(pool)));
                }
                r => (
                    r,
                    "import of a pointer not exported from a pool it imported",
                ),
            }
        }
        _ => (Err(Status::InvalidValue), "not a shareable-handle request"),
    };
    answer(&sh.port, c, d.tag, d.opcode, r, why)
}

/// The token of physical memory the session holds a handle of (made on
/// its first export), and its size.
fn vmm_export(tables: &mut Tables, s: &mut Session, handle: u64) -> Result<Reply, Status> {
    let size = s.vmm.held(handle).ok_or(Status::InvalidValue)?;
    if s.shares.is_import(handle) {
        // Exported again by an importer: the memory is counted to its
        // exporter, who alone exports it.
        return Err(Status::NotSupported);
    }
    let token = match s.shares.exported.token(handle) {
        Some(t) => t,
        None => {
            let mem = s.ctx.share_phys(handle)?;
            let (t, e) = tables.shares.vmm.add(s.id, handle, size, mem)?;
            s.shares.exported.insert(t, e);
            t
        }
    };
    Ok(Reply {
        vals: [token, size, 0, 0],
    })
}

/// A handle of the session's for exported physical memory, and its size.
fn vmm_import(tables: &mut Tables, s: &mut Session, token: u64) -> Result<Reply, Status> {
    let e = tables.shares.vmm.get(token).ok_or(Status::InvalidValue)?;
    // Its own memory, or memory it imported before: the same handle, held
    // once more.
    let again = if e.owner == s.id {
        Some(e.base)
    } else {
        s.shares.import_of(&e)
    };
    if let Some(h) = again {
        if s.vmm.hold(h) {
            return Ok(Reply {
                vals: [h, e.size, 0, 0],
            });
        }
        return Err(Status::InvalidValue);
    }
    let h = s.ctx.import_phys(&e.mem, e.size)?;
    if let Err(err) = s.shares.imported(h, e.clone()) {
        let _ = s.ctx.vmm_release(h);
        return Err(err);
    }
    // Counted to the exporter, not here.
    s.vmm.created(h, e.size, 0);
    Ok(Reply {
        vals: [h, e.size, 0, 0],
    })
}

/// The token of one of the session's pools (made on its first export).
fn pool_export(tables: &mut Tables, s: &mut Session, pool: u64) -> Result<Reply, Status> {
    let token = match s.shares.pools.token(pool) {
        Some(t) => t,
        None => {
            let (t, e) = tables.shares.pools.add(s.id, pool, 0, Default::default())?;
            s.shares.pools.insert(t, e);
            t
        }
    };
    Ok(Reply::one(token))
}

/// Records another session's pool as imported by this one.
fn pool_import(tables: &mut Tables, s: &mut Session, token: u64) -> Result<Reply, Status> {
    let e = tables.shares.pools.get(token).ok_or(Status::InvalidValue)?;
    s.shares.pool_imported(token, e)?;
    Ok(Reply::default())
}

/// Exports the allocation holding `ptr` as IPC memory of the session's
/// exported pool `pool`: its token, start and size.
fn pointer_export(
    tables: &mut Tables,
    s: &mut Session,
    pool: u64,
    ptr: u64,
) -> Result<Reply, Status> {
    match tables.shares.pools.get(pool) {
        Some(p) if p.owner == s.id => {}
        _ => return Err(Status::InvalidValue),
    }
    let r = super::ipc::export(tables, s, ptr)?;
    let e = tables.ipc.get(r.vals[0]).ok_or(Status::InvalidValue)?;
    e.set_tag(pool);
    Ok(r)
}

/// Opens an allocation exported from pool `pool`, which the session
/// imported: its start and size.
fn pointer_import(
    tables: &mut Tables,
    s: &mut Session,
    pool: u64,
    token: u64,
) -> Result<Reply, Status> {
    if !s.shares.has_pool(pool) {
        return Err(Status::InvalidValue);
    }
    match tables.ipc.get(token) {
        Some(e) if e.tag() == pool => super::ipc::open(tables, s, token),
        _ => Err(Status::InvalidValue),
    }
}

/// Uncounts shared memory nobody holds any more: the session's own
/// (released while imported elsewhere) and that of processes gone.
pub(in crate::serve) fn settle(mem: &mut Memory, tables: &mut Tables, s: &mut Session) {
    for (_, charge) in s.shares.orphans.closed() {
        s.uncount(charge);
        mem.sub(charge);
    }
    settle_kept(mem, tables);
}

/// Uncounts memory of ended processes that nobody holds any more.
pub(in crate::serve) fn settle_kept(mem: &mut Memory, tables: &mut Tables) {
    let mut freed = 0;
    tables.shares.kept.retain(|(charge, e)| {
        if e.opened() {
            return true;
        }
        freed += charge;
        false
    });
    mem.sub(freed);
}

/// The session ends: memory of its that others still hold leaves its
/// count for the vGPU's, until they let go ([`settle_kept`]); its tokens
/// are revoked.
pub(in crate::serve) fn keep_at_end(tables: &mut Tables, s: &mut Session) {
    super::ipc_across::close_all(s);
    let held = s.shares.exported.take_all_opened();
    let mut kept: Vec<(u64, Arc<Export>)> = held.into_iter().map(|e| (e.size, e)).collect();
    // Memory another worker of the VM has open stays with it, as the
    // driver keeps it, counted until it lets go.
    kept.extend(
        s.exported
            .take_all_opened()
            .into_iter()
            .filter(|e| e.vm_link().is_some())
            .map(|e| (e.size, e)),
    );
    kept.extend(s.shares.orphans.take_opened());
    for (charge, e) in kept {
        let charge = charge.min(s.mem_used);
        s.uncount(charge);
        tables.shares.kept.push((charge, e));
    }
}

/// Physical memory of `s` that nothing of the session holds any more was
/// freed (`handle`, counted `charge`): an import lets go of its export;
/// memory it exported that others still hold stays counted to it. Whether
/// the charge may be uncounted now.
pub(in crate::serve) fn on_dead(s: &mut Session, handle: u64, charge: u64) -> bool {
    s.shares.forget(handle);
    if let Some(e) = s.shares.exported.take_opened(handle) {
        s.shares.orphans.push(handle, charge, e);
        return false;
    }
    s.shares.exported.revoke(handle, handle.saturating_add(1));
    true
}
