//! `host.toml`: the GPUs' executor, the VMs with their tenant, weight and
//! device-memory limit. Unknown keys are errors, so a typo never becomes a
//! silent default.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use transport::{Layout, LayoutParams, SpinPolicy};

use crate::Error;
use worker::executor::sim::SimParams;

/// The longest time slice a config may set, µs (one second).
const MAX_SLICE_US: u64 = 1_000_000;

pub use worker::executor::{ExecutorKind, GraphLaunches};

/// Daemon-wide settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Where sockets are created.
    #[serde(default = "default_run_dir")]
    pub run_dir: PathBuf,
    /// The executor.
    #[serde(default)]
    pub executor: ExecutorKind,
    /// Fair scheduling of each GPU between its vGPUs (false: the driver's
    /// own time-slicing, first come first served).
    #[serde(default = "yes")]
    pub scheduler: bool,
    /// Base time slice, microseconds, on a GPU that cannot preempt a
    /// running kernel (FairGV: 6,000). See `sched::Slices`.
    #[serde(default = "default_slice_us")]
    pub slice_us: u64,
    /// Base time slice, microseconds, on a GPU that can (FairGV: 30,000),
    /// as every NVIDIA GPU since Pascal: there each hand-off is a context
    /// switch (about 135 us on an H100), which a 6 ms slice pays 2% for.
    #[serde(default = "default_preemptive_slice_us")]
    pub preemptive_slice_us: u64,
    /// Kernel slicing: a launch of more blocks than this runs as sub-grids
    /// of about this many blocks (never fewer than 1,500), between which the
    /// GPU can change hands; 0 leaves launches whole.
    #[serde(default)]
    pub slice_blocks: u64,
    /// Confine each worker once it has set up (no exec, no connections, no
    /// access to other processes; see `sandbox.rs`). Only for debugging a
    /// worker under a tracer would anyone turn this off.
    #[serde(default = "yes")]
    pub sandbox: bool,
    /// Which launches go to the GPU as CUDA graph launches.
    #[serde(default)]
    pub graph_launches: GraphLaunches,
    /// MiB of module images each vGPU's worker keeps by content, so that
    /// its processes send a library's images once (0: none).
    #[serde(default = "default_image_cache_mib")]
    pub image_cache_mib: u64,
    /// Share module images between VMs through the daemon's store: the
    /// bytes exist once on the host and a second VM's processes send only
    /// hashes (see `image_store.rs`).
    #[serde(default = "yes")]
    pub share_images: bool,
    /// A VM (on a GPU without MPS standbys) whose worker a sticky CUDA
    /// error once poisoned keeps a standby worker from then on, made
    /// ready beside the serving one and promoted at once after its next
    /// fault (see `supervisor/faults.rs`). Costs a VM that never faults nothing.
    #[serde(default = "yes")]
    pub fault_standby: bool,
    /// MiB the daemon's image store keeps at most, all VMs together (each
    /// VM's worker adds at most `image_cache_mib`).
    #[serde(default = "default_image_store_mib")]
    pub image_store_mib: u64,
    /// NVIDIA's MPS control program, for GPUs with `[[gpu]] mps = true`.
    #[serde(default = "default_mps_control")]
    pub mps_control: PathBuf,
    /// Priority lift: the nice value (-20..=-1) the grant services' threads
    /// and each worker's serving thread run at, so that on a busy host they
    /// do not wait for a CPU behind the VMs' vCPUs; 0 turns it off. Needs
    /// CAP_SYS_NICE (or root); where the host refuses it, it is reported off
    /// in `status` and nothing else changes (see `hostcpu/mod.rs`).
    #[serde(default = "default_priority")]
    pub priority: i32,
    /// vCPU lift: while a VM holds its GPU's grant, its vCPU threads (QMP's,
    /// or its native guest processes' threads) run at `priority` too, and
    /// get their own nice back when the grant moves. Needs the priority lift.
    #[serde(default = "yes")]
    pub vcpu_lift: bool,
    /// CPUs reserved for the daemon, its grant services and its workers, as
    /// a list like "0-1" or "0,2,4-5"; left out, they run on any CPU.
    #[serde(default)]
    pub cpus: Option<String>,
    /// The `cpu.weight` (1..=10000, the default cgroup's is 100) of a cgroup
    /// v2 child that the workers go into, where the daemon has a writable
    /// cgroup of its own; 0 turns it off (see `hostcpu/cgroup.rs`).
    #[serde(default = "default_cgroup_cpu_weight")]
    pub cgroup_cpu_weight: u64,
}

