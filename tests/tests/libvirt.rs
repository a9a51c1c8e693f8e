//! libvirt domains get and give back their vGPUs: the operator guide's
//! libvirt walkthrough (`tests/libvirt/walkthrough.sh`) against a real
//! libvirtd, with TCG domains of the test guest (vm-images/) on a daemon
//! with the sim executor: a bad weight and an unknown GPU refuse to start
//! naming the field, two domains at weights 1:2 compute through their vGPUs
//! and share by weight, `virsh metadata` sets a weight live, a libvirtd
//! restart leaves a running domain's vGPU working, `virsh destroy` frees
//! the vGPU (status, socket and vCPU file). And only `fairvgpu-libvirt`
//! links libvirt, not `fairvgpu`.
//!
//! Needs root, libvirt-daemon-system (libvirtd, virsh) and what the VM tests
//! need (scripts/check installs them). Skips, saying why, without them,
//! unless FAIRVGPU_REQUIRE_LIBVIRT=1 (CI), where their absence fails. It
//! starts libvirtd itself where none runs (CI has no systemd), and restarts
//! one that runs (libvirtd finds hooks when it starts).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use tests::{cargo_build, workspace};

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .chain([Path::new("/usr/sbin").to_owned()])
                .any(|d| d.join(bin).exists())
        })
        .unwrap_or(false)
}

fn prerequisites() -> bool {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root (libvirtd and its hooks)".to_owned());
    }
    for (bin, pkg) in [
        ("libvirtd", "libvirt-daemon-system"),
        ("virsh", "libvirt-clients"),
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("busybox", "busybox-static"),
        ("cpio", "cpio"),
    ] {
        if !on_path(bin) {
            missing.push(pkg.to_owned());
        }
    }
    let headers = std::fs::read_dir("/usr/src")
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with("-amd64"))
        })
        .unwrap_or(false);
    if !headers {
        missing.push("linux-headers-amd64".to_owned());
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("FAIRVGPU_REQUIRE_LIBVIRT").is_none(),
        "FAIRVGPU_REQUIRE_LIBVIRT is set but these are missing: {missing:?}"
    );
    eprintln!("skipping: missing {missing:?}");
    false
}

#[test]
fn libvirt_domains_get_and_give_back_their_vgpus() {
    if !prerequisites() {
        return;
    }
    let debug = cargo_build("cli");
    cargo_build("libvirt-bridge");
    cargo_build("libcuda");
    let guest_bin = Path::new(env!("CARGO_BIN_EXE_vm-probe")).parent().unwrap();
    // QEMU runs as libvirt-qemu: its kernel, initrd, console and the
    // vGPU's socket must lie where that user can reach them, which a
    // clone under a private home folder is not (so not under scratch's
    // target/tmp, nor TMPDIR, which scripts/check puts there).
    let work = Path::new("/tmp").join(format!("fvg-libvirt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let image = work.join("image");
    let st = Command::new(workspace().join("vm-images/build.sh"))
        .arg(&image)
        .env("LIBCUDA", debug.join("libcuda.so"))
        .env("GUEST_BIN", guest_bin)
        .status()
        .expect("vm-images/build.sh runs");
    if !st.success() {
        // The guest kernel comes from Debian's archive: without it, no image.
        assert!(
            std::env::var_os("FAIRVGPU_REQUIRE_LIBVIRT").is_none(),
            "building the guest image failed"
        );
        eprintln!("skipping: the guest image could not be built (vm-images/build.sh failed)");
        let _ = std::fs::remove_dir_all(&work);
        return;
    }
    let start = Instant::now();
    let out = Command::new(workspace().join("tests/libvirt/walkthrough.sh"))
        .arg(work.join("walk"))
        .env("FAIRVGPU", debug.join("fairvgpu"))
        .env("FAIRVGPU_LIBVIRT", debug.join("fairvgpu-libvirt"))
        .env("IMAGE", &image)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the walkthrough runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    let logs = ["daemon.log", "watch.log"].map(|f| {
        let l = std::fs::read_to_string(work.join("walk").join(f)).unwrap_or_default();
        format!("-- {f}:\n{l}")
    });
    assert!(
        out.status.success(),
        "the walkthrough failed after {:?}\n{}",
        start.elapsed(),
        logs.join("\n")
    );
    assert!(text.contains("walkthrough: all checks passed"), "{text}");
    eprintln!("walkthrough: {:?}", start.elapsed());
    let _ = std::fs::remove_dir_all(&work);
}

/// The `fairvgpu` binary goes to GPU hosts without libvirt: only
/// `fairvgpu-libvirt` may link it.
#[test]
fn only_the_bridge_links_libvirt() {
    let debug = cargo_build("cli");
    let needed = |bin: &str| {
        let out = Command::new("ldd")
            .arg(debug.join(bin))
            .output()
            .expect("ldd runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let main = needed("fairvgpu");
    assert!(main.contains("libc.so"), "ldd said: {main}");
    assert!(!main.contains("libvirt"), "fairvgpu links libvirt: {main}");
    if prerequisites() {
        cargo_build("libvirt-bridge");
        assert!(needed("fairvgpu-libvirt").contains("libvirt.so"));
    }
}
