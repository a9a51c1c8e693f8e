//! Moving a context to another GPU: its objects made again under the same
//! handles, its memory copied and remapped at the same addresses.

use std::ffi::c_void;
use std::ptr::null_mut;

use cudarc::driver::sys::{self, CUcontext, CUdevice};
use protocol::Status;

use super::check;
use super::context::{CudaContext, Obj, ObjSpec, CURRENT};
use super::device::device;
use super::module::func_attr;
use super::vmm::{vmm_access, vmm_free, vmm_new, VmmAlloc};
use crate::executor::{Handle, Moved};

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
    into: &mut crate::executor::HandleMap<Obj>,
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
            ObjSpec::Function(..) | ObjSpec::Nothing => continue,
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
    objs: crate::executor::HandleMap<Obj>,
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

impl CudaContext {
    pub(super) fn prepare_migration(&self, target: u32) -> Option<crate::executor::PrepareJob> {
        if target == self.ordinal
            || !self.vmm
            || self.globals_taken
            || !self.guest_vmm.is_empty()
            || !self.graphs.is_empty()
            || !self.arrays.is_empty()
        {
            return None;
        }
        let specs = self.specs();
        let allocs: Vec<(u64, usize)> = self.allocs.iter().map(|(&va, a)| (va, a.padded)).collect();
        Some(Box::new(move || {
            prepare(target, &specs, &allocs).map(|p| Box::new(p) as crate::executor::Prepared)
        }))
    }

    pub(super) fn migrate(
        &mut self,
        target: u32,
        prepared: Option<crate::executor::Prepared>,
    ) -> Result<Moved, Status> {
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
        if !self.graphs.is_empty() {
            // Its graphs would have to be built again there: the vGPU stays.
            tracing::warn!("a context holding graphs does not move to another GPU");
            return Err(Status::NotSupported);
        }
        if !self.arrays.is_empty() {
            // Arrays and the objects over them are not made again there.
            tracing::warn!(
                "a context holding CUDA arrays, texture or surface objects does not move to \
                 another GPU"
            );
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
