//! IPC and shareable handles (VMM memory, pools and their allocations)
//! between the workers of a VM whose processes each have a worker of
//! their own (process slots): an export made here is also published in
//! the VM's export table (`exports.rs`) under the guest's token, with the
//! driver's handle and, where an opener needs one, an fd handed to the
//! daemon (`IPC_EXPORTED`). A token this worker does not know is looked up
//! there; the opener's worker opens the driver's handle itself
//! (`Ipc::open_mem`, `Ipc::open_event`), after asking the daemon for the
//! fd if there is one (`IPC_WANT`: the request waits parked, other
//! channels are served meanwhile). What the guest gets is an address or an
//! event of its own worker's; the memory stays the exporter's, counted to
//! it (`session/ipc.rs`).

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::{Reply, Status};
use transport::Descriptor;
use wire::feed::{encode_entry, IPC_EXPORTED, IPC_WANT};

use super::super::channel::{answer, reply, ChannelState};
use super::super::shared::{Port, Shared, Tables};
use super::super::wait::{self, Parked, Then, Wait};
use crate::executor::Portable;
pub(super) use crate::exports::Kind as OpenKind;
use crate::exports::{Entry, Kind, Publish, VmExports};
use crate::session::ipc::{Export, VmLink};
use crate::session::Session;
use crate::Error;

/// How long an open waits for the daemon to hand over an export's fd.
const FD_WAIT: Duration = Duration::from_secs(5);

/// An open waiting for its fd.
#[derive(Debug, Clone, Copy)]
pub(in crate::serve) struct OpenWait {
    kind: Kind,
    index: u16,
    gen: u32,
    size: u64,
    handle: [u8; 64],
    until: Instant,
}

/// The table and this worker's slot, where exports cross workers.
fn vm(port: &Port, tables: &Tables) -> Option<(Arc<VmExports>, u32)> {
    Some((tables.vm.clone()?, port.slot?))
}

/// Publishes what `p` says of export `e` (token `token`) in the table and
/// hands its fd to the daemon.
fn publish(
    port: &Port,
    (table, slot): (Arc<VmExports>, u32),
    e: &Export,
    token: u64,
    kind: Kind,
    p: Portable,
) -> Result<(), Status> {
    let (index, gen) = table
        .publish(&Publish {
            token,
            kind,
            owner: slot,
            size: e.size,
            handle: p.handle,
            has_fd: p.fd.is_some(),
        })
        .ok_or(Status::OutOfMemory)?;
    let v = encode_entry(IPC_EXPORTED, index, gen);
    if !port.link.say_ipc(v, p.fd.as_ref().map(AsRawFd::as_raw_fd)) && p.fd.is_some() {
        table.revoke(index, gen);
        return Err(Status::OutOfMemory);
    }
    e.link(VmLink {
        table,
        index,
        gen,
        opener: None,
    });
    Ok(())
}

/// After an export of memory (`r`: token, start, size): published for the
/// VM's other workers too, once.
pub(super) fn publish_mem(
    port: &Port,
    tables: &mut Tables,
    s: &mut Session,
    r: Reply,
) -> Result<Reply, Status> {
    let Some(vm) = vm(port, tables) else {
        return Ok(r);
    };
    let [token, base, size, _] = r.vals;
    let e = tables.ipc.get(token).ok_or(Status::InvalidValue)?;
    if e.vm_link().is_some() {
        return Ok(r);
    }
    match s.ctx.export_mem(base, size) {
        Ok(p) => publish(port, vm, &e, token, Kind::Mem, p)?,
        // Not shareable across workers here: other workers cannot open it.
        Err(Status::NotSupported) => {}
        Err(err) => return Err(err),
    }
    Ok(r)
}

/// After an export of event `event` (`r`: its token): published too, once.
pub(super) fn publish_event(
    port: &Port,
    tables: &mut Tables,
    s: &mut Session,
    event: u64,
    r: Reply,
) -> Result<Reply, Status> {
    let Some(vm) = vm(port, tables) else {
        return Ok(r);
    };
    let token = r.vals[0];
    let e = tables.ipc_events.get(token).ok_or(Status::InvalidValue)?;
    if e.vm_link().is_some() {
        return Ok(r);
    }
    match s.ctx.export_event(event) {
        Ok(p) => publish(port, vm, &e, token, Kind::Event, p)?,
        Err(Status::NotSupported) => {}
        Err(err) => return Err(err),
    }
    Ok(r)
}

