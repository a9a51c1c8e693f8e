//! Checkpoints of a vGPU asked for through the API (`control/saves.rs`):
//! every running worker of the VM told to hold and write its checkpoint,
//! the streams gathered into one save file (`save_file.rs`) or handed with
//! the region to another host's daemon (`handover.rs`); a vGPU let go on.
//! Restores, from a file or from a peer, are `restore.rs`'s.
//!
//! A checkpoint holds the vGPU: its workers start no request, so the
//! region and device memory stay as the checkpoint has them while QEMU
//! saves or moves the VM after it (the guest may still write requests into
//! its rings: QEMU's copy, taken later, has them, and the restored workers
//! serve them). While held, a process claiming a slot gets no worker. The
//! hold ends with `resume`, or with the VM.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Seek};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::restore::Source;
use super::Supervisor;
use crate::config::Config;
use crate::control::{CheckpointWith, SaveAsk, SaveOp};
use crate::handover::Purpose;
use crate::link::CheckpointNote;
use crate::save_file::{self, Lane, Saved};

/// How long the workers have to write their checkpoints, or to serve on
/// from them.
const SAVE_LIMIT: Duration = Duration::from_secs(300);

/// Where an API ask's answer goes.
pub(super) type Answer = Sender<Result<Value, String>>;

/// Where a checkpoint goes, or where a restore's came from.
pub(super) enum Kind {
    /// Into this file, taken as asked.
    Checkpoint(PathBuf, CheckpointWith),
    /// To the daemon at this address, with the region.
    Handover(String),
    /// To the daemon at this address ahead of the handover, the vGPU let
    /// go on at once (no region).
    Ahead(String),
    /// From this file, or from a peer (named for the operator).
    Restore(String),
}

/// A checkpoint or restore of one vGPU, under way.
pub(super) struct Saving {
    pub(super) kind: Kind,
    /// Each lane's memfd (the stream, or why not).
    pub(super) memfds: BTreeMap<u32, OwnedFd>,
    /// Lanes that have not answered yet.
    pub(super) waiting: BTreeSet<u32>,
    /// Checkpoints taken: lane and bytes (a restore: lane and the modules
    /// a spare loaded ahead).
    pub(super) taken: BTreeMap<u32, u64>,
    pub(super) failed: Vec<String>,
    pub(super) since: Instant,
    pub(super) answer: Answer,
}

impl Saving {
    fn restore(&self) -> bool {
        matches!(self.kind, Kind::Restore(_))
    }
}

/// What the workers of a hold left: reasons, the lanes taken, the memfds.
pub(super) type Gathered = (Vec<String>, BTreeMap<u32, u64>, BTreeMap<u32, OwnedFd>);

