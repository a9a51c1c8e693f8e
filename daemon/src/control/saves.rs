//! Checkpoints an operator asks for through the API (`checkpoint`,
//! `resume`, `restore`): queued here for the supervisor, which orders the
//! vGPU's workers and answers (the supervisor's `checkpoint.rs`).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::mpsc::{channel, Sender};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{lock, ControlPlane, Refusal};
use crate::handover::{Purpose, Receiver};
use crate::save_file::{FileLimits, Saved};

/// Bytes of module images a process slot's stream may hold beyond the
/// vGPU's memory limit.
pub const IMAGES_MAX: u64 = 4 << 30;

/// A vGPU handed over from another host (or sent ahead of its handover),
/// and where the supervisor's word on it goes.
pub type Arrival = (Saved, Purpose, Sender<Result<String, String>>);

/// The memfds of a checkpoint sent ahead (by process slot), and when it
/// was sent: the handover's checkpoint is written over them, their pages
/// already there, which is faster than into new memfds during the guest's
/// pause.
pub type Warm = (Instant, BTreeMap<u32, OwnedFd>);

/// How long the memfds of a checkpoint sent ahead are kept for its
/// handover.
pub const WARM_KEEP: Duration = Duration::from_secs(600);

/// What is asked of a vGPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaveOp {
    /// Hold it and write its checkpoint to this file of the checkpoint
    /// folder.
    Checkpoint(String, CheckpointWith),
    /// Let it go on (a checkpoint taken and not used).
    Resume,
    /// Serve on from this file of the checkpoint folder.
    Restore(String),
    /// Hold it, and hand its checkpoint and region to the daemon at this
    /// address (`handover.rs`); or, `true`, send a checkpoint there ahead
    /// of that and let it go on at once.
    Handover(String, bool),
    /// Serve on from what another host's daemon handed over.
    RestoreReceived,
}

/// How a checkpoint to a file is taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointWith {
    /// The VM is paused and stays so until QEMU has saved it (libvirt's
    /// save): the region goes into the file, taken once the workers hold,
    /// and is written over QEMU's copy at the restore (QEMU may copy it
    /// before the workers are done writing).
    pub region: bool,
    /// A file of that name is replaced (a domain's latest save).
    pub replace: bool,
}

/// One ask, and where its answer goes.
#[derive(Debug)]
pub struct SaveAsk {
    /// The VM.
    pub vm: String,
    /// What is asked.
    pub op: SaveOp,
    /// The answer: the API's body, or why not.
    pub answer: Sender<Result<Value, String>>,
}

/// Longest checkpoint file name, bytes.
const NAME_MAX: usize = 255;

/// Whether `name` may name a file of the checkpoint folder: 1 to 255 of
/// letters, digits, `.`, `-`, `_`, not starting with a `.` (no path, no
/// hidden file).
pub fn check_file_name(name: &str) -> Result<(), Refusal> {
    let ok = !name.is_empty()
        && name.len() <= NAME_MAX
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Refusal::Other(format!(
            "{name:?} is not a checkpoint file name: 1 to {NAME_MAX} letters, digits, '.', '-', '_', not starting with '.' (the file is in [daemon] checkpoint_dir)"
        )))
    }
}

