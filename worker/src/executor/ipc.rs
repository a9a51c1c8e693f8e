//! The `Ipc` family of [`super::Context`]: memory one context of a worker shares with another (IPC
//! between processes of one VM, `session/ipc.rs`).

use std::sync::Arc;

use protocol::Status;

/// What one context hands another of the same worker so that it reaches
/// memory of the first (IPC between processes of one VM, see
/// `session/ipc.rs`): nothing on a GPU, where every context of a process
/// reaches every device address; the bytes themselves in the sim model.
#[derive(Clone, Default)]
pub struct SharedMem(pub Option<Arc<dyn std::any::Any + Send + Sync>>);

impl std::fmt::Debug for SharedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "SharedMem(bytes)"
        } else {
            "SharedMem"
        })
    }
}

/// Memory one context of a worker shares with another (IPC between processes of one VM,
/// `session/ipc.rs`).
pub trait Ipc {
    /// What another context of this worker needs to reach `[base, base +
    /// size)`, the start of an allocation or a mapping of this one (the
    /// worker checked that it is).
    fn share_mem(&mut self, base: u64, size: u64) -> Result<SharedMem, Status> {
        let _ = (base, size);
        Ok(SharedMem::default())
    }
    /// Makes `size` bytes at `base` that another context shared
    /// ([`Self::share_mem`]) reachable from this one.
    fn import_mem(&mut self, base: u64, size: u64, mem: &SharedMem) -> Result<(), Status> {
        let _ = (base, size, mem);
        Ok(())
    }
    /// Forgets memory imported at `base`.
    fn close_mem(&mut self, base: u64) {
        let _ = base;
    }
}
