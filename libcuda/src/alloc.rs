//! Device allocations: where the device memory of the process's ranges is
//! placed (a plain allocation on the host, or a VMM mapping at an address
//! free in this process), and how it is given back and forgotten. Used by
//! every family that makes device memory (`memory.rs`, `mem_pool.rs`,
//! `managed/`, graph allocations in `graph/memory.rs`).

use cudarc::driver::sys::CUdeviceptr;

use crate::state::{gpu, objects, Range, RangeKind};
use crate::{code, CuResult};

/// Plain allocations (`cuMemAlloc` on the host) tried before memory is
/// mapped at an address free in this process instead.
const PLAIN_TRIES: usize = 2;

/// Allocates `size` bytes of device memory whose addresses are reserved in
/// this process. The host's driver picks the address of a plain
/// allocation, and it may land on memory the process uses itself (a large
/// library mapped there, say): the driver's next allocation then usually
/// lands beside it, on the same mapping. So after [`PLAIN_TRIES`] such
/// tries the memory is made as a VMM mapping at an address this process
/// has free, which the host's driver takes where it is free there too.
/// The tries that landed badly are given back either way.
pub(crate) fn device_alloc(size: u64) -> Result<u64, CuResult> {
    device_alloc_as(size, RangeKind::Device)?.ok_or_else(|| {
        crate::log_once("device addresses keep landing on the process's own memory");
        code::OUT_OF_MEMORY
    })
}

/// [`device_alloc`] of a range of kind `kind`; `None` where no placement
/// kept the addresses out of the process's own memory.
pub(crate) fn device_alloc_as(size: u64, kind: RangeKind) -> Result<Option<u64>, CuResult> {
    let Some(d) = crate::reserve::place_or(
        size,
        |i| {
            if i < PLAIN_TRIES {
                gpu(|g| g.mem_alloc(size))
            } else {
                mapped_alloc(size)
            }
        },
        |d| {
            let _ = host_free(d);
        },
    )?
    else {
        return Ok(None);
    };
    objects()?.ranges.insert(d, Range { size, kind });
    Ok(Some(d))
}

/// `size` bytes of device memory as a VMM mapping (reservation, physical
/// memory, map) at an address free in this process, which it answers. The
/// physical memory's handle is let go at once: the mapping holds it, and
/// unmapping gives it back. Nothing is left held if a step fails.
fn mapped_alloc(size: u64) -> Result<u64, CuResult> {
    use protocol::Request;
    let req = |r: Request| gpu(|g| g.request(&r)).map(|r| r.vals[0]);
    let len = size
        .checked_next_multiple_of(protocol::VMM_GRANULARITY)
        .ok_or(code::OUT_OF_MEMORY)?;
    let addr = crate::reserve::free_range(len, protocol::VMM_GRANULARITY);
    let va = req(Request::VmmReserve {
        size: len,
        align: 0,
        addr,
    })?;
    let mapped = req(Request::VmmCreate {
        size: len,
        compression: 0,
    })
    .and_then(|handle| {
        let m = req(Request::VmmMap {
            ptr: va,
            size: len,
            offset: 0,
            handle,
        });
        let _ = req(Request::VmmRelease { handle });
        m
    });
    if let Err(e) = mapped {
        let _ = req(Request::VmmAddressFree { ptr: va, size: len });
        return Err(e);
    }
    objects()?.mapped_allocs.insert(va, len);
    Ok(va)
}

/// Gives device memory at `p` back to the host: unmapped and its
/// reservation freed if [`mapped_alloc`] made it, else freed.
fn host_free(p: u64) -> Result<(), CuResult> {
    use protocol::Request;
    let mapped = objects()?.mapped_allocs.remove(&p);
    match mapped {
        Some(len) => {
            let _ = gpu(|g| g.request(&Request::VmmUnmap { ptr: p, size: len }));
            let _ = gpu(|g| g.request(&Request::VmmAddressFree { ptr: p, size: len }));
            Ok(())
        }
        None => gpu(|g| g.mem_free(p)),
    }
}

/// Forgets a device allocation (its reservation too), after the host freed
/// it.
pub(crate) fn forget_alloc(o: &mut crate::state::Objects, p: u64) {
    if let Some(r) = o.ranges.remove(&p) {
        crate::reserve::release(p, r.size);
    }
    o.pools.freed(p);
}

/// Frees device allocation `p` of the process on the host, and forgets it.
pub(crate) fn free_device(p: CUdeviceptr) -> Result<(), CuResult> {
    host_free(p)?;
    forget_alloc(&mut *objects()?, p);
    Ok(())
}
