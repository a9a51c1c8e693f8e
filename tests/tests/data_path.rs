//! Guest client -> ring -> worker -> sim executor, end to end.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use guest::{Gpu, GuestError};
use protocol::{Dim3, ImageKind, Status};
use tests::{bytes_f32, f32_bytes, Host, PTX};

const BLOCK: Dim3 = Dim3 { x: 256, y: 1, z: 1 };
const ONE: Dim3 = Dim3 { x: 1, y: 1, z: 1 };

fn grid(n: u32) -> Dim3 {
    Dim3 {
        x: n.div_ceil(256),
        y: 1,
        z: 1,
    }
}

fn vector_add(gpu: &mut Gpu, n: u32, seed: f32) {
    let a: Vec<f32> = (0..n).map(|i| i as f32 * seed).collect();
    let b: Vec<f32> = (0..n).map(|i| (n - i) as f32 + seed).collect();
    let size = u64::from(n) * 4;
    let (da, db, dc) = (
        gpu.mem_alloc(size).unwrap(),
        gpu.mem_alloc(size).unwrap(),
        gpu.mem_alloc(size).unwrap(),
    );
    gpu.memcpy_htod(da, &f32_bytes(&a)).unwrap();
    gpu.memcpy_htod(db, &f32_bytes(&b)).unwrap();
    let m = gpu.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
    let f = gpu.get_function(m, "vector_add").unwrap();
    assert_eq!(f.param_sizes, vec![8, 8, 8, 4]);
    gpu.launch(
        &f,
        grid(n),
        BLOCK,
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
    let mut out = vec![0u8; size as usize];
    gpu.memcpy_dtoh(&mut out, dc, 0).unwrap();
    let c = bytes_f32(&out);
    for i in 0..n as usize {
        assert_eq!(c[i], a[i] + b[i], "element {i}");
    }
    for p in [da, db, dc] {
        gpu.mem_free(p).unwrap();
    }
    gpu.module_unload(m).unwrap();
}

#[test]
fn vector_add_and_saxpy_are_exact() {
    let host = Host::start("kernels", 256 << 20);
    let mut gpu = host.guest();
    vector_add(&mut gpu, 100_003, 0.5);

    let n: u32 = 65_537;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.001).collect();
    let y: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let (dx, dy) = (
        gpu.mem_alloc(u64::from(n) * 4).unwrap(),
        gpu.mem_alloc(u64::from(n) * 4).unwrap(),
    );
    gpu.memcpy_htod(dx, &f32_bytes(&x)).unwrap();
    gpu.memcpy_htod(dy, &f32_bytes(&y)).unwrap();
    let m = gpu.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
    let f = gpu.get_function(m, "saxpy").unwrap();
    let alpha = 2.5f32;
    let s = gpu.stream_create(0, 0).unwrap();
    let (e0, e1) = (gpu.event_create(0).unwrap(), gpu.event_create(0).unwrap());
    gpu.event_record(e0, s).unwrap();
    gpu.launch(
        &f,
        grid(n),
        BLOCK,
        0,
        s,
        &[
            &alpha.to_le_bytes(),
            &dx.to_le_bytes(),
            &dy.to_le_bytes(),
            &n.to_le_bytes(),
        ],
    )
    .unwrap();
    gpu.event_record(e1, s).unwrap();
    gpu.stream_synchronize(s).unwrap();
    assert!(gpu.event_query(e1).unwrap());
    assert!(gpu.event_elapsed_ms(e0, e1).unwrap() >= 0.0);
    let mut out = vec![0u8; n as usize * 4];
    gpu.memcpy_dtoh(&mut out, dy, s).unwrap();
    let r = bytes_f32(&out);
    for i in 0..n as usize {
        assert_eq!(r[i], alpha.mul_add(x[i], y[i]), "element {i}");
    }
    // memset and device-to-device copy
    gpu.memset_async(dx, 0x3f80_0000, 4, u64::from(n), 0)
        .unwrap(); // 1.0f32
    gpu.memcpy_dtod_async(dy, dx, u64::from(n) * 4, 0).unwrap();
    gpu.memcpy_dtoh(&mut out, dy, 0).unwrap();
    assert!(bytes_f32(&out).iter().all(|&v| v == 1.0));
    gpu.stream_destroy(s).unwrap();
}

