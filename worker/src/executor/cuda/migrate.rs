//! Moving a context to another GPU: its objects made again under the same
//! handles (streams and events with their flags and priorities, modules
//! from their images and their functions with the attributes set, graphs
//! from the guest's nodes), its memory (its allocations and the guest's
//! own VMM memory) copied and remapped at the same addresses, and the
//! module globals whose addresses it holds copied to where they land
//! (`globals.rs`). What cannot move (`Keeper`) is named before anything
//! moves.

use std::ffi::c_void;
use std::ptr::null_mut;

use cudarc::driver::sys::{self, CUcontext, CUdevice};
use protocol::Status;

use super::check;
use super::context::{destroy_obj, let_go, make_context, CudaContext, Obj, ObjSpec, CURRENT};
use super::device::{device, retain_ahead};
use super::module::func_attr;
use super::vmm::{
    compression_supported, granted_compression, vmm_access, vmm_free, vmm_new, vmm_reserve,
    VmmAlloc,
};
use crate::executor::{Handle, Keeper, Migration, Moved, Timing};

/// A context that is no longer used, let go of when dropped (on any
/// thread): destroyed, or, for a primary context (`context.rs`), emptied
/// of the guest's objects and released.
struct OldContext {
    ctx: CUcontext,
    /// The device whose primary context `ctx` is.
    primary: Option<CUdevice>,
    /// What the guest made in it, and the worker's own streams and events.
    objs: Vec<Obj>,
    streams: Vec<sys::CUstream>,
    events: Vec<sys::CUevent>,
}

// SAFETY: nothing else refers to the context or its objects any more; the
// driver allows using a context from any thread made current there.
unsafe impl Send for OldContext {}

