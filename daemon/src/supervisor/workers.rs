//! The supervisor's workers: started for each configured VM, stopped when
//! it leaves the config, restarted when they exit, and their standbys.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use worker::process::EXIT_POISONED;

use super::faults::{ended_by_fault, promote_fault_standby};
use super::Supervisor;
use crate::config::Config;
use crate::control::ControlPlane;
use crate::link::VmHost;
use crate::mps::MpsGpu;
use crate::Error;

/// One VM's worker as the supervisor sees it.
pub(super) struct Supervised {
    pub name: String,
    /// The process slot it serves, in a VM with process slots (a worker
    /// per slot); None: the VM's one worker.
    pub slot: Option<u32>,
    /// None while waiting to restart it.
    pub child: Option<Child>,
    pub started: Instant,
    /// Deaths in a row within a second of starting.
    quick_deaths: u32,
    pub restart_at: Option<Instant>,
    /// It said that a CUDA error poisoned its contexts (and will exit).
    pub poisoned: bool,
    /// A sticky CUDA error ended one of its workers before (on a GPU
    /// without MPS): it keeps a standby with `[daemon] fault_standby`.
    faulted: bool,
    /// The MPS side (see `mps.rs`) the worker is a client of.
    pub side: usize,
    /// Its standby worker, on a GPU that keeps them.
    pub standby: Option<Standby>,
    /// No standby is started before this.
    pub standby_at: Instant,
    /// A process slot's worker that ended (with its process, or not): it
    /// is not restarted, and leaves the supervisor's list this turn.
    pub ended: bool,
}

/// A standby worker: its process and the MPS side it is a client of.
pub(super) struct Standby {
    pub child: Child,
    pub side: usize,
}

/// A standby worker starts this long after its VM's serving worker (whose
/// contexts come first).
pub(super) const STANDBY_AFTER: Duration = Duration::from_secs(2);
/// And this long after the last standby exited without being promoted.
const STANDBY_RETRY: Duration = Duration::from_secs(5);

impl Supervised {
    /// VM `name`'s worker (of process slot `slot`), just started as
    /// `child`, a client of MPS side `side`.
    pub fn new(name: &str, slot: Option<u32>, child: Child, side: usize) -> Supervised {
        Supervised {
            name: name.to_owned(),
            slot,
            child: Some(child),
            side,
            started: Instant::now(),
            quick_deaths: 0,
            restart_at: None,
            poisoned: false,
            faulted: false,
            standby: None,
            standby_at: Instant::now() + STANDBY_AFTER,
            ended: false,
        }
    }

