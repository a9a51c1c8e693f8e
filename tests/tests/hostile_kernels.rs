//! A guest process that names kernels, graphs or conditional scopes it does
//! not own, or asks what only a monitor or the owner may ask (another's
//! kernel list, the vGPU's status on a session, another's kernel output),
//! is refused; its channel lives on and the worker serves on.

use std::sync::atomic::Ordering;

use tests::hostile::assert_no_broken_channel;
use tests::Host;

/// Listing another process's module's kernels is refused, a list from
/// past the end is empty, and the owner's own list is whole.
#[test]
fn kernel_lists_of_foreign_modules_are_refused() {
    use protocol::{ImageKind, Request, Status};
    let host = Host::start("hostile-kernel-list", 64 << 20);
    let mut victim = host.guest();
    let m = victim
        .module_load(ImageKind::Ptx, tests::PTX.as_bytes())
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
    assert_no_broken_channel(&host);
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

    let mut evil = Gpu::monitor(&host.socket, tests::TEST_SPIN).unwrap();
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
    assert_no_broken_channel(&host);
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

    let mut monitor = Gpu::monitor(&host.socket, tests::TEST_SPIN).unwrap();
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
    assert_no_broken_channel(&host);
}

/// Cluster occupancy questions about another process's kernel, or of a
/// shape no launch may have, are refused; the channel lives on.
#[test]
fn cluster_occupancy_of_foreign_kernels_and_bad_shapes_is_refused() {
    use protocol::{Dim3, ImageKind, Request, Status};
    let host = Host::start("hostile-clusters", 64 << 20);
    let mut victim = host.guest();
    let m = victim
        .module_load(ImageKind::Ptx, tests::PTX.as_bytes())
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
    assert_no_broken_channel(&host);
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
        .module_load(ImageKind::Ptx, tests::PTX.as_bytes())
        .unwrap();
    // (Handles count per process: one more lookup than the other process
    // makes, so that this one is not also a handle of the other's.)
    victim.get_function(vm, "vector_add").unwrap();
    let their_f = victim.get_function(vm, "spin_ns").unwrap().handle;
    let theirs = victim.mem_alloc(1 << 16).unwrap();
    let their_event = victim.event_create(0).unwrap();
    let mut g = host.guest();
    let m = g
        .module_load(ImageKind::Ptx, tests::PTX.as_bytes())
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
            cluster: Default::default(),
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
    assert_no_broken_channel(&host);
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
    assert_no_broken_channel(&host);
}
