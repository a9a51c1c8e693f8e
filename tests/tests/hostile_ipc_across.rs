//! IPC handles between the processes of a VM with process slots (each
//! served by a worker of its own), asked for by hand as a hostile guest
//! would, against a real `fairvgpu serve` on the sim: a token of another
//! VM, a made-up one, one whose exporter ended, a close too many are
//! refused as the driver refuses an invalid handle, and no other VM's
//! memory is reached. (The working paths: `ipc_across_workers.rs`.)

use std::time::{Duration, Instant};

use protocol::Request;
use tests::ipc::{daemon, guest, read, refused, req, vm_memory};

const MIB: u64 = 1 << 20;

#[test]
fn tokens_of_another_vm_made_up_or_of_an_ended_exporter_open_nothing() {
    let d = daemon("ipc-across-hostile");
    let mut a = guest(&d, "vm1");
    let mut b = guest(&d, "vm1");
    let mut stranger = guest(&d, "vm2");
    let mut stranger2 = guest(&d, "vm2");
    let ptr = a.mem_alloc(2 * MIB).unwrap();
    a.memcpy_htod(ptr, b"vm1's secret").unwrap();
    let [token, ..] = req(&mut a, Request::IpcExport { ptr }).unwrap();

    // Another VM's processes cannot open it, nor a made-up token here.
    refused(
        req(&mut stranger, Request::IpcOpen { token }),
        "vm2 opens vm1's",
    );
    let theirs = stranger2.mem_alloc(2 * MIB).unwrap();
    let [their_token, ..] = req(&mut stranger2, Request::IpcExport { ptr: theirs }).unwrap();
    refused(
        req(&mut b, Request::IpcOpen { token: their_token }),
        "vm1 opens vm2's",
    );
    for forged in [token ^ 1, token.wrapping_add(1), 1, u64::MAX, ptr] {
        refused(
            req(&mut b, Request::IpcOpen { token: forged }),
            "a forged token",
        );
    }
    // Its own token, opened by the exporter: as the driver answers.
    refused(req(&mut a, Request::IpcOpen { token }), "its own");

    // b and c open it; then a's process ends.
    let [at, ..] = req(&mut b, Request::IpcOpen { token }).unwrap();
    let mut c = guest(&d, "vm1");
    let [x, ..] = req(&mut c, Request::IpcOpen { token }).unwrap();
    req(&mut c, Request::IpcClose { ptr: x }).unwrap();
    drop(a);
    let t = Instant::now();
    loop {
        match req(&mut c, Request::IpcOpen { token }) {
            Err(_) => break,
            Ok([x, ..]) => {
                req(&mut c, Request::IpcClose { ptr: x }).unwrap();
                assert!(t.elapsed() < Duration::from_secs(10), "still opens");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // b keeps what it opened, as the driver keeps it, until it closes;
    // counted to the vGPU until then, and not after.
    assert_eq!(read(&mut b, at, 12), b"vm1's secret");
    assert!(
        vm_memory(&d, |u| u >= 2 * MIB) >= 2 * MIB,
        "uncounted while held"
    );
    req(&mut b, Request::IpcClose { ptr: at }).unwrap();
    let left = vm_memory(&d, |u| u == 0);
    assert_eq!(left, 0, "still counted after the last holder let go");
    refused(req(&mut b, Request::IpcClose { ptr: at }), "closed twice");
    // b cannot reach it any more.
    let mut out = [0u8; 12];
    assert!(b.memcpy_dtoh(&mut out, at, 0).is_err(), "read after close");
}

/// An opener reaches the range it opened, and nothing past it: not the
/// exporter's neighbouring allocation, not by an address of another
/// slot's worker.
#[test]
fn an_opened_range_reaches_nothing_beyond_it() {
    let d = daemon("ipc-across-bounds");
    let mut a = guest(&d, "vm1");
    let mut b = guest(&d, "vm1");
    let shared = a.mem_alloc(2 * MIB).unwrap();
    let private = a.mem_alloc(2 * MIB).unwrap();
    a.memcpy_htod(private, b"not shared").unwrap();
    let [token, ..] = req(&mut a, Request::IpcExport { ptr: shared }).unwrap();
    let [at, n, ..] = req(&mut b, Request::IpcOpen { token }).unwrap();
    assert_eq!(n, 2 * MIB);
    let mut out = vec![0u8; 16];
    assert!(
        b.memcpy_dtoh(&mut out, at + n - 8, 0).is_err(),
        "past its end"
    );
    assert!(
        b.memcpy_dtoh(&mut out, private, 0).is_err(),
        "a's own address"
    );
    assert!(
        b.memcpy_dtoh(&mut out, at + 2 * MIB, 0).is_err(),
        "where a's next allocation would be"
    );
    assert_eq!(read(&mut b, at, 4), vec![0; 4]);
}

/// Shareable handles across workers: another VM's tokens, tokens of
/// another kind and made-up ones import nothing.
#[test]
fn shareable_tokens_of_another_vm_or_kind_import_nothing() {
    let d = daemon("ipc-across-share-hostile");
    let mut a = guest(&d, "vm1");
    let mut b = guest(&d, "vm1");
    let mut stranger = guest(&d, "vm2");
    let g = protocol::VMM_GRANULARITY;
    let h = req(
        &mut stranger,
        Request::VmmCreate {
            size: g,
            compression: 0,
        },
    )
    .unwrap()[0];
    let [their_phys, ..] = req(&mut stranger, Request::VmmExport { handle: h }).unwrap();
    let [their_pool, ..] = req(&mut stranger, Request::PoolExport { pool: 7 }).unwrap();
    refused(
        req(&mut b, Request::VmmImport { token: their_phys }),
        "another VM's memory",
    );
    refused(
        req(&mut b, Request::PoolImport { token: their_pool }),
        "another VM's pool",
    );
    // Tokens of vm1 of one kind, asked for as another.
    let ptr = a.mem_alloc(2 * MIB).unwrap();
    let [mem_token, ..] = req(&mut a, Request::IpcExport { ptr }).unwrap();
    let [pool, ..] = req(&mut a, Request::PoolExport { pool: 9 }).unwrap();
    refused(
        req(&mut b, Request::VmmImport { token: mem_token }),
        "IPC memory as physical memory",
    );
    refused(
        req(&mut b, Request::IpcOpen { token: pool }),
        "a pool as memory",
    );
    refused(
        req(&mut b, Request::PoolImport { token: mem_token }),
        "memory as a pool",
    );
    for forged in [1, u64::MAX, pool ^ 1] {
        refused(req(&mut b, Request::PoolImport { token: forged }), "forged");
    }
}
