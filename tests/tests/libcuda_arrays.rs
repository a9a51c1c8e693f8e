//! CUDA arrays, texture and surface objects from a C program through the
//! stand-in, against a sim worker: every copy path with an array at one
//! end round-trips its bytes, descriptors read back as made, what must be
//! refused is, and the arrays' memory, counted against the vGPU's limit
//! while they live, all comes back.

use std::sync::atomic::Ordering;
use std::time::Duration;

use protocol::array::ArrayDesc;
use protocol::Request;
use tests::{assert_lines, build_c_standin, run_program, standin, Host};

#[test]
fn arrays_through_the_standin_round_trip_refuse_and_leak_nothing() {
    let host = Host::start("arrays", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c_standin("arrays", &dir, &lib, &[]);
    let out = run_program(&exe, &["strict"], &lib.to_string_lossy(), &host.socket, &[]);
    assert_lines(
        &out,
        &[
            "ok: array of an unknown format refused",
            "ok: array of three channels refused",
            "ok: 1D descriptor",
            "ok: HtoA then AtoH",
            "ok: DtoA then AtoD",
            "ok: AtoA",
            "ok: HtoAAsync then AtoHAsync",
            "ok: copy past a 1D array's end refused",
            "ok: copy out past a 1D array's end refused",
            "ok: 2D descriptor",
            "ok: 2D host to array to host",
            "ok: 2D device to array to device",
            "ok: 2D copy past a row's end refused",
            "ok: 2D copy past the last row refused",
            "ok: 3D descriptor",
            "ok: 3D host to array to host (a box)",
            "ok: 3D array to array to device",
            "ok: 3D device to array's last slice",
            "ok: 3D copy past the last slice refused",
            "ok: layered host to array to host",
            "ok: texture's resource",
            "ok: texture's description",
            "ok: linear texture's resource",
            "ok: pitched texture's resource",
            "ok: texture over freed memory refused",
            "ok: pitched texture past its allocation refused",
            "ok: linear float2 texture past its allocation made",
            "ok: surface's resource",
            "ok: surface over an array without SURFACE_LDST made, as the driver makes it",
            "arrays: all freed",
        ],
    );
    host.wait_program_freed();

    // Counted while it lives; given back when destroyed, and when its
    // process ends holding one.
    let mem = |s: &worker::serve::Stats| s.mem_used.load(Ordering::Relaxed);
    let desc = ArrayDesc {
        width: 1024,
        height: 1024,
        depth: 0,
        format: 0x20,
        channels: 4,
        flags: 0,
    };
    let mut g = host.guest();
    let r = g.request(&Request::ArrayCreate { desc }).unwrap();
    assert!(r.vals[1] >= 16 << 20, "counted {}", r.vals[1]);
    assert_eq!(mem(&host.stats()), r.vals[1]);
    g.request(&Request::ArrayDestroy { array: r.vals[0] })
        .unwrap();
    assert_eq!(mem(&host.stats()), 0);
    g.request(&Request::ArrayCreate { desc }).unwrap();
    assert!(mem(&host.stats()) > 0);
    drop(g);
    host.wait_until("the ended process's array", Duration::from_secs(10), |s| {
        mem(s) == 0
    });
}
