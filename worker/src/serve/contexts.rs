//! Where a new guest process's executor context comes from.
//!
//! Making a CUDA context is one of the slowest things a driver does (tens
//! to hundreds of milliseconds on an H100), and the driver does it under
//! locks that every process on the machine shares: one VM that opens and
//! drops sessions in a loop slows every other VM's new processes, whatever
//! the scheduler grants. So a worker that serves processes one after
//! another (one run by hand, serving a region of its own; under the daemon
//! each process has a worker of its own, which made its context before the
//! process came) keeps the contexts of processes that ended, made clean
//! again ([`crate::executor::Limits::recycle`]: their work finished, every
//! object destroyed, every allocation given back to the driver), and gives
//! them to its next processes. A context never passes between vGPUs.
//!
//! Contexts that must be made new are rationed per vGPU by the time the
//! executor spends making them: a token bucket of seconds refilled at
//! [`NEW_SHARE`] of wall time, holding at most [`NEW_BURST_S`]. On a GPU
//! where a context takes 100 ms that is about one a second after a burst of
//! ten; on the sim, where one takes microseconds, no limit at all. A
//! `Hello` that finds no spare and an empty bucket waits in its ring, and
//! only that VM's processes wait.
//!
//! A worker that is an MPS client cannot make a context once the sandbox
//! confines it (measured on an H100: `CUDA_ERROR_MPS_CONNECTION_FAILED`).
//! It makes its contexts ahead ([`ContextPool::prefill`], `[[gpu]]
//! mps_processes` of them) and makes none later: they are all its guest
//! processes can use at once, and one more is turned away with
//! `CUDA_ERROR_MPS_MAX_CLIENTS_REACHED`. Only the first is made before the
//! worker serves; where the executor can ([`Executor::opener`]), the rest
//! are made on a thread of their own while it serves (a `Hello` that finds
//! none yet waits in its ring), and the worker confines its other threads
//! once they are all made ([`ContextPool::filled`]): it computes after one
//! context, not after all of them. An ended process's context whose
//! work still runs waits aside (draining) and is made clean once it is
//! done, so that a process killed mid-kernel costs no slot for good.

use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use protocol::Status;

use crate::executor::{Context, Executor};

/// Clean contexts kept for later processes, at most.
pub const SPARES: usize = 4;
/// Share of wall time a vGPU may spend having new contexts made, in the
/// long run.
pub const NEW_SHARE: f64 = 0.1;
/// Seconds of context making a vGPU may spend at once, after a quiet while.
pub const NEW_BURST_S: f64 = 1.0;

/// Counts of where contexts came from (for the status and tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounts {
    /// Contexts made new by the executor.
    pub created: u64,
    /// Sessions that got a recycled context.
    pub reused: u64,
    /// `Hello`s held back for an empty bucket (each time one was tried).
    pub deferred: u64,
}

/// The spare contexts and the token bucket of one worker.
pub(super) struct ContextPool {
    spares: Vec<Box<dyn Context>>,
    /// Made ahead, given back with work still running (see the module's
    /// doc); only in a fixed pool.
    draining: Vec<Box<dyn Context>>,
    /// Spares kept at most.
    max_spares: usize,
    /// Made ahead and never made new (see the module's doc).
    fixed: bool,
    /// Contexts still being made ahead on another thread; None once that
    /// thread is done (see [`ContextPool::prefill`]).
    filling: Option<Receiver<Box<dyn Context>>>,
    /// Seconds of context making left (may go below 0 by one creation).
    budget_s: f64,
    at: Instant,
    share: f64,
    burst_s: f64,
    pub counts: PoolCounts,
}

impl Default for ContextPool {
    fn default() -> Self {
        ContextPool::new(NEW_SHARE, NEW_BURST_S)
    }
}

impl ContextPool {
    /// A pool whose bucket refills at `share` seconds a second up to
    /// `burst_s`.
    pub fn new(share: f64, burst_s: f64) -> Self {
        ContextPool {
            spares: Vec::new(),
            draining: Vec::new(),
            max_spares: SPARES,
            fixed: false,
            filling: None,
            budget_s: burst_s,
            at: Instant::now(),
            share,
            burst_s,
            counts: PoolCounts::default(),
        }
    }

