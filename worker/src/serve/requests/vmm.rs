//! The virtual memory management requests (cuMemAddressReserve,
//! cuMemCreate, cuMemMap and the rest): each checked against the session's
//! own table (`session::vmm`), run on the executor, answered. Physical
//! memory counts against the vGPU's memory limit exactly as `MemAlloc`
//! does, until it is both released and unmapped (or the session ends: the
//! executor context frees it all, and the session's count goes with it).

use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::super::channel::{answer, ChannelState};
use super::super::shared::{Memory, Port, Tables};
use crate::session::vmm::Dead;
use crate::session::Session;
use crate::Error;

/// Runs a VMM request of session `s` and replies.
pub(super) fn handle(
    port: &Port,
    mem: &mut Memory,
    tables: &mut Tables,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    let (r, why) = run(port, mem, tables, s, req);
    answer(port, c, d.tag, d.opcode, r, why)
}

fn run(
    port: &Port,
    mem: &mut Memory,
    tables: &mut Tables,
    s: &mut Session,
    req: Request,
) -> (Result<Reply, Status>, &'static str) {
    let unit = |r: Result<(), Status>| r.map(|()| Reply::default());
    match req {
        Request::VmmReserve { size, align, addr } => (
            s.ctx.vmm_reserve(size, align, addr).map(|p| {
                s.vmm.reserved(p, size);
                Reply::one(p)
            }),
            "address reservation failed",
        ),
        Request::VmmAddressFree { ptr, size } => (
            unit(
                s.vmm
                    .address_free(ptr, size)
                    .and_then(|()| s.ctx.vmm_address_free(ptr, size)),
            ),
            "free of a reservation it does not hold whole, or still mapped",
        ),
        Request::VmmCreate { size, compression } => {
            // Counted as `MemAlloc` counts: what it takes on the device.
            let r = if !mem.reserve(size, &port.link) {
                Err(Status::OutOfMemory)
            } else {
                let r = s.ctx.vmm_create(size, compression).map(|h| {
                    s.vmm.created(h, size, size);
                    s.mem_used += size;
                    // The compression the device gave, which the guest's
                    // cuMemGetAllocationPropertiesFromHandle answers.
                    let granted = s.ctx.vmm_compression(h).unwrap_or(0);
                    Reply {
                        vals: [h, u64::from(granted), 0, 0],
                    }
                });
                r.inspect_err(|_| mem.sub(size))
            };
            (r, "physical memory over the vGPU's limit")
        }
        Request::VmmRelease { handle } => (
            unit(s.vmm.release(handle).map(|dead| bury(mem, tables, s, dead))),
            "release of a handle it does not hold",
        ),
        Request::VmmMap {
            ptr,
            size,
            offset,
            handle,
        } => {
            let r = s
                .vmm
                .check_map(ptr, size, offset, handle)
                .and_then(|()| s.ctx.vmm_map(ptr, size, offset, handle))
                .map(|()| s.vmm.mapped(ptr, size, handle));
            (
                unit(r),
                "map of a handle it does not hold, outside its reservations, or over a mapping",
            )
        }
        Request::VmmUnmap { ptr, size } => {
            let r = s.vmm.covering(ptr, size).and_then(|parts| {
                for (p, n) in parts {
                    s.exported.revoke(p, p + n);
                    s.ctx.vmm_unmap(p, n)?;
                    let dead = s.vmm.unmapped(p);
                    bury(mem, tables, s, dead);
                }
                Ok(())
            });
            (
                unit(r),
                "unmap of a range that is not whole mappings of its own",
            )
        }
        Request::VmmSetAccess { ptr, size, .. } => {
            // The executor made every mapping readable and writable from
            // the vGPU's device when it mapped it; read-only is kept as
            // read-write.
            let r = if s.vmm.covers(ptr, size) {
                Ok(Reply::default())
            } else {
                Err(Status::InvalidValue)
            };
            (r, "access set on memory it has not mapped")
        }
        Request::VmmRetain { ptr } => (
            s.vmm.retain(ptr).map(|(h, size)| Reply {
                vals: [h, size, u64::from(s.ctx.vmm_compression(h).unwrap_or(0)), 0],
            }),
            "retain of an address it has not mapped",
        ),
        _ => (Err(Status::InvalidValue), "not a VMM request"),
    }
}

/// Frees physical memory nothing holds any more, and uncounts it.
fn bury(mem: &mut Memory, tables: &mut Tables, s: &mut Session, dead: Option<Dead>) {
    let Some(d) = dead else { return };
    if let Err(e) = s.ctx.vmm_release(d.handle) {
        tracing::warn!(?e, "releasing physical memory failed");
    }
    // Memory exported through a shareable handle that another process
    // still holds stays counted until it lets go (`share.rs`).
    if super::share::on_dead(s, d.handle, d.charge) {
        s.uncount(d.charge);
        mem.sub(d.charge);
    }
    super::share::settle(mem, tables, s);
}
