//! A GPU context's image, and a context made again from one in another
//! worker (on another GPU or host): its allocations reserved again at
//! their device addresses and filled with their bytes, its modules loaded
//! again from their images, its functions, streams and events made again
//! through the calls a guest's would take, and re-keyed to their handles;
//! the globals the guest holds found where the driver put them, as after a
//! move (`globals.rs`).

use std::ffi::{c_void, CString};

use cudarc::driver::sys;
use protocol::stream_attr::StreamAttr;
use protocol::Status;

use super::check;
use super::context::{CudaContext, Obj};
use super::vmm::{vmm_map, VmmAlloc};
use crate::checkpoint::Blob;
use crate::executor::checkpoint::{
    Allocation, Checkpoint, ContextImage, EventImage, FunctionImage, GlobalImage, GraphImage,
    LeftOut, ModuleImage, StreamImage,
};
use crate::executor::{Events, Handle, Keeper, Limits, Memory, Modules, StreamAttributes, Streams};

/// `n` bytes of device memory at `src`, read back (the context is current).
fn read_back(src: u64, n: u64) -> Result<Vec<u8>, Status> {
    let mut v = Vec::new();
    v.try_reserve_exact(crate::usize_from(n))
        .map_err(|_| Status::OutOfMemory)?;
    v.resize(crate::usize_from(n), 0);
    // SAFETY: `src` is `n` bytes of this context's memory; `v` holds `n` bytes.
    check(unsafe { sys::cuMemcpyDtoH_v2(v.as_mut_ptr() as *mut c_void, src, v.len()) })?;
    Ok(v)
}

/// Whether a module image is PTX text (not a cubin or fat binary).
fn is_ptx(image: &[u8]) -> bool {
    !(image.starts_with(b"\x7fELF") || protocol::fatbin::is_fatbin(image))
}

impl Checkpoint for CudaContext {
    fn restore_into(&mut self, image: &ContextImage) -> Result<(), Status> {
        self.restore_image(image)
    }

    fn checkpoint_keeper(&self) -> Option<Keeper> {
        if !self.plain.is_empty() {
            return Some(Keeper::PlainMemory);
        }
        let conditional = |g: &super::graph::HostGraph| {
            g.scoped || crate::executor::checkpoint::has_conditional(&g.nodes)
        };
        if !self.scopes.is_empty() || self.graphs.values().any(conditional) {
            return Some(Keeper::ConditionalGraph);
        }
        if let Some(k) = self.arrays.keeper() {
            return Some(k);
        }
        let imported = self
            .objs
            .values()
            .any(|o| matches!(o, Obj::ImportedEvent { .. }));
        if imported || !self.opened.is_empty() {
            return Some(Keeper::IpcAcrossWorkers);
        }
        let vmm = &self.guest_vmm;
        if !(vmm.reserved.is_empty() && vmm.phys.is_empty() && vmm.maps.is_empty()) {
            return Some(Keeper::VirtualMemory);
        }
        None
    }

    fn checkpoint(&mut self) -> Result<ContextImage, Status> {
        self.image(true)
    }

    fn checkpoint_shape(&mut self) -> Result<ContextImage, Status> {
        self.image(false)
    }

    fn read_left_out(&mut self, blob: LeftOut, dst: &mut [u8]) -> Result<(), Status> {
        let src = match blob {
            LeftOut::Allocation(addr) => {
                let a = self.allocs.get(&addr).ok_or(Status::InvalidValue)?;
                if dst.len() > a.padded {
                    return Err(Status::InvalidValue);
                }
                addr
            }
            LeftOut::Global(guest) => {
                let t = self
                    .globals
                    .taken
                    .iter()
                    .find(|t| t.guest == guest)
                    .ok_or(Status::InvalidValue)?;
                if dst.len() as u64 > t.size {
                    return Err(Status::InvalidValue);
                }
                t.now
            }
        };
        self.bind()?;
        // SAFETY: `src` starts at least `dst.len()` bytes of this (current)
        // context's memory (checked above); `dst` is writable host memory.
        check(unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len()) })
    }

    fn stage(&mut self, image: &ContextImage) -> Result<usize, Status> {
        self.stage_image(image)
    }

    fn staged_taken(&self) -> usize {
        self.staged.taken()
    }

    fn unstage(&mut self) {
        if self.bind().is_ok() {
            self.unstage_modules();
        }
    }

    fn param_sizes(&self, func: Handle) -> Option<Vec<u32>> {
        match self.objs.get(&func) {
            Some(Obj::Function { sizes, .. }) => Some(sizes.clone()),
            _ => None,
        }
    }
}

