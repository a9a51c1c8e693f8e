//! CUDA graphs: the explicit graph API, stream capture ([`capture`]) and
//! executable graphs ([`exec`]).
//!
//! A graph lives here, in the process: its nodes are the operations the
//! stand-in already forwards (`Op`: a launch, a box copy, a memset, a
//! host function, an event record or wait, a child graph), each with the
//! nodes it depends on. Capturing a stream adds the stream's work to a
//! graph instead of sending it, so nothing of a capture reaches the host
//! and the scheduler's end-of-slice synchronize cannot break one. An
//! executable graph is the nodes in an order their dependencies allow;
//! launching it submits them to the launch stream in that order, where the
//! host worker runs launches queued behind one another as one CUDA graph
//! launch of its own. Branches of a graph run one after another (a valid
//! order of the graph; their overlap is not kept).
//!
//! Graph, node and executable handles are numbers issued here; every one a
//! program passes is looked up, and an unknown one is an invalid value.
//! Memory nodes' allocations: [`memory`]. Conditional nodes: graphs that
//! hold one are built on the host as one real CUDA graph ([`conditional`]).
//! User objects and the references graphs hold to them: [`user_object`].

pub mod capture;
pub mod conditional;
pub mod exec;
pub mod memory;
mod model;
pub mod user_object;

pub(crate) use model::{graphs, Graph, KernelOp, MemsetOp, Op, Store};

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::{CUcontext, CUevent, CUfunction};
use protocol::Dim3;

use crate::copy_nd::{Box3d, Memcpy3d};
use crate::host_fn::Call;
use crate::state::out;
use crate::{code, CuResult};

// ---------------------------------------------------------------- parameter structs

/// `CUDA_KERNEL_NODE_PARAMS_v1`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelParamsV1 {
    func: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (and `_v3`): v1 and the kernel by its
/// `CUkernel` handle, with a context.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelParams {
    v1: KernelParamsV1,
    kern: CUfunction,
    ctx: CUcontext,
}

/// `CUDA_MEMSET_NODE_PARAMS` (v1; v2 adds a context after it).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemsetParams {
    dst: u64,
    pitch: usize,
    value: c_uint,
    elem: c_uint,
    width: usize,
    height: usize,
}

/// `CUDA_HOST_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HostParams {
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
}

fn read<T: Copy>(p: *const T) -> Result<T, CuResult> {
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: a parameter struct of the caller's (API contract).
    Ok(unsafe { p.read_unaligned() })
}

/// A kernel node's operation from its parameters.
fn kernel_op(p: &KernelParamsV1, kern: CUfunction) -> Result<Op, CuResult> {
    let f = if p.func.is_null() { kern } else { p.func };
    let grid = Dim3 {
        x: p.grid[0],
        y: p.grid[1],
        z: p.grid[2],
    };
    let block = Dim3 {
        x: p.block[0],
        y: p.block[1],
        z: p.block[2],
    };
    let k = crate::launch::kernel_op(
        f,
        grid,
        block,
        p.shared,
        p.params,
        p.extra,
        Default::default(),
    )?;
    Ok(Op::Kernel(k))
}

fn memset_op(p: &MemsetParams) -> Result<Op, CuResult> {
    if ![1, 2, 4].contains(&p.elem) || p.height > 1 && p.pitch < p.width * p.elem as usize {
        return Err(code::INVALID_VALUE);
    }
    Ok(Op::Memset(MemsetOp {
        dst: p.dst,
        pitch: p.pitch,
        value: p.value,
        elem: p.elem,
        width: p.width,
        height: p.height,
    }))
}

fn host_op(p: &HostParams) -> Result<Op, CuResult> {
    let f = p.f.ok_or(code::INVALID_VALUE)?;
    Ok(Op::Host(Call::Fn(f, p.data as usize)))
}

fn copy_op(p: *const Memcpy3d) -> Result<Op, CuResult> {
    let p = read(p)?;
    Ok(Op::Copy(Box3d::from_3d(&p)?))
}

/// The dependencies a caller passes.
fn deps<'a>(d: *const u64, n: usize) -> Result<&'a [u64], CuResult> {
    if n == 0 {
        return Ok(&[]);
    }
    if d.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: `n` node handles (API contract).
    Ok(unsafe { std::slice::from_raw_parts(d, n) })
}

