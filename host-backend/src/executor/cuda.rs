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
use protocol::{DeviceInfo, Dim3, ImageKind, Status};
use vm_memory::VolatileSlice;

use super::{Context, Executor, Handle};
use crate::Error;

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

/// Memory of GPU `ordinal`, bytes.
pub fn device_memory(ordinal: u32) -> Result<u64, Error> {
    device_count()?;
    let fail = |what: &str, s: Status| Error::Config(format!("executor \"cuda\": {what}: {s:?}"));
    let mut dev: CUdevice = 0;
    // SAFETY: out-parameter on our stack.
    check(unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) })
        .map_err(|s| fail("cuDeviceGet", s))?;
    let mut total = 0usize;
    // SAFETY: out-parameter on our stack.
    check(unsafe { sys::cuDeviceTotalMem_v2(&mut total, dev) })
        .map_err(|s| fail("cuDeviceTotalMem", s))?;
    Ok(total as u64)
}

/// Opens GPU `ordinal`; a clear error where there is no driver or no such GPU.
pub fn open(ordinal: u32) -> Result<Box<dyn Executor>, Error> {
    available()?;
    let fail = |what: &str, s: Status| Error::Config(format!("executor \"cuda\": {what}: {s:?}"));
    // SAFETY: cuInit takes flags only.
    check(unsafe { sys::cuInit(0) }).map_err(|s| fail("cuInit", s))?;
    let mut count = 0;
    // SAFETY: out-parameter on our stack.
    check(unsafe { sys::cuDeviceGetCount(&mut count) }).map_err(|s| fail("cuDeviceGetCount", s))?;
    if ordinal >= count as u32 {
        return Err(Error::Config(format!(
            "executor \"cuda\": no GPU {ordinal} (this host has {count})"
        )));
    }
    let mut dev: CUdevice = 0;
    // SAFETY: out-parameter on our stack.
    check(unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) })
        .map_err(|s| fail("cuDeviceGet", s))?;
    Ok(Box::new(CudaExecutor {
        dev,
        registered: Vec::new(),
        primary: null_mut(),
    }))
}

/// One GPU.
#[derive(Debug)]
pub struct CudaExecutor {
    dev: CUdevice,
    /// Host ranges page-locked for DMA (unregistered on drop).
    registered: Vec<usize>,
    primary: CUcontext,
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
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
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
        let wanted = [
            A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
            A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            A::CU_DEVICE_ATTRIBUTE_WARP_SIZE,
            A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
            A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
        ];
        let attributes: Vec<(u32, i32)> = wanted
            .iter()
            .map(|&a| (a as u32, attr(self.dev, a)))
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
        }
    }

    fn register_dma_targets(&mut self, arenas: &[VolatileSlice<'_>]) -> Result<(), Status> {
        if self.primary.is_null() {
            let mut p: CUcontext = null_mut();
            // SAFETY: out-parameter on our stack.
            check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut p, self.dev) })?;
            self.primary = p;
        }
        // SAFETY: a retained context of ours.
        check(unsafe { sys::cuCtxSetCurrent(self.primary) })?;
        CURRENT.with(|c| c.set(self.primary as usize));
        for a in arenas {
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

    fn open(&mut self) -> Result<Box<dyn Context>, Status> {
        let mut ctx: CUcontext = null_mut();
        // SAFETY: out-parameter on our stack; null create-params means defaults.
        check(unsafe { sys::cuCtxCreate_v4(&mut ctx, null_mut(), 0, self.dev) })?;
        CURRENT.with(|c| c.set(ctx as usize));
        Ok(Box::new(CudaContext {
            ctx,
            event_pool: Vec::new(),
            timed: Vec::new(),
            timing_overhead_ns: None,
            functions: Default::default(),
        }))
    }
}

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

struct CudaContext {
    ctx: CUcontext,
    /// Idle timing events, and (function, start, end) of timed launches in flight.
    event_pool: Vec<sys::CUevent>,
    timed: Vec<(Handle, sys::CUevent, sys::CUevent)>,
    /// Event-measured time of an empty kernel (launch latency between the
    /// events), subtracted from every sample; measured on first use.
    timing_overhead_ns: Option<u64>,
    /// function handle -> parameter sizes (for building cuLaunchKernel's pointer array).
    functions: std::collections::HashMap<Handle, Vec<u32>>,
}

// SAFETY: a CUcontext may be used from any thread once made current there;
// every entry point below makes it current before use.
unsafe impl Send for CudaContext {}

