//! Stream capture: while a stream captures, its work becomes nodes of the
//! capture's graph instead of being sent.
//!
//! A capture starts on one stream; another stream joins it by waiting on
//! an event recorded in it, and its work then depends on what the event
//! marked. Each capturing stream keeps the nodes its next operation
//! depends on. `cuStreamEndCapture` on the stream that started it ends it
//! for every stream in it and gives the graph. Synchronizing a capturing
//! stream is refused and spoils the capture, as CUDA does.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering;

use cudarc::driver::sys::{CUevent, CUstream};

use super::{graphs, Op};
use crate::state::process::CAPTURING;
use crate::state::thread::resolve;
use crate::state::{out, out_opt};
use crate::{code, CuResult};

/// `CUDA_ERROR_STREAM_CAPTURE_*`.
const CAPTURE_UNSUPPORTED: CuResult = 900;
const CAPTURE_INVALIDATED: CuResult = 901;
const CAPTURE_UNMATCHED: CuResult = 903;
const ILLEGAL_STATE: CuResult = 401;

/// One stream's part in a capture.
#[derive(Debug, Clone)]
pub(crate) struct Capture {
    /// The capture's id (`cuStreamGetCaptureInfo`).
    pub id: u64,
    /// The graph it adds to.
    pub graph: u64,
    /// What the stream's next operation depends on.
    pub deps: Vec<u64>,
    /// Whether this stream started it.
    pub origin: bool,
    /// Whether it adds to a graph of the program's
    /// (`cuStreamBeginCaptureToGraph`) rather than one made for it.
    pub to_graph: bool,
    /// `CUstreamCaptureMode`.
    pub mode: u32,
}

/// The captures in progress.
#[derive(Default)]
pub(crate) struct Captures {
    /// By host stream handle.
    streams: HashMap<u64, Capture>,
    /// Events recorded in a capture: its id and what they marked.
    events: HashMap<u64, (u64, Vec<u64>)>,
    /// Captures spoiled by an illegal call.
    invalid: std::collections::HashSet<u64>,
    next_id: u64,
}

/// If `st` is capturing, adds the operation `op` makes to its graph after
/// the stream's dependencies and returns true; otherwise false (the caller
/// runs the operation).
pub(crate) fn add(
    st: CUstream,
    op: impl FnOnce() -> Result<Op, CuResult>,
) -> Result<bool, CuResult> {
    if CAPTURING.load(Ordering::Acquire) == 0 {
        return Ok(false);
    }
    let h = resolve(st)?;
    let (graph, deps) = match graphs().captures.streams.get(&h) {
        None => return Ok(false),
        Some(c) => (c.graph, c.deps.clone()),
    };
    let op = op()?;
    let mut s = graphs();
    let id = s.add(graph, op, &deps)?;
    if let Some(c) = s.captures.streams.get_mut(&h) {
        c.deps = vec![id];
    }
    Ok(true)
}

/// Whether `st` is capturing now.
pub(crate) fn capturing(st: CUstream) -> Result<bool, CuResult> {
    if CAPTURING.load(Ordering::Acquire) == 0 {
        return Ok(false);
    }
    let h = resolve(st)?;
    Ok(graphs().captures.streams.contains_key(&h))
}

