//! A region header written by a hostile peer: opening it is an error or a
//! consistent layout, never a panic or an access past the memory.
#![no_main]
use std::io::Write;
use std::os::fd::OwnedFd;

use libfuzzer_sys::fuzz_target;
use transport::Region;

fuzz_target!(|data: &[u8]| {
    let size = 8192usize;
    let fd: OwnedFd = transport::shm::create_memfd("fuzz", size).expect("memfd");
    let mut f = std::fs::File::from(fd.try_clone().expect("dup"));
    let n = data.len().min(size);
    f.write_all(&data[..n]).expect("write");
    if let Ok(r) = Region::open(fd) {
        let l = r.layout();
        assert!(l.region_size <= size);
        assert!(l.channel_offset(l.params.channels - 1) + l.channel_stride <= l.region_size);
    }
});
