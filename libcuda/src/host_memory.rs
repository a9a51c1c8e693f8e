//! Page-locked host memory the GPU reaches: `cuMemHostAlloc` and friends,
//! registered memory, and managed memory where it cannot be on the device,
//! all backed by the vGPU's pinned pool (a part of the shared region the host registered with the
//! driver). Copies to and from it are DMA with no staging copy, and
//! asynchronous ones really are; kernels read and write it through its
//! device address.
//!
//! The pool is mapped at the address the device knows it by when that is
//! free in this process (it usually is: the host picks one far from where
//! programs live), so that a pinned pointer is the same value for the
//! program and its kernels, as on a real GPU with unified addressing.
//!
//! - `cuMemHostRegister` turns the program's own pages into pool pages:
//!   their contents are copied into a block of the pool, which is then
//!   mapped over them (same addresses, same bytes); unregistering maps
//!   private pages back with the contents.
//! - Managed memory (`cuMemAllocManaged`) lives on the device and migrates
//!   (`crate::managed`); only where it cannot be made so is it pool memory,
//!   as it once always was: host and device see the same bytes at the same
//!   address, coherently, at any time (so `cuStreamAttachMemAsync`,
//!   prefetches and advice have nothing to do). Limits: the device
//!   reaches it over the bus, not from its own memory (slower for kernels
//!   that go over it many times), its system-scope atomics are not atomic
//!   with the CPU's, and there is only as much as the pool holds (`[layout] pinned_size`, or the VM's
//!   `pinned_mib`). It needs the pool at its device address.
//!
//! When the pool is used up, host allocations and registrations are made
//! outside it (`host_spill.rs`); managed memory then fails with
//! `CUDA_ERROR_OUT_OF_MEMORY` and a message naming the setting.

use std::ffi::{c_uint, c_void};

use cudarc::driver::sys::CUdeviceptr;

use crate::state::pinned::{Block, Blocks, Kind, Pool};
use crate::state::thread::need_ctx;
use crate::state::{driver, gpu, objects, out};
use crate::{code, CuResult};

const PAGE: u64 = 4096;

/// `CU_MEMHOSTALLOC_*` / `CU_MEMHOSTREGISTER_*` flags.
const HOST_REGISTER_IOMEMORY: c_uint = 0x4;

fn pool() -> Result<&'static Pool, CuResult> {
    driver()?.pool().ok_or(code::NOT_SUPPORTED)
}

/// The block holding `ptr` in the process: (its address, the block).
fn block_of(blocks: &Blocks, ptr: u64) -> Option<(u64, Block)> {
    let (&base, &b) = blocks.range(..=ptr).next_back()?;
    (ptr < base + b.len).then_some((base, b))
}

/// Whether `[ptr, ptr + len)` is pinned memory of the process (by its
/// address in the process, or, where the two differ, its device address):
/// its offset in the pool.
pub(crate) fn pinned_span(ptr: u64, len: u64) -> Option<u64> {
    let d = driver().ok()?;
    let p = d.pool()?;
    let o = d.objects();
    let end = ptr.checked_add(len)?;
    if let Some((base, b)) = block_of(&o.host, ptr) {
        return (end <= base + b.len).then_some(b.offset + (ptr - base));
    }
    // A device address of the pool (a mapped pointer the program got from
    // cuMemHostGetDevicePointer).
    if !p.identity() && ptr >= p.dev && end <= p.dev + p.size {
        let off = ptr - p.dev;
        let base = p.host + off;
        let (b_addr, b) = block_of(&o.host, base)?;
        return (base + len <= b_addr + b.len).then_some(off);
    }
    None
}

/// The process's own address of pool offset `off` (to copy on the host).
pub(crate) fn host_address(off: u64) -> Option<u64> {
    Some(driver().ok()?.pool()?.host + off)
}

/// A block of `len` bytes of the pool.
fn alloc(len: u64, kind: Kind) -> Result<(u64, Block), CuResult> {
    let p = pool()?;
    let len = len
        .max(1)
        .checked_next_multiple_of(PAGE)
        .ok_or(code::OUT_OF_MEMORY)?;
    let offset = match gpu(|g| g.pinned_alloc(len)) {
        Ok(o) => o,
        Err(code::OUT_OF_MEMORY) => {
            crate::log_once(&format!(
                "the vGPU's pinned memory is used up ({} MiB; the host sets it: [layout] \
                 pinned_size or the VM's pinned_mib)",
                p.size >> 20
            ));
            return Err(code::OUT_OF_MEMORY);
        }
        Err(e) => return Err(e),
    };
    let b = Block { len, offset, kind };
    let addr = p.host + offset;
    objects()?.host.insert(addr, b);
    Ok((addr, b))
}

