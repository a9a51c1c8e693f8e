//! The operator's side of the daemon: live state, the control API, the
//! Prometheus metrics and the dashboard.
//!
//! The API is served on a unix socket (mode 0660: whoever may use it is
//! decided by the file system) and, only when configured, on TCP, where
//! every request but the static dashboard page and the API description needs
//! `Authorization: Bearer <token>`. Endpoints (see `docs/api.openapi.json`):
//!
//! - `GET /api/v1/status`: GPUs and vGPUs with live figures
//! - `POST /api/v1/vgpus/{vm}/weight` `{"weight": 2.5}`: set a weight now
//! - `POST /api/v1/vgpus/{vm}/attach|detach` `{"qmp": "/run/qemu/vm1.qmp"}`:
//!   hot-plug or unplug the vGPU through QMP
//! - `POST /api/v1/vgpus/{vm}/vcpus` `{"threads": [4711, 4712]}`: the VM's
//!   vCPU threads (coscheduling boost), where QEMU was attached at start-up
//! - `POST /api/v1/vgpus/{vm}/memory_limit` `{"mib": 4096}`: set a memory
//!   limit now (the guests' next allocations), until the next reload
//! - `POST /api/v1/vgpus/{vm}/migrate` `{"gpu": 1}`: move the running vGPU
//!   to another GPU now; answers when it has moved (with the pause)
//! - `POST /api/v1/vgpus/{vm}/pin` `{"pinned": true}`: forbid (or allow
//!   again) moving it, by the balancer or by hand
//! - `POST /api/v1/reload`: re-read host.toml (also on SIGHUP)
//! - `GET /metrics`: Prometheus text format
//! - `GET /`: the dashboard
//!
//! Figures over a sliding window of [`WINDOW`]: share = the vGPU's charged GPU
//! time over all charged on its GPU; entitlement = its effective weight
//! (its own, or its tenant's split among the tenant's active vGPUs) over
//! those of the vGPUs active on that GPU (charged, queued or holding);
//! MMR = min over max of share/entitlement among active vGPUs.

pub mod http;

use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::{Config, ExecutorKind};
use crate::grant::{GrantService, VgpuLive};
use crate::Error;
use http::{Request, Response};

/// The sliding window of the live figures.
pub const WINDOW: Duration = Duration::from_secs(5);
/// How often the live figures are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

const DASHBOARD: &str = include_str!("dashboard.html");
const OPENAPI: &str = include_str!("../../../docs/api.openapi.json");

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Snapshot {
    at: Instant,
    live: HashMap<u32, VgpuLive>,
}

/// The daemon's live state, shared by the supervisor, the API and the sampler.
pub struct ControlPlane {
    config_path: PathBuf,
    cfg: Mutex<Config>,
    ids: Mutex<HashMap<String, u32>>,
    services: Mutex<HashMap<u32, Arc<GrantService>>>,
    history: Mutex<VecDeque<Snapshot>>,
    events: Mutex<VecDeque<Value>>,
    /// vCPU thread ids per VM, as `fairvgpu attach` read them from QMP.
    vcpus: Mutex<HashMap<String, Vec<u32>>>,
    /// Worker restarts per VM since the daemon started.
    restarts: Mutex<HashMap<String, u64>>,
    /// Per VM: log lines about its peers the daemon suppressed (its
    /// ivshmem server's count, see `qemu_ivshmem::ratelimit`).
    daemon_logs_suppressed: Mutex<HashMap<String, Arc<std::sync::atomic::AtomicU64>>>,
    /// The GPU each vGPU runs on, where it moved from its configured one.
    current: Mutex<HashMap<String, u32>>,
    /// vGPUs that must not move.
    pinned: Mutex<std::collections::HashSet<String>>,
    /// Migrations asked for, under way, or just finished, per VM.
    migrations: Mutex<HashMap<String, Migration>>,
    /// Migrations done per VM.
    migrated: Mutex<HashMap<String, u64>>,
    /// GPUs on this host.
    gpu_count: std::sync::atomic::AtomicU32,
    /// Memory of each GPU, bytes.
    gpu_memory: Vec<u64>,
    /// The balancer's view (DCUDA placement), kept between rounds.
    placer: Mutex<Option<scheduler::placement::Placer>>,
    token: Option<String>,
    started: Instant,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("config_path", &self.config_path)
            .finish_non_exhaustive()
    }
}

fn read_token(cfg: &Config) -> Result<Option<String>, Error> {
    cfg.api
        .token_file
        .as_deref()
        .map(token_from_file)
        .transpose()
}

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

