//! Conditional nodes (IF, WHILE, SWITCH): their condition is a value that
//! device code sets (`cudaGraphSetConditional(handle, v)` in a kernel) and
//! the GPU reads when it reaches the node, so a graph holding one cannot
//! run as its operations one by one: it runs as one real CUDA graph, built
//! on the host.
//!
//! A handle must be the driver's (kernels take it as a parameter), made for
//! the graph that will hold its node. So the first handle of a graph makes
//! the graph's twin on the host, a conditional scope (an empty CUDA graph
//! there), and every handle of the graph and of its conditionals' bodies is
//! made in that scope. A conditional node keeps its body graphs, graphs of
//! this store like any other (filled with the node API or by capturing
//! into them with `cuStreamBeginCaptureToGraph`) and destroyed with it.
//! Instantiating a graph with conditional nodes sends the whole of it,
//! bodies nested, to be built in its scope (`GraphInstantiateIn`); the
//! executable is launched and destroyed as any host-built graph. Graphs
//! without conditional nodes go the way they always went (`exec.rs`).
//!
//! What cannot work this way is refused with CUDA_ERROR_NOT_SUPPORTED and
//! a logged reason: a host function or a copy to or from the guest's own
//! memory in such a graph, a graph with conditional nodes as a child graph,
//! changing an executable of one, launching one into a stream capture.

use std::collections::{HashMap, HashSet};
use std::ffi::c_uint;

use cudarc::driver::sys::CUcontext;
use protocol::graph::{CondKind, GraphNode, GraphOp};

use super::exec::{host_op, Flat};
use super::{graphs, NodeParams, Op, Store};
use crate::state::out;
use crate::{code, not_supported, CuResult};

/// `CU_GRAPH_COND_ASSIGN_DEFAULT`: the only flag.
const ASSIGN_DEFAULT: c_uint = 1;

/// A conditional node as the graph keeps it.
#[derive(Debug, Clone)]
pub(crate) struct CondOp {
    /// The driver's handle.
    pub handle: u64,
    pub kind: CondKind,
    /// Its body graphs (graphs of the store); `phGraph_out` points here.
    pub bodies: Box<[u64]>,
}

/// Which graphs hold conditionals, and where their handles were made.
#[derive(Default)]
pub(crate) struct Conds {
    /// Body graph -> the graph holding its conditional node.
    parent: HashMap<u64, u64>,
    /// Top graph -> its scope on the host.
    scopes: HashMap<u64, u64>,
    /// (handle, top graph it was made for).
    handles: HashSet<(u64, u64)>,
}

impl Store {
    /// The graph `g` is the body of, at any depth (`g` itself if none).
    fn top(&self, mut g: u64) -> u64 {
        while let Some(&p) = self.conds.parent.get(&g) {
            g = p;
        }
        g
    }

    /// Forgets `g`'s conditional nodes' bodies (at any depth) and, if it is
    /// a top graph, its handles; returns its scope on the host, if any.
    pub(super) fn forget_conds(&mut self, g: u64) -> Option<u64> {
        let bodies: Vec<u64> = self
            .graphs
            .get(&g)
            .map(|gr| bodies_of(gr.nodes.iter().map(|n| &n.op)))
            .unwrap_or_default();
        self.drop_bodies(bodies);
        self.conds.handles.retain(|(_, top)| *top != g);
        self.conds.scopes.remove(&g)
    }

    /// Destroys conditional bodies (and theirs, at any depth).
    pub(super) fn drop_bodies(&mut self, bodies: Vec<u64>) {
        for b in bodies {
            self.forget_conds(b);
            self.conds.parent.remove(&b);
            let _ = self.destroy(b);
        }
    }

    /// Whether `g` is a conditional's body (destroyed only with its node).
    pub(super) fn is_body(&self, g: u64) -> bool {
        self.conds.parent.contains_key(&g)
    }
}

/// The body graphs of conditional nodes among `ops`.
pub(super) fn bodies_of<'a>(ops: impl Iterator<Item = &'a Op>) -> Vec<u64> {
    ops.filter_map(|op| match op {
        Op::Cond(c) => Some(c.bodies.iter().copied()),
        _ => None,
    })
    .flatten()
    .collect()
}

/// Whether a graph holds a conditional node (it cannot be a child graph).
pub(super) fn refuse_child(g: &super::Graph) -> Result<(), CuResult> {
    if g.nodes.iter().any(|n| matches!(n.op, Op::Cond(_))) {
        return Err(not_supported(
            "a graph with conditional nodes as a child graph",
        ));
    }
    Ok(())
}

/// A graph with conditional nodes is not cloned (the clone would share the
/// bodies, and its handles were made for the original).
pub(super) fn refuse_clone(g: &super::Graph) -> Result<(), CuResult> {
    if g.nodes.iter().any(|n| matches!(n.op, Op::Cond(_))) {
        return Err(not_supported("cloning a graph with conditional nodes"));
    }
    Ok(())
}

/// Tells the host to let a scope go (its errors change nothing here).
pub(super) fn drop_scope(scope: Option<u64>) {
    if let Some(s) = scope {
        let _ = crate::state::gpu(|g| g.cond_scope_destroy(s));
    }
}

/// `g`'s scope on the host, made on first use.
fn scope_of(top: u64) -> Result<u64, CuResult> {
    if let Some(&s) = graphs().conds.scopes.get(&top) {
        return Ok(s);
    }
    // Not under the graphs' lock: this is a call to the host.
    let s = crate::state::gpu(|g| g.cond_scope_create())?;
    let mut st = graphs();
    if !st.graphs.contains_key(&top) {
        // The graph went meanwhile.
        drop(st);
        drop_scope(Some(s));
        return Err(code::INVALID_VALUE);
    }
    match st.conds.scopes.get(&top) {
        // Another thread made one meanwhile.
        Some(&other) => {
            drop(st);
            drop_scope(Some(s));
            Ok(other)
        }
        None => {
            st.conds.scopes.insert(top, s);
            Ok(s)
        }
    }
}

