//! The memory family: allocations and frees (counted against the vGPU's
//! memory limit, the stream-ordered ones done once the device passes their
//! marks), copies and memset within the caller's own memory, and the VM's
//! pinned pool.

use std::sync::atomic::Ordering;

use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::super::channel::{hold_for_departed, refuse, reply, ChannelState};
use super::super::pinned;
use super::super::shared::{Gpu, Memory, Port, Shared, Slice, Tables};
use super::super::transfer::{continue_transfer, Inbound, Transfer};
use super::super::wait::{self, Parked, Then, Wait};
use super::{one, unit};
use crate::session::Session;
use crate::Error;

/// Runs a memory request of session `s` and replies if it expects one.
pub(super) fn handle(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    let (tag, opc) = (d.tag, d.opcode);
    match req {
        Request::MemAlloc { size } => {
            let r = alloc(&sh.port, &mut sh.mem, s, size);
            if r == Err(Status::OutOfMemory) && hold_for_departed(&sh.port, c, tag) {
                c.hold = true;
                return Ok(());
            }
            reply(&sh.port, c, tag, opc, one(r), &[])
        }
        // The memory goes once the work submitted so far is done (as the
        // driver's free waits for it), without the worker waiting: the
        // guest has it no more from now on.
        Request::MemFree { ptr } if s.orphan_if_opened(ptr) => {
            // Another process has it open (IPC): freed once it closes it.
            reply(&sh.port, c, tag, opc, Ok(Reply::default()), &[])
        }
        Request::MemFree { ptr } => {
            let r = s.detach_alloc(ptr).map(|charge| match s.ctx.mark(None) {
                Ok(m) => s.deferred_frees.push((m, ptr, charge)),
                Err(_) => free_now(&mut sh.mem, s, ptr, charge),
            });
            if r.is_err() {
                refuse(&sh.port, c, "free of a pointer it does not own");
            }
            deferred_frees(sh, s);
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        Request::MemFreeAsync { ptr, stream }
            if s.check_stream(stream).is_ok() && s.orphan_if_opened(ptr) =>
        {
            // As `MemFree`: freed once the last opener closes it.
            Ok(())
        }
        Request::MemFreeAsync { ptr, stream } => {
            free_async(&sh.port, &mut sh.mem, c, s, ptr, stream);
            Ok(())
        }
        Request::PinnedAlloc { size } => {
            let r = pinned::alloc(&mut sh.gpu, size, s.id);
            if r.is_err() {
                refuse(
                    &sh.port,
                    c,
                    "pinned pool exhausted (or the block not registered)",
                );
            }
            pinned_used(&sh.port, &sh.gpu);
            reply(&sh.port, c, tag, opc, one(r), &[])
        }
        Request::PinnedFree { offset } => {
            let r = pinned::free(&mut sh.gpu, offset, s.id);
            if r.is_err() {
                refuse(&sh.port, c, "free of pinned memory it does not own");
            }
            pinned_used(&sh.port, &sh.gpu);
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        req @ (Request::MemcpyHtoDPinned { .. } | Request::MemcpyDtoHPinned { .. }) => {
            pinned_copy(&sh.port, &sh.gpu, &mut sh.slice, c, s, req);
            Ok(())
        }
        Request::MemGetInfo => {
            let limit = sh.mem.limit(&sh.port.link);
            let r = Reply {
                vals: [limit.saturating_sub(sh.mem.vgpu_used()), limit, 0, 0],
            };
            reply(&sh.port, c, tag, opc, Ok(r), &[])
        }
        Request::MemcpyHtoD { dst, len, stream } => htod(sh, c, s, d, dst, len, stream),
        Request::MemcpyDtoH { src, len, stream } => dtoh(sh, c, s, d, src, len, stream),
        Request::MemcpyDtoD {
            dst,
            src,
            len,
            stream,
        } => {
            let r = s
                .check_range(dst, len)
                .and(s.check_range(src, len))
                .and(s.check_stream(stream));
            let r = r.and_then(|()| {
                sh.slice
                    .in_period(s, stream, None, |x| x.dtod(dst, src, len, stream))
            });
            if let Err(e) = r {
                s.defer(e);
                refuse(&sh.port, c, "device-to-device copy outside its allocations");
            }
            Ok(())
        }
        Request::Memset {
            dst,
            value,
            width,
            count,
            stream,
        } => {
            let len = count * u64::from(width);
            // The process's device memory, or its mapped page-locked memory.
            let r = s
                .check_range(dst, len)
                .or_else(|e| {
                    if sh.gpu.pinned.owns_device_range(s.id, dst, len) {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .and(s.check_stream(stream));
            let r = r.and_then(|()| {
                sh.slice.in_period(s, stream, None, |x| {
                    x.memset(dst, value, width, count, stream)
                })
            });
            if let Err(e) = r {
                s.defer(e);
                refuse(&sh.port, c, "memset outside its allocations");
            }
            Ok(())
        }
        _ => super::misrouted(&sh.port, c, d, "memory"),
    }
}

/// Allocates `size` bytes for `s` if the vGPU's limit leaves room.
fn alloc(port: &Port, mem: &mut Memory, s: &mut Session, size: u64) -> Result<u64, Status> {
    // What the allocation takes on the device counts, not what was
    // asked: tiny allocations rounded up to a large granularity
    // must not add up past the limit.
    let charge = s.ctx.footprint(size);
    if !mem.reserve(charge, &port.link) {
        return Err(Status::OutOfMemory);
    }
    let r = s.ctx.alloc(size).inspect(|&p| s.add_alloc(p, size, charge));
    if r.is_err() {
        mem.sub(charge);
    }
    r
}

/// A stream-ordered free: done once the device passes the stream's work
/// so far (see [`deferred_frees`]).
fn free_async(
    port: &Port,
    mem: &mut Memory,
    c: &mut ChannelState,
    s: &mut Session,
    ptr: u64,
    stream: u64,
) {
    let r = s.check_stream(stream).and_then(|()| s.detach_alloc(ptr));
    let r = r.and_then(|charge| match s.ctx.mark(Some(stream)) {
        Ok(m) => {
            s.deferred_frees.push((m, ptr, charge));
            Ok(())
        }
        Err(e) => {
            // The allocation is the guest's no more either way.
            free_now(mem, s, ptr, charge);
            Err(e)
        }
    });
    if let Err(e) = r {
        s.defer(e);
        refuse(port, c, "stream-ordered free of a pointer it does not own");
    }
}

/// A copy between device memory and the VM's pinned pool, on the
/// session's stream; a failure is reported at its next synchronous call.
fn pinned_copy(
    port: &Port,
    gpu: &Gpu,
    slice: &mut Slice,
    c: &mut ChannelState,
    s: &mut Session,
    req: Request,
) {
    let (dev, offset, len, stream, to_device) = match req {
        Request::MemcpyHtoDPinned {
            dst,
            offset,
            len,
            stream,
        } => (dst, offset, len, stream, true),
        Request::MemcpyDtoHPinned {
            src,
            offset,
            len,
            stream,
        } => (src, offset, len, stream, false),
        _ => return,
    };
    let r = s
        .check_range(dev, len)
        .and(s.check_stream(stream))
        .and(gpu.pinned.check(s.id, offset, len))
        .and_then(|()| pinned::part(gpu, offset, len))
        .and_then(|part| {
            port.stats.copy_bytes.fetch_add(len, Ordering::Relaxed);
            slice.in_period(s, stream, None, |x| {
                if to_device {
                    x.htod(dev, &part.as_slice(), stream)
                } else {
                    x.dtoh_async(&part.as_slice(), dev, stream)
                }
            })
        });
    if let Err(e) = r {
        s.defer(e);
        let what = if to_device {
            "host-to-device copy outside its allocations"
        } else {
            "device-to-host copy outside its allocations"
        };
        refuse(port, c, what);
    }
}

/// Says how much of the pinned pool the guests hold.
fn pinned_used(port: &Port, gpu: &Gpu) {
    port.stats
        .pinned_used
        .store(gpu.pinned.used(), Ordering::Relaxed);
}

/// A host-to-device copy: checked here, its data follows in chunks
/// (`transfer.rs`).
fn htod(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    dst: u64,
    len: u64,
    stream: u64,
) -> Result<(), Error> {
    let ok = s
        .check_range(dst, len)
        .and_then(|()| s.check_stream(stream));
    match ok {
        // The copy itself follows with its data.
        Ok(()) => sh.slice.in_period(s, stream, None, |_| ()),
        Err(e) => {
            s.defer(e);
            refuse(&sh.port, c, "host-to-device copy outside its allocations");
        }
    }
    c.transfer = Some(Transfer {
        inbound: Inbound::Htod {
            dst,
            stream,
            ok: ok.is_ok(),
        },
        remaining: len,
        offset: 0,
    });
    continue_transfer(sh, c, s, d)
}

/// A device-to-host copy: parked until the work before it on its stream
/// is done, then streamed out (`wait.rs`, `transfer.rs`).
fn dtoh(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    src: u64,
    len: u64,
    stream: u64,
) -> Result<(), Error> {
    let (tag, opc) = (d.tag, d.opcode);
    let ok = s
        .check_range(src, len)
        .and_then(|()| s.check_stream(stream));
    if let Err(e) = ok {
        refuse(&sh.port, c, "device-to-host copy outside its allocations");
        return reply(&sh.port, c, tag, opc, Err(e), &[]);
    }
    // Synchronous: it streams out once the work before it on its stream
    // is done, which drains the stream: the busy period ends there (charged
    // when the device passes the mark), and the copy's own time is charged
    // chunk by chunk as it streams out (`transfer.rs`). A guest that only
    // launches and reads back (a small inference server) is charged as it
    // goes, not once a slice.
    sh.slice.in_period(s, stream, None, |_| ());
    let period = if Slice::period_ending(s, Some(stream)) {
        s.period.take()
    } else {
        None
    };
    match s.ctx.mark(Some(stream)) {
        Ok(m) => {
            let p = Parked {
                tag,
                opcode: opc,
                wait: Wait::Mark(m),
                then: Then::Dtoh { src, len, stream },
                period,
            };
            wait::park(sh, c, s, p)
        }
        Err(e) => reply(&sh.port, c, tag, opc, Err(e), &[]),
    }
}

/// Frees a detached allocation and uncounts it.
fn free_now(mem: &mut Memory, s: &mut Session, ptr: u64, charge: u64) {
    s.uncount(charge);
    mem.sub(charge);
    if let Err(e) = s.ctx.free(ptr) {
        s.defer(e);
    }
}

/// Does the stream-ordered frees whose marks the device has passed.
pub(in crate::serve) fn deferred_frees(sh: &mut Shared, s: &mut Session) {
    frees_passed(&sh.port, &mut sh.mem, &mut sh.tables, s);
}

/// See [`deferred_frees`].
fn frees_passed(port: &Port, mem: &mut Memory, tables: &mut Tables, s: &mut Session) {
    // Freed while others had them open (IPC), closed by all since.
    for (ptr, charge) in s.orphans.closed() {
        free_now(mem, s, ptr, charge);
    }
    super::share::settle(mem, tables, s);
    for (event, _) in s.event_orphans.closed() {
        if let Err(e) = s.ctx.event_destroy(event) {
            s.defer(e);
        }
    }
    if s.deferred_frees.is_empty() {
        return;
    }
    let mut pending = std::mem::take(&mut s.deferred_frees);
    let before = pending.len();
    pending.retain(|&(m, ptr, charge)| match s.ctx.reached(m) {
        Ok(false) => true,
        // Passed, or the work before failed (the free still happens).
        _ => {
            free_now(mem, s, ptr, charge);
            false
        }
    });
    let passed = pending.len() < before;
    s.deferred_frees = pending;
    if passed {
        // A passed mark synchronizes (where the driver writes the context's
        // kernel printf text): it is this process's, whichever pass this is.
        port.collect_output(Some(s.id));
    }
}
