//! Executable graphs: a graph's operations in an order its dependencies
//! allow (child graphs spread in place), launched into a stream.
//!
//! When every operation is one the host can run from what it holds
//! (kernels, memsets and copies within device memory, event records and
//! waits), the host builds the same graph (the same dependencies, child
//! graphs spread in place) as one CUDA graph at instantiation, and a launch
//! is one request and one `cuGraphLaunch` there: independent branches run
//! side by side (kernels launched with thread block clusters too).
//! Otherwise (a host function, a copy from or to the guest's own memory, a
//! cooperative launch), or if the host refuses it, the operations go one
//! by one, as the guest ran them before.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use cudarc::driver::sys::CUstream;

use protocol::graph::{GraphNode, GraphOp};

use super::{graphs, KernelOp, KernelParams, KernelParamsV1, Op};
use crate::state::out;
use crate::{code, CuResult};

/// An instantiated graph.
#[derive(Clone)]
pub(crate) struct Exec {
    /// Each operation with the node it came from (0 inside a child graph),
    /// in an order its dependencies allow.
    pub ops: Arc<Vec<(u64, Op)>>,
    /// The indices in `ops` of the operations each must follow.
    pub deps: Arc<Vec<Vec<u32>>>,
    pub flags: u64,
    /// The host's executable of the same operations, if it built one.
    pub host: Option<u64>,
    /// The operations changed since the host built its executable: it is
    /// built again before the next launch.
    pub stale: bool,
    /// The graph allocations of its memory nodes, which it keeps alive.
    pub allocs: Vec<u64>,
    /// The graph allocations its free nodes free.
    pub frees: Vec<u64>,
    /// It holds conditional nodes: `host` is all it runs as.
    pub conditional: bool,
    /// Its own references to its graph's user objects (released with it).
    pub objects: super::user_object::Refs,
}

/// The host's node for one operation, or `None` if it cannot run on the
/// host (a conditional node is built by `conditional.rs`).
pub(super) fn host_op(op: &Op) -> Option<GraphOp> {
    Some(match op {
        Op::Kernel(k) if k.flags == 0 => GraphOp::Kernel {
            func: k.handle,
            grid: k.grid,
            block: k.block,
            shared_mem: k.shared,
            params: k.params.clone(),
            cluster: k.cluster,
        },
        Op::Copy(b) if b.src.device && b.dst.device && b.height == 1 && b.depth == 1 => {
            GraphOp::Copy {
                dst: b.dst.addr,
                src: b.src.addr,
                len: b.width,
            }
        }
        Op::Memset(m) => GraphOp::Memset {
            dst: m.dst,
            pitch: m.pitch as u64,
            value: m.value,
            elem: m.elem,
            width: m.width as u64,
            height: m.height as u64,
        },
        Op::EventRecord(e) => GraphOp::EventRecord { event: *e },
        Op::EventWait(e) => GraphOp::EventWait { event: *e },
        Op::Empty => GraphOp::Empty,
        _ => return None,
    })
}

/// The host's nodes for `ops` with their dependencies `deps`, or `None` if
/// any cannot run on the host.
fn host_nodes(ops: &[(u64, Op)], deps: &[Vec<u32>]) -> Option<Vec<GraphNode>> {
    let mut nodes = Vec::with_capacity(ops.len());
    for (i, (_, op)) in ops.iter().enumerate() {
        let op = host_op(op)?;
        let deps = deps.get(i)?.clone();
        if deps.len() > protocol::graph::MAX_DEPS {
            return None;
        }
        nodes.push(GraphNode { op, deps });
    }
    (!nodes.is_empty() && nodes.len() <= protocol::graph::MAX_NODES).then_some(nodes)
}

/// The host's executable for `ops`, if it builds one (a refusal is no
/// error: the operations then go one by one).
fn build_on_host(ops: &[(u64, Op)], deps: &[Vec<u32>]) -> Option<u64> {
    let nodes = host_nodes(ops, deps)?;
    let data = protocol::graph::encode_graph(&nodes);
    crate::state::gpu(|g| g.graph_instantiate(&data)).ok()
}

/// Lets the host's executable go (its errors change nothing here).
fn drop_on_host(h: u64) {
    let _ = crate::state::gpu(|g| g.graph_destroy(h));
}

/// A graph's operations in an order its dependencies allow (child graphs
/// spread in place, empty nodes left out), each with the indices of the
/// operations it must follow.
#[derive(Default)]
pub(super) struct Flat {
    pub ops: Vec<(u64, Op)>,
    pub deps: Vec<Vec<u32>>,
}

impl Flat {
    pub(super) fn of(graph: &super::Graph) -> Result<Flat, CuResult> {
        let mut f = Flat::default();
        f.add(graph, true, &[])?;
        Ok(f)
    }

