//! A guest that scribbles over its own rings loses its channel; the worker,
//! and the other guests on it, carry on.

use std::sync::atomic::Ordering;
use std::time::Duration;

use daemon::config::ExecutorKind;
use fairvgpu_tests::{cargo_build, Host};
use transport::layout::{desc, ringctl, Direction, DESC_SIZE};
use transport::server::Client;
use transport::Descriptor;

/// Writes garbage into the region of channel `ch`.
type Scribble = fn(&transport::Region, u32);

/// Claims a channel as a native guest would and returns the client and channel index.
fn hostile(host: &Host) -> (Client, transport::GuestChannel) {
    let c = Client::connect(&host.socket, Duration::from_secs(5)).unwrap();
    let ch = c.region.claim(u32::from(c.id), 1, 0).unwrap();
    (c, ch)
}

#[test]
fn corrupt_indices_and_descriptors_end_only_the_offending_channel() {
    let host = Host::start("hostile", 64 << 20);
    let mut good = host.guest();
    let p = good.mem_alloc(4096).unwrap();
    good.memcpy_htod(p, &[7; 4096]).unwrap();

    let cases: [(&str, Scribble); 3] = [
        ("head far past the tail", |r, ch| {
            let l = r.layout();
            let ctl = l.channel_offset(ch) + l.ring_parts(Direction::ToHost).ctl;
            raw_u32(r, ctl + ringctl::HEAD, 0x7fff_0000);
        }),
        ("head wrapped backwards", |r, ch| {
            let l = r.layout();
            let ctl = l.channel_offset(ch) + l.ring_parts(Direction::ToHost).ctl;
            raw_u32(r, ctl + ringctl::HEAD, u32::MAX);
        }),
        ("descriptor pointing outside the arena", |r, ch| {
            let l = r.layout();
            let parts = l.ring_parts(Direction::ToHost);
            // Slot 1: the worker already consumed the request in slot 0.
            let slot = l.channel_offset(ch) + parts.descs + DESC_SIZE;
            raw_u32(r, slot + desc::OPCODE, protocol::op::MEM_ALLOC);
            raw_u32(r, slot + desc::DATA_OFF, u32::MAX - 8);
            raw_u32(r, slot + desc::DATA_LEN, 64);
            let ctl = l.channel_offset(ch) + parts.ctl;
            raw_u32(r, ctl + ringctl::HEAD, 2);
        }),
    ];
    for (i, (what, scribble)) in cases.iter().enumerate() {
        let (client, ch) = hostile(&host);
        // Make sure the worker has seen the claim, then corrupt.
        let mut gc = ch;
        assert!(gc
            .req
            .try_send(&Descriptor::new(1, protocol::op::CTX_SYNCHRONIZE), &[])
            .unwrap());
        std::thread::sleep(Duration::from_millis(50));
        scribble(&client.region, gc.index());
        host.wait_until(what, Duration::from_secs(10), |s| {
            s.broken_channels.load(Ordering::Relaxed) > i as u64
        });
        assert!(
            gc.check_alive().is_err(),
            "{what}: the channel must be taken away"
        );
        // The neighbour still works and its memory is intact.
        let mut buf = [0u8; 4096];
        good.memcpy_dtoh(&mut buf, p, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 7), "{what}");
        drop(gc);
        drop(client);
    }
}

/// Writes a u32 into the shared region the way a hostile guest can.
fn raw_u32(r: &transport::Region, off: usize, v: u32) {
    r.raw_u32_for_tests(off).store(v, Ordering::Release);
}

/// A guest process that forges VMM requests against another process's
/// handle, reservation and mappings is refused each time; the other
/// process's memory stays mapped and intact, and the worker serves on.
#[test]
fn forged_vmm_requests_touch_nothing_of_another_process() {
    use protocol::{Request, Status, VMM_GRANULARITY as G};
    let host = Host::start("hostile-vmm", 64 << 20);
    let mut victim = host.guest();
    let req = |g: &mut guest::Gpu, r: Request| g.request(&r).map(|x| x.vals);
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
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
}

/// IPC between processes of one VM: a process cannot export, close or
/// reach another's memory it was not handed, a made-up token opens
/// nothing, and memory it opened is refused again once the exporter frees
/// it or ends; the worker serves on.
#[test]
fn forged_ipc_requests_reach_nothing_not_handed_over() {
    use protocol::{Request, Status};
    let host = Host::start("hostile-ipc", 64 << 20);
    let req = |g: &mut guest::Gpu, r: Request| g.request(&r).map(|x| x.vals);
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
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
}

