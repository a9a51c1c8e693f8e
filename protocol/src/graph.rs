//! A CUDA graph the guest built, to be built, instantiated and launched on
//! the host as one graph (`GraphInstantiate`'s data): its nodes in an order
//! where every node comes after the nodes it depends on, each naming those
//! by index.
//!
//! Only nodes the host can run from what it holds: kernels (the host's
//! function handles, the parameter values packed as for a launch, their
//! thread block clusters), memsets
//! and copies within device memory, event records and waits, empty nodes.
//! A graph with anything else (a host function, a copy from or to the
//! guest's own memory) stays in the guest and runs node by node.
//!
//! A conditional node (IF, WHILE, SWITCH; `GraphInstantiateIn` only, in a
//! scope that holds its handle) carries its body graphs, each a node list
//! of its own (possibly empty), nested at most [`MAX_DEPTH`] deep; the
//! nodes of all bodies count toward [`MAX_NODES`]. Bodies hold only what
//! the driver allows there: kernels, memsets, copies, empty nodes and
//! conditionals.
//!
//! Layout, little-endian: `[count u32]`, then per node `[kind u32][deps
//! u32][dep u32 x deps]` and the kind's fields; a kernel with clusters is
//! a kind of its own, its cluster's dimensions after a kernel's fields; a
//! conditional's are `[handle u64][type u32][bodies u32]` and each body as
//! a graph.

use crate::codec::{len_u32, Reader};
use crate::request::wire::read_dim;
use crate::{bad, Dim3, ProtoError};

/// Nodes a graph may have, at most.
pub const MAX_NODES: usize = 8192;
/// Dependencies a node may have, at most.
pub const MAX_DEPS: usize = 256;
/// Parameter bytes of a kernel node, at most (the driver's own limit).
pub const MAX_PARAMS: usize = 32764;
/// Conditional nodes nested in one another, at most.
pub const MAX_DEPTH: usize = 8;
/// Bodies of a SWITCH node, at most.
pub const MAX_BODIES: usize = 256;

/// `CUgraphConditionalNodeType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CondKind {
    /// Runs body 0 if the value is non-zero (body 1, if there is one, if zero).
    If,
    /// Runs body 0 as long as the value is non-zero.
    While,
    /// Runs body n when the value is n (none when it is past the last).
    Switch,
}

impl CondKind {
    /// From the driver's number (0, 1, 2).
    pub fn from_u32(v: u32) -> Option<CondKind> {
        Some(match v {
            0 => CondKind::If,
            1 => CondKind::While,
            2 => CondKind::Switch,
            _ => return None,
        })
    }

    /// The driver's number.
    pub fn as_u32(self) -> u32 {
        match self {
            CondKind::If => 0,
            CondKind::While => 1,
            CondKind::Switch => 2,
        }
    }

    /// Whether a node of this kind may have `n` bodies (the driver's rule:
    /// IF 1 or 2, WHILE 1, SWITCH any number from 1).
    pub fn bodies_ok(self, n: usize) -> bool {
        match self {
            CondKind::If => (1..=2).contains(&n),
            CondKind::While => n == 1,
            CondKind::Switch => (1..=MAX_BODIES).contains(&n),
        }
    }
}

/// What a node does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphOp {
    /// A kernel launch.
    Kernel {
        /// The host's function handle.
        func: u64,
        /// Grid.
        grid: Dim3,
        /// Block.
        block: Dim3,
        /// Dynamic shared memory, bytes.
        shared_mem: u32,
        /// The parameter values, packed as for a launch.
        params: Vec<u8>,
        /// Thread block cluster dimensions (all zero: none), as a
        /// `cuLaunchKernelEx` attribute gives them.
        cluster: Dim3,
    },
    /// A 2D memset of device memory: `height` rows of `width` elements of
    /// `elem` bytes (1, 2 or 4), `pitch` bytes apart.
    Memset {
        /// First byte.
        dst: u64,
        /// Bytes from one row to the next.
        pitch: u64,
        /// The value (its low `elem` bytes).
        value: u32,
        /// Element size.
        elem: u32,
        /// Elements per row.
        width: u64,
        /// Rows.
        height: u64,
    },
    /// A copy of `len` bytes within device memory.
    Copy {
        /// Destination.
        dst: u64,
        /// Source.
        src: u64,
        /// Bytes.
        len: u64,
    },
    /// Nothing (a join point).
    Empty,
    /// Records an event (the host's handle).
    EventRecord {
        /// Event handle.
        event: u64,
    },
    /// Waits for an event (the host's handle).
    EventWait {
        /// Event handle.
        event: u64,
    },
    /// A conditional node: which of `bodies` run (and how often) is decided
    /// on the device by the value of `handle` when the node is reached.
    Conditional {
        /// The conditional handle (the driver's value, made in the scope).
        handle: u64,
        /// IF, WHILE or SWITCH.
        kind: CondKind,
        /// Its body graphs.
        bodies: Vec<Vec<GraphNode>>,
    },
}

