//! A guest process that names memory it does not own (another process's
//! allocations, VMM handles, reservations and mappings, IPC handles it was
//! not given, pinned blocks, arrays, or ranges past its own) is refused
//! each time; the owner's bytes stay intact and the worker serves on.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tests::hostile::{assert_no_broken_channel, vals};
use tests::Host;

/// A guest process that forges VMM requests against another process's
/// handle, reservation and mappings is refused each time; the other
/// process's memory stays mapped and intact, and the worker serves on.
#[test]
fn forged_vmm_requests_touch_nothing_of_another_process() {
    use protocol::{Request, Status, VMM_GRANULARITY as G};
    let host = Host::start("hostile-vmm", 64 << 20);
    let mut victim = host.guest();
    let req = vals;
    let h = req(
        &mut victim,
        Request::VmmCreate {
            size: 2 * G,
            compression: 0,
        },
    )
    .unwrap()[0];
    let va = req(
        &mut victim,
        Request::VmmReserve {
            size: 4 * G,
            align: 0,
            addr: 0,
        },
    )
    .unwrap()[0];
    let map = Request::VmmMap {
        ptr: va,
        size: 2 * G,
        offset: 0,
        handle: h,
    };
    req(&mut victim, map.clone()).unwrap();
    victim.memcpy_htod(va + G, &[9; 4096]).unwrap();

    let mut evil = host.guest();
    let mine = req(
        &mut evil,
        Request::VmmCreate {
            size: G,
            compression: 0,
        },
    )
    .unwrap()[0];
    let forged = [
        map.clone(),
        Request::VmmMap {
            ptr: va + 2 * G,
            size: G,
            offset: 0,
            handle: mine,
        },
        Request::VmmUnmap {
            ptr: va,
            size: 2 * G,
        },
        Request::VmmAddressFree {
            ptr: va,
            size: 4 * G,
        },
        Request::VmmRelease { handle: h },
        Request::VmmRetain { ptr: va + G },
        Request::VmmSetAccess {
            ptr: va,
            size: 2 * G,
            flags: 3,
        },
        Request::VmmMap {
            ptr: !(G - 1),
            size: 1 << 40,
            offset: 0,
            handle: mine,
        },
        Request::VmmCreate {
            size: 1 << 40,
            compression: 0,
        },
    ];
    for r in forged {
        let e = req(&mut evil, r.clone()).unwrap_err();
        assert!(
            matches!(
                e,
                guest::GuestError::Cuda(
                    Status::InvalidValue | Status::InvalidHandle | Status::OutOfMemory
                )
            ),
            "{r:?}: {e:?}"
        );
    }
    let mut buf = [0u8; 4096];
    assert!(
        evil.memcpy_dtoh(&mut buf, va + G, 0).is_err(),
        "not its memory"
    );
    // Malformed VMM requests on the wire (the guest side does not check
    // what it encodes): refused by decode, the channel lives on.
    for r in [
        Request::VmmCreate {
            size: 4096,
            compression: 0,
        },
        // No CUmemAllocationCompType but none (0) and generic (1).
        Request::VmmCreate {
            size: G,
            compression: 2,
        },
        Request::VmmCreate {
            size: G,
            compression: 0xff,
        },
        Request::VmmMap {
            ptr: va + 1,
            size: G,
            offset: 0,
            handle: mine,
        },
        Request::VmmSetAccess {
            ptr: va,
            size: G,
            flags: 0,
        },
        Request::VmmReserve {
            size: G,
            align: 3 << 20,
            addr: 0,
        },
        Request::VmmReserve {
            size: G,
            align: 0,
            addr: 0x1000,
        },
    ] {
        let e = req(&mut evil, r.clone()).unwrap_err();
        assert!(
            matches!(e, guest::GuestError::Cuda(Status::InvalidValue)),
            "{r:?}: {e:?}"
        );
    }
    assert!(req(&mut evil, Request::VmmRelease { handle: mine }).is_ok());
    drop(evil);
    victim.memcpy_dtoh(&mut buf, va + G, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 9));
    assert_no_broken_channel(&host);
}

