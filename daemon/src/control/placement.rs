//! Placement and migration: where new vGPUs go, the balancer's rounds, and
//! moves asked for by it or by hand, as the control plane tracks them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{lock, ControlPlane, Refusal};
use crate::config::Config;

/// A migration as the control plane tracks it.
#[derive(Debug, Clone)]
pub enum Migration {
    /// Asked for, to this GPU; the supervisor has not started it.
    Requested(u32),
    /// The worker was told; waiting for its report.
    InFlight {
        /// Target GPU.
        to: u32,
        /// Since when.
        since: Instant,
    },
    /// Finished: where it is now and what it cost.
    Done(crate::link::MigrationReport),
    /// Did not happen; the vGPU stays where it was.
    Failed(String),
}

impl ControlPlane {
    /// Places the VMs that name no GPU and have none yet: memory-aware
    /// least-loaded (a vGPU not yet measured counts its memory limit's share
    /// of the GPU as its load).
    pub(super) fn place_new(&self, cfg: &Config) {
        let mut p =
            sched::placement::Placer::new(self.placement_params(cfg), self.gpu_memory.clone());
        let demand = |v: &crate::config::VmConfig, g: u32| sched::placement::Demand {
            cores: (v.memory_limit_mib << 20) as f64
                / self.gpu_memory.get(g as usize).copied().unwrap_or(1).max(1) as f64,
            memory: v.memory_limit_mib << 20,
        };
        let mut unplaced = Vec::new();
        for v in &cfg.vms {
            match lock(&self.current).get(&v.name).copied().or(v.gpu) {
                Some(g) => p.pin(self.vgpu_id(&v.name), g as usize, demand(v, g)),
                None => unplaced.push(v),
            }
        }
        for v in unplaced {
            let g = p
                .place(self.vgpu_id(&v.name), demand(v, 0))
                .and_then(|g| u32::try_from(g).ok())
                .unwrap_or(0);
            lock(&self.current).insert(v.name.clone(), g);
            if let Err(e) = self.ensure_service(cfg, g) {
                tracing::error!("GPU {g}'s grant service: {e}");
            }
            self.event("placement", format!("{}: placed on GPU {g}", v.name));
        }
    }

    pub(super) fn placement_params(&self, cfg: &Config) -> sched::placement::Params {
        let pl = cfg.placement;
        // The config checks it finite and >= 0; `as` saturates a huge one.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let cooldown_ns = (pl.cooldown_s * 1e9) as u64;
        sched::placement::Params {
            over: pl.over,
            under: pl.under,
            watermark: pl.watermark,
            cooldown_ns,
            compaction: pl.compaction,
        }
    }

    /// One round of the balancer: reads each vGPU's demand (time wanting
    /// or holding its GPU, over the status window) and memory, and asks for
    /// the moves DCUDA's balancing and compaction choose.
    pub fn balance(&self) {
        let cfg = self.config();
        if !cfg.placement.enabled || self.gpu_count() < 2 {
            return;
        }
        let st = self.status();
        let mut guard = lock(&self.placer);
        let p = guard.get_or_insert_with(|| {
            sched::placement::Placer::new(self.placement_params(&cfg), self.gpu_memory.clone())
        });
        let mut seen = std::collections::HashSet::new();
        for g in st["gpus"].as_array().into_iter().flatten() {
            for v in g["vgpus"].as_array().into_iter().flatten() {
                let Some(name) = v["name"].as_str() else {
                    continue;
                };
                let id = self.vgpu_id(name);
                seen.insert(id);
                // The status's own GPU index (a config's u32).
                let gpu_index = v["gpu"]
                    .as_u64()
                    .and_then(|g| u32::try_from(g).ok())
                    .unwrap_or(0);
                let gpu = gpu_index as usize;
                let d = sched::placement::Demand {
                    cores: v["demand"].as_f64().unwrap_or(0.0),
                    memory: v["memory_used_bytes"].as_u64().unwrap_or(0),
                };
                if p.gpu_of(id) == Some(gpu) {
                    p.update(id, d);
                } else {
                    p.pin(id, gpu, d);
                }
                // Moving now, or failed to move (an executor that cannot
                // migrate): the balancer leaves it alone.
                let busy_or_failed = matches!(
                    lock(&self.migrations).get(name),
                    Some(
                        Migration::Requested(_) | Migration::InFlight { .. } | Migration::Failed(_)
                    )
                );
                // An MPS client cannot leave its GPU's server.
                let mps = cfg.gpu_mps(gpu_index);
                p.set_pinned(id, v["pinned"] == true || busy_or_failed || mps);
                // CASE's rule: a vGPU goes only where its whole memory
                // limit fits, not just what it uses now.
                if let Some(limit) = v["memory_limit_bytes"].as_u64() {
                    p.set_memory_limit(id, limit);
                }
            }
        }
        for id in p.vgpus() {
            if !seen.contains(&id) {
                p.remove(id);
            }
        }
        let now = crate::nanos(self.started.elapsed());
        let moves = p.balance(now);
        drop(guard);
        let names: HashMap<u32, String> = lock(&self.ids)
            .iter()
            .map(|(n, id)| (*id, n.clone()))
            .collect();
        for m in moves {
            if let (Some(vm), Ok(to)) = (names.get(&m.vgpu), u32::try_from(m.to)) {
                if let Err(e) = self.request_migration(vm, to) {
                    tracing::debug!(vm, "balancer's move not made: {e}");
                }
            }
        }
    }

