//! Managed memory (`cuMemAllocManaged`) as the driver makes it on a system
//! without hardware coherence (x86 with a PCIe GPU): it lives in device
//! memory and migrates to the process when the CPU touches it.
//!
//! - **Allocation**: device memory allocated by the host like `cuMemAlloc`
//!   (counted against the vGPU's memory limit, moved with the vGPU by a
//!   migration at the same address, freed with the process's session), and
//!   the process's pages at the *same address*: a memfd mapped over the
//!   inaccessible reservation `crate::reserve` keeps at every device range
//!   (so the pointer is one value for the program and its kernels), plus a
//!   second view of the memfd only the stand-in uses (`map`). The device
//!   copy is zeroed as the pages are, so a new allocation starts on both
//!   sides, read-only to the program. Where no device address is free in
//!   this process (`crate::reserve::place` fails), or the mapping cannot be
//!   made, or `FAIRVGPU_MANAGED=pool`, it comes from the pinned pool as
//!   before (`crate::host_memory`: coherent host memory, reached by the
//!   device over the bus, as much as the pool holds).
//! - **Residence**, per 2 MiB chunk (`residence`): on the device
//!   (program's pages inaccessible), on both (read-only) or on the host
//!   only (read-write, dirty).
//! - **Device work** (every launch, graph launch, copy, memset: the calls
//!   that go through `work`) first sends every dirty chunk to
//!   the device on the work's own stream and makes every host chunk
//!   inaccessible (`for_work`); the work is submitted holding the table's
//!   read lock, so no fault migrates a chunk between the check and the
//!   submission.
//! - **CPU access** to an inaccessible chunk faults into our SIGSEGV
//!   handler (`fault`, chaining to any earlier handler for every other
//!   fault): it synchronizes the context (the device work that may use the
//!   chunk), copies the chunk into the process and makes it read-only; a
//!   write to a read-only chunk faults again and makes it read-write and
//!   dirty. So a CPU access while a kernel is queued waits for it and sees
//!   its result, and the CPU's and the device's atomics on one array never
//!   run at once (cuda-samples' systemWideAtomics gets exact sums).
//! - **The stand-in's own accesses** never fault: copies and memsets treat
//!   managed memory as device memory (after the flush above), a host
//!   pointer of a copy that is managed memory is copied as device memory,
//!   and migrations copy through the second view.
//! - **Prefetch** to the device sends dirty chunks on the given stream
//!   (asynchronous); to the CPU it moves nothing at once (waiting for the
//!   context's work could wait on work that waits on the CPU) and the
//!   CPU's first touch brings each chunk back. **Advice** and **stream
//!   attachment** are checked, kept and answered (`cuMemRangeGetAttribute`)
//!   but change nothing: with every kernel able to reach any managed memory
//!   (concurrentManagedAccess, see `crate::device`), attachment is a hint,
//!   and read-mostly duplicates cannot be kept across a launch that might
//!   write them, since nothing tells the stand-in what a kernel writes.
//! - **Free** synchronizes the context, unmaps and frees the device memory.
//!
//! **In the signal handler** (async-signal-unsafe, and why acceptable):
//! it takes the table's lock, allocates, and makes calls to the host
//! (mutexes, the ring, a blocking wait on the doorbell). The fault is
//! synchronous: it interrupts the program's own load or store to managed
//! memory, never the inside of malloc or of the stand-in (which never
//! touches the program's view), so no lock the handler needs is held by the
//! interrupted code. A fault inside the stand-in while it is in a call to
//! the host (a managed pointer it was given as plain host memory where it
//! does not expect one, such as a module image) is not handled: it goes to
//! the earlier handler (by default the process dies of SIGSEGV) rather than
//! deadlocking on the call's own lock.
//!
//! **Limits**: a kernel that waits for the CPU to write managed memory
//! while it runs never sees the write (the CPU's access waits for the
//! kernel); a host function (`cuLaunchHostFunc`) that touches managed
//! memory on the device would wait for its own stream. A handler the
//! program installs for SIGSEGV after its first managed allocation must
//! pass on the faults it does not know, as chained handlers do.

pub mod api;
mod fault;
mod map;
pub(crate) mod residence;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use map::{Prot, View};
use residence::{Residence, Span, Where, CHUNK};

use crate::state::gpu;
use crate::{code, CuResult};

const PAGE: u64 = 4096;

/// `CU_DEVICE_CPU` and `CU_DEVICE_INVALID`.
pub(crate) const DEVICE_CPU: i32 = -1;
pub(crate) const DEVICE_INVALID: i32 = -2;

/// What the program said of an allocation (`cuMemAdvise`,
/// `cuMemPrefetchAsync`, `cuStreamAttachMemAsync`), answered back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Advice {
    pub read_mostly: bool,
    /// 0, [`DEVICE_CPU`] or [`DEVICE_INVALID`] (none).
    pub preferred: i32,
    pub accessed_by: bool,
    pub last_prefetch: i32,
    /// `CU_MEM_ATTACH_*`.
    pub attach: u32,
}