fn default_priority() -> i32 {
    -10
}

fn default_cgroup_cpu_weight() -> u64 {
    1000
}

fn default_mps_control() -> PathBuf {
    PathBuf::from("nvidia-cuda-mps-control")
}

fn default_image_store_mib() -> u64 {
    4096
}

fn yes() -> bool {
    true
}

fn default_image_cache_mib() -> u64 {
    512
}

fn default_slice_us() -> u64 {
    sched::Slices::default().non_preemptive_ns / 1000
}

fn default_preemptive_slice_us() -> u64 {
    sched::Slices::default().preemptive_ns / 1000
}

fn default_run_dir() -> PathBuf {
    PathBuf::from("/run/fairvgpu")
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            run_dir: default_run_dir(),
            executor: ExecutorKind::default(),
            scheduler: true,
            slice_us: default_slice_us(),
            preemptive_slice_us: default_preemptive_slice_us(),
            slice_blocks: 0,
            sandbox: true,
            graph_launches: GraphLaunches::default(),
            image_cache_mib: default_image_cache_mib(),
            share_images: true,
            fault_standby: true,
            image_store_mib: default_image_store_mib(),
            mps_control: default_mps_control(),
            priority: default_priority(),
            vcpu_lift: true,
            cpus: None,
            cgroup_cpu_weight: default_cgroup_cpu_weight(),
        }
    }
}

/// The control API (status, weights, reload, metrics, dashboard).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// Unix socket of the API (default `<run_dir>/api.sock`, mode 0660).
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// Also serve on this TCP address (e.g. "127.0.0.1:9400"); every
    /// request there needs `Authorization: Bearer <token>`.
    #[serde(default)]
    pub tcp: Option<String>,
    /// File holding the bearer token (at least 16 characters); required with `tcp`.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

/// One VM and its vGPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// Name (letters, digits, '-' and '_'); the socket is `<run_dir>/<name>.sock`.
    pub name: String,
    /// Tenant the VM belongs to.
    pub tenant: String,
    /// Scheduling weight (> 0).
    #[serde(default = "one")]
    pub weight: f64,
    /// Device memory the vGPU may allocate, MiB.
    pub memory_limit_mib: u64,
    /// Index of the GPU it starts on; left out, the daemon places it
    /// (least-loaded GPU with room for its memory limit).
    #[serde(default)]
    pub gpu: Option<u32>,
    /// Host CPU for the vGPU worker's serving thread; pin it beside the VM's
    /// vCPUs so that ring round trips stay in one cache domain.
    #[serde(default)]
    pub worker_cpu: Option<usize>,
    /// Page-locked host memory its guests may hold (`cuMemHostAlloc`,
    /// registered and managed memory), MiB, a multiple of 2; left out,
    /// `[layout] pinned_size`.
    #[serde(default)]
    pub pinned_mib: Option<u64>,
    /// Its tenant opts this vGPU in to co-running: on a GPU with
    /// `[[gpu]] mps = true` it may hold the GPU together with other opted-in
    /// vGPUs whose work fits beside its own, sharing their fault fate (see
    /// `grant/corun.rs`).
    #[serde(default)]
    pub corun: bool,
}

fn one() -> f64 {
    1.0
}

/// A tenant's weight: its share of each GPU against the other tenants,
/// split among its VMs there by their own weights (hierarchical weights).
/// A tenant without a `[[tenant]]` entry has none: its VMs' weights count
/// on their own, as flat weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The name VMs give as their `tenant`.
    pub name: String,
    /// Weight against the other tenants (> 0).
    pub weight: f64,
}

