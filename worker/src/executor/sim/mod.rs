//! `sim`: a CPU model of a non-preemptive GPU, for machines without one.
//!
//! Device memory lives in host RAM. Work runs in submission order on one
//! hardware queue shared by every context of the device: the results are
//! computed at submission, and the queue's clock advances by each operation's
//! modeled duration (copies at the configured bandwidth, kernels by their
//! size), so synchronizing waits as long as the modeled device would take.
//! Kernels are the entries of `kernels/fairvgpu.ptx`, implemented in Rust and
//! found by their PTX entry name.
//!
//! Here the model's parameters and the executor (one device of the shared
//! queue); `context.rs` a guest process's context, and each family trait of
//! `executor/` implemented in the file of its API family (`memory.rs` the
//! model's device memory and copies, `module.rs`, `launch.rs`, `stream.rs`,
//! `vmm.rs`, `graphs.rs`, `arrays.rs`, `migrate.rs`), `addresses.rs` the
//! device addresses it hands out, `pinned.rs` the pinned pool's blocks it
//! reaches, `kernels.rs` the kernels, `attributes.rs`
//! the device attributes it reports.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::{DeviceInfo, Status};
use vm_memory::VolatileSlice;

use super::{Context, Executor};

mod addresses;
mod arrays;
mod attributes;
mod bytes;
mod checkpoint;
mod context;
mod graphs;
mod kernels;
mod launch;
mod memory;
mod migrate;
mod module;
mod pinned;
mod stream;
mod vmm;

use context::SimContext;

/// Parameters of the model (in host.toml's `[sim]`; keys left out keep
/// their defaults).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimParams {
    /// Device memory in bytes.
    pub memory: u64,
    /// Host<->device copy bandwidth, GB/s.
    pub copy_gbps: f64,
    /// Device memory bandwidth for kernels, GB/s.
    pub mem_gbps: f64,
    /// Fixed cost of every operation, ns.
    pub op_ns: u64,
    /// Number of simulated GPUs (migration targets), each with its own
    /// queue and `memory`.
    #[serde(default = "one_gpu")]
    pub gpus: u32,
    /// A simulated GPU without generic compression (its attribute 107 is
    /// 0, compressible memory asked of it is made plain): a migration of
    /// compressible memory to it is refused. Every other GPU has it.
    pub no_compression_gpu: Option<u32>,
}

fn one_gpu() -> u32 {
    1
}

impl SimParams {
    /// Whether simulated GPU `device` makes compressible memory.
    pub fn compresses(&self, device: u32) -> bool {
        self.no_compression_gpu != Some(device)
    }
}

impl Default for SimParams {
    fn default() -> Self {
        SimParams {
            memory: 16 << 30,
            copy_gbps: 25.0,
            mem_gbps: 2000.0,
            op_ns: 2_000,
            gpus: 1,
            no_compression_gpu: None,
        }
    }
}

/// The single in-order hardware queue.
#[derive(Debug)]
struct Queue {
    busy_until: Instant,
    /// Device time of everything ever submitted, every context's (ns): what
    /// a context's busy period waited behind others' work (`launch.rs`).
    total_ns: u64,
}

impl Queue {
    /// Enqueues an operation of `ns`; returns when it completes.
    fn submit(&mut self, ns: u64) -> Instant {
        let start = self.busy_until.max(Instant::now());
        self.busy_until = start + Duration::from_nanos(ns);
        self.total_ns += ns;
        self.busy_until
    }
}

/// The simulated device. Clones share the device (its queue and address
/// space): several workers on one GPU.
///
/// Like a real GPU, a kernel that touches memory outside its context's
/// allocations faults with `IllegalAddress`, and that error is sticky: every
/// later call of every context opened from this executor (one worker
/// process) fails the same way, until a new executor is made.
#[derive(Debug, Clone)]
pub struct SimExecutor {
    params: SimParams,
    queues: Arc<Vec<Mutex<Queue>>>,
    device: u32,
    addresses: Arc<Mutex<addresses::Addresses>>,
    poisoned: Arc<std::sync::atomic::AtomicU32>,
    /// The pinned pool and what this worker registered of it.
    pinned: pinned::Pinned,
}

