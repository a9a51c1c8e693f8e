//! Live migration of a guest holding what frameworks hold (a real daemon,
//! two simulated GPUs): a stream with a priority, events, a module global
//! whose address it learnt, its own VMM memory (reserved, created, mapped)
//! and a graph kept on the host. The vGPU moves GPU 0 -> 1 -> 0 -> 1 while
//! the guest runs rounds of that work, and every round's results are what
//! they would have been had it stayed. A guest holding a CUDA array is
//! refused a move, and the refusal names the array and the target GPU; so
//! is one holding compressible memory, to a GPU without compression, and
//! so are guests sharing VMM memory through a shareable handle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use daemon::control::{client_call, ApiTarget};
use guest::Gpu;
use protocol::graph::{encode_graph, GraphNode, GraphOp};
use protocol::{Dim3, ImageKind, Request};
use serde_json::Value;
use tests::{cargo_build, PTX, TEST_SPIN};

const ROUNDS: u64 = 60;

fn daemon(name: &str) -> DaemonProc {
    daemon_with(name, "")
}

/// With `sim` added to the `[sim]` table (two GPUs). Its log (warnings up)
/// goes to a file: the refusals these tests cause are asserted there.
fn daemon_with(name: &str, sim: &str) -> DaemonProc {
    let bin = cargo_build("cli").join("fairvgpu");
    DaemonProc::start_with_logged(
        &bin,
        name,
        ExecutorKind::Sim,
        &[VmSpec::new("mover", 256)],
        &format!("\n[sim]\ngpus = 2\n{sim}\n[placement]\nenabled = false\n"),
        "warn",
    )
    .unwrap()
}

/// How many warnings in the daemon's log refuse a move to GPU 1 because of
/// `what`.
fn refusals(d: &DaemonProc, what: &str) -> usize {
    std::fs::read_to_string(d.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("WARN") && l.contains("migration to GPU 1 refused") && l.contains(what)
        })
        .count()
}

fn migrate(d: &DaemonProc, gpu: u32) -> (u16, Value) {
    d.post(
        "/api/v1/vgpus/mover/migrate",
        &format!("{{\"gpu\": {gpu}}}"),
    )
    .expect("API answers")
}

fn read_u32(gpu: &mut Gpu, at: u64) -> u32 {
    let mut four = [0u8; 4];
    gpu.memcpy_dtoh(&mut four, at, 0).unwrap();
    u32::from_le_bytes(four)
}

