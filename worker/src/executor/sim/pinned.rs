//! The pinned pool as the model's device sees it: the pool's range and
//! the blocks this worker registered. As on a GPU, the device reaches a
//! block of the pool only while this worker has it registered: a device
//! access to any other part of the pool (another worker's block, a block
//! freed, a page never handed out) fails. The model is stricter than a
//! GPU in one way: its copies to and from the pool need the block
//! registered too (a GPU would copy through a staging buffer), so that a
//! worker that forgot to register a block is caught.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use protocol::Status;
use vm_memory::VolatileSlice;

#[derive(Debug, Default)]
struct Registered {
    /// The pool's range, `(start, length)` (length 0: none).
    pool: (u64, u64),
    /// Whether the whole pool is registered (`register_pinned`).
    whole: bool,
    /// Blocks registered one by one: start -> length.
    blocks: BTreeMap<u64, u64>,
}

/// What the executor and the contexts it opens share of the pool. A clone
/// of the executor is another worker (see `SimExecutor`): its clone of
/// this starts with nothing registered.
#[derive(Debug, Default)]
pub(super) struct Pinned(Arc<Mutex<Registered>>);

impl Clone for Pinned {
    fn clone(&self) -> Self {
        let pool = self.lock().pool;
        Pinned(Arc::new(Mutex::new(Registered {
            pool,
            ..Default::default()
        })))
    }
}

fn range(s: &VolatileSlice<'_>) -> (u64, u64) {
    (s.ptr_guard().as_ptr() as u64, s.len() as u64)
}

impl Pinned {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registered> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The same registrations, for a context of this executor.
    pub fn share(&self) -> Pinned {
        Pinned(self.0.clone())
    }

    /// The pool is `pool`; `whole`: all of it registered now.
    pub fn set_pool(&self, pool: &VolatileSlice<'_>, whole: bool) {
        let mut r = self.lock();
        r.pool = range(pool);
        r.whole = whole;
    }

    /// Registers `block`, a range of the pool not registered yet.
    pub fn register(&self, block: &VolatileSlice<'_>) -> Result<(), Status> {
        let (start, len) = range(block);
        let mut r = self.lock();
        let (pool, pool_len) = r.pool;
        let end = start.checked_add(len).ok_or(Status::InvalidValue)?;
        if len == 0 || start < pool || end > pool + pool_len {
            return Err(Status::InvalidValue);
        }
        let overlaps = r
            .blocks
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > start);
        if overlaps {
            // As the driver's CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED.
            return Err(Status::InvalidValue);
        }
        r.blocks.insert(start, len);
        Ok(())
    }

    /// Unregisters `block`, registered as it is.
    pub fn unregister(&self, block: &VolatileSlice<'_>) -> Result<(), Status> {
        let (start, len) = range(block);
        let mut r = self.lock();
        match r.blocks.get(&start) {
            Some(&l) if l == len => {
                r.blocks.remove(&start);
                Ok(())
            }
            _ => Err(Status::InvalidValue),
        }
    }

    /// Whether `[ptr, ptr + len)` touches the pool, and if so whether the
    /// device reaches all of it: `None` outside the pool, `Some(Ok)` in a
    /// registered block, `Some(Err(IllegalAddress))` anywhere else in it.
    pub fn reach(&self, ptr: u64, len: u64) -> Option<Result<(), Status>> {
        let r = self.lock();
        let (pool, pool_len) = r.pool;
        let end = ptr.saturating_add(len);
        if pool_len == 0 || end <= pool || ptr >= pool + pool_len {
            return None;
        }
        let inside = ptr >= pool && end <= pool + pool_len;
        let registered = r.whole
            || r.blocks
                .range(..=ptr)
                .next_back()
                .is_some_and(|(&s, &l)| end <= s + l);
        Some(if inside && registered {
            Ok(())
        } else {
            Err(Status::IllegalAddress)
        })
    }

    /// As [`Pinned::reach`], for a host-side slice a copy uses.
    pub fn reach_slice(&self, s: &VolatileSlice<'_>) -> Result<(), Status> {
        let (ptr, len) = range(s);
        self.reach(ptr, len).unwrap_or(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use crate::executor::sim::{SimExecutor, SimParams};
    use crate::executor::Executor;
    use protocol::Status;
    use vm_memory::{Bytes, VolatileSlice};

    /// A device access to the pool is refused where this worker has not
    /// registered it (a page never handed out, a block freed, another
    /// worker's block) and passes the model's check in its own
    /// registered block.
    #[test]
    fn the_device_reaches_only_the_pool_blocks_this_worker_registered() {
        let mut pool = vec![0u8; 16 * 4096];
        let pool = VolatileSlice::from(&mut pool[..]);
        let base = pool.ptr_guard().as_ptr() as u64;
        let block = pool.subslice(4096, 8192).unwrap();
        let mut exec = SimExecutor::new(SimParams::default());
        let mut other = exec.clone();
        assert_eq!(exec.pinned_blocks(&pool), Ok(true));
        assert_eq!(other.pinned_blocks(&pool), Ok(true));
        let mut ctx = exec.open().unwrap();
        let dev = ctx.alloc(8192).unwrap();
        ctx.htod(dev, &VolatileSlice::from(&mut [7u8; 8192][..]), 0)
            .unwrap();
        // Nothing registered yet: neither copies nor a memset reach it.
        assert_eq!(ctx.htod(dev, &block, 0), Err(Status::IllegalAddress));
        assert_eq!(ctx.dtoh_async(&block, dev, 0), Err(Status::IllegalAddress));
        assert_eq!(
            ctx.memset(base + 4096, 1, 1, 16, 0),
            Err(Status::IllegalAddress)
        );
        exec.register_pinned_block(&block).unwrap();
        assert_eq!(
            exec.register_pinned_block(&pool.subslice(8192, 4096).unwrap()),
            Err(Status::InvalidValue),
            "registered already"
        );
        ctx.dtoh_async(&block, dev, 0).unwrap();
        assert_eq!(block.read_obj::<u8>(8191).unwrap(), 7, "the copy landed");
        ctx.htod(dev, &block, 0).unwrap();
        // The model's kernels do not write host memory, and say so.
        assert_eq!(
            ctx.memset(base + 4096, 1, 1, 16, 0),
            Err(Status::NotSupported)
        );
        // Past the block, another worker's clone of the device: refused.
        assert_eq!(
            ctx.memset(base + 8192, 1, 1, 8192, 0),
            Err(Status::IllegalAddress)
        );
        let mut theirs = other.open().unwrap();
        let d2 = theirs.alloc(8192).unwrap();
        assert_eq!(
            theirs.dtoh_async(&block, d2, 0),
            Err(Status::IllegalAddress)
        );
        assert_eq!(
            other.unregister_pinned_block(&block),
            Err(Status::InvalidValue)
        );
        exec.unregister_pinned_block(&block).unwrap();
        assert_eq!(ctx.dtoh_async(&block, dev, 0), Err(Status::IllegalAddress));
        // Registered whole (the fallback): every page is reached.
        exec.register_pinned(&pool).unwrap();
        ctx.dtoh_async(&pool.subslice(0, 8192).unwrap(), dev, 0)
            .unwrap();
    }
}
