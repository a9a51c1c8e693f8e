//! IPC between the processes of a VM with process slots, each served by a
//! worker process of its own, against a real `fairvgpu serve` on the sim:
//! memory one process exports is opened by another (at an address of its
//! own worker's), and what either writes the other reads, live; the
//! memory stays counted once, to its exporter, until the last holder
//! lets go. An event one records, another waits on. VMM memory through a
//! shareable handle and a pool's allocation likewise. (The refusals of
//! hostile tokens: `hostile_ipc_across.rs`.)

use std::time::{Duration, Instant};

use protocol::{Request, VMM_GRANULARITY as G};
use tests::ipc::{daemon, guest, map, read, refused, req, vm_memory};

const MIB: u64 = 1 << 20;

#[test]
fn memory_exported_by_one_process_is_shared_live_with_another_workers_process() {
    let d = daemon("ipc-across");
    let mut a = guest(&d, "vm1");
    let mut b = guest(&d, "vm1");
    let ptr = a.mem_alloc(4 * MIB).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    a.memcpy_htod(ptr + MIB, &data).unwrap();
    let [token, base, size, _] = req(&mut a, Request::IpcExport { ptr: ptr + MIB }).unwrap();
    assert_eq!((base, size), (ptr, 4 * MIB));
    // The token is the host's, not an address or a driver's handle.
    assert_ne!(token, ptr);

    let [at, n, ..] = req(&mut b, Request::IpcOpen { token }).unwrap();
    assert_eq!(n, 4 * MIB);
    assert_eq!(
        read(&mut b, at + MIB, data.len()),
        data,
        "b reads a's bytes"
    );
    // What b writes, a reads, and the other way round: one memory.
    b.memcpy_htod(at, b"written by b").unwrap();
    assert_eq!(read(&mut a, ptr, 12), b"written by b");
    a.memcpy_htod(ptr + 100, b"then by a").unwrap();
    assert_eq!(read(&mut b, at + 100, 9), b"then by a");
    // Opened again: the same address, closed as often.
    let [again, ..] = req(&mut b, Request::IpcOpen { token }).unwrap();
    assert_eq!(again, at);
    req(&mut b, Request::IpcClose { ptr: at }).unwrap();
    assert_eq!(read(&mut b, at, 12), b"written by b", "one open left");

    // Counted once, to its exporter: the VM holds a's 4 MiB, not 8.
    let used = vm_memory(&d, |u| u >= 4 * MIB);
    assert!((4 * MIB..8 * MIB).contains(&used), "{used}");
    // a frees it while b has it open: it stays, counted, for b.
    a.mem_free(ptr).unwrap();
    assert_eq!(read(&mut b, at + MIB, data.len()), data, "kept for b");
    assert!(vm_memory(&d, |u| u >= 4 * MIB) >= 4 * MIB, "still counted");
    // Nobody opens freed memory anew, as the driver refuses its handle.
    let mut c = guest(&d, "vm1");
    refused(
        req(&mut c, Request::IpcOpen { token }),
        "freed memory's token",
    );
    req(&mut b, Request::IpcClose { ptr: at }).unwrap();
    // Once b closed it, a's worker lets it go on its next pass.
    a.synchronize().unwrap();
    let used = vm_memory(&d, |u| u < 4 * MIB);
    assert!(used < 4 * MIB, "not let go: {used}");
    refused(
        req(&mut b, Request::IpcClose { ptr: at }),
        "a close too many",
    );
    refused(
        req(&mut b, Request::IpcOpen { token }),
        "the token of freed memory",
    );
}

/// `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`.
const IPC_EVENT: u32 = 4 | 2;

#[test]
fn an_event_recorded_by_one_process_is_waited_on_by_another_workers_process() {
    let d = daemon("ipc-across-event");
    let mut a = guest(&d, "vm1");
    let mut b = guest(&d, "vm1");
    let m = a
        .module_load(protocol::ImageKind::Ptx, tests::PTX.as_bytes())
        .unwrap();
    let spin = a.get_function(m, "spin_ns").unwrap();
    let ev = a.event_create(IPC_EVENT).unwrap();
    let [token, ..] = req(&mut a, Request::IpcExportEvent { event: ev }).unwrap();
    let [theirs, ..] = req(&mut b, Request::IpcOpenEvent { token }).unwrap();
    assert!(b.event_query(theirs).unwrap(), "never recorded: done");

    // a records it behind 400 ms of work: b sees it pending, then done.
    let one = protocol::Dim3 { x: 1, y: 1, z: 1 };
    let ns: u64 = 400_000_000;
    a.launch(&spin, one, one, 0, 0, &[&ns.to_le_bytes()])
        .unwrap();
    a.event_record(ev, 0).unwrap();
    let t = Instant::now();
    // Asked of a first: its record was made (launches and records are
    // not answered).
    assert!(!a.event_query(ev).unwrap(), "pending for a");
    assert!(!b.event_query(theirs).unwrap(), "b sees a's record pending");
    b.event_synchronize(theirs).unwrap();
    assert!(b.event_query(theirs).unwrap());
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "b waited {:?}",
        t.elapsed()
    );
    // Another handle for the same event; each let go of on its own.
    let [again, ..] = req(&mut b, Request::IpcOpenEvent { token }).unwrap();
    assert_ne!(again, theirs);
    b.event_destroy(theirs).unwrap();
    assert!(b.event_query(again).unwrap());
    b.event_destroy(again).unwrap();

    // Made-up tokens, a memory token as an event's, another VM's.
    let ptr = a.mem_alloc(MIB).unwrap();
    let [mem_token, ..] = req(&mut a, Request::IpcExport { ptr }).unwrap();
    refused(
        req(&mut b, Request::IpcOpenEvent { token: mem_token }),
        "a memory token",
    );
    refused(
        req(&mut b, Request::IpcOpenEvent { token: token ^ 1 }),
        "forged",
    );
    let mut stranger = guest(&d, "vm2");
    refused(
        req(&mut stranger, Request::IpcOpenEvent { token }),
        "another VM's",
    );
}

