//! A guest process's context on the model: its memory, modules, streams,
//! events and marks, its calls run on the device's queue.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::stream_attr::StreamAttr;
use protocol::{Dim3, ImageKind, Param, Status};
use vm_memory::VolatileSlice;

use super::kernels::{k_unmodeled, kernel_by_name, Kernel};
use super::memory::zeroed;
use super::{Queue, SimParams};
use crate::executor::{Context, Handle, Launch, Moved, SharedMem};
use crate::ptx;

pub(super) struct SimModule {
    pub(super) entries: ptx::Entries,
    /// The kernels' names in the text's order.
    pub(super) names: Vec<String>,
    /// Global variables: name -> (address, size), allocated at load.
    pub(super) globals: HashMap<String, (u64, u64)>,
}

/// A model event: when the device passes its last record (none yet: it
/// is complete).
pub(super) type SimEvent = std::sync::Arc<Mutex<Option<Instant>>>;

/// When the device passes event `e`'s last record.
fn when(e: &SimEvent) -> Option<Instant> {
    *e.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) struct SimContext {
    pub(super) params: SimParams,
    pub(super) queues: Arc<Vec<Mutex<Queue>>>,
    pub(super) device: u32,
    pub(super) addresses: Arc<Mutex<super::addresses::Addresses>>,
    /// The pinned pool's device range: the model's kernels do not reach
    /// host memory.
    pub(super) pinned: (u64, u64),
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
    /// Function attributes set with `cuFuncSetAttribute`, by kernel.
    pub(super) func_attrs: HashMap<(Handle, u32), i32>,
    /// Events: when the device passes each one's last record (shared with
    /// contexts of the worker that opened it by IPC handle).
    pub(super) events: HashMap<Handle, SimEvent>,
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
}

