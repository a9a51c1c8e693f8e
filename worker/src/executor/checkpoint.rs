//! The `Checkpoint` family of [`super::Context`]: a context's whole state as
//! plain data (a [`ContextImage`]), from which another worker, on another
//! host or from a file, makes the context again: the same handles, the same
//! device addresses, the same bytes there.
//!
//! An image is taken between two requests once the context's work is done;
//! what an executor cannot put in one (a [`Keeper`]) is named before
//! anything is taken, as for a move between GPUs. An image may come from
//! another host: [`ContextImage::check`] is what a restore trusts of it.

use protocol::stream_attr::{StreamAttr, RAW_LEN};
use protocol::{ImageKind, Status};
use serde::{Deserialize, Serialize};

use super::{Handle, Keeper};

/// A context's state between two requests, its work done.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextImage {
    /// The next handle the context gives (the handles of its objects are
    /// below it).
    pub next_handle: Handle,
    /// Context limits set (`CUlimit`, value); unset ones keep their defaults.
    pub limits: Vec<(u32, u64)>,
    /// Its allocations at their device addresses, module globals included.
    pub memory: Vec<Allocation>,
    /// Its modules.
    pub modules: Vec<ModuleImage>,
    /// The functions it looked up in them.
    pub functions: Vec<FunctionImage>,
    /// Its streams.
    pub streams: Vec<StreamImage>,
    /// Its events.
    pub events: Vec<EventImage>,
    /// Its executable graphs (none in images taken before they were
    /// carried).
    #[serde(default)]
    pub graphs: Vec<GraphImage>,
}

/// Bytes an image left out ([`Checkpoint::checkpoint_shape`]): where they
/// are on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftOut {
    /// The allocation at this device address.
    Allocation(u64),
    /// The global whose address the guest holds is this.
    Global(u64),
}

/// One allocation: `len` bytes at device address `addr`. Its bytes travel
/// after the image's description (`checkpoint::format`), not in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// Its device address.
    pub addr: u64,
    /// Its size in bytes.
    pub len: u64,
    /// Its contents (`len` bytes once taken or read).
    #[serde(skip)]
    pub bytes: crate::checkpoint::Blob,
}

/// A module: the image it was loaded from, and where its globals are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleImage {
    /// Its handle.
    pub handle: Handle,
    /// Whether the image is PTX text (else a cubin or fat binary).
    pub ptx: bool,
    /// Bytes of the image.
    pub len: u64,
    /// The global variables whose addresses the guest holds.
    pub globals: Vec<GlobalImage>,
    /// The image (`len` bytes), travelling after the description.
    #[serde(skip)]
    pub image: crate::checkpoint::Blob,
}

impl ModuleImage {
    /// How its image is loaded.
    pub fn kind(&self) -> ImageKind {
        if self.ptx {
            ImageKind::Ptx
        } else {
            ImageKind::Cubin
        }
    }
}

/// A module's global variable at the address the guest holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalImage {
    /// Its name in the module.
    pub name: String,
    /// The device address the guest holds.
    pub addr: u64,
    /// Its size in bytes.
    pub len: u64,
    /// Its contents (`len` bytes), travelling after the description.
    #[serde(skip)]
    pub bytes: crate::checkpoint::Blob,
}

/// A function of a module.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionImage {
    /// Its handle.
    pub handle: Handle,
    /// The module's handle.
    pub module: Handle,
    /// Its name in the module.
    pub name: String,
    /// Attributes set (`CUfunction_attribute`, value).
    pub attrs: Vec<(u32, i32)>,
}

/// A stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamImage {
    /// Its handle.
    pub handle: Handle,
    /// `CUstream_flags`.
    pub flags: u32,
    /// Attributes set, priority included: (`CUstreamAttrID`, the value's
    /// bytes as on the wire), checked again when made.
    pub attrs: Vec<(u32, Vec<u8>)>,
}

impl StreamImage {
    /// The stream's attributes, each checked as a guest's would be.
    pub fn checked_attrs(&self) -> Result<Vec<StreamAttr>, Status> {
        self.attrs
            .iter()
            .map(|(id, raw)| {
                let raw: &[u8; RAW_LEN] = raw
                    .as_slice()
                    .try_into()
                    .map_err(|_| Status::InvalidValue)?;
                StreamAttr::from_raw(*id, raw).map_err(|_| Status::InvalidValue)
            })
            .collect()
    }
}

/// An event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventImage {
    /// Its handle.
    pub handle: Handle,
    /// `CUevent_flags`.
    pub flags: u32,
    /// Whether it was ever recorded (its work is done: it reads complete).
    pub recorded: bool,
}

