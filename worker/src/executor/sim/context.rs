//! A guest process's context on the model: what it holds, putting its work
//! on the device's queue, what its kernels printed, recycling it and its
//! limits. The `Context` trait is in `calls.rs`, each call passed to the
//! file of its API family (`memory`, `module`, `launch`, `stream`, `vmm`,
//! `graphs`, `arrays`, `migrate`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::stream_attr::StreamAttr;
use protocol::Status;

use super::kernels::Kernel;
use super::{Queue, SimParams};
use crate::executor::{Handle, Limits};
use crate::ptx;

pub(super) struct SimModule {
    /// The PTX it was loaded from (what a checkpoint carries).
    pub(super) text: String,
    pub(super) entries: ptx::Entries,
    /// The kernels' names in the text's order.
    pub(super) names: Vec<String>,
    /// Global variables: name -> (address, size), allocated at load.
    pub(super) globals: HashMap<String, (u64, u64)>,
}

/// A model event: when the device passes its last record (none yet: it
/// is complete).
pub(super) type SimEvent = std::sync::Arc<Mutex<Option<Instant>>>;

pub(super) struct SimContext {
    pub(super) params: SimParams,
    pub(super) queues: Arc<Vec<Mutex<Queue>>>,
    pub(super) device: u32,
    pub(super) addresses: Arc<Mutex<super::addresses::Addresses>>,
    /// The pinned pool's blocks the device reaches (the model's kernels
    /// do not write host memory, but are refused the rest of the pool as
    /// on a GPU).
    pub(super) pinned: super::pinned::Pinned,
    /// The sticky error that poisoned the device's contexts (0: none).
    pub(super) poisoned: Arc<std::sync::atomic::AtomicU32>,
    /// What the context's kernels printed and not yet written (as the
    /// driver's printf FIFO: written at a synchronize, to descriptor 1),
    /// and the assert messages (to descriptor 2).
    pub(super) printed: [Vec<u8>; 2],
    pub(super) mem: BTreeMap<u64, super::memory::Buf>,
    /// Memory of other contexts of the worker imported here (IPC): start
    /// -> (size, its bytes).
    pub(super) imports: BTreeMap<u64, (u64, super::memory::SharedBuf)>,
    pub(super) modules: HashMap<Handle, SimModule>,
    pub(super) functions: HashMap<Handle, (Kernel, Vec<u32>)>,
    /// The module and name each function was looked up by (what a
    /// checkpoint carries).
    pub(super) function_of: HashMap<Handle, (Handle, String)>,
    /// Function attributes set with `cuFuncSetAttribute`, by kernel.
    pub(super) func_attrs: HashMap<(Handle, u32), i32>,
    /// Events: when the device passes each one's last record (shared with
    /// contexts of the worker that opened it by IPC handle).
    pub(super) events: HashMap<Handle, SimEvent>,
    /// Events shared with another worker of the VM (IPC across process
    /// slots): a memfd word both map, the time of the last record as
    /// `CLOCK_MONOTONIC` nanoseconds (0: none), the truth for either.
    pub(super) event_pages: HashMap<Handle, super::bytes::Bytes>,
    pub(super) streams: HashMap<Handle, Instant>,
    /// Stream attributes set (and each stream's priority), by stream and
    /// `CUstreamAttrID`; unset ones read their defaults.
    pub(super) stream_attrs: HashMap<(Handle, u32), StreamAttr>,
    /// Context limits set (`CUlimit` -> value); unset ones read their defaults.
    pub(super) limits: HashMap<u32, u64>,
    /// Marks the worker waits on: when the queue passes each.
    pub(super) marks: HashMap<Handle, Instant>,
    pub(super) next_handle: Handle,
    pub(super) last_done: Instant,
    pub(super) timings: Vec<(Handle, u64)>,
    /// A sliced launch's whole time, by function (see `launch_slice`).
    pub(super) slice_ns: HashMap<Handle, u64>,
    /// The busy period being timed: when the queue reaches its start, and
    /// when its work ends (once ended).
    pub(super) period: Option<(Instant, Option<Instant>)>,
    /// Within the period: the queue's `total_ns` after this context's last
    /// submission, and the other contexts' work that ran between its
    /// operations since the period began (ns): not its own time.
    pub(super) period_seen: u64,
    pub(super) period_others: u64,
    /// Physical memory of the VMM API, by handle.
    pub(super) vmm_phys: HashMap<Handle, super::memory::Buf>,
    /// Compressible VMM memory, by handle: its compression type (`vmm.rs`).
    pub(super) vmm_compressed: HashMap<Handle, u8>,
    /// VMM mappings: start -> (size, handle, offset in its memory). Their
    /// addresses resolve to the handle's bytes.
    pub(super) vmm_maps: BTreeMap<u64, (u64, Handle, u64)>,
    /// Executable graphs and conditional scopes (`graphs.rs`).
    pub(super) graphs: super::graphs::SimGraphs,
    /// CUDA arrays, texture and surface objects (`arrays.rs`).
    pub(super) arrays: super::arrays::SimArrays,
    /// Module images staged ahead of a restore (`Checkpoint::stage`): the
    /// model parses them again when taken, but counts them as a GPU would.
    pub(super) staged: crate::executor::staged::Staged<()>,
}