#[test]
fn copies_of_256_mib_are_byte_exact_both_ways() {
    let host = Host::start("bigcopy", 1 << 30);
    let mut gpu = host.guest();
    let size = 256usize << 20;
    let data: Vec<u8> = (0..size as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let p = gpu.mem_alloc(size as u64).unwrap();
    // Copied by the calling thread alone, then split with the helper thread
    // (whichever this machine defaults to, both ways run here).
    for threads in [1, 2] {
        gpu.set_copy_threads(threads);
        let (splits_before, _) = gpu.copy_split_counts();
        gpu.memcpy_htod(p, &data).unwrap();
        let mut back = vec![0u8; size];
        gpu.memcpy_dtoh(&mut back, p, 0).unwrap();
        assert!(
            back == data,
            "256 MiB round trip by {threads} thread(s) differs"
        );
        // An unaligned window inside it.
        let mut part = vec![0u8; 3_000_001];
        gpu.memcpy_dtoh(&mut part, p + 12_345, 0).unwrap();
        assert_eq!(&part[..], &data[12_345..12_345 + 3_000_001]);
        let (splits, helped) = gpu.copy_split_counts();
        if threads == 1 {
            assert_eq!(splits, splits_before, "one thread splits nothing");
        } else {
            // Every chunk of 256 KiB or more was split: 256 MiB each way.
            assert!(splits - splits_before >= 2 * 256, "{splits} splits");
            assert!(helped <= splits);
        }
    }
}

#[test]
fn memory_limit_gives_out_of_memory_and_is_released() {
    let host = Host::start("limit", 64 << 20);
    let mut gpu = host.guest();
    assert_eq!(gpu.mem_get_info().unwrap(), (64 << 20, 64 << 20));
    let a = gpu.mem_alloc(40 << 20).unwrap();
    assert!(matches!(
        gpu.mem_alloc(40 << 20),
        Err(GuestError::Cuda(Status::OutOfMemory))
    ));
    // The limit is per vGPU, across its guest processes.
    let mut other = host.guest();
    assert!(matches!(
        other.mem_alloc(30 << 20),
        Err(GuestError::Cuda(Status::OutOfMemory))
    ));
    gpu.mem_free(a).unwrap();
    let b = other.mem_alloc(60 << 20).unwrap();
    other.mem_free(b).unwrap();
    assert_eq!(host.stats().mem_used.load(Ordering::Relaxed), 0);
}

#[test]
fn forged_pointers_and_handles_are_refused() {
    let host = Host::start("forged", 64 << 20);
    let mut victim = host.guest();
    let secret = victim.mem_alloc(4096).unwrap();
    victim.memcpy_htod(secret, &[0x5a; 4096]).unwrap();

    let mut bad = host.guest();
    let own = bad.mem_alloc(4096).unwrap();
    let mut buf = vec![0u8; 4096];
    // Another process's pointer, a wild pointer, a range crossing the end.
    for (ptr, len) in [
        (secret, 4096usize),
        (0xdead_beef_0000, 16),
        (own + 4000, 200),
    ] {
        let e = bad.memcpy_dtoh(&mut buf[..len], ptr, 0).unwrap_err();
        assert!(matches!(e, GuestError::Cuda(Status::InvalidValue)), "{e}");
    }
    // Asynchronous misuse is reported at the next synchronizing call.
    bad.memcpy_htod_async(secret, &[1; 16], 0).unwrap();
    assert!(matches!(
        bad.synchronize(),
        Err(GuestError::Cuda(Status::InvalidValue))
    ));
    assert!(matches!(
        bad.mem_free(secret),
        Err(GuestError::Cuda(Status::InvalidValue))
    ));
    assert!(matches!(
        bad.mem_free(own + 8),
        Err(GuestError::Cuda(Status::InvalidValue))
    ));
    assert!(matches!(
        bad.stream_synchronize(12345),
        Err(GuestError::Cuda(Status::InvalidHandle))
    ));
    assert!(matches!(
        bad.module_unload(777),
        Err(GuestError::Cuda(Status::InvalidHandle))
    ));
    // (A kernel given a pointer it does not own faults and poisons the
    // worker: tests/tests/recovery.rs.)
    let m = bad.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
    let f = bad.get_function(m, "vector_add").unwrap();
    let n = 16u32;
    // Wrong parameter size (bypassing the client's own check).
    bad.launch_raw(f.handle, grid(n), BLOCK, 0, &[0u8; 12])
        .unwrap();
    assert!(matches!(
        bad.synchronize(),
        Err(GuestError::Cuda(Status::InvalidValue))
    ));
    // Use after free and double free.
    bad.mem_free(own).unwrap();
    assert!(bad.memcpy_dtoh(&mut buf[..8], own, 0).is_err());
    assert!(matches!(
        bad.mem_free(own),
        Err(GuestError::Cuda(Status::InvalidValue))
    ));
    // Garbage PTX.
    assert!(matches!(
        bad.module_load(ImageKind::Ptx, b"this is not ptx"),
        Err(GuestError::Cuda(Status::InvalidPtx))
    ));

    // The victim's memory was never touched.
    victim.memcpy_dtoh(&mut buf, secret, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0x5a));
    assert!(host.stats().refused.load(Ordering::Relaxed) >= 8);
}