impl SimExecutor {
    /// A device with these parameters.
    pub fn new(params: SimParams) -> Self {
        SimExecutor {
            params,
            queues: Arc::new(
                (0..params.gpus.max(1))
                    .map(|_| {
                        Mutex::new(Queue {
                            busy_until: Instant::now(),
                            total_ns: 0,
                        })
                    })
                    .collect(),
            ),
            device: 0,
            addresses: Arc::default(),
            poisoned: Arc::default(),
            pinned: pinned::Pinned::default(),
        }
    }
}

impl Executor for SimExecutor {
    fn register_pinned(&mut self, pool: &VolatileSlice<'_>) -> Result<u64, Status> {
        self.pinned.set_pool(pool, true);
        Ok(pool.ptr_guard().as_ptr() as u64)
    }

    /// The model reaches registered host memory at its host address, as
    /// an H100 does.
    fn pinned_blocks(&mut self, pool: &VolatileSlice<'_>) -> Result<bool, Status> {
        self.pinned.set_pool(pool, false);
        Ok(true)
    }

    fn register_pinned_block(&mut self, block: &VolatileSlice<'_>) -> Result<(), Status> {
        self.pinned.register(block)
    }

    fn unregister_pinned_block(&mut self, block: &VolatileSlice<'_>) -> Result<(), Status> {
        self.pinned.unregister(block)
    }

    fn devices(&self) -> u32 {
        // One queue per GPU of a u32 count (`[sim] gpus`).
        u32::try_from(self.queues.len()).unwrap_or(u32::MAX)
    }

    fn device(&self) -> u32 {
        self.device
    }

    fn set_device(&mut self, device: u32) -> Result<(), Status> {
        if device as usize >= self.queues.len() {
            return Err(Status::InvalidValue);
        }
        self.device = device;
        Ok(())
    }

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: "fairvgpu sim GPU".into(),
            total_mem: self.params.memory,
            cc: (9, 0),
            sm_count: 132,
            attributes: attributes::H100
                .iter()
                .map(|&(a, v)| match a {
                    attributes::GENERIC_COMPRESSION_SUPPORTED => {
                        (a, i32::from(self.params.compresses(self.device)))
                    }
                    _ => (a, v),
                })
                .collect(),
            driver_version: SIM_DRIVER_RELEASE.into(),
            cuda_version: 13000,
            ..Default::default()
        }
    }

    fn open(&mut self) -> Result<Box<dyn Context>, Status> {
        Ok(Box::new(self.open_sim()?))
    }
}

/// The driver release the sim reports as its host's: a real 580 release
/// (CUDA 13.0), the branch the stand-ins mirror.
pub const SIM_DRIVER_RELEASE: &str = "580.65.06";

impl SimExecutor {
    /// A context of the model; after a kernel fault none can be made, as
    /// on a GPU (the process must be replaced).
    fn open_sim(&mut self) -> Result<SimContext, Status> {
        match self.poisoned.load(std::sync::atomic::Ordering::Relaxed) {
            0 => {}
            code => return Err(Status::from_code(code)),
        }
        Ok(SimContext {
            params: self.params,
            queues: self.queues.clone(),
            device: self.device,
            addresses: self.addresses.clone(),
            pinned: self.pinned.share(),
            poisoned: self.poisoned.clone(),
            printed: Default::default(),
            mem: BTreeMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            function_of: HashMap::new(),
            func_attrs: HashMap::new(),
            stream_attrs: HashMap::new(),
            events: HashMap::new(),
            event_pages: HashMap::new(),
            streams: HashMap::new(),
            limits: HashMap::new(),
            marks: HashMap::new(),
            next_handle: 1,
            last_done: Instant::now(),
            timings: Vec::new(),
            slice_ns: HashMap::new(),
            staged: Default::default(),
            period: None,
            period_seen: 0,
            period_others: 0,
            imports: BTreeMap::new(),
            vmm_phys: HashMap::new(),
            vmm_compressed: HashMap::new(),
            vmm_maps: BTreeMap::new(),
            graphs: Default::default(),
            arrays: Default::default(),
        })
    }
}
