//! vGPUs declared at run time through the API (`PUT` and `DELETE
//! /api/v1/vgpus/{vm}`), for managers that own their VMs' lives (libvirt's
//! hook and `fairvgpu-libvirt watch`). A declared vGPU is a `[[vm]]` that
//! host.toml does not list: the supervisor starts and stops it as it does a
//! reloaded one, and a reload of host.toml keeps it.

use serde_json::json;

use super::http::Response;
use super::{lock, ControlPlane, Refusal};
use crate::config::{ExecutorKind, VmConfig};
pub use wire::declaration::VgpuDeclaration;

/// Longest tenant or owner name.
const MAX_NAME: usize = 64;

/// How long giving a vGPU back waits for its checkpoint under way.
const UNDECLARE_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

fn plain_name(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty()
        || s.len() > MAX_NAME
        || !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "{what} {s:?}: use 1 to {MAX_NAME} letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}

/// The `[[vm]]` that `d` declares, named `vm`.
pub fn vm_config(d: &VgpuDeclaration, vm: &str) -> VmConfig {
    VmConfig {
        name: vm.to_owned(),
        tenant: d.tenant.clone(),
        weight: d.weight,
        memory_limit_mib: d.memory_limit_mib,
        gpu: d.gpu,
        worker_cpu: None,
        pinned_mib: None,
        corun: false,
        process_slots: None,
    }
}

/// What a declaration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    /// A new vGPU: its worker starts.
    Added,
    /// It was declared already; its weight and memory limit are as asked now.
    Updated,
}

