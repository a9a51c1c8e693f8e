//! `cuda`: the CUDA driver API through `cudarc`'s dynamically loaded bindings,
//! so the binary starts on machines without CUDA and fails with a clear
//! message only when a GPU is asked for.
//!
//! One CUDA context per guest process (`Context`), created on the worker's
//! GPU; destroying it frees everything the guest held. The worker calls from
//! one thread, and every entry point makes its context current first.
//! Every `unsafe` block here is a driver call whose pointer arguments are
//! either out-parameters on our stack or ranges the worker validated.

use std::cell::Cell;
use std::ffi::{c_void, CString};
use std::ptr::null_mut;

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUresult};
use protocol::{DeviceInfo, Dim3, ImageKind, Param, Status};
use vm_memory::VolatileSlice;

use super::{Context, Executor, Handle, Moved, Queued};
use crate::config::GraphLaunches;
use crate::Error;

mod batch;
mod tensor_map;

fn check(r: CUresult) -> Result<(), Status> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Status::from_code(r as u32))
    }
}

/// Checks that the NVIDIA driver library can be loaded.
pub fn available() -> Result<(), Error> {
    // SAFETY: only probes whether the shared library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Config(
            "executor \"cuda\": libcuda.so.1 (the NVIDIA driver) was not found on this host".into(),
        ));
    }
    Ok(())
}

/// Number of GPUs the driver sees.
pub fn device_count() -> Result<u32, Error> {
    available()?;
    let fail = |what: &str, s: Status| Error::Config(format!("executor \"cuda\": {what}: {s:?}"));
    // SAFETY: cuInit takes flags only.
    check(unsafe { sys::cuInit(0) }).map_err(|s| fail("cuInit", s))?;
    let mut count = 0;
    // SAFETY: out-parameter on our stack.
    check(unsafe { sys::cuDeviceGetCount(&mut count) }).map_err(|s| fail("cuDeviceGetCount", s))?;
    Ok(count.max(0) as u32)
}

/// Peer-to-peer copy bandwidth from GPU `src` to GPU `dst`, GB/s: the best
/// of a few copies of `bytes` between plain allocations (the baseline a
/// migration's copy is compared with).
pub fn peer_bandwidth(src: u32, dst: u32, bytes: usize) -> Result<f64, Error> {
    device_count()?;
    let fail = |what: &str, s: Status| Error::Config(format!("peer bandwidth: {what}: {s:?}"));
    let mut ctxs = [null_mut(); 2];
    let mut ptrs = [0u64; 2];
    for (i, o) in [src, dst].into_iter().enumerate() {
        let d = device(o).map_err(|s| fail("cuDeviceGet", s))?;
        // SAFETY: out-parameter on our stack; default parameters.
        check(unsafe { sys::cuCtxCreate_v4(&mut ctxs[i], null_mut(), 0, d) })
            .map_err(|s| fail("cuCtxCreate", s))?;
        // SAFETY: out-parameter on our stack, in the context just made current.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptrs[i], bytes) })
            .map_err(|s| fail("cuMemAlloc", s))?;
    }
    // Direct peer access where the GPUs allow it (NVLink, PCIe P2P): the
    // fastest a copy between them can be. The destination context is current.
    // SAFETY: both contexts are ours and alive.
    let _ = unsafe { sys::cuCtxEnablePeerAccess(ctxs[0], 0) };
    let mut best = 0f64;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        // SAFETY: two live allocations of `bytes` in their contexts.
        check(unsafe { sys::cuMemcpyPeer(ptrs[1], ctxs[1], ptrs[0], ctxs[0], bytes) })
            .map_err(|s| fail("cuMemcpyPeer", s))?;
        // SAFETY: the destination context is current after the allocation above.
        check(unsafe { sys::cuCtxSynchronize() }).map_err(|s| fail("sync", s))?;
        best = best.max(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    for c in ctxs {
        // SAFETY: our own contexts; their allocations go with them.
        let _ = unsafe { sys::cuCtxDestroy_v2(c) };
    }
    CURRENT.with(|c| c.set(0));
    Ok(best)
}

/// Memory of GPU `ordinal`, bytes.
pub fn device_memory(ordinal: u32) -> Result<u64, Error> {
    device_count()?;
    let fail = |what: &str, s: Status| Error::Config(format!("executor \"cuda\": {what}: {s:?}"));
    let dev = device(ordinal).map_err(|s| fail("cuDeviceGet", s))?;
    let mut total = 0usize;
    // SAFETY: out-parameter on our stack.
    check(unsafe { sys::cuDeviceTotalMem_v2(&mut total, dev) })
        .map_err(|s| fail("cuDeviceTotalMem", s))?;
    Ok(total as u64)
}

/// Opens GPU `ordinal`; a clear error where there is no driver or no such GPU.
/// `graphs`: which launches go as graph launches (see `batch`).
pub fn open(ordinal: u32, graphs: GraphLaunches) -> Result<Box<dyn Executor>, Error> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::Config(format!(
            "executor \"cuda\": no GPU {ordinal} (this host has {count})"
        )));
    }
    let dev = device(ordinal)
        .map_err(|s| Error::Config(format!("executor \"cuda\": cuDeviceGet: {s:?}")))?;
    // Allocations are made movable (virtual memory management) where there
    // is another GPU to move to and every GPU supports it.
    let vmm = count > 1
        && (0..count).all(|o| {
            device(o).is_ok_and(|d| {
                attr(
                d,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            ) != 0
            })
        });
    Ok(Box::new(CudaExecutor {
        dev,
        ordinal,
        devices: count,
        vmm,
        registered: Vec::new(),
        primary: null_mut(),
        primary_dev: dev,
        graphs,
    }))
}

/// One GPU.
#[derive(Debug)]
pub struct CudaExecutor {
    dev: CUdevice,
    ordinal: u32,
    devices: u32,
    /// Contexts allocate with the virtual memory management API (so they can
    /// move to another GPU).
    vmm: bool,
    /// Host ranges page-locked for DMA (unregistered on drop).
    registered: Vec<usize>,
    primary: CUcontext,
    /// The device whose primary context `primary` is.
    primary_dev: CUdevice,
    /// Which launches contexts submit as graph launches.
    graphs: GraphLaunches,
}

// SAFETY: the primary context handle is only used from the worker thread
// that owns the executor, after making it current there.
unsafe impl Send for CudaExecutor {}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        if self.primary.is_null() {
            return;
        }
        // SAFETY: the primary context was retained by us and is still alive.
        let _ = unsafe { sys::cuCtxSetCurrent(self.primary) };
        for &p in &self.registered {
            // SAFETY: `p` was registered by us and its mapping is still alive
            // (the worker drops the executor before the region).
            let _ = unsafe { sys::cuMemHostUnregister(p as *mut c_void) };
        }
        // SAFETY: balances the retain in `register_dma_targets`.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.primary_dev) };
        CURRENT.with(|c| c.set(0));
    }
}

fn attr(dev: CUdevice, a: sys::CUdevice_attribute) -> i32 {
    let mut v = 0;
    // SAFETY: out-parameter on our stack.
    let _ = unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
    v
}

