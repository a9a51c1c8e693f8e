//! The fairvgpu host: daemon, per-vGPU workers, executors, benches.

#![warn(missing_docs)]

pub mod bench;
