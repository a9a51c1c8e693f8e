//! A guest program for the tests: attaches to SOCKET (or a /dev/fairvgpuN), allocates MIB MiB, fills
//! it, prints "ready", then keeps streaming copies into it until killed.

use anyhow::{Context, Result};
use guest::Gpu;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let sock = args.next().context("usage: test-guest SOCKET MIB")?;
    let mib: u64 = args
        .next()
        .context("usage: test-guest SOCKET MIB")?
        .parse()?;
    let mut gpu = Gpu::open(sock.as_ref(), tests::TEST_SPIN)?;
    let size = mib << 20;
    let p = gpu.mem_alloc(size)?;
    let chunk = vec![0xa5u8; 8 << 20];
    for off in (0..size).step_by(chunk.len()) {
        gpu.memcpy_htod(p + off, &chunk[..chunk.len().min((size - off) as usize)])?;
    }
    println!("ready");
    loop {
        gpu.memcpy_htod_async(p, &chunk, 0)?;
    }
}