impl CudaContext {
    /// Its image once its work is done: the bytes of its memory and globals
    /// read back if `with_bytes`, else left out.
    fn image(&mut self, with_bytes: bool) -> Result<ContextImage, Status> {
        if self.checkpoint_keeper().is_some() {
            return Err(Status::NotSupported);
        }
        self.bind()?;
        let t = std::time::Instant::now();
        // SAFETY: no arguments; our context is current.
        check(unsafe { sys::cuCtxSynchronize() })?;
        tracing::debug!(ms = crate::millis(t.elapsed()), "its work finished");
        let mut memory = Vec::with_capacity(self.allocs.len());
        for (&addr, a) in &self.allocs {
            let len = a.padded as u64;
            memory.push(Allocation {
                addr,
                len,
                bytes: if with_bytes {
                    read_back(addr, len)?.into()
                } else {
                    Blob::default()
                },
            });
        }
        let mut image = ContextImage {
            next_handle: self.next_handle + 1,
            memory,
            ..ContextImage::default()
        };
        for (&handle, o) in &self.objs {
            match o {
                Obj::Module { image: img, .. } => {
                    let mut globals = Vec::new();
                    for t in self.globals.taken.iter().filter(|t| t.module == handle) {
                        if t.size == 0 {
                            continue;
                        }
                        globals.push(GlobalImage {
                            name: t.name.to_string_lossy().into_owned(),
                            addr: t.guest,
                            len: t.size,
                            bytes: if with_bytes {
                                read_back(t.now, t.size)?.into()
                            } else {
                                Blob::default()
                            },
                        });
                    }
                    image.modules.push(ModuleImage {
                        handle,
                        ptx: is_ptx(img),
                        len: img.len() as u64,
                        globals,
                        image: Blob::Shared(img.clone()),
                    });
                }
                Obj::Function {
                    module,
                    name,
                    attrs,
                    ..
                } => image.functions.push(FunctionImage {
                    handle,
                    module: *module,
                    name: name.to_string_lossy().into_owned(),
                    attrs: attrs.clone(),
                }),
                Obj::Stream {
                    flags, priority, ..
                } => {
                    let mut attrs = vec![StreamAttr::Priority(*priority)];
                    attrs.extend(
                        self.stream_attrs
                            .of(handle)
                            .iter()
                            .filter(|a| !matches!(a, StreamAttr::Priority(_))),
                    );
                    image.streams.push(StreamImage {
                        handle,
                        flags: *flags,
                        attrs: attrs
                            .iter()
                            .map(|a| (a.id(), a.to_raw().to_vec()))
                            .collect(),
                    });
                }
                Obj::Event { flags, .. } => image.events.push(EventImage {
                    handle,
                    flags: *flags,
                    recorded: false,
                }),
                Obj::ImportedEvent { .. } => return Err(Status::NotSupported),
            }
        }
        for &(l, before) in &self.limits0.clone() {
            let now = self.limit(l)?;
            if now != before as u64 {
                image.limits.push((l, now));
            }
        }
        image.graphs = self
            .graphs
            .iter()
            .map(|(&h, g)| GraphImage::of(h, &g.nodes))
            .collect();
        image.sort();
        Ok(image)
    }

    /// Moves the object made under handle `made` to handle `to`.
    fn rekey(&mut self, made: Handle, to: Handle) -> Result<(), Status> {
        let o = self.objs.remove(&made).ok_or(Status::InvalidHandle)?;
        self.objs.insert(to, o);
        Ok(())
    }

