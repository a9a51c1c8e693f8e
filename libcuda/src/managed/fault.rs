//! The SIGSEGV handler through which the program's touches of managed
//! memory reach the stand-in. Installed once, when the first managed
//! allocation is made on the device; any fault that is not a managed
//! allocation's goes to the handler that was there before (the program's
//! own, or the default action: the process dies of SIGSEGV as without us).

use crate::state::process::{Prev, FAULT_INSTALL as INSTALL, FAULT_PREV as PREV};

/// `si_code` of a fault on a mapped page the access was not allowed to.
const SEGV_ACCERR: libc::c_int = 2;

/// Installs the handler (once per process); false if it could not be.
pub(crate) fn install() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: zeroed sigaction structs are valid (empty mask, no flags).
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = handler as *const () as usize;
        // SA_ONSTACK: a program that handles stack overflows on an
        // alternate stack (Rust's runtime does) still can.
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: reads the current action into `old` without changing it.
        if unsafe { libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old) } != 0 {
            return;
        }
        // The previous action is known before ours can run.
        let _ = PREV.set(Prev(old));
        // SAFETY: installs `handler`, an `extern "C"` function that never
        // unwinds.
        unsafe { libc::sigaction(libc::SIGSEGV, &act, std::ptr::null_mut()) };
    });
    PREV.get().is_some()
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let info_ref = unsafe { &*info };
    let code = info_ref.si_code;
    // SAFETY: the faulting address of a SIGSEGV's siginfo.
    let addr = unsafe { info_ref.si_addr() } as u64;
    if code == SEGV_ACCERR {
        match std::panic::catch_unwind(|| super::on_fault(addr)) {
            Ok(true) => return,
            Ok(false) => {}
            // Nothing may unwind out of a signal handler.
            Err(_) => std::process::abort(),
        }
    }
    chain(sig, info, ctx);
}

/// Passes a fault that is not ours to the action installed before.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(Prev(prev)) = PREV.get() else {
        std::process::abort();
    };
    match prev.sa_sigaction {
        libc::SIG_DFL | libc::SIG_IGN => {
            // The default action (a fault cannot be ignored): put it back;
            // the faulting instruction runs again and the process dies of
            // the signal as it would have. A signal sent by kill() is
            // raised again instead.
            // SAFETY: zeroed sigaction is SIG_DFL with an empty mask.
            let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: installs the default action; async-signal-safe.
            unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
            // SAFETY: reads the siginfo the kernel passed.
            if unsafe { (*info).si_code } <= 0 {
                // SAFETY: async-signal-safe.
                unsafe { libc::raise(sig) };
            }
        }
        f if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the program installed this three-argument handler
            // for this signal; we call it as the kernel would have.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(f) };
            f(sig, info, ctx);
        }
        f => {
            // SAFETY: the program installed this one-argument handler.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(f) };
            f(sig);
        }
    }
}
