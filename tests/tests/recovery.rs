//! Worker faults under a real `fairvgpu serve` (sim executor), two VMs:
//! a guest's kernel fault poisons its vGPU's worker, a worker is killed
//! outright; each time the daemon restarts the worker on the same region,
//! the guests of that VM get `VgpuReset` and recover by opening the GPU
//! again, and the other VM's guest runs on, correct, without one error.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairvgpu_tests::{bytes_f32, cargo_build, f32_bytes, PTX, TEST_SPIN};
use guest_frontend::{Gpu, GuestError};
use host_backend::control::{client_call, ApiTarget};
use protocol::{Dim3, ImageKind, Status};
use serde_json::Value;

struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start() -> Daemon {
    let bin = cargo_build("fairvgpu").join("fairvgpu");
    let dir = std::env::temp_dir().join(format!("fvg-recovery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = format!(
        "[daemon]\nrun_dir = {:?}\nexecutor = \"sim\"\n\n[spin]\nspins = 2000\nmax_block_us = 2000\n",
        dir.display().to_string()
    );
    for vm in ["vm1", "vm2"] {
        cfg.push_str(&format!(
            "\n[[vm]]\nname = \"{vm}\"\ntenant = \"t-{vm}\"\nweight = 1\nmemory_limit_mib = 256\n"
        ));
    }
    std::fs::write(dir.join("host.toml"), cfg).unwrap();
    let child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(dir.join("host.toml"))
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("daemon starts");
    let d = Daemon { child, dir };
    let deadline = Instant::now() + Duration::from_secs(30);
    for s in ["api.sock", "vm1.sock", "vm2.sock"] {
        while !d.dir.join(s).exists() {
            assert!(Instant::now() < deadline, "{s} did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    d
}

fn status(d: &Daemon) -> Value {
    let (code, body) = client_call(
        &ApiTarget::Unix(d.dir.join("api.sock")),
        "GET",
        "/api/v1/status",
        b"",
    )
    .expect("API answers");
    assert_eq!(code, 200);
    serde_json::from_slice(&body).unwrap()
}

fn vgpu(st: &Value, name: &str) -> Value {
    st["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["vgpus"].as_array().unwrap().iter())
        .find(|v| v["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not in status"))
}

fn wait_restarts(d: &Daemon, name: &str, n: u64) {
    let t = Instant::now();
    while vgpu(&status(d), name)["worker_restarts"].as_u64() != Some(n) {
        assert!(t.elapsed() < Duration::from_secs(20), "{name}: no restart");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid of the worker process of `vm` (a child of the daemon).
fn worker_pid(d: &Daemon, vm: &str) -> i32 {
    let t = Instant::now();
    loop {
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(d.child.id())
                && args.contains(&&b"worker"[..])
                && args
                    .windows(2)
                    .any(|w| w[0] == b"--vm" && w[1] == vm.as_bytes())
            {
                return pid;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no worker for {vm}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

const N: u32 = 4096;

fn grid() -> (Dim3, Dim3) {
    (
        Dim3 {
            x: N / 256,
            y: 1,
            z: 1,
        },
        Dim3 { x: 256, y: 1, z: 1 },
    )
}

/// Runs one vector add of `N` elements and checks every element.
fn vector_add(gpu: &mut Gpu, seed: f32) -> Result<(), GuestError> {
    let m = gpu.module_load(ImageKind::Ptx, PTX.as_bytes())?;
    let f = gpu.get_function(m, "vector_add")?;
    let a: Vec<f32> = (0..N).map(|i| i as f32 + seed).collect();
    let b: Vec<f32> = (0..N).map(|i| 2.0 * i as f32).collect();
    let bytes = u64::from(N) * 4;
    let (da, db, dc) = (
        gpu.mem_alloc(bytes)?,
        gpu.mem_alloc(bytes)?,
        gpu.mem_alloc(bytes)?,
    );
    gpu.memcpy_htod(da, &f32_bytes(&a))?;
    gpu.memcpy_htod(db, &f32_bytes(&b))?;
    let (g, blk) = grid();
    gpu.launch(
        &f,
        g,
        blk,
        0,
        0,
        &[
            &da.to_le_bytes(),
            &db.to_le_bytes(),
            &dc.to_le_bytes(),
            &N.to_le_bytes(),
        ],
    )?;
    let mut out = vec![0u8; bytes as usize];
    gpu.memcpy_dtoh(&mut out, dc, 0)?;
    let c = bytes_f32(&out);
    for i in 0..N as usize {
        assert_eq!(c[i], a[i] + b[i], "element {i}");
    }
    for p in [da, db, dc] {
        gpu.mem_free(p)?;
    }
    gpu.module_unload(m)?;
    Ok(())
}

fn open(sock: &Path) -> Gpu {
    Gpu::connect_with(sock, TEST_SPIN).expect("guest attaches")
}

#[test]
fn poisoned_or_killed_worker_is_replaced_and_only_its_guests_see_it() {
    let d = start();
    let (vm1, vm2) = (d.dir.join("vm1.sock"), d.dir.join("vm2.sock"));

    // The other tenant: vector adds, checked element by element, all along.
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let other = {
        let (stop, rounds, sock) = (stop.clone(), rounds.clone(), vm2.clone());
        std::thread::spawn(move || {
            let mut gpu = open(&sock);
            let mut seed = 0.0;
            while !stop.load(Ordering::Relaxed) {
                vector_add(&mut gpu, seed).expect("the other VM's guest never sees an error");
                seed += 1.0;
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    // 1. A kernel fault. A bystander process of the same VM holds memory.
    let mut bystander = open(&vm1);
    let held = bystander.mem_alloc(1 << 20).unwrap();
    let mut bad = open(&vm1);
    let m = bad.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
    let f = bad.get_function(m, "vector_add").unwrap();
    let own = bad.mem_alloc(u64::from(N) * 4).unwrap();
    let (g, blk) = grid();
    let wild = 0x10u64; // no allocation of anybody's: the kernel faults
    bad.launch(
        &f,
        g,
        blk,
        0,
        0,
        &[
            &wild.to_le_bytes(),
            &own.to_le_bytes(),
            &own.to_le_bytes(),
            &N.to_le_bytes(),
        ],
    )
    .unwrap();
    assert!(matches!(
        bad.synchronize(),
        Err(GuestError::Cuda(Status::IllegalAddress))
    ));
    wait_restarts(&d, "vm1", 1);
    // Everything vm1's guests held is gone; they are told so, and recover.
    assert!(matches!(bad.mem_alloc(16), Err(GuestError::VgpuReset)));
    assert!(matches!(
        bystander.memcpy_htod(held, &[1; 16]),
        Err(GuestError::VgpuReset)
    ));
    drop((bad, bystander));
    let mut again = open(&vm1);
    vector_add(&mut again, 7.0).expect("vm1 works again after the restart");
    let events = status(&d)["events"].to_string();
    assert!(events.contains("poisoned"), "{events}");

    // 2. The worker is killed outright while a guest holds memory.
    let held = again.mem_alloc(1 << 20).unwrap();
    let pid = worker_pid(&d, "vm1");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_restarts(&d, "vm1", 2);
    assert!(matches!(again.mem_free(held), Err(GuestError::VgpuReset)));
    drop(again);
    let mut fresh = open(&vm1);
    vector_add(&mut fresh, 9.0).expect("vm1 works again after the kill");
    drop(fresh);

    // The other tenant never stopped, never erred, and was never restarted.
    let before = rounds.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    assert!(rounds.load(Ordering::Relaxed) > before, "vm2 stalled");
    stop.store(true, Ordering::Relaxed);
    other.join().expect("vm2's guest passed every check");
    let st = status(&d);
    assert_eq!(vgpu(&st, "vm2")["worker_restarts"], 0);
    // Nothing of vm1's guests stays allocated.
    let t = Instant::now();
    while vgpu(&status(&d), "vm1")["memory_used_bytes"].as_u64() != Some(0) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "vm1 memory not freed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
