//! The graph data model: the operations a node holds, nodes, graphs, and
//! the store of every graph, executable graph and capture of the process
//! ([`GRAPHS`]).

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard};

use protocol::Dim3;

use super::{capture, conditional, exec, memory, user_object};
use crate::copy_nd::Box3d;
use crate::host_fn::Call;
use crate::{code, CuResult};

/// A kernel launch as a node keeps it: the host's function handle and the
/// parameter values, packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelOp {
    /// The `CUfunction` (or `CUkernel`) the program named.
    pub func: usize,
    /// The host's handle of it.
    pub handle: u64,
    pub grid: Dim3,
    pub block: Dim3,
    pub shared: u32,
    pub cluster: Dim3,
    pub flags: u32,
    /// Parameter values, back to back.
    pub params: Vec<u8>,
    /// Each parameter's size (to point at each value for a getter).
    pub sizes: Vec<u32>,
    /// Pointers to each value, made for a getter.
    pub ptrs: Vec<usize>,
}

/// A 2D memset as a node keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemsetOp {
    pub dst: u64,
    pub pitch: usize,
    pub value: u32,
    pub elem: u32,
    pub width: usize,
    pub height: usize,
}

/// What a node does: one of the operations a stream runs.
#[derive(Clone)]
pub(crate) enum Op {
    Kernel(KernelOp),
    Copy(Box3d),
    Memset(MemsetOp),
    Host(Call),
    Empty,
    EventRecord(u64),
    EventWait(u64),
    /// A child graph (a copy of it, as the node was made).
    Graph(Graph),
    /// A graph allocation, made with the node ([`memory`]).
    MemAlloc {
        ptr: u64,
        size: u64,
    },
    /// The end of a graph allocation's use in the graph.
    MemFree(u64),
    /// A conditional node ([`conditional`]).
    Cond(conditional::CondOp),
}

impl Op {
    /// `CUgraphNodeType`.
    pub(super) fn node_type(&self) -> c_int {
        match self {
            Op::Kernel(_) => 0,
            Op::Copy(_) => 1,
            Op::Memset(_) => 2,
            Op::Host(_) => 3,
            Op::Graph(_) => 4,
            Op::Empty => 5,
            Op::EventWait(_) => 6,
            Op::EventRecord(_) => 7,
            Op::MemAlloc { .. } => 10,
            Op::MemFree(_) => 11,
            Op::Cond(_) => 13,
        }
    }
}

/// A node: its handle, what it does, what it waits for, and (in a clone)
/// the node it was copied from.
#[derive(Clone)]
pub(crate) struct Node {
    pub id: u64,
    pub op: Op,
    pub deps: Vec<u64>,
    pub from: u64,
}

/// A graph: nodes in the order they were added.
#[derive(Clone, Default)]
pub(crate) struct Graph {
    pub nodes: Vec<Node>,
    /// The references to user objects it holds (taken again by a clone or
    /// a child graph node's copy, released when it goes).
    pub objects: user_object::Refs,
}

impl Graph {
    pub(super) fn node(&self, id: u64) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    pub(super) fn node_mut(&mut self, id: u64) -> Option<&mut Node> {
        self.nodes.iter_mut().find(|n| n.id == id)
    }

    /// The nodes in an order that runs each after all it depends on
    /// (earliest added first among those ready); `None` for a cycle.
    pub fn order(&self) -> Option<Vec<usize>> {
        let index: HashMap<u64, usize> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id, i))
            .collect();
        let mut waiting: Vec<usize> = self.nodes.iter().map(|n| n.deps.len()).collect();
        let mut after: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for d in &n.deps {
                after[*index.get(d)?].push(i);
            }
        }
        let mut ready: std::collections::BTreeSet<usize> =
            (0..self.nodes.len()).filter(|&i| waiting[i] == 0).collect();
        let mut order = Vec::with_capacity(self.nodes.len());
        while let Some(i) = ready.pop_first() {
            order.push(i);
            for &j in &after[i] {
                waiting[j] -= 1;
                if waiting[j] == 0 {
                    ready.insert(j);
                }
            }
        }
        (order.len() == self.nodes.len()).then_some(order)
    }
}

/// Everything graph-shaped the process holds.
#[derive(Default)]
pub(crate) struct Store {
    pub graphs: HashMap<u64, Graph>,
    /// Which graph each node is in.
    pub owner: HashMap<u64, u64>,
    pub execs: HashMap<u64, exec::Exec>,
    pub captures: capture::Captures,
    pub allocs: memory::GraphAllocs,
    pub conds: conditional::Conds,
    next: u64,
}