/// One allocation on the device.
#[derive(Debug)]
pub(crate) struct Managed {
    res: Residence,
    view: View,
    pub advice: Advice,
}

/// Every allocation on the device, by address.
#[derive(Debug)]
pub(crate) struct Table {
    allocs: BTreeMap<u64, Managed>,
    /// Chunks on the host, over all allocations.
    on_host: usize,
}

impl Table {
    fn recount(&mut self) {
        self.on_host = self.allocs.values().map(|m| m.res.on_host()).sum();
    }

    /// The address of the allocation holding `[ptr, ptr + len)` whole.
    pub(crate) fn base_of(&self, ptr: u64, len: u64) -> Option<u64> {
        let (&base, m) = self.allocs.range(..=ptr).next_back()?;
        let end = ptr.checked_add(len.max(1))?;
        (end <= base + m.res.len()).then_some(base)
    }

    /// The allocation holding `[ptr, ptr + len)` whole: (its address, it).
    pub(crate) fn holding(&mut self, ptr: u64, len: u64) -> Option<(u64, &mut Managed)> {
        let (&base, m) = self.allocs.range_mut(..=ptr).next_back()?;
        let end = ptr.checked_add(len.max(1))?;
        (end <= base + m.res.len()).then_some((base, m))
    }
}

impl Table {
    /// The empty table.
    pub(crate) const fn new() -> Table {
        Table {
            allocs: BTreeMap::new(),
            on_host: 0,
        }
    }
}

/// Every managed allocation on the device and where its chunks are:
/// changed by `cuMemAllocManaged`, `cuMemFree`, prefetches, advice, the
/// fault handler and the migration before device work ([`for_work`]).
static TABLE: RwLock<Table> = RwLock::new(Table::new());

/// Allocations in [`TABLE`]: with none, device work takes no lock.
/// Counted with them by this module.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn read() -> RwLockReadGuard<'static, Table> {
    TABLE.read().unwrap_or_else(|e| e.into_inner())
}

fn write() -> RwLockWriteGuard<'static, Table> {
    TABLE.write().unwrap_or_else(|e| e.into_inner())
}

/// Held while device work is submitted: no chunk migrates meanwhile.
pub(crate) type WorkGuard = Option<RwLockReadGuard<'static, Table>>;

/// Makes managed memory the device's before device work on `stream` (see
/// the module's notes) and keeps it so while the guard is held.
pub(crate) fn for_work(stream: u64) -> Result<WorkGuard, CuResult> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return Ok(None);
    }
    loop {
        let r = read();
        if r.on_host == 0 {
            return Ok(Some(r));
        }
        drop(r);
        to_device(&mut write(), None, stream)?;
    }
}

/// Device work on `stream` (a launch, a graph launch, a copy, a memset):
/// the one choke point where managed memory is made the device's first
/// ([`for_work`]) and kept so while `f` submits the work.
pub(crate) fn work<R>(
    stream: u64,
    f: impl FnOnce(&mut guest::Gpu) -> guest::Result<R>,
) -> Result<R, CuResult> {
    let _managed = for_work(stream)?;
    gpu(f)
}

fn io_error(what: &str, e: std::io::Error) -> CuResult {
    crate::log_once(&format!("managed memory: {what}: {e}"));
    code::UNKNOWN
}

/// The part of allocation `[base, base + len)` that `only` (address,
/// length) overlaps, or all of it; `None` if they do not overlap.
fn part(base: u64, len: u64, only: Option<(u64, u64)>) -> Option<Span> {
    let Some((a, n)) = only else {
        return Some(Span { off: 0, len });
    };
    let start = a.max(base);
    let end = a.saturating_add(n).min(base + len);
    (start < end).then_some(Span {
        off: start - base,
        len: end - start,
    })
}

/// Sends the host chunks of the allocations `only` overlaps (all if
/// `None`) to the device: dirty ones copied on `stream`, every one made
/// inaccessible first (no write slips in after its copy).
fn to_device(t: &mut Table, only: Option<(u64, u64)>, stream: u64) -> Result<(), CuResult> {
    let mut r = Ok(());
    for (&base, m) in t.allocs.iter_mut() {
        let Some(span) = part(base, m.res.len(), only) else {
            continue;
        };
        r = send(base, m, span, stream);
        if r.is_err() {
            break;
        }
    }
    t.recount();
    r
}

fn send(base: u64, m: &mut Managed, span: Span, stream: u64) -> Result<(), CuResult> {
    for (s, w) in m.res.runs(span, |w| w != Where::Device) {
        m.view
            .protect(s, Prot::None)
            .map_err(|e| io_error("protect", e))?;
        if w == Where::HostDirty {
            let copied = gpu(|g| g.memcpy_htod_async(base + s.off, m.view.bytes(s), stream));
            if let Err(e) = copied {
                // Still the host's: the program keeps its bytes.
                let _ = m.view.protect(s, Prot::ReadWrite);
                return Err(e);
            }
        }
        m.res.set(s, Where::Device);
    }
    Ok(())
}

