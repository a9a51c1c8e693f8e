//! Faults: MPS clients share fault fate, so a GPU fault or a crash among an
//! MPS server's clients ends them all; standby workers are promoted in
//! their place, and the ended ones reaped once the driver has torn them
//! down. On a GPU without MPS a fault ends its worker alone, and a standby
//! kept since an earlier fault serves at once.

use std::collections::HashSet;
use std::process::Child;
use std::time::{Duration, Instant};

use worker::process::EXIT_POISONED;

use super::workers::{restart_later, signal_child, stop_child, Supervised, STANDBY_AFTER};
use super::Supervisor;
use crate::config::Config;
use crate::control::ControlPlane;
use crate::link::VmHost;
use crate::setup::grant_socket;
use crate::Error;

/// A worker the daemon ended (its GPU's MPS server lost a client, or its
/// own fault made its standby the VM's worker), until the driver has torn
/// it down and it is reaped.
pub(super) struct Ending {
    name: String,
    pub child: Child,
    gpu: u32,
    /// The MPS side it was a client of.
    side: usize,
    since: Instant,
}

impl Ending {
    /// Ends `vm`'s worker `child` with SIGKILL, as a crash would (its
    /// contexts are lost already, and a clean exit would only wait on the
    /// driver), to be reaped once the driver has torn it down.
    fn kill(vm: &str, child: Child, gpu: u32, side: usize) -> Ending {
        signal_child(&child, nix::sys::signal::Signal::SIGKILL);
        Ending {
            name: vm.to_owned(),
            child,
            gpu,
            side,
            since: Instant::now(),
        }
    }
}

impl Supervisor {
    /// Workers that said a CUDA error poisoned their contexts (they say so
    /// before they tear them down and exit). On a GPU without MPS, one whose
    /// VM keeps a standby is ended and its standby serves at once, without
    /// waiting for the driver to tear the ended one's contexts down (on an
    /// H100 its exit came 136-171 ms after its report). Returns the MPS
    /// GPUs among them, whose clients are all ended ([`Self::on_mps_fault`]).
    pub(super) fn poisoned_gpus(&mut self, want: &Config) -> Vec<u32> {
        let mut mps_faults: Vec<u32> = Vec::new();
        for w in &mut self.children {
            let gpu = self.plane.gpu_of(&w.name).unwrap_or(0);
            let host = self.hosts.get(&w.name);
            if !host.is_some_and(VmHost::take_poisoned) || w.child.is_none() {
                continue;
            }
            if self.mps.contains_key(&gpu) {
                w.poisoned = true;
                if !mps_faults.contains(&gpu) {
                    mps_faults.push(gpu);
                }
                continue;
            }
            if w.standby.is_none() {
                continue; // restarted once it has exited (on_worker_exited)
            }
            // Its contexts are lost already: killed, as a crash would end
            // it, and reaped in a later turn.
            if let Some(child) = w.child.take() {
                self.ending.push(Ending::kill(&w.name, child, gpu, w.side));
            }
            if !promote_fault_standby(&self.plane, want, host, w, gpu) {
                restart_later(
                    &self.plane,
                    w,
                    "ended (a CUDA error poisoned its GPU contexts)",
                );
            }
        }
        mps_faults
    }

