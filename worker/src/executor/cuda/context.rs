//! A guest process's CUDA context: its driver objects under our handles,
//! making it current, recycling it, and its limits. The `Context` trait is
//! in `calls.rs`, each call passed to the file of its API family.

use std::cell::Cell;
use std::ffi::CString;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys::{self, CUcontext, CUdevice};
use protocol::Status;

use super::batch;
use super::check;
use super::vmm::{vmm_free, vmm_prop, GuestVmm, VmmAlloc};
use crate::executor::{GraphLaunches, Handle, Limits};

thread_local! {
    pub(super) static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Whether a guest context of this worker is its GPU's primary context.
///
/// A GPU takes about a hundred contexts, whatever memory is free
/// (`results/2026-11-28-h100-contexts-per-gpu.md`). The worker registers
/// the VM's host memory in the primary context (`device.rs`); were the
/// guest's context one more, each attached process would cost two. So the
/// first guest context of a worker is the primary context itself, retained
/// rather than made, and emptied rather than destroyed when the guest is
/// done with it; later ones are made, as natively.
static PRIMARY_TAKEN: AtomicBool = AtomicBool::new(false);

/// A driver object the guest holds by handle. Handles are ours (not the
/// driver's pointers), so that the objects can be re-created on another GPU
/// under the same handles when the vGPU moves.
pub(super) enum Obj {
    Stream {
        raw: sys::CUstream,
        flags: u32,
        priority: i32,
    },
    Event {
        raw: sys::CUevent,
        flags: u32,
        /// Once exported (IPC): a stream of this context on which other
        /// contexts' records of the event are made (see
        /// `CudaContext::event_record`); null until then.
        relay: sys::CUstream,
    },
    /// Another context's event, opened by IPC handle: used, never
    /// destroyed here, not made again elsewhere (the worker revokes event
    /// handles when it migrates).
    ImportedEvent {
        raw: sys::CUevent,
        /// The owner's relay stream for the event.
        relay: sys::CUstream,
        /// An event of this context marking where a record of the
        /// imported event was made on one of its streams; null until the
        /// first record.
        local: sys::CUevent,
    },
    /// The image is kept to load the module again on another GPU.
    Module {
        raw: sys::CUmodule,
        image: std::sync::Arc<[u8]>,
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
pub(super) enum ObjSpec {
    /// Flags and priority.
    Stream(u32, i32),
    Event(u32),
    Module(std::sync::Arc<[u8]>),
    /// Module, name, parameter sizes, attributes set.
    Function(Handle, CString, Vec<u32>, Vec<(u32, i32)>),
    /// Not made again (an imported event).
    Nothing,
}

pub(super) struct CudaContext {
    pub(super) ctx: CUcontext,
    /// `ctx` is `dev`'s primary context (see [`PRIMARY_TAKEN`]): shared
    /// with the executor's registrations, so released, not destroyed, and
    /// emptied of the guest's objects first.
    pub(super) primary: bool,
    pub(super) dev: CUdevice,
    pub(super) ordinal: u32,
    /// Allocations are VMM ranges (movable to another GPU at the same
    /// addresses); false on one-GPU hosts, where plain cuMemAlloc is used.
    pub(super) vmm: bool,
    pub(super) granularity: usize,
    pub(super) allocs: std::collections::BTreeMap<u64, VmmAlloc>,
    /// Plain (`cuMemAlloc`) allocations, freed one by one when the context
    /// is recycled (destroying it frees them all at once).
    pub(super) plain: std::collections::HashSet<u64>,
    /// The limits of the context as it was made, restored when recycled.
    pub(super) limits0: Vec<(u32, usize)>,
    pub(super) objs: crate::executor::HandleMap<Obj>,
    pub(super) next_handle: Handle,
    /// The module globals whose addresses the guest learnt, and where each
    /// is after a move (see `globals.rs`).
    pub(super) globals: super::globals::Globals,
    /// Idle timing events, and (function, start, end) of timed launches in flight.
    pub(super) event_pool: Vec<sys::CUevent>,
    pub(super) timed: Vec<(Handle, sys::CUevent, sys::CUevent)>,
    /// The busy period being timed: its start event and, once it ended,
    /// one end event per stream it used.
    pub(super) period: Option<(sys::CUevent, Vec<sys::CUevent>)>,
    /// Each function's sliceable variant (`ptx::SLICE_SUFFIX`), looked up
    /// once; `None`: it has none.
    pub(super) sliced: std::collections::HashMap<Handle, Option<sys::CUfunction>>,
    /// Graph templates for runs of queued launches (see `batch`).
    pub(super) templates: batch::Templates,
    /// The guest's stream attributes (see `stream_attrs.rs`).
    pub(super) stream_attrs: super::stream_attrs::StreamAttrs,
    /// Marks the worker waits on: their events, one per stream marked.
    pub(super) marks: std::collections::HashMap<crate::executor::Marker, Vec<sys::CUevent>>,
    pub(super) next_mark: crate::executor::Marker,
    /// The stream device-to-host copies into the arenas go on (made when
    /// first needed; non-blocking, so that it waits for no other stream).
    pub(super) copy: sys::CUstream,
    /// The guest's own reservations, physical memory and mappings.
    pub(super) guest_vmm: GuestVmm,
    /// The guest's graphs, built here (see `graph.rs`).
    pub(super) graphs: std::collections::HashMap<Handle, super::graph::HostGraph>,
    /// Conditional scopes: their graphs (see `conditional.rs`).
    pub(super) scopes: std::collections::HashMap<Handle, sys::CUgraph>,
    /// The guest's arrays, texture and surface objects (see `arrays.rs`):
    /// a context holding any stays on its GPU.
    pub(super) arrays: super::arrays::CudaArrays,
    /// Memory of other workers' processes opened here (see `ipc.rs`).
    pub(super) opened: std::collections::HashMap<u64, super::ipc::Opened>,
    /// Its interprocess events are made so (process slots, `ipc.rs`).
    pub(super) ipc_events: bool,
    /// Modules loaded ahead of a restore (`staged.rs`): the module and the
    /// image it was loaded from, as an `Obj::Module` keeps them.
    pub(super) staged: crate::executor::staged::Staged<(sys::CUmodule, std::sync::Arc<[u8]>)>,
}

// SAFETY: a CUcontext may be used from any thread once made current there;
// every entry point below makes it current before use.
unsafe impl Send for CudaContext {}

impl CudaContext {
    pub(super) fn new(
        dev: CUdevice,
        ordinal: u32,
        vmm: bool,
        graphs: GraphLaunches,
    ) -> Result<CudaContext, Status> {
        let primary = !PRIMARY_TAKEN.swap(true, Ordering::AcqRel);
        let ctx = match make_context(dev, primary) {
            Ok(c) => c,
            Err(e) => {
                if primary {
                    PRIMARY_TAKEN.store(false, Ordering::Release);
                }
                return Err(e);
            }
        };
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
                let_go(ctx, primary.then_some(dev));
                if primary {
                    PRIMARY_TAKEN.store(false, Ordering::Release);
                }
                return Err(e);
            }
        }
        Ok(CudaContext {
            ctx,
            primary,
            dev,
            ordinal,
            vmm,
            granularity: granularity.max(1),
            allocs: Default::default(),
            plain: Default::default(),
            limits0: (0..7)
                .filter_map(|l| {
                    let mut v = 0usize;
                    // SAFETY: out-parameter on our stack; the new context is current.
                    let r = unsafe { sys::cuCtxGetLimit(&mut v, cu_limit(l).ok()?) };
                    (r == sys::CUresult::CUDA_SUCCESS).then_some((l, v))
                })
                .collect(),
            objs: Default::default(),
            next_handle: 0x1000,
            globals: Default::default(),
            event_pool: Vec::new(),
            timed: Vec::new(),
            period: None,
            sliced: Default::default(),
            templates: batch::Templates::new(graphs),
            stream_attrs: Default::default(),
            marks: Default::default(),
            next_mark: 0,
            copy: null_mut(),
            guest_vmm: GuestVmm::default(),
            graphs: Default::default(),
            scopes: Default::default(),
            arrays: Default::default(),
            opened: Default::default(),
            ipc_events: false,
            staged: Default::default(),
        })
    }

    pub(super) fn bind(&self) -> Result<(), Status> {
        if CURRENT.with(Cell::get) != self.ctx as usize {
            // SAFETY: `self.ctx` is a live context owned by self.
            check(unsafe { sys::cuCtxSetCurrent(self.ctx) })?;
            CURRENT.with(|c| c.set(self.ctx as usize));
        }
        Ok(())
    }

    pub(super) fn insert(&mut self, o: Obj) -> Handle {
        self.next_handle += 1;
        self.objs.insert(self.next_handle, o);
        self.next_handle
    }

    /// The driver stream of a handle (0: the default stream).
    pub(super) fn stream(&self, h: Handle) -> Result<sys::CUstream, Status> {
        if h == 0 {
            return Ok(null_mut());
        }
        match self.objs.get(&h) {
            Some(Obj::Stream { raw, .. }) => Ok(*raw),
            _ => Err(Status::InvalidHandle),
        }
    }

    pub(super) fn event(&self, h: Handle) -> Result<sys::CUevent, Status> {
        match self.objs.get(&h) {
            Some(Obj::Event { raw, .. } | Obj::ImportedEvent { raw, .. }) => Ok(*raw),
            _ => Err(Status::InvalidHandle),
        }
    }

    pub(super) fn module(&self, h: Handle) -> Result<sys::CUmodule, Status> {
        match self.objs.get(&h) {
            Some(Obj::Module { raw, .. }) => Ok(*raw),
            _ => Err(Status::InvalidHandle),
        }
    }

    pub(super) fn func(&self, h: Handle) -> Result<(sys::CUfunction, &[u32]), Status> {
        match self.objs.get(&h) {
            Some(Obj::Function { raw, sizes, .. }) => Ok((*raw, sizes)),
            _ => Err(Status::InvalidHandle),
        }
    }

    /// What it takes to make this context's objects again elsewhere.
    pub(super) fn specs(&self) -> Vec<(Handle, ObjSpec)> {
        self.objs
            .iter()
            .map(|(&h, o)| {
                let spec = match o {
                    Obj::Stream {
                        flags, priority, ..
                    } => ObjSpec::Stream(*flags, *priority),
                    Obj::Event { flags, .. } => ObjSpec::Event(*flags),
                    Obj::ImportedEvent { .. } => ObjSpec::Nothing,
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
            for (_, g) in std::mem::take(&mut self.graphs) {
                g.destroy();
            }
            for (_, g) in std::mem::take(&mut self.scopes) {
                // SAFETY: our graph, destroyed once, in its context.
                unsafe {
                    sys::cuGraphDestroy(g);
                }
            }
            self.guest_vmm.clear();
            for (va, a) in std::mem::take(&mut self.allocs) {
                vmm_free(va, &a);
            }
            if self.primary {
                self.empty_primary();
            }
        }
        let_go(self.ctx, self.primary.then_some(self.dev));
        if self.primary {
            PRIMARY_TAKEN.store(false, Ordering::Release);
        }
        CURRENT.with(|c| {
            if c.get() == self.ctx as usize {
                c.set(0)
            }
        });
    }
}

impl CudaContext {
    /// The events of timed launches, the busy period and marks, taken out
    /// (their work is done: the context is recycled or moves).
    pub(super) fn take_timing_events(&mut self) -> Vec<sys::CUevent> {
        self.timed
            .drain(..)
            .flat_map(|(_, a, b)| [a, b])
            .chain(
                self.period
                    .take()
                    .into_iter()
                    .flat_map(|(a, ends)| std::iter::once(a).chain(ends)),
            )
            .chain(self.marks.drain().flat_map(|(_, evs)| evs))
            .collect()
    }

    /// Destroys what the guest made in the primary context, which outlives
    /// it (the executor's registrations hold it): what recycling destroys,
    /// and the copy stream and idle events it keeps. Work still running
    /// keeps its objects; they go with the context, at the worker's end.
    fn empty_primary(&mut self) {
        if let Err(s) = Limits::recycle(self) {
            tracing::debug!("the primary context is left as the guest left it: {s:?}");
            return;
        }
        for e in std::mem::take(&mut self.event_pool) {
            // SAFETY: an idle event of this context, destroyed once.
            let _ = unsafe { sys::cuEventDestroy_v2(e) };
        }
        if !self.copy.is_null() {
            // SAFETY: our copy stream, destroyed once.
            let _ =
                unsafe { sys::cuStreamDestroy_v2(std::mem::replace(&mut self.copy, null_mut())) };
        }
    }
}

/// Makes a context on `dev`, current on this thread: its primary context
/// (retained) if `primary`, else a new one.
pub(super) fn make_context(dev: CUdevice, primary: bool) -> Result<CUcontext, Status> {
    let mut ctx: CUcontext = null_mut();
    if primary {
        // SAFETY: out-parameter on our stack; balanced by `let_go`.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) })?;
        // SAFETY: the context just retained.
        if let Err(e) = check(unsafe { sys::cuCtxSetCurrent(ctx) }) {
            let_go(ctx, Some(dev));
            return Err(e);
        }
    } else {
        // SAFETY: out-parameter on our stack; null create-params means defaults.
        check(unsafe { sys::cuCtxCreate_v4(&mut ctx, null_mut(), 0, dev) })?;
    }
    Ok(ctx)
}

/// Ends our hold on `ctx`: releases it if it is `primary`'s primary
/// context (the driver destroys it with the last release), else destroys
/// it, and all it holds.
pub(super) fn let_go(ctx: CUcontext, primary: Option<CUdevice>) {
    let _ = match primary {
        // SAFETY: balances a retain of ours (`make_context`); allowed from
        // any thread.
        Some(dev) => unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) },
        // SAFETY: our own context, destroyed once; nothing uses it after.
        None => unsafe { sys::cuCtxDestroy_v2(ctx) },
    };
}

/// Destroys one guest object of the current context (a function goes with
/// its module).
pub(super) fn destroy_obj(o: Obj) -> sys::CUresult {
    match o {
        // SAFETY: a stream of the current context, destroyed once.
        Obj::Stream { raw, .. } => unsafe { sys::cuStreamDestroy_v2(raw) },
        Obj::Event { raw, relay, .. } => destroy_event(raw, relay),
        // SAFETY: a module of the current context, unloaded once.
        Obj::Module { raw, .. } => unsafe { sys::cuModuleUnload(raw) },
        Obj::ImportedEvent { local, .. } => destroy_event(local, null_mut()),
        Obj::Function { .. } => sys::CUresult::CUDA_SUCCESS,
    }
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

/// Destroys an event of a context and, when it was exported, its relay
/// stream (see `CudaContext::share_event`); either may be null (none).
pub(super) fn destroy_event(event: sys::CUevent, relay: sys::CUstream) -> sys::CUresult {
    if !relay.is_null() {
        // SAFETY: the event's relay stream, destroyed once, with it.
        let r = unsafe { sys::cuStreamDestroy_v2(relay) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return r;
        }
    }
    if event.is_null() {
        return sys::CUresult::CUDA_SUCCESS;
    }
    // SAFETY: a live event, destroyed once.
    unsafe { sys::cuEventDestroy_v2(event) }
}

impl Limits for CudaContext {
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
        check(unsafe { sys::cuCtxSetLimit(cu_limit(limit)?, crate::usize_from(value)) })
    }

    /// See [`crate::executor::Limits::recycle`]. The driver's memory goes back to the
    /// driver (which clears it before anyone else gets it); what stays is
    /// the context itself, its copy stream and idle timing events.
    fn recycle(&mut self) -> Result<(), Status> {
        self.bind()?;
        // Only a context with no work left is reused: one whose departed
        // process left a kernel running (for ever, maybe) is destroyed
        // instead, which does not wait for it.
        let streams: Vec<sys::CUstream> = self
            .objs
            .values()
            .filter_map(|o| match o {
                Obj::Stream { raw, .. } => Some(*raw),
                _ => None,
            })
            .chain([null_mut(), self.copy])
            .collect();
        for st in streams {
            // SAFETY: a stream of this context (or the null stream); the
            // context is current.
            match unsafe { sys::cuStreamQuery(st) } {
                sys::CUresult::CUDA_SUCCESS => {}
                sys::CUresult::CUDA_ERROR_NOT_READY => return Err(Status::NotReady),
                e => return check(e),
            }
        }
        // A sticky error shows here, and such a context is never reused.
        // SAFETY: no arguments; our context is current.
        check(unsafe { sys::cuCtxSynchronize() })?;
        self.templates.clear();
        self.reset_stream_attrs()?;
        self.sliced.clear();
        for (_, g) in std::mem::take(&mut self.graphs) {
            g.destroy();
        }
        self.arrays.clear()?;
        let idle = self.take_timing_events();
        self.event_pool.extend(idle);
        self.guest_vmm.clear();
        for (va, a) in std::mem::take(&mut self.allocs) {
            vmm_free(va, &a);
        }
        for p in std::mem::take(&mut self.plain) {
            // SAFETY: a live allocation of this context, freed once.
            check(unsafe { sys::cuMemFree_v2(p) })?;
        }
        // Memory of other processes it opened, closed.
        let opened: Vec<u64> = self.opened.keys().copied().collect();
        for base in opened {
            crate::executor::Ipc::close_opened(self, base)?;
        }
        // Functions go with their modules; streams and events one by one.
        for (_, o) in std::mem::take(&mut self.objs) {
            check(destroy_obj(o))?;
        }
        self.unstage_modules();
        self.globals.clear();
        for &(l, v) in &self.limits0 {
            let mut now = 0usize;
            let lim = cu_limit(l)?;
            // SAFETY: out-parameter on our stack; the context is current.
            check(unsafe { sys::cuCtxGetLimit(&mut now, lim) })?;
            if now != v {
                // SAFETY: the context is current; a limit it was made with.
                check(unsafe { sys::cuCtxSetLimit(lim, v) })?;
            }
        }
        Ok(())
    }
}
