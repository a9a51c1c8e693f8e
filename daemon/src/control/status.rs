//! The live status of every GPU and vGPU over the sliding window.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::{lock, ControlPlane, SAMPLE_EVERY, WINDOW};
use crate::config::{Config, ExecutorKind, VmConfig};
use crate::grant::VgpuLive;

impl ControlPlane {
    /// Live status of every GPU and vGPU, over the sliding window.
    pub fn status(&self) -> Value {
        let cfg = self.config();
        let h = lock(&self.history);
        let (new, old) = match (
            h.back(),
            h.iter().find(|s| s.at.elapsed() <= WINDOW + SAMPLE_EVERY),
        ) {
            (Some(n), Some(o)) => (Some(n), Some(o)),
            (n, _) => (n, h.front()),
        };
        let dt = match (new, old) {
            (Some(n), Some(o)) => n.at.duration_since(o.at).as_secs_f64(),
            _ => 0.0,
        };
        let none = HashMap::new();
        let newl = new.map_or(&none, |s| &s.live);
        let oldl = old.map_or(&none, |s| &s.live);
        let on = |v: &crate::config::VmConfig| self.gpu_of(&v.name).or(v.gpu).unwrap_or(0);
        let mut gpus: Vec<u32> = cfg.vms.iter().map(on).collect();
        gpus.extend(0..self.gpu_count());
        gpus.sort_unstable();
        gpus.dedup();
        let mut out = Vec::new();
        for g in gpus {
            let vms: Vec<_> = cfg.vms.iter().filter(|v| on(v) == g).collect();
            out.push(self.gpu_status(&cfg, g, &vms, newl, oldl, dt));
        }
        let (rss, fds) = worker::procfs::own_usage();
        let images = lock(&self.image_store).as_ref().map_or(Value::Null, |s| {
            use std::sync::atomic::Ordering::Relaxed;
            json!({
                "images": s.images.load(Relaxed),
                "bytes": s.bytes.load(Relaxed),
                "hits": s.hits.load(Relaxed),
                "refused": s.refused.load(Relaxed),
            })
        });
        json!({
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "daemon": { "rss_bytes": rss, "open_fds": fds, "image_store": images },
            "window_seconds": WINDOW.as_secs_f64(),
            "scheduler": cfg.daemon.scheduler,
            "executor": format!("{:?}", cfg.daemon.executor).to_lowercase(),
            "host_cpu": serde_json::to_value(self.host_cpu.report()).unwrap_or(Value::Null),
            "gpus": out,
            "events": lock(&self.events).iter().cloned().collect::<Vec<_>>(),
        })
    }

