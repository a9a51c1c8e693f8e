use protocol::stream_attr::StreamAttr;
use protocol::{Dim3, ImageKind, Status};
use vm_memory::VolatileSlice;

use super::super::kernels::vector_add_params;
use crate::executor::checkpoint::{ContextImage, GraphImage};
use crate::executor::sim::{SimExecutor, SimParams};
use crate::executor::{Context, Executor};

const N: u32 = 1024;

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn write(ctx: &mut dyn Context, dst: u64, v: &[f32]) {
    let mut bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    ctx.htod(dst, &VolatileSlice::from(bytes.as_mut_slice()), 0)
        .unwrap();
}

fn read(ctx: &mut dyn Context, src: u64, n: u32) -> Vec<f32> {
    let mut bytes = vec![0u8; n as usize * 4];
    ctx.dtoh(&VolatileSlice::from(bytes.as_mut_slice()), src, 0)
        .unwrap();
    f32s(&bytes)
}

/// A context with memory, a module (and its global), a function with an
/// attribute set, a stream with its priority, a recorded event and a limit.
struct Built {
    ctx: Box<dyn Context>,
    module: u64,
    add: u64,
    stream: u64,
    event: u64,
    bufs: [u64; 3],
}

fn build(exec: &mut SimExecutor) -> Built {
    let mut ctx = exec.open().unwrap();
    let module = ctx
        .load_module(ImageKind::Ptx, crate::KERNELS_PTX.as_bytes())
        .unwrap();
    let (add, _) = ctx.function(module, "vector_add").unwrap();
    ctx.func_set_attribute(add, 8, 1024).unwrap();
    let stream = ctx.stream_create(0, -3).unwrap();
    let event = ctx.event_create(0).unwrap();
    let bufs = [0; 3].map(|_| ctx.alloc(u64::from(N) * 4).unwrap());
    let a: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..N).map(|i| 2.0 * i as f32).collect();
    write(&mut *ctx, bufs[0], &a);
    write(&mut *ctx, bufs[1], &b);
    let (g, bl) = (Dim3 { x: 4, y: 1, z: 1 }, Dim3 { x: 256, y: 1, z: 1 });
    let p = vector_add_params(bufs[0], bufs[1], bufs[2], N);
    ctx.launch(add, g, bl, 0, stream, &p).unwrap();
    ctx.event_record(event, stream).unwrap();
    ctx.set_limit(2, 16 << 20).unwrap();
    Built {
        ctx,
        module,
        add,
        stream,
        event,
        bufs,
    }
}

#[test]
fn a_context_made_again_from_its_image_computes_on_with_the_same_handles_and_bytes() {
    let mut exec = SimExecutor::new(SimParams::default());
    let mut b = build(&mut exec);
    let image = b.ctx.checkpoint().unwrap();
    image.check().unwrap();
    assert_eq!(image.memory.len(), 3, "three buffers");
    assert_eq!(image.modules[0].globals.len(), 1, "the module's global");
    assert_eq!(
        (
            image.modules.len(),
            image.functions.len(),
            image.streams.len()
        ),
        (1, 1, 1)
    );
    // The same state gives the same image.
    assert_eq!(b.ctx.checkpoint().unwrap(), image);

    // Another worker (another executor, as on another host).
    let mut there = SimExecutor::new(SimParams::default());
    let mut ctx = there.restore(&image).unwrap();
    let sum: Vec<f32> = (0..N).map(|i| 3.0 * i as f32).collect();
    assert_eq!(read(&mut *ctx, b.bufs[2], N), sum, "the bytes came along");
    assert!(
        ctx.event_query(b.event).unwrap(),
        "a recorded event reads done"
    );
    assert_eq!(
        ctx.stream_attribute(b.stream, 8).unwrap(),
        StreamAttr::Priority(-3)
    );
    assert_eq!(ctx.func_attribute(b.add, 8).unwrap(), 1024);
    assert_eq!(ctx.limit(2).unwrap(), 16 << 20);
    let (global, size) = ctx.module_global(b.module, "fvg_counter").unwrap();
    assert_eq!(size, 4);
    assert_eq!(image.modules[0].globals[0].addr, global);
    // The pointers and handles the guest holds work there: c = a + c.
    let (g, bl) = (Dim3 { x: 4, y: 1, z: 1 }, Dim3 { x: 256, y: 1, z: 1 });
    let p = vector_add_params(b.bufs[0], b.bufs[2], b.bufs[2], N);
    ctx.launch(b.add, g, bl, 0, b.stream, &p).unwrap();
    ctx.stream_synchronize(b.stream).unwrap();
    let want: Vec<f32> = (0..N).map(|i| 4.0 * i as f32).collect();
    assert_eq!(read(&mut *ctx, b.bufs[2], N), want);
    // New objects get handles the image never used.
    let s = ctx.stream_create(0, 0).unwrap();
    assert!(s >= image.next_handle);
    let fresh = ctx.alloc(64).unwrap();
    assert!(image.memory.iter().all(|a| a.addr != fresh));
    // Its image is the same again, with the new stream and memory.
    let again = ctx.checkpoint().unwrap();
    assert_eq!(again.memory.len(), 4);
    assert_eq!(again.streams.len(), 2);
}