/// A node: what it does, and the indices of the nodes it comes after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphNode {
    /// What it does.
    pub op: GraphOp,
    /// Indices of earlier nodes it depends on.
    pub deps: Vec<u32>,
}

const KERNEL: u32 = 0;
const MEMSET: u32 = 1;
const COPY: u32 = 2;
const EMPTY: u32 = 3;
const EVENT_RECORD: u32 = 4;
const EVENT_WAIT: u32 = 5;
const CONDITIONAL: u32 = 6;
/// A kernel with thread block clusters: a kernel's fields, then the
/// cluster's dimensions.
const KERNEL_CLUSTER: u32 = 7;

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_dim(out: &mut Vec<u8>, d: Dim3) {
    for v in [d.x, d.y, d.z] {
        put32(out, v);
    }
}

/// Encodes a graph.
pub fn encode_graph(nodes: &[GraphNode]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, nodes);
    out
}

fn encode_into(out: &mut Vec<u8>, nodes: &[GraphNode]) {
    put32(out, len_u32(nodes.len()));
    for n in nodes {
        let kind = match n.op {
            GraphOp::Kernel { cluster, .. } if cluster != Dim3::default() => KERNEL_CLUSTER,
            GraphOp::Kernel { .. } => KERNEL,
            GraphOp::Memset { .. } => MEMSET,
            GraphOp::Copy { .. } => COPY,
            GraphOp::Empty => EMPTY,
            GraphOp::EventRecord { .. } => EVENT_RECORD,
            GraphOp::EventWait { .. } => EVENT_WAIT,
            GraphOp::Conditional { .. } => CONDITIONAL,
        };
        put32(out, kind);
        put32(out, len_u32(n.deps.len()));
        for &d in &n.deps {
            put32(out, d);
        }
        match &n.op {
            GraphOp::Kernel {
                func,
                grid,
                block,
                shared_mem,
                params,
                cluster,
            } => {
                put64(out, *func);
                put_dim(out, *grid);
                put_dim(out, *block);
                put32(out, *shared_mem);
                put32(out, len_u32(params.len()));
                out.extend_from_slice(params);
                if *cluster != Dim3::default() {
                    put_dim(out, *cluster);
                }
            }
            GraphOp::Memset {
                dst,
                pitch,
                value,
                elem,
                width,
                height,
            } => {
                put64(out, *dst);
                put64(out, *pitch);
                put32(out, *value);
                put32(out, *elem);
                put64(out, *width);
                put64(out, *height);
            }
            GraphOp::Copy { dst, src, len } => {
                put64(out, *dst);
                put64(out, *src);
                put64(out, *len);
            }
            GraphOp::Empty => {}
            GraphOp::EventRecord { event } | GraphOp::EventWait { event } => put64(out, *event),
            GraphOp::Conditional {
                handle,
                kind,
                bodies,
            } => {
                put64(out, *handle);
                put32(out, kind.as_u32());
                put32(out, len_u32(bodies.len()));
                for b in bodies {
                    encode_into(out, b);
                }
            }
        }
    }
}

/// Decodes a graph, checking every count, index and size: a dependency
/// must name an earlier node (so the graph has no cycle), and nothing may
/// follow the last node.
pub fn decode_graph(data: &[u8]) -> Result<Vec<GraphNode>, ProtoError> {
    let mut r = Reader::new(data);
    let mut total = 0usize;
    let nodes = decode_nodes(&mut r, 0, &mut total)?;
    if nodes.is_empty() {
        return Err(bad("graph", "no nodes"));
    }
    if r.remaining() != 0 {
        return Err(bad("graph", "bytes after the last node"));
    }
    Ok(nodes)
}

