//! `fairvgpu demo`: a daemon with the sim executor and a guest that runs
//! vector add and saxpy through it, checking every element.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use guest_frontend::Gpu;
use protocol::{Dim3, ImageKind};

/// The kernels every executor understands.
pub const KERNELS_PTX: &str = include_str!("../kernels/fairvgpu.ptx");

fn wait_for_socket(p: &Path, child: &mut Child) -> Result<()> {
    let start = Instant::now();
    while !p.exists() {
        if let Some(st) = child.try_wait()? {
            bail!("daemon exited early: {st}");
        }
        if start.elapsed() > Duration::from_secs(20) {
            bail!("daemon did not create {} in time", p.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Runs the demo; returns Ok only if every result checked out.
pub fn run(executor: crate::config::ExecutorKind) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("fairvgpu-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cfg_path = dir.join("host.toml");
    std::fs::write(
        &cfg_path,
        format!(
            "[daemon]\nrun_dir = {:?}\nexecutor = \"{}\"\n\n[[vm]]\nname = \"demo\"\ntenant = \"demo-tenant\"\nweight = 1\nmemory_limit_mib = 1024\n",
            dir.display().to_string(),
            match executor {
                crate::config::ExecutorKind::Sim => "sim",
                crate::config::ExecutorKind::Cuda => "cuda",
            }
        ),
    )?;
    println!("config: {}", cfg_path.display());
    let exe = std::env::current_exe()?;
    let mut daemon = Command::new(exe)
        .args(["serve", "--config"])
        .arg(&cfg_path)
        .spawn()
        .context("starting daemon")?;
    let result = guest(&dir.join("demo.sock"), &mut daemon);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = daemon.wait();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn guest(sock: &Path, daemon: &mut Child) -> Result<()> {
    wait_for_socket(sock, daemon)?;
    println!("daemon up: vGPU \"demo\" served at {}", sock.display());
    let mut gpu = Gpu::connect(sock).context("guest attach")?;
    let info = gpu.device_info().clone();
    println!(
        "guest: attached on channel {}, device {:?}, {} MiB",
        gpu.channel(),
        info.name,
        info.total_mem >> 20
    );

    let n: u32 = 1 << 20;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| (n - i) as f32 * 0.25).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let size = u64::from(n) * 4;
    let (da, db, dc) = (
        gpu.mem_alloc(size)?,
        gpu.mem_alloc(size)?,
        gpu.mem_alloc(size)?,
    );
    gpu.memcpy_htod(da, &bytes(&a))?;
    gpu.memcpy_htod(db, &bytes(&b))?;
    let module = gpu.module_load(ImageKind::Ptx, KERNELS_PTX.as_bytes())?;
    let add = gpu.get_function(module, "vector_add")?;
    let grid = Dim3 {
        x: n.div_ceil(256),
        y: 1,
        z: 1,
    };
    let block = Dim3 { x: 256, y: 1, z: 1 };
    let t = Instant::now();
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
    )?;
    gpu.synchronize()?;
    let mut out = vec![0u8; size as usize];
    gpu.memcpy_dtoh(&mut out, dc, 0)?;
    let c: Vec<f32> = out
        .chunks_exact(4)
        .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        .collect();
    let wrong = (0..n as usize).filter(|&i| c[i] != a[i] + b[i]).count();
    println!(
        "vector_add: {n} elements, {wrong} wrong, {:?} round trip",
        t.elapsed()
    );
    if wrong > 0 {
        bail!("vector_add returned {wrong} wrong elements");
    }

    let saxpy = gpu.get_function(module, "saxpy")?;
    let alpha = 3.0f32;
    gpu.launch(
        &saxpy,
        grid,
        block,
        0,
        0,
        &[
            &alpha.to_le_bytes(),
            &da.to_le_bytes(),
            &db.to_le_bytes(),
            &n.to_le_bytes(),
        ],
    )?;
    gpu.memcpy_dtoh(&mut out, db, 0)?;
    let y: Vec<f32> = out
        .chunks_exact(4)
        .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        .collect();
    let wrong = (0..n as usize)
        .filter(|&i| y[i] != alpha.mul_add(a[i], b[i]))
        .count();
    println!("saxpy: {n} elements, {wrong} wrong");
    if wrong > 0 {
        bail!("saxpy returned {wrong} wrong elements");
    }
    let (free, total) = gpu.mem_get_info()?;
    println!("memory: {} MiB of {} MiB free", free >> 20, total >> 20);
    for p in [da, db, dc] {
        gpu.mem_free(p)?;
    }
    drop(gpu);
    println!("demo: all results correct");
    Ok(())
}