/// Adds a node built from the caller's parameters.
fn add_node(
    node: *mut u64,
    g: u64,
    d: *const u64,
    n: usize,
    op: Result<Op, CuResult>,
) -> Result<(), CuResult> {
    if node.is_null() {
        return Err(code::INVALID_VALUE);
    }
    let op = op?;
    let deps = deps(d, n)?;
    let id = graphs().add(g, op, deps)?;
    out(node, id)
}

/// Writes up to `*n` handles to `to` (when given) and the number there are to `*n`.
fn list(to: *mut u64, n: *mut usize, items: &[u64]) -> Result<(), CuResult> {
    if n.is_null() {
        return Err(code::INVALID_VALUE);
    }
    if !to.is_null() {
        // SAFETY: room for `*n` handles at `to` (API contract).
        let room = unsafe { *n }.min(items.len());
        // SAFETY: as above.
        let slots = unsafe { std::slice::from_raw_parts_mut(to, room) };
        slots.copy_from_slice(&items[..room]);
    }
    out(n, items.len())
}

/// `CUgraphNodeParams`: a type, padding, then the type's parameters.
#[repr(C)]
#[derive(Debug)]
pub struct NodeParams {
    ty: c_int,
    reserved0: [c_int; 3],
    body: [u64; 29],
    reserved2: u64,
}

/// A node's operation from `CUgraphNodeParams`.
fn generic_op(p: *const NodeParams) -> Result<Op, CuResult> {
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: a CUgraphNodeParams (API contract).
    let p = unsafe { &*p };
    let body = p.body.as_ptr() as *const u8;
    match p.ty {
        0 => {
            // SAFETY: the union holds CUDA_KERNEL_NODE_PARAMS_v3 (same layout as v2).
            let k = unsafe { (body as *const KernelParams).read_unaligned() };
            kernel_op(&k.v1, k.kern)
        }
        // SAFETY: CUDA_MEMCPY_NODE_PARAMS: flags, reserved, context, then the copy.
        1 => copy_op(unsafe { body.add(16) } as *const Memcpy3d),
        2 => memset_op(&read(body as *const MemsetParams)?),
        3 => host_op(&read(body as *const HostParams)?),
        4 => {
            let child = read(body as *const u64)?;
            let g = graphs()
                .graphs
                .get(&child)
                .cloned()
                .ok_or(code::INVALID_VALUE)?;
            if !memory::may_be_child(g.nodes.iter().map(|n| &n.op)) {
                return Err(code::NOT_SUPPORTED);
            }
            conditional::refuse_child(&g)?;
            Ok(Op::Graph(g))
        }
        5 => Ok(Op::Empty),
        6 => Ok(Op::EventWait(read(body as *const u64)?)),
        7 => Ok(Op::EventRecord(read(body as *const u64)?)),
        t => Err(crate::not_supported(&format!("graph nodes of type {t}"))),
    }
}

/// Adds a node from `CUgraphNodeParams` (a conditional one writes its
/// bodies back into them).
fn add_generic(
    node: *mut u64,
    g: u64,
    d: *const u64,
    n: usize,
    p: *mut NodeParams,
) -> Result<(), CuResult> {
    // SAFETY: the type, first field of a CUgraphNodeParams (API contract).
    if !p.is_null() && unsafe { (*p).ty } == 13 {
        return conditional::add_node(node, g, d, n, p);
    }
    add_node(node, g, d, n, generic_op(p))
}

