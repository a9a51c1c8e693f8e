//! `libcuda.so.1` for guests: the CUDA driver API, each call forwarded to
//! the vGPU through [`guest::Gpu`].
//!
//! Every symbol the real driver exports is exported here
//! (`data/entry_points.tsv`, checked against `data/driver-580-exports.txt`
//! by a test). The entry points we serve live in one module per API family;
//! `build.rs` makes an exported stub for every other one (it answers
//! `CUDA_ERROR_NOT_SUPPORTED` and logs its name once) and the table
//! `cuGetProcAddress` looks names up in, with the driver's version rules.
//!
//! | family | module |
//! | --- | --- |
//! | initialization, devices, versions, errors | [`device`] |
//! | contexts, primary contexts | [`context`] |
//! | device memory, copies, memsets, pointer attributes | [`memory`] |
//! | 2D and 3D copies | `copy_nd` |
//! | graphs, stream capture, executable graphs | [`graph`] |
//! | stream-ordered allocation, memory pools | [`mem_pool`] |
//! | modules, libraries, kernels, the linker | [`module`] |
//! | launches, function attributes, occupancy | [`launch`] |
//! | peer access and peer copies (one device: copies within it) | [`peer`] |
//! | streams, events | [`stream`] |
//! | host functions, stream callbacks | [`host_fn`] |
//! | page-locked and registered host memory, managed memory from the pool | [`host_memory`] |
//! | managed memory on the device, migrating on touch | [`managed`] |
//! | `cuGetProcAddress` | [`proc_address`] |
//! | tensor-map descriptors | [`tensor_map`] |
//! | profiler controls (no-ops) | [`profiler`] |
//! | virtual memory management (reservations, cuMemCreate, cuMemMap) | [`vmm`] |
//! | `cuGetExportTable`: the runtime's private interface | [`export_table`] |
//!
//! Handles and pointers use `cudarc`'s generated types, so the ABI is the
//! driver's. Enum-typed arguments and results travel as plain integers: a C
//! caller may pass any value, and a Rust enum must never hold an undeclared
//! one. Answers that cannot change (device count, name, attributes,
//! versions, error strings, the current context) are given here without a
//! round trip.
//!
//! The vGPU is found as [`guest::Gpu::from_env`] says: in a VM, the
//! kernel module's `/dev/fairvgpu0` (or `FAIRVGPU_DEVICE`); on the host
//! itself and in tests, `FAIRVGPU_SOCKET` (the vGPU's ivshmem-server socket).
//!
//! Every exported function catches panics (nothing may unwind into C) and
//! checks every pointer it is given for null.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

#[macro_use]
mod export;
mod alloc;
pub mod copy_nd;
mod image;
mod reserve;
mod shareable;
mod state;

pub mod arrays;
pub mod context;
pub mod device;
pub mod export_table;
pub mod graph;
pub mod host_fn;
pub mod host_memory;
mod host_spill;
pub mod ipc;
pub mod launch;
pub mod managed;
pub mod mem_pool;
pub mod memory;
pub mod module;
pub mod peer;
pub mod proc_address;
pub mod profiler;
pub mod stream;
pub mod tensor_map;
pub mod vmm;

use std::ffi::c_uint;

pub(crate) use state::log::{log_once, not_supported, trace};

/// `CUresult` as the C ABI carries it.
pub type CuResult = c_uint;

/// The `CUresult` codes this library answers with itself.
pub(crate) mod code {
    #![allow(missing_docs, dead_code)]
    use super::CuResult;
    pub const SUCCESS: CuResult = 0;
    pub const INVALID_VALUE: CuResult = 1;
    pub const OUT_OF_MEMORY: CuResult = 2;
    pub const NOT_INITIALIZED: CuResult = 3;
    pub const DEINITIALIZED: CuResult = 4;
    pub const NO_DEVICE: CuResult = 100;
    pub const INVALID_DEVICE: CuResult = 101;
    pub const INVALID_IMAGE: CuResult = 200;
    pub const INVALID_CONTEXT: CuResult = 201;
    pub const CONTEXT_ALREADY_CURRENT: CuResult = 202;
    pub const CONTEXT_ALREADY_IN_USE: CuResult = 216;
    pub const PEER_ACCESS_UNSUPPORTED: CuResult = 217;
    pub const FILE_NOT_FOUND: CuResult = 301;
    pub const INVALID_HANDLE: CuResult = 400;
    pub const NOT_FOUND: CuResult = 500;
    pub const NOT_READY: CuResult = 600;
    pub const PEER_ACCESS_ALREADY_ENABLED: CuResult = 704;
    pub const PEER_ACCESS_NOT_ENABLED: CuResult = 705;
    pub const PRIMARY_CONTEXT_ACTIVE: CuResult = 708;
    pub const HOST_MEMORY_ALREADY_REGISTERED: CuResult = 712;
    pub const HOST_MEMORY_NOT_REGISTERED: CuResult = 713;
    /// The vGPU's host worker restarted and the process's GPU state is gone
    /// (as after a sticky error on a real GPU, the program must start again).
    pub const CONTEXT_IS_DESTROYED: CuResult = 709;
    pub const NOT_PERMITTED: CuResult = 800;
    pub const NOT_SUPPORTED: CuResult = 801;
    pub const UNKNOWN: CuResult = 999;
}

/// `CUmemorytype`.
#[allow(dead_code)]
pub(crate) mod memtype {
    pub const HOST: u32 = 1;
    pub const DEVICE: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const UNIFIED: u32 = 4;
}

/// The CUDA version this library reports (13.0).
pub(crate) const DRIVER_VERSION: i32 = guest::CUDA_DRIVER_VERSION;

/// The highest stream priority (numerically lowest) a vGPU offers.
pub(crate) const GREATEST_PRIORITY: std::ffi::c_int = -5;

/// Runs an entry point's body: its `Err` is the call's `CUresult`, and a
/// panic (a bug here) becomes `CUDA_ERROR_UNKNOWN` instead of unwinding
/// into C.
pub(crate) fn entry(f: impl FnOnce() -> Result<(), CuResult>) -> CuResult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => code::UNKNOWN,
    }
}

/// What every entry point that no module serves answers.
pub(crate) fn unserved(symbol: &str) -> CuResult {
    not_supported(symbol)
}

/// Exported stubs for the symbols no module serves (made by `build.rs`).
pub mod unserved_stubs {
    include!(concat!(env!("OUT_DIR"), "/unserved.rs"));
}
