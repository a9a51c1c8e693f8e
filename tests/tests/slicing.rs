//! Kernel slicing on a real daemon (sim executor): with `slice_blocks` set,
//! a launch of 16,384 blocks runs as sub-grids (issued while the vGPU holds
//! the GPU, the rest after other vGPUs had their turn) and computes exactly
//! what the whole launch computes; another VM's small kernels run on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use guest::Gpu;
use protocol::{Dim3, ImageKind};
use tests::{bytes_f32, cargo_build, f32_bytes, spin_guest, PTX, TEST_SPIN};

#[test]
fn a_large_grid_runs_as_sub_grids_with_exact_results() {
    let bin = cargo_build("cli").join("fairvgpu");
    let vm = |name: &str| VmSpec::new(name, 512);
    let d = DaemonProc::start_full(
        &bin,
        "slicing",
        ExecutorKind::Sim,
        &[vm("big"), vm("small")],
        "slice_blocks = 2000",
        "",
    )
    .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let small = spin_guest(d.socket("small"), 100_000, 1, stop.clone(), rounds.clone());

    let mut gpu = Gpu::connect_with(&d.socket("big"), TEST_SPIN).unwrap();
    let m = gpu.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
    let add = gpu.get_function(m, "vector_add").unwrap();
    let saxpy = gpu.get_function(m, "saxpy").unwrap();
    let n: u32 = 16_384 * 256;
    let bytes = u64::from(n) * 4;
    let a: Vec<f32> = (0..n).map(|i| (i % 1013) as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 71) as f32 * 0.5).collect();
    let (da, db, dc) = (
        gpu.mem_alloc(bytes).unwrap(),
        gpu.mem_alloc(bytes).unwrap(),
        gpu.mem_alloc(bytes).unwrap(),
    );
    gpu.memcpy_htod(da, &f32_bytes(&a)).unwrap();
    gpu.memcpy_htod(db, &f32_bytes(&b)).unwrap();
    let grid = Dim3 {
        x: 16_384,
        y: 1,
        z: 1,
    };
    let block = Dim3 { x: 256, y: 1, z: 1 };
    for _ in 0..3 {
        gpu.launch(
            &add,
            grid,
            block,
            0,
            0,
            &[
                &da.to_le_bytes(),
                &db.to_le_bytes(),
                &dc.to_le_bytes(),
                &n.to_le_bytes(),
            ],
        )
        .unwrap();
    }
    // y = 2 * c + b, sliced too.
    gpu.launch(
        &saxpy,
        grid,
        block,
        0,
        0,
        &[
            &2f32.to_le_bytes(),
            &dc.to_le_bytes(),
            &db.to_le_bytes(),
            &n.to_le_bytes(),
        ],
    )
    .unwrap();
    let mut out = vec![0u8; bytes as usize];
    gpu.memcpy_dtoh(&mut out, db, 0).unwrap();
    let got = bytes_f32(&out);
    for i in 0..n as usize {
        assert_eq!(got[i], 2.0 * (a[i] + b[i]) + b[i], "element {i}");
    }
    let v = d.vgpu("big").unwrap();
    let t = std::time::Instant::now();
    let mut sliced = v["sliced_launches"].as_u64().unwrap_or(0);
    while sliced < 4 && t.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        sliced = d.vgpu("big").unwrap()["sliced_launches"]
            .as_u64()
            .unwrap_or(0);
    }
    assert_eq!(sliced, 4, "every large launch was sliced");
    stop.store(true, Ordering::Relaxed);
    small.join().unwrap();
    assert!(rounds.load(Ordering::Relaxed) > 0);
}
