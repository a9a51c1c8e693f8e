//! Executable graphs: a graph's operations in an order its dependencies
//! allow (child graphs spread in place), launched into a stream.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use cudarc::driver::sys::CUstream;

use super::{graphs, KernelOp, KernelParams, KernelParamsV1, Op};
use crate::state::out;
use crate::{code, CuResult};

/// An instantiated graph.
#[derive(Clone)]
pub(crate) struct Exec {
    /// Each operation with the node it came from (0 inside a child graph).
    pub ops: Arc<Vec<(u64, Op)>>,
    pub flags: u64,
}

/// `graph`'s operations in order, child graphs spread in place.
fn flatten(graph: &super::Graph, top: bool, into: &mut Vec<(u64, Op)>) -> Result<(), CuResult> {
    let order = graph.order().ok_or(code::INVALID_VALUE)?;
    for i in order {
        let n = &graph.nodes[i];
        match &n.op {
            Op::Graph(child) => flatten(child, false, into)?,
            Op::Empty => {}
            op => into.push((if top { n.id } else { 0 }, op.clone())),
        }
    }
    Ok(())
}

fn instantiate(e: *mut u64, g: u64, flags: u64) -> Result<(), CuResult> {
    if e.is_null() {
        return Err(code::INVALID_VALUE);
    }
    let mut s = graphs();
    let mut ops = Vec::new();
    flatten(s.graph(g)?, true, &mut ops)?;
    let h = s.issue();
    s.execs.insert(
        h,
        Exec {
            ops: Arc::new(ops),
            flags,
        },
    );
    out(e, h)
}

/// Runs one operation in `st`'s order.
fn run(op: &Op, st: CUstream) -> Result<(), CuResult> {
    match op {
        Op::Kernel(k) => crate::launch::run_kernel(k, st),
        Op::Copy(b) => b.run(st, false),
        Op::Memset(m) => crate::memory::memset_2d(
            m.dst, m.pitch, m.value, m.elem, m.width, m.height, st, false,
        ),
        Op::Host(call) => crate::host_fn::enqueue(st, *call),
        Op::EventRecord(e) => crate::stream::record(*e as _, st),
        Op::EventWait(e) => crate::stream::wait(st, *e as _),
        Op::Empty | Op::Graph(_) => Ok(()),
    }
}

fn launch(e: u64, st: CUstream) -> Result<(), CuResult> {
    crate::context::need_ctx()?;
    let ops = graphs()
        .execs
        .get(&e)
        .ok_or(code::INVALID_VALUE)?
        .ops
        .clone();
    // The stream is checked once, before any of it is sent.
    crate::stream::resolve(st)?;
    for (_, op) in ops.iter() {
        run(op, st)?;
    }
    Ok(())
}

/// A kernel node's parameters for a getter: `kernelParams` points at the
/// node's own copy of each value.
pub(crate) fn kernel_params(k: &mut KernelOp) -> KernelParamsV1 {
    let mut at = 0usize;
    k.ptrs = k
        .sizes
        .iter()
        .map(|s| {
            let p = k.params.as_ptr() as usize + at;
            at += *s as usize;
            p
        })
        .collect();
    KernelParamsV1 {
        func: k.func as _,
        grid: [k.grid.x, k.grid.y, k.grid.z],
        block: [k.block.x, k.block.y, k.block.z],
        shared: k.shared,
        params: k.ptrs.as_mut_ptr() as *mut *mut c_void,
        extra: std::ptr::null_mut(),
    }
}

/// Replaces node `node`'s operation in executable `e` with `op`, which
/// must be of the same kind.
fn set_op(e: u64, node: u64, op: Op) -> Result<(), CuResult> {
    let mut s = graphs();
    let ex = s.execs.get_mut(&e).ok_or(code::INVALID_VALUE)?;
    let ops = Arc::make_mut(&mut ex.ops);
    let slot = ops
        .iter_mut()
        .find(|(id, _)| *id == node && node != 0)
        .ok_or(code::INVALID_VALUE)?;
    if std::mem::discriminant(&slot.1) != std::mem::discriminant(&op) {
        return Err(code::INVALID_VALUE);
    }
    slot.1 = op;
    Ok(())
}

/// `CUgraphExecUpdateResultInfo`.
#[repr(C)]
#[derive(Debug)]
pub struct UpdateResult {
    result: c_int,
    error_node: u64,
    error_from: u64,
}

