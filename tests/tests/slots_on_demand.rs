//! Process slots' workers bound on demand, against a real `fairvgpu serve`
//! on the sim: a VM with slots starts no worker (the daemon keeps one spare
//! per GPU, bound to no VM); a process that attaches gets the spare bound
//! to its slot and computes; its worker ends with it; a fault's worker is
//! not restarted and the next process computes at once; a burst of more
//! processes than spares all compute; and a vGPU with two running
//! processes moves to another GPU with both, their pointers intact.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tests::worker_pids;

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use guest::Gpu;
use protocol::{Dim3, ImageKind};
use tests::faults::{text, Rig};
use tests::{cargo_build, wait_for_workers, worker_processes as workers, PTX, TEST_SPIN};

fn log(d: &DaemonProc) -> String {
    std::fs::read_to_string(d.log_path()).unwrap_or_default()
}

/// The daemon's log once it holds `line` (the supervisor notes a worker's
/// exit at its next round, which may come after the next process ended),
/// or as it is after 10 s.
fn log_with(d: &DaemonProc, line: &str) -> String {
    let t = Instant::now();
    loop {
        let l = log(d);
        if l.contains(line) || t.elapsed() > Duration::from_secs(10) {
            return l;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_vm_with_slots_holds_no_worker_until_a_process_attaches_and_none_after_it() {
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 4;
    let r = Rig::start("slots-demand", vm);
    // The GPU's spare alone, however long the VM idles.
    wait_for_workers(&r.d, 1, "an idle VM with slots");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(workers(&r.d), 1, "an idle VM holds no worker");
    assert!(!log(&r.d).contains("bound to a slot"), "{}", log(&r.d));

    // The first process computes, on the spare bound to its slot.
    let out = r.run("compute", &[]);
    assert!(
        text(&out.stdout).contains("compute sync: CUDA_SUCCESS"),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        log(&r.d).contains("spare worker bound to a slot"),
        "{}",
        log(&r.d)
    );
    // Its worker ended with it; a new spare waits.
    wait_for_workers(&r.d, 1, "after the process");

    // Two processes at once: a worker each, both gone once they are.
    let (mut a, _) = r.started("hold", &["2"]);
    let (mut b, _) = r.started("hold", &["2"]);
    wait_for_workers(&r.d, 3, "two bound workers and the next spare");
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    wait_for_workers(&r.d, 1, "after the two processes");
    let status = r.d.vgpu("vm1").unwrap();
    assert_eq!(status["worker_faults"], 0, "{status}");
}

#[test]
fn a_faulted_slots_worker_is_not_restarted_and_the_next_process_computes_at_once() {
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 2;
    let r = Rig::start("slots-fault", vm);
    wait_for_workers(&r.d, 1, "the spare");
    let out = r.run("trap", &[]);
    assert!(
        text(&out.stdout).contains("trap sync: CUDA_ERROR_LAUNCH_FAILED"),
        "{}",
        text(&out.stdout)
    );
    // The very next process computes: no retry.
    let out = r.run("compute", &[]);
    assert!(
        text(&out.stdout).contains("compute sync: CUDA_SUCCESS"),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let l = log_with(&r.d, "not restarted");
    assert!(l.contains("not restarted"), "{l}");
    assert!(!l.contains("restarting it on the same region"), "{l}");
    wait_for_workers(&r.d, 1, "after the fault and the next process");
}

/// A VM's processes beyond its slots wait for one to end, as natively they
/// would not fail for the others that run, and then compute.
#[test]
fn a_process_beyond_the_slots_waits_for_one_and_computes() {
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 2;
    let r = Rig::start("slots-beyond", vm);
    let held: Vec<Gpu> = (0..2)
        .map(|_| Gpu::connect_with(&r.d.socket("vm1"), TEST_SPIN).unwrap())
        .collect();
    let third = r.program("compute", &[]).output_handle();
    std::thread::sleep(Duration::from_millis(500));
    assert!(!third.is_finished(), "the third did not wait for a slot");
    drop(held);
    let out = third.join().unwrap();
    assert!(
        text(&out.stdout).contains("compute sync: CUDA_SUCCESS"),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn a_burst_of_more_processes_than_spares_all_compute() {
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 4;
    let r = Rig::start("slots-burst", vm);
    wait_for_workers(&r.d, 1, "the spare");
    let burst: Vec<_> = (0..4)
        .map(|_| r.program("compute", &[]).output_handle())
        .collect();
    for p in burst {
        let out = p.join().unwrap();
        assert!(
            text(&out.stdout).contains("compute sync: CUDA_SUCCESS"),
            "{}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    // Each got a worker of its own: a spare (ready, or bound as it
    // started) or one started for its slot, or the worker of a slot that
    // a process of the burst left before another claimed it (which on a
    // loaded machine happened: 3 bound for 4). At least one beyond the one
    // spare: the burst's processes run at once.
    let l = log(&r.d);
    let bound = l.matches("spare worker bound to a slot").count()
        + l.matches("no spare worker for process slot").count();
    assert!((2..=4).contains(&bound), "{bound} workers bound\n{l}");
    wait_for_workers(&r.d, 1, "after the burst");
}

/// Runs a command to its end on a thread of its own.
trait OutputHandle {
    fn output_handle(self) -> std::thread::JoinHandle<std::process::Output>;
}

impl OutputHandle for &mut std::process::Command {
    fn output_handle(self) -> std::thread::JoinHandle<std::process::Output> {
        let child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::spawn(move || child.wait_with_output().unwrap())
    }
}

/// A guest process that keeps incrementing a two-node list whose pointers
/// live in device memory (each node in an allocation of its own) until
/// `stop`; its launches go to `launches`. Returns whether the list's sum
/// at the end is exact.
fn list_walker(
    sock: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    launches: Arc<AtomicU64>,
) -> std::thread::JoinHandle<Result<(), String>> {
    std::thread::spawn(move || {
        let mut gpu = Gpu::connect_with(&sock, TEST_SPIN).map_err(|e| e.to_string())?;
        let m = gpu.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
        let inc = gpu.get_function(m, "list_inc").unwrap();
        let sum = gpu.get_function(m, "list_sum").unwrap();
        let (a, b) = (gpu.mem_alloc(16).unwrap(), gpu.mem_alloc(16).unwrap());
        let node = |next: u64, v: f32| {
            let mut n = [0u8; 16];
            n[..8].copy_from_slice(&next.to_le_bytes());
            n[8..12].copy_from_slice(&v.to_le_bytes());
            n
        };
        gpu.memcpy_htod(a, &node(b, 1.0)).unwrap();
        gpu.memcpy_htod(b, &node(0, 2.0)).unwrap();
        let out = gpu.mem_alloc(4).unwrap();
        let one = Dim3 { x: 1, y: 1, z: 1 };
        let mut k = 0u64;
        while !stop.load(Ordering::Relaxed) {
            gpu.launch(
                &inc,
                one,
                one,
                0,
                0,
                &[&a.to_le_bytes(), &2u32.to_le_bytes()],
            )
            .map_err(|e| format!("launch {k}: {e}"))?;
            gpu.synchronize().map_err(|e| format!("sync {k}: {e}"))?;
            k += 1;
            launches.fetch_add(1, Ordering::Relaxed);
        }
        gpu.launch(
            &sum,
            one,
            one,
            0,
            0,
            &[&a.to_le_bytes(), &out.to_le_bytes(), &2u32.to_le_bytes()],
        )
        .unwrap();
        let mut four = [0u8; 4];
        gpu.memcpy_dtoh(&mut four, out, 0).unwrap();
        let got = f32::from_le_bytes(four);
        let want = 3.0 + 2.0 * k as f32;
        (got == want)
            .then_some(())
            .ok_or(format!("sum {got}, not {want}, after {k} launches"))
    })
}

#[test]
fn a_vgpu_with_two_running_processes_moves_with_both() {
    let mut vm = VmSpec::new("mover", 256);
    vm.process_slots = 2;
    let d = DaemonProc::start_with_logged(
        &cargo_build("cli").join("fairvgpu"),
        "slots-migrate",
        ExecutorKind::Sim,
        &[vm],
        "\n[sim]\ngpus = 2\n\n[placement]\nenabled = false\n",
        "info",
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::default()).collect();
    let walkers: Vec<_> = counts
        .iter()
        .map(|c| list_walker(d.socket("mover"), stop.clone(), c.clone()))
        .collect();
    let launched = |n: u64| {
        let t = Instant::now();
        while counts.iter().any(|c| c.load(Ordering::Relaxed) < n) {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the processes stalled"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    launched(10);
    let (code, body) = d
        .post("/api/v1/vgpus/mover/migrate", "{\"gpu\": 1}")
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["gpu"], 1, "{body}");
    let before: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    launched(before.iter().max().unwrap() + 10);
    stop.store(true, Ordering::Relaxed);
    for w in walkers {
        w.join().unwrap().unwrap();
    }
    let v = d.vgpu("mover").unwrap();
    assert_eq!(v["gpu"], 1, "{v}");
    assert_eq!(v["migrations"], 1, "{v}");
    // Both slots free again: a new process computes, on GPU 1.
    let t = Instant::now();
    let mut gpu = loop {
        match Gpu::connect_with(&d.socket("mover"), TEST_SPIN) {
            Ok(g) => break g,
            Err(e) => {
                assert!(t.elapsed() < Duration::from_secs(10), "{e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let p = gpu.mem_alloc(4096).unwrap();
    gpu.memcpy_htod(p, &[7u8; 4096]).unwrap();
    let mut back = [0u8; 4096];
    gpu.memcpy_dtoh(&mut back, p, 0).unwrap();
    assert_eq!(back, [7u8; 4096]);
    let l = log(&d);
    assert!(
        l.contains("moving its 2 workers from GPU 0 to GPU 1"),
        "{l}"
    );
    // Its worker, bound after the move, is on GPU 1, as is the spare kept
    // for it (GPU 0 has no VM with slots now).
    let t = Instant::now();
    loop {
        let gpus: Vec<String> = worker_pids(&d)
            .into_iter()
            .map(|pid| {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
                args.windows(2)
                    .find(|w| w[0] == b"--gpu")
                    .map(|w| String::from_utf8_lossy(w[1]).into_owned())
                    .unwrap_or_default()
            })
            .collect();
        if !gpus.is_empty() && gpus.iter().all(|g| g == "1") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "workers' GPUs: {gpus:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(gpu);
}

/// A slot's worker killed while its process holds memory: the process
/// sees an error, the memory it held counts against the VM's limit no
/// more, and the next process gets all of it.
#[test]
fn what_a_killed_slots_worker_held_is_given_back() {
    let mut vm = VmSpec::new("vm1", 64);
    vm.process_slots = 2;
    let d = DaemonProc::start_logged(
        &cargo_build("cli").join("fairvgpu"),
        "slots-killed",
        ExecutorKind::Sim,
        &[vm],
        "info",
    )
    .unwrap();
    let sock = d.socket("vm1");
    let mut a = Gpu::connect_with(&sock, TEST_SPIN).unwrap();
    a.mem_alloc(48 << 20).unwrap();
    // Every worker process of the daemon (the bound one and the spare).
    for pid in worker_pids(&d) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(a.mem_alloc(1 << 20).is_err(), "its worker is gone");
    drop(a);
    let t = Instant::now();
    loop {
        let got = Gpu::connect_with(&sock, TEST_SPIN).and_then(|mut b| b.mem_alloc(48 << 20));
        if got.is_ok() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the next process cannot have the memory: {got:?}\n{}",
            log(&d)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(log(&d).contains("not restarted"), "{}", log(&d));
}

/// A vGPU with two running processes, one of which holds a CUDA array
/// (which cannot move): the migration fails naming that process's slot,
/// the other process's worker, which had moved, comes back, and both
/// compute on GPU 0 with their data.
#[test]
fn a_move_one_worker_cannot_make_brings_the_others_back() {
    use protocol::Request;
    let mut vm = VmSpec::new("mover", 256);
    vm.process_slots = 2;
    let d = DaemonProc::start_with_logged(
        &cargo_build("cli").join("fairvgpu"),
        "slots-move-back",
        ExecutorKind::Sim,
        &[vm],
        "\n[sim]\ngpus = 2\n\n[placement]\nenabled = false\n",
        "info",
    )
    .unwrap();
    let sock = d.socket("mover");
    let mut plain = Gpu::connect_with(&sock, TEST_SPIN).unwrap();
    let mut keeper = Gpu::connect_with(&sock, TEST_SPIN).unwrap();
    let bufs: Vec<u64> = [&mut plain, &mut keeper]
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            let b = g.mem_alloc(64).unwrap();
            g.memcpy_htod(b, &[i as u8 + 1; 64]).unwrap();
            b
        })
        .collect();
    let desc = protocol::array::ArrayDesc {
        width: 64,
        height: 64,
        depth: 0,
        format: 0x20,
        channels: 1,
        flags: 0,
    };
    keeper.request(&Request::ArrayCreate { desc }).unwrap();
    let (code, body) = d
        .post("/api/v1/vgpus/mover/migrate", "{\"gpu\": 1}")
        .unwrap();
    assert_eq!(code, 409, "{body}");
    let text = body.to_string();
    assert!(
        text.contains("process slot 1's worker could not: a CUDA array"),
        "{text}"
    );
    assert!(text.contains("a CUDA array"), "{text}");
    assert_eq!(d.vgpu("mover").unwrap()["gpu"], 0);
    for (i, (g, b)) in [&mut plain, &mut keeper].into_iter().zip(&bufs).enumerate() {
        let mut back = [0u8; 64];
        g.memcpy_dtoh(&mut back, *b, 0).unwrap();
        assert_eq!(back, [i as u8 + 1; 64], "process {i}");
    }
    let l = log(&d);
    assert!(l.contains("go back to GPU 0"), "{l}");
}
