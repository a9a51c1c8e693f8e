//! Where a new guest process's executor context comes from.
//!
//! Making a CUDA context is one of the slowest things a driver does (tens
//! to hundreds of milliseconds on an H100), and the driver does it under
//! locks that every process on the machine shares: one VM that opens and
//! drops sessions in a loop slows every other VM's new processes, whatever
//! the scheduler grants. So the worker keeps the contexts of processes that
//! ended, made clean again ([`Context::recycle`]: their work finished, every
//! object destroyed, every allocation given back to the driver), and gives
//! them to the next processes of the same vGPU. A context never passes
//! between vGPUs: each vGPU has its own worker.
//!
//! Contexts that must be made new are rationed per vGPU by a token bucket
//! ([`NEW_PER_SECOND`], bursts of [`NEW_BURST`]): a `Hello` that finds no
//! spare and no token waits in its ring, and only that VM's processes wait.

use std::time::Instant;

use protocol::Status;

use crate::executor::{Context, Executor};

/// Clean contexts kept for later processes, at most.
pub const SPARES: usize = 4;
/// New contexts a vGPU may have made per second, in the long run.
pub const NEW_PER_SECOND: f64 = 8.0;
/// New contexts a vGPU may have made at once, after a quiet while.
pub const NEW_BURST: f64 = 16.0;

/// Counts of where contexts came from (for the status and tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounts {
    /// Contexts made new by the executor.
    pub created: u64,
    /// Sessions that got a recycled context.
    pub reused: u64,
    /// `Hello`s held back for want of a token (each time one was tried).
    pub deferred: u64,
}

/// The spare contexts and the token bucket of one worker.
pub(super) struct ContextPool {
    spares: Vec<Box<dyn Context>>,
    tokens: f64,
    at: Instant,
    per_second: f64,
    burst: f64,
    pub counts: PoolCounts,
}

impl Default for ContextPool {
    fn default() -> Self {
        ContextPool::new(NEW_PER_SECOND, NEW_BURST)
    }
}

impl ContextPool {
    /// A pool whose bucket refills at `per_second` up to `burst`.
    pub fn new(per_second: f64, burst: f64) -> Self {
        ContextPool {
            spares: Vec::new(),
            tokens: burst,
            at: Instant::now(),
            per_second,
            burst,
            counts: PoolCounts::default(),
        }
    }

    /// A context for a new session: a spare if there is one, else a new one
    /// if the bucket has a token; `Ok(None)`: none now, try again later.
    pub fn take(&mut self, exec: &mut dyn Executor) -> Result<Option<Box<dyn Context>>, Status> {
        if let Some(c) = self.spares.pop() {
            self.counts.reused += 1;
            return Ok(Some(c));
        }
        let now = Instant::now();
        let dt = now.duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + dt * self.per_second).min(self.burst);
        if self.tokens < 1.0 {
            self.counts.deferred += 1;
            return Ok(None);
        }
        let c = exec.open()?;
        self.tokens -= 1.0;
        self.counts.created += 1;
        Ok(Some(c))
    }

    /// The context of a session that ended: kept, clean, if it can be made
    /// clean and there is room; dropped (destroyed) otherwise. `poisoned`:
    /// the executor's contexts are unusable (a sticky error).
    pub fn give_back(&mut self, mut ctx: Box<dyn Context>, poisoned: bool) {
        if poisoned || self.spares.len() >= SPARES {
            return;
        }
        match ctx.recycle() {
            Ok(()) => self.spares.push(ctx),
            Err(s) => tracing::debug!("a context is not reused: {s:?}"),
        }
    }

    /// Destroys the spares (the vGPU moves to another GPU, or the
    /// executor's contexts are unusable).
    pub fn clear(&mut self) {
        self.spares.clear();
    }

    /// Spares kept now.
    #[cfg(test)]
    pub fn spares(&self) -> usize {
        self.spares.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::sim::{SimExecutor, SimParams};
    use vm_memory::VolatileSlice;

    fn sim() -> Box<dyn Executor> {
        Box::new(SimExecutor::new(SimParams::default()))
    }

    #[test]
    fn an_ended_process_context_goes_to_the_next_one_clean() {
        let mut exec = sim();
        let mut pool = ContextPool::default();
        let mut a = pool.take(exec.as_mut()).unwrap().unwrap();
        let p = a.alloc(4096).unwrap();
        a.memset(p, 0xab, 1, 4096, 0).unwrap();
        pool.give_back(a, false);
        assert_eq!(pool.spares(), 1);
        let mut b = pool.take(exec.as_mut()).unwrap().unwrap();
        assert_eq!(pool.counts.created, 1);
        assert_eq!(pool.counts.reused, 1);
        // The first process's allocation is gone with it.
        assert_eq!(b.free(p), Err(Status::InvalidValue));
        // What the next one allocates reads as zeroes, not the first's bytes.
        let q = b.alloc(4096).unwrap();
        let mut out = vec![0xffu8; 4096];
        b.dtoh(&VolatileSlice::from(&mut out[..]), q, 0).unwrap();
        assert!(out.iter().all(|&x| x == 0));
    }

    #[test]
    fn spares_are_bounded_and_a_poisoned_context_is_not_kept() {
        let mut exec = sim();
        let mut pool = ContextPool::default();
        let ctxs: Vec<_> = (0..SPARES + 2)
            .map(|_| pool.take(exec.as_mut()).unwrap().unwrap())
            .collect();
        for c in ctxs {
            pool.give_back(c, false);
        }
        assert_eq!(pool.spares(), SPARES);
        let c = pool.take(exec.as_mut()).unwrap().unwrap();
        pool.give_back(c, true);
        assert_eq!(pool.spares(), SPARES - 1);
        pool.clear();
        assert_eq!(pool.spares(), 0);
    }

    #[test]
    fn new_contexts_are_rationed_and_the_bucket_refills() {
        let mut exec = sim();
        // 20 a second, bursts of 3.
        let mut pool = ContextPool::new(20.0, 3.0);
        let mut held: Vec<_> = (0..3)
            .map(|_| pool.take(exec.as_mut()).unwrap().unwrap())
            .collect();
        assert!(
            pool.take(exec.as_mut()).unwrap().is_none(),
            "the burst is spent"
        );
        assert_eq!(pool.counts.deferred, 1);
        std::thread::sleep(std::time::Duration::from_millis(120));
        assert!(
            pool.take(exec.as_mut()).unwrap().is_some(),
            "a token came back"
        );
        // Spend what else came back (at most the burst).
        let mut more = 0;
        while pool.take(exec.as_mut()).unwrap().is_some() {
            more += 1;
            assert!(more <= 3, "never more than the burst");
        }
        let created = pool.counts.created;
        // A spare needs no token.
        pool.give_back(held.pop().unwrap(), false);
        assert!(pool.take(exec.as_mut()).unwrap().is_some());
        assert_eq!(pool.counts.created, created);
        assert_eq!(pool.counts.reused, 1);
    }
}