#[test]
fn a_context_made_clean_takes_an_image_and_one_holding_objects_is_refused() {
    let mut exec = SimExecutor::new(SimParams::default());
    let mut b = build(&mut exec);
    let image = b.ctx.checkpoint().unwrap();
    let mut there = SimExecutor::new(SimParams::default());
    // One that holds a stream and an event: refused, nothing taken. (No
    // memory or module global: the model never gives an address out twice.)
    let mut busy = there.open().unwrap();
    busy.stream_create(0, 0).unwrap();
    busy.event_create(0).unwrap();
    assert_eq!(busy.restore_into(&image), Err(Status::InvalidContext));
    // The same context made clean (as a spare worker's, made ahead).
    busy.synchronize().unwrap();
    busy.recycle().unwrap();
    busy.restore_into(&image).unwrap();
    let sum: Vec<f32> = (0..N).map(|i| 3.0 * i as f32).collect();
    assert_eq!(read(&mut *busy, b.bufs[2], N), sum, "the bytes came along");
    assert_eq!(busy.checkpoint().unwrap(), image);
}

#[test]
fn a_restore_where_its_addresses_are_taken_is_refused() {
    let mut exec = SimExecutor::new(SimParams::default());
    let mut b = build(&mut exec);
    let image = b.ctx.checkpoint().unwrap();
    // The same executor: the addresses are its own context's already.
    assert_eq!(exec.restore(&image).err(), Some(Status::InvalidValue));
}

/// A graph of one `c = a + b` launch over `b`'s buffers (`n` elements).
fn add_graph(b: &Built, n: u32) -> Vec<protocol::graph::GraphNode> {
    let (g, bl) = (Dim3 { x: 4, y: 1, z: 1 }, Dim3 { x: 256, y: 1, z: 1 });
    vec![protocol::graph::GraphNode {
        deps: Vec::new(),
        op: protocol::graph::GraphOp::Kernel {
            func: b.add,
            grid: g,
            block: bl,
            shared_mem: 0,
            params: vector_add_params(b.bufs[0], b.bufs[1], b.bufs[2], n),
            cluster: Default::default(),
        },
    }]
}

