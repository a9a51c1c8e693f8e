//! Launches submitted as CUDA graph launches.
//!
//! One `cuLaunchKernel` costs the host 4-5 us on the H100 machines we
//! measured; one launch of an instantiated graph of B chained kernel nodes
//! about 2.5 us, plus about 0.4 us for each node whose launch differs from
//! that node's last one (`cuGraphExecKernelNodeSetParams`). The device runs
//! chained nodes back to back, about 1 us apart for a one-thread kernel, and
//! starts even a one-node graph sooner: a launch + synchronize round trip
//! took 6.9-7.1 us as a one-node graph against 9.1-9.6 us with
//! `cuLaunchKernel` (`scripts/gpu/graph_probe.c`,
//! `results/2026-11-22-h100-launch-batch.md`).
//!
//! So launches go through graphs: single launches as one-node graphs too by
//! default (`[daemon] graph_launches = "all"`), only runs of two or more
//! with `"runs"`, none with `"off"`. Under the fair scheduler the two
//! graph modes share the GPU alike (`results/2026-11-22-h100-wake-credit.md`).
//! A context keeps one template per stream and size in [`SIZES`]: a chain
//! of that many kernel nodes, built and instantiated from the third run of
//! that size on that stream ([`BUILD_AT`]: a stream that launches once or
//! twice does not pay for a build) and after that updated node by node. A
//! single launch right after an event record on its stream goes to
//! `cuLaunchKernel` ([`Templates::recorded`]: the program is timing it). Per
//! stream, because the driver orders each launch of an executable graph
//! behind its previous launch, whatever the stream: one template shared by
//! two streams would run their kernels one after the other, where natively
//! they overlap (32 streams of `simpleHyperQ` ran 2.2x slower so). At most
//! [`MAX_TEMPLATES`] are kept, the least recently used dropped first (one
//! still running is freed by the driver when it completes); a stream's go
//! with it. A run of launches queued on one stream
//! (several when the guest launches faster than the worker submits) is cut
//! into chunks of those sizes, largest first ([`chunks`]). When the graph
//! path fails (a kernel a graph cannot hold, a launch configuration the
//! driver refuses), nothing of the chunk was submitted and the caller
//! launches it with `cuLaunchKernel`, one by one, so each launch reports
//! its own error as it would have without graphs.
//!
//! A node refers to its function: the templates are dropped before a module
//! is unloaded, and before the context moves or goes.

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use cudarc::driver::sys::{self, CUresult};
use protocol::Dim3;

use crate::executor::GraphLaunches;

/// Template sizes, largest first: a run holds at most 64 launches (what the
/// worker takes from a channel in one pass), and beyond 16 nodes a larger
/// chain saves little (`graph_probe`: 0.44 us per updated node at 64, 0.42 at 128).
pub(super) const SIZES: [usize; 7] = [64, 32, 16, 8, 4, 2, 1];

/// Failed builds after which a context stops trying a size.
const MAX_BUILD_FAILURES: u8 = 3;

/// Templates a context keeps, over all its streams: 32 streams' single
/// launches (`simpleHyperQ`), or a few streams' runs of every size.
pub(super) const MAX_TEMPLATES: usize = 128;

/// Cuts a run into template-sized chunks, largest first.
pub(super) fn chunks<T>(mut run: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        let size = SIZES.iter().copied().find(|&s| s <= run.len())?;
        let (chunk, rest) = run.split_at(size);
        run = rest;
        Some(chunk)
    })
}

/// One launch of a chunk, in the driver's terms.
pub(super) struct Node<'a> {
    pub f: sys::CUfunction,
    pub grid: Dim3,
    pub block: Dim3,
    pub smem: u32,
    /// Its packed parameters.
    pub params: &'a [u8],
    /// One pointer per kernel parameter, into `params`.
    pub ptrs: Vec<*mut c_void>,
}

impl Node<'_> {
    fn driver_params(&mut self) -> sys::CUDA_KERNEL_NODE_PARAMS {
        sys::CUDA_KERNEL_NODE_PARAMS {
            func: self.f,
            gridDimX: self.grid.x,
            gridDimY: self.grid.y,
            gridDimZ: self.grid.z,
            blockDimX: self.block.x,
            blockDimY: self.block.y,
            blockDimZ: self.block.z,
            sharedMemBytes: self.smem,
            kernelParams: self.ptrs.as_mut_ptr(),
            extra: null_mut(),
            kern: null_mut(),
            ctx: null_mut(),
        }
    }
}

