//! Modules, libraries, kernels and the linker.
//!
//! Images are loaded on the host, in the process's one host context.
//!
//! The library API (CUDA 12) is the module API without a context, and lazy:
//! the CUDA runtime registers every fat binary of a program (hundreds, in
//! a framework) with `cuLibraryLoadData` before `main`, and uses few. A
//! library here keeps its image (the caller's own bytes when it promises to
//! keep them, `CU_LIBRARY_BINARY_IS_PRESERVED`, else a copy) and is loaded
//! on the host as a module when a kernel or global of it is first asked
//! for. A `CUkernel` is the function of that name in that module, and
//! `cuKernelGetFunction` hands back the same handle (the runtime passes
//! kernels straight to `cuLaunchKernel`).

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::mem::MaybeUninit;

use cudarc::driver::sys::{CUdeviceptr, CUfunction, CUmodule};

use crate::state::tables::{Image, Library};
use crate::state::thread::need_ctx;
use crate::state::{c_str, gpu, host_src, objects, out, out_opt, Kernel, Range, RangeKind};
use crate::{code, CuResult};
use protocol::ImageKind;

/// Loads the image at `img` (a fat binary wrapper, fatbin, cubin or
/// NUL-terminated PTX, its length found as the driver finds it).
///
/// # Safety
/// `img` must point to a complete module image.
unsafe fn load_image(img: *const c_void) -> Result<u64, CuResult> {
    // SAFETY: per this function's contract.
    let (kind, bytes) = unsafe { image_bytes(img) }?;
    load_bytes(kind, bytes)
}

/// The kind and bytes of the image at `img`.
///
/// # Safety
/// `img` must point to a complete module image that outlives the slice.
unsafe fn image_bytes<'a>(img: *const c_void) -> Result<(ImageKind, &'a [u8]), CuResult> {
    if img.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: `img` is a module image, per this function's contract.
    let (kind, start, len) =
        unsafe { crate::image::probe(img as *const u8) }.ok_or(code::INVALID_IMAGE)?;
    // SAFETY: probe found `len` bytes of image at `start`.
    Ok((kind, unsafe { std::slice::from_raw_parts(start, len) }))
}

fn load_bytes(kind: ImageKind, bytes: &[u8]) -> Result<u64, CuResult> {
    let h = gpu(|g| g.module_load(kind, bytes))?;
    objects()?.modules.insert(h, Vec::new());
    Ok(h)
}

/// `CU_LIBRARY_BINARY_IS_PRESERVED`.
const BINARY_IS_PRESERVED: c_int = 1;

/// Registers a library (loaded on first use).
///
/// # Safety
/// `img` must point to a complete module image; `opts` must be null or hold
/// `n` library options.
unsafe fn library(img: *const c_void, opts: *const c_int, n: c_uint) -> Result<usize, CuResult> {
    crate::state::driver()?;
    // SAFETY: per this function's contract.
    let (kind, bytes) = unsafe { image_bytes(img) }?;
    let preserved = !opts.is_null()
        // SAFETY: `n` options (this function's contract).
        && unsafe { std::slice::from_raw_parts(opts, n as usize) }.contains(&BINARY_IS_PRESERVED);
    let image = if preserved {
        Image::Preserved {
            start: bytes.as_ptr() as usize,
            len: bytes.len(),
        }
    } else {
        Image::Copied(bytes.to_vec())
    };
    // A unique address for the handle, freed with the library.
    let h = Box::into_raw(Box::new(0u8)) as usize;
    objects()?.libraries.insert(
        h,
        Library {
            kind,
            image,
            module: None,
        },
    );
    Ok(h)
}

/// The module of library `lib`, loaded on the host now if it was not.
fn library_module(lib: CUmodule) -> Result<u64, CuResult> {
    let h = lib as usize;
    let (kind, bytes) = {
        let o = objects()?;
        let l = o.libraries.get(&h).ok_or(code::INVALID_HANDLE)?;
        if let Some(m) = l.module {
            return Ok(m);
        }
        let bytes = match &l.image {
            Image::Copied(v) => v.clone(),
            Image::Preserved { start, len } => {
                // SAFETY: the caller keeps a preserved image alive until the
                // library is unloaded (the option's contract).
                let b = unsafe { std::slice::from_raw_parts(*start as *const u8, *len) };
                b.to_vec()
            }
        };
        (l.kind, bytes)
    };
    let m = load_bytes(kind, &bytes)?;
    let mut o = objects()?;
    match o.libraries.get_mut(&h) {
        Some(l) if l.module.is_none() => {
            l.module = Some(m);
            Ok(m)
        }
        // Another thread loaded it (or unloaded the library) meanwhile.
        other => {
            let winner = other.and_then(|l| l.module);
            drop(o);
            let _ = unload(m);
            winner.ok_or(code::INVALID_HANDLE)
        }
    }
}

