//! The launch family: kernel launches, checked against the function's
//! parameter sizes and queued in runs (`crate::session::LaunchRun`),
//! sliced into sub-grids (`transfer.rs` issues them), or timed on the
//! device; and host functions (`cuLaunchHostFunc`), which the guest runs
//! when the device reaches them.

use std::sync::atomic::Ordering;

use protocol::{Dim3, Request, Status};
use transport::Descriptor;

use super::super::channel::{refuse, ChannelState};
use super::super::shared::{Figures, Port, Shared, Slice};
use super::super::transfer::Sliced;
use super::super::wait::{self, Parked, Then, Wait};
use crate::executor::{Handle, Launch};
use crate::session::Session;
use crate::Error;

/// How long a `WaitHostFn` waits before answering "none yet".
const HOST_FN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs a launch-family request of session `s` (only `WaitHostFn` has a
/// reply: the rest report failures at the next synchronous call).
pub(super) fn handle(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    match req {
        Request::Launch {
            func,
            grid,
            block,
            shared_mem,
            stream,
            cluster,
            flags,
        } => {
            let shape = Launch {
                func,
                grid,
                block,
                shared_mem,
            };
            let r = if cluster != Dim3::default() || flags != 0 {
                let coop = flags & protocol::launch_flags::COOPERATIVE != 0;
                launch_alone(
                    &sh.port,
                    &mut sh.slice,
                    c,
                    s,
                    d,
                    shape,
                    stream,
                    cluster,
                    coop,
                )
            } else {
                let sm_count = sh.gpu.sm_count;
                launch(
                    &sh.port,
                    &mut sh.slice,
                    &mut sh.figures,
                    sm_count,
                    c,
                    s,
                    d,
                    shape,
                    stream,
                )
            };
            if let Err(e) = r {
                s.defer(e);
                refuse(&sh.port, c, "launch refused");
            }
            Ok(())
        }
        Request::HostFn { stream, id } => {
            host_fn(&sh.port, c, s, stream, id);
            Ok(())
        }
        Request::WaitHostFn => {
            let p = Parked {
                tag: d.tag,
                opcode: d.opcode,
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
        _ => super::misrouted(&sh.port, c, d, "launch"),
    }
}

/// Whether the request's data is the function's parameters, by size.
fn check_params(s: &Session, d: &Descriptor, func: Handle) -> Result<(), Status> {
    let sizes = s.function(func)?;
    let want: u64 = sizes.iter().map(|&x| u64::from(x)).sum();
    if want != u64::from(d.data_len) {
        return Err(Status::InvalidValue);
    }
    Ok(())
}

/// Copies the request's data (the launch's parameters) into `params`.
fn read_params(c: &mut ChannelState, d: &Descriptor, params: &mut Vec<u8>) -> Result<(), Status> {
    params.clear();
    params.resize(d.data_len as usize, 0);
    c.host
        .req
        .data(d)
        .map_err(|_| Status::InvalidValue)?
        .copy_to(&mut params[..]);
    Ok(())
}

/// A launch with clusters or a cooperative grid: goes one by one, never
/// batched nor sliced (a sliced cooperative grid could not sync).
#[allow(clippy::too_many_arguments)]
fn launch_alone(
    port: &Port,
    slice: &mut Slice,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    shape: Launch,
    stream: Handle,
    cluster: Dim3,
    coop: bool,
) -> Result<(), Status> {
    check_params(s, d, shape.func)?;
    s.check_stream(stream)?;
    let mut params = Vec::new();
    read_params(c, d, &mut params)?;
    port.stats.launches.fetch_add(1, Ordering::Relaxed);
    let Launch {
        func,
        grid,
        block,
        shared_mem,
    } = shape;
    // Launches queued before go first: the stream order is the guest's (a
    // graph run node by node sends its cluster launches among plain ones).
    slice.flush_launches(s);
    slice.in_period(s, stream, Some(func), |x| {
        x.launch_ex(
            func, grid, block, shared_mem, stream, &params, cluster, coop,
        )
    })
}

/// A launch: sliced into sub-grids if large (under the scheduler), else
/// queued in the session's run, or timed on the device while its
/// kernel's time is unknown.
#[allow(clippy::too_many_arguments)]
fn launch(
    port: &Port,
    slice: &mut Slice,
    figures: &mut Figures,
    sm_count: u32,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    shape: Launch,
    stream: Handle,
) -> Result<(), Status> {
    check_params(s, d, shape.func)?;
    s.check_stream(stream)?;
    // The buffer is reused from launch to launch (a sliced launch keeps it).
    let mut params = std::mem::take(&mut slice.params);
    read_params(c, d, &mut params)?;
    if slice.gate.is_none() {
        port.stats.launches.fetch_add(1, Ordering::Relaxed);
        slice.queue_launch(s, stream, shape, &params);
        slice.params = params;
        return Ok(());
    }
    let Some(params) = try_slice(port, slice, c, s, shape, stream, params) else {
        return Ok(());
    };
    let est = estimate(slice, figures, sm_count, s, shape);
    port.stats.launches.fetch_add(1, Ordering::Relaxed);
    // One timed launch per unknown kernel at a time; the others
    // go untimed meanwhile.
    let func = shape.func;
    let r = if slice.time_launches || est.is_none() && s.timing.insert(func) {
        port.stats.timed_launches.fetch_add(1, Ordering::Relaxed);
        slice.flush_launches(s);
        slice.in_period(s, stream, Some(func), |x| {
            x.launch_timed(
                func,
                shape.grid,
                shape.block,
                shape.shared_mem,
                stream,
                &params,
            )
        })
    } else {
        slice.queue_launch(s, stream, shape, &params);
        Ok(())
    };
    slice.params = params;
    r
}

/// Kernel slicing: a large grid runs as sub-grids, issued while this vGPU
/// holds the GPU (see `pump_sliced`). `None` once the channel took the
/// launch (and its parameters); else the parameters back.
fn try_slice(
    port: &Port,
    slice: &mut Slice,
    c: &mut ChannelState,
    s: &mut Session,
    shape: Launch,
    stream: Handle,
    params: Vec<u8>,
) -> Option<Vec<u8>> {
    let Launch {
        func,
        grid,
        block,
        shared_mem,
    } = shape;
    if slice.slice_blocks == 0
        || grid.count() <= slice.slice_blocks.max(sched::slicing::MIN_BLOCKS)
        || !s.ctx.can_slice(func)
    {
        return Some(params);
    }
    let parts = sched::slicing::slice_grid(grid.x, grid.y, grid.z, slice.slice_blocks);
    if parts.len() <= 1 {
        return Some(params);
    }
    slice.flush_launches(s);
    port.stats.launches.fetch_add(1, Ordering::Relaxed);
    port.stats.sliced_launches.fetch_add(1, Ordering::Relaxed);
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
    None
}

/// The launch's estimated time (`None`: its kernel's is unknown yet),
/// counted into the work issued under the grant and into the monitor's
/// occupancy.
fn estimate(
    slice: &mut Slice,
    figures: &mut Figures,
    sm_count: u32,
    s: &mut Session,
    shape: Launch,
) -> Option<u64> {
    let Launch {
        func,
        grid,
        block,
        shared_mem,
    } = shape;
    // The monitor: how much of the GPU's cores this launch can
    // occupy, weighted by its estimated time.
    // A block past u32::MAX threads (the guest's dimensions multiplied)
    // is asked as u32::MAX, which no GPU runs: the same key and the same
    // question, never a truncated block that looks small.
    let threads = u32::try_from(block.count()).unwrap_or(u32::MAX);
    let bps = *s
        .occupancy
        .entry((func, threads, shared_mem))
        .or_insert_with(|| {
            s.ctx
                .occupancy(func, threads, shared_mem)
                .map_or(0, |n| u32::try_from(n).unwrap_or(0))
        });
    let resident = u64::from(bps).saturating_mul(u64::from(sm_count)).max(1);
    let fraction = (grid.count() as f64 / resident as f64).min(1.0);
    let mut est = s.kernel_ns.get(&func).copied();
    if est.is_none() && s.timing.contains(&func) {
        // The kernel's timed launch may be done by now.
        Slice::collect_timings(s);
        est = s.kernel_ns.get(&func).copied();
    }
    let weight = est.unwrap_or(1_000) as f64;
    figures.occupancy.0 += fraction * weight;
    figures.occupancy.1 += weight;
    // The prediction of what fits in the slice; the charge
    // comes from the busy period.
    slice.issued_ns += est.unwrap_or(0);
    est
}

/// A host function on `stream`: handed to the process's `WaitHostFn` once
/// the device reaches it.
fn host_fn(port: &Port, c: &mut ChannelState, s: &mut Session, stream: Handle, id: u64) {
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
            refuse(port, c, "host function numbered 0");
        }
        Err(e) => {
            s.defer(e);
            refuse(port, c, "host function on a stream it does not own");
        }
    }
}