    /// `a`'s range reserved at its own address, backed by memory of this
    /// GPU and filled with its bytes.
    fn restore_allocation(&mut self, a: &Allocation) -> Result<(), Status> {
        let padded = crate::usize_from(self.footprint(a.len));
        let va = a.addr;
        if !super::window::take(va, padded as u64) {
            tracing::warn!(
                addr = format_args!("{va:#x}"),
                len = a.len,
                "a restored allocation's addresses are not free in this worker's window"
            );
            return Err(Status::InvalidValue);
        }
        let handle = vmm_map(va, padded, self.ordinal, 0).inspect_err(|_| {
            super::window::give(va, padded as u64);
        })?;
        self.allocs.insert(va, VmmAlloc { padded, handle });
        // Runs of a stream's holes are zeros: set on the device, not
        // copied (most of a training's memory, `Blob::runs`).
        for (at, n, zero) in a.bytes.runs() {
            let dst = va + at as u64;
            // `va` is `padded` >= `a.len` bytes just mapped in this
            // (current) context, and `a.bytes` holds `a.len` bytes
            // (checked), of which `[at, at + n)` is a run.
            if zero {
                // SAFETY: `n` bytes of device memory at `dst` (above).
                check(unsafe { sys::cuMemsetD8_v2(dst, 0, n) })?;
            } else {
                let src = a.bytes[at..at + n].as_ptr() as *const c_void;
                // SAFETY: `n` bytes at `dst` (above) from `n` host bytes.
                check(unsafe { sys::cuMemcpyHtoD_v2(dst, src, n) })?;
            }
        }
        Ok(())
    }

    /// Makes the objects of `image` again, each through the call a
    /// guest's would take, under its handle.
    fn restore_objects(&mut self, image: &ContextImage) -> Result<(), Status> {
        for m in &image.modules {
            let kind = m.kind();
            let h = self.load_module(kind, &m.image)?;
            self.rekey(h, m.handle)?;
            for g in &m.globals {
                let (now, size) = self.module_global(m.handle, &g.name)?;
                if size != g.len {
                    return Err(Status::InvalidImage);
                }
                // `module_global` noted it at `now`: the guest holds `g.addr`.
                self.globals.taken.pop();
                let name = CString::new(g.name.as_str()).map_err(|_| Status::InvalidValue)?;
                self.globals.restored(m.handle, name, g.addr, now, size);
                // SAFETY: the global's `size` bytes in this (current)
                // context; `g.bytes` holds as many (checked).
                check(unsafe {
                    sys::cuMemcpyHtoD_v2(now, g.bytes.as_ptr() as *const c_void, g.bytes.len())
                })?;
            }
        }
        for f in &image.functions {
            let (h, _) = self.function(f.module, &f.name)?;
            self.rekey(h, f.handle)?;
            for &(a, v) in &f.attrs {
                self.func_set_attribute(f.handle, a, v)?;
            }
        }
        for s in &image.streams {
            let attrs = s.checked_attrs()?;
            let priority = attrs
                .iter()
                .find_map(|a| match a {
                    StreamAttr::Priority(p) => Some(*p),
                    _ => None,
                })
                .unwrap_or(0);
            let h = self.stream_create(s.flags, priority)?;
            self.rekey(h, s.handle)?;
            for a in attrs {
                if !matches!(a, StreamAttr::Priority(_)) {
                    self.stream_set_attribute(s.handle, a)?;
                }
            }
        }
        for e in &image.events {
            let h = self.event_create(e.flags)?;
            self.rekey(h, e.handle)?;
        }
        // Last: their nodes name the functions and events above.
        for g in &image.graphs {
            let built = self.build_graph(&g.decoded()?)?;
            if let Some(old) = self.graphs.insert(g.handle, built) {
                old.destroy();
            }
        }
        Ok(())
    }
}

impl CudaContext {
    /// [`Checkpoint::restore_into`]: memory first, at its addresses in this
    /// worker's window, then the objects under their handles.
    fn restore_image(&mut self, image: &ContextImage) -> Result<(), Status> {
        image.check()?;
        let empty = self.allocs.is_empty()
            && self.plain.is_empty()
            && self.objs.is_empty()
            && self.graphs.is_empty();
        if !empty {
            return Err(Status::InvalidContext);
        }
        let t = std::time::Instant::now();
        self.bind()?;
        // Memory first: the modules loaded after it cannot land on it.
        for a in &image.memory {
            self.restore_allocation(a)?;
        }
        let memory_ms = crate::millis(t.elapsed());
        // New objects take handles above every one of the image's, then
        // move down to theirs.
        self.next_handle = image.next_handle.saturating_sub(1);
        self.restore_objects(image)?;
        self.next_handle = image.next_handle.saturating_sub(1);
        for &(l, v) in &image.limits {
            self.set_limit(l, v)?;
        }
        // SAFETY: no arguments; the context is current.
        check(unsafe { sys::cuCtxSynchronize() })?;
        tracing::debug!(
            memory_ms,
            allocations = image.memory.len(),
            objects_ms = crate::millis(t.elapsed()) - memory_ms,
            modules = image.modules.len(),
            "a context made again"
        );
        Ok(())
    }
}