/// Placement of vGPUs on the host's GPUs and their live migration (DCUDA).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementConfig {
    /// Move running vGPUs between GPUs to balance them (with one GPU there
    /// is nothing to do).
    pub enabled: bool,
    /// How often the balancer looks, ms.
    pub interval_ms: u64,
    /// A GPU whose vGPUs demand more of its time than this is overloaded.
    pub over: f64,
    /// A GPU below this demand may take a vGPU.
    pub under: f64,
    /// Share of a GPU's memory its vGPUs' limits may add up to.
    pub watermark: f64,
    /// Move the vGPUs of the least-loaded GPU onto the next when both fit
    /// in one (leaving a GPU idle).
    pub compaction: bool,
    /// A moved vGPU stays put at least this long, s.
    pub cooldown_s: f64,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig {
            enabled: true,
            interval_ms: 100,
            over: 1.0,
            under: 0.9,
            watermark: 0.9,
            compaction: true,
            cooldown_s: 10.0,
        }
    }
}

/// One GPU's settings (`[[gpu]]`); a GPU without an entry takes the
/// defaults.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// The GPU's index (as `[[vm]] gpu` names it).
    pub index: u32,
    /// Who of its runnable vGPUs goes first: `"fair"` (start-tag fair
    /// queuing, the default), `"las"` (least attained service over weight,
    /// never forgotten) or `"tfs"` (attained service that fades): see
    /// `sched::policy`; or `"phase"`: the fair queue's order, and where
    /// vGPUs co-run (`mps`), one mostly copying and one computing may hold
    /// the GPU together (phase selection, `grant/corun.rs`).
    #[serde(default)]
    pub policy: sched::DevicePolicy,
    /// The daemon runs NVIDIA's Multi-Process Service for this GPU and its
    /// workers are its clients (see `mps.rs`: what it gives and costs; its
    /// vGPUs never move to another GPU), so opted-in vGPUs may co-run there.
    /// On the sim executor no MPS program runs; only the co-running grants
    /// do (the sim runs one kernel at a time, so they test the plumbing).
    #[serde(default)]
    pub mps: bool,
    /// With `mps`: how many guest processes each vGPU of this GPU runs at
    /// once (1 to 32). A worker that is an MPS client cannot make a context
    /// once the sandbox confines it, so it makes this many ahead, at each
    /// start (about 160 ms each on an H100, 500 ms after a fault restarted
    /// the MPS server); a process beyond them gets
    /// `CUDA_ERROR_MPS_MAX_CLIENTS_REACHED`.
    #[serde(default = "default_mps_processes")]
    pub mps_processes: usize,
    /// With `mps`: each vGPU of this GPU keeps a standby worker, a client of
    /// a second MPS server with its contexts made ahead, which takes over
    /// at once when a client's fault ends the serving workers (see
    /// `mps.rs`). Costs each vGPU a second set of contexts (about 0.5 GiB
    /// of GPU memory each on an H100). Off: after a fault the workers are
    /// started again once the driver has torn the old ones down (about
    /// 1.3 s for four on an H100).
    #[serde(default = "default_mps_standby")]
    pub mps_standby: bool,
    /// This GPU's base time slice, microseconds, in place of `[daemon]
    /// slice_us` or `preemptive_slice_us` (a GPU serving interactive
    /// tenants may want short turns even where it can preempt).
    #[serde(default)]
    pub slice_us: Option<u64>,
}

fn default_mps_processes() -> usize {
    4
}

fn default_mps_standby() -> bool {
    true
}

/// The whole file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Daemon settings.
    #[serde(default)]
    pub daemon: DaemonConfig,
    /// Parameters of the sim executor.
    #[serde(default)]
    pub sim: SimParams,
    /// Region layout of every vGPU.
    #[serde(default)]
    pub layout: LayoutParams,
    /// Idle spinning of workers.
    #[serde(default)]
    pub spin: SpinPolicy,
    /// The control API.
    #[serde(default)]
    pub api: ApiConfig,
    /// Placement and migration between GPUs.
    #[serde(default)]
    pub placement: PlacementConfig,
    /// Tenants with weights of their own (hierarchical weights).
    #[serde(rename = "tenant", default)]
    pub tenants: Vec<TenantConfig>,
    /// The VMs.
    #[serde(rename = "vm", default)]
    pub vms: Vec<VmConfig>,
    /// Settings of single GPUs.
    #[serde(rename = "gpu", default)]
    pub gpus: Vec<GpuConfig>,
}

