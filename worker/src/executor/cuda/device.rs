//! The driver and its GPUs: loading it, counting and opening GPUs, and the
//! executor of one GPU (its device attributes, host memory registered for DMA).

use std::ffi::c_void;
use std::ptr::null_mut;

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUresult};
use protocol::{DeviceInfo, Status};
use vm_memory::VolatileSlice;

use super::check;
use super::context::{CudaContext, CURRENT};
use crate::executor::{Context, Executor, GraphLaunches};
use crate::Error;

/// What can go wrong finding and opening GPUs: the driver missing, a GPU
/// asked for that is not there, or a driver call failing (which, and its
/// status). It reaches callers as [`Error::Cuda`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The driver library could not be loaded.
    #[error("executor \"cuda\": libcuda.so.1 (the NVIDIA driver) was not found on this host")]
    NoDriver,
    /// No GPU of that ordinal.
    #[error("executor \"cuda\": no GPU {ordinal} (this host has {count})")]
    NoSuchGpu {
        /// The GPU asked for.
        ordinal: u32,
        /// GPUs the driver sees.
        count: u32,
    },
    /// A driver call failed while finding or opening a GPU.
    #[error("executor \"cuda\": {call}: {status:?}")]
    Driver {
        /// The call (`cuInit`, `cuDeviceGet`...).
        call: &'static str,
        /// What it answered.
        status: Status,
    },
    /// A driver call failed while measuring peer bandwidth.
    #[error("peer bandwidth: {call}: {status:?}")]
    Peer {
        /// The call.
        call: &'static str,
        /// What it answered.
        status: Status,
    },
}

/// A failed driver call `call` as an [`Error`].
fn driver(call: &'static str) -> impl Fn(Status) -> Error {
    move |status| CudaError::Driver { call, status }.into()
}

/// Checks that the NVIDIA driver library can be loaded.
pub fn available() -> Result<(), Error> {
    // SAFETY: only probes whether the shared library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoDriver.into());
    }
    Ok(())
}