    /// Appends `graph`, all of which follows `after`; returns what nothing
    /// in it follows (what follows the graph must follow those).
    fn add(
        &mut self,
        graph: &super::Graph,
        top: bool,
        after: &[u32],
    ) -> Result<Vec<u32>, CuResult> {
        let order = graph.order().ok_or(code::INVALID_VALUE)?;
        // Each node's last operations (a child graph's or an empty node's
        // stand for the node), and the nodes something depends on.
        let mut ends: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut followed: HashSet<u64> = HashSet::new();
        for i in order {
            let n = &graph.nodes[i];
            let mut before: Vec<u32> = if n.deps.is_empty() {
                after.to_vec()
            } else {
                n.deps
                    .iter()
                    .flat_map(|d| ends.get(d).cloned().unwrap_or_default())
                    .collect()
            };
            before.sort_unstable();
            before.dedup();
            followed.extend(n.deps.iter().copied());
            let end = match &n.op {
                Op::Graph(child) => self.add(child, false, &before)?,
                // Their memory is there from the node's making on.
                Op::Empty | Op::MemAlloc { .. } | Op::MemFree(_) => before,
                op => {
                    self.ops.push((if top { n.id } else { 0 }, op.clone()));
                    self.deps.push(before);
                    vec![(self.ops.len() - 1) as u32]
                }
            };
            ends.insert(n.id, end);
        }
        let mut last: Vec<u32> = graph
            .nodes
            .iter()
            .filter(|n| !followed.contains(&n.id))
            .flat_map(|n| ends.get(&n.id).cloned().unwrap_or_default())
            .collect();
        if graph.nodes.is_empty() {
            last = after.to_vec();
        }
        last.sort_unstable();
        last.dedup();
        Ok(last)
    }
}

