//! Shareable handles (VMM memory and memory pools) between the processes
//! of one VM, asked for by hand as a hostile guest would: a made-up token
//! or one of another VM opens nothing, a process frees or exports only
//! what it holds, shared memory is counted once (to its exporter) until
//! its last holder lets go, and an exporter that ends revokes its tokens.
//! (Beside `hostile_rings.rs`, which is long enough.)

use std::sync::atomic::Ordering;
use std::time::Duration;

use guest::{Gpu, GuestError};
use protocol::{Request, Status, VMM_GRANULARITY as G};
use tests::ipc::{map, req};
use tests::Host;

fn refused(r: Result<[u64; 4], GuestError>, what: &str) {
    assert!(
        matches!(
            r,
            Err(GuestError::Cuda(
                Status::InvalidValue | Status::InvalidHandle | Status::InvalidContext
            ))
        ),
        "{what}: {r:?}"
    );
}

fn unmap(g: &mut Gpu, va: u64) {
    req(g, Request::VmmUnmap { ptr: va, size: G }).unwrap();
    req(
        g,
        Request::VmmAddressFree {
            ptr: va,
            size: 2 * G,
        },
    )
    .unwrap();
}

fn used(host: &Host) -> u64 {
    host.stats().mem_used.load(Ordering::Relaxed)
}

#[test]
fn forged_vmm_shareable_handles_reach_nothing_not_handed_over() {
    let host = Host::start("hostile-share-vmm", 64 << 20);
    let other_vm = Host::start("hostile-share-vm2", 64 << 20);
    let mut victim = host.guest();
    let mut evil = host.guest();
    let h = req(
        &mut victim,
        Request::VmmCreate {
            size: G,
            compression: 0,
        },
    )
    .unwrap()[0];
    let vva = map(&mut victim, h);
    victim.memcpy_htod(vva, &[5; 4096]).unwrap();

    refused(
        req(&mut evil, Request::VmmExport { handle: h }),
        "export of another's handle",
    );
    for token in [1, u64::MAX, h, vva] {
        refused(
            req(&mut evil, Request::VmmImport { token }),
            "made-up token",
        );
    }

    // Handed over: the same memory, counted once.
    let [t, size, ..] = req(&mut victim, Request::VmmExport { handle: h }).unwrap();
    assert_eq!(size, G);
    assert_eq!(
        req(&mut victim, Request::VmmExport { handle: h }).unwrap()[0],
        t,
        "the same token for the same memory"
    );
    let mut stranger = other_vm.guest();
    refused(
        req(&mut stranger, Request::VmmImport { token: t }),
        "a token of another VM",
    );
    let [eh, esize, ..] = req(&mut evil, Request::VmmImport { token: t }).unwrap();
    assert_eq!(esize, G);
    assert!(
        matches!(
            req(&mut evil, Request::VmmExport { handle: eh }),
            Err(GuestError::Cuda(Status::NotSupported))
        ),
        "an import exported again (the exporter alone exports it)"
    );
    let eva = map(&mut evil, eh);
    let mut buf = [0u8; 4096];
    evil.memcpy_dtoh(&mut buf, eva, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 5), "the exporter's bytes");
    evil.memcpy_htod(eva + 4096, &[6; 4096]).unwrap();
    victim.memcpy_dtoh(&mut buf, vva + 4096, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 6), "the importer's writes");
    assert_eq!(used(&host), G, "counted once, to the exporter");

    // Only its own handle: released once, and nothing of the victim's.
    refused(
        req(&mut evil, Request::VmmRelease { handle: h }),
        "release of the exporter's handle",
    );
    refused(
        req(&mut evil, Request::VmmUnmap { ptr: vva, size: G }),
        "unmap of the exporter's mapping",
    );
    req(&mut evil, Request::VmmRelease { handle: eh }).unwrap();
    refused(
        req(&mut evil, Request::VmmRelease { handle: eh }),
        "released twice",
    );

    // The exporter lets go while the importer still maps it: it stays,
    // counted, until the importer unmaps.
    unmap(&mut victim, vva);
    req(&mut victim, Request::VmmRelease { handle: h }).unwrap();
    assert_eq!(used(&host), G, "still held by the importer");
    evil.memcpy_dtoh(&mut buf, eva + 4096, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 6));
    unmap(&mut evil, eva);
    // The exporter's count settles at its next request.
    victim.synchronize().unwrap();
    assert_eq!(used(&host), 0, "uncounted once nobody holds it");

    // An exporter that ends revokes its tokens; what an importer holds
    // stays counted until it lets go.
    let h2 = req(
        &mut victim,
        Request::VmmCreate {
            size: G,
            compression: 0,
        },
    )
    .unwrap()[0];
    let [t2, ..] = req(&mut victim, Request::VmmExport { handle: h2 }).unwrap();
    let eh2 = req(&mut evil, Request::VmmImport { token: t2 }).unwrap()[0];
    let eva2 = map(&mut evil, eh2);
    evil.memcpy_htod(eva2, &[7; 4096]).unwrap();
    drop(victim);
    let mut late = host.guest();
    std::thread::sleep(Duration::from_millis(200));
    refused(
        req(&mut late, Request::VmmImport { token: t2 }),
        "a token of an ended process",
    );
    assert_eq!(used(&host), G, "the importer still holds it");
    evil.memcpy_dtoh(&mut buf, eva2, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 7));
    unmap(&mut evil, eva2);
    req(&mut evil, Request::VmmRelease { handle: eh2 }).unwrap();
    assert_eq!(used(&host), 0, "let go of by the importer");

    // An importer that ends lets go too.
    let h3 = req(
        &mut late,
        Request::VmmCreate {
            size: G,
            compression: 0,
        },
    )
    .unwrap()[0];
    let [t3, ..] = req(&mut late, Request::VmmExport { handle: h3 }).unwrap();
    let eh3 = req(&mut evil, Request::VmmImport { token: t3 }).unwrap()[0];
    map(&mut evil, eh3);
    drop(late);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(used(&host), G, "held by the importer");
    drop(evil);
    host.wait_until("all memory back", Duration::from_secs(10), |s| {
        s.mem_used.load(Ordering::Relaxed) == 0
    });
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
}

