//! `fairvgpu serve`: one worker process per running guest process, bound
//! when the process attaches and ended with it (`setup::worker_spec` says
//! what each is to do).
//!
//! The serving loop is a `Supervisor`: its state as named fields, one
//! method per event it handles, in files of one job each:
//! - here: the daemon's start and stop, and the loop (a reload on SIGHUP,
//!   the config's changes, then each event in turn),
//! - `workers.rs`: workers started, stopped with their VM, and their exits
//!   noted,
//! - `faults.rs`: a GPU fault or crash among an MPS server's clients ends
//!   them all; ended workers reaped,
//! - `migration.rs`: migrations asked for started, workers' reports
//!   collected, the balancer run,
//! - `slots.rs`: process slots' workers bound when their processes claim
//!   them, and never restarted,
//! - `spares.rs`: a spare worker per GPU, started ahead for those slots.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wire::signals;

use crate::config::{Config, ExecutorKind};
use crate::control::ControlPlane;
use crate::link::VmHost;
use crate::mps::MpsGpu;
use crate::setup::image_store_socket;
use crate::Error;

mod checkpoint;
mod faults;
mod migration;
mod restore;
mod slots;
mod spares;
mod workers;

use faults::Ending;
use workers::{stop_child, Launcher, Supervised};

/// Supervises a worker process per guest process until SIGTERM, serves the control
/// API, and reloads the config on SIGHUP (or the API's reload).
pub fn serve(cfg: &Config, config_path: &Path) -> Result<(), Error> {
    if cfg.daemon.executor == ExecutorKind::Cuda {
        // Fail here, once, rather than in every worker start.
        worker::executor::cuda::available()?;
    }
    // Before any socket in run_dir is touched: a second daemon there is
    // refused (see `run_lock.rs`), its error the only line it prints.
    let run_lock = crate::run_lock::RunLock::take(&cfg.daemon.run_dir)?;
    let mut sup = Supervisor::start(cfg, config_path)?;
    sup.run()?;
    let cfg = sup.stop();
    remove_sockets(&cfg);
    drop(run_lock);
    tracing::info!(run_dir = %cfg.daemon.run_dir.display(), "stopped: workers ended, sockets and lock removed");
    Ok(())
}

/// The daemon's serving loop and all it keeps between turns.
struct Supervisor {
    /// One per running guest process.
    children: Vec<Supervised>,
    /// Workers the daemon ended, until reaped.
    ending: Vec<Ending>,
    /// Each VM's region and socket live here, in the daemon, so that they
    /// outlive its worker (see crate::link).
    hosts: BTreeMap<String, VmHost>,
    /// The memory limit each VM's region was last given, MiB.
    limits: HashMap<String, u64>,
    last_balance: Instant,
    /// The module image store the workers share (see `image_store.rs`).
    _images: Option<crate::image_store::ImageStore>,
    /// One MPS control daemon per GPU that asks for it (see `mps.rs`).
    mps: HashMap<u32, MpsGpu>,
    plane: Arc<ControlPlane>,
    /// What starts worker processes.
    launcher: Launcher,
    /// The spare workers, one per GPU with a VM.
    spares: spares::Spares,
    /// Process slots claimed while they had no worker.
    claims: slots::Claims,
    /// Migrations of vGPUs under way, by VM.
    moves: HashMap<String, migration::Moving>,
    /// Checkpoints and restores under way.
    saves: HashMap<String, checkpoint::Saving>,
    /// vGPUs held after a checkpoint (`checkpoint.rs`).
    held: std::collections::BTreeSet<String>,
    /// vGPUs other hosts handed over, until restored (`restore.rs`).
    arrived: HashMap<String, crate::save_file::Saved>,
    /// The workers' pids the control plane was last told, by VM.
    reported: HashMap<String, Vec<u32>>,
}

/// The supervisor's pause between turns.
const TURN: Duration = Duration::from_millis(20);
/// Its pause while a guest waits on a checkpoint, a restore or a vGPU
/// handed over.
const BUSY_TURN: Duration = Duration::from_millis(2);