impl CudaContext {
    fn bind(&self) -> Result<(), Status> {
        if CURRENT.with(Cell::get) != self.ctx as usize {
            // SAFETY: `self.ctx` is a live context owned by self.
            check(unsafe { sys::cuCtxSetCurrent(self.ctx) })?;
            CURRENT.with(|c| c.set(self.ctx as usize));
        }
        Ok(())
    }
}

impl Drop for CudaContext {
    fn drop(&mut self) {
        // SAFETY: destroying our own context frees all it holds; nothing uses it after.
        let _ = unsafe { sys::cuCtxDestroy_v2(self.ctx) };
        CURRENT.with(|c| {
            if c.get() == self.ctx as usize {
                c.set(0)
            }
        });
    }
}

fn stream(h: Handle) -> sys::CUstream {
    h as sys::CUstream
}

impl CudaContext {
    /// Event-measured time of an empty kernel: the minimum of a few runs.
    fn calibrate(&mut self) -> Result<u64, Status> {
        const EMPTY: &[u8] = b".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry fvg_empty()\n{\n\tret;\n}\n\0";
        let mut m: sys::CUmodule = null_mut();
        // SAFETY: a NUL-terminated PTX image of our own.
        check(unsafe { sys::cuModuleLoadData(&mut m, EMPTY.as_ptr() as *const c_void) })?;
        let mut f: sys::CUfunction = null_mut();
        // SAFETY: our module; NUL-terminated name.
        let r = check(unsafe { sys::cuModuleGetFunction(&mut f, m, c"fvg_empty".as_ptr()) });
        let mut best = u64::MAX;
        if r.is_ok() {
            let mut ev = [null_mut(); 2];
            for e in &mut ev {
                // SAFETY: out-parameter on our stack.
                check(unsafe { sys::cuEventCreate(e, 0) })?;
            }
            for _ in 0..5 {
                let mut ms = 0f32;
                let (start, end) = (ev[0], ev[1]);
                let steps: [&dyn Fn() -> CUresult; 4] = [
                    // SAFETY: our own event, the default stream.
                    &|| unsafe { sys::cuEventRecord(start, null_mut()) },
                    // SAFETY: our own parameterless kernel on the default stream.
                    &|| unsafe {
                        sys::cuLaunchKernel(
                            f,
                            1,
                            1,
                            1,
                            1,
                            1,
                            1,
                            0,
                            null_mut(),
                            null_mut(),
                            null_mut(),
                        )
                    },
                    // SAFETY: our own event, the default stream.
                    &|| unsafe { sys::cuEventRecord(end, null_mut()) },
                    // SAFETY: our own recorded event.
                    &|| unsafe { sys::cuEventSynchronize(end) },
                ];
                let ok = steps.iter().all(|step| step() == CUresult::CUDA_SUCCESS)
                    // SAFETY: both events recorded and complete.
                    && unsafe { sys::cuEventElapsedTime_v2(&mut ms, start, end) } == CUresult::CUDA_SUCCESS;
                if ok {
                    best = best.min((f64::from(ms) * 1e6) as u64);
                }
            }
            for e in ev {
                self.event_pool.push(e);
            }
        }
        // SAFETY: our module, no longer used.
        let _ = unsafe { sys::cuModuleUnload(m) };
        r.map(|()| if best == u64::MAX { 0 } else { best })
    }
}

impl Context for CudaContext {
    fn alloc(&mut self, size: u64) -> Result<u64, Status> {
        self.bind()?;
        let mut p = 0;
        // SAFETY: out-parameter on our stack.
        check(unsafe { sys::cuMemAlloc_v2(&mut p, size as usize) })?;
        Ok(p)
    }

