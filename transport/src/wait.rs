//! Hybrid waiting: poll for a bounded number of iterations, then announce
//! that we sleep and block on a doorbell. The peer rings only when it sees
//! the announcement, so a busy channel makes no system call at all.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::error::{Error, Result};

/// How long to poll before blocking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpinPolicy {
    /// Poll iterations before blocking (FairGV uses 100,000).
    pub spins: u32,
    /// Longest single block before re-checking; bounds the cost of a lost wake-up.
    pub max_block_us: u64,
}

impl Default for SpinPolicy {
    fn default() -> Self {
        SpinPolicy {
            spins: 100_000,
            max_block_us: 10_000,
        }
    }
}

/// Something a waiter blocks on and a peer rings.
pub trait Bell: Send + Sync + std::fmt::Debug {
    /// Wakes the waiter (at most one system call).
    fn ring(&self) -> Result<()>;
    /// Blocks until rung or until `timeout`; true if rung.
    fn wait(&self, timeout: Duration) -> Result<bool>;
    /// Called before the waiter announces that it sleeps: a bell whose
    /// ringer must know where to ring (the guest's vCPU-affine vector)
    /// publishes it here, so the announcement is never seen before it.
    fn prepare(&self) -> Result<()> {
        Ok(())
    }
}

/// An eventfd doorbell: the host's side, and what QEMU's ivshmem-doorbell
/// device turns into an MSI-X interrupt for the guest.
#[derive(Debug)]
pub struct EventFdBell {
    fd: OwnedFd,
}

impl EventFdBell {
    /// A fresh non-blocking eventfd.
    pub fn new() -> Result<EventFdBell> {
        use nix::sys::eventfd::{EfdFlags, EventFd};
        let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| Error::io("eventfd", e))?;
        Ok(EventFdBell {
            fd: OwnedFd::from(efd),
        })
    }

    /// Wraps an eventfd received from a peer.
    pub fn from_fd(fd: OwnedFd) -> EventFdBell {
        EventFdBell { fd }
    }

    /// The descriptor (to pass to a peer).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    fn drain(&self) {
        let mut buf = [0u8; 8];
        // Non-blocking: EAGAIN when nothing is pending, which is fine.
        let _ = nix::unistd::read(self.fd.as_fd(), &mut buf);
    }
}

impl Bell for EventFdBell {
    fn ring(&self) -> Result<()> {
        match nix::unistd::write(self.fd.as_fd(), &1u64.to_ne_bytes()) {
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => Ok(()),
            Err(e) => Err(Error::io("ringing eventfd", e)),
        }
    }

    fn wait(&self, timeout: Duration) -> Result<bool> {
        let ms = i32::try_from(timeout.as_millis())
            .unwrap_or(i32::MAX)
            .max(1);
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        let n = match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(Error::io("poll on eventfd", e)),
        };
        if n > 0 {
            self.drain();
        }
        Ok(n > 0)
    }
}

impl AsRawFd for EventFdBell {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// The pure-polling fallback for a guest without the kernel module: "blocking"
/// is a short sleep, and ringing does nothing.
#[derive(Debug, Default)]
pub struct PollingBell;

impl Bell for PollingBell {
    fn ring(&self) -> Result<()> {
        Ok(())
    }

