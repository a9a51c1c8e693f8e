//! Graphs on the model: an executable is its nodes, run in their order
//! (each after those it depends on, as one stream would) when launched.
//!
//! Conditional nodes are modeled as the driver runs them: a scope (the
//! twin of a guest graph) holds conditional handles, each a value of the
//! context's; a graph instantiated in the scope keeps a copy of them. At
//! each launch every handle takes its default value (with
//! `CU_GRAPH_COND_ASSIGN_DEFAULT`) or 0, a kernel sets it (`cond_set`,
//! `cond_countdown` of `kernels.rs`, as `cudaGraphSetConditional` does), and
//! a conditional node reads it when reached: IF runs body 0 if non-zero (or
//! body 1, if it has one, if zero), WHILE runs body 0 as long as it is
//! non-zero, SWITCH runs body n for the value n (none past the last).

use std::collections::HashMap;

use protocol::graph::{visit, CondKind, GraphNode, GraphOp};
use protocol::Status;

use super::context::SimContext;
use crate::executor::checkpoint::{has_conditional, GraphImage};
use crate::executor::{Conditionals, Events, Graphs, Handle, Launches, Memory, Streams};

/// Iterations a WHILE node may run in one launch on the model (a GPU runs
/// on; the model would hang its worker): past it the launch fails as a
/// kernel that ran too long does (`CUDA_ERROR_LAUNCH_TIMEOUT`).
pub(super) const MAX_ITERATIONS: u64 = 1 << 20;

/// A conditional handle: its default value and flags.
#[derive(Debug, Clone, Copy)]
pub(super) struct CondHandle {
    default_value: u32,
    flags: u32,
}

/// The handles of a scope (or an executable's copy of them).
type Handles = Vec<(u64, CondHandle)>;

/// The context's graphs and conditional state.
#[derive(Default)]
pub(super) struct SimGraphs {
    /// Executables: their nodes, and the handles of the scope they were
    /// made in.
    execs: HashMap<Handle, (Vec<GraphNode>, Handles)>,
    /// Scopes and their handles.
    scopes: HashMap<Handle, Handles>,
    /// The values of the handles of the graph being launched (a kernel
    /// sets one of these; another handle is an error).
    pub(super) values: HashMap<u64, u32>,
}

impl SimGraphs {
    /// Whether it holds no executable graph and no conditional scope.
    pub(super) fn is_empty(&self) -> bool {
        self.execs.is_empty() && self.scopes.is_empty()
    }

    pub(super) fn clear(&mut self) {
        *self = SimGraphs::default();
    }

    /// Whether it holds what an image cannot: a conditional scope, or a
    /// graph made in one or with a conditional node.
    pub(super) fn conditional(&self) -> bool {
        !self.scopes.is_empty()
            || self
                .execs
                .values()
                .any(|(nodes, handles)| !handles.is_empty() || has_conditional(nodes))
    }

    /// The executables' images (none of them conditional).
    pub(super) fn images(&self) -> Vec<GraphImage> {
        self.execs
            .iter()
            .map(|(&h, (nodes, _))| GraphImage::of(h, nodes))
            .collect()
    }

    /// Keeps `nodes` as executable `handle` (a restore; its functions were
    /// checked).
    pub(super) fn restored(&mut self, handle: Handle, nodes: Vec<GraphNode>) {
        self.execs.insert(handle, (nodes, Handles::default()));
    }
}

impl SimContext {
    /// Checks every kernel of `nodes` (at any depth) is the context's.
    pub(super) fn check_funcs(&self, nodes: &[GraphNode]) -> Result<(), Status> {
        visit(nodes, &mut |n| match n.op {
            GraphOp::Kernel { func, .. } if !self.functions.contains_key(&func) => {
                Err(Status::InvalidHandle)
            }
            _ => Ok(()),
        })
    }

    pub(super) fn sim_graph_instantiate(
        &mut self,
        scope: Option<Handle>,
        nodes: &[GraphNode],
    ) -> Result<Handle, Status> {
        self.alive()?;
        self.check_funcs(nodes)?;
        let handles = match scope {
            Some(s) => self
                .graphs
                .scopes
                .get(&s)
                .ok_or(Status::InvalidHandle)?
                .clone(),
            None => Vec::new(),
        };
        let h = self.new_handle();
        self.graphs.execs.insert(h, (nodes.to_vec(), handles));
        Ok(h)
    }

    /// Sets a conditional handle's value from a kernel: only a handle of
    /// the graph being launched.
    pub(super) fn set_conditional(&mut self, handle: u64, value: u32) -> Result<(), Status> {
        match self.graphs.values.get_mut(&handle) {
            Some(v) => {
                *v = value;
                Ok(())
            }
            None => Err(Status::IllegalAddress),
        }
    }

