//! SIGTERM/SIGINT/SIGHUP to flags, for the daemon and workers.

use std::sync::atomic::{AtomicBool, Ordering};

static TERM: AtomicBool = AtomicBool::new(false);
static HUP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    TERM.store(true, Ordering::SeqCst);
}

extern "C" fn on_hup(_: libc::c_int) {
    HUP.store(true, Ordering::SeqCst);
}

/// Installs the handlers; `terminated()` reports whether one fired.
pub fn install() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
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
