//! Graph memory nodes: allocations a graph makes and frees
//! (`cuGraphAddMemAllocNode`, `cuGraphAddMemFreeNode`, and
//! `cuMemAllocAsync` / `cuMemFreeAsync` on a capturing stream).
//!
//! CUDA fixes such an allocation's address when the node is made, for the
//! graph's whole life. So the memory is allocated then, on the host as any
//! device allocation (counted against the vGPU's memory limit), and the
//! nodes order nothing more than an empty node does: the memory stays
//! valid from one launch to the next. It is given back once no graph and
//! no executable graph holds its allocation node any more, and the program
//! may free it outside the graph too (`cuMemFree`, `cuMemFreeAsync`), which
//! only says it is done with it. Graphs with memory nodes cannot be child
//! graphs, and memory nodes cannot be removed, as in CUDA.

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;

use cudarc::driver::sys::{CUdevice, CUstream};

use super::{graphs, Op, Store};
use crate::state::out;
use crate::{code, CuResult};

/// The graph allocations the process holds.
#[derive(Default)]
pub(crate) struct GraphAllocs {
    /// Size of each, by address.
    live: HashMap<u64, u64>,
    /// Those the program freed outside the graph.
    freed: HashSet<u64>,
    /// The most bytes held at once since the high mark was last reset.
    high: u64,
}

impl GraphAllocs {
    fn used(&self) -> u64 {
        self.live.values().sum()
    }
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1): pool properties (88 bytes: the
/// allocation type, handle types, location type and id first), access
/// descriptors, the size, and the address the driver writes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AllocParams {
    pool: [u8; 88],
    access: *const std::ffi::c_void,
    access_count: usize,
    bytes: usize,
    dptr: u64,
}

impl Store {
    /// Whether a graph or an executable graph still holds the allocation
    /// node of `ptr`.
    fn holds(&self, ptr: u64) -> bool {
        let alloc = |op: &Op| matches!(op, Op::MemAlloc { ptr: p, .. } if *p == ptr);
        self.graphs
            .values()
            .any(|g| g.nodes.iter().any(|n| alloc(&n.op)))
            || self.execs.values().any(|e| e.allocs.contains(&ptr))
    }
}

/// The allocations made by the memory nodes in `ops`.
pub(crate) fn allocs_of<'a>(ops: impl Iterator<Item = &'a Op>) -> Vec<u64> {
    ops.filter_map(|op| match op {
        Op::MemAlloc { ptr, .. } => Some(*ptr),
        _ => None,
    })
    .collect()
}

/// The allocations freed by the memory nodes in `ops`.
pub(crate) fn frees_of<'a>(ops: impl Iterator<Item = &'a Op>) -> Vec<u64> {
    ops.filter_map(|op| match op {
        Op::MemFree(ptr) => Some(*ptr),
        _ => None,
    })
    .collect()
}

/// Whether a graph with these nodes may become a child graph (not if it
/// has memory nodes).
pub(crate) fn may_be_child<'a>(mut ops: impl Iterator<Item = &'a Op>) -> bool {
    !ops.any(|op| matches!(op, Op::MemAlloc { .. } | Op::MemFree(_)))
}

/// Gives back those of `ptrs` that no graph or executable graph holds any
/// more (after one was destroyed).
pub(crate) fn release(ptrs: Vec<u64>) {
    let gone: Vec<u64> = {
        let mut s = graphs();
        let mut gone = Vec::new();
        for p in ptrs {
            // Given back once: the first to find it unheld takes it.
            if !s.holds(p) && s.allocs.live.remove(&p).is_some() {
                s.allocs.freed.remove(&p);
                gone.push(p);
            }
        }
        gone
    };
    // Not under the graphs' lock: these are calls to the host.
    for p in gone {
        let _ = crate::alloc::free_device(p);
    }
}

/// A new graph allocation of `size` bytes (its address fixed from now on).
fn allocate(size: u64) -> Result<u64, CuResult> {
    crate::state::thread::need_ctx()?;
    if size == 0 {
        return Err(code::INVALID_VALUE);
    }
    let p = crate::alloc::device_alloc(size)?;
    let mut s = graphs();
    s.allocs.live.insert(p, size);
    let used = s.allocs.used();
    s.allocs.high = s.allocs.high.max(used);
    Ok(p)
}

/// `cuMemAllocAsync` on stream `st`: if it is capturing, an allocation node
/// is added to its graph and its address written to `p` (true).
pub(crate) fn alloc_in_capture(p: *mut u64, size: u64, st: CUstream) -> Result<bool, CuResult> {
    if !super::capture::capturing(st)? {
        return Ok(false);
    }
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    let mut made = None;
    let added = super::capture::add(st, || {
        let ptr = allocate(size)?;
        made = Some(ptr);
        Ok(Op::MemAlloc { ptr, size })
    });
    match (added, made) {
        (Ok(true), Some(ptr)) => out(p, ptr).map(|()| true),
        // The capture ended meanwhile (false: the caller allocates), or
        // the node could not be added.
        (r, made) => {
            if let Some(ptr) = made {
                release(vec![ptr]);
            }
            r.map(|_| false)
        }
    }
}

/// `cuMemFreeAsync` on stream `st`: if it is capturing, a free node of a
/// graph allocation is added to its graph (true).
pub(crate) fn free_in_capture(ptr: u64, st: CUstream) -> Result<bool, CuResult> {
    if !super::capture::capturing(st)? {
        return Ok(false);
    }
    if !graphs().allocs.live.contains_key(&ptr) {
        return Err(crate::not_supported(
            "freeing memory the capture did not allocate, in a capture",
        ));
    }
    super::capture::add(st, || Ok(Op::MemFree(ptr)))
}

