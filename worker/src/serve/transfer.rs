//! Data that crosses the arenas in chunks: host-to-device copies, module
//! images and link inputs coming in, device-to-host copies going out; and
//! launches issued sub-grid by sub-grid (kernel slicing).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use protocol::{op, ImageKind, Reply, Status};
use transport::{Descriptor, FLAG_MORE};

use super::channel::{notify_guest, refuse, reply, ChannelState};
use super::shared::Shared;
use crate::session::Session;
use crate::Error;

/// Largest chunk of a device-to-host copy streamed through the arena.
const DTOH_CHUNK: usize = 1 << 20;

pub(super) enum Inbound {
    Htod {
        dst: u64,
        stream: u64,
        ok: bool,
    },
    Module {
        kind: ImageKind,
        buf: Vec<u8>,
        tag: u64,
    },
    Link {
        buf: Vec<u8>,
        tag: u64,
    },
    Graph {
        buf: Vec<u8>,
        tag: u64,
        /// The conditional scope it is built in (`GraphInstantiateIn`).
        scope: Option<u64>,
    },
}

pub(super) struct Transfer {
    pub inbound: Inbound,
    pub remaining: u64,
    pub offset: u64,
}

pub(super) struct Outbound {
    pub tag: u64,
    pub src: u64,
    pub len: u64,
    pub off: u64,
    pub stream: u64,
}

/// A sliced launch with sub-grids still to issue.
pub(super) struct Sliced {
    pub func: u64,
    pub block: protocol::Dim3,
    pub y: u32,
    pub z: u32,
    pub smem: u32,
    pub stream: u64,
    pub params: Vec<u8>,
    pub grid_x: u32,
    pub rest: std::collections::VecDeque<sched::slicing::SubGrid>,
}

pub(super) fn start_module(
    c: &mut ChannelState,
    tag: u64,
    kind: ImageKind,
    len: u64,
    _d: &Descriptor,
) -> Result<(), Error> {
    // The buffer grows as chunks arrive: a guest that announces 256 MiB and
    // sends nothing costs nothing.
    c.transfer = Some(Transfer {
        inbound: Inbound::Module {
            kind,
            buf: Vec::new(),
            tag,
        },
        remaining: len,
        offset: 0,
    });
    Ok(())
}

/// Drops `len` bytes of data owed by a refused request (they arrive as DATA chunks).
pub(super) fn skip_data(c: &mut ChannelState, d: &Descriptor, len: u64) {
    let rest = len.saturating_sub(u64::from(d.data_len));
    if rest > 0 {
        c.transfer = Some(Transfer {
            inbound: Inbound::Htod {
                dst: 0,
                stream: 0,
                ok: false,
            },
            remaining: rest,
            offset: 0,
        });
    }
}

/// Applies the data of `d` to the transfer in progress.
pub(super) fn continue_transfer(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
) -> Result<(), Error> {
    let Some(mut t) = c.transfer.take() else {
        refuse(&sh.port, c, "data chunk with no transfer in progress");
        s.defer(Status::InvalidValue);
        return Ok(());
    };
    let n = u64::from(d.data_len);
    if n > t.remaining {
        refuse(&sh.port, c, "more data than announced");
        s.defer(Status::InvalidValue);
        return Ok(());
    }
    let data = c.host.req.data(d)?;
    match &mut t.inbound {
        Inbound::Htod { dst, stream, ok } => {
            if *ok && n > 0 {
                sh.port.stats.copy_bytes.fetch_add(n, Ordering::Relaxed);
                if let Err(e) = s.ctx.htod(*dst + t.offset, &data, *stream) {
                    s.defer(e);
                    *ok = false;
                }
            }
        }
        Inbound::Module { buf, .. } | Inbound::Link { buf, .. } | Inbound::Graph { buf, .. } => {
            let start = buf.len();
            buf.resize(start + crate::usize_from(n), 0);
            data.copy_to(&mut buf[start..]);
        }
    }
    t.offset += n;
    t.remaining -= n;
    if t.remaining > 0 {
        c.transfer = Some(t);
        return Ok(());
    }
    match t.inbound {
        Inbound::Module { kind, buf, tag } => {
            let r = s.ctx.load_module(kind, &buf).inspect(|&m| s.add_module(m));
            if r.is_ok() {
                sh.gpu.images.insert(kind, &buf);
                tracing::debug!(cached_bytes = sh.gpu.images.bytes(), "module image kept");
            }
            reply(&sh.port, c, tag, op::MODULE_LOAD, r.map(Reply::one), &[])
        }
        Inbound::Link { buf, tag } => {
            let r = protocol::link_records(&buf)
                .map_err(|_| Status::InvalidValue)
                .and_then(|inputs| s.ctx.link(&inputs));
            match r {
                // The linked image goes back in one message.
                Ok(image) if image.len() > sh.port.chunk => {
                    refuse(&sh.port, c, "linked image larger than one arena chunk");
                    reply(&sh.port, c, tag, op::LINK, Err(Status::NotSupported), &[])
                }
                Ok(image) => reply(
                    &sh.port,
                    c,
                    tag,
                    op::LINK,
                    Ok(Reply::one(image.len() as u64)),
                    &image,
                ),
                Err(e) => reply(&sh.port, c, tag, op::LINK, Err(e), &[]),
            }
        }
        Inbound::Graph { buf, tag, scope } => {
            let r = protocol::graph::decode_graph(&buf)
                .map_err(|e| {
                    refuse(&sh.port, c, &format!("graph: {e}"));
                    Status::InvalidValue
                })
                .and_then(|nodes| {
                    s.check_graph_nodes(scope, &nodes).inspect_err(|_| {
                        refuse(&sh.port, c, "graph names what the process does not hold")
                    })?;
                    match scope {
                        Some(sc) => s.ctx.graph_instantiate_in(sc, &nodes),
                        None => s.ctx.graph_instantiate(&nodes),
                    }
                })
                .inspect(|&g| s.add_graph(g));
            tracing::debug!(bytes = buf.len(), result = ?r, "a guest's graph built");
            let opc = match scope {
                Some(_) => op::GRAPH_INSTANTIATE_IN,
                None => op::GRAPH_INSTANTIATE,
            };
            reply(&sh.port, c, tag, opc, r.map(Reply::one), &[])
        }
        Inbound::Htod { .. } => Ok(()),
    }
}

