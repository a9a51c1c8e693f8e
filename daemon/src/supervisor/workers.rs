//! The supervisor's workers: one per running guest process, started for
//! its process slot (`slots.rs`) or bound from a spare (`spares.rs`), and
//! stopped when their VM leaves the config.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Instant;

use super::faults::ended_by_fault;
use super::Supervisor;
use crate::config::Config;
use crate::control::ControlPlane;
use crate::link::VmHost;
use crate::mps::MpsGpu;
use crate::Error;

/// One guest process's worker as the supervisor sees it.
pub(super) struct Supervised {
    pub name: String,
    /// The process slot it serves.
    pub slot: u32,
    /// None once it ended or the daemon ended it.
    pub child: Option<Child>,
    pub started: Instant,
    /// The MPS side (see `mps.rs`) the worker is a client of.
    pub side: usize,
    /// It ended (with its process, or not): it is not restarted, and
    /// leaves the supervisor's list this turn.
    pub ended: bool,
}

impl Supervised {
    /// VM `name`'s worker of process slot `slot`, just started as `child`,
    /// a client of MPS side `side`.
    pub fn new(name: &str, slot: u32, child: Child, side: usize) -> Supervised {
        Supervised {
            name: name.to_owned(),
            slot,
            child: Some(child),
            side,
            started: Instant::now(),
            ended: false,
        }
    }
}

/// What starts worker processes: the daemon's own executable, run as
/// `fairvgpu worker`.
pub(super) struct Launcher {
    pub exe: PathBuf,
    pub config_path: PathBuf,
    pub host_cpu: Arc<crate::hostcpu::HostCpu>,
}

impl Launcher {
    /// A worker for process slot `slot` of `name`, the client of MPS side
    /// `side` of its GPU (if the GPU runs MPS); one that serves on from the
    /// checkpoint stream in memfd `restore`, where given.
    pub fn spawn(
        &self,
        plane: &ControlPlane,
        (name, slot): (&str, u32),
        host: &VmHost,
        mps: Option<(&MpsGpu, usize)>,
        restore: Option<&std::os::fd::OwnedFd>,
    ) -> Result<Child, Error> {
        let feed = host.feed_slot(slot)?;
        let ledger = host.ledger()?;
        // Only these fds cross the exec (the rest are close-on-exec); the
        // supervisor is the only thread that starts processes.
        let restore = restore
            .map(std::os::fd::OwnedFd::try_clone)
            .transpose()
            .map_err(|source| Error::Io {
                what: "dup of a checkpoint memfd",
                source,
            })?;
        for fd in [Some(&feed), Some(&ledger), restore.as_ref()]
            .into_iter()
            .flatten()
        {
            nix::fcntl::fcntl(
                fd,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )
            .map_err(|e| Error::Io {
                what: "feed fd flags",
                source: e.into(),
            })?;
        }
        let gpu = plane.gpu_of(name).unwrap_or(0);
        let mut cmd = Command::new(&self.exe);
        cmd.args(["worker", "--config"])
            .arg(&self.config_path)
            .args(["--vm", name, "--id"])
            .arg(plane.vgpu_id(name).to_string())
            .arg("--feed-fd")
            .arg(feed.as_raw_fd().to_string())
            .arg("--gpu")
            .arg(gpu.to_string());
        // A vGPU declared through the API is not in host.toml, which the
        // worker reads: its entry goes along.
        if let Some(entry) = declared_entry(plane, name)? {
            cmd.arg("--declared").arg(entry);
        }
        cmd.arg("--slot")
            .arg(slot.to_string())
            .arg("--ledger-fd")
            .arg(ledger.as_raw_fd().to_string());
        if let Some(r) = &restore {
            cmd.arg("--restore-fd").arg(r.as_raw_fd().to_string());
        }
        if let Some((m, side)) = mps {
            cmd.envs(m.side(side).client_env())
                .env_remove("CUDA_VISIBLE_DEVICES");
        }
        let child = cmd.spawn().map_err(|source| Error::Io {
            what: "spawning worker",
            source,
        })?;
        self.host_cpu.worker_started(child.id());
        Ok(child)
        // `feed` closes here: the worker holds the only copy of its end.
    }

