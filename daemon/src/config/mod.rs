//! `host.toml`: the GPUs' executor, the VMs with their tenant, weight and
//! device-memory limit. Unknown keys are errors, so a typo never becomes a
//! silent default.
//!
//! Here the file's tables and their defaults; `check.rs`: parsing and
//! validation (errors that name the key and its line); `lookup.rs`: what
//! the rest of the daemon asks of the config per VM and per GPU.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use transport::{LayoutParams, SpinPolicy};

use worker::executor::sim::SimParams;

mod check;
mod lookup;

pub use check::ConfigError;

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
    /// MiB of module images each guest process's worker keeps by content,
    /// so that a process sends an image it loads again once (0: none).
    #[serde(default = "default_image_cache_mib")]
    pub image_cache_mib: u64,
    /// Share module images between processes, of one VM or of several,
    /// through the daemon's store: the bytes exist once on the host and a
    /// later process sends only hashes (see `image_store.rs`). Off: each
    /// process sends its own.
    #[serde(default = "yes")]
    pub share_images: bool,
    /// MiB the daemon's image store keeps at most, all VMs together (each
    /// process's worker adds at most `image_cache_mib`).
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
    /// Real-time lift: while a VM holds a GPU that another VM waits for,
    /// its vCPU threads, its worker's serving thread and the grant
    /// services' threads run in `SCHED_FIFO` (priorities 1, 2 and 3), each
    /// only to the round's end, back at the lifted nice after. Off by
    /// default: ahead of every fair-class thread on their CPUs for up to a
    /// slice. Needs the vCPU lift, CAP_SYS_NICE, and where the kernel has
    /// real-time group scheduling, real-time runtime for the cgroups of the
    /// daemon and the VMs (see `hostcpu/mod.rs`).
    #[serde(default)]
    pub realtime: bool,
    /// CPUs reserved for the daemon, its grant services and its workers, as
    /// a list like "0-1" or "0,2,4-5"; left out, they run on any CPU.
    #[serde(default)]
    pub cpus: Option<String>,
    /// The `cpu.weight` (1..=10000, the default cgroup's is 100) of a cgroup
    /// v2 child that the workers go into, where the daemon has a writable
    /// cgroup of its own; 0 turns it off (see `hostcpu/cgroup.rs`).
    #[serde(default = "default_cgroup_cpu_weight")]
    pub cgroup_cpu_weight: u64,
    /// Where vGPU checkpoints are written and read (`fairvgpu checkpoint`,
    /// `restore`); default `<run_dir>/checkpoints`.
    #[serde(default)]
    pub checkpoint_dir: Option<PathBuf>,
    /// File holding the key that checkpoint files are tagged under
    /// (HMAC-SHA-256; at least 16 bytes); none: SHA-256 alone, which
    /// catches damage, not forgery.
    #[serde(default)]
    pub checkpoint_key_file: Option<PathBuf>,
    /// Take vGPUs handed over from other hosts' daemons on this TCP
    /// address (needs `checkpoint_key_file`, which both hosts share).
    #[serde(default)]
    pub handover_listen: Option<String>,
    /// Seconds a GPU's spare keeps the modules of a checkpoint sent ahead
    /// (`handover --ahead`) for the handover that follows; then it is
    /// ended with them, its GPU memory given back, and a fresh one started.
    #[serde(default = "default_ahead_keep_s")]
    pub ahead_keep_s: u64,
}

fn default_ahead_keep_s() -> u64 {
    600
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
            image_store_mib: default_image_store_mib(),
            mps_control: default_mps_control(),
            priority: default_priority(),
            vcpu_lift: true,
            realtime: false,
            cpus: None,
            cgroup_cpu_weight: default_cgroup_cpu_weight(),
            checkpoint_dir: None,
            checkpoint_key_file: None,
            handover_listen: None,
            ahead_keep_s: default_ahead_keep_s(),
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
    /// How many of the VM's guest processes run at once (1..=16); unset:
    /// [`DEFAULT_PROCESS_SLOTS`]. Each process has a worker process of its
    /// own, bound when it attaches and ended with it, so its faults,
    /// kernels and memory are its own as natively; a process beyond the
    /// limit waits in `cuInit` for one to end (see docs/design.md,
    /// "Isolation between a VM's processes").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_slots: Option<u32>,
}

/// Process slots of a VM that sets none: as many processes at once as
/// this get a worker each.
pub const DEFAULT_PROCESS_SLOTS: u32 = 8;

impl VmConfig {
    /// The VM's process slots: `process_slots`, else
    /// [`DEFAULT_PROCESS_SLOTS`].
    pub fn slots(&self) -> u32 {
        self.process_slots.unwrap_or(DEFAULT_PROCESS_SLOTS)
    }
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
    /// How its vGPUs hold it: `"concurrent"` (the default: every vGPU with
    /// work at once, one ahead of its share held back) or `"exclusive"`
    /// (one vGPU a slice; `corun` and `"phase"` co-holding apply only
    /// there). See docs/design.md, "Sharing the GPU at once".
    #[serde(default)]
    pub sharing: sched::Sharing,
    /// The daemon runs NVIDIA's Multi-Process Service for this GPU and its
    /// workers are its clients (see `mps.rs`: what it gives and costs; its
    /// vGPUs never move to another GPU), so opted-in vGPUs may co-run there.
    /// On the sim executor no MPS program runs; only the co-running grants
    /// do (the sim runs one kernel at a time, so they test the plumbing).
    #[serde(default)]
    pub mps: bool,
    /// With `mps`: how many guest processes a worker run by hand
    /// (`fairvgpu worker` outside the daemon, serving its own region)
    /// serves at once (1 to 32): an MPS client cannot make a context once
    /// the sandbox confines it, so it makes this many ahead. Under the
    /// daemon each process's worker makes its one context ahead.
    #[serde(default = "default_mps_processes")]
    pub mps_processes: usize,
    /// With `mps`: a second MPS server for this GPU, which its next
    /// workers (its spare, new processes' workers) are clients of at once
    /// after a client's fault ended the serving server's clients (see
    /// `mps.rs`). Off: they start once the driver has torn the ended ones
    /// down (about 1.3 s for four on an H100).
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

#[cfg(test)]
mod tests;

#[cfg(test)]
mod example {
    #[test]
    fn shipped_example_config_is_valid() {
        let c = super::Config::parse(include_str!("../../../docs/host.example.toml")).unwrap();
        assert_eq!(c.vms.len(), 2);
    }
}
