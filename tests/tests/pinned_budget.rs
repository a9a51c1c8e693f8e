//! The pinned pool is one budget for a VM's workers (`worker/src/serve/pinned.rs`), against a
//! real `fairvgpu serve` on the sim: in a VM with four process slots one process takes more
//! than a quarter of the pool (through `Gpu::pinned_alloc`, and through the stand-in's
//! `cuMemAllocHost` in `tests/c/faults.c`'s `pinned`); two processes allocating at once get disjoint blocks whose bytes stay
//! their own and reach the device (the sim refuses DMA with a block its worker did not
//! register); neither reaches the other's blocks; a process's blocks come back when it ends,
//! and a killed worker's when the daemon replaces it.

use std::time::{Duration, Instant};
use tests::worker_pids;

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use guest::{Gpu, GuestError};
use protocol::Status;
use tests::cargo_build;

fn vm_with_slots(tag: &str) -> DaemonProc {
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 4;
    DaemonProc::start(
        &cargo_build("cli").join("fairvgpu"),
        tag,
        ExecutorKind::Sim,
        &[vm],
    )
    .unwrap()
}

fn connect(d: &DaemonProc) -> Gpu {
    Gpu::connect_with(&d.socket("vm1"), tests::TEST_SPIN).unwrap()
}

/// Fills `[off, off + len)` of the pool, as the guest maps it, with `byte`.
fn fill(g: &Gpu, off: u64, len: u64, byte: u8) {
    let pool = g.region().pinned().unwrap();
    let s = pool.subslice(off as usize, len as usize).unwrap();
    s.copy_from(&vec![byte; len as usize]);
}

/// `[off, off + len)` of the pool, as the guest maps it.
fn read(g: &Gpu, off: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0; len as usize];
    let pool = g.region().pinned().unwrap();
    pool.subslice(off as usize, len as usize)
        .unwrap()
        .copy_to(&mut v[..]);
    v
}