impl Drop for OldContext {
    fn drop(&mut self) {
        // A primary context may outlive our release (the executor's
        // registrations hold it until they move): its objects go now.
        if self.primary.is_some() {
            // SAFETY: the context is alive (we hold it); current on this
            // thread only to destroy what is ours in it.
            let r = unsafe { sys::cuCtxSetCurrent(self.ctx) };
            if r == sys::CUresult::CUDA_SUCCESS {
                for o in self.objs.drain(..) {
                    let _ = destroy_obj(o);
                }
                for st in self.streams.drain(..) {
                    // SAFETY: a stream of ours in this context, destroyed once.
                    let _ = unsafe { sys::cuStreamDestroy_v2(st) };
                }
                for e in self.events.drain(..) {
                    // SAFETY: an event of ours in this context, destroyed once.
                    let _ = unsafe { sys::cuEventDestroy_v2(e) };
                }
                // SAFETY: detaches the context from this thread.
                let _ = unsafe { sys::cuCtxSetCurrent(null_mut()) };
            }
        }
        let_go(self.ctx, self.primary);
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
                    relay: null_mut(),
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

/// Memory made on the target: handle -> (size, its handle, a temporary view).
type Staged<K> = std::collections::HashMap<K, (usize, sys::CUmemGenericAllocationHandle, u64)>;

/// Frees memory made on the target and its temporary view.
fn free_staged(padded: usize, handle: sys::CUmemGenericAllocationHandle, tmp: u64) {
    vmm_free(tmp, &VmmAlloc { padded, handle });
}

/// A context made ahead on a migration's target GPU, with the objects of
/// the context to move (as they were when it was prepared).
struct PreparedCtx {
    ctx: CUcontext,
    /// `ctx` is `dev`'s primary context (for a primary one's move).
    primary: bool,
    dev: CUdevice,
    ordinal: u32,
    objs: crate::executor::HandleMap<Obj>,
    /// Physical memory made ahead on the target for each allocation, mapped
    /// at a temporary address: va -> (padded, handle, temporary va).
    staged: Staged<u64>,
    /// The same for the guest's own physical memory (VMM), by our handle.
    staged_phys: Staged<Handle>,
}

// SAFETY: the context is current on no thread once prepared (see `prepare`);
// whoever takes it makes it current first.
unsafe impl Send for PreparedCtx {}

impl Drop for PreparedCtx {
    fn drop(&mut self) {
        for (_, (padded, handle, tmp)) in self.staged.drain().chain(self.staged_phys.drain()) {
            free_staged(padded, handle, tmp);
        }
        if !self.ctx.is_null() {
            // A context of ours nobody uses; its objects go with it.
            drop(OldContext {
                ctx: self.ctx,
                primary: self.primary.then_some(self.dev),
                objs: std::mem::take(&mut self.objs).into_values().collect(),
                streams: Vec::new(),
                events: Vec::new(),
            });
        }
    }
}

/// Makes a context on GPU `ordinal` with the objects of `specs` and memory
/// for the allocations `allocs` (va, padded size) and the guest's physical
/// memory `phys` (handle, size, compression type), and leaves it current
/// on no thread; the GPU's primary context if `primary`.
fn prepare(
    ordinal: u32,
    primary: bool,
    specs: &[(Handle, ObjSpec)],
    allocs: &[(u64, usize)],
    phys: &[(Handle, usize, u8)],
) -> Result<PreparedCtx, Status> {
    let dev = device(ordinal)?;
    retain_ahead(dev)?;
    let ctx = make_context(dev, primary)?;
    let mut p = PreparedCtx {
        ctx,
        primary,
        dev,
        ordinal,
        objs: Default::default(),
        staged: Default::default(),
        staged_phys: Default::default(),
    };
    let r = recreate_into(&mut p.objs, specs).and_then(|()| {
        for &(va, padded) in allocs {
            let (tmp, h) = vmm_new(padded, ordinal, 0)?;
            p.staged.insert(va, (padded, h, tmp));
        }
        for &(gh, n, comp) in phys {
            let (tmp, h) = vmm_new(n, ordinal, comp)?;
            p.staged_phys.insert(gh, (n, h, tmp));
        }
        Ok(())
    });
    // SAFETY: detaches whatever is current on this thread (our new context).
    let _ = unsafe { sys::cuCtxSetCurrent(null_mut()) };
    CURRENT.with(|c| c.set(0));
    r.map(|()| p)
}

/// Takes memory made ahead (if its size still fits) or makes it now (of
/// compression type `compression`).
fn staged_or_new<K: std::hash::Hash + Eq>(
    staged: &mut Staged<K>,
    key: &K,
    n: usize,
    target: u32,
    compression: u8,
) -> Result<(sys::CUmemGenericAllocationHandle, u64), Status> {
    match staged.remove(key) {
        Some((padded, h, tmp)) if padded == n => Ok((h, tmp)),
        other => {
            if let Some((padded, handle, tmp)) = other {
                free_staged(padded, handle, tmp);
            }
            let (tmp, h) = vmm_new(n, target, compression)?;
            Ok((h, tmp))
        }
    }
}

/// Copies `n` bytes at `src` (source context) to `dst` (target context):
/// directly where the target reaches the source's memory (`direct`; the
/// range is opened to it), else through the driver's staging.
///
/// # Safety
/// Both ranges must be live, `n` bytes, mapped in the two contexts; the
/// target context must be current.
unsafe fn copy_over(
    dst: u64,
    dst_ctx: CUcontext,
    src: u64,
    src_ctx: CUcontext,
    n: usize,
    direct: bool,
) -> Result<(), Status> {
    if direct {
        // SAFETY: the caller's promise; the default stream of the current
        // (target) context.
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, n, null_mut()) })
    } else {
        // SAFETY: the caller's promise.
        check(unsafe { sys::cuMemcpyPeer(dst, dst_ctx, src, src_ctx, n) })
    }
}

/// What a migration made on the target and on the source, put in place or
/// undone once the copy is over: the target's memory for each allocation
/// (address, padded size, the driver's handle, its temporary view) and for
/// the guest's own physical memory (by our handle), the views of the
/// latter on the source, and where each global the guest holds landed.
#[derive(Default)]
struct Copied {
    staged: Vec<(u64, usize, sys::CUmemGenericAllocationHandle, u64)>,
    staged_phys: Vec<(Handle, usize, sys::CUmemGenericAllocationHandle, u64)>,
    views: Vec<(u64, usize)>,
    homes: Vec<u64>,
}

