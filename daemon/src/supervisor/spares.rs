//! Spare workers: one per GPU that has a VM (a client
//! of the MPS side new clients go to, where the GPU runs MPS), started
//! ahead and bound to no VM. It opens the GPU and makes a context, says it
//! is ready, and waits on its socket; a process claiming a slot with no
//! worker gets it bound (`slots.rs`), and a new spare is started for the
//! GPU. A spare holds nothing of any VM until it is bound: it is confined
//! once bound, before it reads a guest's request, as a worker started for
//! a slot is.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Read as _;
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use super::workers::stop_child;
use super::Supervisor;
use crate::config::Config;
use crate::Error;

/// How long after a spare exited unbound (a broken GPU or config) the next
/// is started, so that a spare that cannot start does not spin.
const SPARE_RETRY: Duration = Duration::from_secs(5);

/// One spare worker.
pub(super) struct Spare {
    pub child: Child,
    /// The daemon's end of its socket (non-blocking until it is bound).
    pub sock: UnixStream,
    /// The MPS side it is a client of (0 without MPS).
    pub side: usize,
    /// It said that its GPU is open and its context made.
    ready: bool,
    started: Instant,
    /// A checkpoint sent ahead it is loading the modules of, and whom to
    /// tell once it has.
    staging: Option<Staging>,
    /// When it was last given a checkpoint sent ahead: it holds those
    /// modules until it is bound, or `ahead_keep_s` passes.
    staged_at: Option<Instant>,
}

/// A spare's staging under way: the VM, the answer the peer that sent the
/// checkpoint waits for, and since when.
pub(super) struct Staging {
    vm: String,
    answer: Sender<Result<String, String>>,
    since: Instant,
}

impl Staging {
    /// Answers the peer: `modules` loaded ahead on `gpu`, or none.
    fn done(self, gpu: u32, modules: Option<u64>) {
        let vm = &self.vm;
        let ms = self.since.elapsed().as_millis();
        let line = match modules {
            Some(n) => format!("{vm}: {n} modules loaded ahead on GPU {gpu} in {ms} ms"),
            None => format!("{vm}: its modules were not all loaded ahead on GPU {gpu} ({ms} ms)"),
        };
        let _ = self.answer.send(Ok(line));
    }
}

/// How long a peer waits for a spare's staging before it is answered
/// without it (its handover would still find what is staged by then).
const STAGING_WAIT: Duration = Duration::from_secs(30);

/// The spares, by GPU.
#[derive(Default)]
pub(super) struct Spares {
    by_gpu: BTreeMap<u32, Spare>,
    /// No spare of that GPU starts before this.
    retry_at: BTreeMap<u32, Instant>,
}

impl Spares {
    /// Ends every spare (the daemon's stop).
    pub fn stop(&mut self) {
        for (gpu, mut s) in std::mem::take(&mut self.by_gpu) {
            s.end_staging(gpu);
            stop_child(&mut s.child);
        }
    }

    /// The spares' processes of GPU `gpu`, taken out (their MPS server
    /// failed: they are ended with its other clients).
    pub fn take_gpu(&mut self, gpu: u32) -> Option<Spare> {
        let mut s = self.by_gpu.remove(&gpu)?;
        s.end_staging(gpu);
        Some(s)
    }
}

impl Spare {
    /// Whether it said it is ready (read without waiting); false once its
    /// socket closed. A word that its staging is done answers its peer.
    fn poll_ready(&mut self, gpu: u32) -> bool {
        let mut word = [0u8; 8];
        while let Ok(8) = (&self.sock).read(&mut word) {
            let v = i64::from_le_bytes(word);
            match wire::feed::decode(v).0 {
                wire::feed::SPARE_READY => self.ready = true,
                wire::feed::SPARE_STAGED => {
                    if let Some(st) = self.staging.take() {
                        st.done(gpu, Some(wire::feed::decode_value(v)));
                    }
                }
                _ => {}
            }
        }
        if self
            .staging
            .as_ref()
            .is_some_and(|st| st.since.elapsed() > STAGING_WAIT)
        {
            self.end_staging(gpu);
        }
        self.ready
    }

    /// Answers the peer of a staging under way without waiting more.
    fn end_staging(&mut self, gpu: u32) {
        if let Some(st) = self.staging.take() {
            st.done(gpu, None);
        }
    }
}