/// One node list: the top graph (`depth` 0) or a conditional's body;
/// `total` counts the nodes of every list so far.
fn decode_nodes(
    r: &mut Reader<'_>,
    depth: usize,
    total: &mut usize,
) -> Result<Vec<GraphNode>, ProtoError> {
    let count = r.u32()? as usize;
    *total = total.saturating_add(count);
    if *total > MAX_NODES {
        return Err(bad("graph", format!("more than {MAX_NODES} nodes")));
    }
    let mut nodes = Vec::with_capacity(count);
    for i in 0..count {
        let kind = r.u32()?;
        let n = r.u32()? as usize;
        if n > MAX_DEPS {
            return Err(bad("graph", format!("node {i}: {n} dependencies")));
        }
        let mut deps = Vec::with_capacity(n);
        for _ in 0..n {
            let d = r.u32()?;
            if d as usize >= i {
                return Err(bad("graph", format!("node {i} depends on node {d}")));
            }
            deps.push(d);
        }
        let op = match kind {
            KERNEL | KERNEL_CLUSTER => {
                let func = r.u64()?;
                let grid = read_dim(r)?;
                let block = read_dim(r)?;
                let shared_mem = r.u32()?;
                let len = r.u32()? as usize;
                if len > MAX_PARAMS {
                    return Err(bad("graph", format!("node {i}: {len} parameter bytes")));
                }
                let params = r.bytes(len)?.to_vec();
                let cluster = if kind == KERNEL_CLUSTER {
                    let c = read_dim(r)?;
                    if [c.x, c.y, c.z].contains(&0) {
                        return Err(bad("graph", format!("node {i}: a cluster of {c:?}")));
                    }
                    c
                } else {
                    Dim3::default()
                };
                GraphOp::Kernel {
                    func,
                    grid,
                    block,
                    shared_mem,
                    params,
                    cluster,
                }
            }
            MEMSET => {
                let (dst, pitch, value, elem) = (r.u64()?, r.u64()?, r.u32()?, r.u32()?);
                let (width, height) = (r.u64()?, r.u64()?);
                if !matches!(elem, 1 | 2 | 4) {
                    return Err(bad(
                        "graph",
                        format!("node {i}: memset of {elem}-byte elements"),
                    ));
                }
                GraphOp::Memset {
                    dst,
                    pitch,
                    value,
                    elem,
                    width,
                    height,
                }
            }
            COPY => GraphOp::Copy {
                dst: r.u64()?,
                src: r.u64()?,
                len: r.u64()?,
            },
            EMPTY => GraphOp::Empty,
            EVENT_RECORD | EVENT_WAIT if depth > 0 => {
                return Err(bad(
                    "graph",
                    format!("node {i}: an event node in a conditional body"),
                ))
            }
            EVENT_RECORD => GraphOp::EventRecord { event: r.u64()? },
            EVENT_WAIT => GraphOp::EventWait { event: r.u64()? },
            CONDITIONAL => {
                let handle = r.u64()?;
                let kind = r.u32()?;
                let kind = CondKind::from_u32(kind)
                    .ok_or_else(|| bad("graph", format!("node {i}: conditional type {kind}")))?;
                let n = r.u32()? as usize;
                if !kind.bodies_ok(n) {
                    return Err(bad("graph", format!("node {i}: {kind:?} with {n} bodies")));
                }
                if depth >= MAX_DEPTH {
                    return Err(bad(
                        "graph",
                        format!("conditionals nested over {MAX_DEPTH} deep"),
                    ));
                }
                let mut bodies = Vec::with_capacity(n);
                for _ in 0..n {
                    bodies.push(decode_nodes(r, depth + 1, total)?);
                }
                GraphOp::Conditional {
                    handle,
                    kind,
                    bodies,
                }
            }
            k => return Err(bad("graph", format!("node {i}: kind {k}"))),
        };
        nodes.push(GraphNode { op, deps });
    }
    Ok(nodes)
}