/// The live entry of another worker's that `token` names, of `kind` (and
/// exported from pool `tag`, if given).
fn entry(
    table: &VmExports,
    slot: u32,
    token: u64,
    (kind, tag): (Kind, Option<u64>),
) -> Result<Entry, Status> {
    match table.find(token) {
        Some(e) if e.kind == kind && e.owner != slot && tag.is_none_or(|t| t == e.tag) => Ok(e),
        _ => Err(Status::InvalidValue),
    }
}

/// After an export of physical memory `handle` (`r`: token, size):
/// published too, once.
pub(super) fn publish_phys(
    port: &Port,
    tables: &mut Tables,
    s: &mut Session,
    handle: u64,
    r: Reply,
) -> Result<Reply, Status> {
    let Some(vm) = vm(port, tables) else {
        return Ok(r);
    };
    let e = tables
        .shares
        .vmm
        .get(r.vals[0])
        .ok_or(Status::InvalidValue)?;
    if e.vm_link().is_some() {
        return Ok(r);
    }
    match s.ctx.export_phys(handle) {
        Ok(p) => publish(port, vm, &e, r.vals[0], Kind::Phys, p)?,
        Err(Status::NotSupported) => {}
        Err(err) => return Err(err),
    }
    Ok(r)
}

/// After an export of a pool (`r`: its token): published too, once.
pub(super) fn publish_pool(port: &Port, tables: &mut Tables, r: Reply) -> Result<Reply, Status> {
    let Some(vm) = vm(port, tables) else {
        return Ok(r);
    };
    let e = tables
        .shares
        .pools
        .get(r.vals[0])
        .ok_or(Status::InvalidValue)?;
    if e.vm_link().is_none() {
        let p = Portable {
            handle: [0; 64],
            fd: None,
        };
        publish(port, vm, &e, r.vals[0], Kind::Pool, p)?;
    }
    Ok(r)
}

/// After an export of a pool's allocation (`r`: token, start, size):
/// published too, tagged with the pool's token.
pub(super) fn publish_pointer(
    port: &Port,
    tables: &mut Tables,
    s: &mut Session,
    pool: u64,
    r: Reply,
) -> Result<Reply, Status> {
    let r = publish_mem(port, tables, s, r)?;
    if let Some(l) = tables
        .ipc
        .get(r.vals[0])
        .as_deref()
        .and_then(Export::vm_link)
    {
        l.table.set_tag(l.index, l.gen, pool);
    }
    Ok(r)
}

/// Records another worker's pool as imported by the session.
pub(super) fn pool_import(
    port: &Port,
    tables: &mut Tables,
    s: &mut Session,
    token: u64,
) -> Result<Reply, Status> {
    let (table, slot) = vm(port, tables).ok_or(Status::InvalidValue)?;
    let e = entry(&table, slot, token, (Kind::Pool, None))?;
    let link = VmLink {
        table,
        index: e.index,
        gen: e.gen,
        opener: Some(slot),
    };
    s.shares
        .pool_imported(token, Export::opened_remote(0, 0, link))?;
    Ok(Reply::default())
}

/// Opens memory or an event (`kind`) another worker of the VM exported
/// under `token`: at once if it needs no fd, else once the daemon handed
/// it over (parked).
pub(super) fn open(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    token: u64,
    (kind, tag): (Kind, Option<u64>),
) -> Result<(), Error> {
    const WHY: &str = "open of a token no other process of the VM exports";
    let e = match vm(&sh.port, &sh.tables).map(|(t, slot)| entry(&t, slot, token, (kind, tag))) {
        Some(Ok(e)) => e,
        Some(Err(err)) => return answer(&sh.port, c, d.tag, d.opcode, Err(err), WHY),
        None => return answer(&sh.port, c, d.tag, d.opcode, Err(Status::InvalidValue), WHY),
    };
    if let Some(base) = s
        .imports
        .remote_base(e.index, e.gen)
        .filter(|_| kind == Kind::Mem)
    {
        let r = s.imports.open_again(base).map(|()| Reply {
            vals: [base, e.size, 0, 0],
        });
        return answer(&sh.port, c, d.tag, d.opcode, r, WHY);
    }
    if let Some(h) = s
        .shares
        .remote_import(e.index, e.gen)
        .filter(|_| kind == Kind::Phys)
    {
        let r = if s.vmm.hold(h) {
            Ok(Reply {
                vals: [h, e.size, 0, 0],
            })
        } else {
            Err(Status::InvalidValue)
        };
        return answer(&sh.port, c, d.tag, d.opcode, r, WHY);
    }
    if kind == Kind::Event && s.imported_events.len() >= crate::session::ipc::MAX_EXPORTS {
        return answer(&sh.port, c, d.tag, d.opcode, Err(Status::OutOfMemory), WHY);
    }
    let w = OpenWait {
        kind,
        index: e.index,
        gen: e.gen,
        size: e.size,
        handle: e.handle,
        until: Instant::now() + FD_WAIT,
    };
    if !e.has_fd {
        let r = finish(&sh.port, &sh.tables, s, w, None);
        return answer(&sh.port, c, d.tag, d.opcode, r, WHY);
    }
    if !sh
        .port
        .link
        .say_ipc(encode_entry(IPC_WANT, e.index, e.gen), None)
    {
        return answer(&sh.port, c, d.tag, d.opcode, Err(Status::InvalidValue), WHY);
    }
    let p = Parked {
        tag: d.tag,
        opcode: d.opcode,
        wait: Wait::IpcFd(w),
        then: Then::Reply,
        period: None,
    };
    wait::park(sh, c, s, p)
}