    fn wait(&self, timeout: Duration) -> Result<bool> {
        std::thread::sleep(timeout.min(Duration::from_micros(50)));
        Ok(false)
    }
}

/// Waits until `poll` yields a value: spin, then announce through `sleeping`
/// and block on `bell`, re-checking after the announcement so that a message
/// published just before it is never missed. Gives up at `deadline`.
///
/// Rung with nothing to take, the waiter spins again before it blocks: the
/// peer rang ahead of its message (a host about to be granted the GPU wakes
/// its sleeping guests, so that its replies find them awake).
pub fn wait_for<T>(
    policy: &SpinPolicy,
    sleeping: &AtomicU32,
    bell: &dyn Bell,
    deadline: Option<Instant>,
    mut poll: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    for _ in 0..policy.spins {
        if let Some(v) = poll()? {
            return Ok(v);
        }
        std::hint::spin_loop();
    }
    loop {
        bell.prepare()?;
        sleeping.store(1, Ordering::Relaxed);
        // Pairs with the fence in `notify_if_sleeping`: either we see the
        // message, or the producer sees our flag and rings.
        fence(Ordering::SeqCst);
        if let Some(v) = poll()? {
            sleeping.store(0, Ordering::Relaxed);
            return Ok(v);
        }
        let mut block = Duration::from_micros(policy.max_block_us.max(1));
        if let Some(d) = deadline {
            let now = Instant::now();
            if now >= d {
                sleeping.store(0, Ordering::Relaxed);
                return Err(Error::Timeout);
            }
            block = block.min(d - now);
        }
        let rung = bell.wait(block)?;
        sleeping.store(0, Ordering::Relaxed);
        if let Some(v) = poll()? {
            return Ok(v);
        }
        if rung {
            for _ in 0..policy.spins {
                if let Some(v) = poll()? {
                    return Ok(v);
                }
                std::hint::spin_loop();
            }
        }
    }
}

/// Called by a producer after publishing: rings `bell` only if the consumer
/// announced that it sleeps.
pub fn notify_if_sleeping(sleeping: &AtomicU32, bell: &dyn Bell) -> Result<()> {
    fence(Ordering::SeqCst);
    if sleeping.load(Ordering::Relaxed) != 0 {
        bell.ring()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(not(miri))]
    use std::sync::{atomic::AtomicBool, Arc};

    #[cfg(not(miri))]
    #[test]
    fn blocked_waiter_is_woken_by_ring() {
        let bell = Arc::new(EventFdBell::new().unwrap());
        let flag = Arc::new(AtomicU32::new(0));
        let ready = Arc::new(AtomicBool::new(false));
        let (b2, f2, r2) = (bell.clone(), flag.clone(), ready.clone());
        let t = std::thread::spawn(move || {
            let policy = SpinPolicy {
                spins: 10,
                max_block_us: 5_000_000,
            };
            let start = Instant::now();
            wait_for(&policy, &f2, &*b2, None, || {
                Ok(r2.load(Ordering::Acquire).then_some(()))
            })
            .unwrap();
            start.elapsed()
        });
        while flag.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        ready.store(true, Ordering::Release);
        notify_if_sleeping(&flag, &*bell).unwrap();
        let waited = t.join().unwrap();
        assert!(
            waited < Duration::from_secs(4),
            "wake-up was lost: waited {waited:?}"
        );
    }

    /// Rung ahead of the message, the waiter is spinning when it comes: it
    /// takes it without being rung again (its blocks last 5 s).
    #[cfg(not(miri))]
    #[test]
    fn a_waiter_rung_ahead_of_its_message_spins_for_it() {
        use std::sync::atomic::AtomicU64;
        let bell = Arc::new(EventFdBell::new().unwrap());
        let flag = Arc::new(AtomicU32::new(0));
        let rung = Arc::new(AtomicBool::new(false));
        let (b2, f2, r2) = (bell.clone(), flag.clone(), rung.clone());
        let t = std::thread::spawn(move || {
            let policy = SpinPolicy {
                spins: 100_000,
                max_block_us: 5_000_000,
            };
            // The message comes on the 1000th look after the ring (or, for
            // a waiter that slept again, on its first look 4.5 s after).
            let looks = AtomicU64::new(0);
            let since = std::cell::Cell::new(None::<Instant>);
            wait_for(&policy, &f2, &*b2, None, || {
                if !r2.load(Ordering::Acquire) {
                    return Ok(None);
                }
                let t = since.get().unwrap_or_else(Instant::now);
                since.set(Some(t));
                let n = looks.fetch_add(1, Ordering::Relaxed);
                Ok((n >= 1000 || t.elapsed() > Duration::from_millis(4500)).then_some(()))
            })
            .unwrap();
            since.get().map(|t| t.elapsed())
        });
        // Past its first spin, it sleeps: rung with nothing yet.
        while flag.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let t0 = Instant::now();
        rung.store(true, Ordering::Release);
        bell.ring().unwrap();
        t.join().unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "it slept again: waited {:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn deadline_gives_timeout() {
        let flag = AtomicU32::new(0);
        let policy = SpinPolicy {
            spins: 10,
            max_block_us: 100,
        };
        let d = Some(Instant::now() + Duration::from_millis(2));
        let r: Result<()> = wait_for(&policy, &flag, &PollingBell, d, || Ok(None));
        assert!(matches!(r, Err(Error::Timeout)));
        assert_eq!(flag.load(Ordering::Relaxed), 0);
    }
}