/// Gives the block at `addr` back to the pool.
fn release(addr: u64) -> Result<Block, CuResult> {
    let b = objects()?.host.remove(&addr).ok_or(code::INVALID_VALUE)?;
    gpu(|g| g.pinned_free(b.offset))?;
    Ok(b)
}

/// Managed memory from the pool (`crate::managed` when it cannot be on
/// the device): its address.
pub(crate) fn managed_from_pool(size: u64) -> Result<u64, CuResult> {
    if !pool()?.identity() {
        return Err(crate::not_supported(
            "cuMemAllocManaged (the pinned pool is not at its device address in this process)",
        ));
    }
    alloc(size, Kind::Managed).map(|(addr, _)| addr)
}

/// Whether `ptr` is the start of a managed block of the pool.
pub(crate) fn is_managed(ptr: u64) -> bool {
    objects().is_ok_and(|o| o.host.get(&ptr).is_some_and(|b| b.kind == Kind::Managed))
}

/// Frees managed memory at `ptr` (`cuMemFree` of a managed pointer); false
/// if `ptr` is no managed block.
pub(crate) fn free_managed(ptr: u64) -> Result<bool, CuResult> {
    let managed = objects()?
        .host
        .get(&ptr)
        .is_some_and(|b| b.kind == Kind::Managed);
    if !managed {
        return Ok(false);
    }
    // The device's work before the free may still use it.
    gpu(|g| g.synchronize())?;
    release(ptr).map(|_| true)
}

/// What `cuPointerGetAttribute` says of pool memory at `ptr`; `None` if
/// `ptr` is not pool memory of the process.
pub(crate) fn attribute(ptr: u64, attr: i32) -> Option<Result<Attr, CuResult>> {
    if let Some(a) = crate::host_spill::attribute(ptr, attr) {
        return Some(a);
    }
    let d = driver().ok()?;
    let p = d.pool()?;
    let (base, b) = block_of(&d.objects().host, ptr)?;
    let dev = p.dev + b.offset + (ptr - base);
    let managed = b.kind == Kind::Managed;
    let (start, len) = match b.kind {
        Kind::Registered { start, len, .. } => (start, len),
        _ => (base, b.len),
    };
    Some(Ok(match attr {
        // MEMORY_TYPE: host memory, or managed (device, with IS_MANAGED).
        2 => Attr::U32(if managed {
            crate::memtype::DEVICE
        } else {
            crate::memtype::HOST
        }),
        1 => Attr::U64(crate::state::thread::current() as u64), // CONTEXT
        3 => Attr::U64(dev),                                    // DEVICE_POINTER
        4 => Attr::U64(ptr),                                    // HOST_POINTER
        6 => Attr::I32(1),                                      // SYNC_MEMOPS
        7 | 20 => Attr::U64(base),                              // BUFFER_ID, MEMORY_BLOCK_ID
        8 => Attr::I32(i32::from(managed)),                     // IS_MANAGED
        9 => Attr::I32(0),                                      // DEVICE_ORDINAL
        10 | 15 | 21 => Attr::I32(0),
        11 | 19 => Attr::U64(start), // RANGE_START_ADDR, MAPPING_BASE_ADDR
        12 | 18 => Attr::U64(len),   // RANGE_SIZE, MAPPING_SIZE
        13 => Attr::I32(1),          // MAPPED
        14 => Attr::U64(0),
        16 => Attr::I32(3),
        17 => Attr::U64(0),
        _ => {
            return Some(Err(crate::not_supported(&format!(
                "cuPointerGetAttribute({attr})"
            ))))
        }
    }))
}

/// An attribute's value and width.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attr {
    I32(i32),
    U32(u32),
    U64(u64),
}

impl Attr {
    /// Writes it to `data`.
    pub fn write(self, data: *mut c_void) -> Result<(), CuResult> {
        match self {
            Attr::I32(v) => out(data as *mut i32, v),
            Attr::U32(v) => out(data as *mut u32, v),
            Attr::U64(v) => out(data as *mut u64, v),
        }
    }
}

fn host_alloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> Result<(), CuResult> {
    need_ctx()?;
    if pp.is_null() || flags & !0x7 != 0 {
        return Err(code::INVALID_VALUE);
    }
    let addr = match alloc(size as u64, Kind::Alloc(flags)) {
        Ok((addr, _)) => addr,
        Err(code::OUT_OF_MEMORY) => crate::host_spill::alloc(size as u64, flags)?,
        Err(e) => return Err(e),
    };
    out(pp, addr as *mut c_void)
}

