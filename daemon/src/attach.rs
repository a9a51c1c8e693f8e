//! Attaching a VM's vGPU to QEMU: at start-up (the arguments, or libvirt's
//! `<shmem>` element) or hot-plugged into a running QEMU through QMP
//! (`chardev-add` + `device_add` of an `ivshmem-doorbell` device whose
//! chardev is the vGPU's ivshmem-server socket), and unplugged again.
//!
//! Vector k of the device is delivered to vCPU k in the guest (the kernel
//! module sets the affinity), so the device gets as many vectors as the
//! region has, and the host's doorbell for a waiting guest lands on the vCPU
//! that waits.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use transport::qmp::Qmp;

use crate::config::Config;
use crate::Error;

/// One VM's vGPU as QEMU sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plug {
    /// The VM.
    pub vm: String,
    /// QEMU id of both the chardev and the device.
    pub id: String,
    /// The vGPU's ivshmem-server socket.
    pub socket: PathBuf,
    /// MSI-X vectors (one per vCPU the guest may wait on).
    pub vectors: u32,
}

/// Why a vGPU could not be hot-plugged or unplugged (besides QMP's own
/// errors).
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The VM's ivshmem-server socket is not there to plug.
    #[error("{} does not exist: is `fairvgpu serve` running with vm {vm:?}?", socket.display())]
    NoSocket {
        /// The socket.
        socket: PathBuf,
        /// The VM.
        vm: String,
    },
    /// The guest did not release the device in time.
    #[error("the guest did not release {id} within {timeout:?} (no ACPI hot-plug support?)")]
    NotReleased {
        /// The device's QEMU id.
        id: String,
        /// How long it was given.
        timeout: Duration,
    },
}

/// How long the guest gets to release an unplugged device.
pub const UNPLUG_TIMEOUT: Duration = Duration::from_secs(60);

impl Plug {
    /// The plug of VM `vm` of a config.
    pub fn for_vm(cfg: &Config, vm: &str) -> Result<Plug, Error> {
        let Some(vmc) = cfg.vm(vm) else {
            return Err(Error::NoVm(vm.to_owned()));
        };
        Ok(Plug {
            vm: vm.to_owned(),
            id: format!("fairvgpu-{vm}"),
            socket: cfg.socket(vm),
            vectors: cfg.layout_for(vmc).vectors,
        })
    }

    /// The plug of a vGPU named `vm` that host.toml need not list (one
    /// declared through the API, as libvirt's domains are).
    pub fn declared(cfg: &Config, vm: &str) -> Plug {
        Plug {
            vm: vm.to_owned(),
            id: format!("fairvgpu-{vm}"),
            socket: cfg.socket(vm),
            vectors: cfg.layout.vectors,
        }
    }

    /// QEMU command-line arguments that attach the vGPU at start-up.
    pub fn qemu_args(&self) -> Vec<String> {
        vec![
            "-chardev".into(),
            format!("socket,path={},id={}", self.socket.display(), self.id),
            "-device".into(),
            format!(
                "ivshmem-doorbell,chardev={id},vectors={v},master=on,id={id}",
                id = self.id,
                v = self.vectors
            ),
        ]
    }

    /// libvirt's element for the domain XML (inside `<devices>`).
    pub fn libvirt_xml(&self) -> String {
        format!(
            "<shmem name='{id}' role='master'>\n  <model type='ivshmem-doorbell'/>\n  <server path='{sock}'/>\n  <msi vectors='{v}' ioeventfd='on'/>\n  <alias name='{alias}'/>\n</shmem>\n",
            id = self.id,
            alias = wire::libvirt_xml::SHMEM_ALIAS,
            sock = xml_escape(&self.socket.display().to_string()),
            v = self.vectors,
        )
    }

