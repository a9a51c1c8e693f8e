//! The daemon's watch over the process slots of a VM that have no worker
//! (a worker per guest process, bound on demand; see the supervisor's
//! `slots.rs`).
//!
//! A slot without a worker shows its guests that its host end sleeps (the
//! slot's host-sleeping word is set), so a guest process that claims a
//! channel there and sends its `Hello` rings the slot's host doorbell
//! vector. One thread per VM with slots blocks on those doorbells (the
//! slots without a worker alone, and an eventfd of its own): an idle VM
//! costs no wake-ups, however many there are. When one rings, the thread
//! looks at the slot's channels: channels let go of (closing, abandoned)
//! are freed here, as no worker holds anything of them; a claimed one
//! asks the supervisor for a worker, once, until the slot is given back
//! ([`SlotWatch::release`]). A guest that rings without claiming gets
//! nothing started: a worker is asked for only for a claimed channel, and
//! at most one per slot.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use transport::{Bell, ClaimState, EventFdBell, Region};

use crate::Error;

/// A VM's process slot that a guest process claimed while it had no worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotClaim {
    /// The VM.
    pub vm: String,
    /// The slot.
    pub slot: u32,
}

/// Which of a VM's slots have (or were asked) a worker, and which the
/// thread is to look at again.
#[derive(Debug, Default)]
struct Slots {
    /// A worker serves it, or the supervisor was asked for one.
    taken: Vec<bool>,
    /// To look at on the thread's next turn, rung or not.
    look: Vec<bool>,
}

/// One VM's watch (see the module's doc); the thread ends when it drops.
#[derive(Debug)]
pub struct SlotWatch {
    slots: Arc<Mutex<Slots>>,
    wake: Arc<EventFdBell>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SlotWatch {
    /// Starts watching `region`'s slots, whose guests ring `bells` (one
    /// host doorbell vector per slot), every slot without a worker; claims
    /// go to `claims` (as what the receiver takes them in).
    pub fn start<T: From<SlotClaim> + Send + 'static>(
        vm: &str,
        region: Region,
        bells: Vec<Arc<EventFdBell>>,
        claims: Sender<T>,
    ) -> Result<SlotWatch, Error> {
        let n = region.layout().params.partitions;
        for k in 0..n {
            // No worker: the slot's guests ring when they send.
            region.slot_sleeping(k)?.store(1, Ordering::SeqCst);
        }
        let n = n as usize;
        let slots = Arc::new(Mutex::new(Slots {
            taken: vec![false; n],
            look: vec![true; n],
        }));
        let wake = Arc::new(EventFdBell::new()?);
        let stop = Arc::new(AtomicBool::new(false));
        let mut t = Thread {
            vm: vm.to_owned(),
            region,
            bells,
            claims,
            slots: slots.clone(),
            wake: wake.clone(),
            stop: stop.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("slots-{vm}"))
            .spawn(move || t.run())
            .map_err(|source| Error::Io {
                what: "spawning a slot watch thread",
                source,
            })?;
        Ok(SlotWatch {
            slots,
            wake,
            stop,
            thread: Some(thread),
        })
    }

    /// Marks slot `k` as served (a worker was started for it otherwise
    /// than on the watch's asking): the watch leaves its doorbell alone.
    pub fn take(&self, k: u32) {
        let mut s = lock(&self.slots);
        if let Some(t) = s.taken.get_mut(k as usize) {
            *t = true;
        }
    }

    /// Slot `k` has no worker again (its worker ended, or none could be
    /// started): the watch looks at its channels at once (a process that
    /// came as the worker left finds one) and then waits on its doorbell.
    pub fn release(&self, k: u32) {
        {
            let mut s = lock(&self.slots);
            let k = k as usize;
            if k < s.taken.len() {
                s.taken[k] = false;
                s.look[k] = true;
            }
        }
        let _ = self.wake.ring();
    }
}

impl Drop for SlotWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.wake.ring();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Takes what rang `b` (non-blocking: nothing to take is fine).
fn drain(b: &EventFdBell) {
    let mut buf = [0u8; 8];
    let _ = nix::unistd::read(b.fd().as_fd(), &mut buf);
}

fn lock(m: &Mutex<Slots>) -> std::sync::MutexGuard<'_, Slots> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The watch's thread.
struct Thread<T> {
    vm: String,
    region: Region,
    bells: Vec<Arc<EventFdBell>>,
    claims: Sender<T>,
    slots: Arc<Mutex<Slots>>,
    wake: Arc<EventFdBell>,
    stop: Arc<AtomicBool>,
}

impl<T: From<SlotClaim>> Thread<T> {
    fn run(&mut self) {
        while !self.stop.load(Ordering::SeqCst) {
            // The slots without a worker, and those to look at now.
            let (idle, mut due): (Vec<usize>, Vec<usize>) = {
                let mut s = lock(&self.slots);
                let idle = (0..s.taken.len()).filter(|&k| !s.taken[k]).collect();
                let due = (0..s.look.len())
                    .filter(|&k| std::mem::take(&mut s.look[k]))
                    .collect();
                (idle, due)
            };
            if due.is_empty() {
                let watched: Vec<(usize, &EventFdBell)> = idle
                    .iter()
                    .filter_map(|&k| self.bells.get(k).map(|b| (k, &**b)))
                    .collect();
                let mut fds: Vec<PollFd> = std::iter::once(self.wake.fd().as_fd())
                    .chain(watched.iter().map(|(_, b)| b.fd().as_fd()))
                    .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
                    .collect();
                // Until a doorbell or the supervisor rings: no timeout.
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => {
                        tracing::warn!(vm = self.vm, "slot watch: poll: {e}");
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                }
                let rung = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
                due = fds
                    .iter()
                    .skip(1)
                    .zip(&watched)
                    .filter(|(f, _)| rung(f))
                    .map(|(_, (k, _))| *k)
                    .collect();
                drain(&self.wake);
            }
            for k in due {
                self.look_at(k);
            }
        }
    }

    /// Looks at slot `k`'s channels if it has no worker: frees those let
    /// go of, asks for a worker if one is claimed.
    fn look_at(&mut self, k: usize) {
        let mut s = lock(&self.slots);
        if s.taken.get(k).is_none_or(|&t| t) {
            return; // its worker drains its doorbell
        }
        if let Some(b) = self.bells.get(k) {
            drain(b);
        }
        let Ok(slot) = u32::try_from(k) else {
            return;
        };
        let chans = self.region.layout().partition_channels(slot);
        let mut claimed = false;
        for ch in chans {
            match self.region.claim_state(ch) {
                Ok(ClaimState::Claimed) => claimed = true,
                Ok(st) if st.needs_reclaim() => {
                    // No worker holds anything of it: freed here.
                    if let Ok(mut h) = self.region.host_channel(ch) {
                        let _ = h.reclaim(st);
                    }
                }
                _ => {}
            }
        }
        if claimed {
            s.taken[k] = true;
            drop(s);
            tracing::debug!(
                vm = self.vm,
                slot,
                "a process claimed a slot with no worker"
            );
            let _ = self.claims.send(T::from(SlotClaim {
                vm: self.vm.clone(),
                slot,
            }));
        }
    }
}