/// IPC between processes of one VM: a process cannot export, close or
/// reach another's memory it was not handed, a made-up token opens
/// nothing, and memory it opened is refused again once the exporter frees
/// it or ends; the worker serves on.
#[test]
fn forged_ipc_requests_reach_nothing_not_handed_over() {
    use protocol::{Request, Status};
    let host = Host::start("hostile-ipc", 64 << 20);
    let req = vals;
    let refused = |r: Result<[u64; 4], guest::GuestError>, what: &str| {
        assert!(
            matches!(
                r,
                Err(guest::GuestError::Cuda(
                    Status::InvalidValue | Status::InvalidContext | Status::InvalidHandle
                ))
            ),
            "{what}: {r:?}"
        );
    };
    let mut victim = host.guest();
    let p = victim.mem_alloc(8192).unwrap();
    victim.memcpy_htod(p, &[5; 8192]).unwrap();
    let mut evil = host.guest();
    let mut buf = [0u8; 4096];
    refused(
        req(&mut evil, Request::IpcExport { ptr: p }),
        "export of another's memory",
    );
    for token in [0, 1, u64::MAX, p] {
        refused(req(&mut evil, Request::IpcOpen { token }), "made-up token");
    }
    refused(
        req(&mut evil, Request::IpcClose { ptr: p }),
        "close of unopened memory",
    );
    assert!(
        evil.memcpy_dtoh(&mut buf, p, 0).is_err(),
        "not handed over yet"
    );

    // Handed over: reachable, within its range only.
    let [token, base, size, _] = req(&mut victim, Request::IpcExport { ptr: p + 100 }).unwrap();
    assert_eq!((base, size), (p, 8192));
    refused(
        req(&mut victim, Request::IpcOpen { token }),
        "its own token",
    );
    assert_eq!(
        req(&mut evil, Request::IpcOpen { token }).unwrap()[..2],
        [p, 8192]
    );
    evil.memcpy_dtoh(&mut buf, p + 4096, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 5));
    assert!(
        evil.memcpy_dtoh(&mut [0u8; 2], p + 8191, 0).is_err(),
        "past its end"
    );

    // Freed by the exporter while opened: it stays, out of the
    // exporter's reach, until the opener closes it; then it is freed and
    // the token is dead.
    victim.mem_free(p).unwrap();
    evil.memcpy_dtoh(&mut buf, p, 0).unwrap();
    assert!(
        victim.memcpy_dtoh(&mut buf, p, 0).is_err(),
        "the exporter's no more"
    );
    refused(
        req(&mut victim, Request::IpcExport { ptr: p }),
        "exported again",
    );
    assert_eq!(
        host.stats().mem_used.load(Ordering::Relaxed),
        8192,
        "still counted"
    );
    req(&mut evil, Request::IpcClose { ptr: p }).unwrap();
    host.wait_until("freed once closed", Duration::from_secs(10), |s| {
        s.mem_used.load(Ordering::Relaxed) == 0
    });
    assert!(
        evil.memcpy_dtoh(&mut buf, p, 0).is_err(),
        "closed and freed"
    );
    refused(
        req(&mut evil, Request::IpcOpen { token }),
        "token of freed memory",
    );

    // An exporter that ends takes its exports with it.
    let q = evil.mem_alloc(4096).unwrap();
    let [t2, ..] = req(&mut evil, Request::IpcExport { ptr: q }).unwrap();
    req(&mut victim, Request::IpcOpen { token: t2 }).unwrap();
    drop(evil);
    host.wait_until("the exporter's memory back", Duration::from_secs(10), |s| {
        s.mem_used.load(Ordering::Relaxed) == 0
    });
    assert!(
        victim.memcpy_dtoh(&mut buf, q, 0).is_err(),
        "its exporter ended"
    );
    refused(
        req(&mut victim, Request::IpcOpen { token: t2 }),
        "token of an ended exporter",
    );

    // Events: only one's own is exported; an opened one works until its
    // owner destroys it.
    let mut evil = host.guest();
    let ev = victim.event_create(6).unwrap();
    refused(
        req(&mut evil, Request::IpcExportEvent { event: ev }),
        "another's event",
    );
    for token in [0, 1, u64::MAX, ev] {
        refused(
            req(&mut evil, Request::IpcOpenEvent { token }),
            "made-up event token",
        );
    }
    assert!(evil.event_synchronize(ev).is_err(), "not its event");
    let [et, ..] = req(&mut victim, Request::IpcExportEvent { event: ev }).unwrap();
    refused(
        req(&mut victim, Request::IpcOpenEvent { token: et }),
        "its own event token",
    );
    let [mine, ..] = req(&mut evil, Request::IpcOpenEvent { token: et }).unwrap();
    evil.event_synchronize(mine).unwrap();
    // Destroyed by its owner while opened: it stays for the opener, out
    // of the owner's reach, until the opener lets go of it.
    victim.event_destroy(ev).unwrap();
    assert!(victim.event_synchronize(ev).is_err(), "the owner's no more");
    evil.event_synchronize(mine).unwrap();
    evil.event_destroy(mine).unwrap();
    assert!(evil.event_destroy(mine).is_err(), "let go of once");
    assert!(evil.event_synchronize(mine).is_err(), "let go of");
    refused(
        req(&mut evil, Request::IpcOpenEvent { token: et }),
        "token of a destroyed event",
    );
    // And one whose owner ends is revoked.
    let ev2 = victim.event_create(6).unwrap();
    let [et2, ..] = req(&mut victim, Request::IpcExportEvent { event: ev2 }).unwrap();
    let [theirs, ..] = req(&mut evil, Request::IpcOpenEvent { token: et2 }).unwrap();
    evil.event_synchronize(theirs).unwrap();
    drop(victim);
    // Its session ends once the worker sees its channel go.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while evil.event_synchronize(theirs).is_ok() {
        assert!(
            std::time::Instant::now() < until,
            "its owner ended: revoked"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    evil.event_destroy(theirs).unwrap();
    assert_no_broken_channel(&host);
}

