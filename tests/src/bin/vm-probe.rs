//! Checks that only make sense inside a VM with the kernel module loaded.
//!
//! usage:
//!   vm-probe block CALLS     synchronizing calls that wait on the (simulated)
//!                            GPU, with a tiny spin budget: they must block in
//!                            the module and be woken by the host's doorbell
//!                            interrupt (both counted by the module)
//!   vm-probe memfree SECS    waits until all of this vGPU's memory is free
//!                            again (after a killed process's channel was
//!                            given back), or fails after SECS
//!   vm-probe info            prints the module's counters
//!   vm-probe loop US SECS    a kernel of US microseconds launched and
//!                            synchronized again and again for SECS, with
//!                            the default spin budget (a tenant's loop, as
//!                            `bench fairness` runs it on the host); every
//!                            250 ms a line `FVG-LOOP <count so far>`, for
//!                            the host to time (scripts/vm-fairness.py)
//!   vm-probe compute ROUNDS  adds ones to a vector on the device round
//!                            after round, 200 ms apart, and checks every
//!                            element after each (after round r, a[i] =
//!                            i + r): a program whose vGPU a checkpoint or
//!                            a migration moves mid-loop; a line
//!                            `FVG-ROUND r` after each, then
//!                            `FVG-COMPUTE ok rounds=R sum=S`

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use guest::device::default_device;
use guest::Gpu;
use protocol::{Dim3, ImageKind};
use transport::SpinPolicy;
use worker::KERNELS_PTX;

fn open(spins: u32) -> Result<Gpu> {
    let dev = default_device().context("no /dev/fairvgpu0: module not loaded or no vGPU")?;
    let policy = SpinPolicy {
        spins,
        max_block_us: 1_000_000,
    };
    Ok(Gpu::open_device(&dev, policy)?)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args
        .next()
        .context("usage: vm-probe block|memfree|info|loop|compute [N [SECS|WAITERS]]")?;
    let n: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(100);
    let second: Option<u64> = args.next().map(|a| a.parse()).transpose()?;
    let secs = second.unwrap_or(10);
    match cmd.as_str() {
        "block" => {
            // One spin, and a reply that waits for a 5 ms kernel: a wait must
            // block in the module, unless the guest was descheduled for the
            // kernel's whole run (a loaded host): allow a fifth of those. The
            // second argument: how many processes wait on the device at
            // once (two_at_once: 2).
            let waiters = second.unwrap_or(1).max(1);
            let mut gpu = open(1)?;
            let m = gpu.module_load(ImageKind::Ptx, KERNELS_PTX.as_bytes())?;
            let spin = gpu.get_function(m, "spin_ns")?;
            let one = Dim3 { x: 1, y: 1, z: 1 };
            let ns = 5_000_000u64.to_le_bytes();
            let before = gpu.device_counters().context("counters")?;
            let t = Instant::now();
            for _ in 0..n {
                gpu.launch(&spin, one, one, 0, 0, &[&ns])?;
                gpu.synchronize()?;
            }
            let after = gpu.device_counters().context("counters")?;
            let (irqs, wakeups) = (
                after.interrupts - before.interrupts,
                after.wakeups - before.wakeups,
            );
            println!(
                "block: {n} synchronizations in {:?}, {irqs} interrupts, {wakeups} wake-ups",
                t.elapsed()
            );
            ensure!(after.vectors > 0, "the device has no MSI-X vectors");
            ensure!(
                wakeups >= n - n / 5,
                "only {wakeups} of {n} synchronizations blocked and were woken"
            );
            // The counters are the device's, read one after the other: an
            // interrupt of another process waiting at once (two_at_once)
            // counted before this one's first read, its wake-up after, makes
            // one wake-up more than interrupts between the reads. And a
            // process waits on the vector of the vCPU it runs on: two on one
            // vCPU share it, and one interrupt wakes both. A wake-up with no
            // interrupt at all (a wait that does not block) is what fails.
            ensure!(
                irqs * waiters + 1 >= wakeups,
                "{wakeups} wake-ups but only {irqs} interrupts ({waiters} waiting at once)"
            );
            println!("block: ok");
        }
        "memfree" => {
            let deadline = Instant::now() + Duration::from_secs(n);
            let mut gpu = open(10_000)?;
            loop {
                let (free, total) = gpu.mem_get_info()?;
                if free == total {
                    println!("memfree: all {total} bytes free");
                    break;
                }
                if Instant::now() > deadline {
                    bail!("memfree: {} bytes still held", total - free);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        "info" => {
            let dev = default_device().context("no /dev/fairvgpu0")?;
            let d = guest::device::Device::open(&dev)?;
            println!("{:?}", d.info()?);
        }
        "loop" => {
            let mut gpu = open(SpinPolicy::default().spins)?;
            let m = gpu.module_load(ImageKind::Ptx, KERNELS_PTX.as_bytes())?;
            let spin = gpu.get_function(m, "spin_ns")?;
            let one = Dim3 { x: 1, y: 1, z: 1 };
            let ns = (n * 1000).to_le_bytes();
            let start = Instant::now();
            let end = start + Duration::from_secs(secs);
            let mut next = start;
            let mut count = 0u64;
            while Instant::now() < end {
                gpu.launch(&spin, one, one, 0, 0, &[&ns])?;
                gpu.synchronize()?;
                count += 1;
                if Instant::now() >= next {
                    println!("FVG-LOOP {count}");
                    next += Duration::from_millis(250);
                }
            }
            println!("FVG-LOOP {count}");
        }
        "compute" => compute(n)?,
        other => bail!("unknown command {other}"),
    }
    Ok(())
}

/// `vm-probe compute ROUNDS` (see the usage above).
fn compute(rounds: u64) -> Result<()> {
    // 2 MiB of device memory in all: more than a 1 MiB limit.
    const N: usize = 256 << 10;
    let mut gpu = open(SpinPolicy::default().spins)?;
    let m = gpu.module_load(ImageKind::Ptx, KERNELS_PTX.as_bytes())?;
    let add = gpu.get_function(m, "vector_add")?;
    let len = (N * 4) as u64;
    let (a, b) = (gpu.mem_alloc(len)?, gpu.mem_alloc(len)?);
    let start: Vec<u8> = (0..N).flat_map(|i| (i as f32).to_le_bytes()).collect();
    gpu.memcpy_htod(a, &start)?;
    gpu.memcpy_htod(b, &1.0f32.to_le_bytes().repeat(N))?;
    let (grid, block) = (
        Dim3 {
            x: 1024,
            y: 1,
            z: 1,
        },
        Dim3 { x: 256, y: 1, z: 1 },
    );
    let n = u32::try_from(N)?;
    let mut out = vec![0u8; N * 4];
    let mut sum = 0.0;
    for r in 1..=rounds {
        let params: [&[u8]; 4] = [
            &a.to_le_bytes(),
            &b.to_le_bytes(),
            &a.to_le_bytes(),
            &n.to_le_bytes(),
        ];
        gpu.launch(&add, grid, block, 0, 0, &params)?;
        gpu.memcpy_dtoh(&mut out, a, 0)?;
        sum = 0.0;
        for (i, c) in out.chunks_exact(4).enumerate() {
            let x = f32::from_le_bytes(c.try_into()?);
            ensure!(x == i as f32 + r as f32, "round {r}: element {i} is {x}");
            sum += f64::from(x);
        }
        println!("FVG-ROUND {r}");
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("FVG-COMPUTE ok rounds={rounds} sum={sum}");
    Ok(())
}
