//! A vGPU served on from a checkpoint: a worker per process slot started
//! from its stream (`--restore-fd`), into a VM whose QEMU loaded the VM's
//! saved or migrated state and is paused. The streams come from a save
//! file, or from another host's daemon (`handover.rs`), which also carried
//! the region: its copy is written over QEMU's before any worker starts,
//! as QEMU's misses what the source's workers wrote.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::mpsc::Sender;
use std::time::Instant;

use serde_json::{json, Value};

use super::checkpoint::{checkpoint_key, Answer, Kind, Saving};
use super::Supervisor;
use crate::config::Config;
use crate::save_file::{self, Lane, Saved};

/// Where a restore's checkpoint comes from.
pub(super) enum Source {
    /// This file of the checkpoint folder.
    File(String),
    /// What another host's daemon handed over.
    Received,
}

impl Supervisor {
    /// Starts a worker for each process slot of the checkpoint from
    /// `source`, each serving on from its stream; `vm` must have none
    /// running. Answers later.
    pub(super) fn start_restore(
        &mut self,
        want: &Config,
        vm: &str,
        source: Source,
        answer: &Answer,
    ) -> Result<Option<Value>, String> {
        let vmc = want.vm(vm).ok_or_else(|| format!("no vm named {vm:?}"))?;
        self.check_empty(vm)?;
        let (from, saved) = match source {
            Source::File(f) => {
                let path = want.checkpoint_dir().join(f);
                let key = checkpoint_key(want)?;
                let limits = self
                    .plane
                    .save_limits(vm, true)
                    .ok_or_else(|| format!("no vm named {vm:?}"))?;
                let saved = save_file::read(&path, vm, key.as_deref(), limits)
                    .map_err(|e| e.to_string())?;
                (path.display().to_string(), saved)
            }
            Source::Received => {
                let saved = self
                    .arrived
                    .remove(vm)
                    .ok_or_else(|| format!("{vm}: no other host handed it over"))?;
                ("what another host handed over".to_owned(), saved)
            }
        };
        self.fits_here(want, vm, &saved)?;
        if let Some((fd, len)) = &saved.region {
            let t = Instant::now();
            self.write_region(vm, fd, *len)?;
            tracing::debug!(vm, ms = t.elapsed().as_millis(), "its region written");
        }
        let mut memfds = BTreeMap::new();
        let mut failed = Vec::new();
        for Lane { slot, stream, .. } in saved.lanes {
            if let Some(h) = self.hosts.get(vm) {
                h.slot_taken(slot);
            }
            // The GPU's spare has its context made: the first slot's pause
            // is shorter by a worker's start.
            let started = match self.bind_spare(vmc, slot, Some(&stream)) {
                Ok(true) => Ok(()),
                _ => self.start_worker_from(vmc, slot, Some(&stream)),
            };
            match started {
                Ok(()) => {
                    memfds.insert(slot, stream);
                }
                Err(e) => failed.push(format!("slot {slot}: no worker started: {e}")),
            }
        }
        self.plane.event(
            "checkpoint",
            format!("{vm}: {} workers serve on from {from}", memfds.len()),
        );
        self.saves.insert(
            vm.to_owned(),
            Saving {
                kind: Kind::Restore(from),
                waiting: memfds.keys().copied().collect(),
                memfds,
                taken: BTreeMap::new(),
                failed,
                since: Instant::now(),
                answer: answer.clone(),
            },
        );
        Ok(None)
    }

    /// `vm`'s host side, unless it has none or a checkpoint, restore or
    /// move is under way.
    pub(super) fn quiet_host(&self, vm: &str) -> Result<&crate::link::VmHost, String> {
        let host = self
            .hosts
            .get(vm)
            .ok_or_else(|| format!("{vm} has no host side"))?;
        if self.saves.contains_key(vm) || self.moves.contains_key(vm) {
            return Err(format!("{vm}: a checkpoint, restore or move is under way"));
        }
        Ok(host)
    }

    /// Refuses unless `vm` has a host side, nothing under way, and no
    /// worker: a restore starts its workers.
    fn check_empty(&self, vm: &str) -> Result<(), String> {
        let host = self.quiet_host(vm)?;
        let served = self.children.iter().any(|w| w.name == vm && !w.ended);
        if !host.lanes().is_empty() || served {
            return Err(format!(
                "{vm} has running processes here: restore into a VM whose QEMU was started with -incoming and is paused"
            ));
        }
        Ok(())
    }