/// Listing another process's module's kernels is refused, a list from
/// past the end is empty, and the owner's own list is whole.
#[test]
fn kernel_lists_of_foreign_modules_are_refused() {
    use protocol::{ImageKind, Request, Status};
    let host = Host::start("hostile-kernel-list", 64 << 20);
    let mut victim = host.guest();
    let m = victim
        .module_load(ImageKind::Ptx, fairvgpu_tests::PTX.as_bytes())
        .unwrap();
    let names = victim.module_functions(m).unwrap();
    assert!(names.iter().any(|n| n == "vector_add"), "{names:?}");
    let mut evil = host.guest();
    for module in [m, 0, u64::MAX] {
        let e = evil
            .request(&Request::ModuleFunctions { module, first: 0 })
            .unwrap_err();
        assert!(
            matches!(e, guest::GuestError::Cuda(Status::InvalidHandle)),
            "{module}: {e:?}"
        );
    }
    // Past the end: the count, and no names.
    let r = victim
        .request(&Request::ModuleFunctions {
            module: m,
            first: u32::MAX,
        })
        .unwrap();
    assert_eq!(r.vals[0], names.len() as u64);
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
}

/// `VgpuStatus` is a monitor's question: asked on a session's channel, or
/// with a process index past any region's channels, it is refused and
/// nothing else happens; a monitor sees the vGPU's processes and their
/// memory, and takes no session of its own.
#[test]
fn vgpu_status_with_bad_fields_or_on_a_session_is_refused() {
    use guest::{Gpu, GuestError};
    use protocol::{Request, Status, MAX_STATUS_PROCESSES};
    let host = Host::start("hostile-status", 64 << 20);
    let mut victim = host.guest();
    let p = victim.mem_alloc(1 << 20).unwrap();
    victim.memcpy_htod(p, &[9; 4096]).unwrap();
    let refused = host.stats().refused.load(Ordering::Relaxed);

    let mut evil = Gpu::monitor(&host.socket, fairvgpu_tests::TEST_SPIN).unwrap();
    for first in [MAX_STATUS_PROCESSES + 1, u32::MAX] {
        let e = evil.request(&Request::VgpuStatus { first }).unwrap_err();
        assert!(
            matches!(e, GuestError::Cuda(Status::InvalidValue)),
            "{first}: {e:?}"
        );
    }
    // On a process's own channel: refused, its session untouched.
    let e = victim
        .request(&Request::VgpuStatus { first: 0 })
        .unwrap_err();
    assert!(matches!(e, GuestError::Cuda(Status::InvalidValue)), "{e:?}");
    assert!(host.stats().refused.load(Ordering::Relaxed) >= refused + 3);

    // The monitor's channel still answers: one process, with its memory.
    let r = evil.vgpu_status().unwrap();
    assert_eq!(r.mem_limit, 64 << 20);
    assert_eq!(r.processes.len(), 1, "{:?}", r.processes);
    assert_eq!(r.processes[0].mem_used, r.mem_used);
    assert!(r.mem_used >= 1 << 20);
    assert_eq!(r.processes[0].pid, std::process::id());
    // From past the end: the count, no processes.
    let far = evil
        .request(&Request::VgpuStatus {
            first: MAX_STATUS_PROCESSES,
        })
        .unwrap();
    assert_eq!(far.vals[3], 1);
    let mut buf = [0u8; 4096];
    victim.memcpy_dtoh(&mut buf, p, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 9));
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
}

/// `TakeOutput` takes only the asking process's own kernel output: asked
/// before `Hello` (a monitor's channel) it is refused; asked over and over
/// by a process that holds none, it answers "nothing" (stream 0, no bytes)
/// every time; neither breaks a channel or touches another process.
#[test]
fn take_output_gives_nothing_that_is_not_the_callers() {
    use guest::{Gpu, GuestError};
    use protocol::{Request, Status};
    let host = Host::start("hostile-output", 64 << 20);
    let mut victim = host.guest();
    let p = victim.mem_alloc(1 << 20).unwrap();
    victim.memcpy_htod(p, &[7; 4096]).unwrap();
    let refused = host.stats().refused.load(Ordering::Relaxed);

    let mut monitor = Gpu::monitor(&host.socket, fairvgpu_tests::TEST_SPIN).unwrap();
    let e = monitor.request(&Request::TakeOutput).unwrap_err();
    assert!(
        matches!(e, GuestError::Cuda(Status::NotInitialized)),
        "{e:?}"
    );
    assert!(host.stats().refused.load(Ordering::Relaxed) > refused);

    let mut evil = host.guest();
    for _ in 0..1000 {
        let r = evil.request(&Request::TakeOutput).unwrap();
        assert_eq!(r.vals[0], 0, "a stream where nothing is held");
    }
    let mut buf = [0u8; 4096];
    victim.memcpy_dtoh(&mut buf, p, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 7));
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
}