/// Takes `g`'s operations into `e`, when the two have the same nodes of
/// the same kinds (`CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED`, 2, if not).
fn update(e: u64, g: u64) -> Result<(), c_int> {
    let mut s = graphs();
    let mut ops = Vec::new();
    flatten(s.graph(g).map_err(|_| 1)?, true, &mut ops).map_err(|_| 1)?;
    let ex = s.execs.get_mut(&e).ok_or(1)?;
    let same = ex.ops.len() == ops.len()
        && ex
            .ops
            .iter()
            .zip(&ops)
            .all(|(a, b)| std::mem::discriminant(&a.1) == std::mem::discriminant(&b.1));
    if !same {
        return Err(2);
    }
    // Node handles stay those the executable was made with.
    for (new, old) in ops.iter_mut().zip(ex.ops.iter()) {
        new.0 = old.0;
    }
    ex.ops = Arc::new(ops);
    Ok(())
}

export! {
    fn cuGraphInstantiateWithFlags [cuGraphInstantiate] (e: *mut u64, g: u64, flags: u64) {
        instantiate(e, g, flags)
    }

    /// `CUDA_GRAPH_INSTANTIATE_PARAMS`: flags, an upload stream, and where
    /// to say how it went (success).
    fn cuGraphInstantiateWithParams [cuGraphInstantiateWithParams_ptsz per_thread] (e: *mut u64, g: u64, p: *mut [u64; 4]) {
        if p.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a CUDA_GRAPH_INSTANTIATE_PARAMS (API contract).
        let flags = unsafe { (*p)[0] };
        instantiate(e, g, flags)?;
        // SAFETY: as above.
        let words = unsafe { &mut *p };
        // The error node and the result (success).
        words[2] = 0;
        words[3] = 0;
        Ok(())
    }

    /// The older name's signature: an error node and a log buffer.
    fn cuGraphInstantiate_v2(e: *mut u64, g: u64, _err: *mut u64, _log: *mut i8, _size: usize) {
        instantiate(e, g, 0)
    }

    fn cuGraphLaunch [cuGraphLaunch_ptsz per_thread] (e: u64, st: CUstream) {
        launch(e, st)
    }

    /// Nothing to upload ahead: the operations go when launched.
    fn cuGraphUpload [cuGraphUpload_ptsz per_thread] (e: u64, st: CUstream) {
        crate::stream::resolve(st)?;
        graphs().execs.get(&e).map(drop).ok_or(code::INVALID_VALUE)
    }

    fn cuGraphExecDestroy(e: u64) {
        graphs().execs.remove(&e).map(drop).ok_or(code::INVALID_VALUE)
    }

    fn cuGraphExecGetFlags(e: u64, flags: *mut u64) {
        let f = graphs().execs.get(&e).ok_or(code::INVALID_VALUE)?.flags;
        out(flags, f)
    }

    fn cuGraphExecKernelNodeSetParams_v2(e: u64, node: u64, p: *const KernelParams) {
        let p = super::read(p)?;
        let op = super::kernel_op(&p.v1, p.kern)?;
        set_op(e, node, op)
    }

    fn cuGraphExecKernelNodeSetParams(e: u64, node: u64, p: *const KernelParamsV1) {
        let op = super::kernel_op(&super::read(p)?, std::ptr::null_mut())?;
        set_op(e, node, op)
    }

    fn cuGraphExecMemcpyNodeSetParams(e: u64, node: u64, p: *const crate::copy_nd::Memcpy3d, _ctx: *mut c_void) {
        set_op(e, node, super::copy_op(p)?)
    }

    fn cuGraphExecMemsetNodeSetParams(e: u64, node: u64, p: *const super::MemsetParams, _ctx: *mut c_void) {
        set_op(e, node, super::memset_op(&super::read(p)?)?)
    }

    fn cuGraphExecHostNodeSetParams(e: u64, node: u64, p: *const super::HostParams) {
        set_op(e, node, super::host_op(&super::read(p)?)?)
    }

    fn cuGraphExecUpdate_v2(e: u64, g: u64, info: *mut UpdateResult) {
        let r = update(e, g);
        if !info.is_null() {
            // SAFETY: a CUgraphExecUpdateResultInfo to fill (API contract).
            let i = unsafe { &mut *info };
            i.result = r.err().unwrap_or(0);
            i.error_node = 0;
            i.error_from = 0;
        }
        // CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
        r.map_err(|_| 910)
    }

    fn cuGraphExecUpdate(e: u64, g: u64, err_node: *mut u64, result: *mut c_uint) {
        let r = update(e, g);
        crate::state::out_opt(err_node, 0)?;
        crate::state::out_opt(result, r.err().unwrap_or(0) as c_uint)?;
        r.map_err(|_| 910)
    }
}
