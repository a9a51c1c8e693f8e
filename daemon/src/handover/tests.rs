use super::*;
use crate::save_file::Lane;
use std::fs::File;
use std::sync::Mutex;

struct Taker {
    got: Mutex<Vec<(String, u64, usize, Purpose)>>,
}

impl Receiver for Taker {
    fn limits(&self, vm: &str) -> Option<FileLimits> {
        (vm == "vm1").then_some(FileLimits {
            slots: 4,
            lane_bytes: 1 << 20,
            region: 8192,
        })
    }

    fn arrived(&self, saved: Saved, purpose: Purpose, answer: Sender<Result<String, String>>) {
        let region = saved.region.as_ref().map_or(0, |r| r.1);
        self.got
            .lock()
            .unwrap()
            .push((saved.vm.clone(), region, saved.lanes.len(), purpose));
        let _ = answer.send(Ok(format!("{}: taken", saved.vm)));
    }
}

fn memfd_of(bytes: &[u8]) -> std::os::fd::OwnedFd {
    let fd = save_file::memfd("t").unwrap();
    File::from(fd.try_clone().unwrap())
        .write_all(bytes)
        .unwrap();
    fd
}

fn saved(vm: &str, region: u64) -> Saved {
    Saved {
        vm: vm.into(),
        region: Some((
            memfd_of(&vec![9u8; usize::try_from(region).unwrap()]),
            region,
        )),
        lanes: vec![Lane {
            slot: 1,
            stream: memfd_of(b"a stream"),
            len: 8,
        }],
    }
}

const KEY: &[u8] = b"0123456789abcdef";

fn listening() -> (String, Arc<Taker>) {
    let probe = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap().to_string();
    drop(probe);
    let t = Arc::new(Taker {
        got: Mutex::new(Vec::new()),
    });
    listen(&addr, KEY.to_vec(), t.clone()).unwrap();
    (addr, t)
}

#[test]
fn a_peer_with_the_key_hands_over_and_hears_the_word() {
    let (addr, t) = listening();
    let line = send(&addr, KEY, &saved("vm1", 8192), Purpose::Handover).unwrap();
    assert_eq!(line, "vm1: taken");
    let ahead = Saved {
        region: None,
        ..saved("vm1", 8192)
    };
    send(&addr, KEY, &ahead, Purpose::Ahead).unwrap();
    assert_eq!(
        *t.got.lock().unwrap(),
        [
            ("vm1".to_owned(), 8192, 1, Purpose::Handover),
            ("vm1".to_owned(), 0, 1, Purpose::Ahead)
        ]
    );
}

/// Connects to `addr` and proves `key` for purpose byte `said` under a
/// proof made for `proved`: the receiver's answer to the proof.
fn prove(addr: &str, said: u8, proved: u8) -> Result<u8, String> {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut hello = [0u8; 40];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&[said]).unwrap();
    s.write_all(&proof_tag(KEY, &hello[8..], proved).finish())
        .unwrap();
    let mut head = [0u8; 3];
    s.read_exact(&mut head[..1]).unwrap();
    if head[0] == GO_ON {
        return Ok(GO_ON);
    }
    s.read_exact(&mut head[1..]).unwrap();
    verdict_after(&s, head, addr).map(|_| head[0])
}

#[test]
fn a_purpose_other_than_the_one_proved_or_unknown_is_refused() {
    let (addr, t) = listening();
    assert_eq!(prove(&addr, 1, 1), Ok(GO_ON));
    let e = prove(&addr, 1, 0).unwrap_err();
    assert!(e.contains("proof does not match"), "{e}");
    let e = prove(&addr, 0, 1).unwrap_err();
    assert!(e.contains("proof does not match"), "{e}");
    let e = prove(&addr, 7, 7).unwrap_err();
    assert!(e.contains("purpose 7 unknown"), "{e}");
    assert!(t.got.lock().unwrap().is_empty());
}

#[test]
fn a_wrong_key_another_region_or_an_unknown_vm_is_refused_and_nothing_arrives() {
    let (addr, t) = listening();
    let e = send(
        &addr,
        b"fedcba9876543210",
        &saved("vm1", 8192),
        Purpose::Handover,
    )
    .unwrap_err();
    assert!(e.contains("proof does not match"), "{e}");
    let e = send(&addr, KEY, &saved("vm1", 4096), Purpose::Handover).unwrap_err();
    assert!(e.contains("region of 4096 bytes"), "{e}");
    let e = send(&addr, KEY, &saved("vm9", 8192), Purpose::Handover).unwrap_err();
    assert!(e.contains("no [[vm]]"), "{e}");
    assert!(t.got.lock().unwrap().is_empty());
}

#[test]
fn a_port_that_is_not_a_daemon_is_named() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n........");
        }
    });
    let e = send(&addr, KEY, &saved("vm1", 8192), Purpose::Handover).unwrap_err();
    assert!(e.contains("not a fairvgpu daemon"), "{e}");
}

#[test]
fn a_busy_receiver_says_so_before_its_hello() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Ok((s, _)) = l.accept() {
            let _ = verdict(&s, Err("this host takes another vGPU now; try again"));
        }
    });
    let e = send(&addr, KEY, &saved("vm1", 8192), Purpose::Handover).unwrap_err();
    assert!(
        e.ends_with("refused it: this host takes another vGPU now; try again"),
        "{e}"
    );
}

#[test]
fn a_peer_with_the_key_whose_region_blocks_are_malformed_is_refused() {
    let (addr, t) = listening();
    let mut s = TcpStream::connect(&addr).unwrap();
    let mut hello = [0u8; 40];
    s.read_exact(&mut hello).unwrap();
    let nonce = &hello[8..];
    s.write_all(&[0]).unwrap();
    s.write_all(&proof_tag(KEY, nonce, 0).finish()).unwrap();
    let mut go = [0u8];
    s.read_exact(&mut go).unwrap();
    assert_eq!(go[0], GO_ON);
    let (mut bytes, _) =
        save_file::write_to(Vec::new(), &saved("vm1", 8192), Some(KEY), nonce).unwrap();
    // Magic, version, flags, the name's length and "vm1", the region's
    // length: then its one block's marker, made one neither zero nor bytes.
    let marker = 8 + 4 + 4 + 2 + 3 + 8;
    assert_eq!(bytes[marker], 1);
    bytes[marker] = 7;
    let _ = s.write_all(&bytes);
    let mut head = [0u8; 3];
    s.read_exact(&mut head).unwrap();
    let why = verdict_after(&s, head, &addr).unwrap_err();
    assert!(
        why.contains("refused it") && why.contains("marked 7"),
        "{why}"
    );
    assert!(t.got.lock().unwrap().is_empty());
}

#[test]
fn a_stream_refused_at_its_head_gets_its_verdict_to_the_sender_mid_stream() {
    // 64 MiB of region to send; the receiver refuses it on its length,
    // having read ahead one chunk, and the sender still gets its reason.
    let (addr, t) = listening();
    let e = send(&addr, KEY, &saved("vm1", 64 << 20), Purpose::Handover).unwrap_err();
    assert!(
        e.contains("refused it") && e.contains("region of 67108864 bytes"),
        "{e}"
    );
    assert!(t.got.lock().unwrap().is_empty());
}
