//! `fairvgpu serve`: one worker process per vGPU, restarted if it dies
//! (`worker_spec` says what each is to do).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use wire::signals;
use worker::executor::Executor;
use worker::process::{ExecutorSpec, Spec, EXIT_POISONED};
use worker::serve::WorkerConfig;

use crate::config::{Config, ExecutorKind};
use crate::link::VmHost;
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
/// see [`crate::link`], and whether to start as a standby, see
/// `crate::mps`) it adopts the region the daemon serves; without, it
/// serves its own.
pub fn worker_spec(
    cfg: &Config,
    vm: &str,
    id: Option<u32>,
    feed: Option<(i32, bool)>,
    gpu: Option<u32>,
) -> Result<Spec, Error> {
    let vmc = cfg
        .vm(vm)
        .ok_or_else(|| Error::Config(format!("no vm named {vm:?}")))?;
    let gpu = gpu.or(vmc.gpu).unwrap_or(0);
    // An MPS client sees only the GPU its server was started for, as 0.
    let mps = cfg.gpu_mps(gpu) && cfg.daemon.executor == ExecutorKind::Cuda;
    let host_id = wire::identity::host_id(&cfg.daemon.run_dir)?;
    let wc = WorkerConfig {
        uuid: wire::identity::vgpu_uuid(&host_id, vm),
        spin: cfg.spin,
        cpu: vmc.worker_cpu,
        grant: cfg.daemon.scheduler.then(|| {
            let id =
                id.unwrap_or_else(|| cfg.vms.iter().position(|v| v.name == vm).unwrap_or(0) as u32);
            (grant_socket(cfg, gpu), id, vmc.weight)
        }),
        vcpus_file: Some(crate::attach::vcpus_file(cfg, vm)),
        slice_blocks: cfg.daemon.slice_blocks,
        image_cache: cfg.daemon.image_cache_mib << 20,
        // Only under the daemon, which runs the store.
        image_store: (feed.is_some() && cfg.daemon.share_images).then(|| image_store_socket(cfg)),
        // An MPS client makes its contexts ahead, while it may still
        // connect (see `mps.rs` and the worker's `serve/contexts.rs`).
        prefill_contexts: if mps { cfg.gpu_mps_processes(gpu) } else { 0 },
        lift_nice: (cfg.daemon.priority != 0).then_some(cfg.daemon.priority),
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
        sandbox: cfg.daemon.sandbox,
    })
}

/// Socket of the daemon's module image store (see `image_store.rs`).
pub fn image_store_socket(cfg: &Config) -> std::path::PathBuf {
    cfg.daemon.run_dir.join("images.sock")
}

/// Socket of the grant service of GPU `gpu`.
pub fn grant_socket(cfg: &Config, gpu: u32) -> std::path::PathBuf {
    cfg.daemon.run_dir.join(format!("grant-gpu{gpu}.sock"))
}

