//! A guest process's context goes, made clean, to the vGPU's next process:
//! the next one is served without a new context, and finds nothing of the
//! first's (its memory, its modules).

use std::sync::atomic::Ordering;
use std::time::Duration;

use protocol::ImageKind;
use tests::{Host, PTX};

#[test]
fn the_next_process_gets_the_ended_ones_context_and_nothing_of_its_work() {
    let host = Host::start("contexts", 64 << 20);
    let stats = host.stats();
    let mut first = host.guest();
    let m = first.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
    assert!(first.get_function(m, "vector_add").is_ok());
    let p = first.mem_alloc(1 << 16).unwrap();
    first.memcpy_htod(p, &[0x5a; 1 << 16]).unwrap();
    first.synchronize().unwrap();
    assert_eq!(stats.contexts_created.load(Ordering::Relaxed), 1);
    drop(first);
    host.wait_until(
        "the first process to be gone",
        Duration::from_secs(10),
        |s| s.mem_used.load(Ordering::Relaxed) == 0,
    );
    let mut second = host.guest();
    assert_eq!(stats.contexts_created.load(Ordering::Relaxed), 1);
    assert_eq!(stats.contexts_reused.load(Ordering::Relaxed), 1);
    // The first's module and memory are not the second's.
    assert!(second.get_function(m, "vector_add").is_err());
    assert!(second.mem_free(p).is_err());
    // What it allocates reads as zeroes, not the first's bytes.
    let q = second.mem_alloc(1 << 16).unwrap();
    let mut out = vec![0xffu8; 1 << 16];
    second.memcpy_dtoh(&mut out, q, 0).unwrap();
    assert!(out.iter().all(|&b| b == 0));
    // And it works as a new one would.
    let m2 = second.module_load(ImageKind::Ptx, PTX.as_bytes()).unwrap();
    assert!(second.get_function(m2, "saxpy").is_ok());
    // Two processes at once: the second of them needs a context of its own.
    let _third = host.guest();
    assert_eq!(stats.contexts_created.load(Ordering::Relaxed), 2);
}
