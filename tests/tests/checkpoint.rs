//! A vGPU's checkpoint taken while its guest computes, and another worker
//! (another executor, as on another host) serving on from it over the same
//! region: the guest's loop goes on with the same pointers and handles and
//! finishes with the exact sums (a graph of its kernel launched every other
//! round), never seeing the change. A checkpoint that
//! does not fit where it would land is refused before the source lets go,
//! and the guest goes on; one refused (an object that cannot be put in
//! one) names it and leaves the guest going on too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use guest::Gpu;
use protocol::{Dim3, ImageKind};
use tests::{worker_config, PTX, TEST_SPIN};
use worker::executor::sim::{SimExecutor, SimParams};
use worker::executor::Keeper;
use worker::serve::{spawn, spawn_over, CheckpointError, Running};

/// Elements: 384 KiB a copy, more than one chunk of the arena (256 KiB),
/// so that a checkpoint may come while a copy's data is under way.
const N: usize = 96 << 10;
const ROUNDS: u64 = 100;

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A guest that adds `b` (all ones) to `a` (0, 1, 2, ...) in place, round
/// after round, and checks `a` after each: after round r, a[i] = i + r.
/// Odd rounds launch the kernel, even ones a graph of it made at the start.
/// `rounds` counts the rounds done; the guest returns its last sum.
fn adder(socket: std::path::PathBuf, rounds: Arc<AtomicU64>) -> std::thread::JoinHandle<f64> {
    std::thread::spawn(move || {
        let mut gpu = Gpu::connect_with(&socket, TEST_SPIN).expect("guest attaches");
        let m = gpu.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
        let add = gpu.get_function(m, "vector_add").unwrap();
        let stream = gpu.stream_create(0, 0).unwrap();
        let len = (N * 4) as u64;
        let (a, b) = (gpu.mem_alloc(len).unwrap(), gpu.mem_alloc(len).unwrap());
        let start: Vec<f32> = (0..N).map(|i| i as f32).collect();
        gpu.memcpy_htod(a, &bytes(&start)).unwrap();
        gpu.memcpy_htod(b, &bytes(&vec![1.0; N])).unwrap();
        let (grid, block) = (Dim3 { x: 384, y: 1, z: 1 }, Dim3 { x: 256, y: 1, z: 1 });
        let n = u32::try_from(N).unwrap();
        let mut out = vec![0u8; N * 4];
        let mut sum = 0.0;
        let params: [&[u8]; 4] = [
            &a.to_le_bytes(),
            &b.to_le_bytes(),
            &a.to_le_bytes(),
            &n.to_le_bytes(),
        ];
        let node = protocol::graph::GraphNode {
            op: protocol::graph::GraphOp::Kernel {
                func: add.handle,
                grid,
                block,
                shared_mem: 0,
                params: params.concat(),
                cluster: Default::default(),
            },
            deps: Vec::new(),
        };
        let graph = gpu
            .graph_instantiate(&protocol::graph::encode_graph(&[node]))
            .unwrap();
        for r in 1..=ROUNDS {
            if r % 2 == 0 {
                gpu.graph_launch(graph, stream).unwrap();
            } else {
                gpu.launch(&add, grid, block, 0, stream, &params).unwrap();
            }
            gpu.memcpy_dtoh(&mut out, a, stream).unwrap();
            let got = f32s(&out);
            for (i, x) in got.iter().enumerate() {
                assert_eq!(*x, i as f32 + r as f32, "round {r}, element {i}");
            }
            sum = got.iter().map(|&x| f64::from(x)).sum();
            rounds.store(r, Ordering::Relaxed);
        }
        sum
    })
}

/// Bytes one copy round trip moves each way: 32 chunks of the arena, so
/// that a checkpoint asked for mid-copy waits for the copy's data.
const COPY: usize = 8 << 20;
const COPIES: u64 = 40;
/// Bytes of the copier's pinned block.
const PINNED: u64 = 64 << 10;

/// A second guest process: copies `COPY` bytes of a pattern of the round
/// to the device and back, round after round, and checks them; `copies`
/// counts the round trips done.
fn copier(socket: std::path::PathBuf, copies: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut gpu = Gpu::connect_with(&socket, TEST_SPIN).expect("guest attaches");
        let p = gpu.mem_alloc(COPY as u64).unwrap();
        let q = gpu.mem_alloc(COPY as u64).unwrap();
        // Each round's bytes also pass through a block of the pinned pool,
        // which must stay the process's across the checkpoint.
        let block = gpu.pinned_alloc(PINNED).unwrap();
        let mut back = vec![0u8; COPY];
        for r in 1..=COPIES {
            let pattern: Vec<u8> = (0..COPY).map(|i| (i as u64 * 31 + r) as u8).collect();
            gpu.memcpy_htod(p, &pattern).unwrap();
            gpu.memcpy_dtoh_pinned(p, block, PINNED, 0).unwrap();
            gpu.memcpy_htod_pinned(q, block, PINNED, 0).unwrap();
            gpu.memcpy_dtoh(&mut back, q, 0).unwrap();
            let n = usize::try_from(PINNED).unwrap();
            assert!(
                back[..n] == pattern[..n],
                "round {r}: the pinned block's bytes changed"
            );
            copies.store(r, Ordering::Relaxed);
        }
        gpu.pinned_free(block)
            .expect("its pinned block is still its own");
    })
}

fn sim() -> Box<SimExecutor> {
    Box::new(SimExecutor::new(SimParams::default()))
}

