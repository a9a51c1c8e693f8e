//! The guest processes a worker serves. Each process has one [`Session`]
//! (one executor context: its memory, modules, streams), reached through
//! one or more channels: its first thread's, which opens the session with
//! `Hello`, and one for each further thread that calls the GPU at the same
//! time, which joins it with the session's token.
//!
//! A process numbers its requests across its channels; the worker runs a
//! session's requests in that order (see `channel::serve_channel`), so
//! that work one thread submits after another thread's call returned
//! reaches the device after it, as in CUDA.

use std::collections::HashMap;

use crate::session::Session;

/// A session's number in the worker.
pub(super) type SessionId = u64;

/// A session and what orders its channels' requests.
pub(super) struct Entry {
    pub s: Session,
    /// What a channel must present to join (random; see [`token`]).
    token: [u64; 2],
    /// Channels bound to it.
    pub channels: u32,
    /// The process id the guest gave when it claimed its first channel
    /// (what `VgpuStatus` lists; unverified).
    pub pid: u32,
    /// The number the process gave its next request.
    pub next_seq: u64,
    /// The channel whose request is still taking its data (or issuing a
    /// sliced launch): the session's other channels wait for it.
    pub holder: Option<u32>,
}

impl Entry {
    /// What a channel must present to join it.
    pub fn token(&self) -> [u64; 2] {
        self.token
    }
}

/// Every session of the worker.
#[derive(Default)]
pub(super) struct Sessions {
    map: HashMap<SessionId, Entry>,
    next: SessionId,
}

impl Sessions {
    /// Opens a session of guest process `pid` whose first request
    /// (`Hello`) was numbered `seq - 1`; returns its id and token.
    pub fn open(&mut self, s: Session, seq: u64, pid: u32) -> (SessionId, [u64; 2]) {
        self.next += 1;
        let t = token();
        self.map.insert(
            self.next,
            Entry {
                s,
                token: t,
                channels: 1,
                pid,
                next_seq: seq,
                holder: None,
            },
        );
        (self.next, t)
    }

    /// Adds a session served on from a checkpoint: its token, numbering
    /// and process id as they were, `channels` bound to it.
    pub fn restored(
        &mut self,
        s: Session,
        token: [u64; 2],
        channels: u32,
        pid: u32,
        next_seq: u64,
    ) -> SessionId {
        self.next += 1;
        self.map.insert(
            self.next,
            Entry {
                s,
                token,
                channels,
                pid,
                next_seq,
                holder: None,
            },
        );
        self.next
    }

    /// Binds one more channel to the session of `token`.
    pub fn join(&mut self, token: [u64; 2]) -> Option<SessionId> {
        let (&id, e) = self.map.iter_mut().find(|(_, e)| e.token == token)?;
        e.channels += 1;
        Some(id)
    }

    /// Unbinds channel `ch` from session `id`; the session, when that was
    /// its last channel.
    pub fn leave(&mut self, id: SessionId, ch: u32) -> Option<Session> {
        let e = self.map.get_mut(&id)?;
        e.channels = e.channels.saturating_sub(1);
        if e.holder == Some(ch) {
            e.holder = None;
        }
        if e.channels > 0 {
            return None;
        }
        self.map.remove(&id).map(|e| e.s)
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get_mut(&mut self, id: SessionId) -> Option<&mut Entry> {
        self.map.get_mut(&id)
    }

    /// Whether a session waits for its stream to reach a host function
    /// (the worker looks soon, not after a doorbell's block).
    pub fn host_fn_pending(&self) -> bool {
        self.map
            .values()
            .any(|e| e.s.host_fn.as_ref().is_some_and(|h| !h.delivered))
    }

    /// Whether a process is still owed the sticky error of a launch of its
    /// that faulted (it gets it at its next call, as natively).
    pub fn fault_owed(&self) -> bool {
        self.map
            .values()
            .any(|e| e.s.pending_error.is_some_and(|s| s.is_sticky()))
    }

    /// Whether the device has run all the sessions' work: no launches
    /// queued here, and every open busy period's streams idle.
    pub fn device_idle(&mut self) -> bool {
        self.map.values_mut().all(|e| {
            let s = &mut e.s;
            s.run.is_empty()
                && s.period.as_ref().is_none_or(|p| {
                    p.streams
                        .iter()
                        .all(|&st| s.ctx.stream_query(st).unwrap_or(false))
                })
        })
    }

    /// Each session's process and the device memory it holds, oldest
    /// session first.
    pub fn processes(&self) -> Vec<protocol::VgpuProcess> {
        let mut v: Vec<_> = self.map.iter().collect();
        v.sort_by_key(|(&id, _)| id);
        v.into_iter().map(|(_, e)| Self::process(e)).collect()
    }

    /// The oldest session's process (a process slot's worker has one at
    /// most), without gathering them all.
    pub fn first_process(&self) -> Option<protocol::VgpuProcess> {
        self.map
            .iter()
            .min_by_key(|(&id, _)| id)
            .map(|(_, e)| Self::process(e))
    }

    fn process(e: &Entry) -> protocol::VgpuProcess {
        protocol::VgpuProcess {
            pid: e.pid,
            mem_used: e.s.mem_used,
        }
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&SessionId, &mut Entry)> {
        self.map.iter_mut()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// 128 random bits from the kernel (a token other processes cannot guess;
/// all of a VM's processes see the shared region anyway, so this keeps
/// apart processes, not tenants).
fn token() -> [u64; 2] {
    let mut b = [0u8; 16];
    // SAFETY: writes at most 16 bytes into our buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 16 {
        // getrandom cannot fail for 16 bytes once the pool is ready; fall
        // back to the clock and the address space's randomness.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, crate::nanos);
        let a = &b as *const _ as u64;
        return [
            t ^ a.rotate_left(17),
            a ^ t.rotate_left(31) ^ 0x9e37_79b9_7f4a_7c15,
        ];
    }
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&b[..8]);
    hi.copy_from_slice(&b[8..]);
    [u64::from_le_bytes(lo), u64::from_le_bytes(hi)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::sim::{SimExecutor, SimParams};
    use crate::executor::Executor;

    fn session() -> Session {
        Session::new(SimExecutor::new(SimParams::default()).open().unwrap())
    }

    #[test]
    fn channels_join_by_token_and_the_last_one_out_frees() {
        let mut ss = Sessions::default();
        let (a, ta) = ss.open(session(), 2, 10);
        let (b, _) = ss.open(session(), 2, 11);
        assert_ne!(a, b);
        ss.get_mut(b).unwrap().s.mem_used = 4096;
        let pids: Vec<_> = ss.processes().iter().map(|p| (p.pid, p.mem_used)).collect();
        assert_eq!(pids, [(10, 0), (11, 4096)], "one per session, oldest first");
        assert_eq!(ss.join(ta), Some(a));
        assert_eq!(
            ss.join([ta[0], ta[1] ^ 1]),
            None,
            "a wrong token joins nothing"
        );
        ss.get_mut(a).unwrap().holder = Some(7);
        assert!(ss.leave(a, 7).is_none(), "one channel left");
        assert_eq!(ss.get_mut(a).unwrap().holder, None);
        assert!(ss.leave(a, 3).is_some(), "the last one frees it");
        assert!(ss.get_mut(a).is_none());
        assert_eq!(ss.len(), 1);
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(token(), token());
    }
}