#[test]
fn a_graph_is_built_again_under_its_handle_and_runs_there() {
    let mut exec = SimExecutor::new(SimParams::default());
    let mut b = build(&mut exec);
    let graph = b.ctx.graph_instantiate(&add_graph(&b, N)).unwrap();
    assert_eq!(b.ctx.checkpoint_keeper(), None);
    let image = b.ctx.checkpoint().unwrap();
    assert_eq!(image.graphs.len(), 1);
    assert_eq!(image.graphs[0].handle, graph);

    let mut there = SimExecutor::new(SimParams::default());
    let mut ctx = there.restore(&image).unwrap();
    // Zero the sum, then the graph computes it again.
    write(&mut *ctx, b.bufs[2], &vec![0.0; N as usize]);
    ctx.graph_launch(graph, b.stream).unwrap();
    ctx.stream_synchronize(b.stream).unwrap();
    let sum: Vec<f32> = (0..N).map(|i| 3.0 * i as f32).collect();
    assert_eq!(read(&mut *ctx, b.bufs[2], N), sum);
    assert_eq!(ctx.checkpoint().unwrap(), image, "the same image again");
    ctx.graph_destroy(graph).unwrap();
}

#[test]
fn what_cannot_be_put_in_an_image_is_named_and_refused() {
    let mut exec = SimExecutor::new(SimParams::default());
    let mut b = build(&mut exec);
    assert_eq!(b.ctx.checkpoint_keeper(), None);
    // A conditional scope: its handles are values the guest's kernels hold.
    let scope = b.ctx.cond_scope_create().unwrap();
    assert_eq!(
        b.ctx.checkpoint_keeper(),
        Some(crate::executor::Keeper::ConditionalGraph)
    );
    assert_eq!(b.ctx.checkpoint().err(), Some(Status::NotSupported));
    b.ctx.cond_scope_destroy(scope).unwrap();
    assert_eq!(b.ctx.checkpoint_keeper(), None);
}

/// `i`'s first graph made one node of `op`, under the same handle.
fn one_node_graph(i: &mut ContextImage, op: protocol::graph::GraphOp) {
    let node = protocol::graph::GraphNode {
        deps: Vec::new(),
        op,
    };
    i.graphs[0] = GraphImage::of(i.graphs[0].handle, &[node]);
}

/// A hostile image (from another host) is checked before anything is made.
#[test]
fn a_forged_image_is_refused() {
    let mut exec = SimExecutor::new(SimParams::default());
    let mut b = build(&mut exec);
    b.ctx.graph_instantiate(&add_graph(&b, N)).unwrap();
    let image = b.ctx.checkpoint().unwrap();
    type Forge = Box<dyn Fn(&mut ContextImage)>;
    let forgeries: Vec<(&str, Forge)> = vec![
        (
            "overlapping memory",
            Box::new(|i| i.memory[1].addr = i.memory[0].addr + 2),
        ),
        (
            "bytes missing",
            Box::new(|i| {
                let b = &i.memory[0].bytes;
                i.memory[0].bytes = b[..b.len() - 1].to_vec().into();
            }),
        ),
        (
            "a handle twice",
            Box::new(|i| i.streams[0].handle = i.functions[0].handle),
        ),
        (
            "a handle past the next",
            Box::new(|i| i.events[0].handle = i.next_handle),
        ),
        (
            "a function of no module",
            Box::new(|i| i.functions[0].module = 9999),
        ),
        (
            "a global over memory",
            Box::new(|i| i.modules[0].globals[0].addr = i.memory[0].addr + 8),
        ),
        (
            "a global's bytes missing",
            Box::new(|i| i.modules[0].globals[0].bytes = Default::default()),
        ),
        (
            "a bad priority",
            Box::new(|i| i.streams[0].attrs[0].1[3] = 0x7f),
        ),
        ("an unknown limit", Box::new(|i| i.limits.push((99, 1)))),
        ("an image cut short", Box::new(|i| i.modules[0].len += 1)),
        (
            "a graph's nodes cut short",
            Box::new(|i| i.graphs[0].len += 1),
        ),
        (
            "a graph that is no graph",
            Box::new(|i| i.graphs[0].nodes.iter_mut().for_each(|b| *b = 0xff)),
        ),
        (
            "a graph of a function not in the image",
            Box::new(|i| {
                let f = i.functions[0].handle;
                i.functions.clear();
                one_node_graph(
                    i,
                    protocol::graph::GraphOp::Kernel {
                        func: f,
                        grid: Dim3 { x: 1, y: 1, z: 1 },
                        block: Dim3 { x: 1, y: 1, z: 1 },
                        shared_mem: 0,
                        params: Vec::new(),
                        cluster: Default::default(),
                    },
                );
            }),
        ),
        (
            "a graph of an event not in the image",
            Box::new(|i| one_node_graph(i, protocol::graph::GraphOp::EventRecord { event: 9999 })),
        ),
        (
            "a graph with a conditional node",
            Box::new(|i| {
                one_node_graph(
                    i,
                    protocol::graph::GraphOp::Conditional {
                        handle: 1,
                        kind: protocol::graph::CondKind::If,
                        bodies: vec![Vec::new()],
                    },
                )
            }),
        ),
        (
            "a graph under a stream's handle",
            Box::new(|i| i.graphs[0].handle = i.streams[0].handle),
        ),
    ];
    for (what, forge) in forgeries {
        let mut bad = image.clone();
        forge(&mut bad);
        assert!(bad.check().is_err(), "{what}: accepted");
        let mut there = SimExecutor::new(SimParams::default());
        assert!(there.restore(&bad).is_err(), "{what}: restored");
    }
}