/// Loads the image in the file `path`.
fn load_file(path: *const c_char) -> Result<u64, CuResult> {
    // SAFETY: a NUL-terminated path (API contract); null is refused.
    let p = unsafe { c_str(path) }?;
    let mut bytes = std::fs::read(p).map_err(|_| code::FILE_NOT_FOUND)?;
    // PTX read from a file has no terminating NUL of its own.
    bytes.push(0);
    // SAFETY: `bytes` holds a whole file, NUL-terminated.
    unsafe { load_image(bytes.as_ptr() as *const c_void) }
}

fn unload(m: u64) -> Result<(), CuResult> {
    if !objects()?.modules.contains_key(&m) {
        return Err(code::INVALID_HANDLE);
    }
    gpu(|g| g.module_unload(m))?;
    let mut o = objects()?;
    if let Some(globals) = o.modules.remove(&m) {
        for p in globals {
            o.ranges.remove(&p);
        }
    }
    o.kernels.retain(|_, k| k.module != m);
    Ok(())
}

/// Looks kernel `name` up in module `m`; its handle.
fn get_function(m: u64, name: *const c_char) -> Result<u64, CuResult> {
    // SAFETY: a NUL-terminated name (API contract); null is refused.
    let n = unsafe { c_str(name) }?;
    function_named(m, n)
}

/// The handles of every kernel of module `m`, in the host's order (the
/// driver's under the cuda executor, the text's under the sim). A kernel
/// already looked up keeps its handle, as the driver's kernels do.
pub(crate) fn functions(m: u64) -> Result<Vec<u64>, CuResult> {
    if !objects()?.modules.contains_key(&m) {
        return Err(code::INVALID_HANDLE);
    }
    let names = gpu(|g| g.module_functions(m))?;
    names
        .iter()
        .map(|n| {
            let known = objects()?
                .kernels
                .iter()
                .find(|(_, k)| k.module == m && k.name.as_bytes() == n.as_bytes())
                .map(|(&h, _)| h);
            known.map_or_else(|| function_named(m, n), Ok)
        })
        .collect()
}

fn function_named(m: u64, n: &str) -> Result<u64, CuResult> {
    if !objects()?.modules.contains_key(&m) {
        return Err(code::INVALID_HANDLE);
    }
    let func = gpu(|g| g.get_function(m, n))?;
    let h = func.handle;
    objects()?.kernels.insert(
        h,
        Kernel {
            func,
            module: m,
            name: CString::new(n).map_err(|_| code::INVALID_VALUE)?,
            max_threads: Default::default(),
        },
    );
    Ok(h)
}

/// Looks global `name` up in module `m`: (address, size).
fn get_global(m: u64, name: *const c_char) -> Result<(u64, u64), CuResult> {
    // SAFETY: a NUL-terminated name (API contract); null is refused.
    let n = unsafe { c_str(name) }?;
    if !objects()?.modules.contains_key(&m) {
        return Err(code::INVALID_HANDLE);
    }
    let (addr, size) = gpu(|g| g.module_global(m, n))?;
    let mut o = objects()?;
    o.ranges.insert(
        addr,
        Range {
            size,
            kind: RangeKind::Global,
        },
    );
    if let Some(globals) = o.modules.get_mut(&m) {
        globals.push(addr);
    }
    Ok((addr, size))
}

/// The kernel behind a `CUfunction`/`CUkernel` handle.
pub(crate) fn kernel(f: CUfunction) -> Result<Kernel, CuResult> {
    objects()?
        .kernels
        .get(&(f as u64))
        .cloned()
        .ok_or(code::INVALID_HANDLE)
}

