//! Checkpoints of a vGPU asked for through the API (`control/saves.rs`):
//! every running worker of the VM told to hold and write its checkpoint,
//! the streams gathered into one save file (`save_file.rs`); a vGPU let
//! go on; and a restore, each process slot's worker started from its
//! stream.
//!
//! A checkpoint holds the vGPU: its workers start no request, so the
//! region and device memory stay as the file has them while QEMU saves
//! the VM after it (the guest may still write requests into its rings:
//! QEMU's copy, taken later, has them, and the restored workers serve
//! them). While held, a process claiming a slot gets no worker. The hold
//! ends with `resume`, or with the VM.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Seek};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::Supervisor;
use crate::config::Config;
use crate::control::{SaveAsk, SaveOp};
use crate::link::CheckpointNote;
use crate::save_file::{self, FileLimits, Lane};

/// How long the workers have to write their checkpoints, or to serve on
/// from them.
const SAVE_LIMIT: Duration = Duration::from_secs(300);
/// Bytes of module images a process slot's stream may hold beyond the
/// vGPU's memory limit.
const IMAGES_MAX: u64 = 4 << 30;

type Answer = Sender<Result<Value, String>>;

/// A checkpoint or restore of one vGPU, under way.
pub(super) struct Saving {
    /// Checkpoint: the file it goes to. Restore: the file it came from.
    file: PathBuf,
    restore: bool,
    /// Each lane's memfd (the stream, or why not).
    memfds: BTreeMap<u32, OwnedFd>,
    /// Lanes that have not answered yet.
    waiting: BTreeSet<u32>,
    /// Checkpoints taken: lane and bytes.
    taken: BTreeMap<u32, u64>,
    failed: Vec<String>,
    since: Instant,
    answer: Answer,
}

impl Supervisor {
    /// Checkpoints: those asked for start, the workers' notes are
    /// gathered, and those complete or out of time are answered.
    pub(super) fn on_checkpoints(&mut self, want: &Config) {
        for ask in self.plane.take_save_asks() {
            let SaveAsk { vm, op, answer } = ask;
            let r = match op {
                SaveOp::Checkpoint(f) => self.start_checkpoint(want, &vm, &f, &answer),
                SaveOp::Restore(f) => self.start_restore(want, &vm, &f, &answer),
                SaveOp::Resume => self.resume(&vm),
            };
            match r {
                Ok(Some(v)) => {
                    let _ = answer.send(Ok(v));
                }
                Ok(None) => {}
                Err(why) => {
                    let _ = answer.send(Err(why));
                }
            }
        }
        // A hold ends with its VM: its QEMU gone, and with it every worker.
        let hosts = &self.hosts;
        self.held.retain(|vm| {
            hosts.get(vm).is_some_and(|h| {
                !h.lanes().is_empty()
                    || !h
                        .peer_pids()
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .is_empty()
            })
        });
        let names: Vec<String> = self.saves.keys().cloned().collect();
        for vm in names {
            self.advance_save(want, &vm);
        }
    }

    /// Orders every running worker of `vm` to hold and write its
    /// checkpoint; answers at once (None: later).
    fn start_checkpoint(
        &mut self,
        want: &Config,
        vm: &str,
        file: &str,
        answer: &Answer,
    ) -> Result<Option<Value>, String> {
        let host = self
            .hosts
            .get(vm)
            .ok_or_else(|| format!("{vm} has no host side"))?;
        if self.saves.contains_key(vm) || self.moves.contains_key(vm) {
            return Err(format!("{vm}: a checkpoint, restore or move is under way"));
        }
        let dir = want.checkpoint_dir();
        make_private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(file);
        if path.exists() {
            return Err(format!("{} exists: name another file", path.display()));
        }
        let mut memfds = BTreeMap::new();
        for lane in host.lanes() {
            let fd = save_file::memfd(&format!("fairvgpu-{vm}-checkpoint-{lane}"))
                .map_err(|e| format!("a memfd for slot {lane}: {e}"))?;
            let dup = fd.try_clone().map_err(|e| e.to_string())?;
            match host.checkpoint_lane(lane, dup) {
                Ok(()) => {
                    memfds.insert(lane, fd);
                }
                // Its worker ended meanwhile, with its process.
                Err(e) => tracing::debug!(vm, lane, "no checkpoint asked: {e}"),
            }
        }
        self.plane.event(
            "checkpoint",
            format!("{vm}: held; its {} workers take checkpoints", memfds.len()),
        );
        self.held.insert(vm.to_owned());
        self.saves.insert(
            vm.to_owned(),
            Saving {
                file: path,
                restore: false,
                waiting: memfds.keys().copied().collect(),
                memfds,
                taken: BTreeMap::new(),
                failed: Vec::new(),
                since: Instant::now(),
                answer: answer.clone(),
            },
        );
        Ok(None)
    }

