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
//! - `POST /api/v1/vgpus/{vm}/checkpoint` `{"file": "vm1.fvgpu"}`: hold the
//!   vGPU and write its checkpoint to that file of `[daemon]
//!   checkpoint_dir`; it stays held until `resume` or its VM is gone
//!   (`"paused": true`: the region too; `"replace": true`: over a file)
//! - `POST /api/v1/vgpus/{vm}/resume`: let a held vGPU go on
//! - `POST /api/v1/vgpus/{vm}/restore` `{"file": "vm1.fvgpu"}`: serve the
//!   VM's processes on from that checkpoint (its QEMU restored and paused)
//! - `POST /api/v1/vgpus/{vm}/pin` `{"pinned": true}`: forbid (or allow
//!   again) moving it, by the balancer or by hand
//! - `PUT /api/v1/vgpus/{vm}` `{"tenant": "acme", "weight": 2,
//!   "memory_limit_mib": 4096}`: declare a vGPU now (or update a declared
//!   one's weight and limit); `DELETE /api/v1/vgpus/{vm}`: give it back
//! - `POST /api/v1/reload`: re-read host.toml (also on SIGHUP; declared
//!   vGPUs stay)
//! - `GET /metrics`: Prometheus text format
//! - `GET /`: the dashboard
//!
//! Figures over a sliding window of [`WINDOW`]: share = the vGPU's charged GPU
//! time over all charged on its GPU; entitlement = its effective weight
//! (its own, or its tenant's split among the tenant's active vGPUs) over
//! those of the vGPUs active on that GPU (charged, queued or holding);
//! MMR = min over max of share/entitlement among active vGPUs.
//!
//! Here the live state (`ControlPlane`) and its sampling; `placement.rs`
//! the balancer and migrations, `settings.rs` what the operator changes at
//! run time (weights, limits, hot-plug, reload), `declare.rs` vGPUs
//! declared and given back through the API, `status.rs` and
//! `metrics.rs` the figures, `api.rs` the API's routes and sockets,
//! `client.rs` the CLI's side, `http.rs` the HTTP it speaks.

mod api;
mod client;
mod declare;
pub mod http;
mod metrics;
mod placement;
mod saves;
mod settings;
mod status;

pub use api::{start, token_from_file};
pub use client::{client_call, ApiTarget};
pub use declare::{Declared, VgpuDeclaration};
pub use placement::Migration;
pub use saves::{check_file_name, Arrival, CheckpointWith, SaveAsk, SaveOp, IMAGES_MAX};

/// Why the control plane refused an operator's change. Besides a VM it does
/// not know (the API's 404), the text is the API's answer as it stands.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The config has no VM of this name.
    #[error("no vm named {0:?}")]
    NoVm(String),
    /// The VM is there, but not as the change needs it (the API's 409).
    #[error("{0}")]
    Conflict(String),
    /// Any other reason, said for the operator.
    #[error("{0}")]
    Other(String),
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal::Other(why)
    }
}

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::{Config, ExecutorKind};
use crate::grant::{GrantService, VgpuLive};
use crate::Error;
use api::read_token;

