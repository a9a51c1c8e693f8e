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
}

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
        for (_, mut s) in std::mem::take(&mut self.by_gpu) {
            stop_child(&mut s.child);
        }
    }

    /// The spares' processes of GPU `gpu`, taken out (their MPS server
    /// failed: they are ended with its other clients).
    pub fn take_gpu(&mut self, gpu: u32) -> Option<Spare> {
        self.by_gpu.remove(&gpu)
    }
}

impl Spare {
    /// Whether it said it is ready (read without waiting); false once its
    /// socket closed.
    fn poll_ready(&mut self) -> bool {
        if !self.ready {
            let mut word = [0u8; 8];
            if let Ok(8) = (&self.sock).read(&mut word) {
                self.ready = i64::from_le_bytes(word) >> 40 == wire::feed::SPARE_READY;
            }
        }
        self.ready
    }
}

impl Supervisor {
    /// Keeps a spare for each GPU with a VM on it:
    /// those that exited are noted (a new one starts `SPARE_RETRY` later),
    /// those of a GPU with none, or of an MPS side new clients no longer
    /// go to, are ended, and a GPU without one gets one (once its MPS
    /// side's old clients are gone, `dying`).
    pub(super) fn keep_spares(&mut self, want: &Config, dying: &HashSet<(u32, usize)>) {
        let wanted: BTreeSet<u32> = want
            .vms
            .iter()
            .map(|v| self.plane.gpu_of(&v.name).unwrap_or(0))
            .collect();
        let serving = |gpu: u32| self.mps.get(&gpu).map_or(0, crate::mps::MpsGpu::serving);
        let mut gone = Vec::new();
        for (&gpu, s) in &mut self.spares.by_gpu {
            if let Ok(Some(status)) = s.child.try_wait() {
                tracing::warn!(gpu, "spare worker exited unbound ({status})");
                self.spares
                    .retry_at
                    .insert(gpu, Instant::now() + SPARE_RETRY);
                gone.push(gpu);
            } else if !wanted.contains(&gpu) || s.side != serving(gpu) {
                stop_child(&mut s.child);
                gone.push(gpu);
            } else if !s.poll_ready() && s.started.elapsed() > Duration::from_secs(60) {
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
        })
    }

    /// Has GPU `gpu`'s spare, if it is a client of MPS side `side`, load
    /// ahead the modules of `vm`'s checkpoint `stream` (a vGPU another host
    /// is about to hand over); whether it was told.
    pub(super) fn stage_spare(
        &mut self,
        gpu: u32,
        side: usize,
        vm: &str,
        stream: &std::os::fd::OwnedFd,
    ) -> bool {
        let Some(s) = self.spares.by_gpu.get_mut(&gpu) else {
            return false;
        };
        if s.side != side {
            return false;
        }
        match worker::spare::send_stage(&s.sock, vm, stream) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(gpu, vm, "staging a spare worker: {e}");
                false
            }
        }
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
        if !s.poll_ready() {
            tracing::debug!(gpu, "a spare still starting is bound");
        }
        let s = self.spares.by_gpu.remove(&gpu)?;
        // A binding fits the socket's buffer: sent whole either way.
        let _ = s.sock.set_nonblocking(false);
        Some(s)
    }
}