export! {
    fn cuModuleLoadData(m: *mut CUmodule, img: *const c_void) {
        need_ctx()?;
        if m.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a module image (API contract).
        let h = unsafe { load_image(img) }?;
        out(m, h as CUmodule)
    }

    /// JIT options tune the host's compilation; the image is what matters.
    fn cuModuleLoadDataEx(m: *mut CUmodule, img: *const c_void, _n: c_uint, _opts: *mut c_int, _vals: *mut *mut c_void) {
        need_ctx()?;
        if m.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a module image (API contract).
        let h = unsafe { load_image(img) }?;
        out(m, h as CUmodule)
    }

    fn cuModuleLoadFatBinary(m: *mut CUmodule, img: *const c_void) {
        need_ctx()?;
        if m.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a fat binary image (API contract).
        let h = unsafe { load_image(img) }?;
        out(m, h as CUmodule)
    }

    fn cuModuleLoad(m: *mut CUmodule, path: *const c_char) {
        need_ctx()?;
        if m.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let h = load_file(path)?;
        out(m, h as CUmodule)
    }

    fn cuModuleUnload(m: CUmodule) {
        need_ctx()?;
        unload(m as u64)
    }

    fn cuModuleGetFunction(f: *mut CUfunction, m: CUmodule, name: *const c_char) {
        need_ctx()?;
        if f.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let h = get_function(m as u64, name)?;
        out(f, h as CUfunction)
    }

    fn cuModuleGetFunctionCount(count: *mut c_uint, m: CUmodule) {
        need_ctx()?;
        if count.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let h = m as u64;
        if !objects()?.modules.contains_key(&h) {
            return Err(code::INVALID_HANDLE);
        }
        let n = gpu(|g| g.module_functions(h))?.len();
        out(count, c_uint::try_from(n).map_err(|_| code::UNKNOWN)?)
    }

    /// The first `n` of the module's kernels (all of them if it has fewer).
    fn cuModuleEnumerateFunctions(fs: *mut CUfunction, n: c_uint, m: CUmodule) {
        need_ctx()?;
        if fs.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let all = functions(m as u64)?;
        let k = all.len().min(n as usize);
        // SAFETY: the caller's array has room for `n` handles (API
        // contract), of which we write the first `k <= n`.
        let dst = unsafe { std::slice::from_raw_parts_mut(fs as *mut MaybeUninit<CUfunction>, k) };
        for (d, &f) in dst.iter_mut().zip(&all) {
            d.write(f as CUfunction);
        }
        Ok(())
    }

    fn cuModuleGetGlobal_v2(p: *mut CUdeviceptr, bytes: *mut usize, m: CUmodule, name: *const c_char) {
        need_ctx()?;
        let (addr, size) = get_global(m as u64, name)?;
        out_opt(p, addr)?;
        out_opt(bytes, size as usize)
    }

    /// Libraries load on first use, as the driver's default lazy loading
    /// does (modules load at once).
    fn cuModuleGetLoadingMode(mode: *mut c_int) {
        crate::state::driver()?;
        out(mode, 2) // CU_MODULE_LAZY_LOADING
    }

    fn cuLibraryLoadData(lib: *mut CUmodule, img: *const c_void, _jit_opts: *mut c_int, _jit_vals: *mut *mut c_void, _n_jit: c_uint, lib_opts: *mut c_int, _lib_vals: *mut *mut c_void, n_lib: c_uint) {
        if lib.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a module image and `n_lib` options (API contract).
        let h = unsafe { library(img, lib_opts, n_lib) }?;
        out(lib, h as CUmodule)
    }

    fn cuLibraryLoadFromFile(lib: *mut CUmodule, path: *const c_char, _jit_opts: *mut c_int, _jit_vals: *mut *mut c_void, _n_jit: c_uint, _lib_opts: *mut c_int, _lib_vals: *mut *mut c_void, _n_lib: c_uint) {
        if lib.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated path (API contract); null is refused.
        let p = unsafe { c_str(path) }?;
        let mut bytes = std::fs::read(p).map_err(|_| code::FILE_NOT_FOUND)?;
        bytes.push(0);
        // SAFETY: `bytes` holds a whole file, NUL-terminated, copied by `library`.
        let h = unsafe { library(bytes.as_ptr() as *const c_void, std::ptr::null(), 0) }?;
        out(lib, h as CUmodule)
    }

    fn cuLibraryUnload(lib: CUmodule) {
        let l = objects()?.libraries.remove(&(lib as usize)).ok_or(code::INVALID_HANDLE)?;
        // SAFETY: the handle is the address of the byte leaked for it by `library`.
        drop(unsafe { Box::from_raw(lib as *mut u8) });
        match l.module {
            Some(m) => unload(m),
            None => Ok(()),
        }
    }

    /// The library's module in the current context.
    fn cuLibraryGetModule(m: *mut CUmodule, lib: CUmodule) {
        need_ctx()?;
        let module = library_module(lib)?;
        out(m, module as CUmodule)
    }

    fn cuLibraryGetKernel(k: *mut CUfunction, lib: CUmodule, name: *const c_char) {
        if k.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let m = library_module(lib)?;
        let h = get_function(m, name)?;
        out(k, h as CUfunction)
    }

    fn cuLibraryGetGlobal(p: *mut CUdeviceptr, bytes: *mut usize, lib: CUmodule, name: *const c_char) {
        let m = library_module(lib)?;
        let (addr, size) = get_global(m, name)?;
        out_opt(p, addr)?;
        out_opt(bytes, size as usize)
    }

    fn cuKernelGetFunction(f: *mut CUfunction, k: CUfunction) {
        need_ctx()?;
        kernel(k)?;
        out(f, k)
    }

    fn cuKernelGetLibrary(lib: *mut CUmodule, k: CUfunction) {
        let kn = kernel(k)?;
        let o = objects()?;
        let (&h, _) = o
            .libraries
            .iter()
            .find(|(_, l)| l.module == Some(kn.module))
            .ok_or(code::INVALID_HANDLE)?;
        out(lib, h as CUmodule)
    }

    fn cuFuncGetModule(m: *mut CUmodule, f: CUfunction) {
        let kn = kernel(f)?;
        out(m, kn.module as CUmodule)
    }

    fn cuKernelGetName(name: *mut *const c_char, k: CUfunction) {
        let p = objects()?
            .kernels
            .get(&(k as u64))
            .map(|kn| kn.name.as_ptr())
            .ok_or(code::INVALID_HANDLE)?;
        // The name lives as long as the kernel's entry (until its module goes).
        out(name, p)
    }

    fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) {
        let p = objects()?
            .kernels
            .get(&(f as u64))
            .map(|kn| kn.name.as_ptr())
            .ok_or(code::INVALID_HANDLE)?;
        out(name, p)
    }

    /// Functions are loaded with their modules.
    fn cuFuncIsLoaded(state: *mut c_int, f: CUfunction) {
        kernel(f)?;
        out(state, 1) // CU_FUNCTION_LOADING_STATE_LOADED
    }

    fn cuFuncLoad(f: CUfunction) {
        kernel(f).map(drop)
    }

    fn cuLinkCreate_v2(_n: c_uint, _opts: *mut c_int, _vals: *mut *mut c_void, state: *mut *mut c_void) {
        if state.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let st = Box::into_raw(Box::new(LinkState::default()));
        out(state, st as *mut c_void)
    }

    fn cuLinkAddData_v2(st: *mut c_void, ty: c_int, data: *mut c_void, size: usize, _name: *const c_char, _n: c_uint, _opts: *mut c_int, _vals: *mut *mut c_void) {
        let kind = link_kind(ty)?;
        // SAFETY: `size` readable bytes at `data` (API contract).
        let b = unsafe { host_src(data, size) }?.to_vec();
        // SAFETY: a live link handle (API contract).
        unsafe { link_state(st) }?.inputs.push((kind, b));
        Ok(())
    }

    fn cuLinkAddFile_v2(st: *mut c_void, ty: c_int, path: *const c_char, _n: c_uint, _opts: *mut c_int, _vals: *mut *mut c_void) {
        let kind = link_kind(ty)?;
        // SAFETY: a NUL-terminated path (API contract); null is refused.
        let p = unsafe { c_str(path) }?;
        let bytes = std::fs::read(p).map_err(|_| code::FILE_NOT_FOUND)?;
        // SAFETY: a live link handle (API contract).
        unsafe { link_state(st) }?.inputs.push((kind, bytes));
        Ok(())
    }

    fn cuLinkComplete(st: *mut c_void, image: *mut *mut c_void, size: *mut usize) {
        need_ctx()?;
        // SAFETY: a live link handle (API contract).
        let state = unsafe { link_state(st) }?;
        let inputs: Vec<(u32, &[u8])> = state
            .inputs
            .iter()
            .map(|(k, b)| (*k, b.as_slice()))
            .collect();
        state.image = gpu(|g| g.link(&inputs))?;
        // The image stays valid until cuLinkDestroy, as the driver promises.
        out(image, state.image.as_mut_ptr() as *mut c_void)?;
        out(size, state.image.len())
    }

    fn cuLinkDestroy(st: *mut c_void) {
        if st.is_null() {
            return Err(code::INVALID_HANDLE);
        }
        // SAFETY: a handle from cuLinkCreate_v2, destroyed once (API contract).
        drop(unsafe { Box::from_raw(st as *mut LinkState) });
        Ok(())
    }
}

/// A link in progress (`CUlinkState`): inputs gathered in the guest, linked
/// on the host by cuLinkComplete.
#[derive(Default)]
struct LinkState {
    inputs: Vec<(u32, Vec<u8>)>,
    image: Vec<u8>,
}

/// The link state behind a handle from cuLinkCreate_v2.
///
/// # Safety
/// `st` must be a handle returned by cuLinkCreate_v2 and not yet destroyed.
unsafe fn link_state<'a>(st: *mut c_void) -> Result<&'a mut LinkState, CuResult> {
    if st.is_null() {
        return Err(code::INVALID_HANDLE);
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { &mut *(st as *mut LinkState) })
}

fn link_kind(t: c_int) -> Result<u32, CuResult> {
    match t {
        0 => Ok(protocol::link_input::CUBIN),
        1 => Ok(protocol::link_input::PTX),
        2 => Ok(protocol::link_input::FATBINARY),
        _ => Err(crate::not_supported(&format!(
            "cuLinkAddData input type {t}"
        ))),
    }
}