export! {
    fn cuGraphCreate(g: *mut u64, flags: c_uint) {
        if g.is_null() || flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        let h = graphs().new_graph();
        out(g, h)
    }

    /// A conditional's body goes only with its node.
    fn cuGraphDestroy(g: u64) {
        let (allocs, scope) = {
            let mut s = graphs();
            s.graph(g)?;
            if s.is_body(g) {
                return Err(code::INVALID_VALUE);
            }
            let scope = s.forget_conds(g);
            (s.destroy(g)?, scope)
        };
        conditional::drop_scope(scope);
        memory::release(allocs);
        Ok(())
    }

    fn cuGraphClone(clone: *mut u64, g: u64) {
        if clone.is_null() {
            return Err(code::INVALID_VALUE);
        }
        conditional::refuse_clone(graphs().graph(g)?)?;
        let h = graphs().clone_graph(g)?;
        out(clone, h)
    }

    fn cuGraphNodeFindInClone(node: *mut u64, original: u64, clone: u64) {
        let mut s = graphs();
        let n = s.graph(clone)?.nodes.iter().find(|n| n.from == original).map(|n| n.id);
        out(node, n.ok_or(code::INVALID_VALUE)?)
    }

    fn cuGraphAddKernelNode(node: *mut u64, g: u64, d: *const u64, n: usize, p: *const KernelParamsV1) {
        let op = read(p).and_then(|p| kernel_op(&p, std::ptr::null_mut()));
        add_node(node, g, d, n, op)
    }

    fn cuGraphAddKernelNode_v2(node: *mut u64, g: u64, d: *const u64, n: usize, p: *const KernelParams) {
        let op = read(p).and_then(|p| kernel_op(&p.v1, p.kern));
        add_node(node, g, d, n, op)
    }

    fn cuGraphAddMemcpyNode(node: *mut u64, g: u64, d: *const u64, n: usize, p: *const Memcpy3d, _ctx: CUcontext) {
        add_node(node, g, d, n, copy_op(p))
    }

    fn cuGraphAddMemsetNode(node: *mut u64, g: u64, d: *const u64, n: usize, p: *const MemsetParams, _ctx: CUcontext) {
        add_node(node, g, d, n, read(p).and_then(|p| memset_op(&p)))
    }

    fn cuGraphAddHostNode(node: *mut u64, g: u64, d: *const u64, n: usize, p: *const HostParams) {
        add_node(node, g, d, n, read(p).and_then(|p| host_op(&p)))
    }

    fn cuGraphAddEmptyNode(node: *mut u64, g: u64, d: *const u64, n: usize) {
        add_node(node, g, d, n, Ok(Op::Empty))
    }

    fn cuGraphAddChildGraphNode(node: *mut u64, g: u64, d: *const u64, n: usize, child: u64) {
        let c = graphs().graphs.get(&child).cloned().ok_or(code::INVALID_VALUE)?;
        if !memory::may_be_child(c.nodes.iter().map(|n| &n.op)) {
            return Err(code::NOT_SUPPORTED);
        }
        conditional::refuse_child(&c)?;
        add_node(node, g, d, n, Ok(Op::Graph(c)))
    }

    fn cuGraphAddEventRecordNode(node: *mut u64, g: u64, d: *const u64, n: usize, e: CUevent) {
        add_node(node, g, d, n, Ok(Op::EventRecord(e as u64)))
    }

    fn cuGraphAddEventWaitNode(node: *mut u64, g: u64, d: *const u64, n: usize, e: CUevent) {
        add_node(node, g, d, n, Ok(Op::EventWait(e as u64)))
    }

    /// A conditional node's body graphs are written to its parameters.
    fn cuGraphAddNode(node: *mut u64, g: u64, d: *const u64, n: usize, p: *mut NodeParams) {
        add_generic(node, g, d, n, p)
    }

    /// Edge data (programmatic dependencies) is not kept: every edge is a
    /// full dependency.
    fn cuGraphAddNode_v2(node: *mut u64, g: u64, d: *const u64, _edges: *const c_void, n: usize, p: *mut NodeParams) {
        add_generic(node, g, d, n, p)
    }

    fn cuGraphNodeGetType(node: u64, ty: *mut c_int) {
        let t = graphs().node_mut(node)?.op.node_type();
        out(ty, t)
    }

    fn cuGraphGetNodes(g: u64, nodes: *mut u64, n: *mut usize) {
        let ids: Vec<u64> = graphs().graph(g)?.nodes.iter().map(|n| n.id).collect();
        list(nodes, n, &ids)
    }

    fn cuGraphGetRootNodes(g: u64, nodes: *mut u64, n: *mut usize) {
        let ids: Vec<u64> = graphs().graph(g)?.nodes.iter().filter(|n| n.deps.is_empty()).map(|n| n.id).collect();
        list(nodes, n, &ids)
    }

    fn cuGraphNodeGetDependencies(node: u64, d: *mut u64, n: *mut usize) {
        let ids = graphs().node_mut(node)?.deps.clone();
        list(d, n, &ids)
    }

    fn cuGraphNodeGetDependencies_v2(node: u64, d: *mut u64, _edges: *mut c_void, n: *mut usize) {
        let ids = graphs().node_mut(node)?.deps.clone();
        list(d, n, &ids)
    }

    fn cuGraphNodeGetDependentNodes(node: u64, d: *mut u64, n: *mut usize) {
        let mut s = graphs();
        let g = *s.owner.get(&node).ok_or(code::INVALID_VALUE)?;
        let ids: Vec<u64> = s.graph(g)?.nodes.iter().filter(|m| m.deps.contains(&node)).map(|m| m.id).collect();
        list(d, n, &ids)
    }

    fn cuGraphGetEdges(g: u64, from: *mut u64, to: *mut u64, n: *mut usize) {
        let edges: Vec<(u64, u64)> = graphs().graph(g)?.nodes.iter().flat_map(|m| m.deps.iter().map(move |d| (*d, m.id))).collect();
        let froms: Vec<u64> = edges.iter().map(|e| e.0).collect();
        let tos: Vec<u64> = edges.iter().map(|e| e.1).collect();
        if !to.is_null() {
            let mut m = edges.len();
            if !n.is_null() {
                // SAFETY: `n` points to the room the caller has (API contract).
                m = unsafe { *n };
            }
            list(to, &mut m, &tos)?;
        }
        list(from, n, &froms)
    }

    fn cuGraphGetEdges_v2(g: u64, from: *mut u64, to: *mut u64, _edges: *mut c_void, n: *mut usize) {
        // SAFETY: the same contract as cuGraphGetEdges.
        let r = unsafe { cuGraphGetEdges(g, from, to, n) };
        if r == code::SUCCESS { Ok(()) } else { Err(r) }
    }

    fn cuGraphAddDependencies(g: u64, from: *const u64, to: *const u64, n: usize) {
        let (f, t) = (deps(from, n)?, deps(to, n)?);
        let mut s = graphs();
        let graph = s.graph(g)?;
        for (a, b) in f.iter().zip(t) {
            if graph.node(*a).is_none() {
                return Err(code::INVALID_VALUE);
            }
            let node = graph.node_mut(*b).ok_or(code::INVALID_VALUE)?;
            if !node.deps.contains(a) {
                node.deps.push(*a);
            }
        }
        Ok(())
    }

    fn cuGraphAddDependencies_v2(g: u64, from: *const u64, to: *const u64, _edges: *const c_void, n: usize) {
        // SAFETY: the same contract as cuGraphAddDependencies.
        let r = unsafe { cuGraphAddDependencies(g, from, to, n) };
        if r == code::SUCCESS { Ok(()) } else { Err(r) }
    }

    fn cuGraphRemoveDependencies(g: u64, from: *const u64, to: *const u64, n: usize) {
        let (f, t) = (deps(from, n)?, deps(to, n)?);
        let mut s = graphs();
        let graph = s.graph(g)?;
        for (a, b) in f.iter().zip(t) {
            let node = graph.node_mut(*b).ok_or(code::INVALID_VALUE)?;
            node.deps.retain(|d| d != a);
        }
        Ok(())
    }

    fn cuGraphRemoveDependencies_v2(g: u64, from: *const u64, to: *const u64, _edges: *const c_void, n: usize) {
        // SAFETY: the same contract as cuGraphRemoveDependencies.
        let r = unsafe { cuGraphRemoveDependencies(g, from, to, n) };
        if r == code::SUCCESS { Ok(()) } else { Err(r) }
    }

    /// Memory nodes cannot be removed.
    fn cuGraphDestroyNode(node: u64) {
        let mut s = graphs();
        if matches!(s.node_mut(node)?.op, Op::MemAlloc { .. } | Op::MemFree(_)) {
            return Err(code::NOT_SUPPORTED);
        }
        if let Op::Cond(c) = &s.node_mut(node)?.op {
            let bodies = c.bodies.to_vec();
            s.drop_bodies(bodies);
        }
        let g = s.owner.remove(&node).ok_or(code::INVALID_VALUE)?;
        let graph = s.graph(g)?;
        graph.nodes.retain(|n| n.id != node);
        for n in &mut graph.nodes {
            n.deps.retain(|d| *d != node);
        }
        Ok(())
    }

    fn cuGraphKernelNodeGetParams_v2 [cuGraphKernelNodeGetParams] (node: u64, p: *mut KernelParams) {
        if p.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let mut s = graphs();
        let Op::Kernel(k) = &mut s.node_mut(node)?.op else {
            return Err(code::INVALID_VALUE);
        };
        let v1 = exec::kernel_params(k);
        // SAFETY: room for the parameters (API contract); the unversioned
        // name takes v1, a prefix of v2: write no more than v1 through it.
        unsafe { (p as *mut KernelParamsV1).write_unaligned(v1) };
        Ok(())
    }

    fn cuGraphKernelNodeSetParams_v2(node: u64, p: *const KernelParams) {
        let p = read(p)?;
        let op = kernel_op(&p.v1, p.kern)?;
        graphs().set_op(node, op)
    }

    fn cuGraphKernelNodeSetParams(node: u64, p: *const KernelParamsV1) {
        let op = kernel_op(&read(p)?, std::ptr::null_mut())?;
        graphs().set_op(node, op)
    }

    fn cuGraphMemsetNodeGetParams(node: u64, p: *mut MemsetParams) {
        let Op::Memset(m) = graphs().node_mut(node)?.op else {
            return Err(code::INVALID_VALUE);
        };
        out(p, MemsetParams { dst: m.dst, pitch: m.pitch, value: m.value, elem: m.elem, width: m.width, height: m.height })
    }

    fn cuGraphMemsetNodeSetParams(node: u64, p: *const MemsetParams) {
        let op = memset_op(&read(p)?)?;
        graphs().set_op(node, op)
    }

    fn cuGraphMemcpyNodeSetParams(node: u64, p: *const Memcpy3d) {
        let op = copy_op(p)?;
        graphs().set_op(node, op)
    }

    fn cuGraphHostNodeGetParams(node: u64, p: *mut HostParams) {
        let Op::Host(Call::Fn(f, data)) = graphs().node_mut(node)?.op else {
            return Err(code::INVALID_VALUE);
        };
        out(p, HostParams { f: Some(f), data: data as *mut c_void })
    }

    fn cuGraphHostNodeSetParams(node: u64, p: *const HostParams) {
        let op = host_op(&read(p)?)?;
        graphs().set_op(node, op)
    }

    fn cuGraphEventRecordNodeGetEvent(node: u64, e: *mut CUevent) {
        let Op::EventRecord(ev) = graphs().node_mut(node)?.op else {
            return Err(code::INVALID_VALUE);
        };
        out(e, ev as CUevent)
    }

    fn cuGraphEventWaitNodeGetEvent(node: u64, e: *mut CUevent) {
        let Op::EventWait(ev) = graphs().node_mut(node)?.op else {
            return Err(code::INVALID_VALUE);
        };
        out(e, ev as CUevent)
    }
}