/// Compares without an early exit, so timing does not reveal a prefix.
fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl ControlPlane {
    /// The plane for `cfg`, read from `config_path`; starts one grant
    /// service per GPU in use when the scheduler is on.
    pub fn new(cfg: Config, config_path: &Path) -> Result<Arc<ControlPlane>, Error> {
        let token = read_token(&cfg)?;
        let plane = ControlPlane {
            config_path: config_path.to_owned(),
            ids: Mutex::new(HashMap::new()),
            services: Mutex::new(HashMap::new()),
            history: Mutex::new(VecDeque::new()),
            events: Mutex::new(VecDeque::new()),
            vcpus: Mutex::new(HashMap::new()),
            restarts: Mutex::new(HashMap::new()),
            daemon_logs_suppressed: Mutex::new(HashMap::new()),
            current: Mutex::new(HashMap::new()),
            pinned: Mutex::new(Default::default()),
            migrations: Mutex::new(HashMap::new()),
            migrated: Mutex::new(HashMap::new()),
            gpu_count: std::sync::atomic::AtomicU32::new(match cfg.daemon.executor {
                ExecutorKind::Sim => cfg.sim.gpus.max(1),
                ExecutorKind::Cuda => crate::executor::cuda::device_count().unwrap_or(1),
            }),
            gpu_memory: Vec::new(),
            placer: Mutex::new(None),
            token,
            started: Instant::now(),
            cfg: Mutex::new(cfg.clone()),
        };
        let mut plane = plane;
        plane.gpu_memory = (0..plane.gpu_count())
            .map(|g| match cfg.daemon.executor {
                ExecutorKind::Sim => cfg.sim.memory,
                ExecutorKind::Cuda => crate::executor::cuda::device_memory(g).unwrap_or(0),
            })
            .collect();
        for vm in &cfg.vms {
            plane.vgpu_id(&vm.name);
        }
        plane.place_new(&cfg);
        for vm in &cfg.vms {
            plane.vgpu_id(&vm.name);
            let gpu = plane.gpu_of(&vm.name).unwrap_or(0);
            plane.ensure_service(&cfg, gpu)?;
            if let Some(svc) = lock(&plane.services).get(&gpu) {
                svc.set_share(
                    plane.vgpu_id(&vm.name),
                    &vm.tenant,
                    vm.weight,
                    cfg.tenant_weight(&vm.tenant),
                )?;
            }
        }
        Ok(Arc::new(plane))
    }

    /// The current configuration.
    pub fn config(&self) -> Config {
        lock(&self.cfg).clone()
    }

    /// The stable id of a VM's vGPU (its grant-service id).
    pub fn vgpu_id(&self, name: &str) -> u32 {
        let mut ids = lock(&self.ids);
        let next = ids.len() as u32;
        *ids.entry(name.to_owned()).or_insert(next)
    }

    pub(crate) fn ensure_service(&self, cfg: &Config, gpu: u32) -> Result<(), Error> {
        if !cfg.daemon.scheduler {
            return Ok(());
        }
        if let std::collections::hash_map::Entry::Vacant(e) = lock(&self.services).entry(gpu) {
            let svc = GrantService::start(
                &crate::daemon::grant_socket(cfg, gpu),
                cfg.daemon.slice_us * 1000,
            )?;
            e.insert(Arc::new(svc));
        }
        Ok(())
    }

    /// GPUs on this host.
    pub fn gpu_count(&self) -> u32 {
        self.gpu_count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The GPU a VM's vGPU runs on now.
    pub fn gpu_of(&self, vm: &str) -> Option<u32> {
        if let Some(g) = lock(&self.current).get(vm) {
            return Some(*g);
        }
        lock(&self.cfg).vm(vm).map(|v| v.gpu.unwrap_or(0))
    }

    /// The grant service of GPU `gpu` (started if the scheduler runs and
    /// it has none yet).
    pub fn service(&self, gpu: u32) -> Result<Option<Arc<GrantService>>, Error> {
        let cfg = self.config();
        self.ensure_service(&cfg, gpu)?;
        Ok(lock(&self.services).get(&gpu).cloned())
    }

    /// Places the VMs that name no GPU and have none yet: memory-aware
    /// least-loaded (a vGPU not yet measured counts its memory limit's share
    /// of the GPU as its load).
    fn place_new(&self, cfg: &Config) {
        let mut p =
            scheduler::placement::Placer::new(self.placement_params(cfg), self.gpu_memory.clone());
        let demand = |v: &crate::config::VmConfig, g: u32| scheduler::placement::Demand {
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
            let g = p.place(self.vgpu_id(&v.name), demand(v, 0)).unwrap_or(0) as u32;
            lock(&self.current).insert(v.name.clone(), g);
            if let Err(e) = self.ensure_service(cfg, g) {
                tracing::error!("GPU {g}'s grant service: {e}");
            }
            self.event("placement", format!("{}: placed on GPU {g}", v.name));
        }
    }

    fn placement_params(&self, cfg: &Config) -> scheduler::placement::Params {
        let pl = cfg.placement;
        scheduler::placement::Params {
            over: pl.over,
            under: pl.under,
            watermark: pl.watermark,
            cooldown_ns: (pl.cooldown_s * 1e9) as u64,
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
            scheduler::placement::Placer::new(self.placement_params(&cfg), self.gpu_memory.clone())
        });
        let mut seen = std::collections::HashSet::new();
        for g in st["gpus"].as_array().into_iter().flatten() {
            for v in g["vgpus"].as_array().into_iter().flatten() {
                let Some(name) = v["name"].as_str() else {
                    continue;
                };
                let id = self.vgpu_id(name);
                seen.insert(id);
                let gpu = v["gpu"].as_u64().unwrap_or(0) as usize;
                let d = scheduler::placement::Demand {
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
                p.set_pinned(id, v["pinned"] == true || busy_or_failed);
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
        let now = self.started.elapsed().as_nanos() as u64;
        let moves = p.balance(now);
        drop(guard);
        let names: HashMap<u32, String> = lock(&self.ids)
            .iter()
            .map(|(n, id)| (*id, n.clone()))
            .collect();
        for m in moves {
            if let Some(vm) = names.get(&m.vgpu) {
                if let Err(e) = self.request_migration(vm, m.to as u32) {
                    tracing::debug!(vm, "balancer's move not made: {e}");
                }
            }
        }
    }

    /// Asks for `vm`'s vGPU to move to `gpu` (the supervisor carries it out).
    pub fn request_migration(&self, vm: &str, gpu: u32) -> Result<(), String> {
        let from = self
            .gpu_of(vm)
            .ok_or_else(|| format!("no vm named {vm:?}"))?;
        if gpu >= self.gpu_count() {
            return Err(format!("no GPU {gpu}: this host has {}", self.gpu_count()));
        }
        if gpu == from {
            return Err(format!("{vm} is on GPU {gpu} already"));
        }
        if lock(&self.pinned).contains(vm) {
            return Err(format!("{vm} is pinned: unpin it to move it"));
        }
        let mut m = lock(&self.migrations);
        if matches!(
            m.get(vm),
            Some(Migration::Requested(_) | Migration::InFlight { .. })
        ) {
            return Err(format!("{vm} is moving already"));
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
                let e = format!(
                    "{vm}: could not move to GPU {}; it stays on GPU {from}",
                    r.gpu
                );
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
    pub fn migrate(&self, vm: &str, gpu: u32, timeout: Duration) -> Result<Value, String> {
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
                Some(Migration::Failed(e)) => return Err(e.clone()),
                _ => {}
            }
            if t.elapsed() > timeout {
                return Err(format!("{vm}: the migration did not finish in {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Forbids (or allows again) moving `vm`.
    pub fn set_pinned(&self, vm: &str, pinned: bool) -> Result<(), String> {
        if lock(&self.cfg).vm(vm).is_none() {
            return Err(format!("no vm named {vm:?}"));
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

    /// Where the daemon counts the log lines about `vm`'s peers it
    /// suppressed (status `log_lines_suppressed`, with its worker's).
    pub fn watch_log_suppressed(&self, vm: &str, counter: Arc<std::sync::atomic::AtomicU64>) {
        lock(&self.daemon_logs_suppressed).insert(vm.to_owned(), counter);
    }

    /// Counts a restart of a VM's worker (status `worker_restarts`).
    pub fn worker_restarted(&self, vm: &str) {
        *lock(&self.restarts).entry(vm.to_owned()).or_default() += 1;
    }

    /// Records an event for the dashboard and the status.
    pub fn event(&self, kind: &str, message: String) {
        tracing::info!(kind, "{message}");
        let mut ev = lock(&self.events);
        ev.push_back(json!({
            "t": self.started.elapsed().as_secs_f64(),
            "kind": kind,
            "message": message,
        }));
        while ev.len() > 100 {
            ev.pop_front();
        }
    }

    /// Takes a snapshot of every vGPU's live figures.
    pub fn sample(&self) {
        let mut live = HashMap::new();
        for svc in lock(&self.services).values() {
            // A vGPU that moved is known to its old GPU's service too
            // (disconnected): the one it is connected to wins.
            for (id, v) in svc.live() {
                match live.entry(id) {
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(v);
                    }
                    std::collections::hash_map::Entry::Occupied(mut e) => {
                        if v.connected && !e.get().connected {
                            e.insert(v);
                        }
                    }
                }
            }
        }
        let mut h = lock(&self.history);
        h.push_back(Snapshot {
            at: Instant::now(),
            live,
        });
        while h.len() > 2 && h[1].at.elapsed() > WINDOW * 2 {
            h.pop_front();
        }
    }

    /// Sets a VM's weight now (until the next reload or restart).
    pub fn set_weight(&self, vm: &str, weight: f64) -> Result<(), String> {
        if !(weight.is_finite() && weight > 0.0) {
            return Err(format!("weight must be a positive number, not {weight}"));
        }
        let (gpu, tenant, tenant_weight) = {
            let mut cfg = lock(&self.cfg);
            let Some(v) = cfg.vms.iter_mut().find(|v| v.name == vm) else {
                return Err(format!("no vm named {vm:?}"));
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
        self.event("weight", format!("{vm}: weight set to {weight}"));
        Ok(())
    }

    /// Sets a VM's memory limit now (until the next reload or restart): the
    /// supervisor passes it to the worker, whose guests' next allocations
    /// see it.
    pub fn set_memory_limit(&self, vm: &str, mib: u64) -> Result<(), String> {
        let mut cfg = lock(&self.cfg);
        if cfg.daemon.executor == ExecutorKind::Sim && mib << 20 > cfg.sim.memory {
            return Err(format!(
                "{mib} MiB exceeds the GPU's {} MiB",
                cfg.sim.memory >> 20
            ));
        }
        if mib == 0 || mib > (1 << 40) {
            return Err(format!("memory limit {mib} MiB is out of range"));
        }
        let Some(v) = cfg.vms.iter_mut().find(|v| v.name == vm) else {
            return Err(format!("no vm named {vm:?}"));
        };
        v.memory_limit_mib = mib;
        drop(cfg);
        self.event("limit", format!("{vm}: memory limit set to {mib} MiB"));
        Ok(())
    }

    /// Records the vCPU thread ids of a VM (vCPU order; empty when its vGPU
    /// was detached) and hands them to its worker through
    /// `<run_dir>/<vm>.vcpus`, for the coscheduling boost.
    pub fn set_vcpus(&self, vm: &str, threads: Vec<u32>) -> Result<(), String> {
        let cfg = self.config();
        if cfg.vm(vm).is_none() {
            return Err(format!("no vm named {vm:?}"));
        }
        let file = crate::attach::vcpus_file(&cfg, vm);
        let text: String = threads.iter().map(|t| format!("{t}\n")).collect();
        let tmp = file.with_extension("vcpus.tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &file))
            .map_err(|e| format!("writing {}: {e}", file.display()))?;
        self.event(
            "vcpus",
            if threads.is_empty() {
                format!("{vm}: vGPU detached")
            } else {
                format!("{vm}: vGPU attached, vCPU threads {threads:?}")
            },
        );
        lock(&self.vcpus).insert(vm.to_owned(), threads);
        Ok(())
    }

    /// VM `vm`'s plug, or "no vm named ..." (the API's 404).
    fn plug(&self, vm: &str) -> Result<crate::attach::Plug, String> {
        let cfg = self.config();
        if cfg.vm(vm).is_none() {
            return Err(format!("no vm named {vm:?}"));
        }
        crate::attach::Plug::for_vm(&cfg, vm).map_err(|e| e.to_string())
    }

    /// Hot-plugs VM `vm`'s vGPU into the QEMU behind the QMP socket `qmp`
    /// and keeps its vCPU threads; returns them.
    pub fn attach(&self, vm: &str, qmp: &Path) -> Result<Vec<u32>, String> {
        let plug = self.plug(vm)?;
        let threads = crate::attach::connect(qmp)
            .and_then(|mut q| plug.attach(&mut q))
            .map_err(|e| e.to_string())?;
        self.set_vcpus(vm, threads.clone())?;
        Ok(threads)
    }

    /// Hot-unplugs VM `vm`'s vGPU (the guest gets `timeout` to release it).
    pub fn detach(&self, vm: &str, qmp: &Path, timeout: Duration) -> Result<(), String> {
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

    fn try_reload(&self) -> Result<Vec<String>, String> {
        let new = Config::load(&self.config_path).map_err(|e| e.to_string())?;
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
                            "{}: worker_cpu applies when its worker restarts",
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
        Ok(notes)
    }

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
            let members: Vec<scheduler::tenants::Member<'_>> = vms
                .iter()
                .zip(&rows)
                .map(|(v, r)| scheduler::tenants::Member {
                    tenant: &v.tenant,
                    weight: v.weight,
                    tenant_weight: cfg.tenant_weight(&v.tenant),
                    active: active(r),
                })
                .collect();
            let eff = scheduler::tenants::effective_weights(&members);
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
                    "interactive": sync_rate > scheduler::classify::INTERACTIVE_SYNC_PER_SECOND,
                    "launches": r.1.report.launches,
                    "memory_used_bytes": r.1.report.mem_used,
                    "memory_limit_bytes": v.memory_limit_mib << 20,
                    "worker_restarts": lock(&self.restarts).get(&v.name).copied().unwrap_or(0),
                    "gpu": g,
                    "demand": demand(r.0),
                    "occupancy": r.1.report.occupancy_ppm as f64 / 1e6,
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
                    "grants_revoked": r.1.revoked,
                }));
            }
            let mmr = if ratios.len() >= 2 && ratios.iter().any(|&r| r > 0.0) {
                json!(scheduler::mmr(&ratios))
            } else {
                Value::Null
            };
            out.push(json!({
                "index": g,
                "utilization": if dt > 0.0 { (total as f64 / 1e9 / dt).min(1.0) } else { 0.0 },
                "memory_used_bytes": mem_used,
                "memory_total_bytes": if cfg.daemon.executor == ExecutorKind::Sim {
                    json!(cfg.sim.memory)
                } else {
                    Value::Null
                },
                "mmr": mmr,
                "vgpus": list,
            }));
        }
        let (rss, fds) = crate::procfs::own_usage();
        json!({
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "daemon": { "rss_bytes": rss, "open_fds": fds },
            "window_seconds": WINDOW.as_secs_f64(),
            "scheduler": cfg.daemon.scheduler,
            "executor": format!("{:?}", cfg.daemon.executor).to_lowercase(),
            "gpus": out,
            "events": lock(&self.events).iter().cloned().collect::<Vec<_>>(),
        })
    }

    /// The Prometheus exposition of [`ControlPlane::status`].
    pub fn metrics(&self) -> String {
        let st = self.status();
        let mut m = Metrics::default();
        m.gauge(
            "fairvgpu_daemon_resident_bytes",
            "Resident memory of the daemon.",
            "",
            &st["daemon"]["rss_bytes"],
        );
        m.gauge(
            "fairvgpu_daemon_open_fds",
            "Open file descriptors of the daemon.",
            "",
            &st["daemon"]["open_fds"],
        );
        for g in st["gpus"].as_array().into_iter().flatten() {
            let gl = format!("gpu=\"{}\"", g["index"]);
            m.gauge(
                "fairvgpu_gpu_utilization",
                "Fraction of the window the GPU was charged to vGPUs.",
                &gl,
                &g["utilization"],
            );
            m.gauge(
                "fairvgpu_gpu_memory_used_bytes",
                "Device memory allocated by the GPU's vGPUs.",
                &gl,
                &g["memory_used_bytes"],
            );
            m.gauge(
                "fairvgpu_gpu_memory_total_bytes",
                "Device memory of the GPU (sim executor).",
                &gl,
                &g["memory_total_bytes"],
            );
            m.gauge(
                "fairvgpu_gpu_mmr",
                "Min-Max Ratio of share over entitlement among active vGPUs, over the window.",
                &gl,
                &g["mmr"],
            );
            for v in g["vgpus"].as_array().into_iter().flatten() {
                let l = format!(
                    "{gl},vm=\"{}\",tenant=\"{}\"",
                    v["name"].as_str().unwrap_or_default(),
                    v["tenant"].as_str().unwrap_or_default()
                );
                m.counter(
                    "fairvgpu_vgpu_gpu_seconds_total",
                    "GPU time charged to the vGPU.",
                    &l,
                    &v["gpu_seconds"],
                );
                m.gauge(
                    "fairvgpu_vgpu_share",
                    "The vGPU's share of its GPU's charged time over the window.",
                    &l,
                    &v["share"],
                );
                m.gauge(
                    "fairvgpu_vgpu_entitlement",
                    "The vGPU's weighted fair share among active vGPUs.",
                    &l,
                    &v["entitlement"],
                );
                m.gauge(
                    "fairvgpu_vgpu_weight",
                    "Scheduling weight.",
                    &l,
                    &v["weight"],
                );
                m.gauge(
                    "fairvgpu_vgpu_queue_depth",
                    "Requests waiting in the vGPU's rings.",
                    &l,
                    &v["queue_depth"],
                );
                m.gauge(
                    "fairvgpu_vgpu_sync_calls_per_second",
                    "Synchronous calls per second over the window.",
                    &l,
                    &v["sync_calls_per_second"],
                );
                m.gauge(
                    "fairvgpu_vgpu_interactive",
                    "1 if CPU-GPU interactive (over 10 synchronous calls per 10 ms).",
                    &l,
                    &json!(u8::from(v["interactive"] == true)),
                );
                m.gauge(
                    "fairvgpu_vgpu_memory_used_bytes",
                    "Device memory allocated.",
                    &l,
                    &v["memory_used_bytes"],
                );
                m.gauge(
                    "fairvgpu_vgpu_memory_limit_bytes",
                    "Device memory limit.",
                    &l,
                    &v["memory_limit_bytes"],
                );
                m.counter(
                    "fairvgpu_vgpu_migrations_total",
                    "Moves of the vGPU to another GPU.",
                    &l,
                    &v["migrations"],
                );
                m.gauge(
                    "fairvgpu_vgpu_occupancy",
                    "Mean fraction of the GPU's cores its recent launches could occupy.",
                    &l,
                    &v["occupancy"],
                );
                m.gauge(
                    "fairvgpu_vgpu_demand",
                    "Share of the window the vGPU wanted or held its GPU (what placement balances).",
                    &l,
                    &v["demand"],
                );
                m.counter(
                    "fairvgpu_vgpu_requests_total",
                    "Requests served by the vGPU's current worker process.",
                    &l,
                    &v["requests"],
                );
                m.counter(
                    "fairvgpu_vgpu_refused_total",
                    "Requests refused as bad input by the vGPU's current worker process.",
                    &l,
                    &v["refused"],
                );
                m.gauge(
                    "fairvgpu_vgpu_worker_resident_bytes",
                    "Resident memory of the vGPU's worker process.",
                    &l,
                    &v["worker_rss_bytes"],
                );
                m.gauge(
                    "fairvgpu_vgpu_worker_open_fds",
                    "Open file descriptors of the vGPU's worker process.",
                    &l,
                    &v["worker_open_fds"],
                );
                m.counter(
                    "fairvgpu_vgpu_log_lines_suppressed_total",
                    "Log lines the VM's guests triggered that the daemon and the vGPU's current worker suppressed (rate-limited per VM).",
                    &l,
                    &v["log_lines_suppressed"],
                );
                m.counter(
                    "fairvgpu_vgpu_grants_revoked_total",
                    "Grants taken back because the vGPU's worker kept the GPU far past its slice.",
                    &l,
                    &v["grants_revoked"],
                );
                m.counter(
                    "fairvgpu_vgpu_worker_restarts_total",
                    "Times the vGPU's worker died and was restarted on the same region.",
                    &l,
                    &v["worker_restarts"],
                );
                m.gauge(
                    "fairvgpu_vgpu_connected",
                    "1 if the vGPU's worker is connected to its GPU's scheduler.",
                    &l,
                    &json!(u8::from(v["connected"] == true)),
                );
            }
        }
        m.finish()
    }

    /// Serves one API request. `tcp`: it came over TCP (a token is needed).
    pub fn handle(&self, req: &Request, tcp: bool) -> Response {
        let public = req.method == "GET" && (req.path == "/" || req.path == "/api/v1/openapi.json");
        if tcp && !public {
            let ok = match (&self.token, &req.bearer) {
                (Some(t), Some(b)) => same_token(t, b),
                _ => false,
            };
            if !ok {
                return Response::error(401, "a valid bearer token is required");
            }
        }
        let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
        match (req.method.as_str(), parts.as_slice()) {
            ("GET", [""]) => Response {
                status: 200,
                content_type: "text/html; charset=utf-8",
                body: DASHBOARD.as_bytes().to_vec(),
            },
            ("GET", ["api", "v1", "openapi.json"]) => Response {
                status: 200,
                content_type: "application/json",
                body: OPENAPI.as_bytes().to_vec(),
            },
            ("GET", ["api", "v1", "status"]) => Response::json(200, &self.status()),
            ("GET", ["metrics"]) => Response {
                status: 200,
                content_type: "text/plain; version=0.0.4",
                body: self.metrics().into_bytes(),
            },
            ("POST", ["api", "v1", "vgpus", vm, "weight"]) => {
                let w = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| v["weight"].as_f64());
                let Some(w) = w else {
                    return Response::error(400, "expected a body like {\"weight\": 2}");
                };
                match self.set_weight(vm, w) {
                    Ok(()) => Response::json(200, &json!({ "vm": vm, "weight": w })),
                    Err(e) if e.starts_with("no vm") => Response::error(404, e),
                    Err(e) => Response::error(400, e),
                }
            }
            ("POST", ["api", "v1", "vgpus", vm, "vcpus"]) => {
                let threads = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| {
                        v["threads"]
                            .as_array()?
                            .iter()
                            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                            .collect::<Option<Vec<u32>>>()
                    });
                let Some(threads) = threads else {
                    return Response::error(
                        400,
                        "expected a body like {\"threads\": [1234, 1235]}",
                    );
                };
                match self.set_vcpus(vm, threads.clone()) {
                    Ok(()) => Response::json(200, &json!({ "vm": vm, "threads": threads })),
                    Err(e) if e.starts_with("no vm") => Response::error(404, e),
                    Err(e) => Response::error(500, e),
                }
            }
            ("POST", ["api", "v1", "vgpus", vm, verb @ ("attach" | "detach")]) => {
                let body = serde_json::from_slice::<Value>(&req.body).unwrap_or(Value::Null);
                let Some(qmp) = body["qmp"].as_str().map(PathBuf::from) else {
                    return Response::error(
                        400,
                        "expected a body like {\"qmp\": \"/run/qemu/vm1.qmp\"}",
                    );
                };
                let r = if *verb == "attach" {
                    let vectors = self.config().layout.vectors as usize;
                    self.attach(vm, &qmp).map(|t| {
                        let mut v = json!({ "vm": vm, "attached": true, "vcpu_threads": t });
                        if t.len() > vectors {
                            v["warning"] = json!(format!(
                                "{} vCPUs share {vectors} doorbell vectors: a kick may land on \
                                 another vCPU than the one that waits ([layout] vectors)",
                                t.len()
                            ));
                        }
                        v
                    })
                } else {
                    let secs = body["timeout_seconds"].as_u64().unwrap_or(60).clamp(1, 600);
                    self.detach(vm, &qmp, Duration::from_secs(secs))
                        .map(|()| json!({ "vm": vm, "attached": false }))
                };
                match r {
                    Ok(v) => Response::json(200, &v),
                    Err(e) if e.starts_with("no vm") => Response::error(404, e),
                    Err(e) => Response::error(409, e),
                }
            }
            ("POST", ["api", "v1", "vgpus", vm, "memory_limit"]) => {
                let mib = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| v["mib"].as_u64());
                let Some(mib) = mib else {
                    return Response::error(400, "expected a body like {\"mib\": 4096}");
                };
                match self.set_memory_limit(vm, mib) {
                    Ok(()) => Response::json(200, &json!({ "vm": vm, "memory_limit_mib": mib })),
                    Err(e) if e.starts_with("no vm") => Response::error(404, e),
                    Err(e) => Response::error(400, e),
                }
            }
            ("POST", ["api", "v1", "vgpus", vm, "migrate"]) => {
                let gpu = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| v["gpu"].as_u64())
                    .and_then(|g| u32::try_from(g).ok());
                let Some(gpu) = gpu else {
                    return Response::error(400, "expected a body like {\"gpu\": 1}");
                };
                match self.migrate(vm, gpu, Duration::from_secs(60)) {
                    Ok(v) => Response::json(200, &v),
                    Err(e) if e.starts_with("no vm") => Response::error(404, e),
                    Err(e) => Response::error(409, e),
                }
            }
            ("POST", ["api", "v1", "vgpus", vm, "pin"]) => {
                let pinned = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| v["pinned"].as_bool());
                let Some(pinned) = pinned else {
                    return Response::error(400, "expected a body like {\"pinned\": true}");
                };
                match self.set_pinned(vm, pinned) {
                    Ok(()) => Response::json(200, &json!({ "vm": vm, "pinned": pinned })),
                    Err(e) => Response::error(404, e),
                }
            }
            ("POST", ["api", "v1", "reload"]) => match self.reload() {
                Ok(notes) => Response::json(200, &json!({ "reloaded": true, "notes": notes })),
                Err(e) => Response::error(400, format!("config kept: {e}")),
            },
            (_, ["api", ..] | ["metrics"]) => Response::error(405, "no such method here"),
            _ => Response::error(404, "not found"),
        }
    }
}

/// Whether two config sections are equal (compared through their TOML text).
fn same<T: serde::Serialize>(a: &T, b: &T) -> bool {
    toml::to_string(a).ok() == toml::to_string(b).ok()
}

/// Prometheus text: each metric's HELP and TYPE, then its samples.
#[derive(Default)]
struct Metrics {
    /// (name, type, help, sample lines), in first-seen order.
    metrics: Vec<(&'static str, &'static str, &'static str, Vec<String>)>,
}

impl Metrics {
    fn line(
        &mut self,
        kind: &'static str,
        name: &'static str,
        help: &'static str,
        labels: &str,
        v: &Value,
    ) {
        let Some(x) = v.as_f64() else { return };
        let sample = if labels.is_empty() {
            format!("{name} {x}\n")
        } else {
            format!("{name}{{{labels}}} {x}\n")
        };
        match self.metrics.iter_mut().find(|m| m.0 == name) {
            Some(m) => m.3.push(sample),
            None => self.metrics.push((name, kind, help, vec![sample])),
        }
    }
    fn gauge(&mut self, name: &'static str, help: &'static str, labels: &str, v: &Value) {
        self.line("gauge", name, help, labels, v);
    }
    fn counter(&mut self, name: &'static str, help: &'static str, labels: &str, v: &Value) {
        self.line("counter", name, help, labels, v);
    }
    fn finish(self) -> String {
        let mut out = String::new();
        for (name, kind, help, samples) in self.metrics {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            out.extend(samples);
        }
        out
    }
}

/// Serves the API on the unix socket (and TCP if configured) and samples
/// the live figures, on background threads.
pub fn start(plane: &Arc<ControlPlane>) -> Result<(), Error> {
    let cfg = plane.config();
    let path = cfg.api_socket();
    let _ = std::fs::remove_file(&path);
    let unix = UnixListener::bind(&path).map_err(|source| Error::Io {
        what: "binding the API socket",
        source,
    })?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).map_err(|source| {
        Error::Io {
            what: "API socket permissions",
            source,
        }
    })?;
    let p = plane.clone();
    spawn("api-unix", move || {
        for s in unix.incoming().flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            dispatch(&p, s, false);
        }
    })?;
    if let Some(addr) = &cfg.api.tcp {
        let tcp = std::net::TcpListener::bind(addr).map_err(|source| Error::Io {
            what: "binding the API TCP address",
            source,
        })?;
        let p = plane.clone();
        spawn("api-tcp", move || {
            for s in tcp.incoming().flatten() {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                dispatch(&p, s, true);
            }
        })?;
    }
    let p = plane.clone();
    spawn("api-sampler", move || loop {
        p.sample();
        std::thread::sleep(SAMPLE_EVERY);
    })?;
    tracing::info!(socket = %path.display(), tcp = ?cfg.api.tcp, "control API serving");
    Ok(())
}

/// Requests served at once; a detach can wait a minute for its guest, so
/// requests run on their own threads, up to this many (then inline).
const MAX_CONCURRENT: usize = 16;

fn dispatch<S>(plane: &Arc<ControlPlane>, s: S, tcp: bool)
where
    S: Send + 'static,
    for<'a> &'a S: std::io::Read + std::io::Write,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    static ACTIVE: AtomicUsize = AtomicUsize::new(0);
    if ACTIVE.fetch_add(1, Ordering::AcqRel) >= MAX_CONCURRENT {
        serve_one(plane, &s, tcp);
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let p = plane.clone();
    let r = std::thread::Builder::new()
        .name("api-request".into())
        .spawn(move || {
            serve_one(&p, &s, tcp);
            ACTIVE.fetch_sub(1, Ordering::AcqRel);
        });
    if r.is_err() {
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One exchange on a connection (`&UnixStream` and `&TcpStream` read and write).
fn serve_one<S: std::io::Read + std::io::Write + Copy>(plane: &ControlPlane, s: S, tcp: bool) {
    let resp = match http::read_request(s) {
        Ok(req) => plane.handle(&req, tcp),
        Err(resp) => resp,
    };
    let _ = http::write_response(s, &resp);
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), Error> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|source| Error::Io {
            what: "spawning an API thread",
            source,
        })
}

/// The CLI's client: one call to the API of the daemon configured in
/// `config` (its unix socket), or at `api` ("unix:PATH" or "http://HOST:PORT").
pub fn client_call(
    target: &ApiTarget,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>), Error> {
    let io = |source| Error::Io {
        what: "calling the control API",
        source,
    };
    match target {
        ApiTarget::Unix(p) => {
            let s = std::os::unix::net::UnixStream::connect(p).map_err(|source| Error::Io {
                what: "connecting to the API socket (is the daemon running?)",
                source,
            })?;
            http::call(s, method, path, None, body).map_err(io)
        }
        ApiTarget::Tcp { addr, token } => {
            let s = std::net::TcpStream::connect(addr).map_err(io)?;
            http::call(s, method, path, token.as_deref(), body).map_err(io)
        }
    }
}

/// Where the CLI finds the API.
#[derive(Debug, Clone)]
pub enum ApiTarget {
    /// A unix socket.
    Unix(PathBuf),
    /// A TCP address with its token.
    Tcp {
        /// host:port
        addr: String,
        /// Bearer token.
        token: Option<String>,
    },
}

/// Reads a bearer token file: one word of at least 16 characters.
pub fn token_from_file(path: &Path) -> Result<String, Error> {
    let t = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("token file {}: {e}", path.display())))?;
    let t = t.trim().to_owned();
    if t.len() < 16 || t.chars().any(|c| c.is_whitespace()) {
        return Err(Error::Config(format!(
            "token file {}: the token must be one word of at least 16 characters",
            path.display()
        )));
    }
    Ok(t)
}