/// What a template's node was last set to.
#[derive(Debug, Default, PartialEq, Eq)]
struct NodeSet {
    f: usize,
    grid: Dim3,
    block: Dim3,
    smem: u32,
    params: Vec<u8>,
}

impl NodeSet {
    fn matches(&self, n: &Node<'_>) -> bool {
        self.f == n.f as usize
            && self.grid == n.grid
            && self.block == n.block
            && self.smem == n.smem
            && self.params == n.params
    }

    fn record(&mut self, n: &Node<'_>) {
        self.f = n.f as usize;
        self.grid = n.grid;
        self.block = n.block;
        self.smem = n.smem;
        self.params.clear();
        self.params.extend_from_slice(n.params);
    }
}

/// A chain of kernel nodes and its instantiation.
struct Template {
    /// Kept: its node handles name the nodes of `exec`.
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: Vec<sys::CUgraphNode>,
    /// What each node was last set to; `None` after a failed update.
    set: Vec<Option<NodeSet>>,
}

impl Template {
    /// A chain of `nodes.len()` kernel nodes set to `nodes`, instantiated.
    ///
    /// # Safety
    /// As for [`Templates::launch`].
    unsafe fn build(nodes: &mut [Node<'_>]) -> Result<Template, CUresult> {
        let mut graph: sys::CUgraph = null_mut();
        // SAFETY: out-parameter on our stack.
        let r = unsafe { sys::cuGraphCreate(&mut graph, 0) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(r);
        }
        // From here on the drop of `t` frees what was made.
        let mut t = Template {
            graph,
            exec: null_mut(),
            nodes: Vec::with_capacity(nodes.len()),
            set: Vec::with_capacity(nodes.len()),
        };
        for n in nodes.iter_mut() {
            let p = n.driver_params();
            let prev = t.nodes.last().copied();
            let mut node: sys::CUgraphNode = null_mut();
            // SAFETY: our graph; `prev` (if any) is a node of it; `p` points
            // to the node's parameters, which the driver copies.
            let r = unsafe {
                sys::cuGraphAddKernelNode_v2(
                    &mut node,
                    t.graph,
                    prev.as_ref().map_or(null(), |d| d as *const _),
                    usize::from(prev.is_some()),
                    &p,
                )
            };
            if r != CUresult::CUDA_SUCCESS {
                return Err(r);
            }
            t.nodes.push(node);
            let mut s = NodeSet::default();
            s.record(n);
            t.set.push(Some(s));
        }
        // SAFETY: our graph, complete; out-parameter on our stack.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut t.exec, t.graph, 0) };
        if r != CUresult::CUDA_SUCCESS {
            t.exec = null_mut();
            return Err(r);
        }
        Ok(t)
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        if !self.exec.is_null() {
            // SAFETY: our instantiation, destroyed once; its context is alive
            // (see the module docs).
            let _ = unsafe { sys::cuGraphExecDestroy(self.exec) };
        }
        // SAFETY: our graph, destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(self.graph) };
    }
}

/// What a context keeps per (stream, size): at most `cap` entries, the
/// least recently used given up first.
struct Slots<T> {
    cap: usize,
    /// Counts lookups: an entry's `used` is the count at its last one.
    clock: u64,
    entries: Vec<Slot<T>>,
}

struct Slot<T> {
    stream: u64,
    size: usize,
    used: u64,
    value: T,
}

impl<T> Slots<T> {
    fn new(cap: usize) -> Slots<T> {
        Slots {
            cap: cap.max(1),
            clock: 0,
            entries: Vec::new(),
        }
    }