    /// Lets `vm`'s workers go on.
    fn resume(&mut self, vm: &str) -> Result<Option<Value>, String> {
        if self.saves.get(vm).is_some_and(|s| !s.restore) {
            return Err(format!("{vm}: its checkpoint is being taken"));
        }
        if !self.held.remove(vm) {
            return Err(format!("{vm} is not held"));
        }
        if let Some(h) = self.hosts.get(vm) {
            for lane in h.lanes() {
                let _ = h.resume_lane(lane);
            }
        }
        self.plane
            .event("checkpoint", format!("{vm}: goes on (hold ended)"));
        Ok(Some(json!({ "vm": vm, "held": false })))
    }

    /// Starts a worker for each process slot of the save file `file`, each
    /// serving on from its stream; `vm` must have none running.
    fn start_restore(
        &mut self,
        want: &Config,
        vm: &str,
        file: &str,
        answer: &Answer,
    ) -> Result<Option<Value>, String> {
        let vmc = want.vm(vm).ok_or_else(|| format!("no vm named {vm:?}"))?;
        let host = self
            .hosts
            .get(vm)
            .ok_or_else(|| format!("{vm} has no host side"))?;
        if self.saves.contains_key(vm) || self.moves.contains_key(vm) {
            return Err(format!("{vm}: a checkpoint, restore or move is under way"));
        }
        let running = host.lanes();
        let served = self.children.iter().any(|w| w.name == vm && !w.ended);
        if !running.is_empty() || served {
            return Err(format!(
                "{vm} has running processes here: restore into a VM whose QEMU was started with -incoming and is paused"
            ));
        }
        let path = want.checkpoint_dir().join(file);
        let key = checkpoint_key(want)?;
        let limits = FileLimits {
            slots: vmc.slots(),
            lane_bytes: (vmc.memory_limit_mib << 20).saturating_add(IMAGES_MAX),
        };
        let lanes =
            save_file::read(&path, vm, key.as_deref(), limits).map_err(|e| e.to_string())?;
        let mut memfds = BTreeMap::new();
        let mut failed = Vec::new();
        for Lane { slot, stream, .. } in lanes {
            if let Some(h) = self.hosts.get(vm) {
                h.slot_taken(slot);
            }
            match self.start_worker_from(vmc, slot, Some(&stream)) {
                Ok(()) => {
                    memfds.insert(slot, stream);
                }
                Err(e) => failed.push(format!("slot {slot}: no worker started: {e}")),
            }
        }
        self.plane.event(
            "checkpoint",
            format!(
                "{vm}: {} workers serve on from {}",
                memfds.len(),
                path.display()
            ),
        );
        self.saves.insert(
            vm.to_owned(),
            Saving {
                file: path,
                restore: true,
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

    /// Takes `vm`'s workers' notes; answers once every lane has.
    fn advance_save(&mut self, want: &Config, vm: &str) {
        let Some(host) = self.hosts.get(vm) else {
            if let Some(s) = self.saves.remove(vm) {
                let _ = s.answer.send(Err(format!("{vm} is gone")));
            }
            return;
        };
        let notes = host.take_checkpoint_notes();
        let live = host.lanes();
        let ended: Vec<u32> = {
            let s = &self.saves[vm];
            s.waiting
                .iter()
                .copied()
                .filter(|l| {
                    // A restoring worker that ended; a held one that ended
                    // with its process (nothing of it to keep).
                    let running = self
                        .children
                        .iter()
                        .any(|w| w.name == vm && w.slot == *l && w.child.is_some());
                    !running || (!s.restore && !live.contains(l))
                })
                .collect()
        };
        let s = self.saves.get_mut(vm).expect("listed above");
        for (lane, note) in notes {
            if !s.waiting.remove(&lane) {
                continue;
            }
            match note {
                CheckpointNote::Taken(n) => {
                    s.taken.insert(lane, n);
                }
                CheckpointNote::Restored => {}
                CheckpointNote::Failed(n) => {
                    let why = s
                        .memfds
                        .get(&lane)
                        .map_or_else(String::new, |f| reason(f, n));
                    s.failed.push(format!("slot {lane}: {why}"));
                }
            }
        }
        for lane in ended {
            if s.waiting.remove(&lane) && s.restore {
                s.failed.push(format!(
                    "slot {lane}: its worker ended (see the daemon's log)"
                ));
            } else {
                s.memfds.remove(&lane);
            }
        }
        let late = s.since.elapsed() > SAVE_LIMIT;
        if !s.waiting.is_empty() && !late {
            return;
        }
        if late {
            s.failed.push(format!(
                "slots {:?} did not answer within {SAVE_LIMIT:?}",
                s.waiting
            ));
        }
        let s = self.saves.remove(vm).expect("listed above");
        let r = if s.restore {
            self.finish_restore(vm, s.file, &s.failed, s.memfds.len())
        } else {
            self.finish_checkpoint(want, vm, s.file, &s.failed, s.taken, s.memfds)
        };
        let _ = s.answer.send(r);
    }

    fn finish_checkpoint(
        &mut self,
        want: &Config,
        vm: &str,
        path: PathBuf,
        failed: &[String],
        taken: BTreeMap<u32, u64>,
        mut memfds: BTreeMap<u32, OwnedFd>,
    ) -> Result<Value, String> {
        let t = Instant::now();
        let written = if failed.is_empty() {
            let lanes: Vec<Lane> = taken
                .iter()
                .filter_map(|(&slot, &len)| {
                    memfds
                        .remove(&slot)
                        .map(|stream| Lane { slot, stream, len })
                })
                .collect();
            checkpoint_key(want).and_then(|key| {
                save_file::write(&path, vm, &lanes, key.as_deref()).map_err(|e| e.to_string())
            })
        } else {
            Err(failed.join("; "))
        };
        match written {
            Ok(bytes) => {
                self.plane.event(
                    "checkpoint",
                    format!(
                        "{vm}: {} processes' checkpoint in {} ({bytes} bytes); held until resumed or gone",
                        taken.len(),
                        path.display()
                    ),
                );
                Ok(json!({
                    "vm": vm,
                    "file": path,
                    "bytes": bytes,
                    "processes": taken.len(),
                    "write_ms": t.elapsed().as_secs_f64() * 1e3,
                    "held": true,
                }))
            }
            Err(why) => {
                // Not taken: the guests go on.
                let _ = self.resume(vm);
                Err(format!("{vm}: no checkpoint, it goes on: {why}"))
            }
        }
    }

    fn finish_restore(
        &mut self,
        vm: &str,
        path: PathBuf,
        failed: &[String],
        workers: usize,
    ) -> Result<Value, String> {
        if failed.is_empty() {
            self.plane.event(
                "checkpoint",
                format!(
                    "{vm}: restored from {} ({workers} processes)",
                    path.display()
                ),
            );
            Ok(json!({ "vm": vm, "file": path, "processes": workers }))
        } else {
            Err(format!(
                "{vm}: not restored from {}: {}",
                path.display(),
                failed.join("; ")
            ))
        }
    }
}

/// The reason a worker wrote into `memfd` (`n` bytes, at most
/// `CHECKPOINT_WHY_MAX`), with anything but printable text replaced.
fn reason(memfd: &OwnedFd, n: u64) -> String {
    let mut text = Vec::new();
    let read = memfd.try_clone().map(File::from).and_then(|mut f| {
        f.rewind()?;
        f.take(n.min(u64::from(wire::feed::CHECKPOINT_WHY_MAX)))
            .read_to_end(&mut text)
    });
    if read.is_err() {
        return "no checkpoint (its reason could not be read)".into();
    }
    String::from_utf8_lossy(&text)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The key checkpoint files are tagged under, if the config names one.
fn checkpoint_key(cfg: &Config) -> Result<Option<Vec<u8>>, String> {
    let Some(p) = &cfg.daemon.checkpoint_key_file else {
        return Ok(None);
    };
    let k = std::fs::read(p).map_err(|e| format!("checkpoint_key_file {}: {e}", p.display()))?;
    let k = k.trim_ascii().to_vec();
    if k.len() < 16 {
        return Err(format!(
            "checkpoint_key_file {}: a key of at least 16 bytes",
            p.display()
        ));
    }
    Ok(Some(k))
}

/// Makes `dir` (mode 0700) if it is not there.
fn make_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}