/// Cluster occupancy questions about another process's kernel, or of a
/// shape no launch may have, are refused; the channel lives on.
#[test]
fn cluster_occupancy_of_foreign_kernels_and_bad_shapes_is_refused() {
    use protocol::{Dim3, ImageKind, Request, Status};
    let host = Host::start("hostile-clusters", 64 << 20);
    let mut victim = host.guest();
    let m = victim
        .module_load(ImageKind::Ptx, fairvgpu_tests::PTX.as_bytes())
        .unwrap();
    let f = victim.get_function(m, "vector_add").unwrap().handle;
    let d = |x| Dim3 { x, y: 1, z: 1 };
    let ask = |func, grid: Dim3, block: Dim3, cluster: Dim3| Request::OccupancyClusters {
        func,
        grid,
        block,
        shared_mem: 0,
        cluster,
        potential: false,
    };
    let good = ask(f, d(64), d(128), d(2));
    assert!(victim.request(&good).is_ok());
    let mut evil = host.guest();
    for (r, want) in [
        (good.clone(), Status::InvalidHandle),
        (ask(f, d(0), d(128), d(2)), Status::InvalidValue),
        (ask(f, d(64), d(2048), d(2)), Status::InvalidValue),
        (
            ask(f, d(64), d(128), Dim3 { x: 64, y: 32, z: 1 }),
            Status::InvalidValue,
        ),
    ] {
        let e = evil.request(&r).unwrap_err();
        assert!(
            matches!(e, guest::GuestError::Cuda(s) if s == want),
            "{r:?}: {e:?}"
        );
    }
    // Too large a cluster for the sim's GPU: the driver's own answer.
    let e = victim.request(&ask(f, d(64), d(128), d(16))).unwrap_err();
    assert!(matches!(
        e,
        guest::GuestError::Cuda(Status::InvalidClusterSize)
    ));
    assert!(victim.request(&good).is_ok());
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
}

/// Every kind of abuse at once against one VM of a daemon for a few seconds
/// (random words anywhere in its region, forged claims, ring indices past
/// the ring, descriptors pointing outside the arena, arena garbage, header
/// rewrites, a flood of doorbells, refused requests, connections made and
/// dropped or held and never read: `bench::hostile`), while in two other VMs
/// a long-lived guest and a stream of new processes run checked vector adds.
/// None of theirs fails or waits long, and the abuse costs the host's log
/// only the lines the per-VM limits let through.
#[test]
fn combined_abuse_of_one_vm_leaves_the_other_vms_alone() {
    let bin = cargo_build("cli").join("fairvgpu");
    let r = bench::hostile::measure(&bin, ExecutorKind::Sim, 0.0, 8.0, None)
        .expect("the scenario runs");
    assert!(r.daemon_alive, "the daemon died");
    let good = &r.abuse;
    eprintln!(
        "good rounds {} (failed {}), worst {:.0} ms; {} log lines; evil: {}",
        good.runs,
        good.failures,
        good.max_ms(),
        r.log_lines,
        r.evil
    );
    assert_eq!(good.failures, 0, "first failure: {:?}", good.first_failure);
    assert!(
        good.runs >= 20,
        "the good guests got {} rounds done",
        good.runs
    );
    // A new process of another VM once hung past 10 s here; a loaded
    // 2-core machine running debug builds stays far below this.
    assert!(
        good.max_ms() < 5_000.0,
        "a good guest waited {:.0} ms",
        good.max_ms()
    );
    // The abuse was real, and what it made the host log was cut.
    let cut = r.evil["log_lines_suppressed"].as_u64().unwrap_or(0);
    assert!(cut > 100, "only {cut} log lines suppressed: {}", r.evil);
    // Per VM 5 lines a minute from its ivshmem server and 5 from its
    // worker (evil's two limiters and the good VMs' servers), and 5 from
    // the grant service per vGPU.
    assert!(r.log_lines <= 40, "{} log lines in 8 s", r.log_lines);
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
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
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
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
}

