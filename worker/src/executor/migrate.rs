//! The `Migration` family of [`super::Context`]: moving a context to another GPU of the worker.

use protocol::Status;

use super::Keeper;

/// What one context's migration did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// Device bytes copied to the target.
    pub bytes: u64,
    /// Allocations remapped at their old addresses.
    pub allocations: u64,
}

/// What a context's migration prepared ahead (on another thread).
pub type Prepared = Box<dyn std::any::Any + Send>;

/// Preparation of a migration, run on a helper thread while the guest goes on.
pub type PrepareJob = Box<dyn FnOnce() -> Result<Prepared, Status> + Send>;

/// Moving a context to another GPU of the worker.
pub trait Migration {
    /// Moves the context to GPU `device` at a kernel boundary: waits for its
    /// work, copies its memory there, and maps it at the same device
    /// addresses (pointers the guest holds, and pointers stored in device
    /// memory, stay valid); its streams, events and modules move with it
    /// under the same handles. On failure it stays where it was.
    fn migrate(&mut self, _device: u32, _prepared: Option<Prepared>) -> Result<Moved, Status> {
        Err(Status::NotSupported)
    }
    /// Work of a migration to `device` that can be done ahead, on another
    /// thread, while the guest still runs here (on a real GPU: the target's
    /// context, modules, streams and events). Its result goes to
    /// [`Self::migrate`]; `None`: nothing to do ahead.
    fn prepare_migration(&self, _device: u32) -> Option<PrepareJob> {
        None
    }
    /// The object that keeps this context on its GPU, if one does: a
    /// migration is refused before anything moves, naming it.
    fn migration_keeper(&self) -> Option<Keeper> {
        None
    }
    /// The object that keeps this context from moving to GPU `target` in
    /// particular (memory with a property that GPU cannot give), or
    /// whatever keeps it on its GPU.
    fn migration_keeper_to(&self, _target: u32) -> Option<Keeper> {
        self.migration_keeper()
    }
}
