//! Opcodes on the wire: one per row of the request table
//! (`request/table.rs`), and `DATA`; what the worker asks of an opcode
//! before it decodes the request.

pub use crate::request::table::codes::*;

/// A continuation chunk of the previous message's data.
pub const DATA: u32 = 100;

/// Whether a descriptor with this opcode puts work on the device, so that
/// the worker runs it only under the grant: a request with the table's
/// `device` flag, or a continuation chunk (of a host-to-device copy).
/// (A synchronize only marks where the work is and waits, parked, without
/// holding the GPU.)
pub fn needs_device(opcode: u32) -> bool {
    opcode == DATA || crate::request::table::needs_device(opcode)
}

/// Whether a request with this opcode returns only when the device work
/// before it is done (the table's `drains` flag).
pub fn drains_device(opcode: u32) -> bool {
    crate::request::table::drains_device(opcode)
}
