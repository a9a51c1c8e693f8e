//! Live migration on a real daemon with two simulated GPUs: a guest builds
//! a linked list in device memory (the pointers live in device memory, in
//! several allocations) and keeps launching kernels that walk it while its
//! vGPU is moved GPU 0 -> 1 -> 0 -> 1 through the API. Every pointer stays
//! valid, no launch is lost, and the sum at the end is exact. A pinned vGPU
//! is refused a move; another VM's guest runs on meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use daemon::control::{client_call, ApiTarget};
use guest::Gpu;
use protocol::{Dim3, ImageKind};
use serde_json::Value;
use tests::{cargo_build, spin_guest, PTX, TEST_SPIN};

const NODES: u32 = 1000;

/// Pins or unpins a vGPU through the API; the HTTP status.
fn pin(d: &DaemonProc, vm: &str, pinned: bool) -> u16 {
    let body = format!("{{\"pinned\": {pinned}}}");
    d.post(&format!("/api/v1/vgpus/{vm}/pin"), &body)
        .expect("API answers")
        .0
}

/// Asks the API to move a vGPU to `gpu`: the HTTP status and the answer.
fn migrate(d: &DaemonProc, vm: &str, gpu: u32) -> (u16, Value) {
    d.post(
        &format!("/api/v1/vgpus/{vm}/migrate"),
        &format!("{{\"gpu\": {gpu}}}"),
    )
    .expect("API answers")
}