    /// A spare worker for GPU `gpu` (see `spares.rs`), the client of MPS
    /// side `side` of it (if it runs MPS): the process, and the daemon's
    /// end of the socket it says it is ready on and is bound over.
    pub fn spawn_spare(
        &self,
        gpu: u32,
        mps: Option<(&MpsGpu, usize)>,
    ) -> Result<(Child, UnixStream), Error> {
        let (ours, theirs) = UnixStream::pair().map_err(|source| Error::Io {
            what: "spare socket pair",
            source,
        })?;
        // Only this fd crosses the exec; the supervisor is the only thread
        // that starts processes.
        nix::fcntl::fcntl(
            &theirs,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| Error::Io {
            what: "spare fd flags",
            source: e.into(),
        })?;
        let mut cmd = Command::new(&self.exe);
        cmd.args(["worker", "--config"])
            .arg(&self.config_path)
            .arg("--spare-fd")
            .arg(theirs.as_raw_fd().to_string())
            .arg("--gpu")
            .arg(gpu.to_string());
        if let Some((m, side)) = mps {
            cmd.envs(m.side(side).client_env())
                .env_remove("CUDA_VISIBLE_DEVICES");
        }
        let child = cmd.spawn().map_err(|source| Error::Io {
            what: "spawning a spare worker",
            source,
        })?;
        self.host_cpu.worker_started(child.id());
        Ok((child, ours))
    }
}

/// The `[[vm]]` entry of a vGPU declared through the API (TOML), which a
/// worker does not find in host.toml; None for one that is there.
pub(super) fn declared_entry(plane: &ControlPlane, name: &str) -> Result<Option<String>, Error> {
    if plane.declared_by(name).is_none() {
        return Ok(None);
    }
    let Some(v) = plane.config().vm(name).cloned() else {
        return Ok(None);
    };
    toml::to_string(&v).map(Some).map_err(|e| Error::Io {
        what: "writing a declared vGPU's entry",
        source: std::io::Error::other(e),
    })
}

impl Supervisor {
    /// Workers of VMs no longer configured stop.
    pub(super) fn stop_removed(&mut self, want: &Config) {
        let plane = &self.plane;
        self.children.retain_mut(|w| {
            if want.vm(&w.name).is_some() {
                return true;
            }
            if let Some(child) = w.child.as_mut() {
                stop_child(child);
            }
            plane.event(
                "worker",
                format!("{}: removed from the config, worker stopped", w.name),
            );
            false
        });
        self.hosts.retain(|name, _| want.vm(name).is_some());
    }

    /// Memory limits changed by a reload apply now.
    pub(super) fn apply_memory_limits(&mut self, want: &Config) -> Result<(), Error> {
        for vm in &want.vms {
            let Some(host) = self.hosts.get(&vm.name) else {
                continue;
            };
            if self.limits.get(&vm.name) != Some(&vm.memory_limit_mib) {
                if self.limits.contains_key(&vm.name) {
                    host.set_memory_limit(vm.memory_limit_mib)?;
                }
                self.limits.insert(vm.name.clone(), vm.memory_limit_mib);
            }
        }
        Ok(())
    }

    /// Configured VMs get their host side. It starts no worker: its
    /// slots' workers are bound as its processes claim them (`slots.rs`).
    pub(super) fn start_missing(&mut self, want: &Config) -> Result<(), Error> {
        for vm in &want.vms {
            self.ensure_host(want, vm)?;
        }
        Ok(())
    }

