//! The vGPU's pinned pool as this process maps it, held by
//! [`super::Driver`], and its blocks, held in [`super::Objects`]: defined
//! here, below the families, so that the state module names none. The
//! logic that hands blocks out and answers for them is `host_memory.rs`'s.

use std::collections::BTreeMap;
use std::ffi::c_uint;

use transport::shm::FixedMapping;

/// The pool as this process sees it.
#[derive(Debug)]
pub(crate) struct Pool {
    /// Where the pool's first byte is in this process.
    pub host: u64,
    /// Where the device reaches it.
    pub dev: u64,
    pub size: u64,
    /// The mapping at the device address (when it could be made there).
    _at_device: Option<FixedMapping>,
    /// The region, to map pool pages over registered memory.
    pub region: transport::Region,
}

impl Pool {
    /// Maps the pool of `region`, whose device address is `dev`.
    pub fn map(region: &transport::Region, size: u64, dev: u64) -> Option<Pool> {
        if size == 0 {
            return None;
        }
        let m = region.map_pinned_at(dev as usize).ok()?;
        let host = m.addr() as u64;
        if host != dev {
            crate::log_once(&format!(
                "the pinned pool could not be mapped at its device address {dev:#x}; pinned \
                 pointers differ from their device addresses and managed memory is not available"
            ));
        }
        Some(Pool {
            host,
            dev,
            size,
            _at_device: Some(m),
            region: region.clone(),
        })
    }

    /// Whether pinned pointers are their own device addresses.
    pub fn identity(&self) -> bool {
        self.host == self.dev
    }
}

/// What a block of the pool is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `cuMemHostAlloc`/`cuMemAllocHost`, with its flags.
    Alloc(c_uint),
    /// `cuMemHostRegister` of the program's `[start, start + len)`.
    Registered { start: u64, len: u64, flags: c_uint },
    /// `cuMemAllocManaged`.
    Managed,
}

/// A block of the pool the process holds, by the address it has in the
/// process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub len: u64,
    /// Its offset in the pool.
    pub offset: u64,
    pub kind: Kind,
}

/// The blocks, by address in the process.
pub(crate) type Blocks = BTreeMap<u64, Block>;

/// What page-locked memory beyond the pool is (`host_spill.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spill {
    /// `cuMemHostAlloc`/`cuMemAllocHost`: memory of the process's own.
    Alloc,
    /// `cuMemHostRegister`: the program's pages, left as they are.
    Registered,
}

/// Page-locked memory beyond the pool, by its start in the process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spilled {
    pub len: u64,
    pub flags: c_uint,
    pub kind: Spill,
}