export! {
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) {
        host_alloc(pp, size, 0)
    }

    /// Every flag (portable, device-mapped, write-combined) describes what
    /// pool memory is anyway.
    fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) {
        host_alloc(pp, size, flags)
    }

    fn cuMemFreeHost(p: *mut c_void) {
        driver()?;
        if let Some(r) = crate::host_spill::free(p as u64) {
            return r;
        }
        let b = objects()?.host.get(&(p as u64)).copied().ok_or(code::INVALID_VALUE)?;
        if !matches!(b.kind, Kind::Alloc(_)) {
            return Err(code::INVALID_VALUE);
        }
        release(p as u64).map(drop)
    }

    fn cuMemHostGetDevicePointer_v2(dptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) {
        need_ctx()?;
        if flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        if let Some(e) = crate::host_spill::device_pointer(p as u64) {
            return Err(e);
        }
        let pl = pool()?;
        let (base, b) = block_of(&objects()?.host, p as u64).ok_or(code::INVALID_VALUE)?;
        out(dptr, pl.dev + b.offset + (p as u64 - base))
    }

    fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) {
        driver()?;
        if let Some(f) = crate::host_spill::flags(p as u64) {
            return out(flags, f);
        }
        let (_, b) = block_of(&objects()?.host, p as u64).ok_or(code::INVALID_VALUE)?;
        let f = match b.kind {
            Kind::Alloc(f) | Kind::Registered { flags: f, .. } => f,
            Kind::Managed => return Err(code::INVALID_VALUE),
        };
        out(flags, f)
    }

    /// The program's pages become pool pages (see the module's notes).
    fn cuMemHostRegister_v2 [cuMemHostRegister] (p: *mut c_void, size: usize, flags: c_uint) {
        need_ctx()?;
        if p.is_null() || size == 0 {
            return Err(code::INVALID_VALUE);
        }
        if flags & HOST_REGISTER_IOMEMORY != 0 {
            return Err(crate::not_supported("cuMemHostRegister of I/O memory"));
        }
        let pl = pool()?;
        let start = p as u64;
        let end = start.checked_add(size as u64).ok_or(code::INVALID_VALUE)?;
        let (a, b) = (start & !(PAGE - 1), end.next_multiple_of(PAGE));
        {
            let o = objects()?;
            if o.host.range(..b).next_back().is_some_and(|(&base, blk)| base + blk.len > a) {
                return Err(code::HOST_MEMORY_ALREADY_REGISTERED);
            }
        }
        let (addr, blk) = match alloc(b - a, Kind::Registered { start, len: size as u64, flags }) {
            Ok(r) => r,
            Err(code::OUT_OF_MEMORY) => return crate::host_spill::register(start, size as u64, flags),
            Err(e) => return Err(e),
        };
        // The bytes are copied into the block and the block mapped over the
        // pages with nothing written to this thread's stack in between: the
        // pages may hold this very call's frames (NPP's watershed registers
        // a buffer on its stack; copied first and mapped over after, the
        // frames made in between were lost and the call returned into
        // garbage).
        // SAFETY: [a, b) is page-aligned memory of the program (it registers
        // it: the API's contract is that it is mapped and readable); the pool
        // block at `addr` is ours, as long, and the same part of the pool.
        let r = unsafe {
            pl.region
                .copy_and_map_pinned_over(blk.offset, (b - a) as usize, a as usize, addr as usize)
        };
        if let Err(e) = r {
            crate::log_once(&format!("cuMemHostRegister: {e}"));
            release(addr)?;
            return Err(code::INVALID_VALUE);
        }
        // The block is known by the program's address from now on.
        let mut o = objects()?;
        o.host.remove(&addr);
        o.host.insert(a, blk);
        Ok(())
    }

    /// The program's pages come back, private again, with what they hold.
    fn cuMemHostUnregister(p: *mut c_void) {
        need_ctx()?;
        let start = p as u64;
        if crate::host_spill::unregister(start) {
            return Ok(());
        }
        let (a, blk) = objects()?
            .host
            .iter()
            .find(|(_, b)| matches!(b.kind, Kind::Registered { start: s, .. } if s == start))
            .map(|(&a, &b)| (a, b))
            .ok_or(code::HOST_MEMORY_NOT_REGISTERED)?;
        let len = blk.len as usize;
        let pl = pool()?;
        // Fresh private pages replace the pool's over [a, a + len), holding
        // what the block holds (read from the pool's own mapping of it),
        // with nothing written to this thread's stack in between: the pages
        // may hold this call's own frames (see cuMemHostRegister).
        // SAFETY: [a, a + len) is page-aligned, the pool block mapped over
        // the program's pages at registration (ours to replace); the pool's
        // mapping of the block stays readable.
        unsafe { transport::shm::map_private_copy_over(a as usize, len, (pl.host + blk.offset) as usize) }
            .map_err(|e| {
                crate::log_once(&format!("cuMemHostUnregister: {e}"));
                code::UNKNOWN
            })?;
        objects()?.host.remove(&a);
        gpu(|g| g.pinned_free(blk.offset))
    }
}
