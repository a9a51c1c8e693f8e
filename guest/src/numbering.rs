//! A process's request numbering, shared by all its channels, and what a
//! synchronizing call proves with it. The host runs a process's requests
//! in their numbers' order, so a call that waited for a stream (or the
//! whole context) and returned without error, with nothing numbered after
//! it since, leaves that stream idle: a synchronize or query of it then
//! answers at once, as the driver's does natively (it reads the stream's
//! progress in memory; here it would be a round trip to the host). A
//! program that copies a result back and then synchronizes its stream
//! (jacobiCudaGraphs, each iteration) pays one round trip, not two.
//!
//! What this leaves for the next call that reaches the host: the error of
//! a kernel on *another* stream that faults after the proof (natively any
//! later call may report it; the one answered here does not).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What a synchronizing call waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// One stream's work (by its host handle).
    Stream(u64),
    /// All of the context's work.
    Context,
}

impl Waited {
    /// Whether having waited for `self` means `other` is done too.
    fn covers(self, other: Waited) -> bool {
        match (self, other) {
            (Waited::Context, _) => true,
            (Waited::Stream(a), Waited::Stream(b)) => a == b,
            (Waited::Stream(_), Waited::Context) => false,
        }
    }
}

/// The numbering and the latest proof of idleness.
#[derive(Debug)]
pub(crate) struct Numbering {
    next: AtomicU64,
    /// The latest synchronizing call that returned without error: its
    /// number and what it waited for.
    quiet: Mutex<Option<(u64, Waited)>>,
}

impl Default for Numbering {
    fn default() -> Self {
        Numbering {
            next: AtomicU64::new(1),
            quiet: Mutex::new(None),
        }
    }
}

impl Numbering {
    /// The next request's number.
    pub fn take(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst)
    }

    /// Request `tag`, which waited for `what`, returned without error.
    pub fn waited(&self, tag: u64, what: Waited) {
        let mut q = self.quiet.lock().unwrap_or_else(|e| e.into_inner());
        // Another thread's later proof stands.
        if q.is_none_or(|(t, _)| t < tag) {
            *q = Some((tag, what));
        }
    }

    /// Whether `what` is known idle: the latest proof covers it and no
    /// request has been numbered after it.
    pub fn idle(&self, what: Waited) -> bool {
        let q = self.quiet.lock().unwrap_or_else(|e| e.into_inner());
        q.is_some_and(|(tag, w)| self.next.load(Ordering::SeqCst) == tag + 1 && w.covers(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_holds_until_the_next_request_and_only_for_what_it_waited_for() {
        let n = Numbering::default();
        assert!(!n.idle(Waited::Stream(3)), "nothing proven yet");
        let t = n.take();
        n.waited(t, Waited::Stream(3));
        assert!(n.idle(Waited::Stream(3)));
        assert!(!n.idle(Waited::Stream(4)), "another stream");
        assert!(!n.idle(Waited::Context), "the context's other streams");
        n.take();
        assert!(!n.idle(Waited::Stream(3)), "a request numbered since");
        let t = n.take();
        n.waited(t, Waited::Context);
        assert!(n.idle(Waited::Stream(9)) && n.idle(Waited::Context));
    }

    #[test]
    fn an_older_proof_does_not_replace_a_newer_one() {
        let n = Numbering::default();
        let (a, b) = (n.take(), n.take());
        n.waited(b, Waited::Context);
        n.waited(a, Waited::Stream(1));
        assert!(n.idle(Waited::Stream(2)), "the context proof stands");
    }
}