impl ControlPlane {
    /// Asks the supervisor for `op` on `vm` and waits for its answer (at
    /// most `timeout`).
    pub fn save_op(&self, vm: &str, op: SaveOp, timeout: Duration) -> Result<Value, Refusal> {
        if lock(&self.cfg).vm(vm).is_none() {
            return Err(Refusal::NoVm(vm.to_owned()));
        }
        if let SaveOp::Checkpoint(f, _) | SaveOp::Restore(f) = &op {
            check_file_name(f)?;
        }
        let checkpoint = matches!(op, SaveOp::Checkpoint(..));
        if checkpoint {
            *lock(&self.checkpointing).entry(vm.to_owned()).or_default() += 1;
        }
        let (tx, rx) = channel();
        lock(&self.save_asks).push(SaveAsk {
            vm: vm.to_owned(),
            op,
            answer: tx,
        });
        self.ring();
        let r = match rx.recv_timeout(timeout) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(why)) => Err(Refusal::Conflict(why)),
            Err(_) => Err(Refusal::Conflict(format!(
                "{vm}: the daemon did not answer within {timeout:?}"
            ))),
        };
        if checkpoint {
            let mut under_way = lock(&self.checkpointing);
            if let Some(n) = under_way.get_mut(vm) {
                *n -= 1;
                if *n == 0 {
                    under_way.remove(vm);
                }
            }
        }
        r
    }

    /// Waits up to `limit` for `vm`'s checkpoint to a file under way, if
    /// any, to be written (or to fail); true if none is under way now.
    pub fn checkpoint_done(&self, vm: &str, limit: Duration) -> bool {
        let since = std::time::Instant::now();
        while lock(&self.checkpointing).contains_key(vm) {
            if since.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Sets how the supervisor is told of an ask or an arrival.
    pub fn on_ask(&self, ring: impl Fn() + Send + 'static) {
        *lock(&self.ring) = Some(Box::new(ring));
    }

    fn ring(&self) {
        if let Some(r) = lock(&self.ring).as_ref() {
            r();
        }
    }

    /// The asks not yet taken, oldest first.
    pub fn take_save_asks(&self) -> Vec<SaveAsk> {
        std::mem::take(&mut *lock(&self.save_asks))
    }

    /// Queues a resume of `vm` whose answer nobody waits for (a handover
    /// that failed on its way).
    pub fn queue_resume(&self, vm: &str) {
        lock(&self.save_asks).push(SaveAsk {
            vm: vm.to_owned(),
            op: SaveOp::Resume,
            answer: channel().0,
        });
        self.ring();
    }

    /// Keeps `streams`, a checkpoint of `vm` sent ahead, for its handover
    /// (replacing any kept before).
    pub fn keep_warm(&self, vm: &str, streams: BTreeMap<u32, OwnedFd>) {
        lock(&self.warm_streams).insert(vm.to_owned(), (Instant::now(), streams));
    }

    /// The memfds kept for `vm`'s handover (none if none or stale; the
    /// other VMs' stale ones go with [`ControlPlane::drop_stale_warm`]).
    pub fn take_warm(&self, vm: &str) -> BTreeMap<u32, OwnedFd> {
        lock(&self.warm_streams)
            .remove(vm)
            .filter(|(at, _)| at.elapsed() < WARM_KEEP)
            .map(|(_, s)| s)
            .unwrap_or_default()
    }

    /// Drops the memfds kept for handovers that are older than
    /// [`WARM_KEEP`], or of VMs not in `live`.
    pub fn drop_stale_warm(&self, live: &dyn Fn(&str) -> bool) {
        lock(&self.warm_streams).retain(|vm, (at, _)| at.elapsed() < WARM_KEEP && live(vm));
    }

    /// vGPUs handed over since the last call.
    pub fn take_arrivals(&self) -> Vec<Arrival> {
        std::mem::take(&mut *lock(&self.arrivals))
    }

    /// What a file or a peer's stream for `vm` may hold here.
    pub fn save_limits(&self, vm: &str, region: bool) -> Option<FileLimits> {
        let cfg = lock(&self.cfg);
        let v = cfg.vm(vm)?;
        let region = if region {
            transport::layout::Layout::new(cfg.layout_for(v))
                .ok()?
                .region_size as u64
        } else {
            0
        };
        Some(FileLimits {
            slots: v.slots(),
            lane_bytes: (v.memory_limit_mib << 20).saturating_add(IMAGES_MAX),
            region,
        })
    }
}

impl Receiver for ControlPlane {
    fn limits(&self, vm: &str) -> Option<FileLimits> {
        self.save_limits(vm, true)
    }

    fn arrived(&self, saved: Saved, purpose: Purpose, answer: Sender<Result<String, String>>) {
        lock(&self.arrivals).push((saved, purpose, answer));
        self.ring();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each ask and arrival tells the supervisor at once: it would
    /// otherwise wait up to a turn (20 ms) with the guest paused.
    #[test]
    fn asks_and_arrivals_ring_the_supervisor() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (p, _) = super::super::declare::tests::plane("saves-ring");
        let rung = std::sync::Arc::new(AtomicUsize::new(0));
        let r = rung.clone();
        p.on_ask(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        p.queue_resume("vm1");
        assert_eq!(rung.load(Ordering::SeqCst), 1);
        let saved = Saved {
            vm: "vm1".into(),
            region: None,
            lanes: Vec::new(),
        };
        p.arrived(saved, Purpose::Handover, channel().0);
        assert_eq!(rung.load(Ordering::SeqCst), 2);
        assert_eq!(p.take_arrivals().len(), 1);
        assert_eq!(p.take_save_asks().len(), 1);
    }

    #[test]
    fn only_plain_names_in_the_folder_are_file_names() {
        for good in ["vm1.fvgpu", "a", "vm-1_2026-11-28.ckpt"] {
            assert!(check_file_name(good).is_ok(), "{good}");
        }
        let long = "a".repeat(NAME_MAX + 1);
        for bad in [
            "",
            ".hidden",
            "../etc/passwd",
            "a/b",
            "/abs",
            "a b",
            "é",
            "a\0b",
            &long,
        ] {
            assert!(check_file_name(bad).is_err(), "{bad:?}");
        }
    }
}