    /// VM `vm`'s host side (its region and socket), made if it has none
    /// yet, and watched for processes claiming its slots.
    fn ensure_host(&mut self, want: &Config, vm: &crate::config::VmConfig) -> Result<(), Error> {
        if self.hosts.contains_key(&vm.name) {
            return Ok(());
        }
        let host = VmHost::start(&vm.name, &want.socket(&vm.name), want.layout_for(vm))?;
        self.plane
            .watch_log_suppressed(&vm.name, host.log_counter());
        self.launcher
            .host_cpu
            .registry
            .set_peers(self.plane.vgpu_id(&vm.name), host.peer_pids());
        host.watch_slots(self.claims.sender())?;
        tracing::info!(
            vm = vm.name,
            slots = vm.slots(),
            "vGPU ready: a worker is bound to each process slot its processes claim"
        );
        self.hosts.insert(vm.name.clone(), host);
        Ok(())
    }

    /// Starts a worker for process slot `slot` of VM `vm`; its host side
    /// is there.
    pub(super) fn start_worker(
        &mut self,
        vm: &crate::config::VmConfig,
        slot: u32,
    ) -> Result<(), Error> {
        self.start_worker_from(vm, slot, None)
    }

    /// [`Supervisor::start_worker`], serving on from the checkpoint
    /// stream in memfd `restore` where given.
    pub(super) fn start_worker_from(
        &mut self,
        vm: &crate::config::VmConfig,
        slot: u32,
        restore: Option<&std::os::fd::OwnedFd>,
    ) -> Result<(), Error> {
        let gpu = self.plane.gpu_of(&vm.name).unwrap_or(0);
        let side = self.mps.get(&gpu).map(|m| (m, m.serving()));
        let host = self.hosts.get(&vm.name).ok_or(Error::NoWorker)?;
        let child = self
            .launcher
            .spawn(&self.plane, (&vm.name, slot), host, side, restore)?;
        let pid = child.id();
        self.children.push(Supervised::new(
            &vm.name,
            slot,
            child,
            side.map_or(0, |s| s.1),
        ));
        // One per guest process (the event said it, within its limit).
        tracing::debug!(
            vm = vm.name,
            slot,
            gpu,
            pid,
            "a process slot's worker started"
        );
        Ok(())
    }

    /// Tells the control plane each VM's running workers (status
    /// `worker_pids`) when they changed.
    pub(super) fn report_workers(&mut self) {
        let mut now: HashMap<String, Vec<u32>> = HashMap::new();
        for w in &self.children {
            if let Some(c) = &w.child {
                now.entry(w.name.clone()).or_default().push(c.id());
            }
        }
        if now != self.reported {
            self.plane.set_workers(now.clone());
            self.reported = now;
        }
    }

    /// The `i`-th worker, if it exited: not restarted, however it ended
    /// (`slots.rs`); a GPU whose MPS server it may have left faulted joins
    /// `mps_faults`.
    pub(super) fn on_worker_exited(&mut self, i: usize, mps_faults: &mut Vec<u32>) {
        let w = &mut self.children[i];
        let Some(status) = w.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) else {
            return;
        };
        w.child = None;
        let gpu = self.plane.gpu_of(&w.name).unwrap_or(0);
        let crashed = self.mps.contains_key(&gpu) && ended_by_fault(&status, w.started.elapsed());
        let host = self.hosts.get(&w.name);
        let slot = w.slot;
        super::slots::slot_worker_ended(&self.plane, host, w, slot, &status, &mut self.claims);
        if crashed && !mps_faults.contains(&gpu) {
            mps_faults.push(gpu);
        }
    }
}

pub(super) fn signal_child(child: &Child, sig: nix::sys::signal::Signal) {
    // A pid past i32 (none is) must not wrap into a negative one: kill()
    // would signal a process group, or at -1 every process.
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

pub(super) fn stop_child(child: &mut Child) {
    signal_child(child, nix::sys::signal::Signal::SIGTERM);
    let _ = child.wait();
}
