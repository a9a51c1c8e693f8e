//! What each request does: checked against the caller's session
//! (`crate::session`), run on the executor, answered.

use std::sync::atomic::Ordering;

use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::channel::{refuse, reply, Chan};
use super::shared::{Shared, Slice};
use super::transfer::{continue_transfer, skip_data, start_module, Inbound, Sliced, Transfer};
use super::wait::{self, Parked, Then, Wait};
use crate::executor::{Handle, Launch};
use crate::session::Session;
use crate::Error;

/// Longest kernel name accepted.
const MAX_NAME: u32 = 4096;
/// Bytes of graph data the host takes (a graph of `protocol::graph::MAX_NODES`
/// nodes with a few hundred parameter bytes each).
const MAX_GRAPH_BYTES: usize = 16 << 20;
use protocol::tensor_map::{TensorMapParams, PARAMS_BYTES};
/// How long a `WaitHostFn` waits before answering "none yet".
const HOST_FN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs a channel's request (its first descriptor; the data chunks that
/// follow go to [`super::transfer::continue_transfer`]) for session `s`.
pub(super) fn handle(
    sh: &mut Shared,
    c: &mut Chan,
    s: &mut Session,
    d: &Descriptor,
) -> Result<(), Error> {
    if c.transfer.is_some() {
        // A new request while data was still owed: the guest broke the stream.
        c.transfer = None;
        refuse(
            &sh.port,
            c,
            "request before the previous one's data was complete",
        );
        s.defer(Status::InvalidValue);
    }
    let req = match Request::decode(d.opcode, &d.inline) {
        Ok(r) => r,
        Err(e) => {
            refuse(&sh.port, c, &e.to_string());
            if d.flags & transport::FLAG_NO_REPLY == 0 {
                return reply(&sh.port, c, d.tag, d.opcode, Err(Status::InvalidValue), &[]);
            }
            s.defer(Status::InvalidValue);
            return Ok(());
        }
    };
    let tag = d.tag;
    let opc = d.opcode;
    // Synchronous calls first report an earlier asynchronous failure.
    if req.expects_reply() && !matches!(req, Request::Hello { .. }) {
        if let Some(err) = s.pending_error.take() {
            if let Request::ModuleLoad { len, kind } = req {
                // Still swallow the image that follows.
                start_module(c, tag, kind, len, d)?;
                c.transfer = None;
                skip_data(c, d, len);
            }
            super::wait::written_at_fault(s, err);
            return reply(&sh.port, c, tag, opc, Err(err), &[]);
        }
    }
    let one = |r: Result<u64, Status>| r.map(Reply::one);
    let unit = |r: Result<(), Status>| r.map(|()| Reply::default());
    match req {
        req @ (Request::VmmReserve { .. }
        | Request::VmmAddressFree { .. }
        | Request::VmmCreate { .. }
        | Request::VmmRelease { .. }
        | Request::VmmMap { .. }
        | Request::VmmUnmap { .. }
        | Request::VmmSetAccess { .. }
        | Request::VmmRetain { .. }) => super::vmm::handle(sh, c, s, tag, opc, req),
        req @ (Request::IpcExport { .. }
        | Request::IpcOpen { .. }
        | Request::IpcClose { .. }
        | Request::IpcExportEvent { .. }
        | Request::IpcOpenEvent { .. }) => super::ipc::handle(sh, c, s, tag, opc, req),
        req @ (Request::VmmExport { .. }
        | Request::VmmImport { .. }
        | Request::PoolExport { .. }
        | Request::PoolImport { .. }
        | Request::PoolExportPointer { .. }
        | Request::PoolImportPointer { .. }) => super::share::handle(sh, c, s, tag, opc, req),
        req @ (Request::ArrayCreate { .. }
        | Request::ArrayDestroy { .. }
        | Request::ArrayCopy { .. }
        | Request::TexCreate
        | Request::TexDestroy { .. }
        | Request::SurfCreate { .. }
        | Request::SurfDestroy { .. }) => super::arrays::handle(sh, c, s, d, req),
        // A second Hello on a channel: the device again (its session stays).
        Request::Hello { version } => {
            let r = if version == protocol::PROTOCOL_VERSION {
                Ok(Reply::default())
            } else {
                Err(Status::NotSupported)
            };
            let info = sh.port.info_bytes.clone();
            reply(&sh.port, c, tag, opc, r, &info)
        }
        Request::TakeOutput => {
            // A message's worth of the process's oldest text, with its
            // stream; stream 0 and no bytes: nothing held.
            let max = sh.port.chunk;
            let taken = c
                .session
                .and_then(|id| sh.port.output.borrow_mut().take(id, max));
            let (stream, text) = taken.unwrap_or((0, Vec::new()));
            reply(
                &sh.port,
                c,
                tag,
                opc,
                Ok(Reply::one(u64::from(stream))),
                &text,
            )
        }
        Request::VgpuStatus { .. } => {
            refuse(
                &sh.port,
                c,
                "VgpuStatus on a session's channel (ask before Hello)",
            );
            reply(&sh.port, c, tag, opc, Err(Status::InvalidValue), &[])
        }
        Request::Join { .. } => {
            refuse(&sh.port, c, "join on a channel already serving a session");
            reply(&sh.port, c, tag, opc, Err(Status::InvalidValue), &[])
        }
        Request::CtxSynchronize => park_drain(sh, c, s, tag, opc, None),
        Request::MemAlloc { size } => {
            // What the allocation takes on the device counts, not what was
            // asked: tiny allocations rounded up to a large granularity
            // must not add up past the limit.
            let charge = s.ctx.footprint(size);
            let r = if sh.mem.used.saturating_add(charge) > sh.mem.limit(&sh.port.link) {
                Err(Status::OutOfMemory)
            } else {
                s.ctx.alloc(size).inspect(|&p| s.add_alloc(p, size, charge))
            };
            if r.is_ok() {
                sh.mem.add(charge);
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
                Err(_) => free_now(sh, s, ptr, charge),
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
            let r = s.check_stream(stream).and_then(|()| s.detach_alloc(ptr));
            let r = r.and_then(|charge| match s.ctx.mark(Some(stream)) {
                Ok(m) => {
                    s.deferred_frees.push((m, ptr, charge));
                    Ok(())
                }
                Err(e) => {
                    // The allocation is the guest's no more either way.
                    free_now(sh, s, ptr, charge);
                    Err(e)
                }
            });
            if let Err(e) = r {
                s.defer(e);
                refuse(
                    &sh.port,
                    c,
                    "stream-ordered free of a pointer it does not own",
                );
            }
            Ok(())
        }
        Request::HostFn { stream, id } => {
            let r = s
                .check_stream(stream)
                .and_then(|()| s.ctx.mark(Some(stream)));
            match r {
                Ok(m) if id != 0 => {
                    s.host_fn = Some(crate::session::HostFnWait {
                        id,
                        mark: Some(m),
                        ready: None,
                        delivered: false,
                    });
                }
                Ok(m) => {
                    s.ctx.forget(m);
                    s.defer(Status::InvalidValue);
                    refuse(&sh.port, c, "host function numbered 0");
                }
                Err(e) => {
                    s.defer(e);
                    refuse(&sh.port, c, "host function on a stream it does not own");
                }
            }
            Ok(())
        }
        Request::WaitHostFn => {
            let p = Parked {
                tag,
                opcode: opc,
                wait: Wait::HostFn {
                    until: std::time::Instant::now() + HOST_FN_WAIT,
                },
                then: Then::Reply,
                period: None,
            };
            wait::park(sh, c, s, p)
        }
        Request::HostFnDone { id } => {
            match &s.host_fn {
                Some(h) if h.id == id && h.delivered => s.host_fn = None,
                _ => refuse(&sh.port, c, "host function done that was not handed out"),
            }
            Ok(())
        }
        Request::PinnedAlloc { size } => {
            let r = sh.gpu.pinned.alloc(size, s.id);
            if r.is_err() {
                refuse(&sh.port, c, "pinned pool exhausted");
            }
            sh.port
                .stats
                .pinned_used
                .store(sh.gpu.pinned.used(), Ordering::Relaxed);
            reply(&sh.port, c, tag, opc, one(r), &[])
        }
        Request::PinnedFree { offset } => {
            let r = sh.gpu.pinned.free(offset, s.id);
            if r.is_err() {
                refuse(&sh.port, c, "free of pinned memory it does not own");
            }
            sh.port
                .stats
                .pinned_used
                .store(sh.gpu.pinned.used(), Ordering::Relaxed);
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        Request::MemcpyHtoDPinned {
            dst,
            offset,
            len,
            stream,
        } => {
            let r = s
                .check_range(dst, len)
                .and(s.check_stream(stream))
                .and(sh.gpu.pinned.check(s.id, offset, len))
                .and_then(|()| super::pinned::part(sh, offset, len))
                .and_then(|part| {
                    sh.port.stats.copy_bytes.fetch_add(len, Ordering::Relaxed);
                    sh.slice
                        .in_period(s, stream, None, |x| x.htod(dst, &part.as_slice(), stream))
                });
            if let Err(e) = r {
                s.defer(e);
                refuse(&sh.port, c, "host-to-device copy outside its allocations");
            }
            Ok(())
        }
        Request::MemcpyDtoHPinned {
            src,
            offset,
            len,
            stream,
        } => {
            let r = s
                .check_range(src, len)
                .and(s.check_stream(stream))
                .and(sh.gpu.pinned.check(s.id, offset, len))
                .and_then(|()| super::pinned::part(sh, offset, len))
                .and_then(|part| {
                    sh.port.stats.copy_bytes.fetch_add(len, Ordering::Relaxed);
                    sh.slice.in_period(s, stream, None, |x| {
                        x.dtoh_async(&part.as_slice(), src, stream)
                    })
                });
            if let Err(e) = r {
                s.defer(e);
                refuse(&sh.port, c, "device-to-host copy outside its allocations");
            }
            Ok(())
        }
        Request::MemGetInfo => {
            let r = Reply {
                vals: [
                    sh.mem.limit(&sh.port.link).saturating_sub(sh.mem.used),
                    sh.mem.limit(&sh.port.link),
                    0,
                    0,
                ],
            };
            reply(&sh.port, c, tag, opc, Ok(r), &[])
        }
        Request::MemcpyHtoD { dst, len, stream } => {
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
        Request::MemcpyDtoH { src, len, stream } => {
            let ok = s
                .check_range(src, len)
                .and_then(|()| s.check_stream(stream));
            match ok {
                Err(e) => {
                    refuse(&sh.port, c, "device-to-host copy outside its allocations");
                    reply(&sh.port, c, tag, opc, Err(e), &[])
                }
                Ok(()) => {
                    // Synchronous: its own time is the device's. It streams
                    // out once the work before it on its stream is done.
                    sh.slice.in_period(s, stream, None, |_| ());
                    match s.ctx.mark(Some(stream)) {
                        Ok(m) => {
                            let p = Parked {
                                tag,
                                opcode: opc,
                                wait: Wait::Mark(m),
                                then: Then::Dtoh { src, len, stream },
                                period: None,
                            };
                            wait::park(sh, c, s, p)
                        }
                        Err(e) => reply(&sh.port, c, tag, opc, Err(e), &[]),
                    }
                }
            }
        }
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
        Request::ModuleLoad { kind, len } => {
            start_module(c, tag, kind, len, d)?;
            continue_transfer(sh, c, s, d)
        }
        Request::ModuleUnload { module } => {
            let r = s
                .check_module(module)
                .and_then(|()| s.ctx.unload_module(module));
            if r.is_ok() {
                s.remove_module(module);
            }
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        Request::ModuleGetFunction { module } => {
            let mut name = vec![0u8; d.data_len.min(MAX_NAME) as usize];
            c.host.req.data(d)?.copy_to(&mut name[..]);
            let r = match (s.check_module(module), std::str::from_utf8(&name)) {
                (Err(e), _) => Err(e),
                (_, Err(_)) => Err(Status::InvalidValue),
                (Ok(()), Ok(n)) => s.ctx.function(module, n.trim_end_matches('\0')),
            };
            match r {
                Ok((h, params)) => {
                    let bytes = protocol::Param::encode_all(&params);
                    s.add_function(h, params.iter().map(|p| p.size).collect());
                    reply(&sh.port, c, tag, opc, Ok(Reply::one(h)), &bytes)
                }
                Err(e) => reply(&sh.port, c, tag, opc, Err(e), &[]),
            }
        }
        Request::ModuleFunctions { module, first } => {
            let r = s
                .check_module(module)
                .and_then(|()| s.ctx.function_names(module));
            match r {
                Ok(names) => {
                    // From `first` on, as many names as one message holds.
                    let mut data = Vec::new();
                    for n in names.iter().skip(first as usize) {
                        if data.len() + n.len() + 1 > sh.port.chunk {
                            break;
                        }
                        data.extend_from_slice(n.as_bytes());
                        data.push(0);
                    }
                    if data.is_empty() && (first as usize) < names.len() {
                        refuse(&sh.port, c, "kernel name longer than one arena chunk");
                        return reply(&sh.port, c, tag, opc, Err(Status::NotSupported), &[]);
                    }
                    let count = Reply::one(names.len() as u64);
                    reply(&sh.port, c, tag, opc, Ok(count), &data)
                }
                Err(e) => reply(&sh.port, c, tag, opc, Err(e), &[]),
            }
        }
        Request::Occupancy {
            func,
            block_size,
            shared_mem,
        } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.occupancy(func, block_size, shared_mem))
                .map(|v| Reply::one(u64::from(v as u32)));
            reply(&sh.port, c, tag, opc, r, &[])
        }
        Request::OccupancySmem {
            func,
            num_blocks,
            block_size,
        } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.available_smem(func, num_blocks, block_size));
            reply(&sh.port, c, tag, opc, one(r), &[])
        }
        Request::OccupancyClusters {
            func,
            grid,
            block,
            shared_mem,
            cluster,
            potential,
        } => {
            let shape = crate::executor::Launch {
                func,
                grid,
                block,
                shared_mem,
            };
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.occupancy_clusters(shape, cluster, potential))
                .map(|v| Reply::one(u64::from(v as u32)));
            reply(&sh.port, c, tag, opc, r, &[])
        }
        Request::ModuleLoadCached { kind, len, hash } => {
            let r = match sh.gpu.images.get(&hash, kind, len) {
                Some(image) => s
                    .ctx
                    .load_module(kind, image.bytes())
                    .inspect(|&m| s.add_module(m)),
                None => Err(Status::NotFound),
            };
            reply(&sh.port, c, tag, opc, r.map(Reply::one), &[])
        }
        Request::TensorMapEncode => {
            let mut b = vec![0u8; d.data_len.min(PARAMS_BYTES as u32) as usize];
            c.host.req.data(d)?.copy_to(&mut b[..]);
            let r = TensorMapParams::decode(&b)
                .map_err(|_| Status::InvalidValue)
                .and_then(|p| {
                    // The tensor must be the caller's own memory.
                    s.check_range(p.address, p.span())?;
                    s.ctx.tensor_map(&p)
                });
            match r {
                Ok(map) => reply(&sh.port, c, tag, opc, Ok(Reply::default()), &map),
                Err(e) => reply(&sh.port, c, tag, opc, Err(e), &[]),
            }
        }
        Request::ModuleGetGlobal { module } => {
            let mut name = vec![0u8; d.data_len.min(MAX_NAME) as usize];
            c.host.req.data(d)?.copy_to(&mut name[..]);
            let r = match (s.check_module(module), std::str::from_utf8(&name)) {
                (Err(e), _) => Err(e),
                (_, Err(_)) => Err(Status::InvalidValue),
                (Ok(()), Ok(n)) => s.ctx.module_global(module, n.trim_end_matches('\0')),
            };
            let r = r.map(|(p, size)| {
                s.add_global(p, size);
                Reply {
                    vals: [p, size, 0, 0],
                }
            });
            reply(&sh.port, c, tag, opc, r, &[])
        }
        Request::Link { len } => {
            c.transfer = Some(Transfer {
                inbound: Inbound::Link {
                    buf: Vec::new(),
                    tag,
                },
                remaining: len,
                offset: 0,
            });
            continue_transfer(sh, c, s, d)
        }
        Request::GraphInstantiate { len } => graph_data(sh, c, s, d, tag, opc, len, None),
        Request::GraphInstantiateIn { scope, len } => {
            if let Err(e) = s.conds.check_scope(scope) {
                refuse(
                    &sh.port,
                    c,
                    "graph for a conditional scope the process does not hold",
                );
                skip_data(c, d, u64::from(len));
                return reply(&sh.port, c, tag, opc, Err(e), &[]);
            }
            graph_data(sh, c, s, d, tag, opc, len, Some(scope))
        }
        Request::CondScopeCreate => {
            let r = s
                .conds
                .room()
                .and_then(|()| s.ctx.cond_scope_create())
                .inspect(|&h| s.conds.add_scope(h));
            reply(&sh.port, c, tag, opc, r.map(Reply::one), &[])
        }
        Request::CondHandleCreate {
            scope,
            default_value,
            flags,
        } => {
            let r = s
                .conds
                .handle_room(scope)
                .and_then(|()| s.ctx.cond_handle_create(scope, default_value, flags))
                .inspect(|&h| s.conds.add_handle(scope, h));
            reply(&sh.port, c, tag, opc, r.map(Reply::one), &[])
        }
        Request::CondScopeDestroy { scope } => {
            let r = s
                .conds
                .check_scope(scope)
                .and_then(|()| s.ctx.cond_scope_destroy(scope));
            if r.is_ok() {
                s.conds.remove_scope(scope);
            }
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        Request::GraphLaunch { exec, stream } => {
            let r = s
                .check_graph(exec)
                .and(s.check_stream(stream))
                .and_then(|()| {
                    sh.slice
                        .in_period(s, stream, None, |x| x.graph_launch(exec, stream))
                });
            if let Err(e) = r {
                s.defer(e);
                refuse(&sh.port, c, "graph launch refused");
            }
            Ok(())
        }
        Request::GraphDestroy { exec } => {
            let r = s.check_graph(exec).and_then(|()| s.ctx.graph_destroy(exec));
            if r.is_ok() {
                s.remove_graph(exec);
            }
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        Request::FuncGetAttribute { func, attr } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.func_attribute(func, attr))
                .map(|v| Reply::one(u64::from(v as u32)));
            reply(&sh.port, c, tag, opc, r, &[])
        }
        Request::Launch {
            func,
            grid,
            block,
            shared_mem,
            stream,
            cluster,
            flags,
        } if cluster != protocol::Dim3::default() || flags != 0 => {
            // Clusters and cooperative grids go one by one, never batched
            // nor sliced (a sliced cooperative grid could not sync).
            let r = s.function(func).and_then(|sizes| {
                let want: u64 = sizes.iter().map(|&x| u64::from(x)).sum();
                if want != u64::from(d.data_len) {
                    return Err(Status::InvalidValue);
                }
                Ok(())
            });
            let r = r.and(s.check_stream(stream)).and_then(|()| {
                let mut params = vec![0u8; d.data_len as usize];
                c.host
                    .req
                    .data(d)
                    .map_err(|_| Status::InvalidValue)?
                    .copy_to(&mut params[..]);
                sh.port.stats.launches.fetch_add(1, Ordering::Relaxed);
                let coop = flags & protocol::launch_flags::COOPERATIVE != 0;
                sh.slice.in_period(s, stream, Some(func), |x| {
                    x.launch_ex(
                        func, grid, block, shared_mem, stream, &params, cluster, coop,
                    )
                })
            });
            if let Err(e) = r {
                s.defer(e);
                refuse(&sh.port, c, "launch refused");
            }
            Ok(())
        }
        Request::Launch {
            func,
            grid,
            block,
            shared_mem,
            stream,
            ..
        } => {
            let shape = Launch {
                func,
                grid,
                block,
                shared_mem,
            };
            let r = s.function(func).and_then(|sizes| {
                let want: u64 = sizes.iter().map(|&x| u64::from(x)).sum();
                if want != u64::from(d.data_len) {
                    return Err(Status::InvalidValue);
                }
                Ok(())
            });
            let scheduled = sh.slice.gate.is_some();
            let r = r.and(s.check_stream(stream)).and_then(|()| {
                // The buffer is reused from launch to launch (a sliced launch keeps it).
                let mut params = std::mem::take(&mut sh.slice.params);
                params.clear();
                params.resize(d.data_len as usize, 0);
                c.host
                    .req
                    .data(d)
                    .map_err(|_| Status::InvalidValue)?
                    .copy_to(&mut params[..]);
                // Kernel slicing: a large grid runs as sub-grids, issued
                // while this vGPU holds the GPU (see `pump_sliced`).
                if scheduled
                    && sh.slice.slice_blocks > 0
                    && grid.count() > sh.slice.slice_blocks.max(sched::slicing::MIN_BLOCKS)
                    && s.ctx.can_slice(func)
                {
                    let parts =
                        sched::slicing::slice_grid(grid.x, grid.y, grid.z, sh.slice.slice_blocks);
                    if parts.len() > 1 {
                        sh.slice.flush_launches(s);
                        sh.port.stats.launches.fetch_add(1, Ordering::Relaxed);
                        sh.port
                            .stats
                            .sliced_launches
                            .fetch_add(1, Ordering::Relaxed);
                        c.sliced = Some(Sliced {
                            func,
                            block,
                            y: grid.y,
                            z: grid.z,
                            smem: shared_mem,
                            stream,
                            params,
                            grid_x: grid.x,
                            rest: parts.into(),
                        });
                        return Ok(());
                    }
                }
                if !scheduled {
                    sh.port.stats.launches.fetch_add(1, Ordering::Relaxed);
                    sh.slice.queue_launch(s, stream, shape, &params);
                    sh.slice.params = params;
                    return Ok(());
                }
                // The monitor: how much of the GPU's cores this launch can
                // occupy, weighted by its estimated time.
                let bps = *s
                    .occupancy
                    .entry((
                        func,
                        block.count().min(u64::from(u32::MAX)) as u32,
                        shared_mem,
                    ))
                    .or_insert_with(|| {
                        s.ctx
                            .occupancy(func, block.count() as u32, shared_mem)
                            .map_or(0, |n| n.max(0) as u32)
                    });
                let resident = u64::from(bps)
                    .saturating_mul(u64::from(sh.gpu.sm_count))
                    .max(1);
                let fraction = (grid.count() as f64 / resident as f64).min(1.0);
                let mut est = s.kernel_ns.get(&func).copied();
                if est.is_none() && s.timing.contains(&func) {
                    // The kernel's timed launch may be done by now.
                    Slice::collect_timings(s);
                    est = s.kernel_ns.get(&func).copied();
                }
                let weight = est.unwrap_or(1_000) as f64;
                sh.figures.occupancy.0 += fraction * weight;
                sh.figures.occupancy.1 += weight;
                // The prediction of what fits in the slice; the charge
                // comes from the busy period.
                sh.slice.issued_ns += est.unwrap_or(0);
                sh.port.stats.launches.fetch_add(1, Ordering::Relaxed);
                // One timed launch per unknown kernel at a time; the others
                // go untimed meanwhile.
                let r = if sh.slice.time_launches || est.is_none() && s.timing.insert(func) {
                    sh.port.stats.timed_launches.fetch_add(1, Ordering::Relaxed);
                    sh.slice.flush_launches(s);
                    sh.slice.in_period(s, stream, Some(func), |x| {
                        x.launch_timed(func, grid, block, shared_mem, stream, &params)
                    })
                } else {
                    sh.slice.queue_launch(s, stream, shape, &params);
                    Ok(())
                };
                sh.slice.params = params;
                r
            });
            if let Err(e) = r {
                s.defer(e);
                refuse(&sh.port, c, "launch refused");
            }
            Ok(())
        }
        Request::StreamCreate { flags, priority } => {
            let r = s
                .ctx
                .stream_create(flags, priority)
                .inspect(|&h| s.add_stream(h));
            reply(&sh.port, c, tag, opc, one(r), &[])
        }
        Request::StreamWaitEvent {
            stream,
            event,
            flags,
        } => {
            let r = s
                .check_stream(stream)
                .and(s.check_event(event))
                .and_then(|()| {
                    sh.slice.in_period(s, stream, None, |x| {
                        x.stream_wait_event(stream, event, flags)
                    })
                });
            if let Err(e) = r {
                s.defer(e);
                refuse(&sh.port, c, "wait on a stream or event it does not own");
            }
            Ok(())
        }
        Request::FuncSetAttribute { func, attr, value } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.func_set_attribute(func, attr, value));
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        Request::CtxGetLimit { limit } => {
            let r = s.ctx.limit(limit);
            reply(&sh.port, c, tag, opc, one(r), &[])
        }
        Request::CtxSetLimit { limit, value } => {
            let r = s.ctx.set_limit(limit, value);
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        Request::StreamSetAttribute { stream, attr } => {
            let r = s.check_stream(stream);
            let r = r.and_then(|()| s.ctx.stream_set_attribute(stream, attr));
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        Request::StreamGetAttribute { stream, attr } => {
            let r = s.check_stream(stream);
            let r = r
                .and_then(|()| s.ctx.stream_attribute(stream, attr))
                .map(|a| {
                    let raw = a.to_raw();
                    let mut vals = [0u64; 4];
                    for (v, b) in vals.iter_mut().zip(raw.chunks_exact(8)) {
                        *v = u64::from_le_bytes(b.try_into().unwrap_or_default());
                    }
                    Reply { vals }
                });
            reply(&sh.port, c, tag, opc, r, &[])
        }
        Request::StreamDestroy { stream } => {
            let r = if stream == 0 {
                Err(Status::InvalidHandle)
            } else {
                s.check_stream(stream)
            };
            let r = r
                .and_then(|()| s.ctx.stream_destroy(stream))
                .inspect(|()| s.remove_stream(stream));
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        Request::StreamSynchronize { stream } => match s.check_stream(stream) {
            Ok(()) => park_drain(sh, c, s, tag, opc, Some(stream)),
            Err(e) => reply(&sh.port, c, tag, opc, Err(e), &[]),
        },
        Request::StreamQuery { stream } => {
            let r = s
                .check_stream(stream)
                .and_then(|()| s.ctx.stream_query(stream));
            let r = r.and_then(ready);
            reply(&sh.port, c, tag, opc, r, &[])
        }
        Request::EventCreate { flags } => {
            let r = s.ctx.event_create(flags).inspect(|&h| s.add_event(h));
            reply(&sh.port, c, tag, opc, one(r), &[])
        }
        Request::EventDestroy { event } => {
            let r = if s.imported_events.remove(event) {
                // Another process's event it opened (IPC), revoked or not:
                // forgotten here.
                s.ctx.event_destroy(event)
            } else if s.orphan_event_if_opened(event) {
                // Another process has it open (IPC): destroyed once it lets
                // go of it.
                Ok(())
            } else {
                s.check_own_event(event)
                    .and_then(|()| s.ctx.event_destroy(event))
                    .inspect(|()| s.remove_event(event))
            };
            reply(&sh.port, c, tag, opc, unit(r), &[])
        }
        Request::EventRecord { event, stream } => {
            let r = s
                .check_event(event)
                .and(s.check_stream(stream))
                .and_then(|()| {
                    sh.slice
                        .in_period(s, stream, None, |x| x.event_record(event, stream))
                });
            if let Err(e) = r {
                s.defer(e);
            }
            Ok(())
        }
        Request::EventSynchronize { event } => match s.check_event(event) {
            Ok(()) => {
                let p = Parked {
                    tag,
                    opcode: opc,
                    wait: Wait::Event(event),
                    then: Then::Reply,
                    period: None,
                };
                wait::park(sh, c, s, p)
            }
            Err(e) => reply(&sh.port, c, tag, opc, Err(e), &[]),
        },
        Request::EventQuery { event } => {
            let r = s.check_event(event).and_then(|()| s.ctx.event_query(event));
            let r = r.and_then(ready);
            reply(&sh.port, c, tag, opc, r, &[])
        }
        Request::EventElapsedTime { start, end } => {
            let r = s
                .check_event(start)
                .and(s.check_event(end))
                .and_then(|()| s.ctx.event_elapsed(start, end));
            reply(
                &sh.port,
                c,
                tag,
                opc,
                r.map(|ms| Reply::one(u64::from(ms.to_bits()))),
                &[],
            )
        }
    }
}

/// Frees a detached allocation and uncounts it.
pub(super) fn free_now(sh: &mut Shared, s: &mut Session, ptr: u64, charge: u64) {
    s.uncount(charge);
    sh.mem.sub(charge);
    if let Err(e) = s.ctx.free(ptr) {
        s.defer(e);
    }
}

/// Does the stream-ordered frees whose marks the device has passed.
pub(super) fn deferred_frees(sh: &mut Shared, s: &mut Session) {
    // Freed while others had them open (IPC), closed by all since.
    for (ptr, charge) in s.orphans.closed() {
        free_now(sh, s, ptr, charge);
    }
    super::share::settle(sh, s);
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
            free_now(sh, s, ptr, charge);
            false
        }
    });
    let passed = pending.len() < before;
    s.deferred_frees = pending;
    if passed {
        // A passed mark synchronizes (where the driver writes the context's
        // kernel printf text): it is this process's, whichever pass this is.
        sh.port.collect_output(Some(s.id));
    }
}