/// Graphs the host builds run only the caller's own kernels, on its own
/// memory and events: another process's function, memory, event or
/// executable is refused, and so are malformed graphs; the caller's own
/// graph runs.
#[test]
fn graphs_run_only_the_callers_own_kernels_memory_and_events() {
    use protocol::graph::{encode_graph, GraphNode, GraphOp};
    use protocol::{Dim3, ImageKind, Status};
    let host = Host::start("hostile-graphs", 64 << 20);
    let mut victim = host.guest();
    let vm = victim
        .module_load(ImageKind::Ptx, fairvgpu_tests::PTX.as_bytes())
        .unwrap();
    // (Handles count per process: one more lookup than the other process
    // makes, so that this one is not also a handle of the other's.)
    victim.get_function(vm, "vector_add").unwrap();
    let their_f = victim.get_function(vm, "spin_ns").unwrap().handle;
    let theirs = victim.mem_alloc(1 << 16).unwrap();
    let their_event = victim.event_create(0).unwrap();
    let mut g = host.guest();
    let m = g
        .module_load(ImageKind::Ptx, fairvgpu_tests::PTX.as_bytes())
        .unwrap();
    let f = g.get_function(m, "spin_ns").unwrap().handle;
    let mine = g.mem_alloc(1 << 16).unwrap();
    let one = Dim3 { x: 1, y: 1, z: 1 };
    let kernel = |func| GraphNode {
        op: GraphOp::Kernel {
            func,
            grid: one,
            block: one,
            shared_mem: 0,
            params: 1000u64.to_le_bytes().to_vec(),
        },
        deps: vec![],
    };
    let copy = |dst, src| GraphNode {
        op: GraphOp::Copy {
            dst,
            src,
            len: 4096,
        },
        deps: vec![],
    };
    // The caller's own: built, launched, destroyed.
    let ok = g
        .graph_instantiate(&encode_graph(&[kernel(f), copy(mine + 4096, mine)]))
        .unwrap();
    g.graph_launch(ok, 0).unwrap();
    g.synchronize().unwrap();
    let refused = |g: &mut guest::Gpu, nodes: &[GraphNode], want: Status| {
        let e = g.graph_instantiate(&encode_graph(nodes)).unwrap_err();
        assert!(
            matches!(e, guest::GuestError::Cuda(s) if s == want),
            "{nodes:?}: {e:?}"
        );
    };
    refused(&mut g, &[kernel(their_f)], Status::InvalidHandle);
    refused(&mut g, &[copy(theirs, mine)], Status::InvalidValue);
    refused(&mut g, &[copy(mine, theirs)], Status::InvalidValue);
    refused(
        &mut g,
        &[copy(mine + (1 << 16) - 100, mine)],
        Status::InvalidValue,
    );
    refused(
        &mut g,
        &[GraphNode {
            op: GraphOp::EventRecord { event: their_event },
            deps: vec![],
        }],
        Status::InvalidHandle,
    );
    // Parameter bytes that are not the kernel's.
    let mut short = kernel(f);
    if let GraphOp::Kernel { params, .. } = &mut short.op {
        params.pop();
    }
    refused(&mut g, &[short], Status::InvalidValue);
    // Malformed: a dependency on a later node, garbage bytes.
    let mut cyclic = vec![kernel(f), kernel(f)];
    cyclic[0].deps = vec![1];
    refused(&mut g, &cyclic, Status::InvalidValue);
    let e = g.graph_instantiate(&[0xff; 64]).unwrap_err();
    assert!(matches!(e, guest::GuestError::Cuda(Status::InvalidValue)));
    // Another process's executable: neither launched nor destroyed.
    let e = victim.graph_destroy(ok).unwrap_err();
    assert!(matches!(e, guest::GuestError::Cuda(Status::InvalidHandle)));
    victim.graph_launch(ok, 0).unwrap(); // asynchronous: reported next
    let e = victim.synchronize().unwrap_err();
    assert!(matches!(e, guest::GuestError::Cuda(Status::InvalidHandle)));
    g.graph_destroy(ok).unwrap();
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
}