    fn free(&mut self, ptr: u64) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: the worker checked `ptr` is a live allocation of this context.
        check(unsafe { sys::cuMemFree_v2(ptr) })
    }

    fn htod(&mut self, dst: u64, src: &VolatileSlice<'_>, s: Handle) -> Result<(), Status> {
        self.bind()?;
        let p = src.ptr_guard().as_ptr() as *const c_void;
        // SAFETY: `src` is a live mapping of `src.len()` bytes; the destination range
        // was validated; pageable source memory is staged before the call returns.
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, p, src.len(), stream(s)) })
    }

    fn dtoh(&mut self, dst: &VolatileSlice<'_>, src: u64, s: Handle) -> Result<(), Status> {
        self.bind()?;
        let p = dst.ptr_guard_mut().as_ptr() as *mut c_void;
        // SAFETY: `dst` is a live, writable mapping of `dst.len()` bytes; the
        // source range was validated; the copy completes before we return.
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(p, src, dst.len(), stream(s)) })?;
        // SAFETY: stream handle issued by this context (or 0).
        check(unsafe { sys::cuStreamSynchronize(stream(s)) })
    }

    fn dtod(&mut self, dst: u64, src: u64, len: u64, s: Handle) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: both ranges validated by the worker.
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len as usize, stream(s)) })
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
        let st = stream(s);
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
        let mut owned;
        let img: &[u8] = if kind == ImageKind::Ptx && image.last() != Some(&0) {
            owned = image.to_vec();
            owned.push(0);
            &owned
        } else {
            image
        };
        let mut m: sys::CUmodule = null_mut();
        // SAFETY: `img` is a complete image (PTX NUL-terminated above); the driver
        // validates its contents and copies what it keeps.
        check(unsafe { sys::cuModuleLoadData(&mut m, img.as_ptr() as *const c_void) })?;
        Ok(m as Handle)
    }

    fn unload_module(&mut self, module: Handle) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: the worker checked the handle was issued to this session.
        check(unsafe { sys::cuModuleUnload(module as sys::CUmodule) })
    }

    fn function(&mut self, module: Handle, name: &str) -> Result<(Handle, Vec<u32>), Status> {
        self.bind()?;
        let cname = CString::new(name).map_err(|_| Status::InvalidValue)?;
        let mut f: sys::CUfunction = null_mut();
        // SAFETY: module handle checked by the worker; name is NUL-terminated.
        check(unsafe {
            sys::cuModuleGetFunction(&mut f, module as sys::CUmodule, cname.as_ptr())
        })?;
        let mut sizes = Vec::new();
        loop {
            let (mut off, mut size) = (0usize, 0usize);
            // SAFETY: out-parameters on our stack; an index past the end returns an error.
            let r = unsafe { sys::cuFuncGetParamInfo(f, sizes.len(), &mut off, &mut size) };
            if r != CUresult::CUDA_SUCCESS || sizes.len() > 4096 {
                break;
            }
            sizes.push(size as u32);
        }
        self.functions.insert(f as Handle, sizes.clone());
        Ok((f as Handle, sizes))
    }

    fn func_attribute(&mut self, func: Handle, attr: u32) -> Result<i32, Status> {
        use sys::CUfunction_attribute as A;
        let a = match attr {
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
            _ => return Err(Status::InvalidValue),
        };
        self.bind()?;
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        let mut v = 0;
        // SAFETY: function handle issued by this context; out-parameter on our stack.
        check(unsafe { sys::cuFuncGetAttribute(&mut v, a, func as sys::CUfunction) })?;
        Ok(v)
    }

    fn occupancy(&mut self, func: Handle, block_size: u32, shared_mem: u32) -> Result<i32, Status> {
        self.bind()?;
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        let mut n = 0;
        // SAFETY: function handle issued by this context; out-parameter on our stack.
        check(unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                func as sys::CUfunction,
                block_size as i32,
                shared_mem as usize,
            )
        })?;
        Ok(n)
    }

    fn module_global(&mut self, module: Handle, name: &str) -> Result<(u64, u64), Status> {
        self.bind()?;
        let cname = CString::new(name).map_err(|_| Status::InvalidValue)?;
        let (mut p, mut size) = (0u64, 0usize);
        // SAFETY: module handle checked by the worker; out-parameters on our stack.
        check(unsafe {
            sys::cuModuleGetGlobal_v2(&mut p, &mut size, module as sys::CUmodule, cname.as_ptr())
        })?;
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
        let sizes = self.functions.get(&func).ok_or(Status::InvalidHandle)?;
        // cuLaunchKernel wants one pointer per parameter; the parameters are
        // already packed back to back, so point into that buffer.
        let mut ptrs: Vec<*mut c_void> = Vec::with_capacity(sizes.len());
        let mut at = 0usize;
        for &sz in sizes {
            let end = at.checked_add(sz as usize).ok_or(Status::InvalidValue)?;
            let p = params.get(at..end).ok_or(Status::InvalidValue)?;
            ptrs.push(p.as_ptr() as *mut c_void);
            at = end;
        }
        // SAFETY: `ptrs` holds one pointer per kernel parameter, each to that many
        // bytes of `params`; the driver only reads them, and copies the values
        // before returning.
        check(unsafe {
            sys::cuLaunchKernel(
                func as sys::CUfunction,
                g.x,
                g.y,
                g.z,
                b.x,
                b.y,
                b.z,
                smem,
                stream(s),
                ptrs.as_mut_ptr(),
                null_mut(),
            )
        })
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
        if self.timing_overhead_ns.is_none() {
            self.timing_overhead_ns = Some(self.calibrate().unwrap_or(0));
        }
        let mut ev = [null_mut(); 2];
        for e in &mut ev {
            *e = match self.event_pool.pop() {
                Some(e) => e,
                None => {
                    let mut n: sys::CUevent = null_mut();
                    // SAFETY: out-parameter on our stack; timing events (flags 0).
                    check(unsafe { sys::cuEventCreate(&mut n, 0) })?;
                    n
                }
            };
        }
        // SAFETY: our own events and a stream checked by the worker.
        check(unsafe { sys::cuEventRecord(ev[0], stream(s)) })?;
        self.launch(func, g, b, smem, s, params)?;
        // SAFETY: as above.
        check(unsafe { sys::cuEventRecord(ev[1], stream(s)) })?;
        self.timed.push((func, ev[0], ev[1]));
        Ok(())
    }

    fn take_timings(&mut self) -> Vec<(Handle, u64)> {
        if self.bind().is_err() {
            return Vec::new();
        }
        let overhead = self.timing_overhead_ns.unwrap_or(0);
        let mut out = Vec::new();
        let mut still = Vec::new();
        for (f, a, b) in std::mem::take(&mut self.timed) {
            // SAFETY: our own event.
            if unsafe { sys::cuEventQuery(b) } != CUresult::CUDA_SUCCESS {
                still.push((f, a, b));
                continue;
            }
            let mut ms = 0f32;
            // SAFETY: both events recorded by us and complete; out-parameter on our stack.
            if unsafe { sys::cuEventElapsedTime_v2(&mut ms, a, b) } == CUresult::CUDA_SUCCESS {
                out.push((f, ((f64::from(ms) * 1e6) as u64).saturating_sub(overhead)));
            }
            self.event_pool.push(a);
            self.event_pool.push(b);
        }
        self.timed = still;
        out
    }

    fn stream_create(&mut self, flags: u32) -> Result<Handle, Status> {
        self.bind()?;
        let mut st: sys::CUstream = null_mut();
        // SAFETY: out-parameter on our stack.
        check(unsafe { sys::cuStreamCreate(&mut st, flags) })?;
        Ok(st as Handle)
    }

    fn stream_destroy(&mut self, s: Handle) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: handle checked by the worker.
        check(unsafe { sys::cuStreamDestroy_v2(stream(s)) })
    }

    fn stream_synchronize(&mut self, s: Handle) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: handle checked by the worker (0 = default stream).
        check(unsafe { sys::cuStreamSynchronize(stream(s)) })
    }

    fn stream_query(&mut self, s: Handle) -> Result<bool, Status> {
        self.bind()?;
        // SAFETY: handle checked by the worker.
        match unsafe { sys::cuStreamQuery(stream(s)) } {
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
        Ok(e as Handle)
    }

    fn event_destroy(&mut self, e: Handle) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: handle checked by the worker.
        check(unsafe { sys::cuEventDestroy_v2(e as sys::CUevent) })
    }

    fn event_record(&mut self, e: Handle, s: Handle) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: handles checked by the worker.
        check(unsafe { sys::cuEventRecord(e as sys::CUevent, stream(s)) })
    }

    fn event_synchronize(&mut self, e: Handle) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: handle checked by the worker.
        check(unsafe { sys::cuEventSynchronize(e as sys::CUevent) })
    }

    fn event_query(&mut self, e: Handle) -> Result<bool, Status> {
        self.bind()?;
        // SAFETY: handle checked by the worker.
        match unsafe { sys::cuEventQuery(e as sys::CUevent) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(Status::from_code(r as u32)),
        }
    }

    fn event_elapsed(&mut self, start: Handle, end: Handle) -> Result<f32, Status> {
        self.bind()?;
        let mut ms = 0f32;
        // SAFETY: handles checked by the worker; out-parameter on our stack.
        check(unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, start as sys::CUevent, end as sys::CUevent)
        })?;
        Ok(ms)
    }

    fn synchronize(&mut self) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: no arguments; our context is current.
        check(unsafe { sys::cuCtxSynchronize() })
    }
}