/// Parks a synchronize of `stream` (`None`: the whole context) until the
/// device has done the work submitted before it, marking the end of the
/// busy period it drains (charged once the device is there).
fn park_drain(
    sh: &mut Shared,
    c: &mut Chan,
    s: &mut Session,
    tag: u64,
    opc: u32,
    stream: Option<Handle>,
) -> Result<(), Error> {
    let period = if Slice::period_ending(s, stream) {
        s.period.take()
    } else {
        None
    };
    match s.ctx.mark(stream) {
        Ok(m) => {
            let p = Parked {
                tag,
                opcode: opc,
                wait: Wait::Mark(m),
                then: Then::Reply,
                period,
            };
            wait::park(sh, c, s, p)
        }
        // The work before failed: so does the drain (its period with it).
        Err(e) => {
            wait::written_at_fault(s, e);
            reply(&sh.port, c, tag, opc, Err(e), &[])
        }
    }
}

/// A query's answer: success when done, `NotReady` otherwise (as CUDA reports it).
/// Takes a graph's data (`GraphInstantiate`, or `GraphInstantiateIn` in
/// `scope`): built when the last of it is in.
#[allow(clippy::too_many_arguments)]
fn graph_data(
    sh: &mut Shared,
    c: &mut Chan,
    s: &mut Session,
    d: &Descriptor,
    tag: u64,
    opc: u32,
    len: u32,
    scope: Option<u64>,
) -> Result<(), Error> {
    if len as usize > MAX_GRAPH_BYTES {
        refuse(&sh.port, c, "graph larger than the host takes");
        skip_data(c, d, u64::from(len));
        return reply(&sh.port, c, tag, opc, Err(Status::InvalidValue), &[]);
    }
    c.transfer = Some(Transfer {
        inbound: Inbound::Graph {
            buf: Vec::new(),
            tag,
            scope,
        },
        remaining: u64::from(len),
        offset: 0,
    });
    continue_transfer(sh, c, s, d)
}

fn ready(done: bool) -> Result<Reply, Status> {
    if done {
        Ok(Reply::default())
    } else {
        Err(Status::NotReady)
    }
}