/// Supervises one worker process per VM until SIGTERM, serves the control
/// API, and reloads the config on SIGHUP (or the API's reload).
pub fn serve(cfg: &Config, config_path: &Path) -> Result<(), Error> {
    if cfg.daemon.executor == ExecutorKind::Cuda {
        // Fail here, once, rather than in every worker start.
        worker::executor::cuda::available()?;
    }
    // Before any socket in run_dir is touched: a second daemon there is
    // refused (see `run_lock.rs`), its error the only line it prints.
    let run_lock = crate::run_lock::RunLock::take(&cfg.daemon.run_dir)?;
    // The host CPU options, on this thread before any other starts (the
    // CPU mask of `[daemon] cpus` is inherited by every thread and worker).
    let host_cpu = std::sync::Arc::new(crate::hostcpu::HostCpu::start(&cfg.daemon));
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
    let plane = crate::control::ControlPlane::new(cfg.clone(), config_path, host_cpu.clone())?;
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
    // One MPS control daemon per GPU that asks for it (see `mps.rs`),
    // before any of its workers starts.
    let mut mps: std::collections::HashMap<u32, crate::mps::MpsGpu> = Default::default();
    for g in cfg
        .gpus
        .iter()
        .filter(|g| g.mps && cfg.daemon.executor == ExecutorKind::Cuda)
    {
        let d = crate::mps::MpsGpu::start(
            &cfg.daemon.mps_control,
            &cfg.daemon.run_dir,
            g.index,
            g.mps_standby,
        )?;
        mps.insert(g.index, d);
    }
    // The module image store the workers share (see `image_store.rs`).
    let _images = if cfg.daemon.share_images {
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
    // Each VM's region and socket live here, in the daemon, so that they
    // outlive its worker (see crate::link).
    let mut hosts: std::collections::BTreeMap<String, VmHost> = Default::default();
    // Workers the daemon ended, until reaped.
    let mut ending: Vec<Ending> = Vec::new();
    // A worker for `name`, or a standby one, the client of MPS side `side`
    // of its GPU (if the GPU runs MPS).
    let spawn = |name: &str,
                 host: &VmHost,
                 mps: Option<(&crate::mps::MpsGpu, usize)>,
                 standby: bool|
     -> Result<Child, Error> {
        let feed = if standby {
            host.standby_feed()?
        } else {
            host.feed()?
        };
        // Only this fd crosses the exec (the rest are close-on-exec); the
        // supervisor is the only thread that starts processes.
        nix::fcntl::fcntl(
            &feed,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| Error::Io {
            what: "feed fd flags",
            source: e.into(),
        })?;
        let gpu = plane.gpu_of(name).unwrap_or(0);
        let mut cmd = Command::new(&exe);
        cmd.args(["worker", "--config"])
            .arg(config_path)
            .args(["--vm", name, "--id"])
            .arg(plane.vgpu_id(name).to_string())
            .arg("--feed-fd")
            .arg(feed.as_raw_fd().to_string())
            .arg("--gpu")
            .arg(gpu.to_string());
        if standby {
            cmd.arg("--standby");
        }
        if let Some((m, side)) = mps {
            cmd.envs(m.side(side).client_env())
                .env_remove("CUDA_VISIBLE_DEVICES");
        }
        let child = cmd.spawn().map_err(|source| Error::Io {
            what: "spawning worker",
            source,
        })?;
        host_cpu.worker_started(child.id());
        Ok(child)
        // `feed` closes here: the worker holds the only copy of its end.
    };
    let mut children: Vec<Supervised> = Vec::new();
    let mut limits: std::collections::HashMap<String, u64> = Default::default();
    let mut last_balance = Instant::now();
    while !signals::terminated() {
        if signals::take_hangup() {
            let _ = plane.reload();
        }
        let want = plane.config();
        // Workers of VMs no longer configured stop.
        children.retain_mut(|w| {
            if want.vm(&w.name).is_some() {
                return true;
            }
            if let Some(child) = w.child.as_mut() {
                stop_child(child);
            }
            if let Some(sb) = w.standby.as_mut() {
                stop_child(&mut sb.child);
            }
            plane.event(
                "worker",
                format!("{}: removed from the config, worker stopped", w.name),
            );
            false
        });
        hosts.retain(|name, _| want.vm(name).is_some());
        // Memory limits changed by a reload apply now.
        for vm in &want.vms {
            let Some(host) = hosts.get(&vm.name) else {
                continue;
            };
            if limits.get(&vm.name) != Some(&vm.memory_limit_mib) {
                if limits.contains_key(&vm.name) {
                    host.set_memory_limit(vm.memory_limit_mib)?;
                }
                limits.insert(vm.name.clone(), vm.memory_limit_mib);
            }
        }
        // Configured VMs without a worker get one.
        for vm in &want.vms {
            if !children.iter().any(|w| w.name == vm.name) {
                if !hosts.contains_key(&vm.name) {
                    let host =
                        VmHost::start(&vm.name, &want.socket(&vm.name), want.layout_for(vm))?;
                    plane.watch_log_suppressed(&vm.name, host.log_counter());
                    host_cpu
                        .registry
                        .set_peers(plane.vgpu_id(&vm.name), host.peer_pids());
                    hosts.insert(vm.name.clone(), host);
                }
                let gpu = plane.gpu_of(&vm.name).unwrap_or(0);
                let side = mps.get(&gpu).map(|m| (m, m.serving()));
                children.push(Supervised {
                    name: vm.name.clone(),
                    child: Some(spawn(&vm.name, &hosts[&vm.name], side, false)?),
                    side: side.map_or(0, |s| s.1),
                    started: Instant::now(),
                    quick_deaths: 0,
                    restart_at: None,
                    poisoned: false,
                    faulted: false,
                    standby: None,
                    standby_at: Instant::now() + STANDBY_AFTER,
                });
                tracing::info!(
                    vm = vm.name,
                    tenant = vm.tenant,
                    weight = vm.weight,
                    "vGPU worker started"
                );
            }
        }
        // GPUs whose MPS server lost a client to a GPU fault or a crash
        // (not one that failed to start, which never was its client). A
        // worker says that a CUDA error poisoned its contexts before it
        // tears them down and exits: its GPU's clients are ended at once.
        let mut mps_faults: Vec<u32> = Vec::new();
        for w in &mut children {
            let gpu = plane.gpu_of(&w.name).unwrap_or(0);
            if hosts.get(&w.name).is_some_and(VmHost::take_poisoned)
                && w.child.is_some()
                && mps.contains_key(&gpu)
            {
                w.poisoned = true;
                if !mps_faults.contains(&gpu) {
                    mps_faults.push(gpu);
                }
            }
        }
        for w in &mut children {
            if let Some(status) = w.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                w.child = None;
                w.poisoned = false;
                let gpu = plane.gpu_of(&w.name).unwrap_or(0);
                if status.code() == Some(EXIT_POISONED) && !mps.contains_key(&gpu) {
                    // Without MPS a fault ends this worker alone: its
                    // standby, if it has one ready, serves at once.
                    w.faulted = true;
                    if promote_fault_standby(&plane, &want, hosts.get(&w.name), w, gpu) {
                        continue;
                    }
                }
                let crashed = ended_by_fault(&status, w.started.elapsed());
                let why = if status.code() == Some(EXIT_POISONED) {
                    "a CUDA error poisoned its GPU contexts".to_owned()
                } else {
                    status.to_string()
                };
                plane.event(
                    "worker",
                    format!(
                        "{}: worker exited ({why}); restarting it on the same region",
                        w.name
                    ),
                );
                plane.worker_restarted(&w.name);
                w.restart_at = Some(Instant::now() + w.backoff());
                if mps.contains_key(&gpu) && crashed && !mps_faults.contains(&gpu) {
                    mps_faults.push(gpu);
                }
            }
        }
        // MPS clients share fault fate: after a client's fault the server
        // takes no new client until all its clients have exited. So every
        // worker of that GPU is ended and started again, and its VM's
        // guests recover as from a worker crash (`VgpuReset`).
        for &gpu in &mps_faults {
            // With standby workers the other side serves from now on: each
            // VM's standby takes over at once, and a VM without one starts
            // a worker there at once, never waiting for this side's
            // teardown.
            let swapped = mps.get_mut(&gpu).is_some_and(crate::mps::MpsGpu::swap);
            // Killed, as a crash would end them: their contexts are lost
            // already, and a clean exit would only wait on the server.
            // Reaped below in later turns (the driver tears them down one
            // after another: 0.44 s for four on an H100), so that this loop
            // never waits on one.
            let (mut n, mut promoted) = (0, 0);
            for w in &mut children {
                if plane.gpu_of(&w.name).unwrap_or(0) != gpu {
                    continue;
                }
                let exited = w.child.is_none();
                match w.child.take() {
                    Some(child) => {
                        signal_child(&child, nix::sys::signal::Signal::SIGKILL);
                        ending.push(Ending {
                            name: w.name.clone(),
                            child,
                            gpu,
                            side: w.side,
                            since: Instant::now(),
                        });
                        n += 1;
                        plane.worker_restarted(&w.name);
                    }
                    // Exited already (it crashed, or it had been poisoned
                    // and was reaped above): its standby takes over too.
                    None if w.restart_at.is_some() => {}
                    None => continue,
                }
                let poisoned = std::mem::take(&mut w.poisoned);
                let why = if poisoned {
                    "a CUDA error poisoned its GPU contexts"
                } else {
                    "another client of its GPU's MPS server failed"
                };
                if let (true, Some(host), Some(mut sb)) =
                    (swapped, hosts.get(&w.name), w.standby.take())
                {
                    let ready = if host.standby_ready() {
                        "ready"
                    } else {
                        "still making its contexts"
                    };
                    match promote(&plane, &want, host, &w.name, gpu) {
                        Ok(()) => {
                            w.child = Some(sb.child);
                            w.side = sb.side;
                            w.started = Instant::now();
                            w.restart_at = None;
                            w.standby_at = Instant::now() + STANDBY_AFTER;
                            promoted += 1;
                            plane.event(
                                "worker",
                                format!(
                                    "{}: its standby worker ({ready}) took over: {why}",
                                    w.name
                                ),
                            );
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(vm = w.name, "promoting its standby worker: {e}");
                            stop_child(&mut sb.child);
                        }
                    }
                }
                if exited {
                    continue; // its restart is set already
                }
                w.restart_at = Some(if poisoned {
                    Instant::now() + w.backoff()
                } else {
                    Instant::now()
                });
                plane.event("worker", format!("{}: worker restarted: {why}", w.name));
            }
            tracing::info!(
                gpu,
                clients = n,
                promoted,
                "MPS clients of a failed client's GPU ended; standby workers took over or new ones start"
            );
        }
        ending.retain_mut(|e| match e.child.try_wait() {
            Ok(None) => true,
            _ => {
                tracing::info!(
                    vm = e.name,
                    gpu = e.gpu,
                    ms = e.since.elapsed().as_millis() as u64,
                    "ended MPS client reaped"
                );
                false
            }
        });
        // New clients of an MPS server start only once every client it had
        // is gone, as the server needs (measured on an H100: starting them
        // at once, their `cuInit` waiting on the server, took longer).
        let dying: std::collections::HashSet<(u32, usize)> =
            ending.iter().map(|e| (e.gpu, e.side)).collect();
        for w in &mut children {
            let gpu = plane.gpu_of(&w.name).unwrap_or(0);
            let side = mps.get(&gpu).map(|m| (m, m.serving()));
            if w.restart_at.is_some_and(|t| Instant::now() >= t)
                && !dying.contains(&(gpu, side.map_or(0, |s| s.1)))
            {
                let Some(host) = hosts.get(w.name.as_str()) else {
                    continue;
                };
                w.child = Some(spawn(&w.name, host, side, false)?);
                w.side = side.map_or(0, |s| s.1);
                w.started = Instant::now();
                w.restart_at = None;
            }
        }
        // Standby workers (see `mps.rs`): one per serving worker of a GPU
        // that keeps them, a client of the other side once none of that
        // side's old clients is left, started a while after the serving
        // one so as not to slow its start.
        for w in &mut children {
            let gpu = plane.gpu_of(&w.name).unwrap_or(0);
            // And, on a GPU without MPS, one for a VM that faulted before
            // (`[daemon] fault_standby`).
            let (client, side) = match mps.get(&gpu) {
                Some(m) => match m.standby() {
                    Some(side) => (Some((m, side)), side),
                    None => continue,
                },
                None if want.daemon.fault_standby && w.faulted => (None, 0),
                None => continue,
            };
            if let Some(sb) = w.standby.as_mut() {
                if let Ok(Some(status)) = sb.child.try_wait() {
                    plane.event(
                        "worker",
                        format!("{}: standby worker exited ({status})", w.name),
                    );
                    w.standby = None;
                    w.standby_at = Instant::now() + STANDBY_RETRY;
                }
                continue;
            }
            if w.child.is_none()
                || Instant::now() < w.standby_at
                || w.started.elapsed() < STANDBY_AFTER
                || dying.contains(&(gpu, side))
            {
                continue;
            }
            let Some(host) = hosts.get(w.name.as_str()) else {
                continue;
            };
            w.standby = Some(Standby {
                child: spawn(&w.name, host, client, true)?,
                side,
            });
            tracing::info!(vm = w.name, gpu, side, "standby worker started");
        }
        // Migrations: start those asked for, collect the workers' reports.
        for (vm, to) in plane.take_requested() {
            if let Err(e) = start_migration(&plane, hosts.get(&vm), &vm, to) {
                plane.finish_migration(&vm, Err(e));
            }
        }
        for (name, host) in &hosts {
            for r in host.take_reports() {
                plane.finish_migration(name, Ok(r));
            }
        }
        plane.expire_migrations(Duration::from_secs(30));
        if last_balance.elapsed() >= Duration::from_millis(want.placement.interval_ms) {
            last_balance = Instant::now();
            plane.balance();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::info!(
        workers = children.len(),
        "stopping (SIGTERM or SIGINT): ending the workers"
    );
    for w in &mut children {
        if let Some(child) = w.child.as_mut() {
            stop_child(child);
        }
        if let Some(sb) = w.standby.as_mut() {
            stop_child(&mut sb.child);
        }
    }
    for e in &mut ending {
        let _ = e.child.wait();
    }
    drop(hosts);
    let cfg = plane.config();
    remove_sockets(&cfg);
    drop(run_lock);
    tracing::info!(run_dir = %cfg.daemon.run_dir.display(), "stopped: workers ended, sockets and lock removed");
    Ok(())
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

/// After a fault ended `w`'s worker (no MPS), makes its standby, if it
/// has one, its worker at once; whether it did. The next standby starts
/// `STANDBY_AFTER` later.
fn promote_fault_standby(
    plane: &crate::control::ControlPlane,
    cfg: &Config,
    host: Option<&VmHost>,
    w: &mut Supervised,
    gpu: u32,
) -> bool {
    let (Some(host), Some(mut sb)) = (host, w.standby.take()) else {
        return false;
    };
    let ready = if host.standby_ready() {
        "ready"
    } else {
        "still starting"
    };
    if let Err(e) = promote(plane, cfg, host, &w.name, gpu) {
        tracing::warn!(vm = w.name, "promoting its standby worker: {e}");
        stop_child(&mut sb.child);
        return false;
    }
    plane.worker_restarted(&w.name);
    w.child = Some(sb.child);
    w.started = Instant::now();
    w.restart_at = None;
    w.standby_at = Instant::now() + STANDBY_AFTER;
    plane.event(
        "worker",
        format!(
            "{}: its standby worker ({ready}) took over: a CUDA error poisoned its GPU contexts",
            w.name
        ),
    );
    true
}

/// Makes `vm`'s standby worker its worker (the caller ended the serving
/// one): the GPU's grant service forgets the ended one, and the standby
/// registers there over a connection made here (it is confined).
fn promote(
    plane: &crate::control::ControlPlane,
    cfg: &Config,
    host: &VmHost,
    vm: &str,
    gpu: u32,
) -> Result<(), Error> {
    plane.forget_worker(vm);
    let grant = if cfg.daemon.scheduler {
        Some(
            std::os::unix::net::UnixStream::connect(grant_socket(cfg, gpu)).map_err(|source| {
                Error::Io {
                    what: "connecting to the grant service",
                    source,
                }
            })?,
        )
    } else {
        None
    };
    host.promote(grant)
}

/// Tells `vm`'s worker to move to GPU `to`: the target GPU's fair queue
/// takes the vGPU in as far ahead of its virtual time as it was on the
/// source (it neither gains nor loses share by moving), and the worker,
/// which may not connect anywhere itself, gets the target's grant socket.
fn start_migration(
    plane: &crate::control::ControlPlane,
    host: Option<&VmHost>,
    vm: &str,
    to: u32,
) -> Result<(), String> {
    let host = host.ok_or_else(|| format!("{vm} has no worker"))?;
    let id = plane.vgpu_id(vm);
    let from = plane.gpu_of(vm).unwrap_or(0);
    let cfg = plane.config();
    let vmc = cfg.vm(vm).ok_or_else(|| format!("no vm named {vm:?}"))?;
    let grant = if cfg.daemon.scheduler {
        let src = plane.service(from).map_err(|e| e.to_string())?;
        let dst = plane
            .service(to)
            .map_err(|e| e.to_string())?
            .ok_or("no grant service on the target GPU")?;
        let lag = src.and_then(|s| s.lag(id)).unwrap_or(0);
        dst.set_share(id, &vmc.tenant, vmc.weight, cfg.tenant_weight(&vmc.tenant))
            .map_err(|e| e.to_string())?;
        dst.expect(id, lag).map_err(|e| e.to_string())?;
        let s = std::os::unix::net::UnixStream::connect(grant_socket(&cfg, to))
            .map_err(|e| format!("connecting to GPU {to}'s grant service: {e}"))?;
        Some(s)
    } else {
        None
    };
    plane.event(
        "migration",
        format!("{vm}: moving from GPU {from} to GPU {to}"),
    );
    host.migrate(to, grant.as_ref()).map_err(|e| e.to_string())
}

/// One VM's worker as the supervisor sees it.
struct Supervised {
    name: String,
    /// None while waiting to restart it.
    child: Option<Child>,
    started: Instant,
    /// Deaths in a row within a second of starting.
    quick_deaths: u32,
    restart_at: Option<Instant>,
    /// It said that a CUDA error poisoned its contexts (and will exit).
    poisoned: bool,
    /// A sticky CUDA error ended one of its workers before (on a GPU
    /// without MPS): it keeps a standby with `[daemon] fault_standby`.
    faulted: bool,
    /// The MPS side (see `mps.rs`) the worker is a client of.
    side: usize,
    /// Its standby worker, on a GPU that keeps them.
    standby: Option<Standby>,
    /// No standby is started before this.
    standby_at: Instant,
}

/// A standby worker: its process and the MPS side it is a client of.
struct Standby {
    child: Child,
    side: usize,
}

/// A standby worker starts this long after its VM's serving worker (whose
/// contexts come first).
const STANDBY_AFTER: Duration = Duration::from_secs(2);
/// And this long after the last standby exited without being promoted.
const STANDBY_RETRY: Duration = Duration::from_secs(5);

/// A worker the daemon ended (its GPU's MPS server lost a client), until
/// the driver has torn it down and it is reaped.
struct Ending {
    name: String,
    child: Child,
    gpu: u32,
    /// The MPS side it was a client of.
    side: usize,
    since: Instant,
}

impl Supervised {
    /// How long to wait before restarting a worker that just died: at once,
    /// unless it keeps dying as soon as it starts (a broken GPU or config),
    /// then 1, 2, 4 ... up to 16 seconds, so that it does not spin.
    fn backoff(&mut self) -> Duration {
        if self.started.elapsed() < Duration::from_secs(1) {
            self.quick_deaths += 1;
        } else {
            self.quick_deaths = 0;
        }
        match self.quick_deaths {
            0 | 1 => Duration::ZERO,
            n => Duration::from_secs(1 << (n - 2).min(4)),
        }
    }
}

/// Whether a worker's end can have left its GPU's MPS server faulted: a
/// GPU fault it reported, or a crash (a signal) once it had been running.
/// One that failed to start (its exit code) never was a client.
fn ended_by_fault(status: &std::process::ExitStatus, ran: Duration) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.code() == Some(EXIT_POISONED)
        || (status.signal().is_some() && ran >= Duration::from_secs(1))
}

fn signal_child(child: &Child, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig);
}

fn stop_child(child: &mut Child) {
    signal_child(child, nix::sys::signal::Signal::SIGTERM);
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_fault_or_a_crash_after_start_restarts_an_mps_gpus_workers() {
        use std::os::unix::process::ExitStatusExt;
        use std::process::ExitStatus;
        let long = Duration::from_secs(5);
        let poisoned = ExitStatus::from_raw(EXIT_POISONED << 8);
        assert!(ended_by_fault(&poisoned, Duration::ZERO));
        let killed = ExitStatus::from_raw(9);
        assert!(ended_by_fault(&killed, long));
        assert!(!ended_by_fault(&killed, Duration::from_millis(300)));
        assert!(!ended_by_fault(&ExitStatus::from_raw(1 << 8), long));
        assert!(!ended_by_fault(&ExitStatus::from_raw(0), long));
    }

    #[test]
    fn restarts_at_once_unless_the_worker_keeps_dying_at_start() {
        let mut w = Supervised {
            name: "vm".into(),
            child: None,
            started: Instant::now() - Duration::from_secs(60),
            quick_deaths: 0,
            restart_at: None,
            poisoned: false,
            faulted: false,
            side: 0,
            standby: None,
            standby_at: Instant::now(),
        };
        assert_eq!(w.backoff(), Duration::ZERO, "died after a long run");
        w.started = Instant::now();
        assert_eq!(w.backoff(), Duration::ZERO, "one quick death");
        let pauses: Vec<u64> = (0..6).map(|_| w.backoff().as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 16], "a crash loop backs off");
        w.started = Instant::now() - Duration::from_secs(5);
        assert_eq!(w.backoff(), Duration::ZERO, "a worker that ran resets it");
    }
}