/// Adds a conditional node to `g` from `CUgraphNodeParams` (type 13): its
/// handle must have been made for `g` (or the graph `g` is a body of); its
/// body graphs are made and written to the caller's `phGraph_out`.
pub(super) fn add_node(
    node: *mut u64,
    g: u64,
    d: *const u64,
    n: usize,
    p: *mut NodeParams,
) -> Result<(), CuResult> {
    if node.is_null() || p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: a CUgraphNodeParams (API contract), whose union holds
    // CUDA_CONDITIONAL_NODE_PARAMS: handle, type, size, phGraph_out, ctx.
    let body = unsafe { &mut (*p).body };
    let handle = body[0];
    let (ty, size) = (body[1] as u32, (body[1] >> 32) as usize);
    let kind = CondKind::from_u32(ty).ok_or(code::INVALID_VALUE)?;
    if !kind.bodies_ok(size) {
        return Err(code::INVALID_VALUE);
    }
    let deps = super::deps(d, n)?;
    let mut s = graphs();
    s.graph(g)?;
    let top = s.top(g);
    if !s.conds.handles.contains(&(handle, top)) {
        return Err(code::INVALID_VALUE);
    }
    let bodies: Box<[u64]> = (0..size).map(|_| s.new_graph()).collect();
    for b in bodies.iter() {
        s.conds.parent.insert(*b, g);
    }
    let array = bodies.as_ptr() as u64;
    let list = bodies.to_vec();
    let op = Op::Cond(CondOp {
        handle,
        kind,
        bodies,
    });
    match s.add(g, op, deps) {
        Ok(id) => {
            // The driver's array: valid as long as the node.
            body[2] = array;
            out(node, id)
        }
        Err(e) => {
            for b in list {
                s.conds.parent.remove(&b);
                let _ = s.destroy(b);
            }
            Err(e)
        }
    }
}

/// The host's nodes for `ops` (a graph's, flattened), conditionals' bodies
/// nested; `depth` 0 for the top graph.
fn host_tree(
    s: &Store,
    ops: &[(u64, Op)],
    deps: &[Vec<u32>],
    depth: usize,
) -> Result<Vec<GraphNode>, CuResult> {
    if depth > protocol::graph::MAX_DEPTH {
        return Err(not_supported("conditional nodes nested this deep"));
    }
    let mut nodes = Vec::with_capacity(ops.len());
    for (i, (_, op)) in ops.iter().enumerate() {
        let gop = match op {
            Op::Cond(c) => {
                let mut bodies = Vec::with_capacity(c.bodies.len());
                for b in c.bodies.iter() {
                    let g = s.graphs.get(b).ok_or(code::INVALID_VALUE)?;
                    let f = Flat::of(g)?;
                    bodies.push(host_tree(s, &f.ops, &f.deps, depth + 1)?);
                }
                GraphOp::Conditional {
                    handle: c.handle,
                    kind: c.kind,
                    bodies,
                }
            }
            op => host_op(op).ok_or_else(|| {
                not_supported(
                    "a host function, a copy with host memory or a cluster launch \
                     in a graph with conditional nodes",
                )
            })?,
        };
        if depth > 0 && matches!(gop, GraphOp::EventRecord { .. } | GraphOp::EventWait { .. }) {
            return Err(not_supported("an event node in a conditional body"));
        }
        let d = deps.get(i).cloned().unwrap_or_default();
        if d.len() > protocol::graph::MAX_DEPS {
            return Err(not_supported("a node with this many dependencies"));
        }
        nodes.push(GraphNode { op: gop, deps: d });
    }
    Ok(nodes)
}

/// Whether `ops` hold a conditional node.
pub(super) fn has_cond(ops: &[(u64, Op)]) -> bool {
    ops.iter().any(|(_, op)| matches!(op, Op::Cond(_)))
}

/// Builds graph `g`'s operations (with conditional nodes) on the host, in
/// its scope; the executable's handle.
pub(super) fn instantiate(g: u64, ops: &[(u64, Op)], deps: &[Vec<u32>]) -> Result<u64, CuResult> {
    let (scope, data) = {
        let s = graphs();
        if s.is_body(g) {
            // A body is instantiated only within its node.
            return Err(code::INVALID_VALUE);
        }
        let scope = *s.conds.scopes.get(&g).ok_or(code::INVALID_VALUE)?;
        let nodes = host_tree(&s, ops, deps, 0)?;
        (scope, protocol::graph::encode_graph(&nodes))
    };
    // Not under the graphs' lock: this is a call to the host.
    crate::state::gpu(|gpu| gpu.graph_instantiate_in(scope, &data))
}

export! {
    fn cuGraphConditionalHandleCreate(h: *mut u64, g: u64, _ctx: CUcontext, default_value: c_uint, flags: c_uint) {
        if h.is_null() || flags & !ASSIGN_DEFAULT != 0 {
            return Err(code::INVALID_VALUE);
        }
        crate::state::thread::need_ctx()?;
        let top = {
            let mut s = graphs();
            s.graph(g)?;
            s.top(g)
        };
        let scope = scope_of(top)?;
        let handle = crate::state::gpu(|gpu| gpu.cond_handle_create(scope, default_value, flags))?;
        graphs().conds.handles.insert((handle, top));
        out(h, handle)
    }
}