    /// A context for a new session: a spare if there is one, else a new one
    /// if the bucket is not empty; `Ok(None)`: none now, try again later.
    pub fn take(&mut self, exec: &mut dyn Executor) -> Result<Option<Box<dyn Context>>, Status> {
        // Those made ahead that have arrived since.
        self.filled();
        if let Some(c) = self.spares.pop() {
            self.counts.reused += 1;
            return Ok(Some(c));
        }
        if self.fixed {
            // One whose work has finished since, made clean.
            for i in 0..self.draining.len() {
                if self.draining[i].recycle().is_ok() {
                    self.counts.reused += 1;
                    return Ok(Some(self.draining.swap_remove(i)));
                }
            }
            if self.filling.is_some() {
                // More are on their way: the Hello waits for one.
                self.counts.deferred += 1;
                return Ok(None);
            }
            return Err(Status::MpsMaxClientsReached);
        }
        let now = Instant::now();
        let dt = now.duration_since(self.at).as_secs_f64();
        self.at = now;
        self.budget_s = (self.budget_s + dt * self.share).min(self.burst_s);
        if self.budget_s <= 0.0 {
            self.counts.deferred += 1;
            return Ok(None);
        }
        let c = exec.open();
        let spent = now.elapsed().as_secs_f64();
        self.budget_s -= spent;
        let c = c?;
        self.counts.created += 1;
        Ok(Some(c))
    }

    /// The context [`ContextPool::take_made`] gives next, if one is made
    /// (a spare's, to stage a restore's modules in).
    pub fn made_mut(&mut self) -> Option<&mut Box<dyn Context>> {
        self.filled();
        self.spares.last_mut()
    }

    /// A context made already (ahead, or made clean), if one is here: none
    /// is made for it. A restore fills it rather than making another.
    pub fn take_made(&mut self) -> Option<Box<dyn Context>> {
        self.filled();
        let c = self.spares.pop()?;
        self.counts.reused += 1;
        Some(c)
    }

