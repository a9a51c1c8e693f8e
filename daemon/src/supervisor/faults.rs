//! Faults: MPS clients share fault fate, so a GPU fault or a crash among an
//! MPS server's clients ends them all (each guest process whose worker it
//! was sees the error; the VM's next process gets a new worker), and the
//! ended ones are reaped once the driver has torn them down. On a GPU
//! without MPS a fault ends its own process's worker alone (`slots.rs`).

use std::collections::HashSet;
use std::process::Child;
use std::time::{Duration, Instant};

use worker::process::EXIT_POISONED;

use super::workers::signal_child;
use super::Supervisor;
use crate::link::VmHost;

/// A worker the daemon ended (its GPU's MPS server lost a client), until
/// the driver has torn it down and it is reaped.
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
    /// The GPUs running MPS with a worker that said a CUDA error poisoned
    /// its contexts (it says so before it tears them down and exits): all
    /// their clients are ended ([`Self::on_mps_fault`]). Without MPS such a
    /// worker ends alone.
    pub(super) fn poisoned_gpus(&self) -> Vec<u32> {
        let mut mps_faults: Vec<u32> = Vec::new();
        for w in &self.children {
            let gpu = self.plane.gpu_of(&w.name).unwrap_or(0);
            let host = self.hosts.get(&w.name);
            if !self.mps.contains_key(&gpu)
                || w.child.is_none()
                || !host.is_some_and(VmHost::take_poisoned)
            {
                continue;
            }
            if !mps_faults.contains(&gpu) {
                mps_faults.push(gpu);
            }
        }
        mps_faults
    }

    /// MPS clients share fault fate: after a client's fault the server
    /// takes no new client until all its clients have exited. So every
    /// worker of GPU `gpu` is ended, as natively every client process
    /// would be, and the GPU's next workers become clients of its other
    /// server (`[[gpu]] mps_standby`) at once, or of this one once the
    /// driver has torn the ended ones down.
    pub(super) fn on_mps_fault(&mut self, gpu: u32) {
        let swapped = self.mps.get_mut(&gpu).is_some_and(crate::mps::MpsGpu::swap);
        // Killed, as a crash would end them: their contexts are lost
        // already, and a clean exit would only wait on the server.
        // Reaped in later turns (the driver tears them down one after
        // another: 0.44 s for four on an H100), so that the loop never
        // waits on one.
        let mut n = 0;
        // The GPU's spare is a client of the failed server too.
        if let Some(s) = self.spares.take_gpu(gpu) {
            self.ending
                .push(Ending::kill("(spare)", s.child, gpu, s.side));
        }
        for w in &mut self.children {
            if self.plane.gpu_of(&w.name).unwrap_or(0) != gpu || w.ended {
                continue;
            }
            // Its process sees the error; the slot's next one gets a new
            // worker.
            if let Some(child) = w.child.take() {
                self.ending.push(Ending::kill(&w.name, child, gpu, w.side));
                n += 1;
                let killed = std::os::unix::process::ExitStatusExt::from_raw(9);
                let slot = w.slot;
                super::slots::slot_worker_ended(
                    &self.plane,
                    self.hosts.get(&w.name),
                    w,
                    slot,
                    &killed,
                    &mut self.claims,
                );
            }
        }
        tracing::info!(
            gpu,
            clients = n,
            swapped,
            "MPS clients of a failed client's GPU ended; its next workers start on a server that takes them"
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