    fn cond_value(&self, handle: u64) -> Result<u32, Status> {
        self.graphs
            .values
            .get(&handle)
            .copied()
            .ok_or(Status::InvalidValue)
    }

    fn run_nodes(&mut self, nodes: &[GraphNode], stream: Handle) -> Result<(), Status> {
        for n in nodes {
            match &n.op {
                // The model has no clusters: the grid's blocks run as one.
                GraphOp::Kernel {
                    func,
                    grid,
                    block,
                    shared_mem,
                    params,
                    ..
                } => self.launch(*func, *grid, *block, *shared_mem, stream, params)?,
                GraphOp::Memset {
                    dst,
                    pitch,
                    value,
                    elem,
                    width,
                    height,
                } => {
                    for row in 0..*height {
                        let at = dst + row * pitch;
                        self.memset(at, *value, *elem, *width, stream)?;
                    }
                }
                GraphOp::Copy { dst, src, len } => self.dtod(*dst, *src, *len, stream)?,
                GraphOp::Empty => {}
                GraphOp::EventRecord { event } => self.event_record(*event, stream)?,
                GraphOp::EventWait { event } => self.stream_wait_event(stream, *event, 0)?,
                GraphOp::Conditional {
                    handle,
                    kind,
                    bodies,
                } => self.run_conditional(*handle, *kind, bodies, stream)?,
            }
        }
        Ok(())
    }

    fn run_conditional(
        &mut self,
        handle: u64,
        kind: CondKind,
        bodies: &[Vec<GraphNode>],
        stream: Handle,
    ) -> Result<(), Status> {
        let v = self.cond_value(handle)?;
        match kind {
            CondKind::If => match (v != 0, bodies) {
                (true, [then, ..]) => self.run_nodes(then, stream),
                (false, [_, otherwise]) => self.run_nodes(otherwise, stream),
                _ => Ok(()),
            },
            CondKind::Switch => match bodies.get(v as usize) {
                Some(b) => self.run_nodes(b, stream),
                None => Ok(()),
            },
            CondKind::While => {
                let body = bodies.first().ok_or(Status::InvalidValue)?;
                let mut n = 0u64;
                while self.cond_value(handle)? != 0 {
                    n += 1;
                    if n > MAX_ITERATIONS {
                        return Err(Status::from_code(702));
                    }
                    self.run_nodes(body, stream)?;
                }
                Ok(())
            }
        }
    }
}

impl Graphs for SimContext {
    /// The nodes are kept; a launch runs them.
    fn graph_instantiate(
        &mut self,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        self.sim_graph_instantiate(None, nodes)
    }

    fn graph_launch(&mut self, exec: Handle, stream: Handle) -> Result<(), Status> {
        let (nodes, handles) = self
            .graphs
            .execs
            .get(&exec)
            .ok_or(Status::InvalidHandle)?
            .clone();
        for (h, c) in &handles {
            let v = if c.flags & 1 != 0 { c.default_value } else { 0 };
            self.graphs.values.insert(*h, v);
        }
        let r = self.run_nodes(&nodes, stream);
        for (h, _) in &handles {
            self.graphs.values.remove(h);
        }
        r
    }

    fn graph_destroy(&mut self, exec: Handle) -> Result<(), Status> {
        self.graphs
            .execs
            .remove(&exec)
            .map(drop)
            .ok_or(Status::InvalidHandle)
    }
}

impl Conditionals for SimContext {
    fn graph_instantiate_in(
        &mut self,
        scope: Handle,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        self.sim_graph_instantiate(Some(scope), nodes)
    }

    fn cond_scope_create(&mut self) -> Result<Handle, Status> {
        self.alive()?;
        let h = self.new_handle();
        self.graphs.scopes.insert(h, Vec::new());
        Ok(h)
    }

    fn cond_handle_create(
        &mut self,
        scope: Handle,
        default_value: u32,
        flags: u32,
    ) -> Result<u64, Status> {
        if flags > 1 {
            return Err(Status::InvalidValue);
        }
        if !self.graphs.scopes.contains_key(&scope) {
            return Err(Status::InvalidHandle);
        }
        let h = self.new_handle();
        let c = CondHandle {
            default_value,
            flags,
        };
        if let Some(s) = self.graphs.scopes.get_mut(&scope) {
            s.push((h, c));
        }
        Ok(h)
    }

    fn cond_scope_destroy(&mut self, scope: Handle) -> Result<(), Status> {
        self.graphs
            .scopes
            .remove(&scope)
            .map(drop)
            .ok_or(Status::InvalidHandle)
    }
}