impl Executor for CudaExecutor {
    fn info(&self) -> DeviceInfo {
        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer is 256 bytes long, as passed.
        let _ = unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 256, self.dev) };
        // SAFETY: the driver NUL-terminates within the buffer (zeroed beforehand).
        let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut total = 0usize;
        // SAFETY: out-parameter on our stack.
        let _ = unsafe { sys::cuDeviceTotalMem_v2(&mut total, self.dev) };
        use sys::CUdevice_attribute as A;
        // Every attribute the driver knows (1 ..= CU_DEVICE_ATTRIBUTE_MAX - 1):
        // the runtime's cudaGetDeviceProperties asks for most of them.
        let attributes: Vec<(u32, i32)> = (1..A::CU_DEVICE_ATTRIBUTE_MAX as u32)
            .filter_map(|a| {
                let mut v = 0;
                // SAFETY: the enum declares every value from 1 to its MAX
                // (CUDA 13.0's list has no gaps), so `a` is one of its variants.
                let attr = unsafe { std::mem::transmute::<u32, A>(a) };
                // SAFETY: out-parameter on our stack.
                let r = unsafe { sys::cuDeviceGetAttribute(&mut v, attr, self.dev) };
                (r == CUresult::CUDA_SUCCESS).then_some((a, v))
            })
            .collect();
        let cc = (
            attr(self.dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) as u32,
            attr(self.dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) as u32,
        );
        let sm_count = attr(self.dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) as u32;
        DeviceInfo {
            name,
            total_mem: total as u64,
            cc,
            sm_count,
            attributes,
            ..Default::default()
        }
    }

    fn register_host_memory(&mut self, ranges: &[VolatileSlice<'_>]) -> Result<(), Status> {
        if self.primary.is_null() {
            let mut p: CUcontext = null_mut();
            // SAFETY: out-parameter on our stack.
            check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut p, self.dev) })?;
            self.primary = p;
            self.primary_dev = self.dev;
        }
        // SAFETY: a retained context of ours.
        check(unsafe { sys::cuCtxSetCurrent(self.primary) })?;
        CURRENT.with(|c| c.set(self.primary as usize));
        for a in ranges {
            let p = a.ptr_guard_mut().as_ptr() as *mut c_void;
            // SAFETY: `a` is a live, page-aligned shared mapping of `a.len()` bytes
            // that outlives the executor; PORTABLE makes it pinned for every context.
            check(unsafe {
                sys::cuMemHostRegister_v2(p, a.len(), sys::CU_MEMHOSTREGISTER_PORTABLE)
            })?;
            self.registered.push(p as usize);
        }
        Ok(())
    }

    fn register_pinned(&mut self, pool: &VolatileSlice<'_>) -> Result<u64, Status> {
        self.register_host_memory(&[])?;
        let p = pool.ptr_guard_mut().as_ptr() as *mut c_void;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: `pool` is a live, page-aligned shared mapping of
        // `pool.len()` bytes that outlives the executor (the worker drops the
        // executor first).
        check(unsafe { sys::cuMemHostRegister_v2(p, pool.len(), flags) })?;
        self.registered.push(p as usize);
        let mut dev = 0;
        // SAFETY: out-parameter on our stack; `p` was just registered mapped.
        check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) })?;
        Ok(dev)
    }

    fn open(&mut self) -> Result<Box<dyn Context>, Status> {
        Ok(Box::new(CudaContext::new(
            self.dev,
            self.ordinal,
            self.vmm,
            self.graphs,
        )?))
    }

    fn devices(&self) -> u32 {
        self.devices
    }

    fn device(&self) -> u32 {
        self.ordinal
    }

    fn set_device(&mut self, ordinal: u32) -> Result<(), Status> {
        if ordinal >= self.devices {
            return Err(Status::InvalidValue);
        }
        if ordinal != self.ordinal && !self.vmm {
            return Err(Status::NotSupported);
        }
        self.dev = device(ordinal)?;
        self.ordinal = ordinal;
        Ok(())
    }
}

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// A driver object the guest holds by handle. Handles are ours (not the
/// driver's pointers), so that the objects can be re-created on another GPU
/// under the same handles when the vGPU moves.
enum Obj {
    Stream {
        raw: sys::CUstream,
        flags: u32,
        priority: i32,
    },
    Event {
        raw: sys::CUevent,
        flags: u32,
    },
    /// The image is kept to load the module again on another GPU.
    Module {
        raw: sys::CUmodule,
        image: Vec<u8>,
    },
    Function {
        raw: sys::CUfunction,
        module: Handle,
        name: CString,
        sizes: Vec<u32>,
        /// Attributes the guest set, set again when the function is made
        /// again on another GPU.
        attrs: Vec<(u32, i32)>,
    },
}

/// How to make an [`Obj`] again (on another GPU).
#[derive(Clone)]
enum ObjSpec {
    /// Flags and priority.
    Stream(u32, i32),
    Event(u32),
    Module(Vec<u8>),
    /// Module, name, parameter sizes, attributes set.
    Function(Handle, CString, Vec<u32>, Vec<(u32, i32)>),
}

/// A context that is no longer used, destroyed when dropped (on any thread).
struct OldContext(CUcontext);

// SAFETY: nothing else refers to the context any more; the driver allows
// destroying a context from any thread.
unsafe impl Send for OldContext {}

impl Drop for OldContext {
    fn drop(&mut self) {
        // SAFETY: see the Send impl; destroyed once.
        let _ = unsafe { sys::cuCtxDestroy_v2(self.0) };
    }
}

/// Makes the objects of `specs` in the current context, into `into`
/// (modules, streams and events first, then the functions of the modules).
fn recreate_into(
    into: &mut super::HandleMap<Obj>,
    specs: &[(Handle, ObjSpec)],
) -> Result<(), Status> {
    for (h, spec) in specs {
        let o = match spec {
            ObjSpec::Stream(flags, priority) => {
                let mut st: sys::CUstream = null_mut();
                // SAFETY: out-parameter on our stack.
                check(unsafe { sys::cuStreamCreateWithPriority(&mut st, *flags, *priority) })?;
                Obj::Stream {
                    raw: st,
                    flags: *flags,
                    priority: *priority,
                }
            }
            ObjSpec::Event(flags) => {
                let mut e: sys::CUevent = null_mut();
                // SAFETY: out-parameter on our stack.
                check(unsafe { sys::cuEventCreate(&mut e, *flags) })?;
                Obj::Event {
                    raw: e,
                    flags: *flags,
                }
            }
            ObjSpec::Module(image) => {
                let mut m: sys::CUmodule = null_mut();
                // SAFETY: the complete image the module was first loaded from.
                check(unsafe { sys::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void) })?;
                Obj::Module {
                    raw: m,
                    image: image.clone(),
                }
            }
            ObjSpec::Function(..) => continue,
        };
        into.insert(*h, o);
    }
    for (h, spec) in specs {
        if let ObjSpec::Function(module, name, sizes, attrs) = spec {
            let Some(Obj::Module { raw: m, .. }) = into.get(module) else {
                return Err(Status::InvalidHandle);
            };
            let mut f: sys::CUfunction = null_mut();
            // SAFETY: a module of the current context; NUL-terminated name.
            check(unsafe { sys::cuModuleGetFunction(&mut f, *m, name.as_ptr()) })?;
            for &(a, v) in attrs {
                // SAFETY: a function of the current context; an attribute and
                // value the function took before.
                check(unsafe { sys::cuFuncSetAttribute(f, func_attr(a)?, v) })?;
            }
            into.insert(
                *h,
                Obj::Function {
                    raw: f,
                    module: *module,
                    name: name.clone(),
                    sizes: sizes.clone(),
                    attrs: attrs.clone(),
                },
            );
        }
    }
    Ok(())
}

/// A context made ahead on a migration's target GPU, with the objects of
/// the context to move (as they were when it was prepared).
struct PreparedCtx {
    ctx: CUcontext,
    dev: CUdevice,
    ordinal: u32,
    objs: super::HandleMap<Obj>,
    /// Physical memory made ahead on the target for each allocation, mapped
    /// at a temporary address: va -> (padded, handle, temporary va).
    staged: std::collections::HashMap<u64, (usize, sys::CUmemGenericAllocationHandle, u64)>,
}

// SAFETY: the context is current on no thread once prepared (see `prepare`);
// whoever takes it makes it current first.
unsafe impl Send for PreparedCtx {}

impl Drop for PreparedCtx {
    fn drop(&mut self) {
        for (_, (padded, handle, tmp)) in self.staged.drain() {
            vmm_free(tmp, &VmmAlloc { padded, handle });
        }
        if !self.ctx.is_null() {
            // SAFETY: a context of ours nobody uses; its objects go with it.
            let _ = unsafe { sys::cuCtxDestroy_v2(self.ctx) };
        }
    }
}

/// Makes a context on GPU `ordinal` with the objects of `specs` and memory
/// for the allocations `allocs` (va, padded size), and leaves it current on
/// no thread.
fn prepare(
    ordinal: u32,
    specs: &[(Handle, ObjSpec)],
    allocs: &[(u64, usize)],
) -> Result<PreparedCtx, Status> {
    let dev = device(ordinal)?;
    let mut ctx: CUcontext = null_mut();
    // SAFETY: out-parameter on our stack; default parameters.
    check(unsafe { sys::cuCtxCreate_v4(&mut ctx, null_mut(), 0, dev) })?;
    let mut p = PreparedCtx {
        ctx,
        dev,
        ordinal,
        objs: Default::default(),
        staged: Default::default(),
    };
    let r = recreate_into(&mut p.objs, specs).and_then(|()| {
        for &(va, padded) in allocs {
            let (tmp, h) = vmm_new(padded, ordinal)?;
            p.staged.insert(va, (padded, h, tmp));
        }
        Ok(())
    });
    // SAFETY: detaches whatever is current on this thread (our new context).
    let _ = unsafe { sys::cuCtxSetCurrent(null_mut()) };
    CURRENT.with(|c| c.set(0));
    r.map(|()| p)
}

/// The guest's own virtual memory management objects (cuMemAddressReserve,
/// cuMemCreate, cuMemMap; the worker checked each call against the
/// session's table), undone when the context goes.
#[derive(Default)]
struct GuestVmm {
    /// base -> size of each reservation.
    reserved: std::collections::HashMap<u64, usize>,
    /// Our handle -> the driver's.
    phys: super::HandleMap<sys::CUmemGenericAllocationHandle>,
    /// base -> size of each mapping.
    maps: std::collections::HashMap<u64, usize>,
}

