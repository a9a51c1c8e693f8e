//! What the operator changes at run time: weights, memory limits, vCPU
//! threads, hot-plug and unplug, and reloads of host.toml.

use std::path::Path;
use std::time::Duration;

use super::{lock, ControlPlane, Refusal};
use crate::config::{Config, ExecutorKind};

impl ControlPlane {
    /// Sets a VM's weight now (until the next reload or restart).
    pub fn set_weight(&self, vm: &str, weight: f64) -> Result<(), Refusal> {
        if !(weight.is_finite() && weight > 0.0) {
            return Err(format!("weight must be a positive number, not {weight}").into());
        }
        let (gpu, tenant, tenant_weight) = {
            let mut cfg = lock(&self.cfg);
            let Some(v) = cfg.vms.iter_mut().find(|v| v.name == vm) else {
                return Err(Refusal::NoVm(vm.to_owned()));
            };
            v.weight = weight;
            let tenant = v.tenant.clone();
            (
                v.gpu.unwrap_or(0),
                tenant.clone(),
                cfg.tenant_weight(&tenant),
            )
        };
        let gpu = self.gpu_of(vm).unwrap_or(gpu);
        if let Some(svc) = lock(&self.services).get(&gpu) {
            svc.set_share(self.vgpu_id(vm), &tenant, weight, tenant_weight)
                .map_err(|e| e.to_string())?;
        }
        if let Some(d) = lock(&self.declared).get_mut(vm) {
            d.weight = weight;
        }
        self.event("weight", format!("{vm}: weight set to {weight}"));
        Ok(())
    }

    /// Sets a VM's memory limit now (until the next reload or restart): the
    /// supervisor passes it to the worker, whose guests' next allocations
    /// see it.
    pub fn set_memory_limit(&self, vm: &str, mib: u64) -> Result<(), Refusal> {
        let mut cfg = lock(&self.cfg);
        if cfg.daemon.executor == ExecutorKind::Sim && mib << 20 > cfg.sim.memory {
            return Err(format!("{mib} MiB exceeds the GPU's {} MiB", cfg.sim.memory >> 20).into());
        }
        if mib == 0 || mib > (1 << 40) {
            return Err(format!("memory limit {mib} MiB is out of range").into());
        }
        let Some(v) = cfg.vms.iter_mut().find(|v| v.name == vm) else {
            return Err(Refusal::NoVm(vm.to_owned()));
        };
        v.memory_limit_mib = mib;
        drop(cfg);
        if let Some(d) = lock(&self.declared).get_mut(vm) {
            d.memory_limit_mib = mib;
        }
        self.event("limit", format!("{vm}: memory limit set to {mib} MiB"));
        Ok(())
    }

    /// Records the vCPU thread ids of a VM (vCPU order; empty when its vGPU
    /// was detached) and hands them to its worker through
    /// `<run_dir>/<vm>.vcpus`, for the coscheduling boost.
    pub fn set_vcpus(&self, vm: &str, threads: Vec<u32>) -> Result<(), Refusal> {
        let cfg = self.config();
        if cfg.vm(vm).is_none() {
            return Err(Refusal::NoVm(vm.to_owned()));
        }
        let file = crate::attach::vcpus_file(&cfg, vm);
        wire::vcpus::write_vcpus(&file, &threads)
            .map_err(|e| format!("writing {}: {e}", file.display()))?;
        self.event(
            "vcpus",
            if threads.is_empty() {
                format!("{vm}: vGPU detached")
            } else {
                format!("{vm}: vGPU attached, vCPU threads {threads:?}")
            },
        );
        self.host_cpu
            .registry
            .set_vcpus(self.vgpu_id(vm), threads.clone());
        lock(&self.vcpus).insert(vm.to_owned(), threads);
        Ok(())
    }

    /// VM `vm`'s plug, or "no vm named ..." (the API's 404).
    pub(super) fn plug(&self, vm: &str) -> Result<crate::attach::Plug, Refusal> {
        let cfg = self.config();
        if cfg.vm(vm).is_none() {
            return Err(Refusal::NoVm(vm.to_owned()));
        }
        Ok(crate::attach::Plug::for_vm(&cfg, vm).map_err(|e| e.to_string())?)
    }

    /// Hot-plugs VM `vm`'s vGPU into the QEMU behind the QMP socket `qmp`
    /// and keeps its vCPU threads; returns them.
    pub fn attach(&self, vm: &str, qmp: &Path) -> Result<Vec<u32>, Refusal> {
        let plug = self.plug(vm)?;
        let threads = crate::attach::connect(qmp)
            .and_then(|mut q| plug.attach(&mut q))
            .map_err(|e| e.to_string())?;
        self.set_vcpus(vm, threads.clone())?;
        Ok(threads)
    }

    /// Hot-unplugs VM `vm`'s vGPU (the guest gets `timeout` to release it).
    pub fn detach(&self, vm: &str, qmp: &Path, timeout: Duration) -> Result<(), Refusal> {
        let plug = self.plug(vm)?;
        crate::attach::connect(qmp)
            .and_then(|mut q| plug.detach(&mut q, timeout))
            .map_err(|e| e.to_string())?;
        self.set_vcpus(vm, Vec::new())
    }

