//! The `Streams` family of [`super::Context`]: streams, whole-context synchronization, and marks:
//! how the worker waits for the device without blocking its other guests.

use protocol::Status;

use super::Handle;

/// A point in a context's work (see [`Streams::mark`]).
pub type Marker = u64;

/// Streams, whole-context synchronization, and marks: how the worker waits for the device without
/// blocking its other guests.
pub trait Streams {
    /// Creates a stream with a priority (clamped to the device's range).
    fn stream_create(&mut self, flags: u32, priority: i32) -> Result<Handle, Status>;
    /// Makes `stream`'s later work wait for `event`'s last record.
    fn stream_wait_event(
        &mut self,
        stream: Handle,
        event: Handle,
        flags: u32,
    ) -> Result<(), Status>;
    /// Destroys a stream.
    fn stream_destroy(&mut self, stream: Handle) -> Result<(), Status>;
    /// Waits for a stream (0: the default stream).
    fn stream_synchronize(&mut self, stream: Handle) -> Result<(), Status>;
    /// Whether a stream is idle.
    fn stream_query(&mut self, stream: Handle) -> Result<bool, Status>;
    /// Waits for all work of this context.
    fn synchronize(&mut self) -> Result<(), Status>;
    /// Marks the point after the work submitted so far to `stream` (`None`:
    /// to every stream of the context), for [`Self::reached`]: how the
    /// worker waits for the device without blocking its other guests.
    fn mark(&mut self, stream: Option<Handle>) -> Result<Marker, Status>;
    /// Whether the device has passed mark `m` (an error: the work before it
    /// failed). A mark reached, or failed, is forgotten.
    fn reached(&mut self, m: Marker) -> Result<bool, Status>;
    /// Lets a mark go unreached.
    fn forget(&mut self, m: Marker);
}