/// Brings the device chunks of `span` of the allocation at `base` into
/// the process, read-only. The device must have finished with them.
fn fetch(base: u64, m: &mut Managed, span: Span) -> Result<(), CuResult> {
    for (s, _) in m.res.runs(span, |w| w == Where::Device) {
        // The program's view of `s` is inaccessible: only the alias is
        // written.
        gpu(|g| g.memcpy_dtoh(m.view.bytes_mut(s), base + s.off, 0))?;
        m.view
            .protect(s, Prot::Read)
            .map_err(|e| io_error("protect", e))?;
        m.res.set(s, Where::HostClean);
    }
    Ok(())
}

/// A CPU access faulted at `addr`: true if it was managed memory, now
/// accessible for the access to run again.
fn on_fault(addr: u64) -> bool {
    if COUNT.load(Ordering::Acquire) == 0 || crate::state::thread::in_call() {
        return false;
    }
    let mut t = write();
    let Some((base, m)) = t.holding(addr, 1) else {
        return false;
    };
    let off = addr - base;
    let s = m.res.chunk_at(off);
    let r = match m.res.at(off) {
        Where::Device => gpu(|g| g.synchronize()).and_then(|()| fetch(base, m, s)),
        Where::HostClean => m
            .view
            .protect(s, Prot::ReadWrite)
            .map(|()| m.res.set(s, Where::HostDirty))
            .map_err(|e| io_error("protect", e)),
        // Another thread's fault got there first.
        Where::HostDirty => Ok(()),
    };
    t.recount();
    if let Err(e) = r {
        eprintln!(
            "fairvgpu libcuda: managed memory at {addr:#x} could not be brought to the CPU \
             (CUresult {e}); the access cannot go on"
        );
        std::process::abort();
    }
    true
}

/// Whether `FAIRVGPU_MANAGED=pool` asks for managed memory from the pinned
/// pool.
fn pool_forced() -> bool {
    std::env::var("FAIRVGPU_MANAGED").is_ok_and(|v| v == "pool")
}

/// A managed allocation of `size` bytes with `CU_MEM_ATTACH_*` `flags`:
/// its address.
pub(crate) fn alloc(size: u64, flags: u32) -> Result<u64, CuResult> {
    let len = size
        .checked_next_multiple_of(PAGE)
        .ok_or(code::OUT_OF_MEMORY)?;
    if pool_forced() {
        return crate::host_memory::managed_from_pool(size);
    }
    if !fault::install() {
        crate::log_once("managed memory: no SIGSEGV handler could be installed; from the pool");
        return crate::host_memory::managed_from_pool(size);
    }
    let d = match crate::alloc::device_alloc_as(len, crate::state::RangeKind::Managed)? {
        Some(d) => d,
        None => {
            crate::log_once(
                "managed memory: device addresses keep landing on the process's own memory; \
                 this allocation comes from the pinned pool",
            );
            return crate::host_memory::managed_from_pool(size);
        }
    };
    // Zero on the device, as the new pages are here: then both sides hold
    // the same bytes, and the program's first writes need no copy back.
    let zeroed = gpu(|g| {
        g.memset_async(d, 0, 1, len, 0)?;
        g.stream_synchronize(0)
    });
    if let Err(e) = zeroed {
        let _ = crate::alloc::free_device(d);
        return Err(e);
    }
    // SAFETY: [d, d + len) is the reservation device_alloc_as made for
    // this allocation (it reserves page multiples), holding nothing else.
    let view = match unsafe { View::over_reservation(d, len as usize, Prot::Read) } {
        Ok(v) => v,
        Err(e) => {
            crate::log_once(&format!(
                "managed memory: cannot map it in the process ({e}); from the pinned pool"
            ));
            crate::alloc::free_device(d)?;
            return crate::host_memory::managed_from_pool(size);
        }
    };
    let mut t = write();
    t.allocs.insert(
        d,
        Managed {
            res: Residence::new(len, CHUNK, Where::HostClean),
            view,
            advice: Advice {
                read_mostly: false,
                preferred: DEVICE_INVALID,
                accessed_by: false,
                last_prefetch: DEVICE_INVALID,
                attach: flags,
            },
        },
    );
    COUNT.fetch_add(1, Ordering::Release);
    t.recount();
    Ok(d)
}

/// Frees managed memory at `p` on the device; false if `p` is no such
/// allocation.
pub(crate) fn free(p: u64) -> Result<bool, CuResult> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return Ok(false);
    }
    let mut t = write();
    if !t.allocs.contains_key(&p) {
        return Ok(false);
    }
    // The device's work before the free may still use it.
    gpu(|g| g.synchronize())?;
    let m = t.allocs.remove(&p);
    COUNT.fetch_sub(1, Ordering::Release);
    t.recount();
    drop(t);
    drop(m);
    // Frees the device memory and unmaps the program's view with the
    // range's reservation.
    crate::alloc::free_device(p)?;
    Ok(true)
}

/// Whether `[ptr, ptr + len)` is managed memory on the device.
pub(crate) fn contains(ptr: u64, len: u64) -> bool {
    COUNT.load(Ordering::Acquire) != 0 && read().base_of(ptr, len).is_some()
}