    /// Re-reads host.toml. Refused (keeping the running config) if it is
    /// invalid or changes what needs a restart; otherwise weights apply at
    /// once, added VMs start and removed VMs stop (the supervisor follows
    /// [`ControlPlane::config`]). Returns notes on what applies when.
    pub fn reload(&self) -> Result<Vec<String>, String> {
        let r = self.try_reload();
        match &r {
            Ok(notes) => self.event("reload", format!("config reloaded; {}", notes.join("; "))),
            Err(e) => self.event("reload-refused", format!("config kept: {e}")),
        }
        r
    }

    pub(super) fn try_reload(&self) -> Result<Vec<String>, String> {
        let mut new = Config::load(&self.config_path).map_err(|e| e.to_string())?;
        // The vGPUs declared through the API are not host.toml's: they stay
        // (held locked, so that none is declared or given back meanwhile).
        let declared = lock(&self.declared);
        for (name, d) in declared.iter() {
            if new.vm(name).is_some() {
                return Err(format!(
                    "vm {name:?} is declared through the API; host.toml cannot list it too"
                ));
            }
            new.vms.push(super::declare::vm_config(d, name));
        }
        let old = self.config();
        if !same(&old.daemon, &new.daemon)
            || !same(&old.layout, &new.layout)
            || !same(&old.api, &new.api)
            || !same(&old.sim, &new.sim)
            || !same(&old.spin, &new.spin)
        {
            return Err(
                "[daemon], [layout], [api], [sim] and [spin] change only with a restart of the daemon"
                    .into(),
            );
        }
        if old.gpus != new.gpus {
            // Each GPU's policy, MPS and slice are fixed when its grant
            // service (and MPS control daemon) start.
            return Err("[[gpu]] entries change only with a restart of the daemon".into());
        }
        let mut notes = Vec::new();
        for t in &new.tenants {
            if old.tenant_weight(&t.name) != Some(t.weight) {
                notes.push(format!("tenant {} weight {}", t.name, t.weight));
            }
        }
        for t in &old.tenants {
            if new.tenant_weight(&t.name).is_none() {
                notes.push(format!("tenant {} has no weight of its own now", t.name));
            }
        }
        for vm in &new.vms {
            if let Some(o) = old.vm(&vm.name) {
                if o.gpu != vm.gpu && vm.gpu.is_some() {
                    return Err(format!(
                        "vm {:?}: moving a vGPU to another GPU is a migration, not a reload",
                        vm.name
                    ));
                }
                if o.pinned_mib != vm.pinned_mib {
                    return Err(format!(
                        "vm {:?}: pinned_mib sizes its shared region, which changes only with a restart of the daemon",
                        vm.name
                    ));
                }
            }
        }
        for vm in &new.vms {
            self.ensure_service(&new, self.gpu_of(&vm.name).or(vm.gpu).unwrap_or(0))
                .map_err(|e| e.to_string())?;
            match old.vm(&vm.name) {
                None => notes.push(format!("{} added", vm.name)),
                Some(o) => {
                    if o.weight != vm.weight {
                        notes.push(format!("{} weight {} -> {}", vm.name, o.weight, vm.weight));
                    }
                    if o.memory_limit_mib != vm.memory_limit_mib {
                        notes.push(format!(
                            "{} memory limit {} -> {} MiB (applies to its next allocations)",
                            vm.name, o.memory_limit_mib, vm.memory_limit_mib
                        ));
                    }
                    if o.tenant != vm.tenant {
                        notes.push(format!("{} tenant {} -> {}", vm.name, o.tenant, vm.tenant));
                    }
                    if o.worker_cpu != vm.worker_cpu {
                        notes.push(format!(
                            "{}: worker_cpu applies to the workers of its next processes",
                            vm.name
                        ));
                    }
                }
            }
            let gpu = self.gpu_of(&vm.name).or(vm.gpu).unwrap_or(0);
            if let Some(svc) = lock(&self.services).get(&gpu) {
                svc.set_share(
                    self.vgpu_id(&vm.name),
                    &vm.tenant,
                    vm.weight,
                    new.tenant_weight(&vm.tenant),
                )
                .map_err(|e| e.to_string())?;
                svc.set_corun(self.vgpu_id(&vm.name), vm.corun)
                    .map_err(|e| e.to_string())?;
            }
        }
        for vm in &old.vms {
            if new.vm(&vm.name).is_none() {
                notes.push(format!("{} removed", vm.name));
            }
        }
        for vm in &new.vms {
            self.vgpu_id(&vm.name);
        }
        self.place_new(&new);
        if notes.is_empty() {
            notes.push("no change".into());
        }
        *lock(&self.cfg) = new;
        drop(declared);
        Ok(notes)
    }
}

/// Whether two config sections are equal (compared through their TOML text).
fn same<T: serde::Serialize>(a: &T, b: &T) -> bool {
    toml::to_string(a).ok() == toml::to_string(b).ok()
}
