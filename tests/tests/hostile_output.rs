//! A guest process whose kernels print without end, and that never takes
//! its output, against a real `fairvgpu serve` on the sim (which models the
//! driver's printf FIFO): the worker holds at most
//! [`protocol::MAX_HELD_OUTPUT`] bytes of it, the daemon's log gets none of
//! the text, and the VM's other processes and the other VMs compute on and
//! get their own output, intact.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use guest::{Gpu, GuestError};
use protocol::{Dim3, ImageKind, Request};
use tests::{bytes_f32, cargo_build, f32_bytes, workspace, PTX, TEST_SPIN};

fn faults_ptx() -> Vec<u8> {
    std::fs::read(workspace().join("worker/kernels/faults.ptx")).unwrap()
}

fn dim(x: u32) -> Dim3 {
    Dim3 { x, y: 1, z: 1 }
}

/// Takes everything the host holds for `gpu`'s process: its bytes per
/// stream (1: standard output, 2: standard error).
fn take_all(gpu: &mut Gpu) -> [Vec<u8>; 2] {
    let mut got = [Vec::new(), Vec::new()];
    loop {
        let (r, text) = gpu.request_data(&Request::TakeOutput).unwrap();
        match r.vals[0] {
            0 => {
                assert!(text.is_empty(), "text with no stream");
                return got;
            }
            s @ (1 | 2) => got[s as usize - 1].extend_from_slice(&text),
            s => panic!("stream {s}"),
        }
    }
}

/// One checked vector add on `gpu`; an error if it failed or was wrong.
fn vector_add(gpu: &mut Gpu, f: &guest::Function, round: u32) -> Result<(), String> {
    let n = 256u32;
    let a: Vec<f32> = (0..n).map(|i| (i + round) as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (2 * i) as f32).collect();
    let e = |e: GuestError| format!("{e:?}");
    let pa = gpu.mem_alloc(4 * n as u64).map_err(e)?;
    let pb = gpu.mem_alloc(4 * n as u64).map_err(e)?;
    let pc = gpu.mem_alloc(4 * n as u64).map_err(e)?;
    gpu.memcpy_htod(pa, &f32_bytes(&a)).map_err(e)?;
    gpu.memcpy_htod(pb, &f32_bytes(&b)).map_err(e)?;
    let args: [&[u8]; 4] = [
        &pa.to_le_bytes(),
        &pb.to_le_bytes(),
        &pc.to_le_bytes(),
        &n.to_le_bytes(),
    ];
    gpu.launch(f, dim(1), dim(n), 0, 0, &args).map_err(e)?;
    let mut out = vec![0u8; 4 * n as usize];
    gpu.memcpy_dtoh(&mut out, pc, 0).map_err(e)?;
    for p in [pa, pb, pc] {
        gpu.mem_free(p).map_err(e)?;
    }
    let c = bytes_f32(&out);
    match (0..n as usize).find(|&i| c[i] != a[i] + b[i]) {
        Some(i) => Err(format!("round {round}: c[{i}] = {}", c[i])),
        None => Ok(()),
    }
}

