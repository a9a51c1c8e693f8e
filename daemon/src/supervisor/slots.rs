//! Process slots' workers, bound on demand: a VM starts no worker; when one of its processes claims a slot that has none (the
//! link's slot watch says so), a spare worker of the VM's GPU is bound to
//! it (`spares.rs`), or, if none is ready, a worker is started for the slot
//! and the process waits for it. A slot's worker ends with its process and
//! is not restarted, however it ended: the slot goes back to the watch.

use std::os::fd::OwnedFd;
use std::process::ExitStatus;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use wire::feed::SpareBinding;
use worker::process::EXIT_POISONED;

use super::workers::{declared_entry, Supervised};
use super::Supervisor;
use crate::config::Config;
use crate::control::ControlPlane;
use crate::link::{SlotClaim, VmHost};
use crate::Error;

/// What ends the supervisor's pause between turns at once.
pub(super) enum Note {
    /// A slot without a worker claimed, from a VM's slot watch.
    Claim(SlotClaim),
    /// A checkpoint, restore or handover asked of the control plane, or a
    /// vGPU another host handed over: the guest is paused meanwhile.
    Asked,
}

impl From<SlotClaim> for Note {
    fn from(c: SlotClaim) -> Note {
        Note::Claim(c)
    }
}

/// The claims of slots without a worker, from every VM's slot watch.
pub(super) struct Claims {
    tx: Sender<Note>,
    rx: Receiver<Note>,
    /// Claims not served yet (their VM is moving between GPUs).
    pending: Vec<SlotClaim>,
    /// Slots given back to their watch only at the time given: their
    /// worker failed to start, or died as it started (a broken GPU or
    /// config), so that a slot's process does not start workers in a loop.
    later: Vec<(SlotClaim, Instant)>,
    /// Each VM's limit on the events its processes' comings and goings
    /// make (a guest can start and end workers at will).
    logs: std::collections::HashMap<String, transport::LogLimiter>,
}

/// How long a slot whose worker could not start or died as it started
/// waits before its watch looks again.
const SLOT_RETRY: Duration = Duration::from_secs(1);

/// A slot's worker that fails before this has run failed as it started.
const QUICK_DEATH: Duration = Duration::from_secs(1);

impl Claims {
    pub fn new() -> Claims {
        let (tx, rx) = std::sync::mpsc::channel();
        Claims {
            tx,
            rx,
            pending: Vec::new(),
            later: Vec::new(),
            logs: std::collections::HashMap::new(),
        }
    }

    /// Where a VM's slot watch sends its claims, and the control plane
    /// says it was asked.
    pub fn sender(&self) -> Sender<Note> {
        self.tx.clone()
    }

    /// Waits up to `pause` for a note (the supervisor's pause between
    /// turns: any ends it at once), and takes every claim that came.
    pub fn wait(&mut self, pause: Duration) {
        let mut first = self.rx.recv_timeout(pause).ok();
        while let Some(n) = first.take().or_else(|| self.rx.try_recv().ok()) {
            if let Note::Claim(c) = n {
                self.pending.push(c);
            }
        }
    }
}

impl Supervisor {
    /// Binds a worker to each slot claimed (a spare, or one started for
    /// it); a VM moving between GPUs gets its workers once it has moved.
    pub(super) fn on_slot_claims(&mut self, want: &Config) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.claims.later)
            .into_iter()
            .partition(|(_, at)| *at <= now);
        self.claims.later = later;
        for (c, _) in due {
            if let Some(h) = self.hosts.get(&c.vm) {
                h.slot_unserved(c.slot);
            }
        }
        self.claims.wait(Duration::ZERO);
        for c in std::mem::take(&mut self.claims.pending) {
            let Some(vm) = want.vm(&c.vm) else {
                continue; // removed meanwhile
            };
            if self.moves.contains_key(&c.vm) || self.held.contains(&c.vm) {
                self.claims.pending.push(c);
                continue;
            }
            let served = self
                .children
                .iter()
                .any(|w| w.name == c.vm && w.slot == c.slot && !w.ended);
            if served || c.slot >= vm.slots() {
                continue;
            }
            if let Err(e) = self.bind_slot(vm, c.slot) {
                tracing::warn!(
                    vm = c.vm,
                    slot = c.slot,
                    "no worker for a claimed slot: {e}"
                );
                self.claims.later.push((c, now + SLOT_RETRY));
            }
        }
    }

    /// Gives slot `slot` of `vm` a worker: the VM's GPU's spare if one is
    /// ready, else one started for it.
    fn bind_slot(&mut self, vm: &crate::config::VmConfig, slot: u32) -> Result<(), Error> {
        if self.bind_spare(vm, slot, None)? {
            return Ok(());
        }
        self.claims.event(
            &self.plane,
            &vm.name,
            format!(
                "{}: no spare worker for process slot {slot}: one started for it, its process waits",
                vm.name
            ),
        );
        self.start_worker(vm, slot)
    }

    /// Binds the VM's GPU's spare to slot `slot` of `vm`, serving on from
    /// the checkpoint `stream` where given (a restore): false if it has
    /// none, or binding it failed (the spare is then ended).
    pub(super) fn bind_spare(
        &mut self,
        vm: &crate::config::VmConfig,
        slot: u32,
        stream: Option<&OwnedFd>,
    ) -> Result<bool, Error> {
        let gpu = self.plane.gpu_of(&vm.name).unwrap_or(0);
        let side = self.mps.get(&gpu).map_or(0, crate::mps::MpsGpu::serving);
        // What can fail comes before the spare is taken: a spare taken
        // and neither bound nor ended would be left running.
        if !self.hosts.contains_key(&vm.name) {
            return Err(Error::NoWorker);
        }
        let binding = SpareBinding {
            vm: vm.name.clone(),
            id: self.plane.vgpu_id(&vm.name),
            slot,
            declared: declared_entry(&self.plane, &vm.name)?,
            restore: stream.is_some(),
            stage: false,
        };
        let Some(mut spare) = self.take_spare(gpu, side) else {
            return Ok(false);
        };
        let host = self.hosts.get(&vm.name).ok_or(Error::NoWorker)?;
        let sent = host.feed_slot(slot).and_then(|feed| {
            let ledger = host.ledger()?;
            Ok(worker::spare::send_binding(
                &spare.sock,
                &binding,
                &feed,
                &ledger,
                stream,
            )?)
        });
        if let Err(e) = sent {
            tracing::warn!(vm = vm.name, slot, "binding a spare worker: {e}");
            super::workers::stop_child(&mut spare.child);
            return Ok(false);
        }
        let pid = spare.child.id();
        let restore = stream.is_some();
        if self.claims.line(&vm.name) {
            tracing::info!(
                vm = vm.name,
                slot,
                gpu,
                pid,
                restore,
                "spare worker bound to a slot"
            );
        } else {
            tracing::debug!(
                vm = vm.name,
                slot,
                gpu,
                pid,
                restore,
                "spare worker bound to a slot"
            );
        }
        self.children
            .push(Supervised::new(&vm.name, slot, spare.child, side));
        Ok(true)
    }
}