impl GuestVmm {
    fn is_empty(&self) -> bool {
        self.reserved.is_empty() && self.phys.is_empty()
    }

    /// Unmaps, releases and unreserves everything (the context is current).
    fn clear(&mut self) {
        for (va, n) in self.maps.drain() {
            // SAFETY: our own mapping, undone once.
            let _ = unsafe { sys::cuMemUnmap(va, n) };
        }
        for (_, h) in self.phys.drain() {
            // SAFETY: our own handle, released once.
            let _ = unsafe { sys::cuMemRelease(h) };
        }
        for (va, n) in self.reserved.drain() {
            // SAFETY: our own reservation, nothing mapped in it any more.
            let _ = unsafe { sys::cuMemAddressFree(va, n) };
        }
    }
}

/// Device memory made with the virtual memory management API: a reserved
/// address range with physical memory of the current GPU mapped into it.
struct VmmAlloc {
    padded: usize,
    handle: sys::CUmemGenericAllocationHandle,
}

struct CudaContext {
    ctx: CUcontext,
    dev: CUdevice,
    ordinal: u32,
    /// Allocations are VMM ranges (movable to another GPU at the same
    /// addresses); false on one-GPU hosts, where plain cuMemAlloc is used.
    vmm: bool,
    granularity: usize,
    allocs: std::collections::BTreeMap<u64, VmmAlloc>,
    objs: super::HandleMap<Obj>,
    next_handle: Handle,
    /// The guest learnt a module global's address: it would change on
    /// another GPU, so the context cannot move.
    globals_taken: bool,
    /// Idle timing events, and (function, start, end) of timed launches in flight.
    event_pool: Vec<sys::CUevent>,
    timed: Vec<(Handle, sys::CUevent, sys::CUevent)>,
    /// The busy period being timed: its start event and, once it ended,
    /// one end event per stream it used.
    period: Option<(sys::CUevent, Vec<sys::CUevent>)>,
    /// Each function's sliceable variant (`ptx::SLICE_SUFFIX`), looked up
    /// once; `None`: it has none.
    sliced: std::collections::HashMap<Handle, Option<sys::CUfunction>>,
    /// Graph templates for runs of queued launches (see `batch`).
    templates: batch::Templates,
    /// Marks the worker waits on: their events, one per stream marked.
    marks: std::collections::HashMap<super::Marker, Vec<sys::CUevent>>,
    next_mark: super::Marker,
    /// The stream device-to-host copies into the arenas go on (made when
    /// first needed; non-blocking, so that it waits for no other stream).
    copy: sys::CUstream,
    /// The guest's own reservations, physical memory and mappings.
    guest_vmm: GuestVmm,
}

// SAFETY: a CUcontext may be used from any thread once made current there;
// every entry point below makes it current before use.
unsafe impl Send for CudaContext {}

fn device(ordinal: u32) -> Result<CUdevice, Status> {
    let mut dev: CUdevice = 0;
    // SAFETY: out-parameter on our stack.
    check(unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) })?;
    Ok(dev)
}