    /// Refuses, before anything of the VM changes, a checkpoint taken on
    /// another GPU model or driver than `vm`'s GPU here, or holding more
    /// device memory than `vm` may (from each stream's description; its
    /// tag was checked, and each worker parses it all within its limits).
    fn fits_here(&self, want: &Config, vm: &str, saved: &Saved) -> Result<(), String> {
        let vmc = want.vm(vm).ok_or_else(|| format!("no vm named {vm:?}"))?;
        let gpu = self.plane.gpu_of(vm).unwrap_or(0);
        let here = facts_here(want, gpu)?;
        let limit = vmc.memory_limit_mib << 20;
        let limits = worker::checkpoint::Limits {
            memory: limit,
            ..Default::default()
        };
        let mut bytes = 0u64;
        for l in &saved.lanes {
            let mut f = File::from(l.stream.try_clone().map_err(|e| e.to_string())?);
            std::io::Seek::rewind(&mut f).map_err(|e| e.to_string())?;
            let image = worker::checkpoint::describe(&mut std::io::BufReader::new(f), &limits)
                .map_err(|e| format!("slot {}: {e}", l.slot))?;
            if image.device != here {
                return Err(format!(
                    "{vm}: taken on {}, its GPU here is {here}",
                    image.device
                ));
            }
            bytes = bytes.saturating_add(image.memory_bytes());
        }
        if bytes > limit {
            return Err(format!(
                "{vm}: its processes hold {} MiB of device memory, its limit here is {} MiB",
                bytes >> 20,
                vmc.memory_limit_mib
            ));
        }
        Ok(())
    }

    /// Writes the region another host carried over `vm`'s (QEMU's copy).
    fn write_region(&self, vm: &str, from: &std::os::fd::OwnedFd, len: u64) -> Result<(), String> {
        let (fd, here) = self.region_of(vm)?;
        if here != len {
            return Err(format!(
                "{vm}: a region of {len} bytes, its region here is {here}"
            ));
        }
        // At offsets: the region's fd shares its file offset with the
        // workers', and it is sealed against growing.
        save_file::region::write_over(from, &File::from(fd), len)
            .map(|_| ())
            .map_err(|e| format!("{vm}: writing its region: {e}"))
    }

    /// A vGPU another host's daemon handed over: kept until restored, if
    /// `vm` is here with nothing running; the line is the sender's.
    pub(super) fn on_arrival(&mut self, saved: Saved) -> Result<String, String> {
        let vm = saved.vm.clone();
        self.check_empty(&vm)?;
        self.fits_here(&self.plane.config(), &vm, &saved)?;
        let n = saved.lanes.len();
        self.plane.event(
            "checkpoint",
            format!(
                "{vm}: handed over from another host ({n} processes); it serves on once restored"
            ),
        );
        self.arrived.insert(vm.clone(), saved);
        Ok(format!(
            "{vm}: taken ({n} processes); it serves on once restored there"
        ))
    }

    /// A checkpoint another host's daemon sent ahead of handing `vm` over
    /// (its guest still running there): the modules of its first process
    /// loaded by the spare of `vm`'s GPU here, which the restore's first
    /// slot binds. The sender's line goes on `answer` once the spare has
    /// loaded them (`spares.rs`), or at once.
    pub(super) fn on_ahead(&mut self, saved: &Saved, answer: Sender<Result<String, String>>) {
        let vm = saved.vm.as_str();
        let fits = self
            .check_empty(vm)
            .and_then(|()| self.fits_here(&self.plane.config(), vm, saved));
        if let Err(why) = fits {
            let _ = answer.send(Err(why));
            return;
        }
        let Some(first) = saved.lanes.first() else {
            let _ = answer.send(Ok(format!("{vm}: no process to load ahead")));
            return;
        };
        let gpu = self.plane.gpu_of(vm).unwrap_or(0);
        let side = self.mps.get(&gpu).map_or(0, crate::mps::MpsGpu::serving);
        match self.stage_spare((gpu, side), vm, &first.stream, answer) {
            Ok(()) => self.plane.event(
                "checkpoint",
                format!("{vm}: sent ahead from another host; its modules load on GPU {gpu}"),
            ),
            Err(answer) => {
                let _ = answer.send(Ok(format!(
                    "{vm}: no spare worker on GPU {gpu}; its modules load at the restore"
                )));
            }
        }
    }

    pub(super) fn finish_restore(
        &mut self,
        vm: &str,
        from: &str,
        (failed, ahead, streams): &super::checkpoint::Gathered,
    ) -> Result<Value, String> {
        let workers = streams.len();
        if failed.is_empty() {
            let ahead: u64 = ahead.values().sum();
            self.plane.event(
                "checkpoint",
                format!(
                    "{vm}: restored from {from} ({workers} processes, {ahead} modules loaded ahead)"
                ),
            );
            Ok(json!({
                "vm": vm,
                "from": from,
                "processes": workers,
                "modules_loaded_ahead": ahead,
            }))
        } else {
            Err(format!(
                "{vm}: not restored from {from}: {}",
                failed.join("; ")
            ))
        }
    }
}

/// The device a checkpoint restored on GPU `gpu` here must have been taken
/// on.
fn facts_here(cfg: &Config, gpu: u32) -> Result<worker::checkpoint::DeviceFacts, String> {
    use worker::checkpoint::DeviceFacts;
    use worker::executor::Executor;
    match cfg.daemon.executor {
        crate::config::ExecutorKind::Sim => {
            let mut e =
                worker::executor::sim::SimExecutor::new(crate::setup::executor_spec(cfg).sim);
            e.set_device(gpu)
                .map_err(|s| format!("no sim GPU {gpu}: {s:?}"))?;
            Ok(DeviceFacts::of(&e.info()))
        }
        crate::config::ExecutorKind::Cuda => {
            let (name, driver, cc) =
                worker::executor::cuda::device_facts(gpu).map_err(|e| e.to_string())?;
            Ok(DeviceFacts { name, driver, cc })
        }
    }
}