/// Calls `f` on every node of `nodes` and of their conditionals' bodies,
/// at any depth; stops at the first error.
pub fn visit<E>(
    nodes: &[GraphNode],
    f: &mut impl FnMut(&GraphNode) -> Result<(), E>,
) -> Result<(), E> {
    for n in nodes {
        f(n)?;
        if let GraphOp::Conditional { bodies, .. } = &n.op {
            for b in bodies {
                visit(b, f)?;
            }
        }
    }
    Ok(())
}

impl GraphOp {
    /// The device memory the node touches, as (start, length) ranges (the
    /// host checks each is the caller's own): a memset's rows span
    /// `pitch * (height - 1) + width * elem` bytes.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        match *self {
            GraphOp::Memset {
                dst,
                pitch,
                elem,
                width,
                height,
                ..
            } => {
                let row = width.saturating_mul(u64::from(elem));
                let span = pitch
                    .saturating_mul(height.saturating_sub(1))
                    .saturating_add(row);
                if height == 0 || row == 0 {
                    vec![]
                } else {
                    vec![(dst, span)]
                }
            }
            GraphOp::Copy { dst, src, len } if len > 0 => vec![(dst, len), (src, len)],
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<GraphNode> {
        let d = |x| Dim3 { x, y: 1, z: 1 };
        vec![
            GraphNode {
                op: GraphOp::Memset {
                    dst: 0x1000,
                    pitch: 256,
                    value: 7,
                    elem: 4,
                    width: 64,
                    height: 2,
                },
                deps: vec![],
            },
            GraphNode {
                op: GraphOp::Kernel {
                    func: 9,
                    grid: d(4),
                    block: d(128),
                    shared_mem: 0,
                    params: vec![1, 2, 3, 4, 5, 6, 7, 8],
                    cluster: Default::default(),
                },
                deps: vec![0],
            },
            GraphNode {
                op: GraphOp::Copy {
                    dst: 0x2000,
                    src: 0x1000,
                    len: 512,
                },
                deps: vec![0],
            },
            GraphNode {
                op: GraphOp::Empty,
                deps: vec![1, 2],
            },
            GraphNode {
                op: GraphOp::EventRecord { event: 5 },
                deps: vec![3],
            },
            GraphNode {
                op: GraphOp::EventWait { event: 6 },
                deps: vec![],
            },
        ]
    }

    #[test]
    fn graphs_round_trip() {
        let g = sample();
        assert_eq!(decode_graph(&encode_graph(&g)).unwrap(), g);
    }

    #[test]
    fn a_kernel_with_clusters_round_trips_and_an_empty_cluster_is_refused() {
        let mut g = sample();
        if let GraphOp::Kernel { cluster, .. } = &mut g[1].op {
            *cluster = Dim3 { x: 8, y: 1, z: 1 };
        }
        let bytes = encode_graph(&g);
        assert_eq!(decode_graph(&bytes).unwrap(), g);
        // A plain kernel's bytes are as they were: the cluster is the
        // other kind's.
        assert_eq!(bytes.len(), encode_graph(&sample()).len() + 12);
        for zero in [(0, 1, 1), (8, 0, 1), (8, 1, 0)] {
            if let GraphOp::Kernel { cluster, .. } = &mut g[1].op {
                *cluster = Dim3 {
                    x: zero.0,
                    y: zero.1,
                    z: zero.2,
                };
            }
            assert!(decode_graph(&encode_graph(&g)).is_err(), "{zero:?}");
        }
    }