    /// Makes `n` spares, outside the bucket, before the worker is
    /// confined; from then on the pool makes none (see the module's doc).
    /// The first is made now; where the executor has an
    /// [`Executor::opener`], the others on a thread of their own, which
    /// hands them over as each is made ([`ContextPool::filled`] says when
    /// it is done). A failure is logged and ends it; none made at all is an
    /// error.
    pub fn prefill(&mut self, exec: &mut dyn Executor, n: usize) -> Result<(), Status> {
        self.fixed = true;
        self.max_spares = n;
        if n > 1 {
            if let Some(mut open) = exec.opener() {
                self.spares.push(exec.open()?);
                self.counts.created += 1;
                let (tx, rx) = std::sync::mpsc::channel();
                let made = std::thread::Builder::new()
                    .name("contexts-ahead".into())
                    .spawn(move || {
                        for i in 1..n {
                            match open() {
                                Ok(c) => {
                                    if tx.send(c).is_err() {
                                        return;
                                    }
                                }
                                Err(s) => {
                                    tracing::warn!(made = i, "making a context ahead: {s:?}");
                                    return;
                                }
                            }
                        }
                    });
                match made {
                    Ok(_) => self.filling = Some(rx),
                    Err(e) => tracing::warn!(made = 1, "making contexts ahead: {e}"),
                }
                return Ok(());
            }
        }
        match self.make_spares(exec, n) {
            Err((0, s)) => Err(s),
            Err((made, s)) => {
                tracing::warn!(made, "making a context ahead: {s:?}");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// Makes `n` spares now, outside the bucket, for a worker that may
    /// still make more later (unlike [`ContextPool::prefill`]): a process
    /// slot's worker started for its process holds one made as it starts.
    /// A failure is logged: the contexts are then made as processes come,
    /// as without.
    pub fn warm(&mut self, exec: &mut dyn Executor, n: usize) {
        if let Err((made, s)) = self.make_spares(exec, n.min(self.max_spares)) {
            tracing::warn!(made, "making a context ahead: {s:?}");
        }
    }

    /// Makes `n` more spares on this thread; at the first failure, stops
    /// and says how many it made before it.
    fn make_spares(&mut self, exec: &mut dyn Executor, n: usize) -> Result<(), (usize, Status)> {
        for made in 0..n {
            let c = exec.open().map_err(|s| (made, s))?;
            self.spares.push(c);
            self.counts.created += 1;
        }
        Ok(())
    }

    /// Takes in the contexts made ahead on another thread since the last
    /// look; true once that thread is done (or there was none), from then
    /// on the worker may confine all its threads.
    pub fn filled(&mut self) -> bool {
        let Some(rx) = self.filling.as_ref() else {
            return true;
        };
        loop {
            match rx.try_recv() {
                Ok(c) => {
                    self.spares.push(c);
                    self.counts.created += 1;
                }
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => {
                    self.filling = None;
                    return true;
                }
            }
        }
    }

    /// The context of a session that ended: kept, clean, if it can be made
    /// clean and there is room; dropped (destroyed) otherwise. `poisoned`:
    /// the executor's contexts are unusable (a sticky error).
    pub fn give_back(&mut self, mut ctx: Box<dyn Context>, poisoned: bool) {
        if poisoned || self.spares.len() + self.draining.len() >= self.max_spares {
            return;
        }
        match ctx.recycle() {
            Ok(()) => self.spares.push(ctx),
            Err(Status::NotReady) if self.fixed => self.draining.push(ctx),
            Err(s) if self.fixed => {
                tracing::warn!("a context made ahead is lost: {s:?}");
            }
            Err(s) => tracing::debug!("a context is not reused: {s:?}"),
        }
    }

    /// Destroys the spares (the vGPU moves to another GPU, or the
    /// executor's contexts are unusable).
    pub fn clear(&mut self) {
        self.spares.clear();
        self.draining.clear();
        // Any still being made are dropped as they arrive.
        self.filling = None;
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
    use protocol::{Dim3, ImageKind};
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
        a.synchronize().unwrap();
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
        // Made ahead: as many as asked, and the next ones reuse them.
        pool.prefill(exec.as_mut(), 10).unwrap();
        assert_eq!(pool.spares(), 10);
        let before = pool.counts.created;
        let c = pool.take(exec.as_mut()).unwrap().unwrap();
        assert_eq!(pool.counts.created, before);
        pool.give_back(c, false);
        assert_eq!(pool.spares(), 10);
        let mut pool = ContextPool::default();
        // One whose process left work running (a 2 s kernel) is not kept.
        let mut busy = pool.take(exec.as_mut()).unwrap().unwrap();
        let m = busy
            .load_module(ImageKind::Ptx, crate::KERNELS_PTX.as_bytes())
            .unwrap();
        let (f, _) = busy.function(m, "spin_ns").unwrap();
        let one = Dim3 { x: 1, y: 1, z: 1 };
        let ns = 2_000_000_000u64.to_le_bytes();
        busy.launch(f, one, one, 0, 0, &ns).unwrap();
        pool.give_back(busy, false);
        assert_eq!(pool.spares(), 0);
    }

    /// An executor whose contexts take 30 ms to make.
    struct Slow(SimExecutor);

    impl Executor for Slow {
        fn info(&self) -> protocol::DeviceInfo {
            self.0.info()
        }
        fn open(&mut self) -> Result<Box<dyn Context>, Status> {
            std::thread::sleep(std::time::Duration::from_millis(30));
            self.0.open()
        }
    }

    #[test]
    fn new_contexts_are_rationed_by_the_time_they_take() {
        let mut exec = Slow(SimExecutor::new(SimParams::default()));
        // 10% of the time, bursts of 0.1 s: about three at once.
        let mut pool = ContextPool::new(0.1, 0.1);
        let mut held = Vec::new();
        while let Some(c) = pool.take(&mut exec).unwrap() {
            held.push(c);
            assert!(held.len() <= 4, "the burst is 0.1 s of 30 ms contexts");
        }
        assert!(held.len() >= 3, "{} made", held.len());
        assert_eq!(pool.counts.deferred, 1);
        // 0.4 s later the bucket has 40 ms again: one or two more.
        std::thread::sleep(std::time::Duration::from_millis(400));
        let mut more = 0;
        while pool.take(&mut exec).unwrap().is_some() {
            more += 1;
            assert!(more <= 2, "40 ms of budget made {more} contexts of 30 ms");
        }
        assert!(more >= 1, "the bucket refilled");
        let created = pool.counts.created;
        // A spare needs no budget.
        pool.give_back(held.pop().unwrap(), false);
        assert!(pool.take(&mut exec).unwrap().is_some());
        assert_eq!(pool.counts.created, created);
        assert_eq!(pool.counts.reused, 1);
        // On the sim, where making one takes microseconds, there is no limit
        // to speak of.
        let mut sim = ContextPool::default();
        let mut fast = SimExecutor::new(SimParams::default());
        for _ in 0..200 {
            assert!(sim.take(&mut fast).unwrap().is_some());
        }
    }

    #[test]
    fn contexts_made_ahead_are_all_there_is() {
        let mut exec = sim();
        let mut pool = ContextPool::default();
        pool.prefill(exec.as_mut(), 2).unwrap();
        assert_eq!(pool.spares(), 2);
        let a = pool.take(exec.as_mut()).unwrap().unwrap();
        let _b = pool.take(exec.as_mut()).unwrap().unwrap();
        // A third process at once is turned away, whatever the bucket holds.
        assert_eq!(
            pool.take(exec.as_mut()).err(),
            Some(Status::MpsMaxClientsReached)
        );
        assert_eq!(pool.counts.created, 2);
        // One ends: the next gets its context.
        pool.give_back(a, false);
        assert!(pool.take(exec.as_mut()).unwrap().is_some());
        assert_eq!(pool.counts.created, 2);
    }

    /// An executor that makes contexts on another thread too, each in
    /// 30 ms.
    struct Threaded;

    impl Executor for Threaded {
        fn info(&self) -> protocol::DeviceInfo {
            SimExecutor::new(SimParams::default()).info()
        }
        fn open(&mut self) -> Result<Box<dyn Context>, Status> {
            std::thread::sleep(std::time::Duration::from_millis(30));
            SimExecutor::new(SimParams::default()).open()
        }
        fn opener(&self) -> Option<crate::executor::Opener> {
            Some(Box::new(|| Threaded.open()))
        }
    }

    #[test]
    fn contexts_made_ahead_on_a_thread_come_as_they_are_made() {
        let mut exec = Threaded;
        let mut pool = ContextPool::default();
        let t = Instant::now();
        pool.prefill(&mut exec, 4).unwrap();
        assert!(
            t.elapsed().as_millis() < 90,
            "only the first is made before serving: {:?}",
            t.elapsed()
        );
        assert!(!pool.filled(), "three are still being made");
        let mut held = vec![pool.take(&mut exec).unwrap().unwrap()];
        // The next processes wait for theirs rather than being turned away.
        let t = Instant::now();
        while held.len() < 4 {
            match pool.take(&mut exec).unwrap() {
                Some(c) => held.push(c),
                None => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
            assert!(t.elapsed().as_secs() < 5, "the rest never came");
        }
        assert!(pool.filled());
        assert_eq!(pool.counts.created, 4);
        // Then it is as if all had been made at once: a fifth is turned away.
        assert_eq!(
            pool.take(&mut exec).err(),
            Some(Status::MpsMaxClientsReached)
        );
        pool.give_back(held.pop().unwrap(), false);
        assert!(pool.take(&mut exec).unwrap().is_some());
        assert_eq!(pool.counts.created, 4);
    }

    #[test]
    fn warm_contexts_come_first_and_more_are_made_after_them() {
        let mut exec = sim();
        let mut pool = ContextPool::default();
        pool.warm(exec.as_mut(), 1);
        assert_eq!(pool.counts.created, 1);
        let first = pool.take(exec.as_mut()).unwrap().unwrap();
        assert_eq!(
            pool.counts.reused, 1,
            "the warm one is handed out as a spare"
        );
        // Unlike contexts made ahead for MPS, the pool is not fixed: the
        // next process gets a new one.
        let second = pool.take(exec.as_mut()).unwrap();
        assert!(second.is_some());
        assert_eq!(pool.counts.created, 2);
        drop(first);
    }

    #[test]
    fn a_context_made_ahead_whose_work_still_runs_comes_back_when_done() {
        let mut exec = sim();
        let mut pool = ContextPool::default();
        pool.prefill(exec.as_mut(), 1).unwrap();
        // Its process ends with a 300 ms kernel still running.
        let mut busy = pool.take(exec.as_mut()).unwrap().unwrap();
        let m = busy
            .load_module(ImageKind::Ptx, crate::KERNELS_PTX.as_bytes())
            .unwrap();
        let (f, _) = busy.function(m, "spin_ns").unwrap();
        let one = Dim3 { x: 1, y: 1, z: 1 };
        busy.launch(f, one, one, 0, 0, &300_000_000u64.to_le_bytes())
            .unwrap();
        pool.give_back(busy, false);
        assert_eq!(pool.spares(), 0);
        assert_eq!(
            pool.take(exec.as_mut()).err(),
            Some(Status::MpsMaxClientsReached),
            "its kernel still runs"
        );
        let t = Instant::now();
        loop {
            match pool.take(exec.as_mut()) {
                Ok(Some(_)) => break,
                Err(s) if s == Status::MpsMaxClientsReached => {}
                other => panic!("{:?}", other.map(|c| c.is_some())),
            }
            assert!(t.elapsed().as_secs() < 10, "never came back");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(pool.counts.created, 1, "no context made after");
    }
}
