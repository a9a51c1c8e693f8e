//! The `Events` family of [`super::Context`]: events, and events shared between contexts of a
//! worker (IPC event handles).

use protocol::Status;

use super::{Handle, SharedMem};

/// Events, and events shared between contexts of a worker (IPC event handles).
pub trait Events {
    /// Creates an event.
    fn event_create(&mut self, flags: u32) -> Result<Handle, Status>;
    /// Destroys an event.
    fn event_destroy(&mut self, event: Handle) -> Result<(), Status>;
    /// Records an event.
    fn event_record(&mut self, event: Handle, stream: Handle) -> Result<(), Status>;
    /// Waits for an event.
    fn event_synchronize(&mut self, event: Handle) -> Result<(), Status>;
    /// Whether an event completed.
    fn event_query(&mut self, event: Handle) -> Result<bool, Status>;
    /// Milliseconds between two events.
    fn event_elapsed(&mut self, start: Handle, end: Handle) -> Result<f32, Status>;
    /// What another context of this worker needs to use `event` of this
    /// one (an IPC event handle).
    fn share_event(&mut self, event: Handle) -> Result<SharedMem, Status>;
    /// An event of another context (shared by [`Self::share_event`])
    /// as a handle of this one: waited on, queried, synchronized and
    /// recorded as its own; [`Self::event_destroy`] forgets it (the
    /// owner destroys it).
    fn import_event(&mut self, shared: &SharedMem) -> Result<Handle, Status>;
}