/// Tensor maps are encoded only over the caller's own memory: a tensor
/// reaching past its allocation, in another process's, or with fields
/// out of the driver's range is refused; the channel lives on.
#[test]
fn tensor_maps_cover_only_the_callers_memory() {
    use protocol::tensor_map::{TensorMapKind, TensorMapParams, TENSOR_MAP_BYTES};
    use protocol::Status;
    let host = Host::start("hostile-tensormap", 64 << 20);
    let mut victim = host.guest();
    let theirs = victim.mem_alloc(1 << 20).unwrap();
    let mut g = host.guest();
    let mine = g.mem_alloc(1 << 20).unwrap();
    // 256 rows of 1 KiB: exactly the allocation.
    let p = |address: u64, rows: u64| TensorMapParams {
        kind: TensorMapKind::Tiled,
        dtype: 7,
        rank: 2,
        address,
        dims: [256, rows, 0, 0, 0],
        strides: [1024, 0, 0, 0],
        box_dim: [64, 64, 0, 0, 0],
        elem_strides: [1, 1, 0, 0, 0],
        interleave: 0,
        swizzle: 0,
        l2_promotion: 0,
        oob_fill: 0,
        lower: [0; 3],
        upper: [0; 3],
        channels_per_pixel: 0,
        pixels_per_column: 0,
        map: [0; TENSOR_MAP_BYTES],
    };
    let map = g.tensor_map(&p(mine, 1024).encode()).unwrap();
    assert_eq!(map.len(), TENSOR_MAP_BYTES);
    let refused = |g: &mut guest::Gpu, bytes: Vec<u8>| {
        let e = g.tensor_map(&bytes).unwrap_err();
        assert!(
            matches!(e, guest::GuestError::Cuda(Status::InvalidValue)),
            "{e:?}"
        );
    };
    refused(&mut g, p(mine, 1025).encode());
    refused(&mut g, p(theirs, 16).encode());
    refused(&mut g, p(mine + 16, 1024).encode());
    refused(
        &mut g,
        TensorMapParams {
            swizzle: 9,
            ..p(mine, 16)
        }
        .encode(),
    );
    refused(&mut g, p(mine, 16).encode()[..100].to_vec());
    let replace = TensorMapParams {
        kind: TensorMapKind::Replace,
        ..p(theirs, 16)
    };
    refused(&mut g, replace.encode());
    assert!(g.tensor_map(&p(mine, 16).encode()).is_ok());
    assert_no_broken_channel(&host);
}