#[test]
fn streams_events_globals_vmm_memory_and_graphs_move_with_their_guest() {
    let d = daemon("migration-objects");
    assert_eq!(d.vgpu("mover").unwrap()["gpu"], 0);
    let mut gpu = Gpu::connect_with(&d.socket("mover"), TEST_SPIN).unwrap();
    let m = gpu.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
    let count = gpu.get_function(m, "atomic_count").unwrap();
    let (global, gsize) = gpu.module_global(m, "fvg_counter").unwrap();
    assert_eq!(gsize, 4);
    // A non-blocking stream of high priority, and events on it.
    let st = gpu.stream_create(1, -1).unwrap();
    let (e0, e1) = (gpu.event_create(0).unwrap(), gpu.event_create(0).unwrap());
    // The guest's own VMM memory.
    let size = protocol::VMM_GRANULARITY;
    let va = gpu
        .request(&Request::VmmReserve {
            size,
            align: 0,
            addr: 0,
        })
        .unwrap()
        .vals[0];
    let h = gpu
        .request(&Request::VmmCreate {
            size,
            compression: 0,
        })
        .unwrap()
        .vals[0];
    gpu.request(&Request::VmmMap {
        ptr: va,
        size,
        offset: 0,
        handle: h,
    })
    .unwrap();
    gpu.request(&Request::VmmSetAccess {
        ptr: va,
        size,
        flags: 3,
    })
    .unwrap();
    gpu.memcpy_htod(va, &[0u8; 128]).unwrap();
    gpu.memcpy_htod(global, &[0u8; 4]).unwrap();
    // A graph: 32 threads count at `va`, then the count is copied 64
    // bytes on.
    let one = Dim3 { x: 1, y: 1, z: 1 };
    let nodes = [
        GraphNode {
            op: GraphOp::Kernel {
                func: count.handle,
                grid: one,
                block: Dim3 { x: 32, y: 1, z: 1 },
                shared_mem: 0,
                params: va.to_le_bytes().to_vec(),
                cluster: Default::default(),
            },
            deps: vec![],
        },
        GraphNode {
            op: GraphOp::Copy {
                dst: va + 64,
                src: va,
                len: 4,
            },
            deps: vec![0],
        },
    ];
    let exec = gpu.graph_instantiate(&encode_graph(&nodes)).unwrap();

    // Rounds of work, the vGPU moved between them from another thread.
    let rounds = Arc::new(AtomicU64::new(0));
    let mover = {
        let (rounds, dir) = (rounds.clone(), d.dir.clone());
        std::thread::spawn(move || {
            let api = ApiTarget::Unix(dir.join("api.sock"));
            for (i, target) in [1, 0, 1].into_iter().enumerate() {
                while rounds.load(Ordering::Relaxed) < 10 * (i as u64 + 1) {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                let (code, body) = client_call(
                    &api,
                    "POST",
                    "/api/v1/vgpus/mover/migrate",
                    format!("{{\"gpu\": {target}}}").as_bytes(),
                )
                .unwrap();
                let v: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(code, 200, "{v}");
                assert_eq!(v["gpu"], target);
            }
        })
    };
    for r in 1..=ROUNDS {
        gpu.event_record(e0, st).unwrap();
        gpu.graph_launch(exec, st).unwrap();
        // 8 threads count in the module global, through its address.
        gpu.launch(
            &count,
            one,
            Dim3 { x: 8, y: 1, z: 1 },
            0,
            st,
            &[&global.to_le_bytes()],
        )
        .unwrap();
        gpu.event_record(e1, st).unwrap();
        gpu.event_synchronize(e1).unwrap();
        assert!(gpu.event_query(e0).unwrap());
        assert!(gpu.event_elapsed_ms(e0, e1).unwrap() >= 0.0);
        assert_eq!(read_u32(&mut gpu, va), 32 * r as u32, "round {r}");
        assert_eq!(read_u32(&mut gpu, va + 64), 32 * r as u32, "round {r}");
        assert_eq!(read_u32(&mut gpu, global), 8 * r as u32, "round {r}");
        rounds.store(r, Ordering::Relaxed);
    }
    mover.join().expect("three migrations");
    let v = d.vgpu("mover").unwrap();
    assert_eq!(v["gpu"], 1);
    assert_eq!(v["migrations"], 3);
    assert_eq!(v["worker_faults"], 0);
    // The handles still name what they named: the module global's
    // address is the one the guest learnt.
    assert_eq!(gpu.module_global(m, "fvg_counter").unwrap(), (global, 4));
    gpu.graph_destroy(exec).unwrap();
    gpu.stream_destroy(st).unwrap();
}

#[test]
fn a_guest_holding_a_cuda_array_stays_and_the_refusal_names_it() {
    let d = daemon("migration-keeper");
    let mut gpu = Gpu::connect_with(&d.socket("mover"), TEST_SPIN).unwrap();
    let buf = gpu.mem_alloc(64).unwrap();
    gpu.memcpy_htod(buf, &[7u8; 64]).unwrap();
    let desc = protocol::array::ArrayDesc {
        width: 64,
        height: 64,
        depth: 0,
        format: 0x20,
        channels: 1,
        flags: 0,
    };
    let array = gpu.request(&Request::ArrayCreate { desc }).unwrap().vals[0];
    let (code, body) = migrate(&d, 1);
    assert_eq!(code, 409, "{body}");
    let text = body.to_string();
    assert!(text.contains("a CUDA array"), "{text}");
    assert!(text.contains("could not move to GPU 1"), "{text}");
    assert!(text.contains("stays on GPU 0"), "{text}");
    assert_eq!(refusals(&d, "a CUDA array"), 1);
    let events = d.status().unwrap()["events"].to_string();
    assert!(events.contains("a CUDA array"), "{events}");
    // Nothing moved or broke: the guest computes on, and once the array
    // goes the vGPU moves.
    let mut back = [0u8; 64];
    gpu.memcpy_dtoh(&mut back, buf, 0).unwrap();
    assert_eq!(back, [7u8; 64]);
    assert_eq!(d.vgpu("mover").unwrap()["gpu"], 0);
    gpu.request(&Request::ArrayDestroy { array }).unwrap();
    let (code, body) = migrate(&d, 1);
    assert_eq!(code, 200, "{body}");
    gpu.memcpy_dtoh(&mut back, buf, 0).unwrap();
    assert_eq!(back, [7u8; 64]);
}

#[test]
fn compressible_memory_does_not_move_to_a_gpu_without_compression() {
    let d = daemon_with("migration-compressible", "no_compression_gpu = 1\n");
    let mut gpu = Gpu::connect_with(&d.socket("mover"), TEST_SPIN).unwrap();
    let size = protocol::VMM_GRANULARITY;
    let create = |gpu: &mut Gpu, compression| {
        gpu.request(&Request::VmmCreate { size, compression })
            .unwrap()
            .vals
    };
    // Granted on GPU 0, which has generic compression.
    let v = create(&mut gpu, protocol::VMM_COMPRESSION_GENERIC);
    assert_eq!(v[1], u64::from(protocol::VMM_COMPRESSION_GENERIC));
    let h = v[0];
    let va = gpu
        .request(&Request::VmmReserve {
            size,
            align: 0,
            addr: 0,
        })
        .unwrap()
        .vals[0];
    gpu.request(&Request::VmmMap {
        ptr: va,
        size,
        offset: 0,
        handle: h,
    })
    .unwrap();
    gpu.memcpy_htod(va, &[5u8; 64]).unwrap();
    let (code, body) = migrate(&d, 1);
    assert_eq!(code, 409, "{body}");
    let text = body.to_string();
    assert!(text.contains("compressible memory"), "{text}");
    assert!(text.contains("could not move to GPU 1"), "{text}");
    assert_eq!(refusals(&d, "compressible memory"), 1);
    assert_eq!(d.vgpu("mover").unwrap()["gpu"], 0);
    let mut back = [0u8; 64];
    gpu.memcpy_dtoh(&mut back, va, 0).unwrap();
    assert_eq!(back, [5u8; 64]);
    // Once it goes, the vGPU moves; GPU 1 makes compressible memory plain
    // and says so.
    gpu.request(&Request::VmmUnmap { ptr: va, size }).unwrap();
    gpu.request(&Request::VmmRelease { handle: h }).unwrap();
    let (code, body) = migrate(&d, 1);
    assert_eq!(code, 200, "{body}");
    let v = create(&mut gpu, protocol::VMM_COMPRESSION_GENERIC);
    assert_eq!(v[1], 0);
}

#[test]
fn guests_sharing_vmm_memory_stay_and_the_refusal_names_it() {
    use protocol::VMM_GRANULARITY as G;
    let d = daemon("migration-shared");
    let mut a = Gpu::connect_with(&d.socket("mover"), TEST_SPIN).unwrap();
    let mut b = Gpu::connect_with(&d.socket("mover"), TEST_SPIN).unwrap();
    let h = a
        .request(&Request::VmmCreate {
            size: G,
            compression: 0,
        })
        .unwrap()
        .vals[0];
    let token = a.request(&Request::VmmExport { handle: h }).unwrap().vals[0];
    let (code, body) = migrate(&d, 1);
    assert_eq!(code, 409, "exported: {body}");
    let imported = b.request(&Request::VmmImport { token }).unwrap().vals[0];
    let (code, body) = migrate(&d, 1);
    assert_eq!(code, 409, "{body}");
    let text = body.to_string();
    assert!(text.contains("shareable handle"), "{text}");
    assert!(text.contains("stays on GPU 0"), "{text}");
    // Every worker of the vGPU is asked to move at once, and each that
    // holds the shared memory refuses: a's once exported, then a's and
    // b's once imported.
    assert_eq!(
        refusals(&d, "shareable handle"),
        3,
        "exported, then imported"
    );
    assert_eq!(d.vgpu("mover").unwrap()["gpu"], 0);
    // Once neither holds the shared memory, the vGPU moves.
    b.request(&Request::VmmRelease { handle: imported })
        .unwrap();
    a.request(&Request::VmmRelease { handle: h }).unwrap();
    let (code, body) = migrate(&d, 1);
    assert_eq!(code, 200, "{body}");
}