    /// Asks for `vm`'s vGPU to move to `gpu` (the supervisor carries it out).
    pub fn request_migration(&self, vm: &str, gpu: u32) -> Result<(), Refusal> {
        let from = self
            .gpu_of(vm)
            .ok_or_else(|| Refusal::NoVm(vm.to_owned()))?;
        if gpu >= self.gpu_count() {
            return Err(format!("no GPU {gpu}: this host has {}", self.gpu_count()).into());
        }
        if gpu == from {
            return Err(format!("{vm} is on GPU {gpu} already").into());
        }
        if lock(&self.pinned).contains(vm) {
            return Err(format!("{vm} is pinned: unpin it to move it").into());
        }
        if self.config().gpu_mps(from) || self.config().gpu_mps(gpu) {
            return Err(format!(
                "{vm}: a vGPU on a GPU with [[gpu]] mps = true does not move (an MPS client stays with its GPU's server)"
            ).into());
        }
        let mut m = lock(&self.migrations);
        if matches!(
            m.get(vm),
            Some(Migration::Requested(_) | Migration::InFlight { .. })
        ) {
            return Err(format!("{vm} is moving already").into());
        }
        m.insert(vm.to_owned(), Migration::Requested(gpu));
        Ok(())
    }

    /// Migrations asked for and not started: they are under way from now.
    pub fn take_requested(&self) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for (vm, m) in lock(&self.migrations).iter_mut() {
            if let Migration::Requested(to) = *m {
                out.push((vm.clone(), to));
                *m = Migration::InFlight {
                    to,
                    since: Instant::now(),
                };
            }
        }
        out
    }

    /// Records how a migration ended.
    pub fn finish_migration(&self, vm: &str, result: Result<crate::link::MigrationReport, String>) {
        let from = self.gpu_of(vm).unwrap_or(0);
        let target = match lock(&self.migrations).get(vm) {
            Some(Migration::InFlight { to, .. } | Migration::Requested(to)) => Some(*to),
            _ => None,
        };
        let state = match result {
            Ok(r) if r.moved => {
                lock(&self.current).insert(vm.to_owned(), r.gpu);
                *lock(&self.migrated).entry(vm.to_owned()).or_default() += 1;
                self.event(
                    "migration",
                    format!(
                        "{vm}: GPU {from} -> {} in {:.1} ms ({:.1} MiB copied)",
                        r.gpu,
                        r.pause_us as f64 / 1e3,
                        r.kib as f64 / 1024.0
                    ),
                );
                Migration::Done(r)
            }
            Ok(r) => {
                let to = target.map_or_else(|| "another GPU".to_owned(), |t| format!("GPU {t}"));
                let why = r.reason();
                let e = if why.is_empty() {
                    format!("{vm}: could not move to {to}; it stays on GPU {}", r.gpu)
                } else {
                    format!(
                        "{vm}: could not move to {to}: {why}; it stays on GPU {}",
                        r.gpu
                    )
                };
                self.event("migration-failed", e.clone());
                Migration::Failed(e)
            }
            Err(e) => {
                self.event("migration-failed", format!("{vm}: {e}"));
                Migration::Failed(e)
            }
        };
        lock(&self.migrations).insert(vm.to_owned(), state);
    }

    /// Fails migrations under way for longer than `limit`.
    pub fn expire_migrations(&self, limit: Duration) {
        let late: Vec<String> = lock(&self.migrations)
            .iter()
            .filter(
                |(_, m)| matches!(m, Migration::InFlight { since, .. } if since.elapsed() > limit),
            )
            .map(|(vm, _)| vm.clone())
            .collect();
        for vm in late {
            self.finish_migration(&vm, Err("the worker did not answer".into()));
        }
    }

    /// Moves `vm` to `gpu` and waits until it has moved (or failed).
    pub fn migrate(&self, vm: &str, gpu: u32, timeout: Duration) -> Result<Value, Refusal> {
        self.request_migration(vm, gpu)?;
        let t = Instant::now();
        loop {
            match lock(&self.migrations).get(vm) {
                Some(Migration::Done(r)) => {
                    return Ok(json!({
                        "vm": vm,
                        "gpu": r.gpu,
                        "pause_ms": r.pause_us as f64 / 1e3,
                        "copied_bytes": r.kib * 1024,
                    }))
                }
                // A VM removed by a reload meanwhile is the API's 404, as
                // when it was gone before the request.
                Some(Migration::Failed(_)) if lock(&self.cfg).vm(vm).is_none() => {
                    return Err(Refusal::NoVm(vm.to_owned()))
                }
                Some(Migration::Failed(e)) => return Err(e.clone().into()),
                _ => {}
            }
            if t.elapsed() > timeout {
                return Err(format!("{vm}: the migration did not finish in {timeout:?}").into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Forbids (or allows again) moving `vm`.
    pub fn set_pinned(&self, vm: &str, pinned: bool) -> Result<(), Refusal> {
        if lock(&self.cfg).vm(vm).is_none() {
            return Err(Refusal::NoVm(vm.to_owned()));
        }
        if pinned {
            lock(&self.pinned).insert(vm.to_owned());
        } else {
            lock(&self.pinned).remove(vm);
        }
        self.event(
            "placement",
            format!("{vm}: {}", if pinned { "pinned" } else { "may move" }),
        );
        Ok(())
    }

    /// Whether `vm` must not move.
    pub fn is_pinned(&self, vm: &str) -> bool {
        lock(&self.pinned).contains(vm)
    }
}
