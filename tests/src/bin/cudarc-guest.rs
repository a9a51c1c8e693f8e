//! A Rust CUDA program written against `cudarc`'s safe API, unaware of
//! fairvgpu. Run it with the real driver, or with the stand-in first on the
//! library path, and compare.
//!
//! usage: cudarc-guest KERNELS.ptx

use anyhow::{ensure, Context, Result};
use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

fn main() -> Result<()> {
    let path = std::env::args()
        .nth(1)
        .context("usage: cudarc-guest KERNELS.ptx")?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    let module = ctx.load_module(Ptx::from_src(std::fs::read_to_string(&path)?))?;
    let add = module.load_function("vector_add")?;
    let saxpy = module.load_function("saxpy")?;

    let n: u32 = 1 << 20;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let b: Vec<f32> = (0..n).map(|i| (n - i) as f32).collect();
    let da = stream.clone_htod(&a)?;
    let db = stream.clone_htod(&b)?;
    let mut dc = stream.alloc_zeros::<f32>(n as usize)?;
    let cfg = LaunchConfig::for_num_elems(n);
    let mut l = stream.launch_builder(&add);
    l.arg(&da).arg(&db).arg(&mut dc).arg(&n);
    // SAFETY: vector_add(const float*, const float*, float*, unsigned) with n elements each.
    unsafe { l.launch(cfg) }?;
    let c = stream.clone_dtoh(&dc)?;
    let wrong = (0..n as usize).filter(|&i| c[i] != a[i] + b[i]).count();
    ensure!(wrong == 0, "vector_add: {wrong} wrong elements");
    println!("cudarc vector_add: {n} elements correct");

    let alpha = 1.5f32;
    let mut dy = stream.clone_htod(&b)?;
    let mut l = stream.launch_builder(&saxpy);
    l.arg(&alpha).arg(&da).arg(&mut dy).arg(&n);
    // SAFETY: saxpy(float, const float*, float*, unsigned) with n elements each.
    unsafe { l.launch(cfg) }?;
    let y = stream.clone_dtoh(&dy)?;
    let wrong = (0..n as usize)
        .filter(|&i| y[i] != alpha.mul_add(a[i], b[i]))
        .count();
    ensure!(wrong == 0, "saxpy: {wrong} wrong elements");
    println!("cudarc saxpy: {n} elements correct");
    stream.synchronize()?;
    println!("cudarc-guest: all checks passed");
    Ok(())
}