    /// The entry of (`stream`, `size`), made with `make` if there is none
    /// (the least recently used entry dropped first when full). Nothing is
    /// kept when `make` fails.
    fn get_or_make<E>(
        &mut self,
        stream: u64,
        size: usize,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<&mut T, E> {
        self.clock += 1;
        let i = match self
            .entries
            .iter()
            .position(|e| e.stream == stream && e.size == size)
        {
            Some(i) => i,
            None => {
                let value = make()?;
                if self.entries.len() >= self.cap {
                    let oldest = (0..self.entries.len())
                        .min_by_key(|&i| self.entries[i].used)
                        .unwrap_or(0);
                    self.entries.swap_remove(oldest);
                }
                self.entries.push(Slot {
                    stream,
                    size,
                    used: 0,
                    value,
                });
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[i];
        e.used = self.clock;
        Ok(&mut e.value)
    }

    /// Drops `stream`'s entries.
    fn forget_stream(&mut self, stream: u64) {
        self.entries.retain(|e| e.stream != stream);
    }

    fn clear(&mut self) {
        self.entries.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Chunks of one size a stream submits without a template before its
/// template of that size is built: building and instantiating one costs
/// the host several launches' time, which a stream that launches once or
/// twice (`simpleHyperQ`'s 32 streams) never earns back.
const BUILD_AT: u32 = 3;

/// Counts each (stream, size)'s chunks submitted without a template, to
/// build one only for a stream that keeps launching ([`BUILD_AT`]).
#[derive(Default)]
struct Warmup {
    misses: std::collections::HashMap<(u64, usize), u32>,
}

impl Warmup {
    /// Counts one more chunk of `size` on `stream` without a template;
    /// whether its template is due now.
    fn due(&mut self, stream: u64, size: usize) -> bool {
        let n = self.misses.entry((stream, size)).or_insert(0);
        *n += 1;
        if *n < BUILD_AT {
            return false;
        }
        self.misses.remove(&(stream, size));
        true
    }

    fn forget_stream(&mut self, stream: u64) {
        self.misses.retain(|&(s, _), _| s != stream);
    }
}

/// Why no template launched a chunk.
enum NoTemplate {
    /// Its stream has not launched enough chunks of its size yet.
    NotDue,
    /// The driver refused to build it.
    Failed(CUresult),
}

/// A context's templates, one per stream and size in [`SIZES`].
pub(super) struct Templates {
    /// The smallest chunk submitted as a graph (0: none is).
    min: usize,
    kept: Slots<Template>,
    warmup: Warmup,
    /// Streams whose last operation was an event record: their next single
    /// launch goes to `cuLaunchKernel` (see [`Templates::recorded`]).
    after_record: std::collections::HashSet<u64>,
    /// Failed builds per size (a kernel or configuration a graph cannot
    /// hold fails on any stream).
    failures: [u8; SIZES.len()],
}

impl Templates {
    /// No templates yet; `mode` says which chunks may go through them.
    pub(super) fn new(mode: GraphLaunches) -> Templates {
        Templates {
            min: match mode {
                GraphLaunches::Off => 0,
                GraphLaunches::Runs => 2,
                GraphLaunches::All => 1,
            },
            kept: Slots::new(MAX_TEMPLATES),
            warmup: Warmup::default(),
            after_record: std::collections::HashSet::new(),
            failures: [0; SIZES.len()],
        }
    }

    /// Guest stream `s` recorded an event. A program that records an event
    /// before a kernel and one after it measures the kernel on the device,
    /// and a one-node graph launched between two event records started its
    /// kernel later than `cuLaunchKernel` does (`stereoDisparity`'s kernel:
    /// 0.12-0.16 ms against 0.08 natively and with `cuLaunchKernel`, on an
    /// H100, `results/2026-11-26-h100-graph-launch-timing.md`): that launch
    /// goes straight.
    pub(super) fn recorded(&mut self, s: u64) {
        self.after_record.insert(s);
    }

    /// Submits `nodes` on `st` (the guest's stream `s`) as one graph
    /// launch of `s`'s template of that size. `false`: nothing of them was
    /// submitted (no template of that size, or the driver refused it); the
    /// caller launches them one by one.
    ///
    /// # Safety
    /// The context the nodes' functions belong to is current; each `ptrs`
    /// holds one pointer per parameter of its function into its `params`;
    /// `st` is the stream of that context `s` names (or null for 0).
    pub(super) unsafe fn launch(
        &mut self,
        st: sys::CUstream,
        s: u64,
        nodes: &mut [Node<'_>],
    ) -> bool {
        let after_record = self.after_record.remove(&s);
        let Some(k) = SIZES.iter().position(|&s| s == nodes.len()) else {
            return false;
        };
        if self.min == 0 || nodes.len() < self.min || self.failures[k] >= MAX_BUILD_FAILURES {
            return false;
        }
        if after_record && nodes.len() == 1 {
            return false;
        }
        let warmup = &mut self.warmup;
        let made = self.kept.get_or_make(s, nodes.len(), || {
            if !warmup.due(s, nodes.len()) {
                return Err(NoTemplate::NotDue);
            }
            // SAFETY: the caller's promise.
            unsafe { Template::build(nodes) }.map_err(NoTemplate::Failed)
        });
        let t = match made {
            Ok(t) => t,
            Err(NoTemplate::NotDue) => return false,
            Err(NoTemplate::Failed(e)) => {
                self.failures[k] += 1;
                tracing::debug!(size = nodes.len(), "launch template not built: {e:?}");
                return false;
            }
        };
        for (i, n) in nodes.iter_mut().enumerate() {
            if t.set[i].as_ref().is_some_and(|s| s.matches(n)) {
                continue;
            }
            let p = n.driver_params();
            // SAFETY: a node of this instantiation's graph; `p` as in build.
            let r = unsafe { sys::cuGraphExecKernelNodeSetParams_v2(t.exec, t.nodes[i], &p) };
            if r != CUresult::CUDA_SUCCESS {
                t.set[i] = None;
                return false;
            }
            t.set[i].get_or_insert_with(NodeSet::default).record(n);
        }
        // SAFETY: our instantiation, its nodes set; the caller's stream,
        // the only one this template is launched on.
        unsafe { sys::cuGraphLaunch(t.exec, st) == CUresult::CUDA_SUCCESS }
    }

    /// Drops the templates of stream `s` (destroyed).
    pub(super) fn forget_stream(&mut self, s: u64) {
        self.kept.forget_stream(s);
        self.warmup.forget_stream(s);
        self.after_record.remove(&s);
    }

    /// Drops every template (before a module unload, a move, the end).
    pub(super) fn clear(&mut self) {
        self.kept.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_cut_largest_first_into_template_sizes() {
        let sizes = |n: usize| -> Vec<usize> {
            let run: Vec<usize> = (0..n).collect();
            let parts: Vec<&[usize]> = chunks(&run).collect();
            // The chunks are the run, in order.
            assert_eq!(parts.concat(), run);
            parts.iter().map(|p| p.len()).collect()
        };
        assert!(sizes(0).is_empty());
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(3), [2, 1]);
        assert_eq!(sizes(64), [64]);
        assert_eq!(sizes(100), [64, 32, 4]);
        assert_eq!(sizes(300), [64, 64, 64, 64, 32, 8, 4]);
        for n in 0..600 {
            let c = sizes(n);
            assert_eq!(c.iter().sum::<usize>(), n, "{n}");
            assert!(c.iter().all(|&x| SIZES.contains(&x)));
            // No two chunks that one larger template could take.
            assert!(
                c.windows(2).all(|w| w[0] > w[1] || w[0] == SIZES[0]),
                "{n}: {c:?}"
            );
        }
    }

    #[test]
    fn a_node_is_set_again_only_when_its_launch_differs() {
        let params = [1u8, 2, 3, 4];
        let n = Node {
            f: 0x1000 as sys::CUfunction,
            grid: Dim3 { x: 4, y: 1, z: 1 },
            block: Dim3 { x: 128, y: 1, z: 1 },
            smem: 0,
            params: &params,
            ptrs: Vec::new(),
        };
        let mut s = NodeSet::default();
        assert!(!s.matches(&n));
        s.record(&n);
        assert!(s.matches(&n));
        let other = [1u8, 2, 3, 5];
        assert!(!s.matches(&Node {
            params: &other,
            ptrs: Vec::new(),
            ..n
        }));
        let n2 = Node {
            smem: 16,
            ptrs: Vec::new(),
            ..n
        };
        assert!(!s.matches(&n2));
        s.record(&n2);
        assert!(s.matches(&n2) && !s.matches(&n));
    }

    /// A stand-in template: the stream and size it was made for, and a
    /// serial number.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Made {
        stream: u64,
        size: usize,
        id: u32,
    }

    fn take(slots: &mut Slots<Made>, made: &mut u32, stream: u64, size: usize) -> Made {
        *slots
            .get_or_make(stream, size, || {
                *made += 1;
                Ok::<_, ()>(Made {
                    stream,
                    size,
                    id: *made,
                })
            })
            .unwrap()
    }

    #[test]
    fn a_template_is_due_at_its_streams_third_chunk_of_that_size() {
        let mut w = Warmup::default();
        assert!(!w.due(1, 1));
        assert!(!w.due(1, 1));
        assert!(!w.due(2, 1), "another stream counts apart");
        assert!(!w.due(1, 4), "another size counts apart");
        assert!(w.due(1, 1));
        // Due once; counted again from nothing (a template evicted later
        // earns its place again).
        assert!(!w.due(1, 1));
        assert!(!w.due(2, 1));
        w.forget_stream(2);
        assert!(!w.due(2, 1), "a destroyed stream's count goes with it");
        assert!(!w.due(2, 1));
        assert!(w.due(2, 1));
    }

    #[test]
    fn each_stream_and_size_gets_its_own_template() {
        let mut slots = Slots::new(MAX_TEMPLATES);
        let mut made = 0;
        let a1 = take(&mut slots, &mut made, 1, 1);
        let b1 = take(&mut slots, &mut made, 2, 1);
        let a4 = take(&mut slots, &mut made, 1, 4);
        assert_eq!((a1.id, b1.id, a4.id), (1, 2, 3));
        // Asked again: the same ones, nothing made.
        assert_eq!(take(&mut slots, &mut made, 2, 1), b1);
        assert_eq!(take(&mut slots, &mut made, 1, 1), a1);
        assert_eq!(take(&mut slots, &mut made, 1, 4), a4);
        assert_eq!(made, 3);
        assert_eq!(slots.len(), 3);
        // A failed make keeps nothing.
        let r = slots.get_or_make(3, 1, || Err::<Made, _>("refused"));
        assert_eq!(r.err(), Some("refused"));
        assert_eq!(slots.len(), 3);
    }

    #[test]
    fn two_streams_never_launch_one_template() {
        // simpleHyperQ's pattern and then some: 32 streams, two single
        // launches each, interleaved, then runs of several sizes.
        let mut slots = Slots::new(MAX_TEMPLATES);
        let mut made = 0;
        let mut launched_on: std::collections::HashMap<u32, u64> = Default::default();
        let mut launch = |slots: &mut Slots<Made>, made: &mut u32, stream: u64, size| {
            let t = take(slots, made, stream, size);
            assert_eq!((t.stream, t.size), (stream, size));
            let first = *launched_on.entry(t.id).or_insert(stream);
            assert_eq!(first, stream, "template {} on two streams", t.id);
        };
        for _ in 0..2 {
            for st in 0..32u64 {
                launch(&mut slots, &mut made, st, 1);
            }
        }
        assert_eq!(made, 32, "one template per stream, kept");
        for round in 0..50u64 {
            for st in 0..8u64 {
                let size = SIZES[crate::usize_from(round + st) % SIZES.len()];
                launch(&mut slots, &mut made, st, size);
            }
        }
    }

    #[test]
    fn the_least_recently_used_template_goes_first() {
        let mut slots = Slots::new(3);
        let mut made = 0;
        let a = take(&mut slots, &mut made, 1, 1);
        let b = take(&mut slots, &mut made, 2, 1);
        let c = take(&mut slots, &mut made, 3, 1);
        // `a` used last: `b` is the oldest.
        assert_eq!(take(&mut slots, &mut made, 1, 1), a);
        let d = take(&mut slots, &mut made, 4, 1);
        assert_eq!(slots.len(), 3);
        assert_eq!(take(&mut slots, &mut made, 1, 1), a);
        assert_eq!(take(&mut slots, &mut made, 3, 1), c);
        assert_eq!(take(&mut slots, &mut made, 4, 1), d);
        assert_eq!(made, 4);
        // `b` was dropped: asked again it is made anew.
        let b2 = take(&mut slots, &mut made, 2, 1);
        assert_ne!(b2.id, b.id);
        assert_eq!(made, 5);
        assert_eq!(slots.len(), 3);
    }

    #[test]
    fn a_destroyed_streams_templates_go_with_it() {
        let mut slots = Slots::new(MAX_TEMPLATES);
        let mut made = 0;
        for size in SIZES {
            take(&mut slots, &mut made, 7, size);
            take(&mut slots, &mut made, 8, size);
        }
        assert_eq!(slots.len(), 2 * SIZES.len());
        slots.forget_stream(7);
        assert_eq!(slots.len(), SIZES.len());
        let kept = take(&mut slots, &mut made, 8, 64);
        assert_eq!(kept.stream, 8);
        assert_eq!(made as usize, 2 * SIZES.len(), "stream 8's are kept");
        slots.clear();
        assert_eq!(slots.len(), 0);
    }
}
