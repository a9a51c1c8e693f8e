//! Module images shared between VMs through the daemon's store, against a
//! real `fairvgpu serve` (sim executor) with two VMs of two tenants: what a
//! process of one VM sent is loaded by a process of the other from its
//! hash, and the daemon's status counts it; with sharing off it is not.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use fairvgpu_tests::{cargo_build, PTX};
use guest_frontend::{Gpu, GuestError};
use host_backend::control::{client_call, ApiTarget};
use protocol::{image_hash, ImageKind, Request, Status};
use serde_json::Value;

struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(name: &str, share: bool) -> Daemon {
    let dir = std::env::temp_dir().join(format!("fvg-images-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = format!(
        "[daemon]\nrun_dir = {:?}\nexecutor = \"sim\"\nshare_images = {share}\n",
        dir.display().to_string()
    );
    for vm in ["vm1", "vm2"] {
        cfg.push_str(&format!(
            "\n[[vm]]\nname = \"{vm}\"\ntenant = \"{vm}\"\nmemory_limit_mib = 256\n"
        ));
    }
    std::fs::write(dir.join("host.toml"), cfg).unwrap();
    let child = Command::new(cargo_build("fairvgpu").join("fairvgpu"))
        .args(["serve", "--config"])
        .arg(dir.join("host.toml"))
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("daemon starts");
    let d = Daemon { child, dir };
    let deadline = Instant::now() + Duration::from_secs(30);
    for s in ["api.sock", "vm1.sock", "vm2.sock"] {
        while !d.dir.join(s).exists() {
            assert!(Instant::now() < deadline, "{s} did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    d
}

fn guest(d: &Daemon, vm: &str) -> Gpu {
    Gpu::connect(&d.dir.join(format!("{vm}.sock"))).expect("guest attaches")
}

fn status(d: &Daemon) -> Value {
    let (code, body) = client_call(
        &ApiTarget::Unix(d.dir.join("api.sock")),
        "GET",
        "/api/v1/status",
        b"",
    )
    .expect("API answers");
    assert_eq!(code, 200);
    serde_json::from_slice(&body).unwrap()
}

fn store_status(d: &Daemon) -> Value {
    status(d)["daemon"]["image_store"].clone()
}

/// VM `name`'s entry in the status.
fn vgpu(d: &Daemon, name: &str) -> Value {
    status(d)["gpus"][0]["vgpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .cloned()
        .unwrap_or_default()
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

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
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
    wait_for("the store keeps the image", || {
        store_status(&d)["images"].as_u64() == Some(1)
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
    wait_for("vm1's first process's memory in the status", || {
        vgpu(&d, "vm1")["memory_used_bytes"].as_u64() > Some(0)
    });
    drop(one);
    wait_for("vm1's first process to be gone", || {
        vgpu(&d, "vm1")["memory_used_bytes"].as_u64() == Some(0)
    });
    let _again = guest(&d, "vm1");
    wait_for("vm1's contexts in the status", || {
        let v = vgpu(&d, "vm1");
        v["contexts_created"].as_u64() == Some(1) && v["contexts_reused"].as_u64() == Some(1)
    });
}

#[test]
fn with_sharing_off_each_vm_sends_its_own() {
    let d = start("off", false);
    let image = large_ptx();
    let mut one = guest(&d, "vm1");
    one.module_load(ImageKind::Ptx, &image).unwrap();
    // vm1's own next process finds it (its worker's cache)...
    assert!(guest(&d, "vm1").request(&ask(&image)).is_ok());
    // ...vm2's does not, and there is no store.
    let e = guest(&d, "vm2").request(&ask(&image)).unwrap_err();
    assert!(matches!(e, GuestError::Cuda(Status::NotFound)), "{e:?}");
    assert!(store_status(&d).is_null());
    assert!(!Path::new(&d.dir.join("images.sock")).exists());
}
