//! SIGTERM/SIGINT/SIGHUP to flags, for the daemon and workers.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static TERM: AtomicBool = AtomicBool::new(false);
static HUP: AtomicBool = AtomicBool::new(false);
/// The write end of a pipe a thread may wait on for SIGTERM/SIGINT (see
/// [`wait_terminated`]); -1 before [`install`].
static TERM_PIPE_W: AtomicI32 = AtomicI32::new(-1);
static TERM_PIPE_R: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_term(_: libc::c_int) {
    TERM.store(true, Ordering::SeqCst);
    let fd = TERM_PIPE_W.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; one byte from a static
        // buffer to a non-blocking pipe that is never closed.
        let _ = unsafe { libc::write(fd, b"t".as_ptr().cast(), 1) };
    }
}

extern "C" fn on_hup(_: libc::c_int) {
    HUP.store(true, Ordering::SeqCst);
}

/// Installs the handlers; `terminated()` reports whether one fired.
pub fn install() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    if TERM_PIPE_W.load(Ordering::SeqCst) < 0 {
        use std::os::fd::IntoRawFd;
        let flags = nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK;
        if let Ok((r, w)) = nix::unistd::pipe2(flags) {
            // Kept open for the process's life: the handler may write at
            // any time.
            TERM_PIPE_R.store(r.into_raw_fd(), Ordering::SeqCst);
            TERM_PIPE_W.store(w.into_raw_fd(), Ordering::SeqCst);
        }
    }
    let act = SigAction::new(
        SigHandler::Handler(on_term),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let _ = unsafe { sigaction(s, &act) };
    }
    let hup = SigAction::new(
        SigHandler::Handler(on_hup),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: as above, the handler only stores to an atomic.
    let _ = unsafe { sigaction(Signal::SIGHUP, &hup) };
}

/// Whether SIGHUP arrived since the last call (the daemon reloads its config).
pub fn take_hangup() -> bool {
    HUP.swap(false, Ordering::SeqCst)
}

/// Whether SIGTERM or SIGINT arrived.
pub fn terminated() -> bool {
    TERM.load(Ordering::SeqCst)
}

/// Blocks the calling thread until SIGTERM or SIGINT arrives (at once if
/// one did), without waking in between; polls every 50 ms where
/// [`install`] could make no pipe.
pub fn wait_terminated() {
    use std::os::fd::BorrowedFd;
    while !terminated() {
        let r = TERM_PIPE_R.load(Ordering::SeqCst);
        if r < 0 {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        }
        // SAFETY: the read end is open for the process's life (`install`).
        let fd = unsafe { BorrowedFd::borrow_raw(r) };
        let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE);
    }
}