impl Claims {
    /// Says `message` about `vm`'s slots in the daemon's events, unless
    /// the VM said its share of them this minute (those are counted).
    fn event(&mut self, plane: &ControlPlane, vm: &str, message: String) {
        match self.limit(vm).allow() {
            Some(0) => plane.event("worker", message),
            Some(n) => plane.event("worker", format!("{message} ({n} more not said)")),
            None => {}
        }
    }

    /// Whether a line about `vm`'s slots may be logged now (see
    /// [`Claims::event`]).
    fn line(&mut self, vm: &str) -> bool {
        self.limit(vm).allow().is_some()
    }

    fn limit(&mut self, vm: &str) -> &mut transport::LogLimiter {
        self.logs.entry(vm.to_owned()).or_default()
    }

    /// Gives `vm`'s slot `slot` back to its watch after [`SLOT_RETRY`].
    pub fn release_later(&mut self, vm: &str, slot: u32) {
        let c = SlotClaim {
            vm: vm.to_owned(),
            slot,
        };
        self.later.push((c, Instant::now() + SLOT_RETRY));
    }
}

/// Slot `slot`'s worker of `w`'s VM exited with `status`: not restarted;
/// what it held goes back to the VM's ledger, and its slot to the watch
/// (which frees what it left and looks for a process that came
/// meanwhile): at once, or, for a worker that died as it started, after
/// [`SLOT_RETRY`]. A crash or a fault is said (at most a few lines a
/// minute per VM: a guest can end its workers at will); its process sees
/// the error, the VM's other processes nothing.
pub(super) fn slot_worker_ended(
    plane: &ControlPlane,
    host: Option<&VmHost>,
    w: &mut Supervised,
    slot: u32,
    status: &ExitStatus,
    claims: &mut Claims,
) {
    w.ended = true;
    // One that failed as it started (an exit code of its own, not a
    // fault's nor a signal's): a broken GPU or config would do it again.
    let failed = status.code().is_some_and(|c| c != 0 && c != EXIT_POISONED);
    let quick = failed && w.started.elapsed() < QUICK_DEATH;
    if let Some(h) = host {
        h.slot_worker_gone(slot, !status.success(), !quick);
    }
    if quick {
        claims.release_later(&w.name, slot);
    }
    if status.success() {
        tracing::debug!(
            vm = w.name,
            slot,
            "a process slot's worker ended with its process"
        );
        return;
    }
    plane.worker_faulted(&w.name);
    let why = if status.code() == Some(EXIT_POISONED) {
        "a CUDA error poisoned its GPU context".to_owned()
    } else {
        status.to_string()
    };
    claims.event(
        plane,
        &w.name,
        format!(
            "{}: process slot {slot}'s worker exited ({why}); not restarted: its process sees the error, the slot's next process gets a new worker",
            w.name
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A note ends the pause at once; claims are kept, asks only wake.
    #[test]
    fn a_note_ends_the_pause_and_claims_are_kept() {
        let mut c = Claims::new();
        let tx = c.sender();
        tx.send(Note::Asked).unwrap();
        let t = Instant::now();
        c.wait(Duration::from_secs(60));
        assert!(t.elapsed() < Duration::from_secs(30), "woken by the ask");
        assert!(c.pending.is_empty());
        let claim = SlotClaim {
            vm: "vm1".into(),
            slot: 2,
        };
        tx.send(Note::Asked).unwrap();
        tx.send(claim.into()).unwrap();
        c.wait(Duration::from_secs(60));
        assert!(t.elapsed() < Duration::from_secs(30));
        assert_eq!(c.pending.len(), 1);
        assert_eq!((c.pending[0].vm.as_str(), c.pending[0].slot), ("vm1", 2));
    }
}