#[test]
fn a_context_staged_with_an_images_modules_gives_them_to_its_restore() {
    let mut exec = SimExecutor::new(SimParams::default());
    let mut b = build(&mut exec);
    let image = b.ctx.checkpoint().unwrap();
    let mut there = SimExecutor::new(SimParams::default());
    let mut ctx = there.open().unwrap();
    assert_eq!(ctx.stage(&image).unwrap(), 1);
    // Staged modules are no objects: the context still takes a restore.
    ctx.restore_into(&image).unwrap();
    assert_eq!(ctx.staged_taken(), 1, "the restore took the staged module");
    let sum: Vec<f32> = (0..N).map(|i| 3.0 * i as f32).collect();
    assert_eq!(read(&mut *ctx, b.bufs[2], N), sum);

    // Another image's modules are not taken; a module the model cannot
    // load is refused when staged, as its load would be.
    let mut other = image.clone();
    let mut longer = other.modules[0].image.to_vec();
    longer.push(b' ');
    other.modules[0].image = longer.into();
    let mut there = SimExecutor::new(SimParams::default());
    let mut ctx = there.open().unwrap();
    ctx.stage(&other).unwrap();
    ctx.restore_into(&image).unwrap();
    assert_eq!(ctx.staged_taken(), 0, "not byte for byte the same image");
    let mut bad = image.clone();
    bad.modules[0].image = b"not ptx".to_vec().into();
    assert!(there.open().unwrap().stage(&bad).is_err());
}

#[test]
fn a_shape_leaves_out_the_bytes_that_read_left_out_gives() {
    use crate::executor::checkpoint::LeftOut;
    let mut exec = SimExecutor::new(SimParams::default());
    let mut b = build(&mut exec);
    let whole = b.ctx.checkpoint().unwrap();
    let shape = b.ctx.checkpoint_shape().unwrap();
    assert!(shape.memory.iter().all(|a| a.bytes.is_empty() && a.len > 0));
    let g = &shape.modules[0].globals[0];
    assert!(g.bytes.is_empty() && g.len == 4);
    for (a, w) in shape.memory.iter().zip(&whole.memory) {
        let mut dst = vec![0u8; usize::try_from(a.len).unwrap()];
        b.ctx
            .read_left_out(LeftOut::Allocation(a.addr), &mut dst)
            .unwrap();
        assert_eq!(dst, *w.bytes);
    }
    let mut dst = [0u8; 4];
    b.ctx
        .read_left_out(LeftOut::Global(g.addr), &mut dst)
        .unwrap();
    assert_eq!(dst[..], *whole.modules[0].globals[0].bytes);
    // Nowhere the context holds memory: refused.
    assert!(b
        .ctx
        .read_left_out(LeftOut::Allocation(0x10), &mut dst)
        .is_err());
}
