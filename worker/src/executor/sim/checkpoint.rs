//! A model context's image, and a context made again from one: its memory
//! at the same addresses in the new worker's address space, its modules
//! from their PTX, its functions, streams and events under the same
//! handles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use protocol::Status;

use super::bytes::Bytes;
use super::context::{SimContext, SimModule};
use super::memory::lock;
use super::module::parse_module;
use crate::executor::checkpoint::{
    Allocation, Checkpoint, ContextImage, EventImage, FunctionImage, GlobalImage, LeftOut,
    ModuleImage, StreamImage,
};
use crate::executor::Keeper;

impl Checkpoint for SimContext {
    fn checkpoint_keeper(&self) -> Option<Keeper> {
        if let Some(k) = self.arrays_keeper() {
            return Some(k);
        }
        let shared = self
            .mem
            .values()
            .any(|b| matches!(*lock(b), Bytes::Shared(..)));
        if shared || !self.imports.is_empty() || !self.event_pages.is_empty() {
            return Some(Keeper::IpcAcrossWorkers);
        }
        if !self.vmm_phys.is_empty() || !self.vmm_maps.is_empty() {
            return Some(Keeper::VirtualMemory);
        }
        if self.graphs.conditional() {
            return Some(Keeper::ConditionalGraph);
        }
        None
    }

    fn restore_into(&mut self, image: &ContextImage) -> Result<(), Status> {
        self.restore_image(image)
    }

    fn checkpoint_shape(&mut self) -> Result<ContextImage, Status> {
        let mut image = self.checkpoint()?;
        for a in &mut image.memory {
            a.bytes = Default::default();
        }
        for g in image.modules.iter_mut().flat_map(|m| &mut m.globals) {
            g.bytes = Default::default();
        }
        Ok(image)
    }

    fn read_left_out(&mut self, blob: LeftOut, dst: &mut [u8]) -> Result<(), Status> {
        // The model's globals are allocations at the address the guest holds.
        let (LeftOut::Allocation(addr) | LeftOut::Global(addr)) = blob;
        let b = self.mem.get(&addr).ok_or(Status::InvalidValue)?;
        let bytes = lock(b).to_vec();
        let src = bytes.get(..dst.len()).ok_or(Status::InvalidValue)?;
        dst.copy_from_slice(src);
        Ok(())
    }

    fn stage(&mut self, image: &ContextImage) -> Result<usize, Status> {
        self.alive()?;
        self.staged.drain();
        for m in &image.modules {
            let kind = m.kind();
            // Refused here as its load would be.
            parse_module(kind, &m.image)?;
            self.staged.put(kind, m.image.to_vec(), ());
        }
        Ok(image.modules.len())
    }

    fn staged_taken(&self) -> usize {
        self.staged.taken()
    }

    fn unstage(&mut self) {
        self.staged.drain();
    }

    fn checkpoint(&mut self) -> Result<ContextImage, Status> {
        self.alive()?;
        if self.checkpoint_keeper().is_some() {
            return Err(Status::NotSupported);
        }
        // Its work finishes first, as a synchronize would.
        Self::wait_until(self.last_done);
        let bytes_at = |addr: u64| self.mem.get(&addr).map(|b| lock(b).to_vec());
        let mut globals_at = std::collections::HashSet::new();
        let mut modules = Vec::with_capacity(self.modules.len());
        for (&handle, m) in &self.modules {
            let mut globals = Vec::with_capacity(m.globals.len());
            for (name, &(addr, len)) in &m.globals {
                // The model allocates every global at load (never of no size).
                let bytes = bytes_at(addr).ok_or(Status::IllegalAddress)?;
                globals_at.insert(addr);
                globals.push(GlobalImage {
                    name: name.clone(),
                    addr,
                    len,
                    bytes: bytes.into(),
                });
            }
            modules.push(ModuleImage {
                handle,
                ptx: true,
                len: m.text.len() as u64,
                globals,
                image: m.text.as_bytes().to_vec().into(),
            });
        }
        let memory = self
            .mem
            .iter()
            .filter(|(addr, _)| !globals_at.contains(*addr))
            .map(|(&addr, b)| {
                let bytes = lock(b).to_vec();
                Allocation {
                    addr,
                    len: bytes.len() as u64,
                    bytes: bytes.into(),
                }
            })
            .collect();
        // A function of a module since unloaded cannot run: left out.
        let functions = self
            .function_of
            .iter()
            .filter(|(_, (m, _))| self.modules.contains_key(m))
            .map(|(&handle, (module, name))| FunctionImage {
                handle,
                module: *module,
                name: name.clone(),
                attrs: attrs_of(&self.func_attrs, handle),
            })
            .collect();
        let streams = self
            .streams
            .keys()
            .map(|&handle| StreamImage {
                handle,
                flags: 0,
                attrs: self
                    .stream_attrs
                    .iter()
                    .filter(|((s, _), _)| *s == handle)
                    .map(|(&(_, id), a)| (id, a.to_raw().to_vec()))
                    .collect(),
            })
            .collect();
        let events = self
            .events
            .iter()
            .map(|(&handle, e)| EventImage {
                handle,
                flags: 0,
                recorded: e.lock().unwrap_or_else(|e| e.into_inner()).is_some(),
            })
            .collect();
        let mut image = ContextImage {
            next_handle: self.next_handle + 1,
            limits: self.limits.iter().map(|(&k, &v)| (k, v)).collect(),
            memory,
            modules,
            functions,
            streams,
            events,
            graphs: self.graphs.images(),
        };
        image.sort();
        Ok(image)
    }