/// Retries `f` until it gives `Ok` (what a process ending gives back is
/// freed once its worker sees it leave).
fn eventually<T>(what: &str, mut f: impl FnMut() -> Result<T, GuestError>) -> T {
    let t = Instant::now();
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if t.elapsed() > Duration::from_secs(20) => panic!("{what}: {e:?}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One process's blocks: `count` of sizes from 4 KiB to 1 MiB, each filled
/// with `byte`, sent to the device from the pool and read back.
fn allocate_and_check(d: &DaemonProc, byte: u8, count: u64) -> (Gpu, Vec<(u64, u64)>) {
    let mut g = connect(d);
    let dev = g.mem_alloc(1 << 20).unwrap();
    let mut blocks = Vec::new();
    for i in 0..count {
        let len = (4096 << (i % 9)).min(1 << 20);
        let off = g.pinned_alloc(len).unwrap();
        fill(&g, off, len, byte);
        g.memcpy_htod_pinned(dev, off, len, 0).unwrap();
        let mut back = vec![0; len as usize];
        g.memcpy_dtoh(&mut back, dev, 0).unwrap();
        assert!(
            back.iter().all(|&b| b == byte),
            "block {i} of {byte:#x} on the device"
        );
        blocks.push((off, len));
    }
    (g, blocks)
}

#[test]
fn a_process_takes_any_part_of_the_pool_and_two_never_share_a_page() {
    let d = vm_with_slots("pinned-budget");
    let mut a = connect(&d);
    let size = a.device_info().pinned_size;
    assert!(size >= 64 << 20, "{size}");
    // Three quarters of the pool, where a slot's share was a quarter.
    let big = a.pinned_alloc(size / 4 * 3).unwrap();
    let mut b = connect(&d);
    assert!(
        matches!(
            b.pinned_alloc(size / 2),
            Err(GuestError::Cuda(Status::OutOfMemory))
        ),
        "a quarter is left"
    );
    let small = b.pinned_alloc(size / 8).unwrap();
    assert!(
        small >= big + size / 4 * 3 || small + size / 8 <= big,
        "overlap"
    );

    // Neither process reaches the other's block: a copy, a free or a memset
    // through its device address is refused by its own worker.
    let dev = b.mem_alloc(4096).unwrap();
    b.memcpy_dtoh_pinned(dev, big, 4096, 0).unwrap();
    let e = b.synchronize().unwrap_err();
    assert!(matches!(e, GuestError::Cuda(Status::InvalidValue)), "{e:?}");
    b.memcpy_htod_pinned(dev, big, 4096, 0).unwrap();
    assert!(b.synchronize().is_err());
    let base = b.device_info().pinned_base;
    b.memset_async(base + big, 0x5a, 1, 16, 0).unwrap();
    assert!(b.synchronize().is_err());
    assert!(b.pinned_free(big).is_err());
    assert!(a.pinned_free(small).is_err());
    a.pinned_free(big).unwrap();
    b.pinned_free(small).unwrap();
    drop((a, b));

    // Two processes at once, in their own slots: disjoint blocks, each
    // holding its own bytes to the end.
    let (ra, rb) = std::thread::scope(|s| {
        let ta = s.spawn(|| allocate_and_check(&d, 0xa1, 60));
        let tb = s.spawn(|| allocate_and_check(&d, 0xb2, 60));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    let mut all: Vec<(u64, u64, u8)> = Vec::new();
    for ((g, blocks), byte) in [(&ra, 0xa1u8), (&rb, 0xb2)] {
        for &(off, len) in blocks {
            assert!(read(g, off, len).iter().all(|&x| x == byte), "overwritten");
            all.push((off, len, byte));
        }
    }
    all.sort_unstable();
    for w in all.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "two blocks share a page: {w:?}");
    }

    // A process that ends gives its blocks back: the other may then take
    // the whole pool.
    let ((mut a, _), (b, b_blocks)) = (ra, rb);
    for &(off, _) in &b_blocks {
        assert!(a.pinned_free(off).is_err(), "another process's block");
    }
    drop((a, b));
    let mut c = connect(&d);
    let whole = eventually("the whole pool after both ended", || c.pinned_alloc(size));
    assert_eq!(whole, 0);
}

/// A worker killed while its process holds most of the pool leaks none of
/// it: the daemon frees what it held once it is gone (a slot's worker is
/// not restarted; the next process gets a new one).
#[test]
fn a_killed_workers_pinned_memory_is_freed_by_its_successor() {
    let d = vm_with_slots("pinned-killed");
    let mut a = connect(&d);
    let size = a.device_info().pinned_size;
    a.pinned_alloc(size / 4 * 3).unwrap();
    // The process's worker, and the GPU's spare.
    let before = worker_pids(&d);
    assert!(!before.is_empty(), "no worker");
    for &pid in &before {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    }
    drop(a);
    let mut c = connect(&d);
    assert_eq!(
        eventually("the whole pool after the worker was killed", || c
            .pinned_alloc(size)),
        0
    );
}

/// Through the stand-in, as a program asks (`cuMemAllocHost`, what
/// `cudaMallocHost` calls): in a VM with four slots one process holds more
/// than a quarter of the pool and another most of the rest at once, each
/// copying through its block; a third, finding too little left, gets
/// memory of its own, which copies as well but the device does not map,
/// and so does a registration of a program's own buffer.
#[test]
fn programs_in_a_vm_with_slots_share_the_pool_as_they_ask() {
    use tests::faults::{text, Rig};
    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 4;
    let r = Rig::start("pinned-programs", vm);
    let size = Gpu::connect_with(&r.sock, tests::TEST_SPIN)
        .unwrap()
        .device_info()
        .pinned_size;
    let mib = |n: u64| (n >> 20).to_string();
    let (mut first, line) = r.started("pinned", &[&mib(size / 8 * 5), "3"]);
    let at = line
        .trim()
        .strip_prefix("pinned: OK at ")
        .unwrap_or_else(|| panic!("more than a quarter of the pool: {line:?}"))
        .to_owned();
    let (mut second, line) = r.started("pinned", &[&mib(size / 4), "3"]);
    assert!(
        line.starts_with("pinned: OK"),
        "most of the rest, at once: {line:?}"
    );
    assert!(!line.contains("not device-mapped"), "{line}");
    let out = r.run("pinned", &[&mib(size / 4), "0"]);
    let third = text(&out.stdout);
    assert!(
        out.status.success()
            && third.trim().starts_with("pinned: OK at ")
            && third.trim().ends_with("(not device-mapped)"),
        "an eighth is left: {third:?} {}",
        text(&out.stderr)
    );
    // And a program's own buffer registered then: its pages stay its own.
    let out = r.run("register", &[&mib(size / 4)]);
    assert_eq!(
        text(&out.stdout).trim(),
        "register: OK (not device-mapped)",
        "{}",
        text(&out.stderr)
    );
    // A kernel of another process reads the first one's block by its
    // address: its worker never registered it, so the device does not
    // reach it (the sim faults as a GPU does).
    let kernels = tests::workspace().join("worker/kernels/fairvgpu.ptx");
    let seen = text(&r.run("peek", &[&at, kernels.to_str().unwrap()]).stdout);
    assert!(
        seen.starts_with("peek: CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{seen}"
    );
    assert!(first.wait().unwrap().success());
    assert!(second.wait().unwrap().success());
    // Given back once their workers see them leave (within moments).
    let t = Instant::now();
    loop {
        let after = text(&r.run("pinned", &[&mib(size / 4 * 3), "0"]).stdout);
        if after.starts_with("pinned: OK") && !after.contains("not device-mapped") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "never given back: {after}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