fn instantiate(e: *mut u64, g: u64, flags: u64) -> Result<(), CuResult> {
    if e.is_null() {
        return Err(code::INVALID_VALUE);
    }
    let (flat, allocs, frees, objects) = {
        let mut s = graphs();
        let graph = s.graph(g)?;
        let allocs = super::memory::allocs_of(graph.nodes.iter().map(|n| &n.op));
        let frees = super::memory::frees_of(graph.nodes.iter().map(|n| &n.op));
        let flat = Flat::of(graph)?;
        let graph = s.graphs.get(&g).ok_or(code::INVALID_VALUE)?;
        let objects = super::user_object::gather(&s, graph);
        (flat, allocs, frees, objects)
    };
    // Not under the graphs' lock: this is a call to the host.
    let conditional = super::conditional::has_cond(&flat.ops);
    let host = if conditional {
        Some(super::conditional::instantiate(g, &flat.ops, &flat.deps)?)
    } else {
        build_on_host(&flat.ops, &flat.deps)
    };
    let mut s = graphs();
    let h = s.issue();
    s.execs.insert(
        h,
        Exec {
            ops: Arc::new(flat.ops),
            deps: Arc::new(flat.deps),
            flags,
            host,
            stale: false,
            allocs,
            frees,
            conditional,
            objects,
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
        Op::Empty | Op::Graph(_) | Op::MemAlloc { .. } | Op::MemFree(_) => Ok(()),
        Op::Cond(_) => Err(crate::not_supported(
            "launching a graph with conditional nodes into a stream capture",
        )),
    }
}

fn launch(e: u64, st: CUstream) -> Result<(), CuResult> {
    crate::state::thread::need_ctx()?;
    let (ops, deps, mut host, stale, allocs, frees) = {
        let s = graphs();
        let ex = s.execs.get(&e).ok_or(code::INVALID_VALUE)?;
        let mem = (ex.allocs.clone(), ex.frees.clone());
        (
            ex.ops.clone(),
            ex.deps.clone(),
            ex.host,
            ex.stale,
            mem.0,
            mem.1,
        )
    };
    // The stream is checked once, before any of it is sent.
    let stream = crate::state::thread::resolve(st)?;
    super::memory::launched(&allocs, &frees);
    if stale {
        // Its operations changed since the host built it: again.
        if let Some(old) = host.take() {
            drop_on_host(old);
        }
        host = build_on_host(&ops, &deps);
        if let Some(ex) = graphs().execs.get_mut(&e) {
            ex.host = host;
            ex.stale = false;
        }
    }
    match host {
        // Into a capture, the operations join it one by one.
        Some(h) if !super::capture::capturing(st)? => {
            crate::managed::work(stream, |g| g.graph_launch(h, stream))
        }
        _ => {
            for (_, op) in ops.iter() {
                run(op, st)?;
            }
            Ok(())
        }
    }
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
    if ex.conditional {
        return Err(crate::not_supported(
            "changing a node of an executable graph with conditional nodes",
        ));
    }
    let ops = Arc::make_mut(&mut ex.ops);
    let slot = ops
        .iter_mut()
        .find(|(id, _)| *id == node && node != 0)
        .ok_or(code::INVALID_VALUE)?;
    if std::mem::discriminant(&slot.1) != std::mem::discriminant(&op) {
        return Err(code::INVALID_VALUE);
    }
    slot.1 = op;
    ex.stale = ex.host.is_some();
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
    let graph = s.graph(g).map_err(|_| 1)?;
    // Memory nodes cannot be updated: the graph must have the same ones.
    let allocs = super::memory::allocs_of(graph.nodes.iter().map(|n| &n.op));
    let Flat { mut ops, deps } = Flat::of(graph).map_err(|_| 1)?;
    let objects = super::user_object::gather(&s, s.graphs.get(&g).ok_or(1)?);
    let ex = s.execs.get_mut(&e).ok_or(1)?;
    if ex.conditional {
        crate::log_once("cuGraphExecUpdate of a graph with conditional nodes is not supported");
        // CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED
        return Err(7);
    }
    if allocs != ex.allocs {
        return Err(2);
    }
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
    ex.deps = Arc::new(deps);
    ex.stale = ex.host.is_some();
    ex.objects = objects;
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
        crate::state::thread::resolve(st)?;
        graphs().execs.get(&e).map(drop).ok_or(code::INVALID_VALUE)
    }

    fn cuGraphExecDestroy(e: u64) {
        let ex = graphs().execs.remove(&e).ok_or(code::INVALID_VALUE)?;
        if let Some(h) = ex.host {
            drop_on_host(h);
        }
        super::memory::release(ex.allocs);
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::super::model::Node;
    use super::super::Graph;
    use super::*;

    fn node(id: u64, op: Op, deps: &[u64]) -> Node {
        Node {
            id,
            op,
            deps: deps.to_vec(),
            from: 0,
        }
    }

    /// An event record names its event; the ops are told apart by it.
    fn ev(e: u64) -> Op {
        Op::EventRecord(e)
    }

    fn event_of(op: &Op) -> u64 {
        match op {
            Op::EventRecord(e) => *e,
            _ => panic!("not a record"),
        }
    }

    #[test]
    fn a_cluster_launch_runs_on_the_host_and_a_cooperative_one_stays_here() {
        let d = |x| protocol::Dim3 { x, y: 1, z: 1 };
        let k = KernelOp {
            func: 1,
            handle: 7,
            grid: d(16),
            block: d(128),
            shared: 0,
            cluster: d(8),
            flags: 0,
            params: vec![0; 8],
            sizes: vec![8],
            ptrs: Vec::new(),
        };
        match host_op(&Op::Kernel(k.clone())) {
            Some(GraphOp::Kernel { cluster, func, .. }) => {
                assert_eq!((cluster, func), (d(8), 7));
            }
            other => panic!("a cluster launch: {other:?}"),
        }
        let cooperative = KernelOp { flags: 1, ..k };
        assert!(host_op(&Op::Kernel(cooperative)).is_none());
    }

    #[test]
    fn branches_stay_branches_and_child_graphs_join_in_place() {
        // 1 -> {2, 3} -> 4, where 3 is a child graph a -> {b, c} and 4
        // follows an empty join node 5 after 2 and 3.
        let child = Graph {
            nodes: vec![
                node(10, ev(100), &[]),
                node(11, ev(101), &[10]),
                node(12, ev(102), &[10]),
            ],
            ..Default::default()
        };
        let g = Graph {
            nodes: vec![
                node(1, ev(1), &[]),
                node(2, ev(2), &[1]),
                node(3, Op::Graph(child), &[1]),
                node(5, Op::Empty, &[2, 3]),
                node(4, ev(4), &[5]),
            ],
            ..Default::default()
        };
        let f = Flat::of(&g).unwrap();
        let at = |e: u64| f.ops.iter().position(|(_, op)| event_of(op) == e).unwrap() as u32;
        let deps_of = |e: u64| {
            let mut d = f.deps[at(e) as usize].clone();
            d.sort_unstable();
            d
        };
        assert_eq!(f.ops.len(), 6, "empty and child graph nodes are spread");
        assert!(deps_of(1).is_empty());
        assert_eq!(deps_of(2), vec![at(1)]);
        assert_eq!(
            deps_of(100),
            vec![at(1)],
            "the child's root follows what the child node follows"
        );
        assert_eq!(deps_of(101), vec![at(100)]);
        assert_eq!(deps_of(102), vec![at(100)]);
        // 4 follows the join: 2 and the child's two last operations.
        let mut want = vec![at(2), at(101), at(102)];
        want.sort_unstable();
        assert_eq!(deps_of(4), want);
        // Every dependency is an earlier operation (what the host requires).
        for (i, d) in f.deps.iter().enumerate() {
            assert!(d.iter().all(|&x| (x as usize) < i));
        }
        // Nodes of the top graph keep their ids; the child's have none.
        assert_eq!(f.ops[at(4) as usize].0, 4);
        assert_eq!(f.ops[at(101) as usize].0, 0);
        // The host gets the same dependencies.
        let nodes = host_nodes(&f.ops, &f.deps).unwrap();
        assert_eq!(nodes[at(4) as usize].deps, f.deps[at(4) as usize]);
    }
}
