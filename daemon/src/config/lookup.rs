//! What the daemon asks of the config per VM and per GPU.

use std::path::PathBuf;

use transport::LayoutParams;

use super::{default_mps_processes, Config, VmConfig};

/// Channels a process slot has at least: as many as the CUDA stand-in gives
/// a process's threads, one each, by default (`FAIRVGPU_CHANNELS_PER_PROCESS`).
pub const CHANNELS_PER_SLOT: u32 = 4;

impl Config {
    /// The region layout of VM `vm` (the `[layout]`, with the VM's own
    /// pinned pool size if it sets one), its channels split into its
    /// process slots (at least [`CHANNELS_PER_SLOT`] per slot,
    /// the `[layout]`'s count rounded up to a multiple of the slots) and a
    /// host doorbell vector per slot at least.
    pub fn layout_for(&self, vm: &VmConfig) -> LayoutParams {
        let mut l = LayoutParams {
            pinned_size: vm.pinned_mib.map_or(self.layout.pinned_size, |m| m << 20),
            ..self.layout
        };
        // At least one (a config with 0 is refused; it may be checked after this).
        let k = vm.slots().max(1);
        l.partitions = k;
        l.channels = l
            .channels
            .max(CHANNELS_PER_SLOT * k)
            .div_ceil(k)
            .saturating_mul(k);
        l.vectors = l.vectors.max(k);
        l
    }

    /// The device policy of GPU `gpu`.
    pub fn gpu_policy(&self, gpu: u32) -> sched::DevicePolicy {
        self.gpus
            .iter()
            .find(|g| g.index == gpu)
            .map(|g| g.policy)
            .unwrap_or_default()
    }

    /// How GPU `gpu`'s vGPUs hold it (`[[gpu]] sharing`).
    pub fn gpu_sharing(&self, gpu: u32) -> sched::Sharing {
        self.gpus
            .iter()
            .find(|g| g.index == gpu)
            .map(|g| g.sharing)
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

    /// Where checkpoint files are written and read.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.daemon
            .checkpoint_dir
            .clone()
            .unwrap_or_else(|| self.daemon.run_dir.join("checkpoints"))
    }

    /// Socket path of a VM.
    pub fn socket(&self, name: &str) -> PathBuf {
        self.daemon.run_dir.join(format!("{name}.sock"))
    }
}