/// The sliding window of the live figures.
pub const WINDOW: Duration = Duration::from_secs(5);
/// How often the live figures are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

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
    /// Workers per VM that ended other than with their process (a crash,
    /// a poisoned context, ended by the daemon), since the daemon started.
    faults: Mutex<HashMap<String, u64>>,
    /// Per VM: the host pids of its running processes' workers.
    workers: Mutex<HashMap<String, Vec<u32>>>,
    /// Per VM: log lines about its peers the daemon suppressed (its
    /// ivshmem server's count, see `transport::ratelimit`).
    daemon_logs_suppressed: Mutex<HashMap<String, Arc<std::sync::atomic::AtomicU64>>>,
    /// The module image store's figures, when images are shared.
    image_store: Mutex<Option<Arc<crate::image_store::StoreStats>>>,
    /// The GPU each vGPU runs on, where it moved from its configured one.
    current: Mutex<HashMap<String, u32>>,
    /// vGPUs that must not move.
    pinned: Mutex<std::collections::HashSet<String>>,
    /// Migrations asked for, under way, or just finished, per VM.
    migrations: Mutex<HashMap<String, Migration>>,
    /// vGPUs declared through the API (not in host.toml), by VM name.
    declared: Mutex<std::collections::BTreeMap<String, VgpuDeclaration>>,
    /// Migrations done per VM.
    migrated: Mutex<HashMap<String, u64>>,
    /// Checkpoints asked for and not yet taken by the supervisor.
    save_asks: Mutex<Vec<SaveAsk>>,
    /// VMs whose checkpoint to a file is under way, and how many asks:
    /// their vGPU is given back only once it is written (libvirt's save
    /// ends the domain while the daemon may still be writing).
    checkpointing: Mutex<HashMap<String, usize>>,
    /// vGPUs handed over from other hosts, for the supervisor.
    arrivals: Mutex<Vec<saves::Arrival>>,
    /// Tells the supervisor of a new ask or arrival, ending its pause
    /// between turns (up to 20 ms; the guest may be paused meanwhile).
    ring: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// Streams a checkpoint sent ahead left, by VM: memfds whose pages the
    /// handover's checkpoint reuses (`saves.rs`).
    warm_streams: Mutex<HashMap<String, saves::Warm>>,
    /// GPUs on this host.
    gpu_count: std::sync::atomic::AtomicU32,
    /// Memory of each GPU, bytes.
    gpu_memory: Vec<u64>,
    /// Each GPU's base time slice, ns (`daemon::gpu_slice_ns`).
    gpu_slice_ns: Vec<u64>,
    /// The balancer's view (DCUDA placement), kept between rounds.
    placer: Mutex<Option<sched::placement::Placer>>,
    token: Option<String>,
    started: Instant,
    /// The host CPU options in force (see `hostcpu`).
    pub host_cpu: Arc<crate::hostcpu::HostCpu>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("config_path", &self.config_path)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// The plane for `cfg`, read from `config_path`; starts one grant
    /// service per GPU in use when the scheduler is on, with the host CPU
    /// options `host_cpu`.
    pub fn new(
        cfg: Config,
        config_path: &Path,
        host_cpu: Arc<crate::hostcpu::HostCpu>,
    ) -> Result<Arc<ControlPlane>, Error> {
        let token = read_token(&cfg)?;
        let plane = ControlPlane {
            config_path: config_path.to_owned(),
            ids: Mutex::new(HashMap::new()),
            services: Mutex::new(HashMap::new()),
            history: Mutex::new(VecDeque::new()),
            events: Mutex::new(VecDeque::new()),
            vcpus: Mutex::new(HashMap::new()),
            faults: Mutex::new(HashMap::new()),
            workers: Mutex::new(HashMap::new()),
            daemon_logs_suppressed: Mutex::new(HashMap::new()),
            image_store: Mutex::new(None),
            current: Mutex::new(HashMap::new()),
            pinned: Mutex::new(Default::default()),
            migrations: Mutex::new(HashMap::new()),
            migrated: Mutex::new(HashMap::new()),
            save_asks: Mutex::new(Vec::new()),
            ring: Mutex::new(None),
            checkpointing: Mutex::new(HashMap::new()),
            arrivals: Mutex::new(Vec::new()),
            warm_streams: Mutex::new(HashMap::new()),
            declared: Mutex::new(Default::default()),
            gpu_count: std::sync::atomic::AtomicU32::new(match cfg.daemon.executor {
                ExecutorKind::Sim => cfg.sim.gpus.max(1),
                ExecutorKind::Cuda => worker::executor::cuda::device_count().unwrap_or(1),
            }),
            gpu_memory: Vec::new(),
            gpu_slice_ns: Vec::new(),
            placer: Mutex::new(None),
            token,
            started: Instant::now(),
            host_cpu,
            cfg: Mutex::new(cfg.clone()),
        };
        let mut plane = plane;
        plane.gpu_memory = (0..plane.gpu_count())
            .map(|g| match cfg.daemon.executor {
                ExecutorKind::Sim => cfg.sim.memory,
                ExecutorKind::Cuda => worker::executor::cuda::device_memory(g).unwrap_or(0),
            })
            .collect();
        plane.gpu_slice_ns = (0..plane.gpu_count())
            .map(|g| crate::setup::gpu_slice_ns(&cfg, g))
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
                svc.set_corun(plane.vgpu_id(&vm.name), vm.corun)?;
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
        // One id per VM name ever seen: never near u32::MAX.
        let next = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        *ids.entry(name.to_owned()).or_insert(next)
    }

    pub(crate) fn ensure_service(&self, cfg: &Config, gpu: u32) -> Result<(), Error> {
        if !cfg.daemon.scheduler {
            return Ok(());
        }
        if let std::collections::hash_map::Entry::Vacant(e) = lock(&self.services).entry(gpu) {
            let slice_ns = self.slice_ns(cfg, gpu);
            tracing::info!(gpu, slice_us = slice_ns / 1000, "grant service starts");
            let svc = GrantService::start_lifted(
                &crate::setup::grant_socket(cfg, gpu),
                slice_ns,
                cfg.gpu_policy(gpu),
                cfg.gpu_mps(gpu),
                cfg.gpu_sharing(gpu),
                self.host_cpu.service_lift(),
            )?;
            e.insert(Arc::new(svc));
        }
        Ok(())
    }

    /// GPU `gpu`'s base time slice under `cfg`, ns (as probed at start;
    /// see `daemon::gpu_slice_ns`).
    pub fn slice_ns(&self, cfg: &Config, gpu: u32) -> u64 {
        self.gpu_slice_ns
            .get(gpu as usize)
            .copied()
            .unwrap_or_else(|| crate::setup::gpu_slice_ns(cfg, gpu))
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

    /// Where the daemon counts the log lines about `vm`'s peers it
    /// suppressed (status `log_lines_suppressed`, with its worker's).
    pub fn watch_log_suppressed(&self, vm: &str, counter: Arc<std::sync::atomic::AtomicU64>) {
        lock(&self.daemon_logs_suppressed).insert(vm.to_owned(), counter);
    }

    /// Where the daemon's module image store counts (status `image_store`).
    pub fn watch_image_store(&self, stats: Arc<crate::image_store::StoreStats>) {
        *lock(&self.image_store) = Some(stats);
    }

    /// Counts a worker of `vm` that ended other than with its process
    /// (status `worker_faults`).
    pub fn worker_faulted(&self, vm: &str) {
        *lock(&self.faults).entry(vm.to_owned()).or_default() += 1;
    }

    /// Each VM's running workers' pids (status `worker_pids`), as the
    /// supervisor last saw them.
    pub fn set_workers(&self, workers: HashMap<String, Vec<u32>>) {
        *lock(&self.workers) = workers;
    }

    /// The daemon ended `vm`'s worker: its GPU's grant service forgets it
    /// now, so that its successor can register at once.
    pub fn forget_worker(&self, vm: &str) {
        let gpu = self.gpu_of(vm).unwrap_or(0);
        let id = self.vgpu_id(vm);
        if let Some(svc) = lock(&self.services).get(&gpu) {
            let _ = svc.forget(id);
        }
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
}
