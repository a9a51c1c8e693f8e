//! What the config makes of each GPU and each VM's worker: the executor,
//! a GPU's base time slice, the sockets of its grant service and of the
//! image store, and what a worker process is to do (its `Spec`). The
//! supervisor, the control plane, the CLI and the benches all ask here.

use std::path::PathBuf;

use worker::executor::Executor;
use worker::process::{ExecutorSpec, Spec};
use worker::serve::WorkerConfig;

use crate::config::{Config, ExecutorKind};
use crate::Error;

/// The executor the config names.
pub fn executor_spec(cfg: &Config) -> ExecutorSpec {
    ExecutorSpec {
        kind: cfg.daemon.executor,
        sim: cfg.sim,
        graph_launches: cfg.daemon.graph_launches,
    }
}

/// Builds the configured executor for one GPU.
pub fn build_executor(cfg: &Config, gpu: u32) -> Result<Box<dyn Executor>, Error> {
    Ok(executor_spec(cfg).open(gpu)?)
}

/// The base time slice of GPU `gpu`, ns (see [`Config::gpu_slice_ns`]): the
/// sim models a GPU that cannot preempt a running kernel; a real GPU says
/// whether it can (one whose driver cannot be asked is taken as one that
/// cannot: the shorter slice).
pub fn gpu_slice_ns(cfg: &Config, gpu: u32) -> u64 {
    let preemptive = match cfg.daemon.executor {
        ExecutorKind::Sim => false,
        ExecutorKind::Cuda => worker::executor::cuda::device_preemptive(gpu).unwrap_or(false),
    };
    cfg.gpu_slice_ns(gpu, preemptive)
}

/// What the worker process of VM `vm` is to do (`fairvgpu worker`): `id`
/// is its vGPU's id at the grant service (the daemon's; by default its
/// position in the config), `gpu` where the vGPU is now (it may have
/// moved; default the config's). With `feed` (the fd of the daemon's feed,
/// see [`crate::link`]) it serves its process slot `slot` of the region
/// the daemon serves; without, it serves its own.
pub fn worker_spec(
    cfg: &Config,
    vm: &str,
    id: Option<u32>,
    feed: Option<i32>,
    gpu: Option<u32>,
    slot: Option<(u32, i32)>,
) -> Result<Spec, Error> {
    let vmc = cfg.vm(vm).ok_or_else(|| Error::NoVm(vm.to_owned()))?;
    let gpu = gpu.or(vmc.gpu).unwrap_or(0);
    // An MPS client sees only the GPU its server was started for, as 0.
    let mps = cfg.gpu_mps(gpu) && cfg.daemon.executor == ExecutorKind::Cuda;
    let host_id = wire::identity::host_id(&cfg.daemon.run_dir)?;
    let wc = WorkerConfig {
        uuid: wire::identity::vgpu_uuid(&host_id, vm),
        spin: cfg.spin,
        cpu: vmc.worker_cpu,
        grant: cfg.daemon.scheduler.then(|| {
            let id = id.unwrap_or_else(|| {
                cfg.vms
                    .iter()
                    .position(|v| v.name == vm)
                    .and_then(|i| u32::try_from(i).ok())
                    .unwrap_or(0)
            });
            (grant_socket(cfg, gpu), id, vmc.weight)
        }),
        vcpus_file: Some(crate::attach::vcpus_file(cfg, vm)),
        slice_blocks: cfg.daemon.slice_blocks,
        image_cache: cfg.daemon.image_cache_mib << 20,
        // Only under the daemon, which runs the store.
        image_store: (feed.is_some() && cfg.daemon.share_images).then(|| image_store_socket(cfg)),
        // An MPS client makes its contexts ahead, while it may still
        // connect (see `mps.rs` and the worker's `serve/contexts.rs`).
        // A process slot's worker serves one process at a time.
        prefill_contexts: match (mps, slot) {
            (true, Some(_)) => 1,
            (true, None) => cfg.gpu_mps_processes(gpu),
            (false, _) => 0,
        },
        // A process slot's worker holds a context ready for its process.
        warm_contexts: usize::from(!mps && slot.is_some()),
        lift_nice: (cfg.daemon.priority != 0).then_some(cfg.daemon.priority),
        realtime: cfg.daemon.realtime,
        // One owner of a vCPU thread's nice value. Where the vCPU lift is
        // on, it raises the holder's vCPU threads for the whole grant and
        // the worker's kick stays off: a kick boosts relative to the value
        // it finds and puts it back a millisecond later, so a kick taken
        // just before the grant moved left the lifted value on a thread
        // that no longer held the GPU (the lift, finding a value it had
        // not set, leaves the thread alone).
        vcpu_kick: !(cfg.daemon.vcpu_lift && cfg.daemon.priority != 0),
        slot: slot.map(|s| s.0),
        // A process slot's worker is bound when a process claims the slot
        // and ends with it (`supervisor/slots.rs`).
        ends_with_process: slot.is_some(),
        ..WorkerConfig::new(
            vm,
            cfg.socket(vm),
            cfg.layout_for(vmc),
            vmc.memory_limit_mib << 20,
        )
    };
    Ok(Spec {
        worker: wc,
        executor: executor_spec(cfg),
        ordinal: if mps { 0 } else { gpu },
        feed,
        ledger: slot.map(|s| s.1),
        restore: None,
        sandbox: cfg.daemon.sandbox,
    })
}

