//! Module images shared between VMs through the daemon's store, against a
//! real `fairvgpu serve` (sim executor) with two VMs of two tenants: what a
//! process of one VM sent is loaded by a process of the other from its
//! hash, and the daemon's status counts it; with sharing off only the
//! process that sent it finds it again.

use std::time::Duration;

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use guest::{Gpu, GuestError};
use protocol::{image_hash, ImageKind, Request, Status};
use serde_json::Value;
use tests::{cargo_build, PTX};

fn start(name: &str, share: bool) -> DaemonProc {
    let vms = ["vm1", "vm2"].map(|n| VmSpec::new(n, 256));
    let bin = cargo_build("cli").join("fairvgpu");
    let keys = format!("share_images = {share}");
    DaemonProc::start_full(
        &bin,
        &format!("images-{name}"),
        ExecutorKind::Sim,
        &vms,
        &keys,
        "",
    )
    .expect("daemon starts")
}

fn guest(d: &DaemonProc, vm: &str) -> Gpu {
    Gpu::connect(&d.socket(vm)).expect("guest attaches")
}

fn store_status(d: &DaemonProc) -> Value {
    d.status().expect("API answers")["daemon"]["image_store"].clone()
}

/// VM `name`'s entry in the status.
fn vgpu(d: &DaemonProc, name: &str) -> Value {
    d.vgpu(name).unwrap_or_default()
}

/// The kernels' PTX padded past `protocol::CACHED_IMAGE` (a large image).
fn large_ptx() -> Vec<u8> {
    let mut p = PTX.as_bytes().to_vec();
    p.extend_from_slice(b"\n// ");
    p.resize(protocol::CACHED_IMAGE as usize + 8192, b'y');
    p.push(b'\n');
    p
}

fn ask(image: &[u8]) -> Request {
    Request::ModuleLoadCached {
        kind: ImageKind::Ptx,
        len: image.len() as u64,
        hash: image_hash(image),
    }
}

/// Waits (10 s at most) until `f` holds for the daemon's status.
fn wait_for(d: &DaemonProc, what: &str, f: impl Fn(&DaemonProc) -> bool) {
    d.wait(what, Duration::from_secs(10), f).unwrap();
}

#[test]
fn a_process_of_another_vm_loads_an_image_by_its_hash() {
    let d = start("share", true);
    let image = large_ptx();
    let mut one = guest(&d, "vm1");
    one.mem_alloc(1 << 20).unwrap();
    let m = one.module_load(ImageKind::Ptx, &image).unwrap();
    assert!(one.get_function(m, "vector_add").is_ok());
    // The worker hands the image to the store, which hashes it itself.
    wait_for(&d, "the store keeps the image", |d| {
        store_status(d)["images"].as_u64() == Some(1)
    });
    let st = store_status(&d);
    assert_eq!(st["bytes"].as_u64(), Some(image.len() as u64));
    // vm2 never saw it: its first ask by hash is a hit all the same, and
    // the module works.
    let mut two = guest(&d, "vm2");
    let m2 = two.request(&ask(&image)).unwrap().vals[0];
    assert!(two.get_function(m2, "saxpy").is_ok());
    assert_eq!(store_status(&d)["hits"].as_u64(), Some(1));
    // A hash of bytes nobody sent is a miss.
    let mut other = image.clone();
    *other.last_mut().unwrap() = b' ';
    let e = two.request(&ask(&other)).unwrap_err();
    assert!(matches!(e, GuestError::Cuda(Status::NotFound)), "{e:?}");
    // The status counts each VM's contexts: vm1's next process gets the
    // first's, once the first is gone.
    wait_for(&d, "vm1's first process's memory in the status", |d| {
        vgpu(d, "vm1")["memory_used_bytes"].as_u64() > Some(0)
    });
    drop(one);
    wait_for(&d, "vm1's first process to be gone", |d| {
        vgpu(d, "vm1")["memory_used_bytes"].as_u64() == Some(0)
    });
    let _again = guest(&d, "vm1");
    wait_for(&d, "vm1's contexts in the status", |d| {
        let v = vgpu(d, "vm1");
        v["contexts_created"].as_u64() == Some(1) && v["contexts_reused"].as_u64() == Some(1)
    });
}

#[test]
fn with_sharing_off_each_vm_sends_its_own() {
    let d = start("off", false);
    let image = large_ptx();
    let mut one = guest(&d, "vm1");
    one.module_load(ImageKind::Ptx, &image).unwrap();
    // The process itself finds it again (its worker's cache)...
    assert!(one.request(&ask(&image)).is_ok());
    // ...no other process does, of its VM (a worker of its own) or of
    // another, and there is no store.
    for vm in ["vm1", "vm2"] {
        let e = guest(&d, vm).request(&ask(&image)).unwrap_err();
        assert!(
            matches!(e, GuestError::Cuda(Status::NotFound)),
            "{vm}: {e:?}"
        );
    }
    assert!(store_status(&d).is_null());
    assert!(!d.dir.join("images.sock").exists());
}