/// Handles issued here start at this value (never a pointer's or a host
/// handle's, for a reader of a trace).
const FIRST_HANDLE: u64 = 0x6a00_0000_0000;

impl Store {
    pub fn issue(&mut self) -> u64 {
        self.next += 1;
        FIRST_HANDLE + self.next
    }

    /// A new empty graph.
    pub fn new_graph(&mut self) -> u64 {
        let h = self.issue();
        self.graphs.insert(h, Graph::default());
        h
    }

    pub fn graph(&mut self, h: u64) -> Result<&mut Graph, CuResult> {
        self.graphs.get_mut(&h).ok_or(code::INVALID_VALUE)
    }

    /// Adds a node to graph `g` after `deps` (nodes of that graph).
    pub fn add(&mut self, g: u64, op: Op, deps: &[u64]) -> Result<u64, CuResult> {
        let graph = self.graphs.get(&g).ok_or(code::INVALID_VALUE)?;
        let mut uniq = Vec::with_capacity(deps.len());
        for d in deps {
            if graph.node(*d).is_none() {
                return Err(code::INVALID_VALUE);
            }
            if !uniq.contains(d) {
                uniq.push(*d);
            }
        }
        let id = self.issue();
        self.owner.insert(id, g);
        self.graph(g)?.nodes.push(Node {
            id,
            op,
            deps: uniq,
            from: 0,
        });
        Ok(id)
    }

    /// The graph a node is in, and the node.
    pub fn node_mut(&mut self, n: u64) -> Result<&mut Node, CuResult> {
        let g = *self.owner.get(&n).ok_or(code::INVALID_VALUE)?;
        self.graph(g)?.node_mut(n).ok_or(code::INVALID_VALUE)
    }

    /// Gives node `n` new parameters: `op` must be of the node's type
    /// (and a memory node's parameters cannot change).
    pub fn set_op(&mut self, n: u64, op: Op) -> Result<(), CuResult> {
        let node = self.node_mut(n)?;
        if node.op.node_type() != op.node_type() {
            return Err(code::INVALID_VALUE);
        }
        node.op = op;
        Ok(())
    }

    /// A copy of graph `g` with new node handles.
    pub fn clone_graph(&mut self, g: u64) -> Result<u64, CuResult> {
        let mut copy = self.graphs.get(&g).ok_or(code::INVALID_VALUE)?.clone();
        let h = self.issue();
        let mut map = HashMap::new();
        for n in &mut copy.nodes {
            let id = self.issue();
            map.insert(n.id, id);
            n.from = n.id;
            n.id = id;
            self.owner.insert(id, h);
        }
        for n in &mut copy.nodes {
            for d in &mut n.deps {
                *d = map[d];
            }
        }
        self.graphs.insert(h, copy);
        Ok(h)
    }

    /// Forgets a graph and its nodes; returns the graph allocations its
    /// memory nodes made (see [`memory::release`]).
    pub fn destroy(&mut self, g: u64) -> Result<Vec<u64>, CuResult> {
        let graph = self.graphs.remove(&g).ok_or(code::INVALID_VALUE)?;
        for n in &graph.nodes {
            self.owner.remove(&n.id);
        }
        Ok(memory::allocs_of(graph.nodes.iter().map(|n| &n.op)))
    }
}

/// Every graph, executable graph, capture, graph allocation and
/// conditional of the process (`None` until first used): changed by the
/// graph entry points and by stream capture, through [`graphs`].
static GRAPHS: Mutex<Option<Store>> = Mutex::new(None);

/// [`store`]'s lock.
pub(crate) struct StoreGuard(MutexGuard<'static, Option<Store>>);

impl std::ops::Deref for StoreGuard {
    type Target = Store;
    fn deref(&self) -> &Store {
        self.0.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl std::ops::DerefMut for StoreGuard {
    fn deref_mut(&mut self) -> &mut Store {
        self.0.get_or_insert_with(Store::default)
    }
}

/// The process's graphs, made on first use (never held across a call to
/// the vGPU).
pub(crate) fn graphs() -> StoreGuard {
    let mut g = StoreGuard(crate::state::process::lock(&GRAPHS));
    g.0.get_or_insert_with(Store::default);
    g
}
