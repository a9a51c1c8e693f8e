//! Real QEMU attaches to our ivshmem server: its `ivshmem-doorbell` device
//! takes the region and the doorbells, and exposes the region as BAR2.
//! Skips when QEMU is not installed, unless FAIRVGPU_REQUIRE_QEMU=1 (CI).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use transport::qmp::Qmp;
use transport::server::{serve, PeerEvent};
use transport::{LayoutParams, Region};

fn qemu() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/bin/qemu-system-x86_64");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var("FAIRVGPU_REQUIRE_QEMU").is_err(),
        "FAIRVGPU_REQUIRE_QEMU is set but qemu-system-x86_64 is missing"
    );
    eprintln!("skipping: qemu-system-x86_64 not installed");
    None
}

#[test]
fn qemu_ivshmem_doorbell_attaches_to_our_server() {
    let Some(qemu) = qemu() else { return };
    let dir = scratch::dir("fvg-qemu");
    let sock = dir.join("ivshmem.sock");
    let qmp_sock = dir.join("qmp.sock");
    let params = LayoutParams {
        channels: 2,
        ring_entries: 16,
        arena_size: 64 << 10,
        vectors: 2,
        pinned_size: 0,
        partitions: 1,
    };
    let (region, fd) = Region::create("qemu-test", params).unwrap();
    let server = serve(&sock, fd, params.vectors).unwrap();

    let mut child = Command::new(qemu)
        .args([
            "-machine",
            "pc",
            "-accel",
            "tcg",
            "-nodefaults",
            "-display",
            "none",
            "-S",
        ])
        .args([
            "-chardev",
            &format!("socket,path={},id=vgpu", sock.display()),
        ])
        .args([
            "-device",
            "ivshmem-doorbell,chardev=vgpu,vectors=2,id=vgpu0",
        ])
        .args([
            "-qmp",
            &format!("unix:{},server=on,wait=off", qmp_sock.display()),
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("start qemu");

    let ev = server.events.recv_timeout(Duration::from_secs(30));
    assert!(
        matches!(ev, Ok(PeerEvent::Connected(_))),
        "QEMU did not connect: {ev:?}"
    );

    let start = Instant::now();
    let mut qmp = loop {
        match Qmp::connect(&qmp_sock, Duration::from_secs(10)) {
            Ok(q) => break q,
            Err(_) if start.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("QMP: {e}"),
        }
    };
    let devs = qmp.find_pci(0x1af4, 0x1110).unwrap();
    assert_eq!(devs.len(), 1, "one ivshmem device expected: {devs:?}");
    let bar2 = devs[0].bars.iter().find(|(i, _)| *i == 2).map(|(_, s)| *s);
    assert_eq!(
        bar2,
        Some(region.layout().region_size as u64),
        "BAR2 must be our region"
    );
    assert!(!qmp.vcpu_threads().unwrap().is_empty());

    // QEMU is a peer like any other: when it exits the server reports it.
    let _ = qmp.execute("quit", serde_json::json!({}));
    let _ = child.wait();
    let ev = server.events.recv_timeout(Duration::from_secs(10));
    assert!(
        matches!(ev, Ok(PeerEvent::Gone(_))),
        "departure not seen: {ev:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