impl Supervisor {
    /// Checkpoints: those asked for start, the workers' notes are
    /// gathered, and those complete or out of time are answered.
    pub(super) fn on_checkpoints(&mut self, want: &Config) {
        for ask in self.plane.take_save_asks() {
            let SaveAsk { vm, op, answer } = ask;
            let r = match op {
                SaveOp::Checkpoint(f, with) => {
                    let path = want.checkpoint_dir().join(f);
                    self.start_checkpoint(want, &vm, Kind::Checkpoint(path, with), &answer)
                }
                SaveOp::Handover(to, ahead) => match checkpoint_key(want) {
                    Ok(Some(_)) => {
                        let kind = if ahead {
                            Kind::Ahead(to)
                        } else {
                            Kind::Handover(to)
                        };
                        self.start_checkpoint(want, &vm, kind, &answer)
                    }
                    Ok(None) => Err(format!(
                        "{vm}: a vGPU goes to another host only under a key both share ([daemon] checkpoint_key_file)"
                    )),
                    Err(e) => Err(e),
                },
                SaveOp::Restore(f) => self.start_restore(want, &vm, Source::File(f), &answer),
                SaveOp::RestoreReceived => self.start_restore(want, &vm, Source::Received, &answer),
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
        let hosts = &self.hosts;
        self.plane.drop_stale_warm(&|vm| hosts.contains_key(vm));
        for (saved, purpose, answer) in self.plane.take_arrivals() {
            match purpose {
                Purpose::Handover => {
                    let _ = answer.send(self.on_arrival(saved));
                }
                Purpose::Ahead => self.on_ahead(&saved, answer),
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
    /// checkpoint, for `kind`; answers later.
    fn start_checkpoint(
        &mut self,
        want: &Config,
        vm: &str,
        kind: Kind,
        answer: &Answer,
    ) -> Result<Option<Value>, String> {
        let host = self.quiet_host(vm)?;
        if let Kind::Checkpoint(path, with) = &kind {
            let dir = want.checkpoint_dir();
            make_private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if path.exists() && !with.replace {
                return Err(format!("{} exists: name another file", path.display()));
            }
        }
        // A handover (or another checkpoint sent ahead) is written over
        // the memfds the last one sent ahead filled.
        let mut warm = match kind {
            Kind::Handover(_) | Kind::Ahead(_) => self.plane.take_warm(vm),
            _ => BTreeMap::new(),
        };
        let mut memfds = BTreeMap::new();
        let mut reused = 0;
        for lane in host.lanes() {
            let fd = match warm.remove(&lane) {
                Some(fd) => {
                    reused += 1;
                    fd
                }
                None => save_file::memfd(&format!("fairvgpu-{vm}-checkpoint-{lane}"))
                    .map_err(|e| format!("a memfd for slot {lane}: {e}"))?,
            };
            let dup = fd.try_clone().map_err(|e| e.to_string())?;
            match host.checkpoint_lane(lane, dup, matches!(kind, Kind::Ahead(_))) {
                Ok(()) => {
                    memfds.insert(lane, fd);
                }
                // Its worker ended meanwhile, with its process.
                Err(e) => tracing::debug!(vm, lane, "no checkpoint asked: {e}"),
            }
        }
        let into = if reused > 0 {
            format!(" ({reused} into the memory of the one sent ahead)")
        } else {
            String::new()
        };
        self.plane.event(
            "checkpoint",
            format!(
                "{vm}: held; its {} workers take checkpoints{into}",
                memfds.len()
            ),
        );
        self.held.insert(vm.to_owned());
        self.saves.insert(
            vm.to_owned(),
            Saving {
                kind,
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
    pub(super) fn resume(&mut self, vm: &str) -> Result<Option<Value>, String> {
        if self.saves.get(vm).is_some_and(|s| !s.restore()) {
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
        let restore = self.saves[vm].restore();
        let ended: Vec<u32> = self.saves[vm]
            .waiting
            .iter()
            .copied()
            .filter(|l| {
                // A restoring worker that ended; a held one that ended
                // with its process (nothing of it to keep).
                let running = self
                    .children
                    .iter()
                    .any(|w| w.name == vm && w.slot == *l && w.child.is_some());
                !running || (!restore && !live.contains(l))
            })
            .collect();
        let s = self.saves.get_mut(vm).expect("listed above");
        for (lane, note) in notes {
            if !s.waiting.remove(&lane) {
                continue;
            }
            match note {
                CheckpointNote::Taken(n) => {
                    s.taken.insert(lane, n);
                }
                CheckpointNote::Restored(ahead) => {
                    s.taken.insert(lane, ahead);
                }
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
            if s.waiting.remove(&lane) && restore {
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
        tracing::debug!(
            vm,
            ms = s.since.elapsed().as_millis(),
            "every worker answered its checkpoint or restore"
        );
        let gathered = (s.failed, s.taken, s.memfds);
        let r = match s.kind {
            Kind::Restore(from) => Some(self.finish_restore(vm, &from, &gathered)),
            Kind::Checkpoint(path, with) => {
                Some(self.finish_checkpoint(want, vm, (path, with), gathered))
            }
            Kind::Handover(to) => {
                self.finish_handover(want, vm, (&to, Purpose::Handover), gathered, &s.answer)
            }
            Kind::Ahead(to) => {
                // The guest's work goes on while what was taken is sent.
                let _ = self.resume(vm);
                self.finish_handover(want, vm, (&to, Purpose::Ahead), gathered, &s.answer)
            }
        };
        if let Some(r) = r {
            let _ = s.answer.send(r);
        }
    }

    fn finish_checkpoint(
        &mut self,
        want: &Config,
        vm: &str,
        (path, with): (PathBuf, CheckpointWith),
        (failed, taken, mut memfds): Gathered,
    ) -> Result<Value, String> {
        let t = Instant::now();
        // The region, still now that the workers hold, where the VM is
        // paused for good (QEMU's copy may miss what they wrote).
        let region = if with.region {
            self.region_of(vm).map(Some)
        } else {
            Ok(None)
        };
        let written = if failed.is_empty() {
            region.and_then(|region| {
                let saved = Saved {
                    vm: vm.to_owned(),
                    region,
                    lanes: taken_lanes(&taken, &mut memfds),
                };
                let key = checkpoint_key(want)?;
                save_file::write(&path, &saved, key.as_deref(), with.replace)
                    .map_err(|e| e.to_string())
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

    /// `vm`'s region (its memfd and length), for a checkpoint that carries
    /// it or a restore that writes it.
    pub(super) fn region_of(&self, vm: &str) -> Result<(OwnedFd, u64), String> {
        let host = self
            .hosts
            .get(vm)
            .ok_or_else(|| format!("{vm} has no host side"))?;
        host.region_memfd().map_err(|e| e.to_string())
    }

    /// Hands what the workers took, with the region (none ahead), to the
    /// daemon at `to` for `purpose`, on a thread of its own, which answers;
    /// None: answered later.
    fn finish_handover(
        &mut self,
        want: &Config,
        vm: &str,
        (to, purpose): (&str, Purpose),
        (failed, taken, mut memfds): Gathered,
        answer: &Answer,
    ) -> Option<Result<Value, String>> {
        let ahead = purpose == Purpose::Ahead;
        let ready = if failed.is_empty() {
            match (checkpoint_key(want), self.region_of(vm)) {
                (Ok(Some(key)), Ok(region)) => Ok((key, region)),
                (Err(e), _) | (_, Err(e)) => Err(e),
                (Ok(None), _) => Err(format!("{vm}: no key")),
            }
        } else {
            Err(failed.join("; "))
        };
        let (key, region) = match ready {
            Ok(r) => r,
            Err(why) if ahead => return Some(Err(format!("{vm}: nothing sent ahead: {why}"))),
            Err(why) => {
                let _ = self.resume(vm);
                return Some(Err(format!(
                    "{vm}: not handed over, it goes on here: {why}"
                )));
            }
        };
        let saved = Saved {
            vm: vm.to_owned(),
            region: (!ahead).then_some(region),
            lanes: taken_lanes(&taken, &mut memfds),
        };
        let (plane, answer) = (self.plane.clone(), answer.clone());
        let (to, name) = (to.to_owned(), vm.to_owned());
        let vm = name.clone();
        let spawned = std::thread::Builder::new()
            .name("handover-out".into())
            .spawn(move || {
                let t = Instant::now();
                let r = match crate::handover::send(&to, &key, &saved, purpose) {
                    Ok(line) if ahead => {
                        plane.event("checkpoint", format!("{vm}: sent ahead to {to} ({line})"));
                        let bytes: u64 = saved.lanes.iter().map(|l| l.len).sum();
                        let streams = saved.lanes.into_iter().map(|l| (l.slot, l.stream));
                        plane.keep_warm(&vm, streams.collect());
                        Ok(json!({
                            "vm": vm,
                            "to": to,
                            "ahead": true,
                            "bytes": bytes,
                            "send_ms": t.elapsed().as_secs_f64() * 1e3,
                            "peer": line,
                            "held": false,
                        }))
                    }
                    Err(why) if ahead => Err(format!("{vm}: nothing sent ahead: {why}")),
                    Ok(line) => {
                        plane.event(
                            "checkpoint",
                            format!("{vm}: handed over to {to} ({line}); held until gone"),
                        );
                        let bytes: u64 = saved.lanes.iter().map(|l| l.len).sum();
                        Ok(json!({
                            "vm": vm,
                            "to": to,
                            "processes": saved.lanes.len(),
                            "bytes": bytes,
                            "region_bytes": saved.region.as_ref().map_or(0, |r| r.1),
                            "send_ms": t.elapsed().as_secs_f64() * 1e3,
                            "peer": line,
                            "held": true,
                        }))
                    }
                    Err(why) => {
                        plane.queue_resume(&vm);
                        Err(format!("{vm}: not handed over, it goes on here: {why}"))
                    }
                };
                let _ = answer.send(r);
            });
        match spawned {
            Ok(_) => None,
            Err(e) => {
                let _ = self.resume(&name);
                Some(Err(format!(
                    "{name}: not handed over, it goes on here: {e}"
                )))
            }
        }
    }
}

/// The lanes whose checkpoints were taken, with their streams.
fn taken_lanes(taken: &BTreeMap<u32, u64>, memfds: &mut BTreeMap<u32, OwnedFd>) -> Vec<Lane> {
    taken
        .iter()
        .filter_map(|(&slot, &len)| {
            memfds
                .remove(&slot)
                .map(|stream| Lane { slot, stream, len })
        })
        .collect()
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
    crate::handover::printable(&text)
}

/// The key checkpoint files and handovers are tagged under, if the config
/// names one.
pub(super) fn checkpoint_key(cfg: &Config) -> Result<Option<Vec<u8>>, String> {
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
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}