#[test]
fn a_running_vgpu_moves_between_gpus_with_its_pointers_intact() {
    let bin = cargo_build("cli").join("fairvgpu");
    let vm = |name: &str| VmSpec::new(name, 256);
    let d = DaemonProc::start_with(
        &bin,
        "migration",
        ExecutorKind::Sim,
        &[vm("mover"), vm("stayer")],
        // Moves by hand only here: the balancer has its own test below.
        "\n[sim]\ngpus = 2\n\n[placement]\nenabled = false\n",
    )
    .unwrap();
    assert_eq!(d.vgpu("mover").unwrap()["gpu"], 0);

    // The other VM, busy on GPU 0 all along.
    let stop = Arc::new(AtomicBool::new(false));
    let other_rounds = Arc::new(AtomicU64::new(0));
    let other = spin_guest(
        d.socket("stayer"),
        200_000,
        1,
        stop.clone(),
        other_rounds.clone(),
    );

    // The list: NODES nodes of 16 bytes in ten allocations, each node
    // pointing to one in another allocation.
    let mut gpu = Gpu::connect_with(&d.socket("mover"), TEST_SPIN).unwrap();
    let m = gpu.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
    let inc = gpu.get_function(m, "list_inc").unwrap();
    let sum = gpu.get_function(m, "list_sum").unwrap();
    let per = NODES / 10;
    let blocks: Vec<u64> = (0..10)
        .map(|_| gpu.mem_alloc(u64::from(per) * 16).unwrap())
        .collect();
    // Node k lives in block k % 10, slot k / 10: consecutive nodes are in
    // different allocations.
    let addr = |k: u32| blocks[(k % 10) as usize] + u64::from(k / 10) * 16;
    let mut images = vec![vec![0u8; per as usize * 16]; 10];
    for k in 0..NODES {
        let next = if k + 1 < NODES { addr(k + 1) } else { 0 };
        let img = &mut images[(k % 10) as usize];
        let off = (k / 10) as usize * 16;
        img[off..off + 8].copy_from_slice(&next.to_le_bytes());
        img[off + 8..off + 12].copy_from_slice(&(k as f32).to_le_bytes());
    }
    for (b, img) in blocks.iter().zip(&images) {
        gpu.memcpy_htod(*b, img).unwrap();
    }
    let head = addr(0);
    let out = gpu.mem_alloc(4).unwrap();
    let one = Dim3 { x: 1, y: 1, z: 1 };

    // Launch, and move the vGPU between launches, from another thread.
    let launches = Arc::new(AtomicU64::new(0));
    let mover = {
        let (launches, dir) = (launches.clone(), d.dir.clone());
        std::thread::spawn(move || {
            let api = ApiTarget::Unix(dir.join("api.sock"));
            let mut pauses = Vec::new();
            for (i, target) in [1, 0, 1].into_iter().enumerate() {
                while launches.load(Ordering::Relaxed) < 20 * (i as u64 + 1) {
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
                pauses.push(v["pause_ms"].as_f64().unwrap());
            }
            pauses
        })
    };
    let mut k = 0u64;
    while !mover.is_finished() || k < 80 {
        gpu.launch(
            &inc,
            one,
            one,
            0,
            0,
            &[&head.to_le_bytes(), &NODES.to_le_bytes()],
        )
        .unwrap();
        k += 1;
        launches.store(k, Ordering::Relaxed);
        if k.is_multiple_of(4) {
            gpu.synchronize().unwrap();
        }
    }
    let pauses = mover.join().expect("three migrations");
    gpu.launch(
        &sum,
        one,
        one,
        0,
        0,
        &[
            &head.to_le_bytes(),
            &out.to_le_bytes(),
            &NODES.to_le_bytes(),
        ],
    )
    .unwrap();
    let mut four = [0u8; 4];
    gpu.memcpy_dtoh(&mut four, out, 0).unwrap();
    let want = (0..NODES).map(|k| k as f64).sum::<f64>() + k as f64 * f64::from(NODES);
    assert_eq!(
        f64::from(f32::from_le_bytes(four)),
        want,
        "after {k} launches"
    );

    let v = d.vgpu("mover").unwrap();
    assert_eq!(v["gpu"], 1);
    assert_eq!(v["migrations"], 3);
    assert_eq!(v["worker_faults"], 0);
    assert!(pauses.iter().all(|&p| p > 0.0 && p < 1000.0), "{pauses:?}");
    let events = d.status().unwrap()["events"].to_string();
    assert!(events.contains("mover: GPU 0 -> 1"), "{events}");

    // Pinned: refused, until unpinned.
    assert_eq!(pin(&d, "mover", true), 200);
    let (code, body) = migrate(&d, "mover", 0);
    assert_eq!(code, 409, "{body}");
    assert!(body.to_string().contains("pinned"), "{body}");
    assert_eq!(pin(&d, "mover", false), 200);
    assert_eq!(migrate(&d, "mover", 7).0, 409);

    stop.store(true, Ordering::Relaxed);
    other.join().expect("the other VM never failed");
    assert!(other_rounds.load(Ordering::Relaxed) > 0);
}

#[test]
fn the_balancer_moves_a_busy_vgpu_off_an_overloaded_gpu() {
    let bin = cargo_build("cli").join("fairvgpu");
    let vm = |name: &str| VmSpec::new(name, 256);
    // Both VMs start on GPU 0 of two; both keep their GPU busy.
    let vms = [vm("a"), vm("b")];
    let extra = "\n[sim]\ngpus = 2\n\n[placement]\ninterval_ms = 200\ncooldown_s = 60\n";
    let d = DaemonProc::start_with(&bin, "balancer", ExecutorKind::Sim, &vms, extra).unwrap();
    // (They were placed 0 and 1 as they name no GPU; put both on 0 by hand.)
    if d.vgpu("b").unwrap()["gpu"] == 1 {
        assert_eq!(pin(&d, "b", true), 200);
        assert_eq!(pin(&d, "b", false), 200);
        let (code, body) = migrate(&d, "b", 0);
        assert_eq!(code, 200, "{body}");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let guests: Vec<_> = ["a", "b"]
        .iter()
        .map(|n| spin_guest(d.socket(n), 1_000_000, 1, stop.clone(), Arc::default()))
        .collect();
    // Both demand all of GPU 0 (load 2.0): within a few rounds one moves.
    let t = std::time::Instant::now();
    loop {
        let (ga, gb) = (
            d.vgpu("a").unwrap()["gpu"].clone(),
            d.vgpu("b").unwrap()["gpu"].clone(),
        );
        if ga != gb {
            break;
        }
        assert!(
            t.elapsed().as_secs() < 30,
            "still both on GPU {ga}: {} {}",
            d.vgpu("a").unwrap(),
            d.vgpu("b").unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let events = d.status().unwrap()["events"].to_string();
    assert!(events.contains("GPU 0 -> 1"), "{events}");
    // No ping-pong: with one busy vGPU per GPU nothing moves again.
    let moves = |d: &DaemonProc| {
        ["a", "b"]
            .iter()
            .map(|n| d.vgpu(n).unwrap()["migrations"].as_u64().unwrap())
            .sum::<u64>()
    };
    let before = moves(&d);
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(moves(&d), before);
    stop.store(true, Ordering::Relaxed);
    for g in guests {
        g.join().unwrap();
    }
}