impl SimContext {
    pub(super) fn handle(&mut self) -> Handle {
        self.next_handle += 1;
        self.next_handle
    }

    /// A new handle of the context's (for `graphs.rs`).
    pub(super) fn new_handle(&mut self) -> Handle {
        self.handle()
    }

    pub(super) fn submit(&mut self, ns: u64, stream: Handle) -> Instant {
        let ns = ns + self.params.op_ns;
        self.enqueue(stream, |q| q.submit(ns))
    }

    /// A zero-time marker on the queue (an event): when the device reaches
    /// it, after everything submitted before.
    pub(super) fn queue_mark(&mut self, stream: Handle) -> Instant {
        self.enqueue(stream, |q| q.busy_until.max(Instant::now()))
    }

    /// Puts something on the device's queue (`put` says when it completes)
    /// and notes that completion for the context and `stream`.
    pub(super) fn enqueue(
        &mut self,
        stream: Handle,
        put: impl FnOnce(&mut Queue) -> Instant,
    ) -> Instant {
        let mut q = self.queues[self.device as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if self.period.is_some() {
            // In order: what others queued since this context's last
            // operation runs before this one.
            self.period_others += q.total_ns.saturating_sub(self.period_seen);
        }
        let done = put(&mut q);
        self.period_seen = q.total_ns;
        drop(q);
        self.last_done = self.last_done.max(done);
        if let Some(s) = self.streams.get_mut(&stream) {
            *s = (*s).max(done);
        }
        done
    }

    /// Fails once a kernel fault poisoned the device's contexts, with the
    /// fault's error, as the driver answers every context of the process.
    pub(super) fn alive(&self) -> Result<(), Status> {
        match self.poisoned.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Ok(()),
            code => Err(Status::from_code(code)),
        }
    }

    /// Adds `text` to what kernels printed to `stream` (0: printf, 1: the
    /// assert messages), within the printf FIFO's size
    /// (`CU_LIMIT_PRINTF_FIFO_SIZE`): as on a GPU, what does not fit is
    /// lost.
    pub(super) fn print(&mut self, stream: usize, text: &[u8]) {
        let fifo = self.limits.get(&1).copied().unwrap_or(1 << 20);
        let fifo = crate::usize_from(fifo);
        let used = self.printed[0].len() + self.printed[1].len();
        let n = text.len().min(fifo.saturating_sub(used));
        self.printed[stream].extend_from_slice(&text[..n]);
    }

    /// Writes what the context's kernels printed, as the driver does when
    /// the context synchronizes or is destroyed: printf text to descriptor
    /// 1, assert messages to 2.
    pub(super) fn flush_printed(&mut self) {
        let [out, err] = std::mem::take(&mut self.printed);
        if !out.is_empty() {
            write_printed(1, &out);
        }
        if !err.is_empty() {
            write_printed(2, &err);
        }
    }

    /// When the last operation submitted to `stream` completes (0: the default stream).
    pub(super) fn stream_done(&self, stream: Handle) -> Result<Instant, Status> {
        if stream == 0 {
            return Ok(self.last_done);
        }
        self.streams
            .get(&stream)
            .copied()
            .ok_or(Status::InvalidHandle)
    }

    pub(super) fn copy_ns(&self, bytes: u64) -> u64 {
        crate::sat_u64(bytes as f64 / self.params.copy_gbps)
    }

    pub(super) fn mem_ns(&self, bytes: u64) -> u64 {
        crate::sat_u64(bytes as f64 / self.params.mem_gbps)
    }

    pub(super) fn wait_until(t: Instant) {
        let now = Instant::now();
        if t > now {
            let d = t - now;
            if d > Duration::from_micros(200) {
                std::thread::sleep(d - Duration::from_micros(100));
            }
            while Instant::now() < t {
                std::hint::spin_loop();
            }
        }
    }
}

/// Writes kernel output to descriptor 1 or 2, as the driver does.
#[cfg(not(test))]
fn write_printed(fd: u8, text: &[u8]) {
    use std::io::Write;
    let _ = if fd == 1 {
        let mut o = std::io::stdout().lock();
        o.write_all(text).and_then(|()| o.flush())
    } else {
        std::io::stderr().lock().write_all(text)
    };
}