/// Where a problem found after parsing is, for the error message.
#[derive(Debug, Clone, Copy)]
enum Loc {
    Nowhere,
    /// A `[table]`, and a key in it.
    Table(&'static str, Option<&'static str>),
    /// A key of the i-th `[[vm]]`.
    Vm(usize, &'static str),
    /// A key of the i-th `[[tenant]]`.
    Tenant(usize, &'static str),
    /// A key of the i-th `[[gpu]]`.
    Gpu(usize, &'static str),
}

impl Loc {
    /// The 1-based line of the key (else of its table) in `text`, for
    /// files written the usual way (one key per line, tables by header).
    fn line_in(self, text: &str) -> Option<usize> {
        let (header, nth, key) = match self {
            Loc::Nowhere => return None,
            Loc::Table(t, k) => (format!("[{t}]"), 0, k),
            Loc::Vm(i, k) => ("[[vm]]".to_owned(), i, Some(k)),
            Loc::Tenant(i, k) => ("[[tenant]]".to_owned(), i, Some(k)),
            Loc::Gpu(i, k) => ("[[gpu]]".to_owned(), i, Some(k)),
        };
        let lines: Vec<&str> = text.lines().collect();
        let start = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trim() == header)
            .nth(nth)?
            .0;
        let end = lines[start + 1..]
            .iter()
            .position(|l| l.trim_start().starts_with('['))
            .map_or(lines.len(), |p| start + 1 + p);
        let found = key.and_then(|k| {
            (start + 1..end).find(|&n| {
                lines[n]
                    .trim_start()
                    .strip_prefix(k)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            })
        });
        Some(found.unwrap_or(start) + 1)
    }
}

impl Config {
    /// Parses and validates TOML text. Errors name the key and, where the
    /// key is in the text, its line.
    pub fn parse(text: &str) -> Result<Config, Error> {
        let cfg: Config = toml::from_str(text).map_err(|e| Error::Config(toml_error(text, &e)))?;
        cfg.check().map_err(|(m, at)| match at.line_in(text) {
            Some(n) => Error::Config(format!("line {n}: {m}")),
            None => Error::Config(m),
        })?;
        Ok(cfg)
    }

    /// Reads, parses and validates a file.
    pub fn load(path: &Path) -> Result<Config, Error> {
        let shown = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(match e.kind() {
                std::io::ErrorKind::NotFound => format!(
                    "{shown}: no such file; pass --config with the path of host.toml (docs/host.example.toml is one)"
                ),
                _ => format!("{shown}: {e}"),
            })
        })?;
        Self::parse(&text).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{shown}: {m}")),
            e => e,
        })
    }

    /// The region layout of VM `vm` (the `[layout]`, with the VM's own
    /// pinned pool size if it sets one).
    pub fn layout_for(&self, vm: &VmConfig) -> LayoutParams {
        LayoutParams {
            pinned_size: vm.pinned_mib.map_or(self.layout.pinned_size, |m| m << 20),
            ..self.layout
        }
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), Error> {
        self.check().map_err(|(m, _)| Error::Config(m))
    }

    /// [`Config::validate`], also saying where in the file the problem is.
    fn check(&self) -> Result<(), (String, Loc)> {
        let bad = |m: String, at: Loc| Err((m, at));
        Layout::new(self.layout)
            .map_err(|e| (format!("[layout]: {e}"), Loc::Table("layout", None)))?;
        if let Some(g) = self
            .sim
            .no_compression_gpu
            .filter(|&g| g >= self.sim.gpus.max(1))
        {
            return bad(
                format!(
                    "[sim] no_compression_gpu {g} does not exist ([sim] gpus = {})",
                    self.sim.gpus
                ),
                Loc::Table("sim", Some("no_compression_gpu")),
            );
        }
        let slice_ok = |us: u64| (1..=MAX_SLICE_US).contains(&us);
        for (key, us) in [
            ("slice_us", self.daemon.slice_us),
            ("preemptive_slice_us", self.daemon.preemptive_slice_us),
        ] {
            if !slice_ok(us) {
                return bad(
                    format!("[daemon] {key} must be 1..={MAX_SLICE_US}, not {us}"),
                    Loc::Table("daemon", Some(key)),
                );
            }
        }
        if !(-20..=0).contains(&self.daemon.priority) {
            return bad(
                format!(
                    "[daemon] priority must be a nice value -20..=0 (0: off), not {}",
                    self.daemon.priority
                ),
                Loc::Table("daemon", Some("priority")),
            );
        }
        if let Some(list) = &self.daemon.cpus {
            if let Err(e) = crate::hostcpu::cpus::parse(list) {
                return bad(
                    format!("[daemon] cpus = {list:?}: {e} (a list like \"0-1\" or \"0,2,4-5\")"),
                    Loc::Table("daemon", Some("cpus")),
                );
            }
        }
        if self.daemon.cgroup_cpu_weight > 10_000 {
            return bad(
                format!(
                    "[daemon] cgroup_cpu_weight must be 1..=10000 (0: off), not {}",
                    self.daemon.cgroup_cpu_weight
                ),
                Loc::Table("daemon", Some("cgroup_cpu_weight")),
            );
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if let Some(us) = g.slice_us.filter(|&us| !slice_ok(us)) {
                return bad(
                    format!("[[gpu]] slice_us must be 1..={MAX_SLICE_US}, not {us}"),
                    Loc::Gpu(i, "slice_us"),
                );
            }
            if !(1..=32).contains(&g.mps_processes) {
                return bad(
                    format!(
                        "[[gpu]] mps_processes must be 1..=32, not {}",
                        g.mps_processes
                    ),
                    Loc::Gpu(i, "mps_processes"),
                );
            }
            if self.gpus[..i].iter().any(|o| o.index == g.index) {
                return bad(
                    format!("[[gpu]] index {} appears twice", g.index),
                    Loc::Gpu(i, "index"),
                );
            }
        }
        if self.vms.is_empty() {
            return bad("no [[vm]] configured".into(), Loc::Nowhere);
        }
        if let Some(addr) = &self.api.tcp {
            if addr.parse::<std::net::SocketAddr>().is_err() {
                return bad(
                    format!("[api] tcp: {addr:?} is not an address like 127.0.0.1:9400"),
                    Loc::Table("api", Some("tcp")),
                );
            }
            if self.api.token_file.is_none() {
                return bad(
                    "[api] tcp needs token_file: the TCP API is never open without a token".into(),
                    Loc::Table("api", Some("tcp")),
                );
            }
        }
        let pl = self.placement;
        let sane = pl.under > 0.0
            && pl.under <= pl.over
            && pl.over.is_finite()
            && pl.watermark > 0.0
            && pl.watermark <= 1.0
            && pl.interval_ms >= 100
            && pl.cooldown_s >= 0.0
            && pl.cooldown_s.is_finite();
        if !sane {
            return bad(
                "[placement]: need 0 < under <= over, 0 < watermark <= 1, interval_ms >= 100, cooldown_s >= 0".into(),
                Loc::Table("placement", None),
            );
        }
        let mut tenants = HashSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if t.name.is_empty() || !tenants.insert(&t.name) {
                return bad(
                    format!("tenant {:?} is empty or given twice", t.name),
                    Loc::Tenant(i, "name"),
                );
            }
            if !(t.weight.is_finite() && t.weight > 0.0) {
                return bad(
                    format!(
                        "tenant {:?}: weight must be a positive number, not {}",
                        t.name, t.weight
                    ),
                    Loc::Tenant(i, "weight"),
                );
            }
        }
        let mut names = HashSet::new();
        for (i, vm) in self.vms.iter().enumerate() {
            if let Err(e) = Layout::new(self.layout_for(vm)) {
                return bad(format!("[[vm]] {}: {e}", vm.name), Loc::Vm(i, "pinned_mib"));
            }
            if vm.name.is_empty()
                || !vm
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return bad(
                    format!("vm name {:?}: use letters, digits, '-' and '_'", vm.name),
                    Loc::Vm(i, "name"),
                );
            }
            if !names.insert(&vm.name) {
                return bad(
                    format!("vm name {:?} is used twice", vm.name),
                    Loc::Vm(i, "name"),
                );
            }
            if !(vm.weight.is_finite() && vm.weight > 0.0) {
                return bad(
                    format!(
                        "vm {:?}: weight must be a positive number, not {}",
                        vm.name, vm.weight
                    ),
                    Loc::Vm(i, "weight"),
                );
            }
            if vm.memory_limit_mib == 0 {
                return bad(
                    format!("vm {:?}: memory_limit_mib must be positive", vm.name),
                    Loc::Vm(i, "memory_limit_mib"),
                );
            }
            let gpu = vm.gpu.unwrap_or(0);
            if self.daemon.executor == ExecutorKind::Sim && gpu >= self.sim.gpus.max(1) {
                return bad(
                    format!(
                        "vm {:?}: gpu {gpu} does not exist ([sim] gpus = {})",
                        vm.name, self.sim.gpus
                    ),
                    Loc::Vm(i, "gpu"),
                );
            }
            if self.daemon.executor == ExecutorKind::Sim
                && vm.memory_limit_mib << 20 > self.sim.memory
            {
                return bad(
                    format!(
                        "vm {:?}: memory_limit_mib {} exceeds the GPU's {} MiB",
                        vm.name,
                        vm.memory_limit_mib,
                        self.sim.memory >> 20
                    ),
                    Loc::Vm(i, "memory_limit_mib"),
                );
            }
        }
        Ok(())
    }

    /// The device policy of GPU `gpu`.
    pub fn gpu_policy(&self, gpu: u32) -> sched::DevicePolicy {
        self.gpus
            .iter()
            .find(|g| g.index == gpu)
            .map(|g| g.policy)
            .unwrap_or_default()
    }

    /// The base time slice of GPU `gpu`, ns: its own `[[gpu]] slice_us`,
    /// else `[daemon] preemptive_slice_us` where it can preempt a running
    /// kernel (`preemptive`), else `[daemon] slice_us`.
    pub fn gpu_slice_ns(&self, gpu: u32, preemptive: bool) -> u64 {
        let own = self
            .gpus
            .iter()
            .find(|g| g.index == gpu)
            .and_then(|g| g.slice_us);
        own.map_or_else(
            || self.slices().for_gpu(preemptive),
            |us| us.saturating_mul(1000),
        )
    }

    /// `[daemon] slice_us` and `preemptive_slice_us`, ns.
    pub fn slices(&self) -> sched::Slices {
        sched::Slices {
            non_preemptive_ns: self.daemon.slice_us.saturating_mul(1000),
            preemptive_ns: self.daemon.preemptive_slice_us.saturating_mul(1000),
        }
    }

    /// Whether the daemon runs MPS for GPU `gpu`.
    pub fn gpu_mps(&self, gpu: u32) -> bool {
        self.gpus.iter().any(|g| g.index == gpu && g.mps)
    }

    /// Whether GPU `gpu` runs MPS with standby workers (`[[gpu]] mps_standby`).
    pub fn gpu_mps_standby(&self, gpu: u32) -> bool {
        self.gpus
            .iter()
            .any(|g| g.index == gpu && g.mps && g.mps_standby)
    }

    /// `[[gpu]] mps_processes` of GPU `gpu` (its default if not listed).
    pub fn gpu_mps_processes(&self, gpu: u32) -> usize {
        self.gpus
            .iter()
            .find(|g| g.index == gpu)
            .map_or_else(default_mps_processes, |g| g.mps_processes)
    }

    /// The weight of a tenant, if it has one of its own.
    pub fn tenant_weight(&self, tenant: &str) -> Option<f64> {
        self.tenants
            .iter()
            .find(|t| t.name == tenant)
            .map(|t| t.weight)
    }

    /// The VM of that name.
    pub fn vm(&self, name: &str) -> Option<&VmConfig> {
        self.vms.iter().find(|v| v.name == name)
    }

    /// The API's unix socket.
    pub fn api_socket(&self) -> PathBuf {
        self.api
            .socket
            .clone()
            .unwrap_or_else(|| self.daemon.run_dir.join("api.sock"))
    }

    /// Socket path of a VM.
    pub fn socket(&self, name: &str) -> PathBuf {
        self.daemon.run_dir.join(format!("{name}.sock"))
    }
}

