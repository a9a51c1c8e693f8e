//! Graphs a guest built, built again here as CUDA graphs with the same
//! nodes and dependencies, instantiated once and launched as one graph
//! each time: the device runs independent branches side by side and the
//! host pays one `cuGraphLaunch` for the whole graph.
//!
//! A node names the guest's objects by our handles (functions, events);
//! they are resolved to the driver's when the graph is built. A graph
//! whose function's module is unloaded is destroyed with it (a launch of
//! it is then an invalid handle). The guest's nodes are kept: a context
//! that moves to another GPU builds each graph there again under the same
//! handle (`migrate.rs`).

use std::ptr::null_mut;

use cudarc::driver::sys;
use protocol::graph::{GraphNode, GraphOp};
use protocol::Status;

use super::check;
use super::context::CudaContext;
use crate::executor::{Graphs, Handle};

/// A graph built from a guest's nodes, and its executable.
pub(super) struct HostGraph {
    pub(super) graph: sys::CUgraph,
    pub(super) exec: sys::CUgraphExec,
    /// The functions its kernel nodes run (to drop it with their module).
    pub(super) funcs: Vec<Handle>,
    /// The guest's nodes, to build it again on another GPU.
    pub(super) nodes: Vec<GraphNode>,
    /// Built in a conditional scope (`conditional.rs`): its graph is the
    /// scope's, and it cannot be built again elsewhere (its handles are
    /// the driver's values, which the guest's kernels hold).
    pub(super) scoped: bool,
}

impl HostGraph {
    /// Destroys the executable and the graph (the context is current).
    pub(super) fn destroy(self) {
        // SAFETY: our own executable and graph, each destroyed once; no
        // launch of it is being made (the worker's one thread is here).
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
        }
        if !self.scoped {
            // SAFETY: as above.
            unsafe {
                sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// Gives kernel node `node` (just added) thread block clusters of
/// `cluster`, as a `cuLaunchKernelEx` attribute gives a launch.
fn set_cluster(node: sys::CUgraphNode, cluster: protocol::Dim3) -> sys::CUresult {
    // SAFETY: a plain C union of plain values, for which all-zero is valid.
    let mut v: sys::CUkernelNodeAttrValue = unsafe { std::mem::zeroed() };
    v.clusterDim.x = cluster.x;
    v.clusterDim.y = cluster.y;
    v.clusterDim.z = cluster.z;
    let id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    // SAFETY: a kernel node of a graph of ours; `v` lives for the call,
    // which copies it.
    unsafe { sys::cuGraphKernelNodeSetAttribute(node, id, &v) }
}

/// A copy of `len` bytes from device address `src` to `dst` as the
/// three-dimensional copy a memcpy node takes: one row, one slice.
fn copy_1d(dst: u64, src: u64, len: u64) -> sys::CUDA_MEMCPY3D {
    use std::ptr::null;
    let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
    sys::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: device,
        srcHost: null(),
        srcDevice: src,
        srcArray: null_mut(),
        reserved0: null_mut(),
        srcPitch: 0,
        srcHeight: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: device,
        dstHost: null_mut(),
        dstDevice: dst,
        dstArray: null_mut(),
        reserved1: null_mut(),
        dstPitch: 0,
        dstHeight: 0,
        WidthInBytes: crate::usize_from(len),
        Height: 1,
        Depth: 1,
    }
}

/// Destroys a graph being built if building it fails.
struct Building(sys::CUgraph);

impl Drop for Building {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a graph of ours no executable was made from.
            unsafe {
                sys::cuGraphDestroy(self.0);
            }
        }
    }
}