    /// GPU `g`'s status, with that of its vGPUs `vms`, from the live
    /// figures `newl` and those `dt` seconds before, `oldl`.
    fn gpu_status(
        &self,
        cfg: &Config,
        g: u32,
        vms: &[&VmConfig],
        newl: &HashMap<u32, VgpuLive>,
        oldl: &HashMap<u32, VgpuLive>,
        dt: f64,
    ) -> Value {
        let demand = |id: u32| {
            let (n, o) = (newl.get(&id), oldl.get(&id));
            // A vGPU that joined within the window counts from zero.
            let before = o.map_or(0, |o| o.active_ns);
            match n {
                Some(n) if dt > 0.0 => {
                    (n.active_ns.saturating_sub(before) as f64 / 1e9 / dt).min(1.0)
                }
                _ => 0.0,
            }
        };
        let rows: Vec<(u32, VgpuLive, u64, u64)> = vms
            .iter()
            .map(|v| {
                let id = self.vgpu_id(&v.name);
                let n = newl.get(&id).copied().unwrap_or_default();
                let o = oldl.get(&id).copied().unwrap_or_default();
                (
                    id,
                    n,
                    n.charged_ns.saturating_sub(o.charged_ns),
                    n.report.sync_calls.saturating_sub(o.report.sync_calls),
                )
            })
            .collect();
        let total: u64 = rows.iter().map(|r| r.2).sum();
        let active =
            |r: &(u32, VgpuLive, u64, u64)| r.2 > 0 || r.1.report.queued > 0 || r.1.holding;
        // Entitlements follow the weights the vGPUs run under: a
        // tenant's weight split among its active vGPUs.
        let members: Vec<sched::tenants::Member<'_>> = vms
            .iter()
            .zip(&rows)
            .map(|(v, r)| sched::tenants::Member {
                tenant: &v.tenant,
                weight: v.weight,
                tenant_weight: cfg.tenant_weight(&v.tenant),
                active: active(r),
            })
            .collect();
        let eff = sched::tenants::effective_weights(&members);
        let wsum: f64 = eff
            .iter()
            .zip(&rows)
            .filter(|(_, r)| active(r))
            .map(|(w, _)| w)
            .sum();
        let mut ratios = Vec::new();
        let mut mem_used = 0;
        let mut list = Vec::new();
        for ((v, r), eff) in vms.iter().zip(&rows).zip(&eff) {
            let share = if total > 0 {
                r.2 as f64 / total as f64
            } else {
                0.0
            };
            let ent = if active(r) && wsum > 0.0 {
                eff / wsum
            } else {
                0.0
            };
            if active(r) && ent > 0.0 {
                ratios.push(share / ent);
            }
            let sync_rate = if dt > 0.0 { r.3 as f64 / dt } else { 0.0 };
            mem_used += r.1.report.mem_used;
            list.push(json!({
                "name": v.name,
                "tenant": v.tenant,
                "weight": v.weight,
                "declared_by": self.declared_by(&v.name),
                "vcpu_threads": lock(&self.vcpus).get(&v.name).cloned().unwrap_or_default(),
                "connected": r.1.connected,
                "holding": r.1.holding,
                "active": active(r),
                "gpu_seconds": r.1.charged_ns as f64 / 1e9,
                "share": share,
                "entitlement": ent,
                "effective_weight": eff,
                "queue_depth": r.1.report.queued,
                "sync_calls_per_second": sync_rate,
                "interactive": sync_rate > sched::classify::INTERACTIVE_SYNC_PER_SECOND,
                "launches": r.1.report.launches,
                "memory_used_bytes": r.1.report.mem_used,
                "memory_limit_bytes": v.memory_limit_mib << 20,
                "worker_faults": lock(&self.faults).get(&v.name).copied().unwrap_or(0),
                "worker_pids": lock(&self.workers).get(&v.name).cloned().unwrap_or_default(),
                "gpu": g,
                "demand": demand(r.0),
                "occupancy": r.1.report.occupancy_ppm as f64 / 1e6,
                "copy_share": r.1.report.copy_ppm as f64 / 1e6,
                "sliced_launches": r.1.report.sliced_launches,
                "pinned": self.is_pinned(&v.name),
                "migrations": lock(&self.migrated).get(&v.name).copied().unwrap_or(0),
                "requests": r.1.report.requests,
                "refused": r.1.report.refused,
                "worker_rss_bytes": r.1.report.rss_bytes,
                "worker_open_fds": r.1.report.open_fds,
                "log_lines_suppressed": r.1.report.log_suppressed
                    + lock(&self.daemon_logs_suppressed)
                        .get(&v.name)
                        .map_or(0, |c| c.load(std::sync::atomic::Ordering::Relaxed)),
                "grants": r.1.grants,
                "grants_revoked": r.1.revoked,
                "contexts_created": r.1.report.contexts_created,
                "contexts_reused": r.1.report.contexts_reused,
            }));
        }
        let mmr = if ratios.len() >= 2 && ratios.iter().any(|&r| r > 0.0) {
            json!(sched::mmr(&ratios))
        } else {
            Value::Null
        };
        json!({
            "index": g,
            "policy": cfg.gpu_policy(g).name(),
            "slice_us": self.slice_ns(cfg, g) / 1000,
            "utilization": if dt > 0.0 { (total as f64 / 1e9 / dt).min(1.0) } else { 0.0 },
            "memory_used_bytes": mem_used,
            "memory_total_bytes": if cfg.daemon.executor == ExecutorKind::Sim {
                json!(cfg.sim.memory)
            } else {
                Value::Null
            },
            "mmr": mmr,
            "vgpus": list,
        })
    }
}
