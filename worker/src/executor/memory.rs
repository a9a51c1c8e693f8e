//! The `Memory` family of [`super::Context`]: device memory of a context: allocations and copies
//! (the guest's `cuMemAlloc`, `cuMemcpy*`, `cuMemset*`).

use protocol::Status;
use vm_memory::VolatileSlice;

use super::Handle;

/// Device memory of a context: allocations and copies (the guest's `cuMemAlloc`, `cuMemcpy*`,
/// `cuMemset*`).
pub trait Memory {
    /// Allocates `size` bytes; returns the device address.
    fn alloc(&mut self, size: u64) -> Result<u64, Status>;
    /// Device memory an allocation of `size` bytes takes (the allocator's
    /// granularity included), counted against the vGPU's limit.
    fn footprint(&self, size: u64) -> u64 {
        size
    }
    /// Frees an allocation made by `alloc` (the worker checked it).
    fn free(&mut self, ptr: u64) -> Result<(), Status>;
    /// Copies `src` (in the request arena) to device address `dst`.
    fn htod(&mut self, dst: u64, src: &VolatileSlice<'_>, stream: Handle) -> Result<(), Status>;
    /// Copies device bytes into `dst` (in the response arena) now, and
    /// returns when they are there. The worker calls it once the work
    /// submitted to `stream` before the copy has completed (a `Marker`),
    /// and the copy must not wait for work submitted since.
    fn dtoh(&mut self, dst: &VolatileSlice<'_>, src: u64, stream: Handle) -> Result<(), Status>;
    /// Copies device bytes into `dst` (pinned memory) when `stream` gets
    /// there; returns at once.
    fn dtoh_async(
        &mut self,
        dst: &VolatileSlice<'_>,
        src: u64,
        stream: Handle,
    ) -> Result<(), Status>;
    /// Device-to-device copy.
    fn dtod(&mut self, dst: u64, src: u64, len: u64, stream: Handle) -> Result<(), Status>;
    /// Fills `count` elements of `width` bytes.
    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        width: u32,
        count: u64,
        stream: Handle,
    ) -> Result<(), Status>;
}
