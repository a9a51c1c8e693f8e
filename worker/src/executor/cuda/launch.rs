//! Kernel launches: single, queued runs (see `batch`), extended (clusters,
//! cooperative) and sliced sub-grids.

use std::ffi::{c_void, CString};
use std::ptr::null_mut;

use cudarc::driver::sys::{self, CUresult};
use protocol::{Dim3, Status};

use super::batch;
use super::check;
use super::context::{CudaContext, Obj};
use crate::executor::{Handle, Launches, Queued};

/// cuLaunchKernel wants one pointer per parameter; the parameters come
/// packed back to back, so point into that buffer (`spare`: room for more).
pub(super) fn param_ptrs(
    sizes: &[u32],
    params: &[u8],
    spare: usize,
) -> Result<Vec<*mut c_void>, Status> {
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
pub(super) unsafe fn launch_raw(
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

impl CudaContext {
    /// Submits one chunk of a run (see `batch`): as one graph launch where it
    /// can, else launch by launch with `cuLaunchKernel`.
    pub(super) fn launch_chunk(
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
        // A stream's attributes reach kernels launched into it, not a
        // graph's nodes (see `stream_attrs.rs`).
        let nodes = nodes.and_then(|n| {
            if self.stream_attrs.shapes_kernels(s) {
                Err(Status::NotSupported)
            } else {
                Ok(n)
            }
        });
        if let Ok(mut nodes) = nodes {
            // SAFETY: our context is current (bound by the caller); each
            // node's function is a live function of it with `ptrs` made by
            // its parameter sizes; `st` is its stream `s`.
            if unsafe { self.templates.launch(st, s, &mut nodes) } {
                return Ok(());
            }
        }
        // One by one, each with its own error (the parameters as given:
        // already translated, see `globals.rs`).
        chunk
            .iter()
            .map(|q| {
                let (l, p) = (q.launch, params.get(q.params.clone()));
                p.ok_or(Status::InvalidValue).and_then(|p| {
                    CudaContext::launch_moved(self, l.func, l.grid, l.block, l.shared_mem, s, p)
                })
            })
            .fold(Ok(()), Result::and)
    }

    /// A launch whose parameters are translated already (see `globals.rs`).
    pub(super) fn launch_moved(
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
}

impl Launches for CudaContext {
    fn launch(
        &mut self,
        func: Handle,
        g: Dim3,
        b: Dim3,
        smem: u32,
        s: Handle,
        params: &[u8],
    ) -> Result<(), Status> {
        let params = self.moved_params(func, params);
        self.launch_moved(func, g, b, smem, s, &params)
    }

    fn launch_many(&mut self, s: Handle, launches: &[Queued], params: &[u8]) -> Result<(), Status> {
        let params = self.moved_run(launches, params);
        let params = &*params;
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
        let params = self.moved_params(func, params);
        self.bind()?;
        let st = self.stream(s)?;
        let ev = [self.pooled_event()?, self.pooled_event()?];
        // SAFETY: our own events and a stream of this context.
        check(unsafe { sys::cuEventRecord(ev[0], st) })?;
        self.launch_moved(func, g, b, smem, s, &params)?;
        // SAFETY: as above.
        check(unsafe { sys::cuEventRecord(ev[1], st) })?;
        self.timed.push((func, ev[0], ev[1]));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)] // the `Context` method's arguments
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
        let params = self.moved_params(func, params);
        let params = &*params;
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
        #[allow(clippy::cast_possible_truncation)] // at most 2, the array's length
        let attrs_used = n as u32;
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
            numAttrs: attrs_used,
        };
        // SAFETY: `ptrs` holds one pointer per kernel parameter into `params`;
        // `cfg` and its attributes live across the call.
        check(unsafe { sys::cuLaunchKernelEx(&cfg, f, ptrs.as_mut_ptr(), null_mut()) })
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

    #[allow(clippy::too_many_arguments)] // the `Context` method's arguments
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
        let params = self.moved_params(func, params);
        let params = &*params;
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
}
