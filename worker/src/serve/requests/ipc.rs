//! The IPC requests (cuIpcGetMemHandle, cuIpcOpenMemHandle,
//! cuIpcCloseMemHandle, cuIpcGetEventHandle, cuIpcOpenEventHandle): each
//! checked against the session's own tables and the worker's exports
//! (`session::ipc`), or, where each process of the VM has a worker of its
//! own, the VM's export table (`exports.rs`, `across.rs`), answered.

use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::super::channel::{answer, ChannelState};
use super::super::shared::{Shared, Tables};
use crate::session::Session;
use crate::Error;

use super::ipc_across as across;

/// Runs an IPC request of session `s` and replies.
pub(super) fn handle(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    super::share::settle_kept(&mut sh.mem, &mut sh.tables);
    let slot = sh.port.slot;
    let tables = &mut sh.tables;
    let (r, why) = match req {
        Request::IpcExport { ptr } => (
            export(tables, s, ptr).and_then(|r| across::publish_mem(&sh.port, tables, s, r)),
            "export of memory it does not own, or one export too many",
        ),
        Request::IpcOpen { token } => match open(tables, s, token) {
            Err(Status::InvalidValue) if tables.vm.is_some() && slot.is_some() => {
                return across::open(sh, c, s, d, token, (across::OpenKind::Mem, None));
            }
            r => (r, "open of a token no other process of the VM exports"),
        },
        Request::IpcClose { ptr } => (close(s, ptr), "close of memory it has not opened"),
        Request::IpcExportEvent { event } => (
            export_event(tables, s, event)
                .and_then(|r| across::publish_event(&sh.port, tables, s, event, r)),
            "export of an event it did not make, or one export too many",
        ),
        Request::IpcOpenEvent { token } => match open_event(tables, s, token) {
            Err(Status::InvalidValue) if tables.vm.is_some() && slot.is_some() => {
                return across::open(sh, c, s, d, token, (across::OpenKind::Event, None));
            }
            r => (
                r,
                "open of an event token no other process of the VM exports",
            ),
        },
        _ => (Err(Status::InvalidValue), "not an IPC request"),
    };
    answer(&sh.port, c, d.tag, d.opcode, r, why)
}

/// Closes memory opened at `ptr` once (another worker's, or a process's
/// of this worker).
fn close(s: &mut Session, ptr: u64) -> Result<Reply, Status> {
    let remote = s.imports.is_remote(ptr);
    let last = s.imports.close(ptr)?;
    if last {
        if remote {
            let _ = s.ctx.close_opened(ptr);
        } else {
            s.ctx.close_mem(ptr);
        }
    }
    Ok(Reply::default())
}

/// The token of the allocation or mapping holding `ptr` (made on the
/// first export), its start and size.
pub(super) fn export(tables: &mut Tables, s: &mut Session, ptr: u64) -> Result<Reply, Status> {
    let (base, size) = s.exportable(ptr).ok_or(Status::InvalidValue)?;
    let token = match s.exported.token(base) {
        Some(t) => t,
        None => {
            let mem = s.ctx.share_mem(base, size)?;
            let (t, e) = tables.ipc.add(s.id, base, size, mem)?;
            s.exported.insert(t, e);
            t
        }
    };
    Ok(Reply {
        vals: [token, base, size, 0],
    })
}

/// Opens another session's export: its start and size.
pub(super) fn open(tables: &mut Tables, s: &mut Session, token: u64) -> Result<Reply, Status> {
    let e = tables.ipc.get(token).ok_or(Status::InvalidValue)?;
    if e.owner == s.id {
        // As the driver answers a process opening its own handle.
        return Err(Status::InvalidContext);
    }
    if s.imports.open(e.clone())? {
        if let Err(err) = s.ctx.import_mem(e.base, e.size, &e.mem) {
            let _ = s.imports.close(e.base);
            return Err(err);
        }
    }
    Ok(Reply {
        vals: [e.base, e.size, 0, 0],
    })
}

/// The token of one of the session's own events (made on its first
/// export).
fn export_event(tables: &mut Tables, s: &mut Session, event: u64) -> Result<Reply, Status> {
    s.check_own_event(event)?;
    let token = match s.exported_events.token(event) {
        Some(t) => t,
        None => {
            let shared = s.ctx.share_event(event)?;
            let (t, e) = tables.ipc_events.add(s.id, event, 0, shared)?;
            s.exported_events.insert(t, e);
            t
        }
    };
    Ok(Reply::one(token))
}

/// Opens another session's exported event: a handle of this session's.
fn open_event(tables: &mut Tables, s: &mut Session, token: u64) -> Result<Reply, Status> {
    let e = tables.ipc_events.get(token).ok_or(Status::InvalidValue)?;
    if e.owner == s.id {
        return Err(Status::InvalidContext);
    }
    if s.imported_events.len() >= crate::session::ipc::MAX_EXPORTS {
        return Err(Status::OutOfMemory);
    }
    let h = s.ctx.import_event(&e.mem)?;
    s.imported_events.insert(h, e);
    Ok(Reply::one(h))
}