/// A TOML error on one line: where, and what (the toml crate's own text
/// draws the line with a caret over several).
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    match e.span().and_then(|r| text.get(..r.start)) {
        Some(before) => {
            let line = before.matches('\n').count() + 1;
            let column = before.chars().rev().take_while(|&c| c != '\n').count() + 1;
            let shown = text.lines().nth(line - 1).unwrap_or("").trim();
            format!("line {line}, column {column} (`{shown}`): {what}")
        }
        _ => what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[daemon]
run_dir = "/tmp/x"
executor = "sim"

[[vm]]
name = "vm1"
tenant = "acme"
weight = 2
memory_limit_mib = 1024
"#;

    #[test]
    fn good_config_parses() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.vms[0].weight, 2.0);
        assert_eq!(c.socket("vm1"), PathBuf::from("/tmp/x/vm1.sock"));
        assert_eq!(c.daemon.graph_launches, GraphLaunches::All);
        let runs = GOOD.replace(
            "executor = \"sim\"",
            "executor = \"sim\"\ngraph_launches = \"runs\"",
        );
        assert_eq!(
            Config::parse(&runs).unwrap().daemon.graph_launches,
            GraphLaunches::Runs
        );
        // A GPU's policy; GPUs without a [[gpu]] take the fair queue.
        let las = format!("{GOOD}\n[[gpu]]\nindex = 1\npolicy = \"las\"\n");
        let c = Config::parse(&las).unwrap();
        assert_eq!(c.gpu_policy(1), sched::DevicePolicy::Las);
        assert_eq!(c.gpu_policy(0), sched::DevicePolicy::FairQueue);
        // Processes at once per vGPU of an MPS GPU: 4 unless set.
        assert_eq!(c.gpu_mps_processes(1), 4);
        let eight = format!("{GOOD}\n[[gpu]]\nindex = 0\nmps = true\nmps_processes = 8\n");
        assert_eq!(Config::parse(&eight).unwrap().gpu_mps_processes(0), 8);
    }

    #[test]
    fn a_gpu_that_preempts_gets_the_preemptive_slice_unless_it_has_its_own() {
        // docs/design.md's slices: 6 ms where kernels cannot be preempted, 30 ms where they can.
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.gpu_slice_ns(0, false), 6_000_000);
        assert_eq!(c.gpu_slice_ns(0, true), 30_000_000);
        let text = GOOD.replace(
            "executor = \"sim\"",
            "executor = \"sim\"\nslice_us = 5000\npreemptive_slice_us = 20000",
        );
        let own = format!("{text}\n[[gpu]]\nindex = 1\nslice_us = 3000\n");
        let c = Config::parse(&own).unwrap();
        assert_eq!(c.gpu_slice_ns(0, false), 5_000_000);
        assert_eq!(c.gpu_slice_ns(0, true), 20_000_000);
        // GPU 1's own slice, whether it preempts or not.
        assert_eq!(c.gpu_slice_ns(1, true), 3_000_000);
        assert_eq!(c.gpu_slice_ns(1, false), 3_000_000);
    }

    #[test]
    fn mistakes_are_named() {
        for (text, needle) in [
            (GOOD.replace("tenant", "tenantt"), "tenantt"),
            (GOOD.replace("weight = 2", "weight = -1"), "weight"),
            (GOOD.replace("1024", "999999999"), "exceeds"),
            (GOOD.replace("vm1", "a b"), "vm name"),
            (format!("{GOOD}\n[[tenant]]\nname = \"acme\"\nweight = -2\n"), "tenant \"acme\": weight"),
            (format!("{GOOD}\n[[tenant]]\nname = \"a\"\nweight = 1\n[[tenant]]\nname = \"a\"\nweight = 2\n"), "twice"),
            (format!("{GOOD}\n[api]\ntcp = \"0.0.0.0:9400\"\n"), "token_file"),
            (format!("{GOOD}\n[api]\ntcp = \"nowhere\"\ntoken_file = \"/t\"\n"), "address"),
            (GOOD.replace("executor = \"sim\"", "executor = \"sim\"\ngraph_launches = \"yes\""), "graph_launches"),
            (GOOD.replace("executor = \"sim\"", "executor = \"sim\"\npreemptive_slice_us = 0"), "preemptive_slice_us must be"),
            (format!("{GOOD}\n[[gpu]]\nindex = 0\nslice_us = 2000000\n"), "[[gpu]] slice_us must be"),
            (format!("{GOOD}\n[layout]\nchannels = 0\nring_entries = 8\narena_size = 4096\nvectors = 1\n"), "channels"),
            (format!("{GOOD}\n[[gpu]]\nindex = 0\npolicy = \"fastest\"\n"), "fastest"),
            (format!("{GOOD}\n[[gpu]]\nindex = 0\n[[gpu]]\nindex = 0\npolicy = \"tfs\"\n"), "twice"),
            (format!("{GOOD}\n[[gpu]]\nindex = 0\nmps = true\nmps_processes = 0\n"), "mps_processes"),
            (format!("{GOOD}\n[sim]\ngpus = 2\nno_compression_gpu = 2\n"), "no_compression_gpu 2 does not exist"),
        ] {
            let e = Config::parse(&text).unwrap_err().to_string();
            assert!(e.contains(needle), "{e:?} should mention {needle:?}");
        }
    }

    #[test]
    fn errors_found_after_parsing_name_the_line() {
        let two = format!(
            "{GOOD}\n[[vm]]\nname = \"vm2\"\ntenant = \"b\"\nweight = 0\nmemory_limit_mib = 1\n"
        );
        let line = two.lines().position(|l| l == "weight = 0").unwrap() + 1;
        let e = Config::parse(&two).unwrap_err().to_string();
        assert!(e.starts_with(&format!("config: line {line}: ")), "{e}");
        assert!(e.contains("weight"), "{e}");
        let api = format!("{GOOD}\n[api]\ntcp = \"x\"\ntoken_file = \"/t\"\n");
        let tcp = api.lines().position(|l| l.starts_with("tcp")).unwrap() + 1;
        let e = Config::parse(&api).unwrap_err().to_string();
        assert!(e.contains(&format!("line {tcp}:")), "{e}");
        // Syntax and unknown keys: the TOML parser's own line and column.
        let e = Config::parse(&GOOD.replace("tenant", "tenantt"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line"), "{e}");
    }

    #[test]
    fn host_cpu_options_default_and_bad_ones_are_one_line_naming_the_key() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(
            (
                c.daemon.priority,
                c.daemon.vcpu_lift,
                c.daemon.cpus.as_deref()
            ),
            (-10, true, None)
        );
        assert_eq!(c.daemon.cgroup_cpu_weight, 1000);
        let set = |extra: &str| {
            GOOD.replace(
                "executor = \"sim\"",
                &format!("executor = \"sim\"\n{extra}"),
            )
        };
        let c = Config::parse(&set(
            "cpus = \"0-1,4\"\npriority = 0\nvcpu_lift = false\ncgroup_cpu_weight = 0",
        ))
        .unwrap();
        assert_eq!(c.daemon.cpus.as_deref(), Some("0-1,4"));
        assert_eq!((c.daemon.priority, c.daemon.vcpu_lift), (0, false));
        for (extra, needle) in [
            (
                "cpus = \"1-0\"",
                "[daemon] cpus = \"1-0\": the range \"1-0\" runs backwards",
            ),
            (
                "cpus = \"0-1,x\"",
                "[daemon] cpus = \"0-1,x\": \"x\" is not a CPU number",
            ),
            ("cpus = \"\"", "[daemon] cpus"),
            ("cpus = 3", "cpus"),
            ("priority = -21", "[daemon] priority must be"),
            ("priority = 5", "[daemon] priority must be"),
            (
                "cgroup_cpu_weight = 10001",
                "[daemon] cgroup_cpu_weight must be",
            ),
            ("vcpu_lifts = true", "vcpu_lifts"),
        ] {
            let text = set(extra);
            let e = Config::parse(&text).unwrap_err().to_string();
            assert!(e.contains(needle), "{e:?} should mention {needle:?}");
            assert_eq!(e.lines().count(), 1, "{e:?}");
            if !extra.starts_with("vcpu_lifts") && !extra.starts_with("cpus = 3") {
                let line = text.lines().position(|l| l == extra).unwrap() + 1;
                assert!(e.contains(&format!("line {line}:")), "{e}");
            }
        }
    }
}

#[cfg(test)]
mod example {
    #[test]
    fn shipped_example_config_is_valid() {
        let c = super::Config::parse(include_str!("../../docs/host.example.toml")).unwrap();
        assert_eq!(c.vms.len(), 2);
    }
}
