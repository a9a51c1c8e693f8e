//! A CUDA graph the guest built, to be built, instantiated and launched on
//! the host as one graph (`GraphInstantiate`'s data): its nodes in an order
//! where every node comes after the nodes it depends on, each naming those
//! by index.
//!
//! Only nodes the host can run from what it holds: kernels (the host's
//! function handles, the parameter values packed as for a launch), memsets
//! and copies within device memory, event records and waits, empty nodes.
//! A graph with anything else (a host function, a copy from or to the
//! guest's own memory) stays in the guest and runs node by node.
//!
//! Layout, little-endian: `[count u32]`, then per node `[kind u32][deps
//! u32][dep u32 x deps]` and the kind's fields.

use crate::codec::Reader;
use crate::request::decode::read_dim;
use crate::{bad, Dim3, ProtoError};

/// Nodes a graph may have, at most.
pub const MAX_NODES: usize = 8192;
/// Dependencies a node may have, at most.
pub const MAX_DEPS: usize = 256;
/// Parameter bytes of a kernel node, at most (the driver's own limit).
pub const MAX_PARAMS: usize = 32764;

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
    put32(&mut out, nodes.len() as u32);
    for n in nodes {
        let kind = match n.op {
            GraphOp::Kernel { .. } => KERNEL,
            GraphOp::Memset { .. } => MEMSET,
            GraphOp::Copy { .. } => COPY,
            GraphOp::Empty => EMPTY,
            GraphOp::EventRecord { .. } => EVENT_RECORD,
            GraphOp::EventWait { .. } => EVENT_WAIT,
        };
        put32(&mut out, kind);
        put32(&mut out, n.deps.len() as u32);
        for &d in &n.deps {
            put32(&mut out, d);
        }
        match &n.op {
            GraphOp::Kernel {
                func,
                grid,
                block,
                shared_mem,
                params,
            } => {
                put64(&mut out, *func);
                put_dim(&mut out, *grid);
                put_dim(&mut out, *block);
                put32(&mut out, *shared_mem);
                put32(&mut out, params.len() as u32);
                out.extend_from_slice(params);
            }
            GraphOp::Memset {
                dst,
                pitch,
                value,
                elem,
                width,
                height,
            } => {
                put64(&mut out, *dst);
                put64(&mut out, *pitch);
                put32(&mut out, *value);
                put32(&mut out, *elem);
                put64(&mut out, *width);
                put64(&mut out, *height);
            }
            GraphOp::Copy { dst, src, len } => {
                put64(&mut out, *dst);
                put64(&mut out, *src);
                put64(&mut out, *len);
            }
            GraphOp::Empty => {}
            GraphOp::EventRecord { event } | GraphOp::EventWait { event } => {
                put64(&mut out, *event)
            }
        }
    }
    out
}

/// Decodes a graph, checking every count, index and size: a dependency
/// must name an earlier node (so the graph has no cycle), and nothing may
/// follow the last node.
pub fn decode_graph(data: &[u8]) -> Result<Vec<GraphNode>, ProtoError> {
    let mut r = Reader::new(data);
    let count = r.u32()? as usize;
    if count == 0 || count > MAX_NODES {
        return Err(bad("graph", format!("{count} nodes (1..={MAX_NODES})")));
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
            KERNEL => {
                let func = r.u64()?;
                let grid = read_dim(&mut r)?;
                let block = read_dim(&mut r)?;
                let shared_mem = r.u32()?;
                let len = r.u32()? as usize;
                if len > MAX_PARAMS {
                    return Err(bad("graph", format!("node {i}: {len} parameter bytes")));
                }
                GraphOp::Kernel {
                    func,
                    grid,
                    block,
                    shared_mem,
                    params: r.bytes(len)?.to_vec(),
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
            EVENT_RECORD => GraphOp::EventRecord { event: r.u64()? },
            EVENT_WAIT => GraphOp::EventWait { event: r.u64()? },
            k => return Err(bad("graph", format!("node {i}: kind {k}"))),
        };
        nodes.push(GraphNode { op, deps });
    }
    if r.remaining() != 0 {
        return Err(bad("graph", "bytes after the last node"));
    }
    Ok(nodes)
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

    #[test]
    fn ranges_cover_what_a_node_touches() {
        let g = sample();
        assert_eq!(g[0].op.ranges(), vec![(0x1000, 256 + 256)]);
        assert_eq!(g[2].op.ranges(), vec![(0x2000, 512), (0x1000, 512)]);
        assert!(g[1].op.ranges().is_empty());
    }
}
