//! The host keeps the module images its vGPU's processes loaded, by
//! content: a second process loading the same large image sends its hash,
//! not its bytes, and gets a working module; a hash the host has not seen,
//! or of another kind or length, is an ordinary miss.

use protocol::{image_hash, ImageKind, Request, Status};
use tests::{Host, PTX};

/// The kernels' PTX padded with a comment to more than
/// `protocol::CACHED_IMAGE` bytes (a large image).
fn large_ptx() -> Vec<u8> {
    let mut p = PTX.as_bytes().to_vec();
    p.extend_from_slice(b"\n// ");
    p.resize(protocol::CACHED_IMAGE as usize + 4096, b'x');
    p.push(b'\n');
    p
}

#[test]
fn a_second_process_loads_a_large_image_by_its_hash() {
    let host = Host::start("image-cache", 64 << 20);
    let image = large_ptx();
    let hash = image_hash(&image);
    let len = image.len() as u64;
    let ask = |kind, len| Request::ModuleLoadCached { kind, len, hash };
    let mut first = host.guest();
    // Not seen yet: a miss.
    let e = first.request(&ask(ImageKind::Ptx, len)).unwrap_err();
    assert!(
        matches!(e, guest::GuestError::Cuda(Status::NotFound)),
        "{e:?}"
    );
    // The first process sends the bytes (after its own miss).
    let m = first.module_load(ImageKind::Ptx, &image).unwrap();
    assert!(first.get_function(m, "vector_add").is_ok());
    // A second process: a hit, and a module that works.
    let mut second = host.guest();
    let m2 = second.request(&ask(ImageKind::Ptx, len)).unwrap().vals[0];
    assert!(second.get_function(m2, "vector_add").is_ok());
    // Another kind or length is a miss.
    for r in [ask(ImageKind::Cubin, len), ask(ImageKind::Ptx, len - 1)] {
        let e = second.request(&r).unwrap_err();
        assert!(
            matches!(e, guest::GuestError::Cuda(Status::NotFound)),
            "{e:?}"
        );
    }
    // And module_load itself takes the cached path (a third process).
    let mut third = host.guest();
    let m3 = third.module_load(ImageKind::Ptx, &image).unwrap();
    assert!(third.get_function(m3, "spin_ns").is_ok());
}