/// VMM memory through a shareable handle (`memMapIPCDrv`) and a pool's
/// allocation (`streamOrderedAllocationIPC`), each imported by a process
/// another worker serves: one memory, live, whoever writes.
#[test]
fn shareable_handles_and_pools_pass_between_workers() {
    let d = daemon("ipc-across-share");
    let mut a = guest(&d, "vm1");
    let mut b = guest(&d, "vm1");
    let h = req(
        &mut a,
        Request::VmmCreate {
            size: G,
            compression: 0,
        },
    )
    .unwrap()[0];
    let va = map(&mut a, h);
    a.memcpy_htod(va, &[5; 4096]).unwrap();
    let [t, size, ..] = req(&mut a, Request::VmmExport { handle: h }).unwrap();
    assert_eq!(size, G);
    let [hb, bsize, ..] = req(&mut b, Request::VmmImport { token: t }).unwrap();
    assert_eq!(bsize, G);
    let [again, ..] = req(&mut b, Request::VmmImport { token: t }).unwrap();
    assert_eq!(again, hb, "the same handle, held once more");
    let vb = map(&mut b, hb);
    assert_eq!(read(&mut b, vb, 4096), vec![5; 4096], "a's bytes");
    b.memcpy_htod(vb + 4096, &[6; 4096]).unwrap();
    assert_eq!(read(&mut a, va + 4096, 4096), vec![6; 4096], "b's writes");
    refused(
        req(&mut b, Request::VmmImport { token: t ^ 1 }),
        "a made-up token",
    );

    // A pool exported, imported; its allocation exported and imported
    // through it alone.
    let [pool, ..] = req(&mut a, Request::PoolExport { pool: 0x1234 }).unwrap();
    let ptr = a.mem_alloc(2 * MIB).unwrap();
    a.memcpy_htod(ptr, b"from the pool").unwrap();
    let [pt, ..] = req(&mut a, Request::PoolExportPointer { pool, ptr }).unwrap();
    refused(
        req(&mut b, Request::PoolImportPointer { pool, token: pt }),
        "through a pool it did not import",
    );
    req(&mut b, Request::PoolImport { token: pool }).unwrap();
    let plain = a.mem_alloc(2 * MIB).unwrap();
    let [plain_token, ..] = req(&mut a, Request::IpcExport { ptr: plain }).unwrap();
    refused(
        req(
            &mut b,
            Request::PoolImportPointer {
                pool,
                token: plain_token,
            },
        ),
        "memory not exported from that pool",
    );
    let [at, n, ..] = req(&mut b, Request::PoolImportPointer { pool, token: pt }).unwrap();
    assert_eq!(n, 2 * MIB);
    assert_eq!(read(&mut b, at, 13), b"from the pool");
    req(&mut b, Request::IpcClose { ptr: at }).unwrap();
}

/// Two processes that end without closing what they shared: the exporter
/// first, while the other has its memory open, then the other. Each one's
/// worker ends with it (what was kept for the opener is let go of when it
/// goes), and the VM holds nothing: the GPU's spare is all that runs.
#[test]
fn workers_of_processes_that_ended_with_memory_shared_end_too() {
    let d = daemon("ipc-across-ends");
    tests::wait_for_workers(&d, 1, "the GPU's spare");
    let mut a = guest(&d, "vm1");
    let mut b = guest(&d, "vm1");
    let ptr = a.mem_alloc(4 * MIB).unwrap();
    let [token, ..] = req(&mut a, Request::IpcExport { ptr }).unwrap();
    let [at, ..] = req(&mut b, Request::IpcOpen { token }).unwrap();
    b.memcpy_htod(at, b"kept").unwrap();
    drop(a);
    assert_eq!(read(&mut b, at, 4), b"kept", "kept for b");
    drop(b);
    assert_eq!(vm_memory(&d, |u| u == 0), 0, "the VM still holds memory");
    tests::wait_for_workers(&d, 1, "the spare alone, both processes' workers ended");
}
