//! A VM's export table (`worker::exports`) as another worker could leave
//! it: raw writes to any word mixed with publishes, lookups, opens,
//! closes, revocations and gone lanes, in any order: no panic, and every
//! entry read back is sound (a known kind, a slot of the region, a size
//! a GPU could hold, an index of the table).
#![no_main]
use libfuzzer_sys::fuzz_target;
use transport::shm::SharedMemory;
use worker::exports::{Kind, Publish, VmExports, ENTRIES, EXPORTS_SIZE, MAX_SIZE};

fn check(e: &worker::exports::Entry) {
    assert!(usize::from(e.index) < ENTRIES);
    assert!(e.size <= MAX_SIZE);
    assert!(e.owner < transport::layout::MAX_PARTITIONS);
    assert!(matches!(
        e.kind,
        Kind::Mem | Kind::Event | Kind::Phys | Kind::Pool
    ));
}

fuzz_target!(|data: &[u8]| {
    let fd = VmExports::create("fuzz-exports").expect("memfd");
    let raw = SharedMemory::map(fd.try_clone().expect("dup"), EXPORTS_SIZE).expect("map");
    let t = VmExports::shared(fd).expect("table");
    for op in data.chunks_exact(10) {
        // Past the table's end too: those must name nothing.
        let i = u16::from_le_bytes([op[1], op[2]]) % 600;
        let mut w = [0u8; 8];
        w.copy_from_slice(&op[2..10]);
        let v = u64::from_le_bytes(w);
        let gen = (v & 0xff_ffff) as u32;
        let slot = u32::from(op[1]);
        match op[0] % 8 {
            0 => {
                let at = (usize::from(i) % ENTRIES) * 128 + usize::from(op[1] % 16) * 8;
                raw.atomic_u64(at)
                    .expect("in the table")
                    .store(v, std::sync::atomic::Ordering::Release);
            }
            1 => {
                if let Some(e) = t.find(v) {
                    check(&e);
                }
            }
            2 => {
                let _ = t.open(i, gen, slot);
            }
            3 => t.close(i, gen, slot),
            4 => t.revoke(i, gen),
            5 => t.lane_ended(slot, &[(i, gen)]),
            6 => {
                let _ = t.publish(&Publish {
                    token: v,
                    kind: Kind::Mem,
                    owner: slot % 16,
                    size: v >> 24,
                    handle: [op[1]; 64],
                    has_fd: op[1] & 1 == 0,
                });
            }
            _ => {
                if let Some(e) = t.entry(i, gen) {
                    check(&e);
                    assert_eq!((e.index, e.gen), (i, gen));
                }
            }
        }
    }
});