    fn param_sizes(&self, func: u64) -> Option<Vec<u32>> {
        let (_, sizes) = self.functions.get(&func)?;
        Some(crate::ptx::layout(sizes).iter().map(|p| p.size).collect())
    }
}

/// The attributes set on function `f`, in order.
fn attrs_of(attrs: &HashMap<(u64, u32), i32>, f: u64) -> Vec<(u32, i32)> {
    let mut v: Vec<(u32, i32)> = attrs
        .iter()
        .filter(|((g, _), _)| *g == f)
        .map(|(&(_, a), &v)| (a, v))
        .collect();
    v.sort_unstable();
    v
}

impl SimContext {
    /// Whether it holds no object of a guest's (just made, or made clean).
    fn holds_nothing(&self) -> bool {
        self.mem.is_empty()
            && self.imports.is_empty()
            && self.modules.is_empty()
            && self.functions.is_empty()
            && self.streams.is_empty()
            && self.events.is_empty()
            && self.graphs.is_empty()
    }

    /// [`Checkpoint::restore_into`]: its memory at the same addresses,
    /// which nothing in this worker may hold yet.
    pub(super) fn restore_image(&mut self, image: &ContextImage) -> Result<(), Status> {
        image.check()?;
        if !self.holds_nothing() {
            return Err(Status::InvalidContext);
        }
        let ctx = self;
        {
            let mut addresses = ctx.addresses.lock().unwrap_or_else(|e| e.into_inner());
            let globals = image.modules.iter().flat_map(|m| &m.globals);
            let pieces = image
                .memory
                .iter()
                .map(|a| (a.addr, a.len, &a.bytes))
                .chain(globals.map(|g| (g.addr, g.len, &g.bytes)));
            for (addr, len, bytes) in pieces {
                if addresses.at(addr, len, 0)? != addr {
                    // Taken already, or not where the model puts memory.
                    return Err(Status::InvalidValue);
                }
                let bytes = Bytes::Heap(bytes.to_vec());
                ctx.mem.insert(addr, Arc::new(Mutex::new(bytes)));
            }
        }
        for m in &image.modules {
            let kind = m.kind();
            let _ = ctx.staged.take(kind, &m.image);
            let (text, entries, names) = parse_module(kind, &m.image)?;
            let globals = m
                .globals
                .iter()
                .map(|g| (g.name.clone(), (g.addr, g.len)))
                .collect();
            ctx.modules.insert(
                m.handle,
                SimModule {
                    text,
                    entries,
                    names,
                    globals,
                },
            );
        }
        for f in &image.functions {
            let sizes = ctx
                .modules
                .get(&f.module)
                .and_then(|m| m.entries.get(&f.name))
                .ok_or(Status::NotFound)?
                .clone();
            ctx.insert_function(f.handle, f.module, &f.name, sizes);
            for &(a, v) in &f.attrs {
                ctx.func_attrs.insert((f.handle, a), v);
            }
        }
        let now = Instant::now();
        for s in &image.streams {
            ctx.streams.insert(s.handle, now);
            for a in s.checked_attrs()? {
                ctx.stream_attrs.insert((s.handle, a.id()), a);
            }
        }
        for e in &image.events {
            let state = e.recorded.then_some(now);
            ctx.events.insert(e.handle, Arc::new(Mutex::new(state)));
        }
        for g in &image.graphs {
            let nodes = g.decoded()?;
            ctx.check_funcs(&nodes)?;
            ctx.graphs.restored(g.handle, nodes);
        }
        ctx.limits = image.limits.iter().copied().collect();
        // `handle()` gives the one after it.
        ctx.next_handle = image.next_handle - 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