/// A memset through the device address of page-locked memory reaches only
/// the caller's own blocks of the VM's pinned pool: another process's
/// block, or past the end of its own, is refused.
#[test]
fn memsets_of_pinned_memory_reach_only_the_callers_blocks() {
    use protocol::Status;
    let host = Host::start("hostile-pinned-memset", 64 << 20);
    let mut victim = host.guest();
    let base = victim.device_info().pinned_base;
    let theirs = victim.pinned_alloc(8192).unwrap();
    let mut evil = host.guest();
    let mine = evil.pinned_alloc(4096).unwrap();
    let refused = |g: &mut guest::Gpu, dst: u64, count: u64| {
        g.memset_async(dst, 0x5a, 1, count, 0).unwrap();
        let e = g.synchronize().unwrap_err();
        assert!(
            matches!(e, guest::GuestError::Cuda(Status::InvalidValue)),
            "{e:?}"
        );
    };
    refused(&mut evil, base + theirs, 16);
    refused(&mut evil, base + mine + 4000, 200);
    // Its own block passes the check (the sim's model cannot write mapped
    // host memory and says so; a GPU writes it).
    evil.memset_async(base + mine, 0x5a, 1, 16, 0).unwrap();
    let e = evil.synchronize().unwrap_err();
    assert!(
        matches!(e, guest::GuestError::Cuda(Status::NotSupported)),
        "{e:?}"
    );
    assert_no_broken_channel(&host);
}