impl Supervisor {
    /// Everything the workers need before the first starts: the host CPU
    /// options, the host id, the grant services and control API, the MPS
    /// servers and the image store.
    fn start(cfg: &Config, config_path: &Path) -> Result<Supervisor, Error> {
        // The host CPU options, on this thread before any other starts (the
        // CPU mask of `[daemon] cpus` is inherited by every thread and worker).
        let host_cpu = Arc::new(crate::hostcpu::HostCpu::start(&cfg.daemon));
        // The id the VMs' vGPU UUIDs derive from, made before any worker asks.
        wire::identity::host_id(&cfg.daemon.run_dir)?;
        let exe = std::env::current_exe().map_err(|source| Error::Io {
            what: "finding own executable",
            source,
        })?;
        signals::install();
        // The daemon holds every VM's region: workers (same user) must not be
        // able to take them from its /proc/<pid>/fd.
        worker::sandbox::not_dumpable()?;
        // The grant services (one per GPU) start before any worker connects.
        let plane = ControlPlane::new(cfg.clone(), config_path, host_cpu.clone())?;
        let claims = slots::Claims::new();
        let ring = claims.sender();
        plane.on_ask(move || {
            let _ = ring.send(slots::Note::Asked);
        });
        // vCPU threads an earlier daemon was given (`fairvgpu attach`).
        for vm in &cfg.vms {
            let threads = crate::attach::read_vcpus(&crate::attach::vcpus_file(cfg, &vm.name));
            if !threads.is_empty() {
                host_cpu
                    .registry
                    .set_vcpus(plane.vgpu_id(&vm.name), threads);
            }
        }
        crate::control::start(&plane)?;
        if let Some(addr) = &cfg.daemon.handover_listen {
            let key = checkpoint::checkpoint_key(cfg)
                .map_err(Error::Handover)?
                .ok_or_else(|| {
                    Error::Handover("handover_listen needs checkpoint_key_file".into())
                })?;
            crate::handover::listen(addr, key, plane.clone()).map_err(|source| Error::Io {
                what: "listening for vGPUs handed over",
                source,
            })?;
        }
        // One MPS control daemon per GPU that asks for it (see `mps.rs`),
        // before any of its workers starts.
        let mut mps: HashMap<u32, MpsGpu> = Default::default();
        for g in cfg
            .gpus
            .iter()
            .filter(|g| g.mps && cfg.daemon.executor == ExecutorKind::Cuda)
        {
            let d = MpsGpu::start(
                &cfg.daemon.mps_control,
                &cfg.daemon.run_dir,
                g.index,
                g.mps_standby,
            )?;
            mps.insert(g.index, d);
        }
        // The module image store the workers share (see `image_store.rs`).
        let images = if cfg.daemon.share_images {
            let store = crate::image_store::ImageStore::start(
                &image_store_socket(cfg),
                cfg.daemon.image_store_mib << 20,
                cfg.daemon.image_cache_mib << 20,
            )?;
            plane.watch_image_store(store.stats().clone());
            Some(store)
        } else {
            None
        };
        Ok(Supervisor {
            children: Vec::new(),
            ending: Vec::new(),
            hosts: BTreeMap::new(),
            limits: HashMap::new(),
            last_balance: Instant::now(),
            _images: images,
            mps,
            plane,
            launcher: Launcher {
                exe,
                config_path: config_path.to_owned(),
                host_cpu,
            },
            spares: spares::Spares::default(),
            claims,
            moves: HashMap::new(),
            saves: HashMap::new(),
            held: Default::default(),
            arrived: HashMap::new(),
            reported: HashMap::new(),
        })
    }

    /// Serves until SIGTERM or SIGINT: each turn follows the config, then
    /// handles what happened to the workers, the MPS servers' faults, the
    /// migrations, and balances the GPUs.
    fn run(&mut self) -> Result<(), Error> {
        while !signals::terminated() {
            if signals::take_hangup() {
                self.on_hangup();
            }
            let want = self.plane.config();
            self.stop_removed(&want);
            self.apply_memory_limits(&want)?;
            self.start_missing(&want)?;
            let mut mps_faults = self.poisoned_gpus();
            for i in 0..self.children.len() {
                self.on_worker_exited(i, &mut mps_faults);
            }
            for &gpu in &mps_faults {
                self.on_mps_fault(gpu);
            }
            // Process slots' workers that ended are not restarted.
            self.children.retain(|w| !w.ended);
            self.reap_ended();
            let dying = self.dying();
            self.on_migrations();
            self.on_checkpoints(&want);
            self.on_slot_claims(&want);
            // Workers ended and bound this round, before a spare's start.
            self.report_workers();
            self.keep_spares(&want, &dying);
            self.balance(&want);
            // A slot claimed meanwhile ends the pause at once. While a
            // checkpoint or restore is under way, or a vGPU handed over
            // waits for its restore, the guest is paused: shorter turns.
            let busy = !self.saves.is_empty() || !self.arrived.is_empty();
            self.claims.wait(if busy { BUSY_TURN } else { TURN });
        }
        Ok(())
    }

    /// SIGHUP: the config file is read again (as by the API's reload).
    fn on_hangup(&self) {
        let _ = self.plane.reload();
    }

    /// Shutdown: every worker ended, the regions dropped;
    /// returns the config the daemon ran last.
    fn stop(&mut self) -> Config {
        tracing::info!(
            workers = self.children.len(),
            "stopping (SIGTERM or SIGINT): ending the workers"
        );
        for w in &mut self.children {
            if let Some(child) = w.child.as_mut() {
                stop_child(child);
            }
        }
        self.spares.stop();
        for e in &mut self.ending {
            let _ = e.child.wait();
        }
        // No VM's vCPU thread stays lifted (or real-time) after the daemon.
        self.launcher.host_cpu.put_back();
        drop(std::mem::take(&mut self.hosts));
        self.plane.config()
    }
}

/// Removes the sockets the daemon made: the API's, each VM's, the image
/// store's and every GPU's grant service's.
fn remove_sockets(cfg: &Config) {
    let mut paths = vec![cfg.api_socket(), image_store_socket(cfg)];
    paths.extend(cfg.vms.iter().map(|vm| cfg.socket(&vm.name)));
    if let Ok(dir) = std::fs::read_dir(&cfg.daemon.run_dir) {
        paths.extend(dir.flatten().map(|e| e.path()).filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("grant-gpu") && n.ends_with(".sock"))
        }));
    }
    for p in paths {
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %p.display(), "removing a socket: {e}"),
        }
    }
}