/// An executable graph the guest built: its nodes, as the guest sent them
/// (`protocol::graph::encode_graph`), built again under its handle. A graph
/// with conditional nodes is not put in an image (its handles are the
/// driver's values, held by the guest's kernels).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphImage {
    /// Its handle.
    pub handle: Handle,
    /// Bytes of its encoded nodes.
    pub len: u64,
    /// Its encoded nodes (`len` bytes), travelling after the description.
    #[serde(skip)]
    pub nodes: Vec<u8>,
}

impl GraphImage {
    /// The image of the graph of `nodes` under `handle`.
    pub fn of(handle: Handle, nodes: &[protocol::graph::GraphNode]) -> GraphImage {
        let nodes = protocol::graph::encode_graph(nodes);
        GraphImage {
            handle,
            len: nodes.len() as u64,
            nodes,
        }
    }

    /// Its nodes, decoded; an error for bytes that are no graph, or one
    /// with a conditional node.
    pub fn decoded(&self) -> Result<Vec<protocol::graph::GraphNode>, Status> {
        let nodes = protocol::graph::decode_graph(&self.nodes).map_err(|_| Status::InvalidValue)?;
        if has_conditional(&nodes) {
            return Err(Status::NotSupported);
        }
        Ok(nodes)
    }
}

/// Whether `nodes` hold a conditional node (at any depth): such a graph is
/// not put in an image.
pub fn has_conditional(nodes: &[protocol::graph::GraphNode]) -> bool {
    let mut found = false;
    let _ = protocol::graph::visit(nodes, &mut |n| {
        found |= matches!(n.op, protocol::graph::GraphOp::Conditional { .. });
        Ok::<(), ()>(())
    });
    found
}

/// The most objects of one kind an image may hold.
pub const MAX_OBJECTS: usize = 1 << 20;

impl ContextImage {
    /// Bytes of device memory it holds (its globals' included).
    pub fn memory_bytes(&self) -> u64 {
        let globals = self.modules.iter().flat_map(|m| &m.globals);
        self.memory.iter().map(|a| a.len).sum::<u64>() + globals.map(|g| g.len).sum::<u64>()
    }

    /// Checks what a restore relies on, whoever wrote the image: every
    /// handle nonzero, below [`Self::next_handle`] and used once; every
    /// function's module in the image; allocations and globals of nonzero
    /// size that do not overlap one another and whose bytes are all there;
    /// module images present; stream attributes and limits valid; every
    /// graph whole, without conditional nodes, its kernels' functions and
    /// its events the image's (its ranges are the restored session's to
    /// check: `Session::restored`).
    pub fn check(&self) -> Result<(), Status> {
        let counts = [
            self.memory.len(),
            self.modules.len(),
            self.functions.len(),
            self.streams.len(),
            self.events.len(),
            self.limits.len(),
            self.graphs.len(),
        ];
        if counts.iter().any(|&n| n > MAX_OBJECTS) {
            return Err(Status::InvalidValue);
        }
        let mut handles = std::collections::HashSet::new();
        let handle_ok = |h: Handle, set: &mut std::collections::HashSet<Handle>| {
            h != 0 && h < self.next_handle && set.insert(h)
        };
        let all = self
            .modules
            .iter()
            .map(|m| m.handle)
            .chain(self.functions.iter().map(|f| f.handle))
            .chain(self.streams.iter().map(|s| s.handle))
            .chain(self.events.iter().map(|e| e.handle))
            .chain(self.graphs.iter().map(|g| g.handle));
        for h in all {
            if !handle_ok(h, &mut handles) {
                return Err(Status::InvalidHandle);
            }
        }
        let modules: std::collections::HashSet<Handle> =
            self.modules.iter().map(|m| m.handle).collect();
        if self.functions.iter().any(|f| !modules.contains(&f.module)) {
            return Err(Status::InvalidHandle);
        }
        let globals = self.modules.iter().flat_map(|m| &m.globals);
        let pieces = self
            .memory
            .iter()
            .map(|a| (a.addr, a.len, a.bytes.len()))
            .chain(globals.map(|g| (g.addr, g.len, g.bytes.len())));
        let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(self.memory.len());
        for (addr, len, have) in pieces {
            let end = addr.checked_add(len).ok_or(Status::InvalidValue)?;
            if len == 0 || addr == 0 || have as u64 != len {
                return Err(Status::InvalidValue);
            }
            ranges.push((addr, end));
        }
        ranges.sort_unstable();
        if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
            return Err(Status::InvalidValue);
        }
        if self
            .modules
            .iter()
            .any(|m| m.image.len() as u64 != m.len || m.len == 0)
        {
            return Err(Status::InvalidImage);
        }
        for s in &self.streams {
            s.checked_attrs()?;
        }
        // As a guest's `cuCtxSetLimit` is checked.
        let limit_ok = |&(l, v): &(u32, u64)| l <= protocol::MAX_LIMIT && v <= protocol::MAX_LEN;
        if !self.limits.iter().all(limit_ok) {
            return Err(Status::InvalidValue);
        }
        self.check_graphs()
    }

    /// [`ContextImage::check`]'s part for graphs.
    fn check_graphs(&self) -> Result<(), Status> {
        use protocol::graph::GraphOp;
        let functions: std::collections::HashSet<Handle> =
            self.functions.iter().map(|f| f.handle).collect();
        let events: std::collections::HashSet<Handle> =
            self.events.iter().map(|e| e.handle).collect();
        for g in &self.graphs {
            if g.nodes.len() as u64 != g.len || g.len == 0 {
                return Err(Status::InvalidValue);
            }
            let nodes = g.decoded()?;
            protocol::graph::visit(&nodes, &mut |n| match n.op {
                GraphOp::Kernel { func, .. } if !functions.contains(&func) => {
                    Err(Status::InvalidHandle)
                }
                GraphOp::EventRecord { event } | GraphOp::EventWait { event }
                    if !events.contains(&event) =>
                {
                    Err(Status::InvalidHandle)
                }
                _ => Ok(()),
            })?;
        }
        Ok(())
    }

    /// Puts every list in its handles' (or addresses') order, so that the
    /// same state gives the same image.
    pub fn sort(&mut self) {
        self.limits.sort_unstable();
        self.memory.sort_unstable_by_key(|a| a.addr);
        self.modules.sort_unstable_by_key(|m| m.handle);
        for m in &mut self.modules {
            m.globals.sort_unstable_by_key(|g| g.addr);
        }
        self.functions.sort_unstable_by_key(|f| f.handle);
        self.streams.sort_unstable_by_key(|s| s.handle);
        for s in &mut self.streams {
            s.attrs.sort_unstable();
        }
        self.events.sort_unstable_by_key(|e| e.handle);
        self.graphs.sort_unstable_by_key(|g| g.handle);
    }
}