impl ControlPlane {
    /// Checks every field of `d` for a vGPU named `vm`; the message names
    /// the field at fault.
    fn check_declaration(&self, vm: &str, d: &VgpuDeclaration) -> Result<(), String> {
        if vm.is_empty()
            || vm.len() > MAX_NAME
            || !vm
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "vm name {vm:?}: use 1 to {MAX_NAME} letters, digits, '-' and '_'"
            ));
        }
        plain_name("tenant", &d.tenant)?;
        if let Some(o) = &d.owner {
            plain_name("owner", o)?;
        }
        if !(d.weight.is_finite() && d.weight > 0.0) {
            return Err(format!(
                "weight must be a positive number, not {}",
                d.weight
            ));
        }
        let gpus = self.gpu_count();
        if let Some(g) = d.gpu {
            if g >= gpus {
                return Err(format!("gpu {g} does not exist (this host has {gpus})"));
            }
        }
        let cfg = self.config();
        // Its GPU's memory; placed by the daemon, the largest GPU's.
        let gpu_bytes = match (cfg.daemon.executor, d.gpu) {
            (ExecutorKind::Sim, _) => cfg.sim.memory,
            (ExecutorKind::Cuda, Some(g)) => self.gpu_memory.get(g as usize).copied().unwrap_or(0),
            (ExecutorKind::Cuda, None) => self.gpu_memory.iter().copied().max().unwrap_or(0),
        };
        if d.memory_limit_mib == 0 || d.memory_limit_mib.saturating_mul(1 << 20) > gpu_bytes {
            return Err(format!(
                "memory_limit_mib {} does not fit the GPU's {} MiB (1 to {} MiB)",
                d.memory_limit_mib,
                gpu_bytes >> 20,
                gpu_bytes >> 20
            ));
        }
        // What host.toml's check says of it there (its region's layout).
        let mut probe = cfg.clone();
        probe.vms.retain(|v| v.name != vm);
        probe.vms.push(vm_config(d, vm));
        probe.validate().map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Declares (or updates) the vGPU of VM `vm`: checked field by field,
    /// then added to the running config, where the supervisor starts its
    /// region and worker. A VM that host.toml lists is refused.
    pub fn declare(&self, vm: &str, d: &VgpuDeclaration) -> Result<Declared, Refusal> {
        self.check_declaration(vm, d)?;
        let mut declared = lock(&self.declared);
        let known = declared.contains_key(vm);
        if !known && self.config().vm(vm).is_some() {
            return Err(Refusal::Conflict(format!(
                "vm {vm:?} is listed in host.toml; change it there and reload"
            )));
        }
        if let Some(old) = declared.get(vm) {
            if old.tenant != d.tenant || (d.gpu.is_some() && old.gpu != d.gpu) {
                return Err(Refusal::Conflict(format!(
                    "vm {vm:?} is declared already with tenant {:?} and gpu {:?}; \
                     undeclare it first to change them",
                    old.tenant, old.gpu
                )));
            }
            let old = old.clone();
            declared.insert(
                vm.to_owned(),
                VgpuDeclaration {
                    gpu: old.gpu,
                    ..d.clone()
                },
            );
            drop(declared);
            if old.weight != d.weight {
                self.set_weight(vm, d.weight)?;
            }
            if old.memory_limit_mib != d.memory_limit_mib {
                self.set_memory_limit(vm, d.memory_limit_mib)?;
            }
            return Ok(Declared::Updated);
        }
        let mut cfg = self.config();
        cfg.vms.push(vm_config(d, vm));
        self.vgpu_id(vm);
        lock(&self.current).remove(vm);
        self.place_new(&cfg);
        let gpu = self.gpu_of_in(&cfg, vm);
        let scheduled =
            self.ensure_service(&cfg, gpu)
                .and_then(|()| match lock(&self.services).get(&gpu) {
                    Some(svc) => svc.set_share(
                        self.vgpu_id(vm),
                        &d.tenant,
                        d.weight,
                        cfg.tenant_weight(&d.tenant),
                    ),
                    None => Ok(()),
                });
        if let Err(e) = scheduled {
            // Nothing of it stays: not even its placement.
            lock(&self.current).remove(vm);
            return Err(e.to_string().into());
        }
        declared.insert(vm.to_owned(), d.clone());
        // Into the running config as it is now (not the copy above, which
        // a concurrent weight change may have left behind).
        lock(&self.cfg).vms.push(vm_config(d, vm));
        drop(declared);
        self.event(
            "declared",
            format!(
                "{vm}: vGPU declared (tenant {}, weight {}, {} MiB{})",
                d.tenant,
                d.weight,
                d.memory_limit_mib,
                d.owner
                    .as_deref()
                    .map(|o| format!(", by {o}"))
                    .unwrap_or_default()
            ),
        );
        Ok(Declared::Added)
    }

    /// Takes back the declared vGPU of VM `vm`: the supervisor ends its
    /// worker and drops its region and socket; its GPU memory is free.
    pub fn undeclare(&self, vm: &str) -> Result<(), Refusal> {
        // A checkpoint under way is written first (libvirt's save gives
        // the domain's vGPU back as soon as QEMU has saved it).
        if !self.checkpoint_done(vm, UNDECLARE_WAIT) {
            tracing::warn!(
                vm,
                "given back with its checkpoint still under way after {UNDECLARE_WAIT:?}"
            );
        }
        let mut declared = lock(&self.declared);
        if !declared.contains_key(vm) {
            if self.config().vm(vm).is_some() {
                return Err(Refusal::Conflict(format!(
                    "vm {vm:?} is listed in host.toml, not declared; remove it there and reload"
                )));
            }
            return Err(Refusal::NoVm(vm.to_owned()));
        }
        self.forget_worker(vm);
        declared.remove(vm);
        lock(&self.cfg).vms.retain(|v| v.name != vm);
        drop(declared);
        lock(&self.current).remove(vm);
        lock(&self.pinned).remove(vm);
        lock(&self.vcpus).remove(vm);
        self.host_cpu
            .registry
            .set_vcpus(self.vgpu_id(vm), Vec::new());
        // Its vCPU file goes with it (its region and socket go with its
        // worker, in the supervisor's next turn).
        let _ = std::fs::remove_file(crate::attach::vcpus_file(&self.config(), vm));
        self.event("undeclared", format!("{vm}: vGPU given back"));
        Ok(())
    }

    /// `PUT /api/v1/vgpus/{vm}`: 201 when added, 200 when updated.
    pub(super) fn put_vgpu(&self, vm: &str, body: &[u8]) -> Response {
        let d = match VgpuDeclaration::from_json(body) {
            Ok(d) => d,
            Err(e) => return Response::error(400, format!("the declaration: {e}")),
        };
        match self.declare(vm, &d) {
            Ok(done) => Response::json(
                if done == Declared::Added { 201 } else { 200 },
                &json!({
                    "vm": vm,
                    "declared": true,
                    "added": done == Declared::Added,
                    "socket": self.config().socket(vm),
                }),
            ),
            Err(e @ Refusal::NoVm(_)) => Response::error(404, e.to_string()),
            Err(e @ Refusal::Conflict(_)) => Response::error(409, e.to_string()),
            Err(e) => Response::error(400, e.to_string()),
        }
    }

    /// `DELETE /api/v1/vgpus/{vm}`.
    pub(super) fn delete_vgpu(&self, vm: &str) -> Response {
        match self.undeclare(vm) {
            Ok(()) => Response::json(200, &json!({ "vm": vm, "declared": false })),
            Err(e @ Refusal::NoVm(_)) => Response::error(404, e.to_string()),
            Err(e) => Response::error(409, e.to_string()),
        }
    }

    /// Who declared `vm` (`Some("")` for an owner left out), or `None` for
    /// a VM of host.toml.
    pub fn declared_by(&self, vm: &str) -> Option<String> {
        lock(&self.declared)
            .get(vm)
            .map(|d| d.owner.clone().unwrap_or_default())
    }

    fn gpu_of_in(&self, cfg: &crate::config::Config, vm: &str) -> u32 {
        lock(&self.current)
            .get(vm)
            .copied()
            .or_else(|| cfg.vm(vm).and_then(|v| v.gpu))
            .unwrap_or(0)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::Config;
    use crate::control::http::Request;
    use std::sync::Arc;

    /// A plane without grant services (scheduler off) over `host.toml` in
    /// a scratch folder: host.toml lists vm1; 2 sim GPUs of 1 GiB.
    /// A control plane of one sim VM, `vm1`, and its config file's path.
    pub(in crate::control) fn plane(name: &str) -> (Arc<ControlPlane>, std::path::PathBuf) {
        let dir = scratch::dir(&format!("declare-{name}"));
        let path = dir.join("host.toml");
        let text = format!(
            "[daemon]\nrun_dir = {:?}\nexecutor = \"sim\"\nscheduler = false\npriority = 0\n\
             cgroup_cpu_weight = 0\n\n[sim]\ngpus = 2\nmemory = 1073741824\n\n\
             [[vm]]\nname = \"vm1\"\ntenant = \"t\"\nmemory_limit_mib = 64\n",
            dir.display().to_string()
        );
        std::fs::write(&path, text).unwrap();
        let cfg = Config::load(&path).unwrap();
        let cpu = Arc::new(crate::hostcpu::HostCpu::start(&cfg.daemon));
        (ControlPlane::new(cfg, &path, cpu).unwrap(), path)
    }

    fn call(p: &ControlPlane, method: &str, path: &str, body: &str) -> (u16, String) {
        let r = p.handle(
            &Request {
                method: method.into(),
                path: path.into(),
                bearer: None,
                body: body.as_bytes().to_vec(),
            },
            false,
        );
        (r.status, String::from_utf8_lossy(&r.body).into_owned())
    }

    fn names(p: &ControlPlane) -> Vec<String> {
        p.config().vms.iter().map(|v| v.name.clone()).collect()
    }

    #[test]
    fn a_vgpu_is_given_back_only_once_its_checkpoint_under_way_is_answered() {
        let (p, _) = plane("give-back-waits");
        let body = r#"{"tenant": "acme", "memory_limit_mib": 64, "owner": "libvirt"}"#;
        assert_eq!(call(&p, "PUT", "/api/v1/vgpus/dom1", body).0, 201);
        // Nobody answers the checkpoint (no supervisor) until the test does.
        let asker = {
            let p = p.clone();
            std::thread::spawn(move || {
                let op =
                    crate::control::SaveOp::Checkpoint("dom1.fvgpu".into(), Default::default());
                p.save_op("dom1", op, std::time::Duration::from_secs(30))
            })
        };
        while !p.checkpointing.lock().unwrap().contains_key("dom1") {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let giver = {
            let p = p.clone();
            std::thread::spawn(move || p.undeclare("dom1"))
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !giver.is_finished(),
            "given back while its checkpoint is under way"
        );
        assert_eq!(p.declared_by("dom1").as_deref(), Some("libvirt"));
        let ask = p.take_save_asks().pop().unwrap();
        ask.answer
            .send(Ok(serde_json::json!({"bytes": 1})))
            .unwrap();
        assert!(asker.join().unwrap().is_ok());
        giver.join().unwrap().unwrap();
        assert_eq!(p.declared_by("dom1"), None);
    }

    #[test]
    fn declared_vgpus_join_the_config_survive_a_reload_and_go_on_delete() {
        let (p, _) = plane("life");
        let body =
            r#"{"tenant": "acme", "weight": 2, "memory_limit_mib": 256, "owner": "libvirt"}"#;
        assert_eq!(call(&p, "PUT", "/api/v1/vgpus/dom1", body).0, 201);
        assert_eq!(names(&p), ["vm1", "dom1"]);
        assert_eq!(p.declared_by("dom1").as_deref(), Some("libvirt"));
        assert_eq!(p.declared_by("vm1"), None);
        // Again, with another weight: an update, not a second vGPU.
        let body3 = body.replace("\"weight\": 2", "\"weight\": 3");
        assert_eq!(call(&p, "PUT", "/api/v1/vgpus/dom1", &body3).0, 200);
        assert_eq!(p.config().vm("dom1").unwrap().weight, 3.0);
        // A weight set live stays through a reload of host.toml.
        assert_eq!(
            call(&p, "POST", "/api/v1/vgpus/dom1/weight", r#"{"weight": 5}"#).0,
            200
        );
        p.reload().unwrap();
        assert_eq!(names(&p), ["vm1", "dom1"]);
        assert_eq!(p.config().vm("dom1").unwrap().weight, 5.0);
        // host.toml's VMs are not the API's to take back, nor to declare.
        let (code, e) = call(&p, "DELETE", "/api/v1/vgpus/vm1", "");
        assert_eq!(code, 409, "{e}");
        assert_eq!(call(&p, "PUT", "/api/v1/vgpus/vm1", body).0, 409);
        assert_eq!(call(&p, "DELETE", "/api/v1/vgpus/dom1", "").0, 200);
        assert_eq!(names(&p), ["vm1"]);
        assert_eq!(call(&p, "DELETE", "/api/v1/vgpus/dom1", "").0, 404);
        p.reload().unwrap();
        assert_eq!(names(&p), ["vm1"]);
    }

    #[test]
    fn a_bad_field_is_refused_by_name_and_leaves_nothing() {
        let (p, _) = plane("bad");
        let cases = [
            (
                r#"{"tenant": "a", "weight": 0, "memory_limit_mib": 64}"#,
                "weight",
            ),
            (
                r#"{"tenant": "a", "weight": -1, "memory_limit_mib": 64}"#,
                "weight",
            ),
            (
                r#"{"tenant": "a", "weight": "x", "memory_limit_mib": 64}"#,
                "weight",
            ),
            (
                r#"{"tenant": "a", "memory_limit_mib": 64, "gpu": 2}"#,
                "gpu",
            ),
            (
                r#"{"tenant": "a", "memory_limit_mib": 2048}"#,
                "memory_limit_mib",
            ),
            (
                r#"{"tenant": "a", "memory_limit_mib": 0}"#,
                "memory_limit_mib",
            ),
            (r#"{"tenant": "a"}"#, "memory_limit_mib"),
            (r#"{"tenant": "a b", "memory_limit_mib": 64}"#, "tenant"),
            (
                r#"{"tenant": "a", "memory_limit_mib": 64, "owner": ""}"#,
                "owner",
            ),
            (
                r#"{"tenant": "a", "memory_limit_mib": 64, "colour": 1}"#,
                "colour",
            ),
        ];
        for (body, field) in cases {
            let (code, e) = call(&p, "PUT", "/api/v1/vgpus/dom1", body);
            assert_eq!(code, 400, "{body}: {e}");
            assert!(e.contains(field), "{body}: {e} does not name {field}");
        }
        let (code, e) = call(
            &p,
            "PUT",
            "/api/v1/vgpus/bad%20name",
            r#"{"tenant": "a", "memory_limit_mib": 64}"#,
        );
        assert_eq!(code, 400, "{e}");
        assert!(e.contains("vm name"), "{e}");
        assert_eq!(names(&p), ["vm1"]);
        assert!(p.config().vm("dom1").is_none());
        assert_eq!(p.declared_by("dom1"), None);
    }

    #[test]
    fn a_reload_that_lists_a_declared_name_is_refused() {
        let (p, path) = plane("clash");
        let body = r#"{"tenant": "acme", "memory_limit_mib": 64}"#;
        assert_eq!(call(&p, "PUT", "/api/v1/vgpus/dom1", body).0, 201);
        let text = std::fs::read_to_string(&path).unwrap()
            + "\n[[vm]]\nname = \"dom1\"\ntenant = \"t\"\nmemory_limit_mib = 64\n";
        std::fs::write(&path, text).unwrap();
        let e = p.reload().unwrap_err();
        assert!(e.contains("declared through the API"), "{e}");
        assert_eq!(names(&p), ["vm1", "dom1"]);
    }

    #[test]
    fn names_are_plain() {
        assert!(plain_name("tenant", "acme-1.prod").is_ok());
        for bad in ["", "a b", "a/b", "ä", &"x".repeat(65)] {
            let e = plain_name("tenant", bad).unwrap_err();
            assert!(e.starts_with("tenant "), "{e}");
        }
    }
}
