//! The `StreamAttributes` family of [`super::Context`]: attributes of streams
//! (`cuStreamSetAttribute`, `cuStreamGetAttribute`).

use protocol::stream_attr::StreamAttr;
use protocol::Status;

use super::Handle;

/// Attributes of streams (`cuStreamSetAttribute`, `cuStreamGetAttribute`).
pub trait StreamAttributes {
    /// Sets an attribute of a stream (0: the default stream); every kernel
    /// launched into it after runs with it, as natively.
    fn stream_set_attribute(&mut self, stream: Handle, attr: StreamAttr) -> Result<(), Status>;
    /// A stream's attribute `id` (one of `stream_attr::id::ALL`).
    fn stream_attribute(&mut self, stream: Handle, id: u32) -> Result<StreamAttr, Status>;
}