    /// How long to wait before restarting a worker that just died: at once,
    /// unless it keeps dying as soon as it starts (a broken GPU or config),
    /// then 1, 2, 4 ... up to 16 seconds, so that it does not spin.
    pub fn backoff(&mut self) -> Duration {
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

/// What starts worker processes: the daemon's own executable, run as
/// `fairvgpu worker`.
pub(super) struct Launcher {
    pub exe: PathBuf,
    pub config_path: PathBuf,
    pub host_cpu: Arc<crate::hostcpu::HostCpu>,
}

impl Launcher {
    /// A worker for `name` (of process slot `slot`, in a VM with them), or
    /// a standby one, the client of MPS side `side` of its GPU (if the GPU
    /// runs MPS).
    pub fn spawn(
        &self,
        plane: &ControlPlane,
        (name, slot): (&str, Option<u32>),
        host: &VmHost,
        mps: Option<(&MpsGpu, usize)>,
        standby: bool,
    ) -> Result<Child, Error> {
        let feed = match (standby, slot) {
            (true, _) => host.standby_feed()?,
            (false, Some(k)) => host.feed_slot(k)?,
            (false, None) => host.feed()?,
        };
        let ledger = slot.map(|_| host.ledger()).transpose()?;
        // Only these fds cross the exec (the rest are close-on-exec); the
        // supervisor is the only thread that starts processes.
        for fd in std::iter::once(&feed).chain(ledger.as_ref()) {
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
        if standby {
            cmd.arg("--standby");
        }
        // A vGPU declared through the API is not in host.toml, which the
        // worker reads: its entry goes along.
        if let Some(entry) = declared_entry(plane, name)? {
            cmd.arg("--declared").arg(entry);
        }
        if let (Some(k), Some(l)) = (slot, &ledger) {
            cmd.arg("--slot")
                .arg(k.to_string())
                .arg("--ledger-fd")
                .arg(l.as_raw_fd().to_string());
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
            if let Some(sb) = w.standby.as_mut() {
                stop_child(&mut sb.child);
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

    /// Configured VMs get their host side; those without process slots a
    /// worker. A VM with process slots starts none: its slots' workers
    /// are bound as its processes claim them (`slots.rs`).
    pub(super) fn start_missing(&mut self, want: &Config) -> Result<(), Error> {
        for vm in &want.vms {
            self.ensure_host(want, vm)?;
            if vm.slots() == 0 && !self.children.iter().any(|w| w.name == vm.name) {
                self.start_worker(vm, None)?;
            }
        }
        Ok(())
    }

    /// VM `vm`'s host side (its region and socket), made if it has none
    /// yet; with process slots, watched for processes claiming them.
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
        if vm.slots() > 0 {
            host.watch_slots(self.claims.sender())?;
            tracing::info!(
                vm = vm.name,
                slots = vm.slots(),
                "vGPU ready: a worker is bound to each process slot its processes claim"
            );
        }
        self.hosts.insert(vm.name.clone(), host);
        Ok(())
    }

    /// Starts VM `vm`'s worker (of process slot `slot`); its host side is
    /// there.
    pub(super) fn start_worker(
        &mut self,
        vm: &crate::config::VmConfig,
        slot: Option<u32>,
    ) -> Result<(), Error> {
        let gpu = self.plane.gpu_of(&vm.name).unwrap_or(0);
        let side = self.mps.get(&gpu).map(|m| (m, m.serving()));
        let host = self.hosts.get(&vm.name).ok_or(Error::NoWorker)?;
        let child = self
            .launcher
            .spawn(&self.plane, (&vm.name, slot), host, side, false)?;
        self.children.push(Supervised::new(
            &vm.name,
            slot,
            child,
            side.map_or(0, |s| s.1),
        ));
        if slot.is_some() {
            // One per guest process (the event said it, within its limit).
            let pid = self
                .children
                .last()
                .and_then(|w| w.child.as_ref())
                .map(Child::id);
            tracing::debug!(
                vm = vm.name,
                slot,
                gpu,
                pid,
                "a process slot's worker started"
            );
        } else {
            tracing::info!(
                vm = vm.name,
                gpu,
                tenant = vm.tenant,
                weight = vm.weight,
                "vGPU worker started"
            );
        }
        Ok(())
    }

    /// The `i`-th worker, if it exited: a restart is set (or, after a fault
    /// on a GPU without MPS, its standby serves at once); a GPU whose MPS
    /// server it may have left faulted joins `mps_faults`.
    pub(super) fn on_worker_exited(&mut self, i: usize, want: &Config, mps_faults: &mut Vec<u32>) {
        let w = &mut self.children[i];
        let Some(status) = w.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) else {
            return;
        };
        w.child = None;
        w.poisoned = false;
        let gpu = self.plane.gpu_of(&w.name).unwrap_or(0);
        if let Some(k) = w.slot {
            // A process slot's worker is not restarted, however it ended.
            let crashed =
                self.mps.contains_key(&gpu) && ended_by_fault(&status, w.started.elapsed());
            let host = self.hosts.get(&w.name);
            super::slots::slot_worker_ended(&self.plane, host, w, k, &status, &mut self.claims);
            if crashed && !mps_faults.contains(&gpu) {
                mps_faults.push(gpu);
            }
            return;
        }
        if status.code() == Some(EXIT_POISONED) && !self.mps.contains_key(&gpu) && w.slot.is_none()
        {
            // Without MPS a fault ends this worker alone: its
            // standby, if it has one ready, serves at once.
            w.faulted = true;
            if promote_fault_standby(&self.plane, want, self.hosts.get(&w.name), w, gpu) {
                return;
            }
        }
        let crashed = ended_by_fault(&status, w.started.elapsed());
        let why = if status.code() == Some(EXIT_POISONED) {
            "a CUDA error poisoned its GPU contexts".to_owned()
        } else {
            status.to_string()
        };
        restart_later(&self.plane, w, &format!("exited ({why})"));
        if self.mps.contains_key(&gpu) && crashed && !mps_faults.contains(&gpu) {
            mps_faults.push(gpu);
        }
    }

    /// Tells the control plane which VMs have a standby worker and whether
    /// it is ready (status `standby`).
    pub(super) fn report_standbys(&self) {
        for w in self.children.iter().filter(|w| w.slot.is_none()) {
            let ready = w.standby.as_ref().map(|_| {
                self.hosts
                    .get(&w.name)
                    .is_some_and(crate::link::VmHost::standby_ready)
            });
            self.plane.set_standby(&w.name, ready);
        }
    }

    /// Workers whose restart is due start again. New clients of an MPS
    /// server start only once every client it had is gone (`dying`), as
    /// the server needs (measured on an H100: starting them at once, their
    /// `cuInit` waiting on the server, took longer).
    pub(super) fn restart_due(
        &mut self,
        dying: &std::collections::HashSet<(u32, usize)>,
    ) -> Result<(), Error> {
        for w in &mut self.children {
            let gpu = self.plane.gpu_of(&w.name).unwrap_or(0);
            let side = self.mps.get(&gpu).map(|m| (m, m.serving()));
            if w.restart_at.is_some_and(|t| Instant::now() >= t)
                && !dying.contains(&(gpu, side.map_or(0, |s| s.1)))
            {
                let Some(host) = self.hosts.get(w.name.as_str()) else {
                    continue;
                };
                w.child =
                    Some(
                        self.launcher
                            .spawn(&self.plane, (&w.name, w.slot), host, side, false)?,
                    );
                w.side = side.map_or(0, |s| s.1);
                w.started = Instant::now();
                w.restart_at = None;
            }
        }
        Ok(())
    }

    /// Standby workers (see `mps.rs`): one per serving worker of a GPU that
    /// keeps them, a client of the other side once none of that side's old
    /// clients is left (`dying`), started a while after the serving one so
    /// as not to slow its start. A standby that exited is noted.
    pub(super) fn start_standbys(
        &mut self,
        want: &Config,
        dying: &std::collections::HashSet<(u32, usize)>,
    ) -> Result<(), Error> {
        // A process slot's worker has no standby: the VM's next process
        // takes another slot.
        for w in self.children.iter_mut().filter(|w| w.slot.is_none()) {
            let gpu = self.plane.gpu_of(&w.name).unwrap_or(0);
            // And, on a GPU without MPS, one for a VM that faulted before
            // (`[daemon] fault_standby`) or keeps one from its start
            // (`[[vm]] standby`).
            let (client, side) = match self.mps.get(&gpu) {
                Some(m) => match m.standby() {
                    Some(side) => (Some((m, side)), side),
                    None => continue,
                },
                None if want.daemon.fault_standby
                    && (w.faulted || want.vm(&w.name).is_some_and(|v| v.standby)) =>
                {
                    (None, 0)
                }
                None => continue,
            };
            if let Some(sb) = w.standby.as_mut() {
                if let Ok(Some(status)) = sb.child.try_wait() {
                    self.plane.event(
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
            let Some(host) = self.hosts.get(w.name.as_str()) else {
                continue;
            };
            w.standby = Some(Standby {
                child: self
                    .launcher
                    .spawn(&self.plane, (&w.name, None), host, client, true)?,
                side,
            });
            tracing::info!(vm = w.name, gpu, side, "standby worker started");
        }
        Ok(())
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

/// `w`'s worker `ended` ("exited (..)", "ended (..)"): said in the events
/// and counted, and a new one started on the same region after its backoff.
pub(super) fn restart_later(plane: &ControlPlane, w: &mut Supervised, ended: &str) {
    plane.event(
        "worker",
        format!(
            "{}: worker {ended}; restarting it on the same region",
            w.name
        ),
    );
    plane.worker_restarted(&w.name);
    w.restart_at = Some(Instant::now() + w.backoff());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_at_once_unless_the_worker_keeps_dying_at_start() {
        let mut w = Supervised {
            name: "vm".into(),
            slot: None,
            child: None,
            started: Instant::now() - Duration::from_secs(60),
            quick_deaths: 0,
            restart_at: None,
            poisoned: false,
            faulted: false,
            side: 0,
            standby: None,
            standby_at: Instant::now(),
            ended: false,
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