impl CudaContext {
    /// Builds and instantiates the guest's `nodes` in the current context
    /// (`self.ctx`, with the objects of `self.objs`).
    pub(super) fn build_graph(&self, guest_nodes: &[GraphNode]) -> Result<HostGraph, Status> {
        if tracing::enabled!(tracing::Level::DEBUG) {
            let mut kinds = std::collections::BTreeMap::<String, usize>::new();
            let _ = protocol::graph::visit(guest_nodes, &mut |n| {
                let k = match &n.op {
                    GraphOp::Kernel { .. } => "kernel".to_owned(),
                    GraphOp::Memset { elem, height, .. } => format!("memset{elem}x{height}"),
                    GraphOp::Copy { .. } => "copy".to_owned(),
                    GraphOp::Empty => "empty".to_owned(),
                    GraphOp::EventRecord { .. } => "record".to_owned(),
                    GraphOp::EventWait { .. } => "wait".to_owned(),
                    GraphOp::Conditional { .. } => "conditional".to_owned(),
                };
                *kinds.entry(k).or_default() += 1;
                Ok::<(), ()>(())
            });
            tracing::debug!(?kinds, "building a guest's graph");
        }
        let nodes = self.moved_nodes(guest_nodes);
        let mut g = Building(null_mut());
        // SAFETY: out-parameter on our stack; flags 0.
        check(unsafe { sys::cuGraphCreate(&mut g.0, 0) })?;
        let mut funcs = Vec::new();
        self.add_nodes(g.0, &nodes, &mut funcs)?;
        let mut exec: sys::CUgraphExec = null_mut();
        // SAFETY: out-parameter on our stack; a complete graph of ours.
        check(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, g.0, 0) })?;
        let graph = std::mem::replace(&mut g.0, null_mut());
        Ok(HostGraph {
            graph,
            exec,
            funcs,
            nodes: guest_nodes.to_vec(),
            scoped: false,
        })
    }

    /// Adds `nodes` to graph `g` (empty, or a conditional's body); the
    /// functions its kernels run are added to `funcs`.
    pub(super) fn add_nodes(
        &self,
        g: sys::CUgraph,
        nodes: &[GraphNode],
        funcs: &mut Vec<Handle>,
    ) -> Result<(), Status> {
        let mut made: Vec<sys::CUgraphNode> = Vec::with_capacity(nodes.len());
        for n in nodes.iter() {
            // Dependencies name earlier nodes (checked when decoded).
            let deps: Vec<sys::CUgraphNode> = n
                .deps
                .iter()
                .map(|&d| made.get(d as usize).copied().ok_or(Status::InvalidValue))
                .collect::<Result<_, _>>()?;
            let mut out: sys::CUgraphNode = null_mut();
            let r = match &n.op {
                GraphOp::Kernel {
                    func,
                    grid,
                    block,
                    shared_mem,
                    params,
                    cluster,
                } => {
                    let (f, sizes) = self.func(*func)?;
                    // One pointer per parameter into the packed values (all
                    // of them: the driver copies them when the node is added).
                    let want: usize = sizes.iter().map(|&n| n as usize).sum();
                    if want != params.len() {
                        return Err(Status::InvalidValue);
                    }
                    let mut ptrs = super::launch::param_ptrs(sizes, params, 0)?;
                    funcs.push(*func);
                    let p = sys::CUDA_KERNEL_NODE_PARAMS {
                        func: f,
                        gridDimX: grid.x,
                        gridDimY: grid.y,
                        gridDimZ: grid.z,
                        blockDimX: block.x,
                        blockDimY: block.y,
                        blockDimZ: block.z,
                        sharedMemBytes: *shared_mem,
                        kernelParams: ptrs.as_mut_ptr(),
                        extra: null_mut(),
                        kern: null_mut(),
                        ctx: null_mut(),
                    };
                    // SAFETY: `p` and the values `ptrs` point into live on our
                    // stack for the call, which copies them; `deps` are nodes
                    // of this graph.
                    let r = unsafe {
                        sys::cuGraphAddKernelNode_v2(&mut out, g, deps.as_ptr(), deps.len(), &p)
                    };
                    if r == sys::CUresult::CUDA_SUCCESS && *cluster != protocol::Dim3::default() {
                        set_cluster(out, *cluster)
                    } else {
                        r
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
                    let p = sys::CUDA_MEMSET_NODE_PARAMS {
                        dst: *dst,
                        pitch: crate::usize_from(*pitch),
                        value: *value,
                        elementSize: *elem,
                        width: crate::usize_from(*width),
                        height: crate::usize_from(*height),
                    };
                    // SAFETY: as above; the range lies in the session's own
                    // memory (checked by the worker).
                    unsafe {
                        sys::cuGraphAddMemsetNode(
                            &mut out,
                            g,
                            deps.as_ptr(),
                            deps.len(),
                            &p,
                            self.ctx,
                        )
                    }
                }
                GraphOp::Copy { dst, src, len } => {
                    // Every field given: all-zero is no valid
                    // `CUmemorytype`, so the struct cannot start zeroed.
                    let p = copy_1d(*dst, *src, *len);
                    // SAFETY: out-parameter on our stack; nodes of this
                    // graph; both ranges lie in the session's own memory
                    // (checked by the worker).
                    unsafe {
                        sys::cuGraphAddMemcpyNode(
                            &mut out,
                            g,
                            deps.as_ptr(),
                            deps.len(),
                            &p,
                            self.ctx,
                        )
                    }
                }
                GraphOp::Empty => {
                    // SAFETY: out-parameter on our stack; nodes of this graph.
                    unsafe { sys::cuGraphAddEmptyNode(&mut out, g, deps.as_ptr(), deps.len()) }
                }
                GraphOp::EventRecord { event } => {
                    let e = self.event(*event)?;
                    // SAFETY: as above; an event of this context.
                    unsafe {
                        sys::cuGraphAddEventRecordNode(&mut out, g, deps.as_ptr(), deps.len(), e)
                    }
                }
                GraphOp::EventWait { event } => {
                    let e = self.event(*event)?;
                    // SAFETY: as above; an event of this context.
                    unsafe {
                        sys::cuGraphAddEventWaitNode(&mut out, g, deps.as_ptr(), deps.len(), e)
                    }
                }
                GraphOp::Conditional {
                    handle,
                    kind,
                    bodies,
                } => {
                    out = self.add_conditional(g, &deps, *handle, *kind, bodies, funcs)?;
                    sys::CUresult::CUDA_SUCCESS
                }
            };
            check(r)?;
            made.push(out);
        }
        Ok(())
    }

    /// Destroys the graphs that run any of `funcs` (their module goes).
    pub(super) fn drop_graphs_of(&mut self, funcs: &[Handle]) {
        let gone: Vec<Handle> = self
            .graphs
            .iter()
            .filter(|(_, g)| g.funcs.iter().any(|f| funcs.contains(f)))
            .map(|(&h, _)| h)
            .collect();
        for h in gone {
            if let Some(g) = self.graphs.remove(&h) {
                g.destroy();
            }
        }
    }
}