/// Array requests name only the caller's own arrays and objects: another
/// process's array, texture or surface handles are refused, as are arrays
/// past the vGPU's memory or the device's limits and copies outside an
/// array or outside the caller's own memory; the victim's bytes are
/// untouched and nothing is left counted.
#[test]
fn array_requests_reach_only_the_callers_arrays_and_memory() {
    use protocol::array::{resource, ArrayCopy, ArrayDesc, CopySide, TexParams, SURFACE_LDST};
    use protocol::{Request, Status};
    let host = Host::start("hostile-arrays", 64 << 20);
    let req = vals;
    let desc = ArrayDesc {
        width: 64,
        height: 16,
        depth: 0,
        format: 0x01,
        channels: 4,
        flags: SURFACE_LDST,
    };
    let mut victim = host.guest();
    let theirs = req(&mut victim, Request::ArrayCreate { desc }).unwrap()[0];
    let their_mem = victim.mem_alloc(4096).unwrap();
    victim.memcpy_htod(their_mem, &[7; 4096]).unwrap();
    let into = |array, from: u64| ArrayCopy {
        src: CopySide::Device {
            ptr: from,
            pitch: 256,
            height: 16,
        },
        dst: CopySide::Array {
            array,
            x: 0,
            y: 0,
            z: 0,
        },
        width: 256,
        height: 16,
        depth: 1,
    };
    req(
        &mut victim,
        Request::ArrayCopy {
            copy: into(theirs, their_mem),
            stream: 0,
        },
    )
    .unwrap();
    let their_tex = TexParams {
        kind: resource::ARRAY,
        base: theirs,
        ..TexParams::default()
    };
    let their_tex = victim.tex_create(&their_tex.encode()).unwrap();
    let their_surf = req(&mut victim, Request::SurfCreate { array: theirs }).unwrap()[0];

    let mut evil = host.guest();
    let mine = req(&mut evil, Request::ArrayCreate { desc }).unwrap()[0];
    let my_mem = evil.mem_alloc(4096).unwrap();
    let out_of = |array, to: u64| ArrayCopy {
        src: into(array, 0).dst,
        dst: CopySide::Device {
            ptr: to,
            pitch: 256,
            height: 16,
        },
        ..into(array, 0)
    };
    let big = ArrayDesc {
        width: 16384,
        height: 16384,
        depth: 0,
        format: 0x20,
        channels: 4,
        flags: 0,
    };
    for r in [
        Request::ArrayDestroy { array: theirs },
        Request::SurfCreate { array: theirs },
        Request::TexDestroy { obj: their_tex },
        Request::SurfDestroy { obj: their_surf },
        // Their array, from or into memory of mine.
        Request::ArrayCopy {
            copy: out_of(theirs, my_mem),
            stream: 0,
        },
        Request::ArrayCopy {
            copy: into(theirs, my_mem),
            stream: 0,
        },
        // My array, from or into their memory.
        Request::ArrayCopy {
            copy: out_of(mine, their_mem),
            stream: 0,
        },
        Request::ArrayCopy {
            copy: into(mine, their_mem),
            stream: 0,
        },
        // Past my memory's end, past my array's last row.
        Request::ArrayCopy {
            copy: into(mine, my_mem + 256),
            stream: 0,
        },
        Request::ArrayCopy {
            copy: ArrayCopy {
                dst: CopySide::Array {
                    array: mine,
                    x: 0,
                    y: 1,
                    z: 0,
                },
                ..into(mine, my_mem)
            },
            stream: 0,
        },
        // A gigabyte of array on a 64 MiB vGPU.
        Request::ArrayCreate { desc: big },
    ] {
        let e = evil.request(&r).unwrap_err();
        assert!(
            matches!(
                e,
                guest::GuestError::Cuda(
                    Status::InvalidValue | Status::InvalidHandle | Status::OutOfMemory
                )
            ),
            "{r:?}: {e:?}"
        );
    }
    // Textures over their array or their memory.
    for p in [
        TexParams {
            kind: resource::ARRAY,
            base: theirs,
            ..TexParams::default()
        },
        TexParams {
            kind: resource::LINEAR,
            base: their_mem,
            format: 0x01,
            channels: 1,
            width: 4096,
            ..TexParams::default()
        },
        TexParams {
            kind: resource::PITCH2D,
            base: my_mem,
            format: 0x01,
            channels: 1,
            width: 64,
            height: 65,
            pitch: 64,
            ..TexParams::default()
        },
    ] {
        assert!(evil.tex_create(&p.encode()).is_err(), "{p:?}");
    }
    // Linear memory past its own allocation is made, as the driver makes
    // it, over its own part only.
    let past = TexParams {
        kind: resource::LINEAR,
        base: my_mem,
        format: 0x01,
        channels: 1,
        width: 4097,
        ..TexParams::default()
    };
    let t = evil.tex_create(&past.encode()).unwrap();
    evil.request(&Request::TexDestroy { obj: t }).unwrap();
    // Bytes that decode as no request at all are refused too.
    assert!(evil.tex_create(&[0xff; 40]).is_err());
    // The victim's array still holds its bytes.
    let back = victim.mem_alloc(4096).unwrap();
    req(
        &mut victim,
        Request::ArrayCopy {
            copy: out_of(theirs, back),
            stream: 0,
        },
    )
    .unwrap();
    let mut b = vec![0u8; 4096];
    victim.memcpy_dtoh(&mut b, back, 0).unwrap();
    assert!(b.iter().all(|&x| x == 7));
    assert_no_broken_channel(&host);
    drop(evil);
    drop(victim);
    host.wait_program_freed();
}