fn wait_rounds(rounds: &AtomicU64, n: u64) {
    let t = Instant::now();
    while rounds.load(Ordering::Relaxed) < n {
        assert!(t.elapsed() < Duration::from_secs(60), "the guest stalled");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn expected_sum() -> f64 {
    (0..N).map(|i| i as f64 + ROUNDS as f64).sum()
}

#[test]
fn a_guest_computes_on_under_the_worker_that_serves_on_from_its_checkpoint() {
    let dir = scratch::dir("fvg-checkpoint-handover");
    let cfg = worker_config("ckpt", dir.join("vgpu.sock"), 64 << 20);
    let first: Running = spawn(&cfg, sim()).expect("worker starts");
    let rounds = Arc::new(AtomicU64::new(0));
    let guest = adder(cfg.socket.clone(), rounds.clone());
    let copies = Arc::new(AtomicU64::new(0));
    let other = copier(cfg.socket.clone(), copies.clone());
    wait_rounds(&rounds, 30);
    wait_rounds(&copies, 3);

    let image = first
        .checkpoint(Duration::from_secs(5))
        .expect("checkpoint taken");
    let at = rounds.load(Ordering::Relaxed);
    assert_eq!(image.sessions.len(), 2, "two guest processes");
    let s = image
        .sessions
        .iter()
        .find(|s| !s.context.modules.is_empty())
        .expect("the adder's process");
    assert_eq!(s.context.memory.len(), 2, "a and b");
    assert_eq!(s.context.modules[0].globals.len(), 1, "the module's global");
    assert_eq!((s.context.modules.len(), s.context.functions.len()), (1, 1));
    assert_eq!(s.context.streams.len(), 1);
    assert_eq!(s.context.graphs.len(), 1, "its graph");
    assert!(s.next_seq > 0);
    // Held: the guest's next request waits in its ring.
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        rounds.load(Ordering::Relaxed) <= at + 1,
        "served while held"
    );

    // Through the stream format, as it would go to another host.
    let mut stream = Vec::new();
    worker::checkpoint::write(&mut stream, &image, Some(b"key")).unwrap();
    let image = worker::checkpoint::read(
        &mut stream.as_slice(),
        worker::checkpoint::Check::Own(Some(b"key")),
        &worker::checkpoint::Limits::default(),
    )
    .unwrap();

    let handover = first.hand_over().expect("the first worker hands over");
    let second = spawn_over(&cfg, sim(), handover, &image).expect("the second serves on");
    assert_eq!(guest.join().expect("the guest finished"), expected_sum());
    other
        .join()
        .expect("the other process's copies all came back");
    assert_eq!(copies.load(Ordering::Relaxed), COPIES);
    assert!(second.stats.requests.load(Ordering::Relaxed) > 0);
    second.shutdown().unwrap();
}

/// What a restore checks before the source lets go: a checkpoint taken on
/// another kind of GPU, naming a channel the worker does not serve, or
/// holding more memory than the vGPU may have there, is refused; the
/// checkpoint is not used, and the guest goes on where it was.
#[test]
fn a_checkpoint_that_does_not_fit_is_refused_and_the_guest_goes_on_where_it_was() {
    let dir = scratch::dir("fvg-checkpoint-fits");
    let cfg = worker_config("ckpt-fits", dir.join("vgpu.sock"), 64 << 20);
    let w = spawn(&cfg, sim()).expect("worker starts");
    let rounds = Arc::new(AtomicU64::new(0));
    let guest = adder(cfg.socket.clone(), rounds.clone());
    wait_rounds(&rounds, 10);
    let image = w
        .checkpoint(Duration::from_secs(5))
        .expect("checkpoint taken");
    let there = sim();
    worker::serve::fits(&cfg, there.as_ref(), &image).expect("it fits a worker like its own");

    let mut other_gpu = image.clone();
    other_gpu.device.name = "NVIDIA H100 80GB HBM3".into();
    match worker::serve::fits(&cfg, there.as_ref(), &other_gpu) {
        Err(e @ CheckpointError::Device { .. }) => {
            assert!(e.to_string().contains("NVIDIA H100 80GB HBM3"), "{e}")
        }
        other => panic!("another GPU's checkpoint: {other:?}"),
    }
    let mut far_channel = image.clone();
    far_channel.sessions[0].channels[0].index = 99;
    assert!(matches!(
        worker::serve::fits(&cfg, there.as_ref(), &far_channel),
        Err(CheckpointError::Channel(99))
    ));
    let small = worker_config("ckpt-fits", dir.join("vgpu.sock"), 256 << 10);
    assert!(matches!(
        worker::serve::fits(&small, there.as_ref(), &image),
        Err(CheckpointError::Memory(_))
    ));
    w.resume();
    assert_eq!(guest.join().expect("the guest finished"), expected_sum());
    w.shutdown().unwrap();
}

#[test]
fn a_refused_checkpoint_names_what_kept_it_and_the_guest_goes_on() {
    let dir = scratch::dir("fvg-checkpoint-refused");
    let cfg = worker_config("ckpt-refused", dir.join("vgpu.sock"), 64 << 20);
    let w = spawn(&cfg, sim()).expect("worker starts");
    let mut gpu = Gpu::connect_with(&cfg.socket, TEST_SPIN).unwrap();
    let p = gpu.mem_alloc(64).unwrap();
    // A conditional scope: its handles are values the guest's kernels hold.
    let scope = gpu.cond_scope_create().unwrap();
    match w.checkpoint(Duration::from_secs(5)) {
        Err(CheckpointError::Kept { keeper, .. }) => {
            assert_eq!(keeper, Keeper::ConditionalGraph)
        }
        other => panic!("a conditional scope was put in a checkpoint: {other:?}"),
    }
    // Not held: the guest goes on.
    gpu.cond_scope_destroy(scope).unwrap();
    gpu.memset_async(p, 1, 1, 64, 0).unwrap();
    gpu.synchronize().unwrap();
    drop(gpu);
    w.shutdown().unwrap();
}
