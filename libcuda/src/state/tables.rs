//! The memory pools and libraries that [`super::Objects`] holds: defined
//! here, below the families, so that the state module names no family. The
//! logic that changes them stays in the family each section names.

use std::collections::HashMap;
use std::ffi::c_int;

use protocol::ImageKind;

// Memory pools and stream-ordered allocations (`mem_pool.rs`).

/// A pool: its settable attributes, and what is allocated from it.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    /// REUSE_FOLLOW_EVENT_DEPENDENCIES, REUSE_ALLOW_OPPORTUNISTIC,
    /// REUSE_ALLOW_INTERNAL_DEPENDENCIES.
    pub reuse: [c_int; 3],
    pub release_threshold: u64,
    pub used: u64,
    pub used_high: u64,
    /// `CUmemPoolProps::handleTypes`.
    pub handle_types: c_int,
    /// The host's token for it once exported (0: not exported).
    pub export: u64,
    /// The token of another process's pool this one imports (0: a pool
    /// of this process).
    pub imported: u64,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            reuse: [1, 1, 1],
            release_threshold: 0,
            used: 0,
            used_high: 0,
            handle_types: 0,
            export: 0,
            imported: 0,
        }
    }
}

/// The pools: by handle, the device's current one, and which pool each
/// stream-ordered allocation came from.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    pub pools: HashMap<usize, Pool>,
    pub default: usize,
    pub current: usize,
    pub of: HashMap<u64, (usize, u64)>,
    /// Pointers imported from other processes' pools: start -> imports.
    pub imported_ptrs: HashMap<u64, u32>,
}

impl Pools {
    /// The device's default pool, made on first use.
    pub fn default_pool(&mut self) -> usize {
        if self.default == 0 {
            let h = Box::into_raw(Box::new(0u8)) as usize;
            self.pools.insert(h, Pool::default());
            self.default = h;
        }
        self.default
    }

    pub fn current(&mut self) -> usize {
        if self.current == 0 {
            self.current = self.default_pool();
        }
        self.current
    }

    /// Forgets what a freed allocation took from its pool (if it came from one).
    pub fn freed(&mut self, ptr: u64) {
        if let Some((pool, size)) = self.of.remove(&ptr) {
            if let Some(pl) = self.pools.get_mut(&pool) {
                pl.used = pl.used.saturating_sub(size);
            }
        }
    }
}

// Libraries (`module.rs`).

/// A library's image: the caller's bytes, which it keeps alive until the
/// library is unloaded (`CU_LIBRARY_BINARY_IS_PRESERVED`), or our copy.
#[derive(Debug)]
pub(crate) enum Image {
    Preserved { start: usize, len: usize },
    Copied(Vec<u8>),
}

/// A library: its image, and its module on the host once loaded.
#[derive(Debug)]
pub(crate) struct Library {
    pub kind: ImageKind,
    pub image: Image,
    pub module: Option<u64>,
}