#[cfg(test)]
mod tests {
    use super::model::Node;
    use super::*;

    fn graph(deps: &[&[u64]]) -> Graph {
        Graph {
            nodes: deps
                .iter()
                .enumerate()
                .map(|(i, d)| Node {
                    id: i as u64 + 1,
                    op: Op::Empty,
                    deps: d.to_vec(),
                    from: 0,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn order_runs_every_node_after_what_it_depends_on() {
        // 1 <- 3, 2 <- 3, 3 <- 4, and 5 alone; 2 was added before 1's dependent.
        let g = graph(&[&[2], &[], &[1, 2], &[3], &[]]);
        let order = g.order().unwrap();
        let pos = |id: u64| order.iter().position(|&i| g.nodes[i].id == id).unwrap();
        assert_eq!(order.len(), 5);
        assert!(pos(2) < pos(1) && pos(1) < pos(3) && pos(3) < pos(4));
        // Among ready nodes, the earliest added goes first.
        assert_eq!(g.nodes[order[0]].id, 2);
    }

    #[test]
    fn a_cycle_has_no_order() {
        assert!(graph(&[&[2], &[1]]).order().is_none());
        assert!(
            graph(&[&[9]]).order().is_none(),
            "a dependency outside the graph"
        );
    }

    #[test]
    fn clones_get_new_handles_and_keep_the_shape() {
        let mut s = Store::default();
        let g = s.new_graph();
        let a = s.add(g, Op::Empty, &[]).unwrap();
        let b = s.add(g, Op::Empty, &[a, a]).unwrap();
        assert_eq!(
            s.graphs[&g].node(b).unwrap().deps,
            vec![a],
            "duplicates merged"
        );
        assert_eq!(s.add(g, Op::Empty, &[12345]), Err(code::INVALID_VALUE));
        let c = s.clone_graph(g).unwrap();
        let nodes = s.graphs[&c].nodes.clone();
        assert_eq!(nodes.len(), 2);
        assert!(nodes.iter().all(|n| n.id != a && n.id != b));
        assert_eq!(nodes[1].deps, vec![nodes[0].id]);
        assert_eq!((nodes[0].from, nodes[1].from), (a, b));
        s.destroy(g).unwrap();
        assert!(!s.owner.contains_key(&a) && s.owner.contains_key(&nodes[0].id));
        assert_eq!(s.destroy(g), Err(code::INVALID_VALUE));
    }
}