/// Allocation properties for pinned device memory on GPU `ordinal`.
fn vmm_prop(ordinal: u32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct for which all-zero is valid (every enum field
    // has a 0 variant: INVALID / NONE); the fields that matter are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal as i32;
    prop
}

fn vmm_access(ordinal: u32) -> sys::CUmemAccessDesc {
    // SAFETY: as in `vmm_prop`.
    let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = ordinal as i32;
    d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d
}

/// Creates `padded` bytes of physical memory on GPU `ordinal` and maps it
/// at `va` (reserved by the caller), readable and writable from that GPU.
fn vmm_map(
    va: u64,
    padded: usize,
    ordinal: u32,
) -> Result<sys::CUmemGenericAllocationHandle, Status> {
    let prop = vmm_prop(ordinal);
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: out-parameter on our stack; `prop` is a valid property struct.
    check(unsafe { sys::cuMemCreate(&mut h, padded, &prop, 0) })?;
    // SAFETY: `va` is a reserved range of `padded` bytes with nothing mapped;
    // `h` is a fresh handle of that size.
    if let Err(e) = check(unsafe { sys::cuMemMap(va, padded, 0, h, 0) }) {
        // SAFETY: our own handle, not mapped.
        let _ = unsafe { sys::cuMemRelease(h) };
        return Err(e);
    }
    let acc = vmm_access(ordinal);
    // SAFETY: the range was just mapped; one descriptor.
    if let Err(e) = check(unsafe { sys::cuMemSetAccess(va, padded, &acc, 1) }) {
        // SAFETY: undoing our own mapping and handle.
        let _ = unsafe { sys::cuMemUnmap(va, padded) };
        // SAFETY: as above.
        let _ = unsafe { sys::cuMemRelease(h) };
        return Err(e);
    }
    Ok(h)
}

/// cuLaunchKernel wants one pointer per parameter; the parameters come
/// packed back to back, so point into that buffer (`spare`: room for more).
fn param_ptrs(sizes: &[u32], params: &[u8], spare: usize) -> Result<Vec<*mut c_void>, Status> {
    let mut ptrs: Vec<*mut c_void> = Vec::with_capacity(sizes.len() + spare);
    let mut at = 0usize;
    for &sz in sizes {
        let end = at.checked_add(sz as usize).ok_or(Status::InvalidValue)?;
        let p = params.get(at..end).ok_or(Status::InvalidValue)?;
        ptrs.push(p.as_ptr() as *mut c_void);
        at = end;
    }
    Ok(ptrs)
}

/// Launches `f` with the parameter pointers `ptrs`.
///
/// # Safety
/// `ptrs` must hold one pointer per parameter of `f`, each to that many
/// readable bytes, and `st` must be a stream of the current context (or null).
unsafe fn launch_raw(
    f: sys::CUfunction,
    g: Dim3,
    b: Dim3,
    smem: u32,
    st: sys::CUstream,
    ptrs: &mut [*mut c_void],
) -> CUresult {
    // SAFETY: the caller's promise.
    unsafe {
        sys::cuLaunchKernel(
            f,
            g.x,
            g.y,
            g.z,
            b.x,
            b.y,
            b.z,
            smem,
            st,
            ptrs.as_mut_ptr(),
            null_mut(),
        )
    }
}

/// The driver's `CUfunction_attribute` for a range-checked number.
fn func_attr(attr: u32) -> Result<sys::CUfunction_attribute, Status> {
    use sys::CUfunction_attribute as A;
    Ok(match attr {
        0 => A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        1 => A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
        2 => A::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
        3 => A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
        4 => A::CU_FUNC_ATTRIBUTE_NUM_REGS,
        5 => A::CU_FUNC_ATTRIBUTE_PTX_VERSION,
        6 => A::CU_FUNC_ATTRIBUTE_BINARY_VERSION,
        7 => A::CU_FUNC_ATTRIBUTE_CACHE_MODE_CA,
        8 => A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        9 => A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        10 => A::CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET,
        11 => A::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
        12 => A::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
        13 => A::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH,
        14 => A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
        15 => A::CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
        _ => return Err(Status::InvalidValue),
    })
}

/// The driver's `CUlimit` for a range-checked limit number.
fn cu_limit(limit: u32) -> Result<sys::CUlimit, Status> {
    use sys::CUlimit as L;
    Ok(match limit {
        0 => L::CU_LIMIT_STACK_SIZE,
        1 => L::CU_LIMIT_PRINTF_FIFO_SIZE,
        2 => L::CU_LIMIT_MALLOC_HEAP_SIZE,
        3 => L::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH,
        4 => L::CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
        5 => L::CU_LIMIT_MAX_L2_FETCH_GRANULARITY,
        6 => L::CU_LIMIT_PERSISTING_L2_CACHE_SIZE,
        _ => return Err(Status::InvalidValue),
    })
}

/// Reserves `padded` bytes of address space and maps new memory of GPU
/// `ordinal` there; undoes the reservation if that fails.
fn vmm_new(
    padded: usize,
    ordinal: u32,
) -> Result<(u64, sys::CUmemGenericAllocationHandle), Status> {
    let va = vmm_reserve(padded)?;
    match vmm_map(va, padded, ordinal) {
        Ok(h) => Ok((va, h)),
        Err(e) => {
            // SAFETY: our own reservation, nothing mapped.
            let _ = unsafe { sys::cuMemAddressFree(va, padded) };
            Err(e)
        }
    }
}

/// Reserves `padded` bytes of device address space.
fn vmm_reserve(padded: usize) -> Result<u64, Status> {
    let mut va = 0;
    // SAFETY: out-parameter on our stack; no fixed address, default alignment.
    check(unsafe { sys::cuMemAddressReserve(&mut va, padded, 0, 0, 0) })?;
    Ok(va)
}

/// Unmaps, releases and unreserves one VMM range.
fn vmm_free(va: u64, a: &VmmAlloc) {
    // SAFETY: our own mapping, handle and reservation, each undone once.
    let _ = unsafe { sys::cuMemUnmap(va, a.padded) };
    // SAFETY: as above.
    let _ = unsafe { sys::cuMemRelease(a.handle) };
    // SAFETY: as above.
    let _ = unsafe { sys::cuMemAddressFree(va, a.padded) };
}

impl CudaContext {
    fn new(
        dev: CUdevice,
        ordinal: u32,
        vmm: bool,
        graphs: GraphLaunches,
    ) -> Result<CudaContext, Status> {
        let mut ctx: CUcontext = null_mut();
        // SAFETY: out-parameter on our stack; null create-params means defaults.
        check(unsafe { sys::cuCtxCreate_v4(&mut ctx, null_mut(), 0, dev) })?;
        CURRENT.with(|c| c.set(ctx as usize));
        let mut granularity = 1;
        if vmm {
            let prop = vmm_prop(ordinal);
            // SAFETY: out-parameter on our stack; a valid property struct.
            let r = check(unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut granularity,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            });
            if let Err(e) = r {
                // SAFETY: our own fresh context.
                let _ = unsafe { sys::cuCtxDestroy_v2(ctx) };
                return Err(e);
            }
        }
        Ok(CudaContext {
            ctx,
            dev,
            ordinal,
            vmm,
            granularity: granularity.max(1),
            allocs: Default::default(),
            objs: Default::default(),
            next_handle: 0x1000,
            globals_taken: false,
            event_pool: Vec::new(),
            timed: Vec::new(),
            period: None,
            sliced: Default::default(),
            templates: batch::Templates::new(graphs),
            marks: Default::default(),
            next_mark: 0,
            copy: null_mut(),
            guest_vmm: GuestVmm::default(),
        })
    }

    fn bind(&self) -> Result<(), Status> {
        if CURRENT.with(Cell::get) != self.ctx as usize {
            // SAFETY: `self.ctx` is a live context owned by self.
            check(unsafe { sys::cuCtxSetCurrent(self.ctx) })?;
            CURRENT.with(|c| c.set(self.ctx as usize));
        }
        Ok(())
    }

    fn insert(&mut self, o: Obj) -> Handle {
        self.next_handle += 1;
        self.objs.insert(self.next_handle, o);
        self.next_handle
    }

    /// The driver stream of a handle (0: the default stream).
    fn stream(&self, h: Handle) -> Result<sys::CUstream, Status> {
        if h == 0 {
            return Ok(null_mut());
        }
        match self.objs.get(&h) {
            Some(Obj::Stream { raw, .. }) => Ok(*raw),
            _ => Err(Status::InvalidHandle),
        }
    }

    fn event(&self, h: Handle) -> Result<sys::CUevent, Status> {
        match self.objs.get(&h) {
            Some(Obj::Event { raw, .. }) => Ok(*raw),
            _ => Err(Status::InvalidHandle),
        }
    }

    fn module(&self, h: Handle) -> Result<sys::CUmodule, Status> {
        match self.objs.get(&h) {
            Some(Obj::Module { raw, .. }) => Ok(*raw),
            _ => Err(Status::InvalidHandle),
        }
    }

    /// Submits one chunk of a run (see `batch`): as one graph launch where it
    /// can, else launch by launch with `cuLaunchKernel`.
    fn launch_chunk(
        &mut self,
        st: sys::CUstream,
        s: Handle,
        chunk: &[Queued],
        params: &[u8],
    ) -> Result<(), Status> {
        let nodes: Result<Vec<batch::Node<'_>>, Status> = chunk
            .iter()
            .map(|q| {
                let (f, sizes) = self.func(q.launch.func)?;
                let p = params.get(q.params.clone()).ok_or(Status::InvalidValue)?;
                Ok(batch::Node {
                    f,
                    grid: q.launch.grid,
                    block: q.launch.block,
                    smem: q.launch.shared_mem,
                    params: p,
                    ptrs: param_ptrs(sizes, p, 0)?,
                })
            })
            .collect();
        if let Ok(mut nodes) = nodes {
            // SAFETY: our context is current (bound by the caller); each
            // node's function is a live function of it with `ptrs` made by
            // its parameter sizes; `st` is a stream of it.
            if unsafe { self.templates.launch(st, &mut nodes) } {
                return Ok(());
            }
        }
        // One by one, each with its own error.
        super::launch_each(self, s, chunk, params)
    }

    fn func(&self, h: Handle) -> Result<(sys::CUfunction, &[u32]), Status> {
        match self.objs.get(&h) {
            Some(Obj::Function { raw, sizes, .. }) => Ok((*raw, sizes)),
            _ => Err(Status::InvalidHandle),
        }
    }

    /// What it takes to make this context's objects again elsewhere.
    fn specs(&self) -> Vec<(Handle, ObjSpec)> {
        self.objs
            .iter()
            .map(|(&h, o)| {
                let spec = match o {
                    Obj::Stream {
                        flags, priority, ..
                    } => ObjSpec::Stream(*flags, *priority),
                    Obj::Event { flags, .. } => ObjSpec::Event(*flags),
                    Obj::Module { image, .. } => ObjSpec::Module(image.clone()),
                    Obj::Function {
                        module,
                        name,
                        sizes,
                        attrs,
                        ..
                    } => ObjSpec::Function(*module, name.clone(), sizes.clone(), attrs.clone()),
                };
                (h, spec)
            })
            .collect()
    }
}
impl Drop for CudaContext {
    fn drop(&mut self) {
        // The graphs go before the context they were made in.
        self.templates.clear();
        if self.bind().is_ok() {
            self.guest_vmm.clear();
            for (va, a) in std::mem::take(&mut self.allocs) {
                vmm_free(va, &a);
            }
        }
        // SAFETY: destroying our own context frees all it holds; nothing uses it after.
        let _ = unsafe { sys::cuCtxDestroy_v2(self.ctx) };
        CURRENT.with(|c| {
            if c.get() == self.ctx as usize {
                c.set(0)
            }
        });
    }
}

impl CudaContext {
    /// The stream of device-to-host copies into the arenas.
    fn copy_stream(&mut self) -> Result<sys::CUstream, Status> {
        if self.copy.is_null() {
            let mut st: sys::CUstream = null_mut();
            // SAFETY: out-parameter on our stack; the context is current.
            check(unsafe {
                sys::cuStreamCreate(&mut st, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            })?;
            self.copy = st;
        }
        Ok(self.copy)
    }

    /// An idle event from the pool, or a new one (timing enabled).
    fn pooled_event(&mut self) -> Result<sys::CUevent, Status> {
        if let Some(e) = self.event_pool.pop() {
            return Ok(e);
        }
        let mut n: sys::CUevent = null_mut();
        // SAFETY: out-parameter on our stack; timing events (flags 0).
        check(unsafe { sys::cuEventCreate(&mut n, 0) })?;
        Ok(n)
    }

    /// Nanoseconds between two recorded events, if `b` has completed.
    fn elapsed_ns(a: sys::CUevent, b: sys::CUevent) -> Option<u64> {
        // SAFETY: our own event.
        if unsafe { sys::cuEventQuery(b) } != CUresult::CUDA_SUCCESS {
            return None;
        }
        let mut ms = 0f32;
        // SAFETY: both events recorded by us; out-parameter on our stack.
        (unsafe { sys::cuEventElapsedTime_v2(&mut ms, a, b) } == CUresult::CUDA_SUCCESS)
            .then(|| (f64::from(ms).max(0.0) * 1e6) as u64)
    }
}

impl Context for CudaContext {
    fn alloc(&mut self, size: u64) -> Result<u64, Status> {
        self.bind()?;
        if !self.vmm {
            let mut p = 0;
            // SAFETY: out-parameter on our stack.
            check(unsafe { sys::cuMemAlloc_v2(&mut p, size as usize) })?;
            return Ok(p);
        }
        let padded = self.footprint(size.max(1)) as usize;
        let (va, handle) = vmm_new(padded, self.ordinal)?;
        self.allocs.insert(va, VmmAlloc { padded, handle });
        Ok(va)
    }

    fn footprint(&self, size: u64) -> u64 {
        let g = self.granularity as u64;
        size.div_ceil(g).saturating_mul(g)
    }

    fn free(&mut self, ptr: u64) -> Result<(), Status> {
        self.bind()?;
        if let Some(a) = self.allocs.remove(&ptr) {
            // Work still using it must finish first, as cuMemFree would wait.
            // SAFETY: no arguments; our context is current.
            check(unsafe { sys::cuCtxSynchronize() })?;
            vmm_free(ptr, &a);
            return Ok(());
        }
        // SAFETY: the worker checked `ptr` is a live allocation of this context.
        check(unsafe { sys::cuMemFree_v2(ptr) })
    }