impl CudaContext {
    /// Copies the context's memory (its allocations and the guest's own
    /// physical memory) and the globals the guest holds into the prepared
    /// context `p` on `target`, after making there the objects made since it
    /// was prepared (`missing`) and destroying those dropped since (`gone`);
    /// notes in `c` what it made on the target. Returns the bytes copied.
    fn copy_to(
        &self,
        p: &mut PreparedCtx,
        target: u32,
        missing: &[(Handle, ObjSpec)],
        gone: Vec<Handle>,
        c: &mut Copied,
    ) -> Result<u64, Status> {
        let src = self.ordinal;
        recreate_into(&mut p.objs, missing)?;
        for h in gone {
            // Objects of the prepared context, each destroyed once.
            match p.objs.remove(&h) {
                Some(Obj::Stream { raw, .. }) => {
                    // SAFETY: a stream of the prepared context (current
                    // here), out of its map: destroyed once.
                    let _ = unsafe { sys::cuStreamDestroy_v2(raw) };
                }
                Some(Obj::Event { raw, relay, .. }) => {
                    let _ = super::context::destroy_event(raw, relay);
                }
                Some(Obj::Module { raw, .. }) => {
                    // SAFETY: a module of the prepared context (current
                    // here), out of its map: unloaded once.
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
        let direct = direct != 0;
        let both = [vmm_access(src), vmm_access(target)];
        let mut bytes = 0u64;
        for (&va, a) in &self.allocs {
            let (h, tmp) = staged_or_new(&mut p.staged, &va, a.padded, target, 0)?;
            c.staged.push((va, a.padded, h, tmp));
            if direct {
                // SAFETY: our own mapped range; two descriptors.
                check(unsafe { sys::cuMemSetAccess(va, a.padded, both.as_ptr(), 2) })?;
            }
            // SAFETY: `tmp` (target) and `va` (source) are live ranges of
            // `a.padded` bytes in the two contexts, `va` open to the
            // target if `direct`; the target context is current.
            unsafe { copy_over(tmp, p.ctx, va, self.ctx, a.padded, direct) }?;
            bytes += a.padded as u64;
        }
        // The guest's own physical memory, mapped or not, through a
        // view of each on the source.
        for (&gh, (old, n)) in &self.guest_vmm.phys {
            let (old, n) = (old.0, *n);
            let comp = self.guest_vmm.compression_of(gh);
            let (h, tmp) = staged_or_new(&mut p.staged_phys, &gh, n, target, comp)?;
            c.staged_phys.push((gh, n, h, tmp));
            // The same memory, or none: never compressible memory made
            // plain (or plain made compressible) behind the guest.
            let got = if comp == 0 {
                0
            } else {
                granted_compression(h)?
            };
            if got != comp {
                tracing::warn!(
                    to = target,
                    "GPU {target} made compression type {got} where the guest holds {comp} \
                     ({}): the vGPU cannot move there",
                    Keeper::CompressibleMemory
                );
                return Err(Status::NotSupported);
            }
            let view = vmm_reserve(n)?;
            // SAFETY: a fresh reservation of `n` bytes; `old` has `n` bytes.
            if let Err(e) = check(unsafe { sys::cuMemMap(view, n, 0, old, 0) }) {
                // SAFETY: our own reservation, nothing mapped.
                let _ = unsafe { sys::cuMemAddressFree(view, n) };
                return Err(e);
            }
            c.views.push((view, n));
            let k = if direct { 2 } else { 1 };
            // SAFETY: the range just mapped; `k` descriptors.
            check(unsafe { sys::cuMemSetAccess(view, n, both.as_ptr(), k) })?;
            // SAFETY: `tmp` (target) and `view` (source) are live ranges
            // of `n` bytes, `view` open to the target if `direct`.
            unsafe { copy_over(tmp, p.ctx, view, self.ctx, n, direct) }?;
            bytes += n as u64;
        }
        // The globals the guest holds: where each lands in the target's
        // modules, with its contents.
        for t in &self.globals.taken {
            let Some(Obj::Module { raw: m, .. }) = p.objs.get(&t.module) else {
                return Err(Status::InvalidHandle);
            };
            let (mut at, mut size) = (0u64, 0usize);
            // SAFETY: a module of the target context; out-parameters on
            // our stack; a NUL-terminated name.
            check(unsafe { sys::cuModuleGetGlobal_v2(&mut at, &mut size, *m, t.name.as_ptr()) })?;
            if size as u64 != t.size {
                return Err(Status::InvalidImage);
            }
            if size > 0 {
                // SAFETY: the global's `size` bytes in each context.
                check(unsafe { sys::cuMemcpyPeer(at, p.ctx, t.now, self.ctx, size) })?;
            }
            c.homes.push(at);
            bytes += size as u64;
        }
        // SAFETY: no arguments; the target context is current.
        check(unsafe { sys::cuCtxSynchronize() })?;
        Ok(bytes)
    }

    /// Maps each allocation's range to its copy on the target (`staged`:
    /// the address, padded size, the driver's handle, its temporary view)
    /// and releases the old memory. Returns how many ranges it switched.
    fn switch_allocs(
        &mut self,
        staged: Vec<(u64, usize, sys::CUmemGenericAllocationHandle, u64)>,
        target: u32,
    ) -> Result<u64, Status> {
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
        Ok(allocations)
    }

    /// Maps the guest's physical memory made on the target (`staged`: our
    /// handle, size, the driver's handle, its temporary view) wherever the
    /// guest mapped the old, and releases the old.
    fn switch_guest_vmm(
        &mut self,
        staged: Vec<(Handle, usize, sys::CUmemGenericAllocationHandle, u64)>,
        target: u32,
    ) -> Result<(), Status> {
        for (&va, &(n, _, _)) in &self.guest_vmm.maps {
            // SAFETY: the guest's own mapping, undone once here (mapped
            // again below).
            let _ = unsafe { sys::cuMemUnmap(va, n) };
        }
        for (gh, n, h, tmp) in staged {
            // The old memory, no longer mapped anywhere, is released as
            // it is dropped (`Phys::drop`; nothing else holds it: memory
            // shared through a shareable handle keeps the vGPU).
            self.guest_vmm
                .phys
                .insert(gh, (std::sync::Arc::new(super::vmm::Phys(h)), n));
            // SAFETY: the temporary view of `h`, undone once.
            let _ = unsafe { sys::cuMemUnmap(tmp, n) };
            // SAFETY: the temporary reservation, freed once.
            let _ = unsafe { sys::cuMemAddressFree(tmp, n) };
        }
        let acc = vmm_access(target);
        for (&va, &(n, gh, off)) in &self.guest_vmm.maps {
            let h = self
                .guest_vmm
                .phys
                .get(&gh)
                .ok_or(Status::InvalidHandle)?
                .0
                 .0;
            // SAFETY: `va..va + n` lies in the guest's reservation, now
            // unmapped; `off + n` within `h`'s memory (as when first mapped).
            check(unsafe { sys::cuMemMap(va, n, crate::usize_from(off), h, 0) })?;
            // SAFETY: the range just mapped; one descriptor.
            check(unsafe { sys::cuMemSetAccess(va, n, &acc, 1) })?;
        }
        Ok(())
    }
}

impl Migration for CudaContext {
    fn migrate(
        &mut self,
        target: u32,
        prepared: Option<crate::executor::Prepared>,
    ) -> Result<Moved, Status> {
        if target == self.ordinal {
            return Ok(Moved::default());
        }
        if let Some(k) = self.migration_keeper_to(target) {
            tracing::warn!(to = target, "a guest process holds {k}: it cannot migrate");
            return Err(Status::NotSupported);
        }
        self.bind()?;
        // Drain at a kernel boundary: what was submitted finishes here.
        // SAFETY: no arguments; our context is current.
        check(unsafe { sys::cuCtxSynchronize() })?;
        let _ = self.take_timings();
        // The target's context, made ahead on a helper thread if it was.
        let mut p = match prepared.and_then(|b| b.downcast::<PreparedCtx>().ok()) {
            Some(p) if p.ordinal == target && p.primary == self.primary => *p,
            _ => prepare(target, self.primary, &self.specs(), &[], &[])?,
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
        let mut c = Copied::default();
        let result = self.copy_to(&mut p, target, &missing, gone, &mut c);
        for (view, n) in c.views.drain(..) {
            // SAFETY: our own view, its copies done (synchronized above, or
            // given up); undone once.
            let _ = unsafe { sys::cuMemUnmap(view, n) };
            // SAFETY: as above.
            let _ = unsafe { sys::cuMemAddressFree(view, n) };
        }
        // The guest's graphs, built again in the target's context (with its
        // objects, and its globals' new homes).
        let old_homes: Vec<u64> = self.globals.taken.iter().map(|t| t.now).collect();
        let result = result.and_then(|bytes| {
            self.globals.set_homes(&c.homes);
            std::mem::swap(&mut self.ctx, &mut p.ctx);
            std::mem::swap(&mut self.objs, &mut p.objs);
            let built: Result<std::collections::HashMap<Handle, super::graph::HostGraph>, Status> =
                self.graphs
                    .iter()
                    .map(|(&h, g)| Ok((h, self.build_graph(&g.nodes)?)))
                    .collect();
            std::mem::swap(&mut self.ctx, &mut p.ctx);
            std::mem::swap(&mut self.objs, &mut p.objs);
            built.map(|g| (bytes, g))
        });
        let (bytes, graphs) = match result {
            Ok(b) => b,
            Err(e) => {
                self.globals.set_homes(&old_homes);
                for (_, padded, h, tmp) in c.staged.into_iter().chain(
                    c.staged_phys
                        .into_iter()
                        .map(|(_, n, h, tmp)| (0, n, h, tmp)),
                ) {
                    free_staged(padded, h, tmp);
                }
                drop(p); // the prepared context, its objects and graphs
                CURRENT.with(|c| c.set(0));
                self.bind()?;
                return Err(e);
            }
        };
        // The switch: each address range now maps the target's copy.
        let mut allocations = self.switch_allocs(c.staged, target)?;
        self.switch_guest_vmm(c.staged_phys, target)?;
        allocations += self.guest_vmm.phys.len() as u64;
        // The old context (its streams, events, modules and graphs; their
        // replacements live in the new one) is destroyed off the pause, on
        // a thread of its own: that takes tens of milliseconds.
        self.templates.clear();
        // The worker moves a vGPU between requests, its work drained: any
        // timing or mark left is passed; its events go with the old context.
        let mut events = std::mem::take(&mut self.event_pool);
        events.extend(self.take_timing_events());
        let old = OldContext {
            ctx: self.ctx,
            primary: self.primary.then_some(self.dev),
            objs: std::mem::replace(&mut self.objs, std::mem::take(&mut p.objs))
                .into_values()
                .collect(),
            streams: [std::mem::replace(&mut self.copy, null_mut())]
                .into_iter()
                .filter(|s| !s.is_null())
                .collect(),
            events,
        };
        let _ = std::thread::Builder::new()
            .name("ctx-destroy".into())
            .spawn(move || drop(old));
        self.ctx = std::mem::replace(&mut p.ctx, null_mut());
        self.dev = p.dev;
        self.ordinal = target;
        self.graphs = graphs;
        self.sliced.clear();
        // The guest's stream attributes, on the new streams (a hint to the
        // device: one the target refuses is not worth failing the move).
        if let Err(e) = self.bind().and_then(|()| self.apply_stream_attrs()) {
            tracing::debug!("stream attributes not set again after the move: {e:?}");
        }
        Ok(Moved { bytes, allocations })
    }

    fn prepare_migration(&self, target: u32) -> Option<crate::executor::PrepareJob> {
        if target == self.ordinal || self.migration_keeper_to(target).is_some() {
            return None;
        }
        let specs = self.specs();
        let allocs: Vec<(u64, usize)> = self.allocs.iter().map(|(&va, a)| (va, a.padded)).collect();
        let phys: Vec<(Handle, usize, u8)> = self
            .guest_vmm
            .phys
            .iter()
            .map(|(&h, &(_, n))| (h, n, self.guest_vmm.compression_of(h)))
            .collect();
        let primary = self.primary;
        Some(Box::new(move || {
            prepare(target, primary, &specs, &allocs, &phys)
                .map(|p| Box::new(p) as crate::executor::Prepared)
        }))
    }

    /// See [`crate::executor::Migration::migration_keeper`].
    fn migration_keeper(&self) -> Option<Keeper> {
        if !self.vmm {
            return Some(Keeper::PlainMemory);
        }
        if !self.scopes.is_empty() || self.graphs.values().any(|g| g.scoped) {
            return Some(Keeper::ConditionalGraph);
        }
        self.arrays.keeper()
    }

    /// See [`crate::executor::Migration::migration_keeper_to`]: compressible
    /// memory stays where it is if the target has no generic compression.
    fn migration_keeper_to(&self, target: u32) -> Option<Keeper> {
        self.migration_keeper().or_else(|| {
            (target != self.ordinal
                && !self.guest_vmm.compressed.is_empty()
                && !compression_supported(target))
            .then_some(Keeper::CompressibleMemory)
        })
    }
}