/// How long `cuInit` waits for an MPS server that is not ready: one
/// recovering from a client's fatal fault turns new clients away until
/// every client it had has exited (the daemon ends them; see `mps.rs`).
const MPS_READY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// `cuInit`, tried again while an MPS server is not ready for clients.
fn init_through_mps() -> Result<(), Status> {
    let end = std::time::Instant::now() + MPS_READY_WAIT;
    loop {
        // SAFETY: cuInit takes flags only.
        let r = unsafe { sys::cuInit(0) };
        let retry = matches!(
            r,
            CUresult::CUDA_ERROR_MPS_SERVER_NOT_READY | CUresult::CUDA_ERROR_MPS_CONNECTION_FAILED
        );
        if !retry || std::time::Instant::now() >= end {
            return check(r);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Number of GPUs the driver sees.
pub fn device_count() -> Result<u32, Error> {
    available()?;
    init_through_mps().map_err(driver("cuInit"))?;
    let mut count = 0;
    // SAFETY: out-parameter on our stack.
    check(unsafe { sys::cuDeviceGetCount(&mut count) }).map_err(driver("cuDeviceGetCount"))?;
    Ok(non_negative(count))
}

/// Peer-to-peer copy bandwidth from GPU `src` to GPU `dst`, GB/s: the best
/// of a few copies of `bytes` between plain allocations (the baseline a
/// migration's copy is compared with).
pub fn peer_bandwidth(src: u32, dst: u32, bytes: usize) -> Result<f64, Error> {
    device_count()?;
    let fail = |call: &'static str, status: Status| Error::from(CudaError::Peer { call, status });
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
    let dev = device(ordinal).map_err(driver("cuDeviceGet"))?;
    let mut total = 0usize;
    // SAFETY: out-parameter on our stack.
    check(unsafe { sys::cuDeviceTotalMem_v2(&mut total, dev) })
        .map_err(driver("cuDeviceTotalMem"))?;
    Ok(total as u64)
}

/// GPU `ordinal` as a checkpoint names a device: its name, the host
/// driver's release and its compute capability; no context is made.
pub fn device_facts(ordinal: u32) -> Result<(String, String, (u32, u32)), Error> {
    device_count()?;
    let dev = device(ordinal).map_err(driver("cuDeviceGet"))?;
    let release = wire::identity::driver_release().unwrap_or_default();
    Ok((name_of(dev), release, cc_of(dev)))
}

/// A device's name (`cuDeviceGetName`).
fn name_of(dev: sys::CUdevice) -> String {
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer is 256 bytes long, as passed.
    let _ = unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev) };
    // SAFETY: the driver NUL-terminates within the buffer (zeroed beforehand).
    unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// A device's compute capability (major, minor).
fn cc_of(dev: sys::CUdevice) -> (u32, u32) {
    use sys::CUdevice_attribute as A;
    (
        non_negative(attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)),
        non_negative(attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
    )
}

/// Whether GPU `ordinal` can preempt a running kernel (compute preemption,
/// every NVIDIA GPU since Pascal): it then gets the preemptive time slice
/// (`sched::Slices`).
pub fn device_preemptive(ordinal: u32) -> Result<bool, Error> {
    device_count()?;
    let dev = device(ordinal).map_err(driver("cuDeviceGet"))?;
    let a = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED;
    Ok(attr(dev, a) == 1)
}

/// Opens GPU `ordinal`; a clear error where there is no driver or no such GPU.
/// `graphs`: which launches go as graph launches (see `batch`).
pub fn open(ordinal: u32, graphs: GraphLaunches) -> Result<Box<dyn Executor>, Error> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(CudaError::NoSuchGpu { ordinal, count }.into());
    }
    let dev = device(ordinal).map_err(driver("cuDeviceGet"))?;
    // Allocations are made movable (virtual memory management) where every
    // GPU supports it: to another GPU, or through a checkpoint to another
    // worker, on this host or another, at the same addresses.
    let vmm = (0..count).all(|o| {
        device(o).is_ok_and(|d| {
            attr(
                d,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            ) != 0
        })
    });
    let mut cuda_version = 0;
    // SAFETY: out-parameter on our stack.
    let _ = unsafe { sys::cuDriverGetVersion(&mut cuda_version) };
    // Read now: the worker is confined later.
    let driver_release = wire::identity::driver_release().unwrap_or_default();
    if driver_release.is_empty() {
        tracing::warn!("the NVIDIA driver's release is unknown (no /sys/module/nvidia/version)");
    }
    Ok(Box::new(CudaExecutor {
        dev,
        ordinal,
        driver_release,
        cuda_version: non_negative(cuda_version),
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
    /// The driver's release ("580.159.04"; empty: unknown), read at open.
    driver_release: String,
    /// `cuDriverGetVersion` (0: unknown).
    cuda_version: u32,
    devices: u32,
    /// Contexts allocate with the virtual memory management API (so they can
    /// move to another GPU).
    vmm: bool,
    /// Host ranges page-locked for DMA (unregistered on drop): address,
    /// length and the flags they were registered with.
    registered: Vec<(usize, usize, u32)>,
    /// The GPU's primary context, where the host memory is registered: the
    /// worker's first guest context is this one too (`context.rs`), so a
    /// worker holds one context, as a native process does.
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
        for &(p, _, _) in &self.registered {
            // SAFETY: `p` was registered by us and its mapping is still alive
            // (the worker drops the executor before the region).
            let _ = unsafe { sys::cuMemHostUnregister(p as *mut c_void) };
        }
        // SAFETY: balances the retain in `register_dma_targets`.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.primary_dev) };
        CURRENT.with(|c| c.set(0));
    }
}

/// A count or version the driver gave as an `int`; a negative one (none
/// is) counts as 0.
fn non_negative(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn attr(dev: CUdevice, a: sys::CUdevice_attribute) -> i32 {
    let mut v = 0;
    // SAFETY: out-parameter on our stack.
    let _ = unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
    v
}

impl Executor for CudaExecutor {
    fn info(&self) -> DeviceInfo {
        let name = name_of(self.dev);
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
        let cc = cc_of(self.dev);
        let sm_count = non_negative(attr(self.dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
        DeviceInfo {
            name,
            total_mem: total as u64,
            cc,
            sm_count,
            attributes,
            driver_version: self.driver_release.clone(),
            cuda_version: self.cuda_version,
            ..Default::default()
        }
    }

    fn register_host_memory(&mut self, ranges: &[VolatileSlice<'_>]) -> Result<(), Status> {
        let first = self.primary.is_null();
        if first {
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
            let flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
            self.registered.push((p as usize, a.len(), flags));
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
        self.registered.push((p as usize, pool.len(), flags));
        let mut dev = 0;
        // SAFETY: out-parameter on our stack; `p` was just registered mapped.
        check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) })?;
        Ok(dev)
    }

    fn pinned_blocks(&mut self, _pool: &VolatileSlice<'_>) -> Result<bool, Status> {
        // The registration context, made current as for the arenas.
        self.register_host_memory(&[])?;
        // Registered memory is reached at its host address only where
        // every GPU the process sees says so (the driver's rule for
        // cuMemHostGetDevicePointer); a migration may take the vGPU to any.
        for o in 0..self.devices {
            let a = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM;
            if attr(device(o)?, a) != 1 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn register_pinned_block(&mut self, block: &VolatileSlice<'_>) -> Result<(), Status> {
        let p = block.ptr_guard_mut().as_ptr() as *mut c_void;
        let len = block.len();
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        self.in_primary(|| {
            // SAFETY: `block` is a live, page-aligned range of the pinned
            // pool's shared mapping, which outlives the executor; no other
            // registration of ours overlaps it (the worker registers each
            // block it hands out once, and unregisters it before freeing).
            check(unsafe { sys::cuMemHostRegister_v2(p, len, flags) })?;
            let dev = mapped_at(p as usize);
            if dev != p as u64 {
                // SAFETY: registered just above, in the current context.
                let _ = unsafe { sys::cuMemHostUnregister(p) };
                tracing::warn!(
                    dev,
                    "a pinned block's device address is not its host address"
                );
                return Err(Status::Unknown);
            }
            Ok(())
        })?;
        self.registered.push((p as usize, len, flags));
        Ok(())
    }

    fn unregister_pinned_block(&mut self, block: &VolatileSlice<'_>) -> Result<(), Status> {
        let p = block.ptr_guard().as_ptr() as usize;
        let i = self
            .registered
            .iter()
            .position(|r| r.0 == p && r.1 == block.len())
            .ok_or(Status::InvalidValue)?;
        self.registered.swap_remove(i);
        // SAFETY: `p` is the base of a range we registered (found above),
        // whose mapping is alive.
        self.in_primary(|| check(unsafe { sys::cuMemHostUnregister(p as *mut c_void) }))
    }

    fn open(&mut self) -> Result<Box<dyn Context>, Status> {
        Ok(Box::new(CudaContext::new(
            self.dev,
            self.ordinal,
            self.vmm,
            self.graphs,
        )?))
    }

    fn opener(&self) -> Option<crate::executor::Opener> {
        // A context made on another thread is current there only; the
        // worker's thread makes each current before its first use.
        let (dev, ordinal, vmm, graphs) = (self.dev, self.ordinal, self.vmm, self.graphs);
        Some(Box::new(move || {
            Ok(Box::new(CudaContext::new(dev, ordinal, vmm, graphs)?) as Box<dyn Context>)
        }))
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
        self.move_registrations()
    }
}

impl CudaExecutor {
    /// Runs `f` with the registration (primary) context current, and the
    /// context current before made current again after: host memory is
    /// registered there (a guest's context may be destroyed before the
    /// memory is unregistered, which would fail then).
    fn in_primary<T>(&self, f: impl FnOnce() -> Result<T, Status>) -> Result<T, Status> {
        if self.primary.is_null() {
            return Err(Status::NotInitialized);
        }
        // SAFETY: our retained primary context, alive.
        check(unsafe { sys::cuCtxPushCurrent_v2(self.primary) })?;
        let r = f();
        let mut popped: CUcontext = null_mut();
        // SAFETY: pops the context pushed above; out-parameter on our stack.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        r
    }

    /// After the vGPU moved to another GPU: the host memory registered in
    /// the old GPU's primary context is registered again in the new GPU's,
    /// and the old one is released, so that nothing of the worker stays on
    /// the GPU it left (a context of some 250 MiB did). The worker moves
    /// between requests, its work drained: nothing uses the memory between
    /// the two registrations. Mapped memory keeps its device address (one
    /// address space for host and devices).
    ///
    /// What is registered is the response arenas and the pinned pool's
    /// live blocks alone (`serve/pinned.rs` registers each block as it is
    /// handed out): the pause grows with the pinned memory the guests hold,
    /// not with the pool's size, where registering the whole pool again
    /// was most of it (unregistering 288 MiB alone took 164-174 ms of a
    /// 205-224 ms pause: docs/measured.md, "Several GPUs"). Where the GPU
    /// needs the whole pool registered, it still is.
    fn move_registrations(&mut self) -> Result<(), Status> {
        if self.primary.is_null() || self.primary_dev == self.dev {
            return Ok(());
        }
        let t = std::time::Instant::now();
        let mut p: CUcontext = null_mut();
        // Retained ahead by the migration's preparation (`retain_ahead`),
        // this is only a count: made here, the context would take 100-170
        // ms of the pause (measured on H200s).
        // SAFETY: out-parameter on our stack.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut p, self.dev) })?;
        release_ahead(self.dev);
        // SAFETY: the old primary context, retained by us and alive.
        let _ = unsafe { sys::cuCtxSetCurrent(self.primary) };
        let before: Vec<u64> = self.registered.iter().map(|r| mapped_at(r.0)).collect();
        for &(a, _, _) in &self.registered {
            // SAFETY: registered by us in the current context; its mapping is alive.
            let _ = unsafe { sys::cuMemHostUnregister(a as *mut c_void) };
        }
        let unregistered = t.elapsed();
        // Releasing the old primary context destroys it, which takes tens
        // of milliseconds: on a thread of its own, off the pause. Nothing
        // of ours is in it any more.
        let old = OldPrimary(self.primary_dev);
        let _ = std::thread::Builder::new()
            .name("primary-release".into())
            .spawn(move || drop(old));
        self.primary = p;
        self.primary_dev = self.dev;
        // SAFETY: the new primary context, just retained.
        check(unsafe { sys::cuCtxSetCurrent(p) })?;
        CURRENT.with(|c| c.set(p as usize));
        let bytes: usize = self.registered.iter().map(|r| r.1).sum();
        for (&(a, len, flags), was) in self.registered.iter().zip(before) {
            // SAFETY: `a` is a live, page-aligned shared mapping of `len`
            // bytes that outlives the executor, unregistered above.
            check(unsafe { sys::cuMemHostRegister_v2(a as *mut c_void, len, flags) })?;
            let now = mapped_at(a);
            if was != 0 && now != was {
                tracing::warn!(
                    was,
                    now,
                    "pinned memory's device address changed in the move"
                );
                return Err(Status::Unknown);
            }
        }
        tracing::info!(
            mib = bytes >> 20,
            unregister_us = crate::micros(unregistered),
            total_us = crate::micros(t.elapsed()),
            "host memory registered again on the new GPU"
        );
        Ok(())
    }
}

/// A device whose primary context we retained, released on drop.
struct OldPrimary(CUdevice);

impl Drop for OldPrimary {
    fn drop(&mut self) {
        // SAFETY: balances our retain of this device's primary context;
        // the driver allows it from any thread.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.0) };
    }
}

/// The target GPU's primary context, retained while a migration is
/// prepared so that the move finds it made (see `retain_ahead`).
static AHEAD: std::sync::Mutex<Option<OldPrimary>> = std::sync::Mutex::new(None);

/// Makes GPU `dev`'s primary context (the host memory's registrations move
/// there in the migration's pause) and holds it until the move retained it
/// itself, or a later preparation replaces it. Called on the preparing
/// thread: making a context is most of what a move to a GPU this worker
/// never used costs.
pub(super) fn retain_ahead(dev: CUdevice) -> Result<(), Status> {
    let mut p: CUcontext = null_mut();
    // SAFETY: out-parameter on our stack; balanced by `OldPrimary`'s drop.
    check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut p, dev) })?;
    let old = AHEAD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .replace(OldPrimary(dev));
    drop(old);
    Ok(())
}

/// Lets go of the context `retain_ahead` held, now that the move to `dev`
/// holds its own: a count, unless it was made for another GPU (a move that
/// failed), whose destruction goes on a thread of its own.
fn release_ahead(dev: CUdevice) {
    let held = AHEAD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    match held {
        Some(p) if p.0 != dev => {
            let _ = std::thread::Builder::new()
                .name("primary-release".into())
                .spawn(move || drop(p));
        }
        other => drop(other),
    }
}

/// The device address of registered, mapped host memory at `a` (0 if not
/// mapped).
fn mapped_at(a: usize) -> u64 {
    let mut dev = 0;
    // SAFETY: out-parameter on our stack; an unmapped range answers an error.
    let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, a as *mut c_void, 0) };
    if r == CUresult::CUDA_SUCCESS {
        dev
    } else {
        0
    }
}

pub(super) fn device(ordinal: u32) -> Result<CUdevice, Status> {
    let mut dev: CUdevice = 0;
    // SAFETY: out-parameter on our stack.
    let ordinal = i32::try_from(ordinal).map_err(|_| Status::InvalidDevice)?;
    // SAFETY: out-parameter on our stack.
    check(unsafe { sys::cuDeviceGet(&mut dev, ordinal) })?;
    Ok(dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_their_kind_and_read_as_before() {
        let e = Error::from(CudaError::NoSuchGpu {
            ordinal: 3,
            count: 2,
        });
        assert!(matches!(
            e,
            Error::Cuda(CudaError::NoSuchGpu {
                ordinal: 3,
                count: 2
            })
        ));
        assert_eq!(
            e.to_string(),
            "config: executor \"cuda\": no GPU 3 (this host has 2)"
        );
        let e = driver("cuDeviceGet")(Status::InvalidDevice);
        assert_eq!(
            e.to_string(),
            "config: executor \"cuda\": cuDeviceGet: InvalidDevice"
        );
        let e = Error::from(CudaError::Peer {
            call: "cuMemcpyPeer",
            status: Status::OutOfMemory,
        });
        assert_eq!(
            e.to_string(),
            "config: peer bandwidth: cuMemcpyPeer: OutOfMemory"
        );
    }
}