impl Supervisor {
    /// Keeps a spare for each GPU with a VM on it:
    /// those that exited are noted (a new one starts `SPARE_RETRY` later),
    /// those of a GPU with none, of an MPS side new clients no longer go
    /// to, or staged `ahead_keep_s` ago and not bound since, are ended, and a GPU without one gets one (once its MPS
    /// side's old clients are gone, `dying`).
    pub(super) fn keep_spares(&mut self, want: &Config, dying: &HashSet<(u32, usize)>) {
        let wanted: BTreeSet<u32> = want
            .vms
            .iter()
            .map(|v| self.plane.gpu_of(&v.name).unwrap_or(0))
            .collect();
        let serving = |gpu: u32| self.mps.get(&gpu).map_or(0, crate::mps::MpsGpu::serving);
        let keep = Duration::from_secs(want.daemon.ahead_keep_s);
        let mut gone = Vec::new();
        for (&gpu, s) in &mut self.spares.by_gpu {
            if let Ok(Some(status)) = s.child.try_wait() {
                s.end_staging(gpu);
                tracing::warn!(gpu, "spare worker exited unbound ({status})");
                self.spares
                    .retry_at
                    .insert(gpu, Instant::now() + SPARE_RETRY);
                gone.push(gpu);
            } else if !wanted.contains(&gpu) || s.side != serving(gpu) {
                s.end_staging(gpu);
                stop_child(&mut s.child);
                gone.push(gpu);
            } else if s.staged_at.is_some_and(|t| t.elapsed() > keep) {
                tracing::info!(
                    gpu,
                    "a spare staged {} s ago and not bound since: ended, with its modules loaded ahead",
                    keep.as_secs()
                );
                s.end_staging(gpu);
                stop_child(&mut s.child);
                gone.push(gpu);
            } else if !s.poll_ready(gpu) && s.started.elapsed() > Duration::from_secs(60) {
                tracing::warn!(gpu, "spare worker not ready after 60 s: ended");
                stop_child(&mut s.child);
                gone.push(gpu);
            }
        }
        for gpu in gone {
            self.spares.by_gpu.remove(&gpu);
        }
        for gpu in wanted {
            let side = serving(gpu);
            let due = self
                .spares
                .retry_at
                .get(&gpu)
                .is_none_or(|t| Instant::now() >= *t);
            if self.spares.by_gpu.contains_key(&gpu) || !due || dying.contains(&(gpu, side)) {
                continue;
            }
            match self.start_spare(gpu, side) {
                Ok(s) => {
                    self.spares.by_gpu.insert(gpu, s);
                }
                Err(e) => {
                    tracing::warn!(gpu, "starting a spare worker: {e}");
                    self.spares
                        .retry_at
                        .insert(gpu, Instant::now() + SPARE_RETRY);
                }
            }
        }
    }

    fn start_spare(&self, gpu: u32, side: usize) -> Result<Spare, Error> {
        let mps = self.mps.get(&gpu).map(|m| (m, side));
        let (child, sock) = self.launcher.spawn_spare(gpu, mps)?;
        sock.set_nonblocking(true).map_err(|source| Error::Io {
            what: "spare socket",
            source,
        })?;
        tracing::debug!(gpu, side, pid = child.id(), "spare worker started");
        Ok(Spare {
            child,
            sock,
            side,
            ready: false,
            started: Instant::now(),
            staging: None,
            staged_at: None,
        })
    }

    /// Has GPU `gpu`'s spare, if it is a client of MPS side `side`, load
    /// ahead the modules of `vm`'s checkpoint `stream` (a vGPU another host
    /// is about to hand over); `answer` is told once it has. Without such a
    /// spare, `answer` comes back.
    pub(super) fn stage_spare(
        &mut self,
        (gpu, side): (u32, usize),
        vm: &str,
        stream: &std::os::fd::OwnedFd,
        answer: Sender<Result<String, String>>,
    ) -> Result<(), Sender<Result<String, String>>> {
        let Some(s) = self.spares.by_gpu.get_mut(&gpu) else {
            return Err(answer);
        };
        if s.side != side {
            return Err(answer);
        }
        if let Err(e) = worker::spare::send_stage(&s.sock, vm, stream) {
            tracing::warn!(gpu, vm, "staging a spare worker: {e}");
            return Err(answer);
        }
        // One staging at a time: the one before is answered as it stands.
        s.end_staging(gpu);
        s.staging = Some(Staging {
            vm: vm.to_owned(),
            answer,
            since: Instant::now(),
        });
        s.staged_at = Some(Instant::now());
        Ok(())
    }

    /// GPU `gpu`'s spare, if it is a client of MPS side `side`, taken to be
    /// bound (its socket blocking again); the next turn starts another.
    /// One still starting is taken too: its binding waits in its socket
    /// until its context is made, which is sooner than a worker started
    /// now would have one.
    pub(super) fn take_spare(&mut self, gpu: u32, side: usize) -> Option<Spare> {
        let s = self.spares.by_gpu.get_mut(&gpu)?;
        if s.side != side {
            return None;
        }
        if !s.poll_ready(gpu) {
            tracing::debug!(gpu, "a spare still starting is bound");
        }
        // Its binding waits in its socket for the staging to end.
        s.end_staging(gpu);
        let s = self.spares.by_gpu.remove(&gpu)?;
        // A binding fits the socket's buffer: sent whole either way.
        let _ = s.sock.set_nonblocking(false);
        Some(s)
    }
}