/// Opens entry `w` with `fd` (if it has one) and records it: the start
/// and size of memory in this worker, or an event handle of the session's.
fn finish(
    port: &Port,
    tables: &Tables,
    s: &mut Session,
    w: OpenWait,
    fd: Option<std::os::fd::OwnedFd>,
) -> Result<Reply, Status> {
    let (table, slot) = vm(port, tables).ok_or(Status::InvalidValue)?;
    // Marked open first: the exporter keeps it from then on.
    if !table.open(w.index, w.gen, slot) {
        return Err(Status::InvalidValue);
    }
    let link = VmLink {
        table: table.clone(),
        index: w.index,
        gen: w.gen,
        opener: Some(slot),
    };
    let p = Portable {
        handle: w.handle,
        fd,
    };
    if w.kind == Kind::Phys {
        let h = match s.ctx.open_phys(w.size, p) {
            Ok(h) => h,
            Err(err) => {
                table.close(w.index, w.gen, slot);
                return Err(err);
            }
        };
        if let Err(err) = s.shares.imported(h, Export::opened_remote(h, w.size, link)) {
            let _ = s.ctx.vmm_release(h);
            return Err(err);
        }
        // Counted to the exporter, not here.
        s.vmm.created(h, w.size, 0);
        return Ok(Reply {
            vals: [h, w.size, 0, 0],
        });
    }
    if w.kind == Kind::Event {
        // One open mark per entry for the session, however many handles.
        let proxy = s.imported_events.remote(w.index, w.gen);
        let h = match s.ctx.open_event(p) {
            Ok(h) => h,
            Err(err) => {
                if proxy.is_none() {
                    table.close(w.index, w.gen, slot);
                }
                return Err(err);
            }
        };
        let proxy = proxy.unwrap_or_else(|| Export::opened_remote(0, 0, link));
        s.imported_events.insert(h, proxy);
        return Ok(Reply::one(h));
    }
    let base = match s.ctx.open_mem(w.size, p) {
        Ok(b) => b,
        Err(err) => {
            table.close(w.index, w.gen, slot);
            return Err(err);
        }
    };
    if let Err(err) = s.imports.open(Export::opened_remote(base, w.size, link)) {
        let _ = s.ctx.close_opened(base);
        return Err(err);
    }
    Ok(Reply {
        vals: [base, w.size, 0, 0],
    })
}

/// A parked open: finished once the daemon's answer came (or refused at
/// its deadline). True when it finished.
pub(in crate::serve) fn poll_open(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    w: OpenWait,
) -> Result<bool, Error> {
    let fd = match sh.port.link.ipc_answer(w.index, w.gen) {
        Some(fd) => fd,
        None if Instant::now() < w.until && !sh.port.link.orphaned() => return Ok(false),
        None => None,
    };
    let Some(p) = c.parked.take() else {
        return Ok(false);
    };
    let r = match fd {
        Some(fd) => finish(&sh.port, &sh.tables, s, w, Some(fd)),
        // The export went before its fd could be handed over.
        None => Err(Status::InvalidValue),
    };
    reply(&sh.port, c, p.tag, p.opcode, r, &[])?;
    Ok(true)
}

/// The session ends: what it opened of other workers' is closed on its
/// context (which may serve the next process).
pub(in crate::serve) fn close_all(s: &mut Session) {
    for base in s.imports.remote() {
        let _ = s.ctx.close_opened(base);
    }
}