/// Conditional scopes and handles are the caller's own: another process's
/// scope is neither used, built in nor destroyed, a graph naming a handle
/// not made in its scope (another process's, another scope's, or none) is
/// refused at any depth, and malformed conditionals are refused; the
/// caller's own conditional graph runs, and the worker stays up.
#[test]
fn conditional_graphs_name_only_the_callers_scopes_and_handles() {
    use protocol::graph::{encode_graph, CondKind, GraphNode, GraphOp};
    use protocol::{Request, Status};
    let host = Host::start("hostile-conditional", 64 << 20);
    let mut victim = host.guest();
    // (Handles count per process: the victim's are made past the caller's,
    // so that they are not also handles of the caller's own.)
    for _ in 0..16 {
        victim.cond_scope_create().unwrap();
    }
    let their_scope = victim.cond_scope_create().unwrap();
    let their_handle = victim.cond_handle_create(their_scope, 1, 1).unwrap();
    let mut g = host.guest();
    let scope = g.cond_scope_create().unwrap();
    let other_scope = g.cond_scope_create().unwrap();
    let h = g.cond_handle_create(scope, 0, 0).unwrap();
    let other_h = g.cond_handle_create(other_scope, 0, 0).unwrap();
    let cond = |handle, bodies| GraphNode {
        op: GraphOp::Conditional {
            handle,
            kind: CondKind::If,
            bodies,
        },
        deps: vec![],
    };
    let empty = || GraphNode {
        op: GraphOp::Empty,
        deps: vec![],
    };
    let is = |r: Result<u64, guest::GuestError>, want: Status| {
        assert!(
            matches!(r, Err(guest::GuestError::Cuda(s)) if s == want),
            "{r:?}, want {want:?}"
        );
    };
    // The caller's own: built, launched (the value is 0: the body is
    // skipped), destroyed.
    let own = encode_graph(&[cond(h, vec![vec![empty()]])]);
    let x = g.graph_instantiate_in(scope, &own).unwrap();
    g.graph_launch(x, 0).unwrap();
    g.synchronize().unwrap();
    g.graph_destroy(x).unwrap();
    // Another process's scope: not built in, no handle made in it, not destroyed.
    is(
        g.graph_instantiate_in(their_scope, &own),
        Status::InvalidHandle,
    );
    is(
        g.cond_handle_create(their_scope, 0, 0),
        Status::InvalidHandle,
    );
    assert!(matches!(
        g.cond_scope_destroy(their_scope),
        Err(guest::GuestError::Cuda(Status::InvalidHandle))
    ));
    // Handles not of the scope: another process's, another scope's (deep
    // in a body), none at all (a plain GraphInstantiate).
    is(
        g.graph_instantiate_in(scope, &encode_graph(&[cond(their_handle, vec![vec![]])])),
        Status::InvalidValue,
    );
    let deep = cond(h, vec![vec![empty(), cond(other_h, vec![vec![]])]]);
    is(
        g.graph_instantiate_in(scope, &encode_graph(&[deep])),
        Status::InvalidValue,
    );
    is(g.graph_instantiate(&own), Status::InvalidValue);
    // Malformed: garbage, a WHILE with two bodies, bad flags.
    is(
        g.graph_instantiate_in(scope, &[0xff; 64]),
        Status::InvalidValue,
    );
    let mut two = encode_graph(&[cond(h, vec![vec![], vec![]])]);
    two[20] = 1; // IF -> WHILE, which takes one body
    is(g.graph_instantiate_in(scope, &two), Status::InvalidValue);
    let bad_flags = g.request(&Request::CondHandleCreate {
        scope,
        default_value: 0,
        flags: 2,
    });
    assert!(matches!(
        bad_flags,
        Err(guest::GuestError::Cuda(Status::InvalidValue))
    ));
    // The victim's scope still works; the caller's goes.
    let theirs = encode_graph(&[cond(their_handle, vec![vec![empty()]])]);
    let vx = victim.graph_instantiate_in(their_scope, &theirs).unwrap();
    victim.graph_launch(vx, 0).unwrap();
    victim.synchronize().unwrap();
    g.cond_scope_destroy(scope).unwrap();
    is(g.graph_instantiate_in(scope, &own), Status::InvalidHandle);
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
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
    let req = |g: &mut guest::Gpu, r: Request| g.request(&r).map(|x| x.vals);
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
    assert_eq!(host.stats().broken_channels.load(Ordering::Relaxed), 0);
    drop(evil);
    drop(victim);
    host.wait_program_freed();
}