/// Socket of the daemon's module image store (see `image_store.rs`).
pub fn image_store_socket(cfg: &Config) -> PathBuf {
    cfg.daemon.run_dir.join("images.sock")
}

/// Socket of the grant service of GPU `gpu`.
pub fn grant_socket(cfg: &Config, gpu: u32) -> PathBuf {
    cfg.daemon.run_dir.join(format!("grant-gpu{gpu}.sock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slots_worker_without_mps_holds_a_context_ready_and_a_worker_alone_none() {
        let dir = scratch::dir("fvg-setup");
        let cfg = Config::parse(&format!(
            "[daemon]\nrun_dir = {:?}\n[[vm]]\nname = \"vm1\"\ntenant = \"t\"\nmemory_limit_mib = 1024\n",
            dir.display().to_string()
        ))
        .unwrap();
        let slot = worker_spec(&cfg, "vm1", None, Some(3), None, Some((1, 4))).unwrap();
        assert_eq!(slot.worker.warm_contexts, 1);
        assert_eq!(slot.worker.prefill_contexts, 0);
        assert_eq!(slot.worker.slot, Some(1));
        let alone = worker_spec(&cfg, "vm1", None, None, None, None).unwrap();
        assert_eq!(alone.worker.warm_contexts, 0);
        assert!(worker_spec(&cfg, "nope", None, None, None, None).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The worker's spec for vm1 under a config whose `[daemon]` table
    /// holds `daemon`.
    fn spec_with(dir: &std::path::Path, daemon: &str) -> WorkerConfig {
        let cfg = Config::parse(&format!(
            "[daemon]\nrun_dir = {:?}\n{daemon}\n[[vm]]\nname = \"vm1\"\ntenant = \"t\"\nmemory_limit_mib = 1024\n",
            dir.display().to_string()
        ))
        .unwrap();
        worker_spec(&cfg, "vm1", None, None, None, None)
            .unwrap()
            .worker
    }

    #[test]
    fn the_kick_is_on_only_where_the_vcpu_lift_is_off() {
        let dir = scratch::dir("fvg-setup-kick");
        let kick = |daemon: &str| spec_with(&dir, daemon).vcpu_kick;
        // The defaults: priority lift and vCPU lift on.
        assert!(!kick(""));
        assert!(kick("vcpu_lift = false"));
        // The vCPU lift needs the priority lift.
        assert!(kick("priority = 0"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_real_time_lift_reaches_the_workers_only_when_set() {
        let dir = scratch::dir("fvg-setup-realtime");
        assert!(!spec_with(&dir, "").realtime);
        let on = spec_with(&dir, "realtime = true");
        assert!(on.realtime && on.lift_nice == Some(-10));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