/// A guest computing checked vector adds until `stop`: its rounds, or its
/// first failure, and the bytes of kernel output the host gave it (it
/// prints nothing itself: it leaves its output with the host and takes it
/// at the end, so that none is written to the test's own output).
fn computer(
    socket: std::path::PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(u32, usize)> {
    std::thread::spawn(move || {
        let mut gpu = Gpu::connect_with(&socket, TEST_SPIN).expect("attaches");
        gpu.set_take_output(false);
        let m = gpu.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
        let f = gpu.get_function(m, "vector_add").unwrap();
        let mut rounds = 0;
        while !stop.load(Ordering::Relaxed) {
            vector_add(&mut gpu, &f, rounds).unwrap();
            rounds += 1;
        }
        let given: usize = take_all(&mut gpu).iter().map(Vec::len).sum();
        (rounds, given)
    })
}

#[test]
fn a_guest_printing_without_end_is_bounded_and_costs_no_one_else() {
    let d = DaemonProc::start_logged(
        &cargo_build("cli").join("fairvgpu"),
        "hostile-output",
        ExecutorKind::Sim,
        &[VmSpec::new("vm1", 256), VmSpec::new("vm2", 256)],
        "info",
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Another VM, and another process of the same VM, compute throughout.
    let other_vm = computer(d.socket("vm2"), stop.clone());
    let same_vm = computer(d.socket("vm1"), stop.clone());

    // A process of the same VM printing its own lines, taking them itself.
    let mut polite = Gpu::connect_with(&d.socket("vm1"), TEST_SPIN).unwrap();
    polite.set_take_output(false);
    let pm = polite.module_load(ImageKind::Ptx, &faults_ptx()).unwrap();
    let pf = polite.get_function(pm, "fvg_printf").unwrap();

    // The chatty one: each launch prints 1,024 lines, 50 launches fill
    // the default 1 MiB FIFO, written out at each synchronize; it never
    // takes its output.
    let mut chatty = Gpu::connect_with(&d.socket("vm1"), TEST_SPIN).unwrap();
    chatty.set_take_output(false);
    let cm = chatty.module_load(ImageKind::Ptx, &faults_ptx()).unwrap();
    let cf = chatty.get_function(cm, "fvg_printf").unwrap();
    let line = |tag: u32, t: u32| format!("kernel {tag} thread {t}\n");
    let per_launch: usize = (0..1024).map(|t| line(7, t).len()).sum();
    let mut printed = 0usize;
    let mut polite_rounds = 0u32;
    let t0 = Instant::now();
    while printed < 3 * protocol::MAX_HELD_OUTPUT {
        for _ in 0..50 {
            chatty
                .launch(&cf, dim(1), dim(1024), 0, 0, &[&7u32.to_le_bytes()])
                .unwrap();
            printed += per_launch;
        }
        chatty.synchronize().unwrap();
        // The polite process's lines are its own, whole and in order.
        polite
            .launch(&pf, dim(1), dim(4), 0, 0, &[&9u32.to_le_bytes()])
            .unwrap();
        polite.synchronize().unwrap();
        let [out, err] = take_all(&mut polite);
        let want: String = (0..4).map(|t| line(9, t)).collect();
        assert_eq!(String::from_utf8_lossy(&out), want, "round {polite_rounds}");
        assert!(err.is_empty());
        polite_rounds += 1;
        assert!(t0.elapsed() < Duration::from_secs(240), "flood too slow");
    }
    eprintln!(
        "{} MiB printed in {:.1} s",
        printed >> 20,
        t0.elapsed().as_secs_f64()
    );

    stop.store(true, Ordering::Relaxed);
    let ((r2, foreign2), (r1, foreign1)) = (other_vm.join().unwrap(), same_vm.join().unwrap());
    assert!(r2 > 0 && r1 > 0, "rounds: other VM {r2}, same VM {r1}");
    // Another VM's worker never holds this VM's text.
    assert_eq!(
        foreign2, 0,
        "the other VM's process was given kernel output"
    );
    // Nor a process of the same VM that printed nothing, though the
    // printing process's marks are passed (and its text written) at slice
    // ends served in other processes' passes.
    assert_eq!(
        foreign1, 0,
        "a neighbour of the same VM was given kernel output"
    );

    // The worker held at most the bound for the chatty process: only its
    // own lines, the oldest kept, whole up to the cut.
    let [out, err] = take_all(&mut chatty);
    assert!(err.is_empty());
    assert!(
        out.len() <= protocol::MAX_HELD_OUTPUT,
        "{} bytes held for one process",
        out.len()
    );
    assert!(out.len() >= protocol::MAX_HELD_OUTPUT / 2, "{}", out.len());
    let text = String::from_utf8_lossy(&out);
    let mut lines = text.split_inclusive('\n');
    for (i, l) in lines.by_ref().take(4096).enumerate() {
        assert_eq!(l, line(7, i as u32 % 1024));
    }
    // Taken: nothing more is held, and the process still computes.
    assert!(take_all(&mut chatty).iter().all(Vec::is_empty));
    chatty
        .launch(&cf, dim(1), dim(2), 0, 0, &[&8u32.to_le_bytes()])
        .unwrap();
    chatty.synchronize().unwrap();
    let [out, _] = take_all(&mut chatty);
    assert_eq!(String::from_utf8_lossy(&out), line(8, 0) + &line(8, 1));

    // None of it reached the daemon's log, which stayed small.
    let log = std::fs::read_to_string(d.log_path()).unwrap();
    assert!(
        !log.contains("kernel 7 thread") && !log.contains("kernel 9 thread"),
        "kernel output reached the daemon's log"
    );
    let n = log.lines().count();
    assert!(n < 100, "{n} log lines:\n{log}");
    drop(d);
}