/// An executable graph with allocation nodes of `allocs` and free nodes of
/// `frees` was launched: as the driver
/// has it, each of its allocation nodes allocates again (the same address)
/// and each of its free nodes frees, so an allocation the program freed
/// outside the graph after an earlier launch may be freed again after this
/// one (cuda-samples' graphMemoryNodes frees it with `cuMemFree`, launches
/// again, then frees it with `cuMemFreeAsync`).
pub(crate) fn launched(allocs: &[u64], frees: &[u64]) {
    let mut s = graphs();
    for p in allocs {
        s.allocs.freed.remove(p);
    }
    for p in frees {
        if s.allocs.live.contains_key(p) {
            s.allocs.freed.insert(*p);
        }
    }
}

/// A graph allocation freed by the program outside its graph (true): the
/// program is done with it; it goes when its graphs do. A second free of
/// it before its graph runs again is an invalid value, as of any freed
/// pointer.
pub(crate) fn free_outside(ptr: u64) -> Result<bool, CuResult> {
    let mut s = graphs();
    if !s.allocs.live.contains_key(&ptr) {
        return Ok(false);
    }
    if !s.allocs.freed.insert(ptr) {
        return Err(code::INVALID_VALUE);
    }
    Ok(true)
}

fn check_device(d: CUdevice) -> Result<(), CuResult> {
    crate::state::driver()?;
    if d != 0 {
        return Err(code::INVALID_DEVICE);
    }
    Ok(())
}

export! {
    /// Device memory of this GPU only (pinned, located on device 0).
    fn cuGraphAddMemAllocNode(node: *mut u64, g: u64, d: *const u64, n: usize, p: *mut AllocParams) {
        if p.is_null() || node.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: the caller's parameter struct (API contract).
        let params = unsafe { p.read_unaligned() };
        let word = |i: usize| i32::from_le_bytes(params.pool[i..i + 4].try_into().unwrap_or([0; 4]));
        // Allocation type pinned, location type device, id 0.
        if word(0) != 1 || word(8) != 1 {
            return Err(crate::not_supported("graph allocations other than device memory"));
        }
        if word(12) != 0 {
            return Err(code::INVALID_DEVICE);
        }
        if !graphs().graphs.contains_key(&g) {
            return Err(code::INVALID_VALUE);
        }
        let size = params.bytes as u64;
        let ptr = allocate(size)?;
        let deps = super::deps(d, n);
        let added = deps.and_then(|deps| graphs().add(g, Op::MemAlloc { ptr, size }, deps));
        let id = match added {
            Ok(id) => id,
            Err(e) => {
                release(vec![ptr]);
                return Err(e);
            }
        };
        // The driver writes the address back into the caller's struct.
        let mut params = params;
        params.dptr = ptr;
        // SAFETY: the caller's parameter struct, as read above.
        unsafe { p.write_unaligned(params) };
        out(node, id)
    }

    fn cuGraphAddMemFreeNode(node: *mut u64, g: u64, d: *const u64, n: usize, ptr: u64) {
        if !graphs().allocs.live.contains_key(&ptr) {
            return Err(code::INVALID_VALUE);
        }
        super::add_node(node, g, d, n, Ok(Op::MemFree(ptr)))
    }

    fn cuGraphMemAllocNodeGetParams(node: u64, p: *mut AllocParams) {
        if p.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let (ptr, size) = match graphs().node_mut(node)?.op {
            Op::MemAlloc { ptr, size } => (ptr, size),
            _ => return Err(code::INVALID_VALUE),
        };
        let mut pool = [0u8; 88];
        pool[0..4].copy_from_slice(&1i32.to_le_bytes());
        pool[8..12].copy_from_slice(&1i32.to_le_bytes());
        let params = AllocParams {
            pool,
            access: std::ptr::null(),
            access_count: 0,
            bytes: size as usize,
            dptr: ptr,
        };
        // SAFETY: the caller's parameter struct (API contract).
        unsafe { p.write_unaligned(params) };
        Ok(())
    }

    fn cuGraphMemFreeNodeGetParams(node: u64, ptr: *mut u64) {
        match graphs().node_mut(node)?.op {
            Op::MemFree(p) => out(ptr, p),
            _ => Err(code::INVALID_VALUE),
        }
    }

    /// Nothing is kept beyond what live graphs hold.
    fn cuDeviceGraphMemTrim(d: CUdevice) {
        check_device(d)
    }

    /// Used and reserved memory are the same here: the live graph
    /// allocations, and their most since the high mark was reset.
    fn cuDeviceGetGraphMemAttribute(d: CUdevice, attr: c_int, value: *mut u64) {
        check_device(d)?;
        let s = graphs();
        let v = match attr {
            0 | 2 => s.allocs.used(),
            1 | 3 => s.allocs.high,
            _ => return Err(code::INVALID_VALUE),
        };
        drop(s);
        out(value, v)
    }

    /// Only the high marks can be set, and only to 0.
    fn cuDeviceSetGraphMemAttribute(d: CUdevice, attr: c_int, value: *mut u64) {
        check_device(d)?;
        if value.is_null() || !matches!(attr, 1 | 3) {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: the caller's value (API contract).
        if unsafe { value.read_unaligned() } != 0 {
            return Err(code::INVALID_VALUE);
        }
        let mut s = graphs();
        s.allocs.high = s.allocs.used();
        Ok(())
    }
}
