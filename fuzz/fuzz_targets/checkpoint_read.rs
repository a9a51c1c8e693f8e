//! A vGPU checkpoint from a hostile peer or file: any description and
//! bytes, framed and tagged as a writer would (so that the fuzzer gets past
//! the tag to the parsing and the checks). No panic, no allocation past the
//! limits, and what is read back passes every context's check. Read as a
//! copied stream checking its own tag, and as a mapped memfd checked by its
//! carrier (as a restoring worker reads it), both alike.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::io::Write as _;
use std::sync::Arc;

use worker::checkpoint::{read, read_mapped, stream_tag, Check, Limits, Mapped, MAGIC, VERSION};

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let n = usize::from(u16::from_le_bytes([data[0], data[1]])).min(data.len() - 2);
    let (description, blobs) = data[2..].split_at(n);
    let mut s = Vec::new();
    s.extend_from_slice(&MAGIC);
    s.extend_from_slice(&VERSION.to_le_bytes());
    s.extend_from_slice(&0u32.to_le_bytes());
    s.extend_from_slice(&(n as u64).to_le_bytes());
    s.extend_from_slice(description);
    let tag = stream_tag(None, &s, &[blobs]);
    s.extend_from_slice(blobs);
    s.extend_from_slice(&tag);
    let limits = Limits {
        description: 1 << 16,
        memory: 1 << 20,
        images: 1 << 20,
        sessions: 8,
    };
    let copied = read(&mut s.as_slice(), Check::Own(None), &limits);
    if let Ok(image) = &copied {
        assert!(image.memory_bytes() <= limits.memory);
        for session in &image.sessions {
            session.context.check().expect("read back checked");
        }
    }
    let fd = nix::sys::memfd::memfd_create(c"fuzz", nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING)
        .expect("a memfd");
    let mut f = std::fs::File::from(fd);
    f.write_all(&s).expect("filled");
    let map = Mapped::of(&std::os::fd::OwnedFd::from(f)).expect("mapped");
    let in_place = read_mapped(Arc::new(map), Check::Carried, &limits);
    assert_eq!(copied.ok(), in_place.ok(), "read alike, in place or copied");
});
