//! The `Limits` family of [`super::Context`]: a context's own settings: its limits, and making it
//! as new for a later process.

use protocol::Status;

/// A context's own settings: its limits, and making it as new for a later process.
pub trait Limits {
    /// A limit of the context (`CUlimit`, already range-checked).
    fn limit(&mut self, limit: u32) -> Result<u64, Status>;
    /// Sets a limit of the context.
    fn set_limit(&mut self, limit: u32, value: u64) -> Result<(), Status>;
    /// Makes the context as a new one is, for a later process of the same
    /// vGPU (see `serve/contexts.rs`): if none of its work is left, destroys
    /// every object it holds, gives every allocation back to the driver,
    /// and sets what the process may have changed (limits) back to a new
    /// context's values. An error: it cannot be made clean (work still
    /// running, a sticky error) and the caller drops it.
    fn recycle(&mut self) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
}