    /// Hot-plugs the vGPU into the QEMU behind `qmp`; returns the vCPU
    /// thread ids (vCPU order) for coscheduling.
    pub fn attach(&self, qmp: &mut Qmp) -> Result<Vec<u32>, Error> {
        if !self.socket.exists() {
            return Err(AttachError::NoSocket {
                socket: self.socket.clone(),
                vm: self.vm.clone(),
            }
            .into());
        }
        qmp.execute(
            "chardev-add",
            json!({
                "id": self.id,
                "backend": {"type": "socket", "data": {
                    "addr": {"type": "unix", "data": {"path": self.socket}},
                    "server": false,
                }},
            }),
        )?;
        if let Err(e) = qmp.execute(
            "device_add",
            json!({
                "driver": "ivshmem-doorbell",
                "id": self.id,
                "chardev": self.id,
                "vectors": self.vectors,
                "master": "on",
            }),
        ) {
            // Leave nothing half-attached.
            let _ = qmp.execute("chardev-remove", json!({ "id": self.id }));
            return Err(e.into());
        }
        vcpu_threads(qmp)
    }

    /// Unplugs the vGPU: asks the guest to release the device, waits until
    /// it did (QEMU's DEVICE_DELETED), then removes the chardev.
    pub fn detach(&self, qmp: &mut Qmp, timeout: Duration) -> Result<(), Error> {
        qmp.execute("device_del", json!({ "id": self.id }))?;
        let id = self.id.clone();
        qmp.wait_event("DEVICE_DELETED", timeout, |d| d["device"] == id.as_str())
            .map_err(|e| match e {
                transport::Error::Timeout => Error::Attach(AttachError::NotReleased {
                    id: self.id.clone(),
                    timeout,
                }),
                e => e.into(),
            })?;
        match qmp.execute("chardev-remove", json!({ "id": self.id })) {
            // The device is gone; a QEMU that quit meanwhile took the chardev with it.
            Ok(_) | Err(transport::Error::Disconnected) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// The vCPU thread ids of a running QEMU, in vCPU order.
pub fn vcpu_threads(qmp: &mut Qmp) -> Result<Vec<u32>, Error> {
    let mut t = qmp.vcpu_threads()?;
    t.sort_unstable();
    Ok(t.into_iter().map(|(_, tid)| tid).collect())
}

/// Connects to a QMP socket.
pub fn connect(path: &Path) -> Result<Qmp, Error> {
    Ok(Qmp::connect(path, Duration::from_secs(10))?)
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('\'', "&apos;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Where the daemon keeps a VM's vCPU thread ids for its worker.
pub fn vcpus_file(cfg: &Config, vm: &str) -> PathBuf {
    cfg.daemon.run_dir.join(format!("{vm}.vcpus"))
}

pub use wire::vcpus::read_vcpus;

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config::parse(
            r#"
[daemon]
run_dir = "/run/fv"
[layout]
channels = 8
ring_entries = 64
arena_size = 1048576
vectors = 4
[[vm]]
name = "a"
tenant = "t"
memory_limit_mib = 256
"#,
        )
        .unwrap()
    }

    #[test]
    fn qemu_arguments_and_libvirt_element() {
        let p = Plug::for_vm(&cfg(), "a").unwrap();
        assert_eq!(
            p.qemu_args(),
            [
                "-chardev",
                "socket,path=/run/fv/a.sock,id=fairvgpu-a",
                "-device",
                // A vector per process slot (8 by default) at least.
                "ivshmem-doorbell,chardev=fairvgpu-a,vectors=8,master=on,id=fairvgpu-a"
            ]
        );
        let x = p.libvirt_xml();
        assert!(x.contains("<model type='ivshmem-doorbell'/>"), "{x}");
        assert!(x.contains("role='master'"), "{x}");
        assert!(x.contains("<server path='/run/fv/a.sock'/>"), "{x}");
        assert!(x.contains("<msi vectors='8' ioeventfd='on'/>"), "{x}");
        let e = Plug::for_vm(&cfg(), "b").unwrap_err();
        assert!(matches!(&e, Error::NoVm(vm) if vm == "b"), "{e:?}");
        assert_eq!(e.to_string(), "config: no vm named \"b\"");
    }

    #[test]
    fn vcpu_files_tolerate_garbage() {
        let dir = scratch::dir("fvg-vcpus");
        let f = dir.join("x.vcpus");
        std::fs::write(&f, "101\n102\nbad\n103\n").unwrap();
        assert_eq!(read_vcpus(&f), [101, 102]);
        assert!(read_vcpus(&dir.join("none")).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