#[test]
fn killed_guest_is_cleaned_up_and_others_continue() {
    let host = Host::start("kill", 512 << 20);
    let mut good = host.guest();
    vector_add(&mut good, 10_000, 1.0);

    let mut child = Command::new(env!("CARGO_BIN_EXE_test-guest"))
        .arg(&host.socket)
        .arg("100")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    assert_eq!(host.stats().mem_used.load(Ordering::Relaxed), 100 << 20);

    // Kill it mid-stream (it is enqueueing copies in a loop).
    child.kill().unwrap();
    child.wait().unwrap();
    // The worker frees the memory, then returns the channel: wait for both.
    host.wait_until(
        "the killed guest's memory and channel to be freed",
        Duration::from_secs(20),
        |s| s.mem_used.load(Ordering::Relaxed) == 0 && s.reclaimed.load(Ordering::Relaxed) >= 1,
    );

    // The good guest is undisturbed, and the freed channel is usable again.
    vector_add(&mut good, 10_000, 2.0);
    let mut again = host.guest();
    vector_add(&mut again, 1_000, 3.0);
}

/// Launches the worker finds queued behind one another are submitted as one
/// run (`worker::session::LaunchRun`; on a GPU one graph launch) and
/// keep the guest's order: on one stream, across two streams, and around
/// copies and memsets.
#[test]
fn queued_launches_run_together_in_the_guests_order() {
    let host = Host::start("runs", 64 << 20);
    let mut gpu = host.guest();
    let m = gpu.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
    let saxpy = gpu.get_function(m, "saxpy").unwrap();
    let n: u32 = 1024;
    let size = u64::from(n) * 4;
    // Two pairs (x, y), one per stream, and their values on the CPU.
    let (s1, s2) = (
        gpu.stream_create(0, 0).unwrap(),
        gpu.stream_create(0, 0).unwrap(),
    );
    let mut cpu: Vec<[Vec<f32>; 2]> = Vec::new();
    let mut dev: Vec<[u64; 2]> = Vec::new();
    for p in 0..2u32 {
        let x: Vec<f32> = (0..n).map(|i| ((i + p) % 7) as f32 + 1.0).collect();
        let y: Vec<f32> = (0..n).map(|i| ((i * 3 + p) % 5) as f32).collect();
        let (dx, dy) = (gpu.mem_alloc(size).unwrap(), gpu.mem_alloc(size).unwrap());
        gpu.memcpy_htod(dx, &f32_bytes(&x)).unwrap();
        gpu.memcpy_htod(dy, &f32_bytes(&y)).unwrap();
        cpu.push([x, y]);
        dev.push([dx, dy]);
    }
    let scratch = gpu.mem_alloc(size).unwrap();

    // A second guest holds the worker in a 300 ms synchronize while this
    // one queues 40 launches: when the worker comes back they wait in the
    // ring, one behind the other.
    let socket = host.socket.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let blocker = std::thread::spawn(move || {
        let mut b = Gpu::connect_with(&socket, tests::TEST_SPIN).unwrap();
        let m = b.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
        let spin = b.get_function(m, "spin_ns").unwrap();
        b.launch(&spin, ONE, ONE, 0, 0, &[&300_000_000u64.to_le_bytes()])
            .unwrap();
        tx.send(()).unwrap();
        b.synchronize().unwrap();
    });
    rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let before = host.stats().batched_launches.load(Ordering::Relaxed);

    // Per pair, its k-th operation is y += x (k even) or x -= y (k odd):
    // the order matters, and the values stay small integers (exact in f32).
    let mut ops = [0u32; 2];
    let mut step = |gpu: &mut Gpu, cpu: &mut Vec<[Vec<f32>; 2]>, p: usize| {
        let k = ops[p];
        ops[p] += 1;
        let (a, src, dst) = if k % 2 == 0 {
            (1.0f32, 0, 1)
        } else {
            (-1.0f32, 1, 0)
        };
        let stream = if p == 0 { s1 } else { s2 };
        gpu.launch(
            &saxpy,
            grid(n),
            BLOCK,
            0,
            stream,
            &[
                &a.to_le_bytes(),
                &dev[p][src].to_le_bytes(),
                &dev[p][dst].to_le_bytes(),
                &n.to_le_bytes(),
            ],
        )
        .unwrap();
        let s = cpu[p][src].clone();
        for (d, s) in cpu[p][dst].iter_mut().zip(s) {
            *d = a.mul_add(s, *d);
        }
    };
    for _ in 0..40 {
        step(&mut gpu, &mut cpu, 0);
    }
    gpu.stream_synchronize(s1).unwrap();
    blocker.join().unwrap();
    let batched = host.stats().batched_launches.load(Ordering::Relaxed) - before;
    assert!(
        batched >= 2,
        "no launches were submitted together ({batched})"
    );

    // Then a mix: both streams, memsets and synchronous copies in between.
    for i in 0..600u32 {
        step(&mut gpu, &mut cpu, usize::from(i % 3 == 2));
        if i % 41 == 0 {
            gpu.memset_async(scratch, i, 4, u64::from(n), s1).unwrap();
        }
        if i % 97 == 0 {
            let mut out = vec![0u8; size as usize];
            gpu.memcpy_dtoh(&mut out, dev[0][1], s1).unwrap();
            assert_eq!(bytes_f32(&out), cpu[0][1], "pair 0's y after step {i}");
        }
    }
    gpu.synchronize().unwrap();
    for p in 0..2 {
        for v in 0..2 {
            let mut out = vec![0u8; size as usize];
            gpu.memcpy_dtoh(&mut out, dev[p][v], 0).unwrap();
            assert_eq!(bytes_f32(&out), cpu[p][v], "pair {p}, buffer {v}");
        }
    }
    let mut out = vec![0u8; size as usize];
    gpu.memcpy_dtoh(&mut out, scratch, 0).unwrap();
    assert!(out
        .chunks(4)
        .all(|c| u32::from_le_bytes(c.try_into().unwrap()) == 574));
}