    fn htod(&mut self, dst: u64, src: &VolatileSlice<'_>, s: Handle) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        let p = src.ptr_guard().as_ptr() as *const c_void;
        // SAFETY: `src` is a live mapping of `src.len()` bytes; the destination range
        // was validated; pageable source memory is staged before the call returns.
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, p, src.len(), st) })
    }

    fn dtoh(&mut self, dst: &VolatileSlice<'_>, src: u64, s: Handle) -> Result<(), Status> {
        self.bind()?;
        self.stream(s)?;
        // The work before the copy is done (the worker waited for its
        // mark): the copy goes on a stream of its own, so that it waits for
        // nothing submitted since.
        let st = self.copy_stream()?;
        let p = dst.ptr_guard_mut().as_ptr() as *mut c_void;
        // SAFETY: `dst` is a live, writable mapping of `dst.len()` bytes; the
        // source range was validated; the copy completes before we return.
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(p, src, dst.len(), st) })?;
        // SAFETY: our own stream of this context.
        check(unsafe { sys::cuStreamSynchronize(st) })
    }

    fn dtoh_async(&mut self, dst: &VolatileSlice<'_>, src: u64, s: Handle) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        let p = dst.ptr_guard_mut().as_ptr() as *mut c_void;
        // SAFETY: `dst` is pinned pool memory, registered with the driver and
        // mapped as long as the executor lives; the source range was
        // validated; the guest waits on the stream before reading it.
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(p, src, dst.len(), st) })
    }

    fn dtod(&mut self, dst: u64, src: u64, len: u64, s: Handle) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        // SAFETY: both ranges validated by the worker.
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len as usize, st) })
    }

    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        width: u32,
        count: u64,
        s: Handle,
    ) -> Result<(), Status> {
        self.bind()?;
        let n = count as usize;
        let st = self.stream(s)?;
        let r = match width {
            // SAFETY: range validated by the worker.
            1 => unsafe { sys::cuMemsetD8Async(dst, value as u8, n, st) },
            // SAFETY: as above.
            2 => unsafe { sys::cuMemsetD16Async(dst, value as u16, n, st) },
            // SAFETY: as above.
            _ => unsafe { sys::cuMemsetD32Async(dst, value, n, st) },
        };
        check(r)
    }

    fn load_module(&mut self, kind: ImageKind, image: &[u8]) -> Result<Handle, Status> {
        self.bind()?;
        let terminated = |mut v: Vec<u8>| {
            if kind == ImageKind::Ptx && v.last() != Some(&0) {
                v.push(0);
            }
            v
        };
        let load = |img: &[u8]| {
            let mut m: sys::CUmodule = null_mut();
            // SAFETY: `img` is a complete image (PTX NUL-terminated); the driver
            // validates its contents and copies what it keeps.
            check(unsafe { sys::cuModuleLoadData(&mut m, img.as_ptr() as *const c_void) })
                .map(|()| m)
        };
        // Kernel slicing needs a variant of each kernel that takes its
        // sub-grid's offset; PTX can be given one before the JIT sees it. If
        // the JIT refuses the augmented text, the guest's own is loaded.
        if kind == ImageKind::Ptx {
            let text = std::str::from_utf8(image).unwrap_or("");
            if let Some(t) = crate::ptx::with_slice_variants(text.trim_end_matches('\0')) {
                let img = terminated(t.into_bytes());
                if let Ok(m) = load(&img) {
                    return Ok(self.insert(Obj::Module { raw: m, image: img }));
                }
            }
        }
        let img = terminated(image.to_vec());
        let m = load(&img)?;
        Ok(self.insert(Obj::Module { raw: m, image: img }))
    }

    fn unload_module(&mut self, module: Handle) -> Result<(), Status> {
        self.bind()?;
        let m = self.module(module)?;
        // Their nodes may name the module's functions.
        self.templates.clear();
        // SAFETY: a module of this context.
        check(unsafe { sys::cuModuleUnload(m) })?;
        self.objs.remove(&module);
        self.objs
            .retain(|_, o| !matches!(o, Obj::Function { module: mm, .. } if *mm == module));
        Ok(())
    }

    fn function(&mut self, module: Handle, name: &str) -> Result<(Handle, Vec<Param>), Status> {
        self.bind()?;
        let m = self.module(module)?;
        let cname = CString::new(name).map_err(|_| Status::InvalidValue)?;
        let mut f: sys::CUfunction = null_mut();
        // SAFETY: a module of this context; name is NUL-terminated.
        check(unsafe { sys::cuModuleGetFunction(&mut f, m, cname.as_ptr()) })?;
        let mut params = Vec::new();
        loop {
            let (mut off, mut size) = (0usize, 0usize);
            // SAFETY: out-parameters on our stack; an index past the end returns an error.
            let r = unsafe { sys::cuFuncGetParamInfo(f, params.len(), &mut off, &mut size) };
            if r != CUresult::CUDA_SUCCESS || params.len() > 4096 {
                break;
            }
            params.push(Param {
                offset: off as u32,
                size: size as u32,
            });
        }
        let h = self.insert(Obj::Function {
            raw: f,
            module,
            name: cname,
            sizes: params.iter().map(|p| p.size).collect(),
            attrs: Vec::new(),
        });
        Ok((h, params))
    }

    fn func_attribute(&mut self, func: Handle, attr: u32) -> Result<i32, Status> {
        let a = func_attr(attr)?;
        self.bind()?;
        let (f, _) = self.func(func)?;
        let mut v = 0;
        // SAFETY: a function of this context; out-parameter on our stack.
        check(unsafe { sys::cuFuncGetAttribute(&mut v, a, f) })?;
        Ok(v)
    }

    fn occupancy(&mut self, func: Handle, block_size: u32, shared_mem: u32) -> Result<i32, Status> {
        self.bind()?;
        let (f, _) = self.func(func)?;
        let mut n = 0;
        // SAFETY: a function of this context; out-parameter on our stack.
        check(unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                f,
                block_size as i32,
                shared_mem as usize,
            )
        })?;
        Ok(n)
    }

    fn available_smem(
        &mut self,
        func: Handle,
        num_blocks: u32,
        block_size: u32,
    ) -> Result<u64, Status> {
        self.bind()?;
        let (f, _) = self.func(func)?;
        let mut bytes = 0usize;
        // SAFETY: a function of this context; out-parameter on our stack.
        check(unsafe {
            sys::cuOccupancyAvailableDynamicSMemPerBlock(
                &mut bytes,
                f,
                num_blocks as i32,
                block_size as i32,
            )
        })?;
        Ok(bytes as u64)
    }

    fn tensor_map(
        &mut self,
        p: &protocol::tensor_map::TensorMapParams,
    ) -> Result<[u8; protocol::tensor_map::TENSOR_MAP_BYTES], Status> {
        self.bind()?;
        tensor_map::encode(p)
    }

    fn occupancy_clusters(
        &mut self,
        shape: super::Launch,
        cluster: Dim3,
        potential: bool,
    ) -> Result<i32, Status> {
        self.bind()?;
        let (f, _) = self.func(shape.func)?;
        // SAFETY: a plain C struct for which all-zero is valid (the id 0 is IGNORE).
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        let mut n = 0;
        if cluster != Dim3::default() {
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attr.value.clusterDim.x = cluster.x;
            attr.value.clusterDim.y = cluster.y;
            attr.value.clusterDim.z = cluster.z;
            n = 1;
        }
        let (g, b) = (shape.grid, shape.block);
        let cfg = sys::CUlaunchConfig {
            gridDimX: g.x,
            gridDimY: g.y,
            gridDimZ: g.z,
            blockDimX: b.x,
            blockDimY: b.y,
            blockDimZ: b.z,
            sharedMemBytes: shape.shared_mem,
            hStream: null_mut(),
            attrs: &mut attr,
            numAttrs: n,
        };
        let mut v = 0;
        let r = if potential {
            // SAFETY: a function of this context; `cfg` and its attribute
            // live across the call; out-parameter on our stack.
            unsafe { sys::cuOccupancyMaxPotentialClusterSize(&mut v, f, &cfg) }
        } else {
            // SAFETY: as above.
            unsafe { sys::cuOccupancyMaxActiveClusters(&mut v, f, &cfg) }
        };
        check(r)?;
        Ok(v)
    }

    fn module_global(&mut self, module: Handle, name: &str) -> Result<(u64, u64), Status> {
        self.bind()?;
        let m = self.module(module)?;
        let cname = CString::new(name).map_err(|_| Status::InvalidValue)?;
        let (mut p, mut size) = (0u64, 0usize);
        // SAFETY: a module of this context; out-parameters on our stack.
        check(unsafe { sys::cuModuleGetGlobal_v2(&mut p, &mut size, m, cname.as_ptr()) })?;
        // The driver places globals itself: their addresses would differ on
        // another GPU, and the guest now holds one.
        self.globals_taken = true;
        Ok((p, size as u64))
    }

    fn link(&mut self, inputs: &[(u32, &[u8])]) -> Result<Vec<u8>, Status> {
        use sys::CUjitInputType as J;
        self.bind()?;
        let mut state: sys::CUlinkState = null_mut();
        // SAFETY: no options; out-parameter on our stack.
        check(unsafe { sys::cuLinkCreate_v2(0, null_mut(), null_mut(), &mut state) })?;
        let result = (|| {
            for (kind, bytes) in inputs {
                let ty = match *kind {
                    protocol::link_input::CUBIN => J::CU_JIT_INPUT_CUBIN,
                    protocol::link_input::PTX => J::CU_JIT_INPUT_PTX,
                    protocol::link_input::FATBINARY => J::CU_JIT_INPUT_FATBINARY,
                    _ => return Err(Status::NotSupported),
                };
                let mut data = bytes.to_vec();
                if *kind == protocol::link_input::PTX && data.last() != Some(&0) {
                    data.push(0);
                }
                // SAFETY: `data` is a complete input of `data.len()` bytes; the name is a
                // static NUL-terminated string; no options.
                check(unsafe {
                    sys::cuLinkAddData_v2(
                        state,
                        ty,
                        data.as_mut_ptr() as *mut c_void,
                        data.len(),
                        c"input".as_ptr(),
                        0,
                        null_mut(),
                        null_mut(),
                    )
                })?;
            }
            let (mut image, mut size) = (null_mut::<c_void>(), 0usize);
            // SAFETY: out-parameters on our stack; the image lives until cuLinkDestroy.
            check(unsafe { sys::cuLinkComplete(state, &mut image, &mut size) })?;
            // SAFETY: the driver returned `size` bytes at `image`, valid until the destroy below.
            Ok(unsafe { std::slice::from_raw_parts(image as *const u8, size) }.to_vec())
        })();
        // SAFETY: `state` was created above and is destroyed once.
        let _ = unsafe { sys::cuLinkDestroy(state) };
        result
    }

    fn launch(
        &mut self,
        func: Handle,
        g: Dim3,
        b: Dim3,
        smem: u32,
        s: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        let (f, sizes) = self.func(func)?;
        let mut ptrs = param_ptrs(sizes, params, 0)?;
        // SAFETY: `ptrs` holds one pointer per kernel parameter, each to that many
        // bytes of `params`; the driver only reads them, and copies the values
        // before returning.
        check(unsafe { launch_raw(f, g, b, smem, st, &mut ptrs) })
    }

    fn launch_many(&mut self, s: Handle, launches: &[Queued], params: &[u8]) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        batch::chunks(launches)
            .map(|chunk| self.launch_chunk(st, s, chunk, params))
            // Every chunk runs; the first error stays.
            .fold(Ok(()), Result::and)
    }

    fn launch_timed(
        &mut self,
        func: Handle,
        g: Dim3,
        b: Dim3,
        smem: u32,
        s: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        let ev = [self.pooled_event()?, self.pooled_event()?];
        // SAFETY: our own events and a stream of this context.
        check(unsafe { sys::cuEventRecord(ev[0], st) })?;
        self.launch(func, g, b, smem, s, params)?;
        // SAFETY: as above.
        check(unsafe { sys::cuEventRecord(ev[1], st) })?;
        self.timed.push((func, ev[0], ev[1]));
        Ok(())
    }

    fn take_timings(&mut self) -> Vec<(Handle, u64)> {
        if self.bind().is_err() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut still = Vec::new();
        for (f, a, b) in std::mem::take(&mut self.timed) {
            match Self::elapsed_ns(a, b) {
                Some(ns) => {
                    out.push((f, ns));
                    self.event_pool.extend([a, b]);
                }
                None => still.push((f, a, b)),
            }
        }
        self.timed = still;
        out
    }

    fn period_begin(&mut self) -> Result<(), Status> {
        self.bind()?;
        if let Some((a, ends)) = self.period.take() {
            self.event_pool.push(a);
            self.event_pool.extend(ends);
        }
        let a = self.pooled_event()?;
        // The context is drained: an event on the legacy default stream
        // completes as soon as the device reaches it, before any later work.
        // SAFETY: our own event; the null stream of our current context.
        check(unsafe { sys::cuEventRecord(a, null_mut()) })?;
        self.period = Some((a, Vec::new()));
        Ok(())
    }

    fn period_end(&mut self, streams: &[Handle]) -> Result<(), Status> {
        self.bind()?;
        let raw = streams
            .iter()
            .map(|&h| self.stream(h))
            .collect::<Result<Vec<_>, _>>()?;
        let mut ends = Vec::with_capacity(raw.len());
        for st in raw {
            let e = self.pooled_event()?;
            // SAFETY: our own event and a stream of this context.
            check(unsafe { sys::cuEventRecord(e, st) })?;
            ends.push(e);
        }
        match self.period.as_mut() {
            Some((_, old)) => {
                let old = std::mem::replace(old, ends);
                self.event_pool.extend(old);
                Ok(())
            }
            None => {
                self.event_pool.extend(ends);
                Err(Status::NotReady)
            }
        }
    }

    fn period_ns(&mut self) -> Option<u64> {
        self.bind().ok()?;
        let (a, ends) = self.period.take()?;
        // The last stream to finish ends it; unknown while any has not.
        let worst = ends
            .iter()
            .try_fold(0, |w: u64, &e| Some(w.max(Self::elapsed_ns(a, e)?)))
            .filter(|_| !ends.is_empty());
        self.event_pool.push(a);
        self.event_pool.extend(ends);
        worst
    }

    fn stream_create(&mut self, flags: u32, priority: i32) -> Result<Handle, Status> {
        self.bind()?;
        let mut st: sys::CUstream = null_mut();
        // SAFETY: out-parameter on our stack; the driver clamps the priority.
        check(unsafe { sys::cuStreamCreateWithPriority(&mut st, flags, priority) })?;
        Ok(self.insert(Obj::Stream {
            raw: st,
            flags,
            priority,
        }))
    }

    fn stream_wait_event(&mut self, s: Handle, e: Handle, flags: u32) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        let ev = self.event(e)?;
        // SAFETY: a stream and an event of this context.
        check(unsafe { sys::cuStreamWaitEvent(st, ev, flags) })
    }

    fn func_set_attribute(&mut self, func: Handle, attr: u32, value: i32) -> Result<(), Status> {
        let a = func_attr(attr)?;
        self.bind()?;
        let (f, _) = self.func(func)?;
        // SAFETY: a function of this context; the value was range-checked.
        check(unsafe { sys::cuFuncSetAttribute(f, a, value) })?;
        if let Some(Obj::Function { attrs, .. }) = self.objs.get_mut(&func) {
            attrs.retain(|(x, _)| *x != attr);
            attrs.push((attr, value));
        }
        Ok(())
    }

    fn limit(&mut self, limit: u32) -> Result<u64, Status> {
        self.bind()?;
        let mut v = 0usize;
        // SAFETY: out-parameter on our stack; `limit` was range-checked.
        check(unsafe { sys::cuCtxGetLimit(&mut v, cu_limit(limit)?) })?;
        Ok(v as u64)
    }

    fn set_limit(&mut self, limit: u32, value: u64) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: the context is current; `limit` was range-checked.
        check(unsafe { sys::cuCtxSetLimit(cu_limit(limit)?, value as usize) })
    }

    fn launch_ex(
        &mut self,
        func: Handle,
        g: Dim3,
        b: Dim3,
        smem: u32,
        s: Handle,
        params: &[u8],
        cluster: Dim3,
        cooperative: bool,
    ) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        let (f, sizes) = self.func(func)?;
        let mut ptrs = param_ptrs(sizes, params, 0)?;
        // SAFETY: plain C structs for which all-zero is valid (the id 0 is IGNORE).
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        let mut n = 0;
        if cluster != Dim3::default() {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n].value.clusterDim.x = cluster.x;
            attrs[n].value.clusterDim.y = cluster.y;
            attrs[n].value.clusterDim.z = cluster.z;
            n += 1;
        }
        if cooperative {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            attrs[n].value.cooperative = 1;
            n += 1;
        }
        let cfg = sys::CUlaunchConfig {
            gridDimX: g.x,
            gridDimY: g.y,
            gridDimZ: g.z,
            blockDimX: b.x,
            blockDimY: b.y,
            blockDimZ: b.z,
            sharedMemBytes: smem,
            hStream: st,
            attrs: attrs.as_mut_ptr(),
            numAttrs: n as u32,
        };
        // SAFETY: `ptrs` holds one pointer per kernel parameter into `params`;
        // `cfg` and its attributes live across the call.
        check(unsafe { sys::cuLaunchKernelEx(&cfg, f, ptrs.as_mut_ptr(), null_mut()) })
    }

    fn stream_destroy(&mut self, s: Handle) -> Result<(), Status> {
        self.bind()?;
        if s == 0 {
            return Err(Status::InvalidHandle);
        }
        let st = self.stream(s)?;
        // SAFETY: a stream of this context, destroyed once.
        check(unsafe { sys::cuStreamDestroy_v2(st) })?;
        self.objs.remove(&s);
        Ok(())
    }

    fn stream_synchronize(&mut self, s: Handle) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        // SAFETY: a stream of this context (or the default one).
        check(unsafe { sys::cuStreamSynchronize(st) })
    }

    fn stream_query(&mut self, s: Handle) -> Result<bool, Status> {
        self.bind()?;
        let st = self.stream(s)?;
        // SAFETY: a stream of this context.
        match unsafe { sys::cuStreamQuery(st) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(Status::from_code(e as u32)),
        }
    }

    fn event_create(&mut self, flags: u32) -> Result<Handle, Status> {
        self.bind()?;
        let mut e: sys::CUevent = null_mut();
        // SAFETY: out-parameter on our stack.
        check(unsafe { sys::cuEventCreate(&mut e, flags) })?;
        Ok(self.insert(Obj::Event { raw: e, flags }))
    }

    fn event_destroy(&mut self, e: Handle) -> Result<(), Status> {
        self.bind()?;
        let ev = self.event(e)?;
        // SAFETY: an event of this context, destroyed once.
        check(unsafe { sys::cuEventDestroy_v2(ev) })?;
        self.objs.remove(&e);
        Ok(())
    }

    fn event_record(&mut self, e: Handle, s: Handle) -> Result<(), Status> {
        self.bind()?;
        let (ev, st) = (self.event(e)?, self.stream(s)?);
        // SAFETY: an event and a stream of this context.
        check(unsafe { sys::cuEventRecord(ev, st) })
    }

    fn event_synchronize(&mut self, e: Handle) -> Result<(), Status> {
        self.bind()?;
        let ev = self.event(e)?;
        // SAFETY: an event of this context.
        check(unsafe { sys::cuEventSynchronize(ev) })
    }

    fn event_query(&mut self, e: Handle) -> Result<bool, Status> {
        self.bind()?;
        let ev = self.event(e)?;
        // SAFETY: an event of this context.
        match unsafe { sys::cuEventQuery(ev) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(Status::from_code(r as u32)),
        }
    }

    fn event_elapsed(&mut self, start: Handle, end: Handle) -> Result<f32, Status> {
        self.bind()?;
        let (a, b) = (self.event(start)?, self.event(end)?);
        let mut ms = 0f32;
        // SAFETY: events of this context; out-parameter on our stack.
        check(unsafe { sys::cuEventElapsedTime_v2(&mut ms, a, b) })?;
        Ok(ms)
    }

    fn synchronize(&mut self) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: no arguments; our context is current.
        check(unsafe { sys::cuCtxSynchronize() })
    }

    fn mark(&mut self, stream: Option<Handle>) -> Result<super::Marker, Status> {
        self.bind()?;
        let streams: Vec<sys::CUstream> = match stream {
            Some(s) => vec![self.stream(s)?],
            None => std::iter::once(null_mut())
                .chain(self.objs.values().filter_map(|o| match o {
                    Obj::Stream { raw, .. } => Some(*raw),
                    _ => None,
                }))
                .collect(),
        };
        let mut events = Vec::with_capacity(streams.len());
        for st in streams {
            let e = self.pooled_event()?;
            // SAFETY: our own event and a stream of this context.
            let r = check(unsafe { sys::cuEventRecord(e, st) });
            events.push(e);
            if let Err(err) = r {
                self.event_pool.extend(events);
                return Err(err);
            }
        }
        self.next_mark += 1;
        self.marks.insert(self.next_mark, events);
        Ok(self.next_mark)
    }

    fn reached(&mut self, m: super::Marker) -> Result<bool, Status> {
        self.bind()?;
        let events = self.marks.get(&m).ok_or(Status::InvalidHandle)?;
        let mut outcome = Ok(true);
        for &e in events {
            // SAFETY: our own recorded event.
            match unsafe { sys::cuEventQuery(e) } {
                CUresult::CUDA_SUCCESS => {}
                CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                r => {
                    outcome = Err(Status::from_code(r as u32));
                    break;
                }
            }
        }
        self.forget(m);
        outcome
    }

    fn forget(&mut self, m: super::Marker) {
        if let Some(events) = self.marks.remove(&m) {
            self.event_pool.extend(events);
        }
    }

    fn can_slice(&mut self, func: Handle) -> bool {
        if let Some(v) = self.sliced.get(&func) {
            return v.is_some();
        }
        let variant = match self.objs.get(&func) {
            Some(Obj::Function { module, name, .. }) => {
                let m = match self.objs.get(module) {
                    Some(Obj::Module { raw, .. }) => *raw,
                    _ => return false,
                };
                let mut full = name.as_bytes().to_vec();
                full.extend_from_slice(crate::ptx::SLICE_SUFFIX.as_bytes());
                let Ok(cname) = CString::new(full) else {
                    return false;
                };
                if self.bind().is_err() {
                    return false;
                }
                let mut f: sys::CUfunction = null_mut();
                // SAFETY: a module of this context; NUL-terminated name.
                let r = unsafe { sys::cuModuleGetFunction(&mut f, m, cname.as_ptr()) };
                (r == CUresult::CUDA_SUCCESS).then_some(f)
            }
            _ => None,
        };
        self.sliced.insert(func, variant);
        variant.is_some()
    }

    fn launch_slice(
        &mut self,
        func: Handle,
        g: Dim3,
        b: Dim3,
        smem: u32,
        s: Handle,
        params: &[u8],
        x_offset: u32,
        grid_x: u32,
    ) -> Result<(), Status> {
        if !self.can_slice(func) {
            return Err(Status::NotSupported);
        }
        let f = self
            .sliced
            .get(&func)
            .copied()
            .flatten()
            .ok_or(Status::NotSupported)?;
        self.bind()?;
        let st = self.stream(s)?;
        let (_, sizes) = self.func(func)?;
        let mut ptrs = param_ptrs(sizes, params, 2)?;
        let (mut off, mut nx) = (x_offset, grid_x);
        ptrs.push(&mut off as *mut u32 as *mut c_void);
        ptrs.push(&mut nx as *mut u32 as *mut c_void);
        // SAFETY: one pointer per parameter of the variant (the original's
        // parameters into `params`, then the two u32s on our stack); the
        // driver copies the values before returning.
        check(unsafe { launch_raw(f, g, b, smem, st, &mut ptrs) })
    }

    fn vmm_reserve(&mut self, size: u64, align: u64) -> Result<u64, Status> {
        self.bind()?;
        let n = usize::try_from(size).map_err(|_| Status::OutOfMemory)?;
        let mut va = 0;
        // SAFETY: out-parameter on our stack; no address asked for; an
        // alignment of 0 or a power of two (checked by the protocol).
        check(unsafe { sys::cuMemAddressReserve(&mut va, n, align as usize, 0, 0) })?;
        self.guest_vmm.reserved.insert(va, n);
        Ok(va)
    }

    fn vmm_address_free(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        self.bind()?;
        match self.guest_vmm.reserved.get(&ptr) {
            Some(&n) if n as u64 == size => {}
            _ => return Err(Status::InvalidValue),
        }
        self.guest_vmm.reserved.remove(&ptr);
        // SAFETY: our own whole reservation, nothing mapped in it (the
        // worker checked), freed once.
        check(unsafe { sys::cuMemAddressFree(ptr, size as usize) })
    }

    fn vmm_create(&mut self, size: u64) -> Result<Handle, Status> {
        self.bind()?;
        let n = usize::try_from(size).map_err(|_| Status::OutOfMemory)?;
        let prop = vmm_prop(self.ordinal);
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: out-parameter on our stack; a valid property struct
        // (pinned memory of this context's GPU); a size that is a multiple
        // of 2 MiB (the protocol's check), no flags.
        check(unsafe { sys::cuMemCreate(&mut h, n, &prop, 0) })?;
        self.next_handle += 1;
        self.guest_vmm.phys.insert(self.next_handle, h);
        Ok(self.next_handle)
    }

    fn vmm_release(&mut self, handle: Handle) -> Result<(), Status> {
        self.bind()?;
        let h = self
            .guest_vmm
            .phys
            .remove(&handle)
            .ok_or(Status::InvalidHandle)?;
        // SAFETY: our own handle, no longer mapped (the worker checked),
        // released once.
        check(unsafe { sys::cuMemRelease(h) })
    }

    fn vmm_map(&mut self, ptr: u64, size: u64, offset: u64, handle: Handle) -> Result<(), Status> {
        self.bind()?;
        let h = *self
            .guest_vmm
            .phys
            .get(&handle)
            .ok_or(Status::InvalidHandle)?;
        let n = size as usize;
        // SAFETY: `ptr..ptr + size` lies in a reservation of ours with
        // nothing mapped there, and `offset + size` within the handle's
        // memory (the worker checked both); no flags.
        check(unsafe { sys::cuMemMap(ptr, n, offset as usize, h, 0) })?;
        let acc = vmm_access(self.ordinal);
        // SAFETY: the range just mapped; one descriptor.
        if let Err(e) = check(unsafe { sys::cuMemSetAccess(ptr, n, &acc, 1) }) {
            // SAFETY: undoing the mapping just made.
            let _ = unsafe { sys::cuMemUnmap(ptr, n) };
            return Err(e);
        }
        self.guest_vmm.maps.insert(ptr, n);
        Ok(())
    }

    fn vmm_unmap(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        self.bind()?;
        match self.guest_vmm.maps.get(&ptr) {
            Some(&n) if n as u64 == size => {}
            _ => return Err(Status::InvalidValue),
        }
        self.guest_vmm.maps.remove(&ptr);
        // SAFETY: one whole mapping of ours, undone once (the driver waits
        // for work still using it).
        check(unsafe { sys::cuMemUnmap(ptr, size as usize) })
    }

    fn prepare_migration(&self, target: u32) -> Option<super::PrepareJob> {
        if target == self.ordinal || !self.vmm || self.globals_taken || !self.guest_vmm.is_empty() {
            return None;
        }
        let specs = self.specs();
        let allocs: Vec<(u64, usize)> = self.allocs.iter().map(|(&va, a)| (va, a.padded)).collect();
        Some(Box::new(move || {
            prepare(target, &specs, &allocs).map(|p| Box::new(p) as super::Prepared)
        }))
    }

    fn migrate(&mut self, target: u32, prepared: Option<super::Prepared>) -> Result<Moved, Status> {
        if target == self.ordinal {
            return Ok(Moved::default());
        }
        if !self.guest_vmm.is_empty() {
            // Its mappings could move as the context's own allocations do,
            // but that is not done yet: the vGPU stays.
            tracing::warn!(
                to = target,
                "a guest process holds VMM memory (cuMemCreate/cuMemAddressReserve): \
                 it cannot migrate"
            );
            return Err(Status::NotSupported);
        }
        if !self.vmm || self.globals_taken {
            return Err(Status::NotSupported);
        }
        self.bind()?;
        // Drain at a kernel boundary: what was submitted finishes here.
        // SAFETY: no arguments; our context is current.
        check(unsafe { sys::cuCtxSynchronize() })?;
        let _ = self.take_timings();
        // The target's context, made ahead on a helper thread if it was.
        let mut p = match prepared.and_then(|b| b.downcast::<PreparedCtx>().ok()) {
            Some(p) if p.ordinal == target => *p,
            _ => prepare(target, &self.specs(), &[])?,
        };
        // SAFETY: the prepared context, current on no other thread.
        check(unsafe { sys::cuCtxSetCurrent(p.ctx) })?;
        CURRENT.with(|c| c.set(p.ctx as usize));
        // Objects made or dropped by the guest since it was prepared.
        let missing: Vec<(Handle, ObjSpec)> = self
            .specs()
            .into_iter()
            .filter(|(h, _)| !p.objs.contains_key(h))
            .collect();
        let gone: Vec<Handle> = p
            .objs
            .keys()
            .filter(|h| !self.objs.contains_key(h))
            .copied()
            .collect();
        let src = self.ordinal;
        let mut staged: Vec<(u64, usize, sys::CUmemGenericAllocationHandle, u64)> = Vec::new();
        let result = (|| {
            recreate_into(&mut p.objs, &missing)?;
            for h in gone {
                // Objects of the prepared context, each destroyed once.
                match p.objs.remove(&h) {
                    Some(Obj::Stream { raw, .. }) => {
                        // SAFETY: see above.
                        let _ = unsafe { sys::cuStreamDestroy_v2(raw) };
                    }
                    Some(Obj::Event { raw, .. }) => {
                        // SAFETY: see above.
                        let _ = unsafe { sys::cuEventDestroy_v2(raw) };
                    }
                    Some(Obj::Module { raw, .. }) => {
                        // SAFETY: see above.
                        let _ = unsafe { sys::cuModuleUnload(raw) };
                    }
                    _ => {}
                }
            }
            // Copy over NVLink/PCIe peer-to-peer where the target may read
            // the source's memory directly, else through the driver's staging.
            let mut direct = 0;
            // SAFETY: out-parameter on our stack.
            let _ = unsafe { sys::cuDeviceCanAccessPeer(&mut direct, p.dev, self.dev) };
            let mut bytes = 0u64;
            for (&va, a) in &self.allocs {
                // Memory made ahead if the allocation existed then.
                let (h, tmp) = match p.staged.remove(&va) {
                    Some((padded, h, tmp)) if padded == a.padded => (h, tmp),
                    other => {
                        if let Some((padded, handle, tmp)) = other {
                            vmm_free(tmp, &VmmAlloc { padded, handle });
                        }
                        let (tmp, h) = vmm_new(a.padded, target)?;
                        (h, tmp)
                    }
                };
                staged.push((va, a.padded, h, tmp));
                if direct != 0 {
                    let acc = [vmm_access(src), vmm_access(target)];
                    // SAFETY: our own mapped range; two descriptors.
                    check(unsafe { sys::cuMemSetAccess(va, a.padded, acc.as_ptr(), 2) })?;
                    // SAFETY: both ranges are ours, `a.padded` bytes, readable and
                    // writable from the target GPU; the default stream of the
                    // (current) target context.
                    check(unsafe { sys::cuMemcpyDtoDAsync_v2(tmp, va, a.padded, null_mut()) })?;
                } else {
                    // SAFETY: `tmp` (target) and `va` (source) are live ranges of
                    // `a.padded` bytes in the two contexts.
                    check(unsafe { sys::cuMemcpyPeer(tmp, p.ctx, va, self.ctx, a.padded) })?;
                }
                bytes += a.padded as u64;
            }
            // SAFETY: no arguments; the target context is current.
            check(unsafe { sys::cuCtxSynchronize() })?;
            Ok(bytes)
        })();
        let bytes = match result {
            Ok(b) => b,
            Err(e) => {
                for (_, padded, h, tmp) in staged {
                    vmm_free(tmp, &VmmAlloc { padded, handle: h });
                }
                drop(p); // the prepared context and its objects
                CURRENT.with(|c| c.set(0));
                self.bind()?;
                return Err(e);
            }
        };
        // The switch: each address range now maps the target's copy.
        let mut allocations = 0;
        for (va, padded, h, tmp) in staged {
            let old = self.allocs.get(&va).map(|a| a.handle);
            // `va` is remapped to the new physical memory (which holds the
            // data already) and opened to the target GPU; the temporary view
            // goes, and the old memory is freed with its last mapping.
            // SAFETY: our own mapping of `va`, undone once.
            let _ = unsafe { sys::cuMemUnmap(va, padded) };
            if let Some(o) = old {
                // SAFETY: the old handle, no longer mapped anywhere.
                let _ = unsafe { sys::cuMemRelease(o) };
            }
            // SAFETY: `va` is reserved and now unmapped; `h` has `padded` bytes.
            check(unsafe { sys::cuMemMap(va, padded, 0, h, 0) })?;
            let acc = vmm_access(target);
            // SAFETY: the range just mapped; one descriptor.
            check(unsafe { sys::cuMemSetAccess(va, padded, &acc, 1) })?;
            // SAFETY: the temporary view of `h`, undone once (`h` stays mapped at `va`).
            let _ = unsafe { sys::cuMemUnmap(tmp, padded) };
            // SAFETY: the temporary reservation, freed once.
            let _ = unsafe { sys::cuMemAddressFree(tmp, padded) };
            if let Some(a) = self.allocs.get_mut(&va) {
                a.handle = h;
            }
            allocations += 1;
        }
        // The old context (its streams, events and modules; their
        // replacements live in the new one) is destroyed off the pause, on a
        // thread of its own: that takes tens of milliseconds.
        self.templates.clear();
        let old = OldContext(self.ctx);
        let _ = std::thread::Builder::new()
            .name("ctx-destroy".into())
            .spawn(move || drop(old));
        self.ctx = std::mem::replace(&mut p.ctx, null_mut());
        self.dev = p.dev;
        self.ordinal = target;
        self.objs = std::mem::take(&mut p.objs);
        self.event_pool.clear();
        self.timed.clear();
        self.period = None;
        self.sliced.clear();
        // The worker moves a vGPU between requests, its work drained: any
        // mark left is passed; its events went with the old context.
        self.marks.clear();
        self.copy = null_mut();
        Ok(Moved { bytes, allocations })
    }
}