impl Graphs for CudaContext {
    fn graph_instantiate(&mut self, nodes: &[GraphNode]) -> Result<Handle, Status> {
        self.bind()?;
        let built = self.build_graph(nodes)?;
        self.next_handle += 1;
        let h = self.next_handle;
        self.graphs.insert(h, built);
        Ok(h)
    }

    fn graph_launch(&mut self, exec: Handle, stream: Handle) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(stream)?;
        let g = self.graphs.get(&exec).ok_or(Status::InvalidHandle)?;
        // SAFETY: an executable of this context and one of its streams.
        check(unsafe { sys::cuGraphLaunch(g.exec, st) })
    }

    fn graph_destroy(&mut self, exec: Handle) -> Result<(), Status> {
        self.bind()?;
        let g = self.graphs.remove(&exec).ok_or(Status::InvalidHandle)?;
        g.destroy();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memcpy node's parameters are made whole (never from zeroed
    /// memory, which is no valid `CUmemorytype` and aborted the worker of
    /// any graph with a device-to-device copy); no GPU needed.
    #[test]
    fn a_copy_nodes_parameters_are_a_device_to_device_row() {
        let p = copy_1d(0x2000, 0x1000, 64);
        let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
        assert_eq!((p.srcMemoryType, p.dstMemoryType), (device, device));
        assert_eq!((p.srcDevice, p.dstDevice), (0x1000, 0x2000));
        assert_eq!((p.WidthInBytes, p.Height, p.Depth), (64, 1, 1));
        assert!(p.srcArray.is_null() && p.dstArray.is_null());
    }
}
