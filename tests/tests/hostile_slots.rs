//! A hostile guest process in a VM with process slots (`[[vm]]
//! process_slots`): one that claims a channel in another process's slot
//! itself and says `Hello` there is turned away, so that no process shares
//! another's worker process (its faults and its address space).

use std::time::{Duration, Instant};

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use tests::cargo_build;

/// A guest process that forces its way into another's slot (claiming a
/// channel there itself and saying `Hello` on it) is turned away: a slot's
/// worker serves one process, so none shares another's worker process.
#[test]
fn a_second_process_in_a_slot_is_turned_away() {
    use guest::{descriptor, Gpu};
    use protocol::{Request, Status};
    use transport::server::Client;

    let mut vm = VmSpec::new("vm1", 256);
    vm.process_slots = 2;
    let d = DaemonProc::start(
        &cargo_build("cli").join("fairvgpu"),
        "slot-intruder",
        ExecutorKind::Sim,
        &[vm],
    )
    .unwrap();
    let sock = d.socket("vm1");
    let mut owner = Gpu::connect_with(&sock, tests::TEST_SPIN).unwrap();
    let p = owner.mem_alloc(1 << 20).unwrap();

    let client = Client::connect(&sock, Duration::from_secs(5)).unwrap();
    let mut ch = client
        .region
        .claim_in_slot(0, u32::from(client.id), 1, 0)
        .unwrap();
    assert_eq!(ch.index(), 1, "a channel of the owner's slot");
    let hello = Request::Hello {
        version: protocol::PROTOCOL_VERSION,
    };
    assert!(ch.req.try_send(&descriptor(&hello, 1), &[]).unwrap());
    let mut buf = Vec::new();
    let t = Instant::now();
    let reply = loop {
        if let Some(r) = ch.resp.try_recv(&mut buf).unwrap() {
            break r;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no reply");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(Status::from_code(reply.status), Status::NotPermitted);
    // The owner is served on.
    owner.mem_free(p).unwrap();
}
