//! What a vGPU tells its guest about who it is: a UUID of its own and the
//! host's driver release.
//!
//! The UUID is derived from a random id the host keeps in its run_dir
//! ([`HOST_ID_FILE`], made once) and the VM's name: the same across worker
//! restarts and migrations between the daemon's GPUs, different between
//! the VMs of a host and between hosts. Inside a VM it is the GPU's UUID
//! for CUDA (`cuDeviceGetUuid`) and NVML alike.
//!
//! The driver release is read where the driver says it (the kernel
//! module's version), before the worker is confined.

use std::io::Write as _;
use std::path::Path;

use sha2::Digest as _;

use crate::Error;

/// The host's random id in run_dir: 32 lowercase hex digits and a newline.
pub const HOST_ID_FILE: &str = "host-id";

/// The host's random id, kept in `run_dir/host-id`: read if there, made
/// otherwise (by whichever process comes first; the others read it).
pub fn host_id(run_dir: &Path) -> Result<[u8; 16], Error> {
    let path = run_dir.join(HOST_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => return parse_host_id(&text, &path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(Error::Io {
                what: "reading run_dir/host-id",
                source,
            })
        }
    }
    let mut id = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut id))
        .map_err(|source| Error::Io {
            what: "reading /dev/urandom for the host id",
            source,
        })?;
    // Written whole under a name of our own, then linked into place: a
    // process that reads the file sees all of it, and of two that make one
    // at once the first link wins.
    let tmp = run_dir.join(format!(".{HOST_ID_FILE}.{}", std::process::id()));
    let io = |what| move |source| Error::Io { what, source };
    let mut f = std::fs::File::create(&tmp).map_err(io("creating run_dir/host-id"))?;
    f.write_all(format!("{}\n", hex(&id)).as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io("writing run_dir/host-id"))?;
    drop(f);
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(id),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = std::fs::read_to_string(&path).map_err(io("reading run_dir/host-id"))?;
            parse_host_id(&text, &path)
        }
        Err(source) => Err(Error::Io {
            what: "creating run_dir/host-id",
            source,
        }),
    }
}

fn parse_host_id(text: &str, path: &Path) -> Result<[u8; 16], Error> {
    let t = text.trim();
    let mut id = [0u8; 16];
    let ok = t.len() == 32
        && t.is_ascii()
        && id.iter_mut().enumerate().all(|(i, b)| {
            u8::from_str_radix(&t[2 * i..2 * i + 2], 16)
                .map(|v| *b = v)
                .is_ok()
        });
    if !ok {
        return Err(Error::BadHostId {
            path: path.to_owned(),
        });
    }
    Ok(id)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The UUID of VM `vm`'s vGPU on the host whose id (or, for a worker
/// outside a daemon, whatever names its place) is `seed`: the first 16
/// bytes of SHA-256 over both, marked as an RFC 9562 version 8 (custom)
/// UUID of the RFC's variant.
pub fn vgpu_uuid(seed: &[u8], vm: &str) -> [u8; 16] {
    let mut h = sha2::Sha256::new();
    h.update(b"fairvgpu vGPU UUID\0");
    h.update((seed.len() as u64).to_le_bytes());
    h.update(seed);
    h.update(vm.as_bytes());
    let d = h.finalize();
    let mut u = [0u8; 16];
    u.copy_from_slice(&d[..16]);
    u[6] = (u[6] & 0x0f) | 0x80; // version 8
    u[8] = (u[8] & 0x3f) | 0x80; // variant 10
    u
}

/// The driver release the loaded NVIDIA kernel module reports
/// (`/sys/module/nvidia/version`, else `/proc/driver/nvidia/version`), as
/// NVML writes it ("580.159.04"); `None` where neither says.
pub fn driver_release() -> Option<String> {
    let sys = std::fs::read_to_string("/sys/module/nvidia/version").ok();
    if let Some(v) = sys.as_deref().and_then(release_in) {
        return Some(v);
    }
    let proc = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    release_in(proc.lines().next()?)
}

/// The first word of `text` that is a driver release: numbers joined by
/// dots, at least two of them ("580.159.04", "580.65"), at most
/// [`protocol::MAX_DRIVER_VERSION`] bytes.
fn release_in(text: &str) -> Option<String> {
    text.split_whitespace()
        .find(|w| {
            let parts: Vec<&str> = w.split('.').collect();
            parts.len() >= 2
                && w.len() <= protocol::MAX_DRIVER_VERSION
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_as_the_driver_writes_them() {
        assert_eq!(release_in("580.159.04\n").as_deref(), Some("580.159.04"));
        assert_eq!(
            release_in(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  \
                 Release Build  (dvs-builder@U22)  Thu Oct 30 2025"
            )
            .as_deref(),
            Some("580.159.04")
        );
        assert_eq!(
            release_in("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar 5")
                .as_deref(),
            Some("550.54.15")
        );
        assert_eq!(release_in("x86_64 module"), None);
        assert_eq!(release_in("1."), None);
        assert_eq!(release_in(""), None);
    }

    #[test]
    fn uuids_differ_between_vms_and_hosts_and_are_version_8() {
        let a = vgpu_uuid(&[1; 16], "vm1");
        assert_eq!(a, vgpu_uuid(&[1; 16], "vm1"));
        assert_ne!(a, vgpu_uuid(&[1; 16], "vm2"));
        assert_ne!(a, vgpu_uuid(&[2; 16], "vm1"));
        // The seed's length is part of the hash: no seed/name ambiguity.
        assert_ne!(vgpu_uuid(b"ab", "c"), vgpu_uuid(b"a", "bc"));
        assert_eq!(a[6] >> 4, 8);
        assert_eq!(a[8] >> 6, 2);
    }

    #[test]
    fn the_host_id_is_made_once_and_kept() {
        let dir = scratch::dir("fvg-hostid");
        let _ = std::fs::remove_file(dir.join(HOST_ID_FILE));
        let first = host_id(&dir).unwrap();
        assert_ne!(first, [0; 16]);
        assert_eq!(host_id(&dir).unwrap(), first);
        let text = std::fs::read_to_string(dir.join(HOST_ID_FILE)).unwrap();
        assert_eq!(text, format!("{}\n", hex(&first)));
        // Only the file remains (the temporary one is gone).
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::write(dir.join(HOST_ID_FILE), "not hex\n").unwrap();
        let e = host_id(&dir).unwrap_err();
        assert!(
            matches!(&e, Error::BadHostId { path } if *path == dir.join(HOST_ID_FILE)),
            "{e:?}"
        );
        assert!(e.to_string().contains("not a host id"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
