//! Modules and their functions: loading and linking images, function
//! attributes, occupancy, globals and tensor maps.

use std::ffi::{c_void, CString};
use std::ptr::null_mut;

use cudarc::driver::sys::{self, CUresult};
use protocol::{Dim3, ImageKind, Param, Status};

use super::check;
use super::context::{CudaContext, Obj};
use super::tensor_map;
use crate::executor::{Handle, Modules};

/// A count the guest gave as an unsigned number, for a driver call that
/// takes an `int`: past `i32::MAX` it is no count the driver takes.
fn int(v: u32) -> Result<i32, Status> {
    i32::try_from(v).map_err(|_| Status::InvalidValue)
}

/// The driver's `CUfunction_attribute` for a range-checked number.
pub(super) fn func_attr(attr: u32) -> Result<sys::CUfunction_attribute, Status> {
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

impl Modules for CudaContext {
    fn load_module(&mut self, kind: ImageKind, image: &[u8]) -> Result<Handle, Status> {
        self.bind()?;
        if let Some((raw, img)) = self.staged.take(kind, image) {
            return Ok(self.insert(Obj::Module { raw, image: img }));
        }
        // Kept shared with checkpoints (`Blob::Shared`), copied here once
        // (PTX, NUL-terminated where it was not).
        let terminated = |v: &[u8]| -> std::sync::Arc<[u8]> {
            if kind == ImageKind::Ptx && v.last() != Some(&0) {
                [v, &[0]].concat().into()
            } else {
                v.into()
            }
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
                let img = terminated(t.as_bytes());
                if let Ok(m) = load(&img) {
                    return Ok(self.insert(Obj::Module { raw: m, image: img }));
                }
            }
        }
        let img = terminated(image);
        let m = load(&img)?;
        Ok(self.insert(Obj::Module { raw: m, image: img }))
    }

    fn unload_module(&mut self, module: Handle) -> Result<(), Status> {
        self.bind()?;
        let m = self.module(module)?;
        // Their nodes may name the module's functions.
        self.templates.clear();
        let funcs: Vec<Handle> = self
            .objs
            .iter()
            .filter(|(_, o)| matches!(o, Obj::Function { module: mm, .. } if *mm == module))
            .map(|(&h, _)| h)
            .collect();
        self.drop_graphs_of(&funcs);
        // SAFETY: a module of this context.
        check(unsafe { sys::cuModuleUnload(m) })?;
        self.objs.remove(&module);
        self.objs
            .retain(|_, o| !matches!(o, Obj::Function { module: mm, .. } if *mm == module));
        self.globals.forget_module(module);
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
            // A parameter past 4 GiB (the driver allows 32 KiB of them)
            // cannot be described to the guest.
            let fits = |x: usize| u32::try_from(x).map_err(|_| Status::NotSupported);
            params.push(Param {
                offset: fits(off)?,
                size: fits(size)?,
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

    /// The names of a module's kernels, without the variants made for
    /// kernel slicing (ours, not the guest's).
    fn function_names(&mut self, module: Handle) -> Result<Vec<String>, Status> {
        self.bind()?;
        let m = self.module(module)?;
        let mut n = 0u32;
        // SAFETY: a module of this context; out-parameter on our stack.
        check(unsafe { sys::cuModuleGetFunctionCount(&mut n, m) })?;
        let mut fs: Vec<sys::CUfunction> = vec![std::ptr::null_mut(); n as usize];
        // SAFETY: room for the `n` handles the driver writes.
        check(unsafe { sys::cuModuleEnumerateFunctions(fs.as_mut_ptr(), n, m) })?;
        let mut names = Vec::with_capacity(fs.len());
        for f in fs {
            let mut p: *const std::ffi::c_char = std::ptr::null();
            // SAFETY: a function of this module; out-parameter on our stack.
            check(unsafe { sys::cuFuncGetName(&mut p, f) })?;
            if p.is_null() {
                return Err(Status::Unknown);
            }
            // SAFETY: the driver's NUL-terminated name, kept while the
            // module is loaded.
            let name = unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy();
            if !name.ends_with(crate::ptx::SLICE_SUFFIX) {
                names.push(name.into_owned());
            }
        }
        Ok(names)
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

    fn occupancy(&mut self, func: Handle, block_size: u32, shared_mem: u32) -> Result<i32, Status> {
        self.bind()?;
        let (f, _) = self.func(func)?;
        let mut n = 0;
        // SAFETY: a function of this context; out-parameter on our stack.
        check(unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                f,
                int(block_size)?,
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
                int(num_blocks)?,
                int(block_size)?,
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
        shape: crate::executor::Launch,
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
        // The address the guest learnt before is its address still, even
        // after a move put the global elsewhere.
        if let Some(known) = self.globals.known(module, &cname) {
            return Ok(known);
        }
        let (mut p, mut size) = (0u64, 0usize);
        // SAFETY: a module of this context; out-parameters on our stack.
        check(unsafe { sys::cuModuleGetGlobal_v2(&mut p, &mut size, m, cname.as_ptr()) })?;
        if self.globals.overlaps(p, size as u64) {
            // The driver reused an address an earlier move left to a
            // global of this guest: both cannot be told apart.
            tracing::warn!(
                name,
                "a module global landed on a moved global's old address"
            );
            return Err(Status::NotSupported);
        }
        // The driver places globals itself: on another GPU this one lands
        // elsewhere, and the guest holds this address (see `globals.rs`).
        self.globals.take(module, cname, p, size as u64);
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
}
