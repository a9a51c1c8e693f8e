//! Conditional scopes on a GPU: a scope is an empty CUDA graph of the
//! context's, where the guest's conditional handles are made
//! (`cuGraphConditionalHandleCreate`: the handle is the driver's value,
//! which the guest's kernels take as a parameter and set with
//! `cudaGraphSetConditional`). A graph instantiated in the scope is built
//! in that graph (conditional nodes with their bodies, at any depth),
//! instantiated, and its nodes removed again, so that the scope is empty
//! for the next one; the executable is independent of it and is launched
//! and destroyed as any host-built graph (`graph.rs`). A context holding a
//! scope or such an executable stays on its GPU.

use std::ptr::null_mut;

use cudarc::driver::sys;
use protocol::graph::{CondKind, GraphNode};
use protocol::Status;

use super::check;
use super::context::CudaContext;
use super::graph::HostGraph;
use crate::executor::{Conditionals, Handle};

/// Removes every node of `g` (a conditional node takes its bodies).
fn clear(g: sys::CUgraph) -> Result<(), Status> {
    let mut n = 0usize;
    // SAFETY: a graph of ours; a null array asks for the count.
    check(unsafe { sys::cuGraphGetNodes(g, null_mut(), &mut n) })?;
    let mut nodes: Vec<sys::CUgraphNode> = vec![null_mut(); n];
    // SAFETY: room for `n` nodes.
    check(unsafe { sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n) })?;
    for node in nodes.into_iter().take(n) {
        // SAFETY: a node of that graph, destroyed once.
        check(unsafe { sys::cuGraphDestroyNode(node) })?;
    }
    Ok(())
}

impl CudaContext {
    /// Adds a conditional node to `g` after `deps`, and its bodies into the
    /// graphs the driver made for them.
    pub(super) fn add_conditional(
        &self,
        g: sys::CUgraph,
        deps: &[sys::CUgraphNode],
        handle: u64,
        kind: CondKind,
        bodies: &[Vec<GraphNode>],
        funcs: &mut Vec<Handle>,
    ) -> Result<sys::CUgraphNode, Status> {
        use sys::CUgraphConditionalNodeType as T;
        let type_ = match kind {
            CondKind::If => T::CU_GRAPH_COND_TYPE_IF,
            CondKind::While => T::CU_GRAPH_COND_TYPE_WHILE,
            CondKind::Switch => T::CU_GRAPH_COND_TYPE_SWITCH,
        };
        // SAFETY: a plain C struct for which all-zero is valid; the fields
        // that matter are set below.
        let mut p: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
        p.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
        p.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
            handle,
            type_,
            size: u32::try_from(bodies.len()).map_err(|_| Status::InvalidValue)?,
            phGraph_out: null_mut(),
            ctx: self.ctx,
        };
        let mut out: sys::CUgraphNode = null_mut();
        // SAFETY: out-parameters on our stack; `deps` are nodes of `g` (no edge
        // data: full dependencies); the
        // driver fills `phGraph_out` with its array of `size` body graphs.
        check(unsafe {
            sys::cuGraphAddNode_v2(&mut out, g, deps.as_ptr(), null_mut(), deps.len(), &mut p)
        })?;
        // SAFETY: the union holds the conditional parameters written above.
        let outs = unsafe { p.__bindgen_anon_1.conditional.phGraph_out };
        if outs.is_null() {
            return Err(Status::Unknown);
        }
        // SAFETY: the driver's array of `bodies.len()` graphs, alive as
        // long as the node.
        let graphs = unsafe { std::slice::from_raw_parts(outs, bodies.len()) };
        for (&bg, body) in graphs.iter().zip(bodies) {
            self.add_nodes(bg, body, funcs)?;
        }
        Ok(out)
    }
}

impl Conditionals for CudaContext {
    fn cond_scope_create(&mut self) -> Result<Handle, Status> {
        self.bind()?;
        let mut g: sys::CUgraph = null_mut();
        // SAFETY: out-parameter on our stack; flags 0.
        check(unsafe { sys::cuGraphCreate(&mut g, 0) })?;
        self.next_handle += 1;
        let h = self.next_handle;
        self.scopes.insert(h, g);
        Ok(h)
    }

    fn cond_handle_create(
        &mut self,
        scope: Handle,
        default_value: u32,
        flags: u32,
    ) -> Result<u64, Status> {
        self.bind()?;
        let g = *self.scopes.get(&scope).ok_or(Status::InvalidHandle)?;
        let mut h: sys::CUgraphConditionalHandle = 0;
        // SAFETY: out-parameter on our stack; a graph of this context (the
        // driver checks the flags).
        check(unsafe {
            sys::cuGraphConditionalHandleCreate(&mut h, g, self.ctx, default_value, flags)
        })?;
        Ok(h)
    }

    fn cond_scope_destroy(&mut self, scope: Handle) -> Result<(), Status> {
        self.bind()?;
        let g = self.scopes.remove(&scope).ok_or(Status::InvalidHandle)?;
        // SAFETY: our graph, destroyed once; executables made from it are
        // independent of it.
        check(unsafe { sys::cuGraphDestroy(g) })
    }

    fn graph_instantiate_in(
        &mut self,
        scope: Handle,
        nodes: &[GraphNode],
    ) -> Result<Handle, Status> {
        self.bind()?;
        let g = *self.scopes.get(&scope).ok_or(Status::InvalidHandle)?;
        let mut funcs = Vec::new();
        let built = self.add_nodes(g, nodes, &mut funcs).and_then(|()| {
            let mut exec: sys::CUgraphExec = null_mut();
            // SAFETY: out-parameter on our stack; a complete graph of ours.
            check(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, g, 0) }).map(|()| exec)
        });
        // Empty again for the next graph, whatever happened.
        let cleared = clear(g);
        let exec = built?;
        let host = HostGraph {
            graph: g,
            exec,
            funcs,
            nodes: Vec::new(),
            scoped: true,
        };
        if let Err(e) = cleared {
            host.destroy();
            return Err(e);
        }
        self.next_handle += 1;
        let h = self.next_handle;
        self.graphs.insert(h, host);
        Ok(h)
    }
}