/// Taking a context's image.
pub trait Checkpoint {
    /// What keeps this context from being put in an image (an object the
    /// executor cannot make again elsewhere), if anything does.
    fn checkpoint_keeper(&self) -> Option<Keeper> {
        Some(Keeper::Other)
    }

    /// Waits for the context's work, then takes its image. The context
    /// goes on as it was.
    fn checkpoint(&mut self) -> Result<ContextImage, Status> {
        Err(Status::NotSupported)
    }

    /// Makes the objects of `image` (taken by [`Checkpoint::checkpoint`]
    /// in another worker, of this host or another) again in this context,
    /// which must hold none (one just made, or made clean): the same
    /// handles, the same device addresses and bytes. The image is checked
    /// first ([`ContextImage::check`]); its addresses must be free here.
    /// A context that already holds objects is refused
    /// (`InvalidContext`); one that failed midway is dropped.
    fn restore_into(&mut self, _image: &ContextImage) -> Result<(), Status> {
        Err(Status::NotSupported)
    }

    /// Takes its image as [`Checkpoint::checkpoint`] does, but may leave
    /// out the bytes of its allocations and globals (empty where a length
    /// says there are some): [`Checkpoint::read_left_out`] reads each into
    /// the stream's own memory, so that it crosses host memory once.
    fn checkpoint_shape(&mut self) -> Result<ContextImage, Status> {
        self.checkpoint()
    }

    /// Reads the bytes [`Checkpoint::checkpoint_shape`] left out of `blob`
    /// into `dst` (as many as its length), between the same two requests.
    fn read_left_out(&mut self, _blob: LeftOut, _dst: &mut [u8]) -> Result<(), Status> {
        Err(Status::NotSupported)
    }

    /// Loads the modules of `image` ahead of its restore into this context
    /// (a spare's, bound to no VM yet) and looks up the functions the image
    /// names in them; [`Checkpoint::restore_into`] then takes each module
    /// whose image is byte for byte one staged, rather than loading it.
    /// The context holds no object of the guest's meanwhile. How many
    /// modules are staged.
    fn stage(&mut self, _image: &ContextImage) -> Result<usize, Status> {
        Ok(0)
    }

    /// How many modules the restore took from those staged.
    fn staged_taken(&self) -> usize {
        0
    }

    /// Unloads the modules staged and not taken (the spare was bound to
    /// another VM, or the restore is done).
    fn unstage(&mut self) {}

    /// The parameter sizes of function `func` as its module declares them
    /// (what the worker checks a launch's parameters against): after a
    /// restore, from the module made again, never from the image.
    fn param_sizes(&self, _func: Handle) -> Option<Vec<u32>> {
        None
    }
}