/// Refuses a synchronizing call on a capturing stream (and spoils its
/// capture, as CUDA does).
pub(crate) fn refuse_sync(h: u64) -> Result<(), CuResult> {
    if CAPTURING.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let mut s = graphs();
    if let Some(id) = s.captures.streams.get(&h).map(|c| c.id) {
        s.captures.invalid.insert(id);
        return Err(CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// An event record on a capturing stream marks the stream's place in the
/// capture (true); otherwise the caller records it (false).
pub(crate) fn record(e: CUevent, st: CUstream) -> Result<bool, CuResult> {
    if CAPTURING.load(Ordering::Acquire) == 0 {
        return Ok(false);
    }
    let h = resolve(st)?;
    let mut s = graphs();
    let Some(c) = s.captures.streams.get(&h) else {
        return Ok(false);
    };
    let mark = (c.id, c.deps.clone());
    s.captures.events.insert(e as u64, mark);
    Ok(true)
}

/// A wait for an event recorded in a capture joins the waiting stream to
/// that capture (true). A capturing stream's wait for any other event is a
/// wait node; otherwise the caller sends the wait (false).
pub(crate) fn wait(st: CUstream, e: CUevent) -> Result<bool, CuResult> {
    if CAPTURING.load(Ordering::Acquire) == 0 {
        return Ok(false);
    }
    let h = resolve(st)?;
    let mut s = graphs();
    let Some((id, marked)) = s.captures.events.get(&(e as u64)).cloned() else {
        drop(s);
        return add(st, || Ok(Op::EventWait(e as u64)));
    };
    let graph = s
        .captures
        .streams
        .values()
        .find(|c| c.id == id)
        .map(|c| (c.graph, c.mode, c.to_graph));
    let Some((graph, mode, to_graph)) = graph else {
        // The capture it was recorded in is over.
        return Err(CAPTURE_UNMATCHED);
    };
    match s.captures.streams.get_mut(&h) {
        Some(c) if c.id == id => {
            for d in marked {
                if !c.deps.contains(&d) {
                    c.deps.push(d);
                }
            }
        }
        Some(_) => return Err(ILLEGAL_STATE),
        None => {
            s.captures.streams.insert(
                h,
                Capture {
                    id,
                    graph,
                    deps: marked,
                    origin: false,
                    to_graph,
                    mode,
                },
            );
            CAPTURING.fetch_add(1, Ordering::AcqRel);
        }
    }
    Ok(true)
}

/// Starts capturing `st` into `graph` (a new one if `None`) after `deps`.
fn begin(st: CUstream, graph: Option<u64>, deps: &[u64], mode: c_int) -> Result<(), CuResult> {
    crate::state::thread::need_ctx()?;
    let mode = u32::try_from(mode)
        .ok()
        .filter(|m| *m <= 2)
        .ok_or(code::INVALID_VALUE)?;
    let h = resolve(st)?;
    if h == 0 {
        // The legacy default stream synchronizes with every other: it
        // cannot be captured.
        return Err(CAPTURE_UNSUPPORTED);
    }
    let mut s = graphs();
    if s.captures.streams.contains_key(&h) {
        return Err(ILLEGAL_STATE);
    }
    let graph_given = graph.is_some();
    let graph = match graph {
        Some(g) => {
            let gr = s.graph(g)?;
            if deps.iter().any(|d| gr.nodes.iter().all(|n| n.id != *d)) {
                return Err(code::INVALID_VALUE);
            }
            g
        }
        None => s.new_graph(),
    };
    s.captures.next_id += 1;
    let id = s.captures.next_id;
    s.captures.streams.insert(
        h,
        Capture {
            id,
            graph,
            deps: deps.to_vec(),
            origin: true,
            to_graph: graph_given,
            mode,
        },
    );
    CAPTURING.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// Ends the capture `st` started; its graph.
/// Ends the capture `st` started and answers its graph; `handed` says
/// whether the caller takes the graph (a null out-parameter does not).
fn end(st: CUstream, handed: bool) -> Result<u64, CuResult> {
    let h = resolve(st)?;
    let mut s = graphs();
    let c = match s.captures.streams.get(&h) {
        Some(c) if c.origin => c.clone(),
        Some(_) => return Err(CAPTURE_UNMATCHED),
        None => return Err(ILLEGAL_STATE),
    };
    // A capture into the program's own graph may be ended without taking
    // it (graphConditionalNodes ends one so, into a conditional body); a
    // graph made for the capture must be taken.
    if !handed && !c.to_graph {
        return Err(code::INVALID_VALUE);
    }
    let before = s.captures.streams.len();
    s.captures.streams.retain(|_, x| x.id != c.id);
    CAPTURING.fetch_sub(before - s.captures.streams.len(), Ordering::AcqRel);
    s.captures.events.retain(|_, (id, _)| *id != c.id);
    if s.captures.invalid.remove(&c.id) {
        if c.to_graph {
            // The program's graph stays its own.
            return Err(CAPTURE_INVALIDATED);
        }
        let allocs = s.destroy(c.graph).unwrap_or_default();
        drop(s);
        // What the capture allocated goes with it.
        super::memory::release(allocs);
        return Err(CAPTURE_INVALIDATED);
    }
    Ok(c.graph)
}

/// A stream's capture status (`CUstreamCaptureStatus`), id, graph and
/// dependencies.
fn info(st: CUstream) -> Result<(c_int, u64, u64, Vec<u64>), CuResult> {
    let h = resolve(st)?;
    let s = graphs();
    Ok(match s.captures.streams.get(&h) {
        None => (0, 0, 0, Vec::new()),
        Some(c) => {
            let status = if s.captures.invalid.contains(&c.id) {
                2
            } else {
                1
            };
            (status, c.id, c.graph, c.deps.clone())
        }
    })
}

/// Writes a capture's details through the caller's optional pointers.
fn write_info(
    st: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut u64,
    deps: *mut *const u64,
    n: *mut usize,
) -> Result<(), CuResult> {
    crate::state::thread::need_ctx()?;
    let (s, i, g, d) = info(st)?;
    out(status, s)?;
    if s == 0 {
        return Ok(());
    }
    out_opt(id, i)?;
    out_opt(graph, g)?;
    out_opt(n, d.len())?;
    // A thread-exit destructor finds this thread's list gone.
    let p = crate::state::thread::hand_out_deps(d)?;
    out_opt(deps, p)
}

fn update_deps(st: CUstream, d: *const u64, n: usize, flags: c_uint) -> Result<(), CuResult> {
    let h = resolve(st)?;
    let given = super::deps(d, n)?.to_vec();
    let mut s = graphs();
    let c = s.captures.streams.get_mut(&h).ok_or(ILLEGAL_STATE)?;
    match flags {
        0 => {
            for x in given {
                if !c.deps.contains(&x) {
                    c.deps.push(x);
                }
            }
        }
        1 => c.deps = given,
        _ => return Err(code::INVALID_VALUE),
    }
    Ok(())
}

export! {
    fn cuStreamBeginCapture_v2 [cuStreamBeginCapture_v2_ptsz per_thread] (st: CUstream, mode: c_int) {
        begin(st, None, &[], mode)
    }

    fn cuStreamBeginCapture [cuStreamBeginCapture_ptsz per_thread] (st: CUstream) {
        begin(st, None, &[], 0)
    }

    fn cuStreamBeginCaptureToGraph [cuStreamBeginCaptureToGraph_ptsz per_thread] (st: CUstream, g: u64, d: *const u64, _edges: *const std::ffi::c_void, n: usize, mode: c_int) {
        let deps = super::deps(d, n)?.to_vec();
        begin(st, Some(g), &deps, mode)
    }

    fn cuStreamEndCapture [cuStreamEndCapture_ptsz per_thread] (st: CUstream, g: *mut u64) {
        let graph = end(st, !g.is_null())?;
        if g.is_null() {
            return Ok(());
        }
        out(g, graph)
    }

    fn cuStreamIsCapturing [cuStreamIsCapturing_ptsz per_thread] (st: CUstream, status: *mut c_int) {
        crate::state::thread::need_ctx()?;
        out(status, info(st)?.0)
    }

    fn cuStreamGetCaptureInfo [cuStreamGetCaptureInfo_ptsz per_thread] (st: CUstream, status: *mut c_int, id: *mut u64) {
        write_info(st, status, id, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut())
    }

    fn cuStreamGetCaptureInfo_v2 [cuStreamGetCaptureInfo_v2_ptsz per_thread] (st: CUstream, status: *mut c_int, id: *mut u64, g: *mut u64, deps: *mut *const u64, n: *mut usize) {
        write_info(st, status, id, g, deps, n)
    }

    /// Edge data is all default (full dependencies): none is given.
    fn cuStreamGetCaptureInfo_v3 [cuStreamGetCaptureInfo_v3_ptsz per_thread] (st: CUstream, status: *mut c_int, id: *mut u64, g: *mut u64, deps: *mut *const u64, edges: *mut *const std::ffi::c_void, n: *mut usize) {
        write_info(st, status, id, g, deps, n)?;
        out_opt(edges, std::ptr::null())
    }

    fn cuStreamUpdateCaptureDependencies [cuStreamUpdateCaptureDependencies_ptsz per_thread] (st: CUstream, d: *const u64, n: usize, flags: c_uint) {
        update_deps(st, d, n, flags)
    }

    fn cuStreamUpdateCaptureDependencies_v2 [cuStreamUpdateCaptureDependencies_v2_ptsz per_thread] (st: CUstream, d: *const u64, _edges: *const std::ffi::c_void, n: usize, flags: c_uint) {
        update_deps(st, d, n, flags)
    }

    /// The mode decides which calls a capture forbids elsewhere; captures
    /// here never reach the host, so it is kept and given back.
    fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint) {
        if mode.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: checked for null; the caller's mode (API contract).
        let new = unsafe { *mode };
        if new > 2 {
            return Err(code::INVALID_VALUE);
        }
        let old = crate::state::thread::exchange_capture_mode(new);
        out(mode, old)
    }
}
