//! Real QEMU attaches to our ivshmem server: its `ivshmem-doorbell` device
//! takes the region and the doorbells, and exposes the region as BAR2.
//! The device is `master=on`, the kind whose region QEMU migrates: it
//! starts only as peer 0, again after a restart, and QEMU's migration is
//! not blocked. Skips when QEMU is not installed, unless
//! FAIRVGPU_REQUIRE_QEMU=1 (CI).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use transport::qmp::Qmp;
use transport::server::{serve, PeerEvent, ServerHandle, FIRST_PEER};
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
    let server = serve(&sock, fd, &region).unwrap();

    let mut child = start_qemu(&qemu, &sock, &qmp_sock);
    expect_peer_0(&server);
    let mut qmp = connect_qmp(&qmp_sock);
    let devs = qmp.find_pci(0x1af4, 0x1110).unwrap();
    assert_eq!(devs.len(), 1, "one ivshmem device expected: {devs:?}");
    let bar2 = devs[0].bars.iter().find(|(i, _)| *i == 2).map(|(_, s)| *s);
    assert_eq!(
        bar2,
        Some(region.layout().region_size as u64),
        "BAR2 must be our region"
    );
    assert!(!qmp.vcpu_threads().unwrap().is_empty());

    // Not blocked: the paused VM migrates (to nowhere), region included.
    qmp.execute(
        "migrate",
        serde_json::json!({"uri": "exec:cat > /dev/null"}),
    )
    .expect("QEMU takes the migration: no blocker");
    let t = Instant::now();
    let status = loop {
        let r = qmp.execute("query-migrate", serde_json::json!({})).unwrap();
        let s = r["status"].as_str().unwrap_or("").to_owned();
        if matches!(s.as_str(), "completed" | "failed" | "cancelled") {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "migration stuck: {r}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, "completed");

    // QEMU is a peer like any other: when it exits the server reports it.
    quit(&mut qmp, &mut child);
    let ev = server.events.recv_timeout(Duration::from_secs(10));
    assert!(
        matches!(ev, Ok(PeerEvent::Gone(FIRST_PEER))),
        "departure not seen: {ev:?}"
    );
    // The VM's next QEMU (a restart) is peer 0 again, or would not start.
    let _ = std::fs::remove_file(&qmp_sock);
    let mut child = start_qemu(&qemu, &sock, &qmp_sock);
    expect_peer_0(&server);
    let mut qmp = connect_qmp(&qmp_sock);
    quit(&mut qmp, &mut child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A paused QEMU with a `master=on` doorbell device on `sock`.
fn start_qemu(qemu: &Path, sock: &Path, qmp_sock: &Path) -> Child {
    Command::new(qemu)
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
            "ivshmem-doorbell,chardev=vgpu,vectors=2,master=on,id=vgpu0",
        ])
        .args([
            "-qmp",
            &format!("unix:{},server=on,wait=off", qmp_sock.display()),
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("start qemu")
}

fn expect_peer_0(server: &ServerHandle) {
    let ev = server.events.recv_timeout(Duration::from_secs(30));
    assert!(
        matches!(ev, Ok(PeerEvent::Connected(FIRST_PEER))),
        "QEMU did not connect as peer 0: {ev:?}"
    );
}

fn connect_qmp(qmp_sock: &Path) -> Qmp {
    let start = Instant::now();
    loop {
        match Qmp::connect(qmp_sock, Duration::from_secs(10)) {
            Ok(q) => return q,
            Err(_) if start.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("QMP: {e}"),
        }
    }
}

fn quit(qmp: &mut Qmp, child: &mut Child) {
    let _ = qmp.execute("quit", serde_json::json!({}));
    let _ = child.wait();
}