#[test]
fn forged_pool_tokens_import_nothing_not_exported_from_the_pool() {
    let host = Host::start("hostile-share-pool", 64 << 20);
    let mut victim = host.guest();
    let mut evil = host.guest();
    let p = victim.mem_alloc(8192).unwrap();
    victim.memcpy_htod(p, &[3; 8192]).unwrap();
    let q = victim.mem_alloc(4096).unwrap();

    refused(
        req(&mut victim, Request::PoolExportPointer { pool: 1, ptr: p }),
        "a pointer of a pool not exported",
    );
    let [pt, ..] = req(&mut victim, Request::PoolExport { pool: 0x1234 }).unwrap();
    assert_eq!(
        req(&mut victim, Request::PoolExport { pool: 0x1234 }).unwrap()[0],
        pt
    );
    let [t, base, size, _] =
        req(&mut victim, Request::PoolExportPointer { pool: pt, ptr: p }).unwrap();
    assert_eq!((base, size), (p, 8192));
    refused(
        req(&mut evil, Request::PoolExportPointer { pool: pt, ptr: p }),
        "export from another's pool",
    );
    refused(
        req(&mut evil, Request::PoolImportPointer { pool: pt, token: t }),
        "a pointer through a pool not imported",
    );
    for token in [1, u64::MAX, t] {
        refused(
            req(&mut evil, Request::PoolImport { token }),
            "made-up pool",
        );
    }
    req(&mut evil, Request::PoolImport { token: pt }).unwrap();
    // Memory exported as plain IPC memory is not the pool's.
    let [tq, ..] = req(&mut victim, Request::IpcExport { ptr: q }).unwrap();
    refused(
        req(
            &mut evil,
            Request::PoolImportPointer {
                pool: pt,
                token: tq,
            },
        ),
        "IPC memory not of the pool",
    );
    refused(
        req(&mut evil, Request::PoolImportPointer { pool: pt, token: 7 }),
        "made-up pointer",
    );
    let got = req(&mut evil, Request::PoolImportPointer { pool: pt, token: t }).unwrap();
    assert_eq!(got[..2], [p, 8192]);
    let mut buf = [0u8; 4096];
    evil.memcpy_dtoh(&mut buf, p + 4096, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 3));
    refused(
        req(&mut evil, Request::MemFree { ptr: p }),
        "free of the exporter's allocation",
    );
    req(&mut evil, Request::IpcClose { ptr: p }).unwrap();
    assert!(evil.memcpy_dtoh(&mut buf, p, 0).is_err(), "closed");

    // The exporter ends: its pool is gone with it.
    let mut third = host.guest();
    drop(victim);
    std::thread::sleep(Duration::from_millis(200));
    refused(
        req(&mut third, Request::PoolImport { token: pt }),
        "a pool of an ended process",
    );
    refused(
        req(&mut evil, Request::PoolImportPointer { pool: pt, token: t }),
        "a pointer of an ended process",
    );
    host.wait_until("all memory back", Duration::from_secs(10), |s| {
        s.mem_used.load(Ordering::Relaxed) == 0
    });
}