/// In unit tests, through the test harness's captured output, so that a
/// passing test prints nothing.
#[cfg(test)]
fn write_printed(fd: u8, text: &[u8]) {
    let t = String::from_utf8_lossy(text);
    if fd == 1 {
        print!("{t}");
    } else {
        eprint!("{t}");
    }
}

/// A context destroyed writes what its kernels printed, as the driver's
/// does.
impl Drop for SimContext {
    fn drop(&mut self) {
        self.flush_printed();
    }
}

impl Limits for SimContext {
    fn limit(&mut self, limit: u32) -> Result<u64, Status> {
        Ok(match self.limits.get(&limit) {
            Some(&v) => v,
            None => match limit {
                0 => 1024,
                1 => 1 << 20,
                2 => 8 << 20,
                3 => 2,
                4 => 2048,
                5 => 32,
                _ => 0,
            },
        })
    }

    fn set_limit(&mut self, limit: u32, value: u64) -> Result<(), Status> {
        self.limits.insert(limit, value);
        Ok(())
    }

    /// An idle context keeps only what a new context shares with it (the
    /// device, its queue and address space).
    fn recycle(&mut self) -> Result<(), Status> {
        self.alive()?;
        // Work still queued: not reused (a GPU context with a kernel still
        // running is destroyed instead).
        if self.last_done > Instant::now() {
            return Err(Status::NotReady);
        }
        self.mem.clear();
        self.imports.clear();
        self.modules.clear();
        self.staged.drain();
        self.functions.clear();
        self.function_of.clear();
        self.events.clear();
        self.streams.clear();
        self.stream_attrs.clear();
        self.limits.clear();
        self.marks.clear();
        self.timings.clear();
        self.slice_ns.clear();
        self.period = None;
        self.vmm_phys.clear();
        self.vmm_compressed.clear();
        self.vmm_maps.clear();
        self.graphs.clear();
        self.clear_arrays();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::vector_add_params;
    use super::*;
    use crate::executor::sim::{SimExecutor, SimParams};
    use crate::executor::{Executor, Launches, Modules, Streams};
    use protocol::{Dim3, ImageKind};
    use vm_memory::VolatileSlice;

    #[test]
    fn a_kernel_fault_poisons_every_context_of_the_executor_only() {
        let mut exec = SimExecutor::new(SimParams::default());
        let mut bystander = exec.open().unwrap();
        let mut ctx = exec.open().unwrap();
        let ptx = crate::KERNELS_PTX.as_bytes();
        let m = ctx.load_module(ImageKind::Ptx, ptx).unwrap();
        let (f, _) = ctx.function(m, "vector_add").unwrap();
        let buf = ctx.alloc(64).unwrap();
        let (g, b) = (Dim3 { x: 1, y: 1, z: 1 }, Dim3 { x: 16, y: 1, z: 1 });
        // In bounds: fine.
        let ok = vector_add_params(buf, buf, buf, 16);
        ctx.launch(f, g, b, 0, 0, &ok).unwrap();
        ctx.synchronize().unwrap();
        // A wild pointer faults, and the fault is sticky for every context.
        let wild = vector_add_params(0x10, buf, buf, 16);
        assert_eq!(
            ctx.launch(f, g, b, 0, 0, &wild),
            Err(Status::IllegalAddress)
        );
        assert_eq!(ctx.synchronize(), Err(Status::IllegalAddress));
        assert_eq!(bystander.synchronize(), Err(Status::IllegalAddress));
        assert_eq!(bystander.alloc(16), Err(Status::IllegalAddress));
        // Another executor (another worker process) is untouched.
        let mut other = SimExecutor::new(SimParams::default()).open().unwrap();
        assert!(other.alloc(16).is_ok());
        assert!(other.synchronize().is_ok());
    }

    const FAULTS_PTX: &str = include_str!("../../../kernels/faults.ptx");

    #[test]
    fn kernel_printf_waits_in_the_fifo_until_its_context_synchronizes() {
        let mut exec = SimExecutor::new(SimParams::default());
        let mut other = exec.open().unwrap();
        let mut ctx = exec.open_sim().unwrap();
        let m = ctx
            .load_module(ImageKind::Ptx, FAULTS_PTX.as_bytes())
            .unwrap();
        let (f, sizes) = ctx.function(m, "fvg_printf").unwrap();
        assert_eq!(sizes.iter().map(|p| p.size).collect::<Vec<_>>(), vec![4]);
        let (g, b) = (Dim3 { x: 1, y: 1, z: 1 }, Dim3 { x: 3, y: 1, z: 1 });
        ctx.launch(f, g, b, 0, 0, &7i32.to_le_bytes()).unwrap();
        let text = b"kernel 7 thread 0\nkernel 7 thread 1\nkernel 7 thread 2\n";
        assert_eq!(ctx.printed[0], text);
        // Another context's synchronize leaves it; the context's own writes it.
        other.synchronize().unwrap();
        assert_eq!(ctx.printed[0], text);
        ctx.synchronize().unwrap();
        assert!(ctx.printed[0].is_empty());
        // The FIFO's size bounds what a launch leaves.
        ctx.set_limit(1, 20).unwrap();
        ctx.launch(f, g, b, 0, 0, &7i32.to_le_bytes()).unwrap();
        assert_eq!(ctx.printed[0], text[..20]);
    }

    #[test]
    fn a_failed_assert_poisons_the_contexts_with_its_own_error() {
        let mut exec = SimExecutor::new(SimParams::default());
        let mut bystander = exec.open().unwrap();
        let mut ctx = exec.open_sim().unwrap();
        let m = ctx
            .load_module(ImageKind::Ptx, FAULTS_PTX.as_bytes())
            .unwrap();
        let (f, _) = ctx.function(m, "fvg_assert").unwrap();
        let (g, b) = (Dim3 { x: 1, y: 1, z: 1 }, Dim3 { x: 1, y: 1, z: 1 });
        // A null pointer passes the assert.
        ctx.launch(f, g, b, 0, 0, &0u64.to_le_bytes()).unwrap();
        ctx.synchronize().unwrap();
        let assert = Status::from_code(710);
        assert_eq!(ctx.launch(f, g, b, 0, 0, &8u64.to_le_bytes()), Err(assert));
        assert!(
            String::from_utf8_lossy(&ctx.printed[1]).contains("Assertion `p == nullptr` failed.")
        );
        assert_eq!(ctx.synchronize(), Err(assert));
        assert!(ctx.printed[1].is_empty());
        assert_eq!(bystander.synchronize(), Err(assert));
        assert_eq!(exec.open().err(), Some(assert));
    }

    #[test]
    fn a_linked_list_survives_migrations_between_devices() {
        let mut exec = SimExecutor::new(SimParams {
            gpus: 3,
            ..SimParams::default()
        });
        assert_eq!(exec.devices(), 3);
        let mut ctx = exec.open().unwrap();
        let m = ctx
            .load_module(ImageKind::Ptx, crate::KERNELS_PTX.as_bytes())
            .unwrap();
        let (inc, _) = ctx.function(m, "list_inc").unwrap();
        let (sum, _) = ctx.function(m, "list_sum").unwrap();
        // Ten nodes spread over five allocations, linked back to front.
        let blocks: Vec<u64> = (0..5).map(|_| ctx.alloc(32).unwrap()).collect();
        let nodes: Vec<u64> = blocks.iter().flat_map(|&b| [b, b + 16]).collect();
        for (k, &node) in nodes.iter().enumerate() {
            let next = if k == 0 { 0 } else { nodes[k - 1] };
            let mut bytes = next.to_le_bytes().to_vec();
            bytes.extend_from_slice(&(k as f32).to_le_bytes());
            bytes.extend_from_slice(&[0; 4]);
            ctx.htod(node, &VolatileSlice::from(&mut bytes[..]), 0)
                .unwrap();
        }
        let head = *nodes.last().unwrap();
        let out = ctx.alloc(4).unwrap();
        let one = Dim3 { x: 1, y: 1, z: 1 };
        let mut p = head.to_le_bytes().to_vec();
        p.extend_from_slice(&10u32.to_le_bytes());
        for target in [1, 2, 0, 2] {
            ctx.launch(inc, one, one, 0, 0, &p).unwrap();
            let moved = ctx.migrate(target, None).unwrap();
            assert_eq!(
                moved.allocations, 7,
                "five blocks, out and the module global"
            );
            assert_eq!(moved.bytes, 5 * 32 + 4 + 4);
        }
        let mut q = head.to_le_bytes().to_vec();
        q.extend_from_slice(&out.to_le_bytes());
        q.extend_from_slice(&10u32.to_le_bytes());
        ctx.launch(sum, one, one, 0, 0, &q).unwrap();
        ctx.synchronize().unwrap();
        let mut four = [0u8; 4];
        ctx.dtoh(&VolatileSlice::from(&mut four[..]), out, 0)
            .unwrap();
        let got = f32::from_le_bytes(four);
        assert_eq!(got, 45.0 + 4.0 * 10.0);
        assert_eq!(
            ctx.migrate(7, None),
            Err(Status::InvalidValue),
            "no such device"
        );
    }
}