/// Issues the sub-grids of a sliced launch while the vGPU holds the GPU and
/// its slice lasts; what is left waits for the next grant (the run loop
/// releases the GPU between, so other vGPUs get their turn). Each sub-grid
/// is charged its share of the kernel's measured time; a kernel not
/// measured yet has its first sub-grid timed.
pub(super) fn pump_sliced(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
) -> Result<bool, Error> {
    let mut did = false;
    while let Some(sl) = c.sliced.as_mut() {
        let Some(sub) = sl.rest.front().copied() else {
            c.sliced = None;
            break;
        };
        if let Some(g) = sh.slice.gate.as_mut() {
            if g.slice_over() || !g.acquire(Duration::from_millis(1))? {
                break;
            }
            if sh.slice.slice_filled() {
                sh.slice.budget_spent = true;
                break;
            }
        }
        let grid = protocol::Dim3 {
            x: sub.x_count,
            y: sl.y,
            z: sl.z,
        };
        let est = s.kernel_ns.get(&sl.func).copied();
        let mut t0 = Instant::now();
        let r = sh.slice.in_period(s, sl.stream, Some(sl.func), |x| {
            t0 = Instant::now();
            x.launch_slice(
                sl.func,
                grid,
                sl.block,
                sl.smem,
                sl.stream,
                &sl.params,
                sub.x_offset,
                sl.grid_x,
            )
        });
        let share = f64::from(sub.x_count) / f64::from(sl.grid_x.max(1));
        match (r, est) {
            (Err(e), _) => {
                s.defer(e);
                c.sliced = None;
                break;
            }
            (Ok(()), Some(ns)) => sh.slice.issued_ns += crate::sat_u64(ns as f64 * share),
            (Ok(()), None) => {
                // Measure this sub-grid: wait for it on the host clock.
                if let Err(e) = s.ctx.synchronize() {
                    s.defer(e);
                }
                let ns = crate::nanos(t0.elapsed());
                sh.slice.issued_ns += ns;
                s.kernel_ns
                    .insert(sl.func, crate::sat_u64(ns as f64 / share.max(1e-9)));
            }
        }
        sh.slice.worked = true;
        did = true;
        if let Some(sl) = c.sliced.as_mut() {
            sl.rest.pop_front();
        }
    }
    Ok(did)
}

/// Streams a device-to-host copy into the response ring, as far as it has
/// room (the work before it is done: see `wait`).
pub(super) fn pump_outbound(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
) -> Result<(), Error> {
    let Some(mut ob) = c.outbound.take() else {
        return Ok(());
    };
    let ch = c.host.index();
    let mut failed = false;
    loop {
        // Chunks of at most DTOH_CHUNK: the guest copies each out of the
        // arena while the device fills the next, and a chunk that small is
        // still in the host's cache when the guest reads it (a 64 MiB copy
        // out of 256 KiB-1 MiB chunks moved 11.6-12.5 GB/s on an H100 host,
        // out of 4 MiB ones 10.4; `scripts/gpu/copy_probe.c`).
        let n = (ob.len - ob.off).min(sh.port.chunk.min(DTOH_CHUNK) as u64);
        let mut d = Descriptor::new(ob.tag, op::MEMCPY_DTOH);
        if ob.off + n < ob.len {
            d.flags = FLAG_MORE;
        } else {
            // The last chunk: kernel output flushed by the wait before the
            // copy goes with it (see `output.rs`).
            sh.port.collect_output(c.session);
            if c.session.is_some_and(|id| sh.port.output.borrow().has(id)) {
                d.flags = protocol::REPLY_OUTPUT;
            }
        }
        let (src, stream) = (ob.src + ob.off, ob.stream);
        let ctx = &mut s.ctx;
        let st = &sh.port.stats;
        let mut took = 0;
        let sent = c
            .host
            .resp
            .try_send_with(&d, crate::usize_from(n), |out, slice| {
                let t0 = Instant::now();
                if let Err(e) = ctx.dtoh(&slice, src, stream) {
                    out.status = e.code();
                    out.flags &= protocol::REPLY_OUTPUT;
                    failed = true;
                }
                took = crate::nanos(t0.elapsed());
                st.dtoh_ns.fetch_add(took, Ordering::Relaxed);
                st.dtoh_bytes.fetch_add(n, Ordering::Relaxed);
                st.copy_bytes.fetch_add(n, Ordering::Relaxed);
                Ok(())
            })?;
        if !sent {
            // The guest has not copied a chunk out yet. The loop comes back
            // at once (nothing rings when it does), but without hammering
            // the core a guest thread may share with this one.
            for _ in 0..8 {
                std::hint::spin_loop();
            }
            break;
        }
        if sh.slice.gate.is_some() {
            // The chunk's copy, synchronous: its device time (see `dtoh`).
            sh.slice.charged_ns += took;
            sh.slice.bursts += 1;
        }
        notify_guest(&sh.port, ch)?;
        ob.off += n;
        if failed || ob.off >= ob.len {
            return Ok(());
        }
    }
    c.outbound = Some(ob);
    Ok(())
}
