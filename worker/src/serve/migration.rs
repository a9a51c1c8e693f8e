//! Migration: every context moved to another GPU between two requests,
//! what can be done ahead prepared on a helper thread meanwhile.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{wait, Worker};
use crate::gate::Gate;
use crate::Error;

/// A migration being prepared on a helper thread.
pub(super) struct Moving {
    gpu: u32,
    grant: Option<std::os::fd::OwnedFd>,
    rx: std::sync::mpsc::Receiver<Vec<(u64, crate::executor::Prepared)>>,
    asked: Instant,
}

impl Worker {
    /// Between two turns of the serving loop: starts the move the daemon
    /// asked for, and makes it once its preparation is done.
    pub(super) fn migrations(&mut self) -> Result<(), Error> {
        if let Some((gpu, grant)) = self.sh.port.link.take_migration() {
            self.start_migration(gpu, grant)?;
        }
        if let Some(p) = self.moving.as_ref() {
            if let Ok(prepared) = p.rx.try_recv() {
                let p = self.moving.take().expect("checked above");
                tracing::debug!(
                    prepare_ms = p.asked.elapsed().as_secs_f64() * 1e3,
                    "migration prepared"
                );
                self.migrate(p.gpu, p.grant, prepared)?;
            }
        }
        Ok(())
    }

    /// Starts a move to GPU `gpu`: what can be done ahead (the target's
    /// contexts and modules) is done on a helper thread while the guests go
    /// on here; [`Worker::migrate`] follows when it is ready.
    fn start_migration(
        &mut self,
        gpu: u32,
        grant: Option<std::os::fd::OwnedFd>,
    ) -> Result<(), Error> {
        if self.moving.is_some() {
            tracing::warn!(to = gpu, "a migration is under way already; ignored");
            return Ok(());
        }
        // A vGPU that cannot move is refused at once (`migrate` says why).
        let kept = self
            .sessions
            .iter_mut()
            .any(|(_, e)| e.s.migration_keeper_to(gpu).is_some());
        let jobs: Vec<(u64, crate::executor::PrepareJob)> = if kept {
            Vec::new()
        } else {
            self.sessions
                .iter_mut()
                .filter_map(|(_, e)| Some((e.s.id, e.s.ctx.prepare_migration(gpu)?)))
                .collect()
        };
        if jobs.is_empty() {
            return self.migrate(gpu, grant, Vec::new());
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("migration-prepare".into())
            .spawn(move || {
                let done: Vec<_> = jobs
                    .into_iter()
                    .filter_map(|(id, job)| job().ok().map(|p| (id, p)))
                    .collect();
                let _ = tx.send(done);
            })
            .map_err(|source| Error::Io {
                what: "spawning migration helper",
                source,
            })?;
        self.moving = Some(Moving {
            gpu,
            grant,
            rx,
            asked: Instant::now(),
        });
        Ok(())
    }

    /// Moves every context to GPU `gpu` between two requests (a kernel
    /// boundary: what was submitted finishes on the source, what waits in
    /// the rings runs on the target), registers at the target's grant
    /// service over `grant`, and tells the daemon how it went. If a context
    /// cannot move, those already moved go back and the vGPU stays.
    fn migrate(
        &mut self,
        gpu: u32,
        grant: Option<std::os::fd::OwnedFd>,
        prepared: Vec<(u64, crate::executor::Prepared)>,
    ) -> Result<(), Error> {
        let mut prepared: std::collections::HashMap<u64, crate::executor::Prepared> =
            prepared.into_iter().collect();
        let t0 = Instant::now();
        let from = self.sh.gpu.exec.device();
        // An object no GPU but this one can hold keeps the vGPU here,
        // refused before anything moves.
        let kept_by = self
            .sessions
            .iter_mut()
            .find_map(|(_, e)| e.s.migration_keeper_to(gpu));
        if kept_by.is_none() {
            // Events are made anew wherever the contexts end up: the
            // handles other processes opened name the old ones.
            self.sh.tables.ipc_events.revoke_all();
        }
        if self.sh.slice.gate.as_ref().is_some_and(|g| g.holding()) {
            self.release_grant(true)?;
        }
        // Waits on the source are over now that its work is drained.
        for c in &mut self.chans {
            if let Some(e) = c.session.and_then(|id| self.sessions.get_mut(id)) {
                wait::poll(&mut self.sh, c, &mut e.s)?;
            }
        }
        let mut moved: Vec<u64> = Vec::new();
        let mut bytes = 0u64;
        let mut failed = None;
        if let Some(k) = kept_by {
            failed = Some(protocol::Status::NotSupported);
            tracing::warn!(
                to = gpu,
                "migration to GPU {gpu} refused: a guest process holds {k}, which cannot \
                 move; the vGPU stays on GPU {from}"
            );
        }
        for (_, e) in self.sessions.iter_mut() {
            if failed.is_some() {
                break;
            }
            let s = &mut e.s;
            // What was prepared for this very session (not for an earlier
            // one with the same channels).
            let ahead = prepared.remove(&s.id);
            match s.ctx.migrate(gpu, ahead) {
                Ok(m) => {
                    bytes += m.bytes;
                    moved.push(s.id);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // The executor registers its host memory again in the target's
        // context: the response arenas and the pinned blocks the guests
        // hold now (each registered as it was handed out, `pinned.rs`),
        // not the whole pool, whose unregistering alone was most of the
        // pause; so the pause grows with the pinned memory held.
        let ok = failed.is_none() && self.sh.gpu.exec.set_device(gpu).is_ok();
        if !ok {
            for (_, e) in self.sessions.iter_mut() {
                let s = &mut e.s;
                if moved.contains(&s.id) {
                    if let Err(err) = s.ctx.migrate(from, None) {
                        s.defer(err);
                    }
                }
            }
            if kept_by.is_none() {
                tracing::warn!(
                    to = gpu,
                    "migration to GPU {gpu} failed ({}); the vGPU stays on GPU {from}",
                    failed.map_or_else(|| "the target refused".to_owned(), |e| format!("{e:?}"))
                );
            }
        }
        if ok {
            if let (Some(fd), Some((id, weight))) = (grant, self.sh.slice.grant_id) {
                // The source's service forgets the vGPU when this closes;
                // the new gate lifts as the old one did.
                let realtime = self.sh.slice.gate.as_ref().is_some_and(Gate::realtime);
                self.sh.slice.gate = Some(
                    // One of the vGPU's workers (a worker per process)
                    // registers as a member there too.
                    Gate::over_as(
                        std::os::unix::net::UnixStream::from(fd),
                        id,
                        weight,
                        self.sh.mem.ledger.is_some(),
                    )?
                    .with_realtime(realtime),
                );
            }
            // Spare contexts are on the GPU the vGPU left.
            self.sh.gpu.contexts.clear();
            self.sh
                .port
                .stats
                .migrations
                .fetch_add(1, Ordering::Relaxed);
            self.sh
                .port
                .stats
                .device
                .store(u64::from(gpu), Ordering::Relaxed);
        }
        let report = wire::feed::MigrationReport {
            gpu: if ok { gpu } else { from },
            moved: ok,
            pause_us: crate::micros(t0.elapsed()),
            kib: bytes.div_ceil(1024),
            kept_by: if ok { None } else { kept_by },
            failed: if ok || kept_by.is_some() {
                None
            } else {
                Some(failed.unwrap_or(protocol::Status::NotSupported))
            },
        };
        tracing::info!(
            from,
            to = gpu,
            ok,
            pause_us = report.pause_us,
            kib = report.kib,
            "migration"
        );
        self.sh.port.link.report_migration(&report);
        Ok(())
    }
}