    /// MPS clients share fault fate: after a client's fault the server
    /// takes no new client until all its clients have exited. So every
    /// worker of GPU `gpu` is ended and started again, and its VM's guests
    /// recover as from a worker crash (`VgpuReset`).
    pub(super) fn on_mps_fault(&mut self, gpu: u32, want: &Config) {
        // With standby workers the other side serves from now on: each
        // VM's standby takes over at once, and a VM without one starts
        // a worker there at once, never waiting for this side's
        // teardown.
        let swapped = self.mps.get_mut(&gpu).is_some_and(crate::mps::MpsGpu::swap);
        // Killed, as a crash would end them: their contexts are lost
        // already, and a clean exit would only wait on the server.
        // Reaped in later turns (the driver tears them down one after
        // another: 0.44 s for four on an H100), so that the loop never
        // waits on one.
        let (mut n, mut promoted) = (0, 0);
        // The GPU's spare is a client of the failed server too.
        if let Some(s) = self.spares.take_gpu(gpu) {
            self.ending
                .push(Ending::kill("(spare)", s.child, gpu, s.side));
        }
        for w in &mut self.children {
            if self.plane.gpu_of(&w.name).unwrap_or(0) != gpu {
                continue;
            }
            if let Some(k) = w.slot.filter(|_| !w.ended) {
                // A process slot's worker is not restarted: its process
                // sees the error; the slot's next one gets a new worker.
                if let Some(child) = w.child.take() {
                    self.ending.push(Ending::kill(&w.name, child, gpu, w.side));
                    n += 1;
                    let killed = std::os::unix::process::ExitStatusExt::from_raw(9);
                    super::slots::slot_worker_ended(
                        &self.plane,
                        self.hosts.get(&w.name),
                        w,
                        k,
                        &killed,
                        &mut self.claims,
                    );
                }
                continue;
            }
            let exited = w.child.is_none();
            match w.child.take() {
                Some(child) => {
                    self.ending.push(Ending::kill(&w.name, child, gpu, w.side));
                    n += 1;
                    self.plane.worker_restarted(&w.name);
                }
                // Exited already (it crashed, or it had been poisoned
                // and was reaped): its standby takes over too.
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
                (swapped, self.hosts.get(&w.name), w.standby.take())
            {
                let ready = if host.standby_ready() {
                    "ready"
                } else {
                    "still making its contexts"
                };
                match promote(&self.plane, want, host, &w.name, gpu) {
                    Ok(()) => {
                        w.child = Some(sb.child);
                        w.side = sb.side;
                        w.started = Instant::now();
                        w.restart_at = None;
                        w.standby_at = Instant::now() + STANDBY_AFTER;
                        promoted += 1;
                        self.plane.event(
                            "worker",
                            format!("{}: its standby worker ({ready}) took over: {why}", w.name),
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
            self.plane
                .event("worker", format!("{}: worker restarted: {why}", w.name));
        }
        tracing::info!(
            gpu,
            clients = n,
            promoted,
            "MPS clients of a failed client's GPU ended; standby workers took over or new ones start"
        );
    }

    /// Ended workers the driver has torn down are reaped.
    pub(super) fn reap_ended(&mut self) {
        self.ending.retain_mut(|e| match e.child.try_wait() {
            Ok(None) => true,
            _ => {
                tracing::info!(
                    vm = e.name,
                    gpu = e.gpu,
                    ms = crate::nanos(e.since.elapsed()) / 1_000_000,
                    "ended worker reaped"
                );
                false
            }
        });
    }

    /// The MPS servers (GPU and side) some of whose ended clients are still
    /// being torn down: none of their new clients starts yet.
    pub(super) fn dying(&self) -> HashSet<(u32, usize)> {
        self.ending
            .iter()
            .filter(|e| self.mps.contains_key(&e.gpu))
            .map(|e| (e.gpu, e.side))
            .collect()
    }
}

/// After a fault ended `w`'s worker (no MPS), makes its standby, if it
/// has one, its worker at once; whether it did. The next standby starts
/// `STANDBY_AFTER` later.
pub(super) fn promote_fault_standby(
    plane: &ControlPlane,
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
    plane: &ControlPlane,
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

/// Whether a worker's end can have left its GPU's MPS server faulted: a
/// GPU fault it reported, or a crash (a signal) once it had been running.
/// One that failed to start (its exit code) never was a client.
pub(super) fn ended_by_fault(status: &std::process::ExitStatus, ran: Duration) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.code() == Some(EXIT_POISONED)
        || (status.signal().is_some() && ran >= Duration::from_secs(1))
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
}
