//! `cuda`: the CUDA driver API through `cudarc`'s dynamically loaded bindings,
//! so the binary starts on machines without CUDA and fails with a clear
//! message only when a GPU is asked for.
//!
//! One CUDA context per guest process (`Context`), created on the worker's
//! GPU; destroying it frees everything the guest held. The worker calls from
//! one thread, and every entry point makes its context current first.
//! Every `unsafe` block here is a driver call whose pointer arguments are
//! either out-parameters on our stack or ranges the worker validated.
//!
//! One file per family of the driver API, each implementing its family's
//! trait of `executor/` for the context: `device` (the driver, GPUs, the
//! executor), `context` (a guest process's context and its objects;
//! `Limits`), `memory` (`Memory`, `Ipc`), `module`, `launch` (with `batch`: runs as
//! graph launches), `graph` (the guest's own graphs, built here), `timing`,
//! `stream` (streams, events, marks), `vmm`, `migrate` (with `globals`: the
//! module globals a guest holds, found at their old addresses after a move),
//! `tensor_map`, `arrays` (CUDA arrays, texture and surface objects).

use cudarc::driver::sys::CUresult;
use protocol::Status;

mod arrays;
mod batch;
mod checkpoint;
mod conditional;
mod context;
mod device;
mod globals;
mod graph;
mod ipc;
mod launch;
mod memory;
mod migrate;
mod module;
mod staged;
mod stream;
mod stream_attrs;
mod tensor_map;
mod timing;
mod vmm;
mod window;

pub use device::{
    available, device_count, device_facts, device_memory, device_preemptive, open, peer_bandwidth,
    CudaError, CudaExecutor,
};

fn check(r: CUresult) -> Result<(), Status> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Status::from_code(r as u32))
    }
}
