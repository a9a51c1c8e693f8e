//! The `Arrays` family of [`super::Context`]: the CUDA array family: arrays, copies to and from
//! them, texture and surface objects.

use protocol::Status;

use super::Handle;

/// A call of the CUDA array family (see [`Arrays::array_op`]), every
/// handle and range in it checked by the worker against the session
/// (`session/arrays.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayOp {
    /// Makes an array; the answer is its handle.
    Create(protocol::array::ArrayDesc),
    /// Destroys an array.
    Destroy(Handle),
    /// A box copy with an array at one end or both, in a stream's order.
    Copy(protocol::array::ArrayCopy, Handle),
    /// Makes a texture object; the answer is the device's object value.
    TexCreate(protocol::array::TexParams),
    /// Destroys a texture object.
    TexDestroy(u64),
    /// Makes a surface object over an array; the answer is its value.
    SurfCreate(Handle),
    /// Destroys a surface object.
    SurfDestroy(u64),
}

/// The CUDA array family: arrays, copies to and from them, texture and surface objects.
pub trait Arrays {
    /// Runs a call of the CUDA array family: arrays, copies to and from
    /// them, texture and surface objects (the answer: a handle or object
    /// value, 0 for the others). A context holding arrays or objects stays
    /// on its GPU.
    fn array_op(&mut self, op: ArrayOp) -> Result<u64, Status> {
        let _ = op;
        Err(Status::NotSupported)
    }
}