    #[test]
    fn every_truncation_and_bad_field_is_an_error() {
        let bytes = encode_graph(&sample());
        for n in 0..bytes.len() {
            assert!(decode_graph(&bytes[..n]).is_err(), "truncated to {n}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(decode_graph(&extra).is_err());
        // A dependency on itself or a later node (a cycle).
        let mut g = sample();
        g[1].deps = vec![1];
        assert!(decode_graph(&encode_graph(&g)).is_err());
        g[1].deps = vec![4];
        assert!(decode_graph(&encode_graph(&g)).is_err());
        // A memset of 8-byte elements, too many parameter bytes, no nodes.
        let mut g = sample();
        if let GraphOp::Memset { elem, .. } = &mut g[0].op {
            *elem = 8;
        }
        assert!(decode_graph(&encode_graph(&g)).is_err());
        let mut g = sample();
        if let GraphOp::Kernel { params, .. } = &mut g[1].op {
            *params = vec![0; MAX_PARAMS + 1];
        }
        assert!(decode_graph(&encode_graph(&g)).is_err());
        assert!(decode_graph(&encode_graph(&[])).is_err());
    }

    fn cond(kind: CondKind, bodies: Vec<Vec<GraphNode>>) -> GraphNode {
        GraphNode {
            op: GraphOp::Conditional {
                handle: 0x77,
                kind,
                bodies,
            },
            deps: vec![0],
        }
    }

    #[test]
    fn conditionals_round_trip_with_nested_and_empty_bodies() {
        let inner = cond(CondKind::If, vec![sample()[..3].to_vec(), vec![]]);
        let mut g = sample();
        g.push(cond(
            CondKind::While,
            vec![vec![sample()[0].clone(), {
                let mut i = inner.clone();
                i.deps = vec![0];
                i
            }]],
        ));
        g.push(cond(
            CondKind::Switch,
            vec![vec![], sample()[..1].to_vec(), vec![]],
        ));
        let bytes = encode_graph(&g);
        assert_eq!(decode_graph(&bytes).unwrap(), g);
        let mut seen = 0;
        visit(&g, &mut |_| -> Result<(), ()> {
            seen += 1;
            Ok(())
        })
        .unwrap();
        // 6 + while (1 + its 2: 1 + 3 in the IF) + switch (1 + 1).
        assert_eq!(seen, 6 + 1 + 2 + 3 + 1 + 1);
        for n in 0..bytes.len() {
            assert!(decode_graph(&bytes[..n]).is_err(), "truncated to {n}");
        }
    }

    #[test]
    fn conditionals_with_bad_shapes_are_refused() {
        let bad_graph = |c: GraphNode| {
            let mut g = sample();
            g.push(c);
            decode_graph(&encode_graph(&g))
        };
        // Body counts the driver refuses.
        assert!(bad_graph(cond(CondKind::If, vec![])).is_err());
        assert!(bad_graph(cond(CondKind::If, vec![vec![]; 3])).is_err());
        assert!(bad_graph(cond(CondKind::While, vec![vec![]; 2])).is_err());
        assert!(bad_graph(cond(CondKind::Switch, vec![])).is_err());
        assert!(bad_graph(cond(CondKind::Switch, vec![vec![]; 4])).is_ok());
        // An event node in a body.
        assert!(bad_graph(cond(CondKind::If, vec![sample()[4..5].to_vec()])).is_err());
        // A body whose dependency is not an earlier node of the body.
        let mut body = sample()[..2].to_vec();
        body[1].deps = vec![1];
        assert!(bad_graph(cond(CondKind::If, vec![body])).is_err());
        // An unknown type.
        let mut bytes = encode_graph(&[cond(CondKind::If, vec![vec![]])]);
        // count, kind, deps=1, dep 0 -> the node depends on node 0: itself.
        assert!(decode_graph(&bytes).is_err());
        bytes = encode_graph(&[GraphNode {
            op: GraphOp::Conditional {
                handle: 1,
                kind: CondKind::If,
                bodies: vec![vec![]],
            },
            deps: vec![],
        }]);
        assert!(decode_graph(&bytes).is_ok());
        bytes[20] = 3; // the type, after count, kind, deps and the handle
        assert!(decode_graph(&bytes).is_err());
        // Nesting past the limit.
        let mut deep = GraphNode {
            op: GraphOp::Empty,
            deps: vec![],
        };
        for _ in 0..=MAX_DEPTH {
            deep = GraphNode {
                op: GraphOp::Conditional {
                    handle: 1,
                    kind: CondKind::If,
                    bodies: vec![vec![deep]],
                },
                deps: vec![],
            };
        }
        assert!(decode_graph(&encode_graph(&[deep])).is_err());
    }

    #[test]
    fn ranges_cover_what_a_node_touches() {
        let g = sample();
        assert_eq!(g[0].op.ranges(), vec![(0x1000, 256 + 256)]);
        assert_eq!(g[2].op.ranges(), vec![(0x2000, 512), (0x1000, 512)]);
        assert!(g[1].op.ranges().is_empty());
    }
}