impl SimContext {
    fn handle(&mut self) -> Handle {
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
    fn mark(&mut self, stream: Handle) -> Instant {
        self.enqueue(stream, |q| q.busy_until.max(Instant::now()))
    }

    /// Puts something on the device's queue (`put` says when it completes)
    /// and notes that completion for the context and `stream`.
    fn enqueue(&mut self, stream: Handle, put: impl FnOnce(&mut Queue) -> Instant) -> Instant {
        let done = put(&mut self.queues[self.device as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner()));
        self.last_done = self.last_done.max(done);
        if let Some(s) = self.streams.get_mut(&stream) {
            *s = (*s).max(done);
        }
        done
    }

    /// Runs a kernel (results now, time on the queue); returns its modeled time.
    fn run_kernel(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        stream: Handle,
        params: &[u8],
    ) -> Result<u64, Status> {
        let ns = self.compute(func, grid, block, params)?;
        self.submit(ns, stream);
        Ok(ns)
    }

    /// Computes a kernel's results now; returns its modeled time. A fault
    /// poisons the device's contexts.
    fn compute(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        params: &[u8],
    ) -> Result<u64, Status> {
        self.alive()?;
        let (k, _) = *self.functions.get(&func).ok_or(Status::InvalidHandle)?;
        k(self, grid, block, params).inspect_err(|s| {
            if s.is_sticky() {
                let _ = self.poisoned.compare_exchange(
                    0,
                    s.code(),
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        })
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
        let fifo = self.limits.get(&1).copied().unwrap_or(1 << 20) as usize;
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
    fn stream_done(&self, stream: Handle) -> Result<Instant, Status> {
        if stream == 0 {
            return Ok(self.last_done);
        }
        self.streams
            .get(&stream)
            .copied()
            .ok_or(Status::InvalidHandle)
    }

    fn copy_ns(&self, bytes: u64) -> u64 {
        (bytes as f64 / self.params.copy_gbps) as u64
    }

    pub(super) fn mem_ns(&self, bytes: u64) -> u64 {
        (bytes as f64 / self.params.mem_gbps) as u64
    }

    fn wait_until(t: Instant) {
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

impl Context for SimContext {
    fn array_op(&mut self, op: crate::executor::ArrayOp) -> Result<u64, Status> {
        self.sim_array_op(op)
    }

    fn share_mem(&mut self, base: u64, size: u64) -> Result<SharedMem, Status> {
        let shared = self.share(base, size)?;
        Ok(SharedMem(Some(std::sync::Arc::new(shared))))
    }

    fn import_mem(&mut self, base: u64, size: u64, mem: &SharedMem) -> Result<(), Status> {
        let shared = mem
            .0
            .as_ref()
            .and_then(|m| m.downcast_ref::<super::memory::SharedBuf>())
            .ok_or(Status::InvalidValue)?;
        let copy = super::memory::SharedBuf {
            buf: shared.buf.clone(),
            offset: shared.offset,
        };
        self.imports.insert(base, (size, copy));
        Ok(())
    }

    fn close_mem(&mut self, base: u64) {
        self.imports.remove(&base);
    }

    fn share_event(&mut self, event: Handle) -> Result<SharedMem, Status> {
        let e = self.events.get(&event).ok_or(Status::InvalidHandle)?;
        Ok(SharedMem(Some(std::sync::Arc::new(e.clone()))))
    }

    fn import_event(&mut self, shared: &SharedMem) -> Result<Handle, Status> {
        let e = shared
            .0
            .as_ref()
            .and_then(|m| m.downcast_ref::<SimEvent>())
            .ok_or(Status::InvalidValue)?
            .clone();
        let h = self.handle();
        self.events.insert(h, e);
        Ok(h)
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
        self.functions.clear();
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

    fn alloc(&mut self, size: u64) -> Result<u64, Status> {
        self.alive()?;
        let buf = zeroed(size)?;
        // Kept apart (and 2 MiB aligned) so that an overrun is an error.
        let base = self
            .addresses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fresh(size, 0)?;
        self.mem.insert(base, buf);
        Ok(base)
    }

    fn free(&mut self, ptr: u64) -> Result<(), Status> {
        self.mem.remove(&ptr).map(drop).ok_or(Status::InvalidValue)
    }

    fn htod(&mut self, dst: u64, src: &VolatileSlice<'_>, stream: Handle) -> Result<(), Status> {
        self.alive()?;
        let len = src.len();
        for (p, n) in self.pieces(dst, len as u64) {
            let (mut buf, off) = self.locate(p, n)?;
            let part = src
                .subslice((p - dst) as usize, n as usize)
                .map_err(|_| Status::InvalidValue)?;
            part.copy_to(&mut buf[off..off + n as usize]);
        }
        let ns = self.copy_ns(len as u64);
        self.submit(ns, stream);
        Ok(())
    }

    fn dtoh(&mut self, dst: &VolatileSlice<'_>, src: u64, stream: Handle) -> Result<(), Status> {
        self.alive()?;
        let len = dst.len();
        let ns = self.copy_ns(len as u64);
        let done = self.submit(ns, stream);
        self.read_into(dst, src)?;
        Self::wait_until(done);
        Ok(())
    }

    fn dtoh_async(
        &mut self,
        dst: &VolatileSlice<'_>,
        src: u64,
        stream: Handle,
    ) -> Result<(), Status> {
        self.alive()?;
        // The model computes at submission: the bytes are those the work
        // submitted before has written.
        let len = dst.len();
        self.read_into(dst, src)?;
        let ns = self.copy_ns(len as u64);
        self.submit(ns, stream);
        Ok(())
    }

    fn dtod(&mut self, dst: u64, src: u64, len: u64, stream: Handle) -> Result<(), Status> {
        let mut data = Vec::new();
        for (p, n) in self.pieces(src, len) {
            let (buf, off) = self.locate(p, n)?;
            data.extend_from_slice(&buf[off..off + n as usize]);
        }
        for (p, n) in self.pieces(dst, len) {
            let (mut out, off) = self.locate(p, n)?;
            let from = (p - dst) as usize;
            out[off..off + n as usize].copy_from_slice(&data[from..from + n as usize]);
        }
        let ns = self.mem_ns(2 * len);
        self.submit(ns, stream);
        Ok(())
    }

    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        width: u32,
        count: u64,
        stream: Handle,
    ) -> Result<(), Status> {
        let w = width as usize;
        let len = count
            .checked_mul(u64::from(width))
            .ok_or(Status::InvalidValue)?;
        let pat = &value.to_le_bytes()[..w];
        for (p, n) in self.pieces(dst, len) {
            let (mut buf, off) = self.locate(p, n)?;
            // The pattern by byte offset from `dst` (pieces split anywhere).
            let from = (p - dst) as usize;
            for (i, b) in buf[off..off + n as usize].iter_mut().enumerate() {
                *b = pat[(from + i) % w];
            }
        }
        let ns = self.mem_ns(len);
        self.submit(ns, stream);
        Ok(())
    }

    fn load_module(&mut self, kind: ImageKind, image: &[u8]) -> Result<Handle, Status> {
        // Machine code cannot run on the model; PTX can, also the PTX a
        // fat binary carries (what nvcc-built programs register).
        let ptx;
        let image = match kind {
            ImageKind::Ptx => image,
            ImageKind::Cubin if protocol::fatbin::is_fatbin(image) => {
                ptx = protocol::fatbin::best_ptx(image)
                    .map_err(|_| Status::InvalidImage)?
                    .ok_or(Status::NoBinaryForGpu)?;
                &ptx
            }
            ImageKind::Cubin => return Err(Status::NoBinaryForGpu),
        };
        let text = std::str::from_utf8(image).map_err(|_| Status::InvalidPtx)?;
        let text = text.trim_end_matches('\0');
        let entries = ptx::entries(text).ok_or(Status::InvalidPtx)?;
        let names = ptx::entry_names(text, &entries);
        let mut globals = HashMap::new();
        for (name, size) in ptx::globals(text) {
            let p = self.alloc(size)?;
            globals.insert(name, (p, size));
        }
        let h = self.handle();
        self.modules.insert(
            h,
            SimModule {
                entries,
                names,
                globals,
            },
        );
        Ok(h)
    }

    fn unload_module(&mut self, module: Handle) -> Result<(), Status> {
        self.modules
            .remove(&module)
            .map(drop)
            .ok_or(Status::InvalidHandle)
    }

    fn function(&mut self, module: Handle, name: &str) -> Result<(Handle, Vec<Param>), Status> {
        let sizes = self
            .modules
            .get(&module)
            .ok_or(Status::InvalidHandle)?
            .entries
            .get(name)
            .ok_or(Status::NotFound)?
            .clone();
        // A kernel the model does not implement can be looked up (programs
        // look up every kernel they might use); launching it fails.
        let k = kernel_by_name(name).unwrap_or(k_unmodeled);
        let h = self.handle();
        let params = crate::ptx::layout(&sizes);
        self.functions.insert(h, (k, sizes));
        Ok((h, params))
    }

    fn function_names(&mut self, module: Handle) -> Result<Vec<String>, Status> {
        let m = self.modules.get(&module).ok_or(Status::InvalidHandle)?;
        Ok(m.names.clone())
    }

    fn func_attribute(&mut self, func: Handle, attr: u32) -> Result<i32, Status> {
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        if let Some(&v) = self.func_attrs.get(&(func, attr)) {
            return Ok(v);
        }
        // What the model's kernels look like to an occupancy calculator.
        Ok(match attr {
            0 => 1024,  // MAX_THREADS_PER_BLOCK
            4 => 16,    // NUM_REGS
            5 => 70,    // PTX_VERSION
            6 => 90,    // BINARY_VERSION
            8 => 49152, // MAX_DYNAMIC_SHARED_SIZE_BYTES
            9 => -1,    // PREFERRED_SHARED_MEMORY_CARVEOUT
            _ => 0,     // shared, const and local sizes, cache mode
        })
    }

    fn occupancy(&mut self, func: Handle, block_size: u32, shared_mem: u32) -> Result<i32, Status> {
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        // A Hopper-like multiprocessor: 2048 threads, 32 blocks, 228 KiB shared memory.
        let by_threads = 2048 / block_size.max(1);
        let by_smem = (228u32 << 10).checked_div(shared_mem).unwrap_or(u32::MAX);
        Ok(by_threads.min(by_smem).min(32) as i32)
    }

    fn available_smem(
        &mut self,
        func: Handle,
        num_blocks: u32,
        block_size: u32,
    ) -> Result<u64, Status> {
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        // A Hopper multiprocessor: 2048 threads, 228 KiB of shared memory,
        // 1 KiB of it reserved per block, allocated in 128-byte units, at
        // most 227 KiB for one block.
        if num_blocks.saturating_mul(block_size) > 2048 {
            return Ok(0);
        }
        let per_block = (233_472 / u64::from(num_blocks)).saturating_sub(1024);
        Ok((per_block / 128 * 128).min(232_448))
    }

    /// The model cannot run kernels that read tensor maps; its descriptor
    /// holds the address and the shape, not Hopper's encoding.
    fn tensor_map(
        &mut self,
        p: &protocol::tensor_map::TensorMapParams,
    ) -> Result<[u8; protocol::tensor_map::TENSOR_MAP_BYTES], Status> {
        let mut map = [0u8; protocol::tensor_map::TENSOR_MAP_BYTES];
        map.copy_from_slice(&p.encode()[..protocol::tensor_map::TENSOR_MAP_BYTES]);
        map[40..48].copy_from_slice(&p.address.to_le_bytes());
        Ok(map)
    }

    fn occupancy_clusters(
        &mut self,
        shape: Launch,
        cluster: Dim3,
        potential: bool,
    ) -> Result<i32, Status> {
        // Hopper: portable clusters of up to 8 blocks; a cluster's blocks
        // share one GPC, 132 multiprocessors in GPCs of 16 or 18.
        if potential {
            let per_sm =
                self.occupancy(shape.func, shape.block.count() as u32, shape.shared_mem)?;
            return Ok(if per_sm == 0 { 0 } else { 8 });
        }
        if cluster.count() > 8 {
            return Err(Status::InvalidClusterSize);
        }
        let size = cluster.count().max(1) as i32;
        let per_sm = self.occupancy(shape.func, shape.block.count() as u32, shape.shared_mem)?;
        let per_gpc = per_sm * 16;
        Ok((per_gpc / size) * 8)
    }

    fn module_global(&mut self, module: Handle, name: &str) -> Result<(u64, u64), Status> {
        let m = self.modules.get(&module).ok_or(Status::InvalidHandle)?;
        m.globals.get(name).copied().ok_or(Status::NotFound)
    }

    fn link(&mut self, inputs: &[(u32, &[u8])]) -> Result<Vec<u8>, Status> {
        // The model runs PTX: linking PTX inputs is putting their entries in one text.
        let mut out = String::new();
        for (kind, bytes) in inputs {
            if *kind != protocol::link_input::PTX {
                return Err(Status::NotSupported);
            }
            let text = std::str::from_utf8(bytes).map_err(|_| Status::InvalidPtx)?;
            ptx::entries(text.trim_end_matches('\0')).ok_or(Status::InvalidPtx)?;
            out.push_str(text.trim_end_matches('\0'));
            out.push('\n');
        }
        let mut v = out.into_bytes();
        v.push(0);
        Ok(v)
    }

    fn launch(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        _smem: u32,
        stream: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        self.run_kernel(func, grid, block, stream, params).map(drop)
    }

    fn launch_timed(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        _smem: u32,
        stream: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        let ns = self.run_kernel(func, grid, block, stream, params)?;
        // The model knows the kernel's time exactly.
        self.timings.push((func, ns));
        Ok(())
    }

    fn can_slice(&mut self, func: Handle) -> bool {
        self.functions.contains_key(&func)
    }

    fn launch_slice(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        _smem: u32,
        stream: Handle,
        params: &[u8],
        x_offset: u32,
        grid_x: u32,
    ) -> Result<(), Status> {
        // The model computes a kernel's results all at once: the first
        // sub-grid runs the whole grid's work; every sub-grid takes its
        // share of the kernel's time on the queue.
        self.alive()?;
        if grid_x == 0 || x_offset.saturating_add(grid.x) > grid_x {
            return Err(Status::InvalidValue);
        }
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        if x_offset == 0 {
            let ns = self.compute(func, Dim3 { x: grid_x, ..grid }, block, params)?;
            self.slice_ns.insert(func, ns);
        }
        let ns = self.slice_ns.get(&func).copied().unwrap_or(0);
        let part = (ns as f64 * f64::from(grid.x) / f64::from(grid_x)) as u64;
        self.submit(part, stream);
        Ok(())
    }

    fn take_timings(&mut self) -> Vec<(Handle, u64)> {
        std::mem::take(&mut self.timings)
    }

    fn period_begin(&mut self) -> Result<(), Status> {
        let t = self.mark(0);
        self.period = Some((t, None));
        Ok(())
    }

    fn period_end(&mut self, streams: &[Handle]) -> Result<(), Status> {
        let mut end = None::<Instant>;
        for &s in streams {
            let t = self.stream_done(s)?;
            end = Some(end.map_or(t, |e| e.max(t)));
        }
        match self.period.as_mut() {
            Some((_, e)) => {
                *e = end;
                Ok(())
            }
            None => Err(Status::NotReady),
        }
    }

    fn period_ns(&mut self) -> Option<u64> {
        let (a, b) = self.period.take()?;
        let b = b?;
        (Instant::now() >= b).then(|| b.saturating_duration_since(a).as_nanos() as u64)
    }

    fn stream_create(&mut self, _flags: u32, priority: i32) -> Result<Handle, Status> {
        let h = self.handle();
        self.streams.insert(h, Instant::now());
        // Clamped to the H100's range, as the driver does.
        let p = StreamAttr::Priority(priority.clamp(-5, 0));
        self.stream_attrs.insert((h, p.id()), p);
        Ok(h)
    }

    fn stream_set_attribute(&mut self, stream: Handle, attr: StreamAttr) -> Result<(), Status> {
        self.alive()?;
        if stream != 0 && !self.streams.contains_key(&stream) {
            return Err(Status::InvalidHandle);
        }
        let attr = match attr {
            StreamAttr::Priority(p) => StreamAttr::Priority(p.clamp(-5, 0)),
            a => a,
        };
        self.stream_attrs.insert((stream, attr.id()), attr);
        Ok(())
    }

    fn stream_attribute(&mut self, stream: Handle, id: u32) -> Result<StreamAttr, Status> {
        if stream != 0 && !self.streams.contains_key(&stream) {
            return Err(Status::InvalidHandle);
        }
        if let Some(&a) = self.stream_attrs.get(&(stream, id)) {
            return Ok(a);
        }
        use protocol::stream_attr::id;
        Ok(match id {
            id::ACCESS_POLICY_WINDOW => StreamAttr::AccessPolicyWindow(Default::default()),
            id::SYNCHRONIZATION_POLICY => StreamAttr::SyncPolicy(1),
            id::PRIORITY => StreamAttr::Priority(0),
            id::MEM_SYNC_DOMAIN_MAP => StreamAttr::MemSyncDomainMap {
                default: 0,
                remote: 1,
            },
            id::MEM_SYNC_DOMAIN => StreamAttr::MemSyncDomain(0),
            _ => return Err(Status::InvalidValue),
        })
    }

    fn stream_wait_event(
        &mut self,
        stream: Handle,
        event: Handle,
        _flags: u32,
    ) -> Result<(), Status> {
        if stream != 0 && !self.streams.contains_key(&stream) {
            return Err(Status::InvalidHandle);
        }
        // One in-order queue: later work starts after every recorded event.
        self.events
            .contains_key(&event)
            .then_some(())
            .ok_or(Status::InvalidHandle)
    }

    fn func_set_attribute(&mut self, func: Handle, attr: u32, value: i32) -> Result<(), Status> {
        // The model's kernels take any shared memory and cluster shape; the
        // settable attributes read back as set, as the driver's do (the
        // dynamic shared memory limit, the carveout, the cluster shape,
        // its non-portable permission and scheduling policy).
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        match attr {
            8 | 9 | 11..=15 if value >= -1 => {
                self.func_attrs.insert((func, attr), value);
                Ok(())
            }
            _ => Err(Status::InvalidValue),
        }
    }

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

    fn launch_ex(
        &mut self,
        func: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: Handle,
        params: &[u8],
        _cluster: Dim3,
        _cooperative: bool,
    ) -> Result<(), Status> {
        // The model runs every block at once in any case.
        self.launch(func, grid, block, shared_mem, stream, params)
    }

    fn stream_destroy(&mut self, stream: Handle) -> Result<(), Status> {
        self.stream_attrs.retain(|&(s, _), _| s != stream);
        self.streams
            .remove(&stream)
            .map(drop)
            .ok_or(Status::InvalidHandle)
    }

    fn stream_synchronize(&mut self, stream: Handle) -> Result<(), Status> {
        self.flush_printed();
        self.alive()?;
        // One hardware queue: a stream is done when everything before it is.
        let t = self.stream_done(stream)?;
        Self::wait_until(t);
        Ok(())
    }

    fn stream_query(&mut self, stream: Handle) -> Result<bool, Status> {
        let t = self.stream_done(stream)?;
        Ok(Instant::now() >= t)
    }

    fn event_create(&mut self, _flags: u32) -> Result<Handle, Status> {
        let h = self.handle();
        self.events.insert(h, SimEvent::default());
        Ok(h)
    }

    fn event_destroy(&mut self, event: Handle) -> Result<(), Status> {
        self.events
            .remove(&event)
            .map(drop)
            .ok_or(Status::InvalidHandle)
    }

    fn event_record(&mut self, event: Handle, stream: Handle) -> Result<(), Status> {
        if !self.events.contains_key(&event) {
            return Err(Status::InvalidHandle);
        }
        let t = self.mark(stream);
        if let Some(e) = self.events.get(&event) {
            *e.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        }
        Ok(())
    }

    fn event_synchronize(&mut self, event: Handle) -> Result<(), Status> {
        self.flush_printed();
        self.alive()?;
        if let Some(t) = when(self.events.get(&event).ok_or(Status::InvalidHandle)?) {
            Self::wait_until(t);
        }
        Ok(())
    }

    fn event_query(&mut self, event: Handle) -> Result<bool, Status> {
        Ok(when(self.events.get(&event).ok_or(Status::InvalidHandle)?)
            .is_none_or(|t| Instant::now() >= t))
    }

    fn event_elapsed(&mut self, start: Handle, end: Handle) -> Result<f32, Status> {
        let s = when(self.events.get(&start).ok_or(Status::InvalidHandle)?)
            .ok_or(Status::InvalidHandle)?;
        let e = when(self.events.get(&end).ok_or(Status::InvalidHandle)?)
            .ok_or(Status::InvalidHandle)?;
        if Instant::now() < e {
            return Err(Status::NotReady);
        }
        Ok(e.saturating_duration_since(s).as_secs_f32() * 1000.0)
    }

    fn synchronize(&mut self) -> Result<(), Status> {
        self.flush_printed();
        self.alive()?;
        Self::wait_until(self.last_done);
        Ok(())
    }

    /// The nodes are kept; a launch runs them (`graphs.rs`).
    fn graph_instantiate(
        &mut self,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        self.sim_graph_instantiate(None, nodes)
    }

    fn graph_launch(&mut self, exec: Handle, stream: Handle) -> Result<(), Status> {
        self.sim_graph_launch(exec, stream)
    }

    fn graph_destroy(&mut self, exec: Handle) -> Result<(), Status> {
        self.sim_graph_destroy(exec)
    }

    fn cond_scope_create(&mut self) -> Result<Handle, Status> {
        self.sim_scope_create()
    }

    fn cond_handle_create(
        &mut self,
        scope: Handle,
        default_value: u32,
        flags: u32,
    ) -> Result<u64, Status> {
        self.sim_handle_create(scope, default_value, flags)
    }

    fn cond_scope_destroy(&mut self, scope: Handle) -> Result<(), Status> {
        self.sim_scope_destroy(scope)
    }

    fn graph_instantiate_in(
        &mut self,
        scope: Handle,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        self.sim_graph_instantiate(Some(scope), nodes)
    }

    fn mark(&mut self, stream: Option<Handle>) -> Result<crate::executor::Marker, Status> {
        self.alive()?;
        let t = match stream {
            Some(s) => self.stream_done(s)?,
            None => self.last_done,
        };
        let m = self.handle();
        self.marks.insert(m, t);
        Ok(m)
    }

    fn reached(&mut self, m: crate::executor::Marker) -> Result<bool, Status> {
        let t = *self.marks.get(&m).ok_or(Status::InvalidHandle)?;
        if let Err(e) = self.alive() {
            self.marks.remove(&m);
            self.flush_printed();
            return Err(e);
        }
        let done = Instant::now() >= t;
        if done {
            self.marks.remove(&m);
            // The worker synchronizes once the mark is passed (see the
            // cuda executor's `reached`): the driver writes then.
            self.flush_printed();
        }
        Ok(done)
    }

    fn forget(&mut self, m: crate::executor::Marker) {
        self.marks.remove(&m);
    }

    fn vmm_reserve(&mut self, size: u64, align: u64, addr: u64) -> Result<u64, Status> {
        SimContext::vmm_reserve(self, size, align, addr)
    }

    fn vmm_address_free(&mut self, _ptr: u64, _size: u64) -> Result<(), Status> {
        // Addresses are never handed out again in the model.
        Ok(())
    }

    fn vmm_create(&mut self, size: u64, compression: u8) -> Result<Handle, Status> {
        SimContext::vmm_create(self, size, compression)
    }

    fn vmm_compression(&self, handle: Handle) -> Result<u8, Status> {
        SimContext::vmm_compression(self, handle)
    }

    fn vmm_release(&mut self, handle: Handle) -> Result<(), Status> {
        SimContext::vmm_release(self, handle)
    }

    fn vmm_map(&mut self, ptr: u64, size: u64, offset: u64, handle: Handle) -> Result<(), Status> {
        SimContext::vmm_map(self, ptr, size, offset, handle)
    }

    fn vmm_unmap(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        SimContext::vmm_unmap(self, ptr, size)
    }

    fn share_phys(&mut self, handle: Handle) -> Result<crate::executor::SharedMem, Status> {
        SimContext::share_phys(self, handle)
    }

    fn import_phys(
        &mut self,
        mem: &crate::executor::SharedMem,
        size: u64,
    ) -> Result<Handle, Status> {
        SimContext::import_phys(self, mem, size)
    }

    fn migration_keeper(&self) -> Option<crate::executor::Keeper> {
        self.arrays_keeper()
    }

    fn migration_keeper_to(&self, target: u32) -> Option<crate::executor::Keeper> {
        self.arrays_keeper()
            .or_else(|| self.compression_keeper(target))
    }

    fn migrate(
        &mut self,
        device: u32,
        _prepared: Option<crate::executor::Prepared>,
    ) -> Result<Moved, Status> {
        self.alive()?;
        if device as usize >= self.queues.len() {
            return Err(Status::InvalidValue);
        }
        // Drain: what was submitted finishes on the source.
        Self::wait_until(self.last_done);
        if device == self.device {
            return Ok(Moved::default());
        }
        if self.arrays_keeper().is_some() || self.compression_keeper(device).is_some() {
            // As on a GPU: its arrays and objects stay where they are, and
            // compressible memory goes only where it stays compressible.
            return Err(Status::NotSupported);
        }
        // The model keeps device memory in host RAM under the same
        // addresses on every device: the copy costs time on the target's
        // queue (peer copy at the host-device bandwidth), nothing else.
        let bytes: u64 = self
            .mem
            .values()
            .chain(self.vmm_phys.values())
            .map(|b| b.lock().unwrap_or_else(|e| e.into_inner()).len() as u64)
            .sum();
        let allocations = (self.mem.len() + self.vmm_phys.len()) as u64;
        self.device = device;
        let done = self.submit(self.copy_ns(bytes), 0);
        Self::wait_until(done);
        Ok(Moved { bytes, allocations })
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::vector_add_params;
    use super::*;
    use crate::executor::sim::{SimExecutor, SimParams};
    use crate::executor::Executor;

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
