//! Page-locked memory the vGPU's pinned pool cannot hold: when the pool is
//! used up (the VM's processes share it, `[layout] pinned_size` or the
//! VM's `pinned_mib`), `cuMemHostAlloc` is answered with memory of the
//! process's own and `cuMemHostRegister` leaves the program's pages where
//! they are, as natively the driver pins what the host has. Such memory
//! works for what most programs do with it (copies to and from the
//! device, which are staged through the channel as for any pageable
//! memory, and asynchronous ones too); the device cannot reach it, so
//! `cuMemHostGetDevicePointer` refuses it, saying why, and a kernel given
//! its address faults in its own process.

use std::ffi::c_uint;

use crate::host_memory::Attr;
use crate::state::objects;
use crate::state::pinned::{Spill, Spilled};
use crate::{code, CuResult};

const PAGE: u64 = 4096;

/// `len` bytes of the process's own memory, page-aligned and zeroed, for a
/// `cuMemHostAlloc` with `flags` the pool could not hold: its address.
pub(crate) fn alloc(len: u64, flags: c_uint) -> Result<u64, CuResult> {
    let len = len
        .max(1)
        .checked_next_multiple_of(PAGE)
        .ok_or(code::OUT_OF_MEMORY)?;
    let size = usize::try_from(len).map_err(|_| code::OUT_OF_MEMORY)?;
    // SAFETY: a new private read-write mapping wherever the kernel likes;
    // it touches no existing memory, and is this allocation's alone.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(code::OUT_OF_MEMORY);
    }
    let addr = p as u64;
    said(len);
    objects()?.spilled.insert(
        addr,
        Spilled {
            len,
            flags,
            kind: Spill::Alloc,
        },
    );
    Ok(addr)
}

/// Records the program's `[start, start + len)` as registered with `flags`
/// where the pool could not hold it (its pages stay as they are).
pub(crate) fn register(start: u64, len: u64, flags: c_uint) -> Result<(), CuResult> {
    let end = start.checked_add(len).ok_or(code::INVALID_VALUE)?;
    let mut o = objects()?;
    let overlaps = o
        .spilled
        .range(..end)
        .next_back()
        .is_some_and(|(&base, s)| base + s.len > start);
    if overlaps {
        return Err(code::HOST_MEMORY_ALREADY_REGISTERED);
    }
    said(len);
    o.spilled.insert(
        start,
        Spilled {
            len,
            flags,
            kind: Spill::Registered,
        },
    );
    Ok(())
}

/// Says once that the pool is used up and what is done instead.
fn said(len: u64) {
    crate::log_once(&format!(
        "page-locked memory beyond the vGPU's pinned pool ({len} bytes asked): made in the \
         process's own memory; copies to and from it are staged, and the device cannot reach it"
    ));
}

/// `cuMemFreeHost` of `ptr`, if it is a spilled allocation: `None` if it
/// is none.
pub(crate) fn free(ptr: u64) -> Option<Result<(), CuResult>> {
    let mut o = objects().ok()?;
    let s = *o.spilled.get(&ptr)?;
    if s.kind != Spill::Alloc {
        return Some(Err(code::INVALID_VALUE));
    }
    o.spilled.remove(&ptr);
    drop(o);
    let size = usize::try_from(s.len).ok()?;
    // SAFETY: the mapping `alloc` made for this allocation, which the
    // program frees (it may not use it after: the API's contract).
    unsafe { libc::munmap(ptr as *mut libc::c_void, size) };
    Some(Ok(()))
}

/// `cuMemHostUnregister` of `start`, if it was registered here: whether it
/// was.
pub(crate) fn unregister(start: u64) -> bool {
    let Ok(mut o) = objects() else {
        return false;
    };
    let registered = o
        .spilled
        .get(&start)
        .is_some_and(|s| s.kind == Spill::Registered);
    if registered {
        o.spilled.remove(&start);
    }
    registered
}

/// The spilled memory holding `ptr`: its start and what it is.
fn holding(ptr: u64) -> Option<(u64, Spilled)> {
    let o = objects().ok()?;
    let (&base, &s) = o.spilled.range(..=ptr).next_back()?;
    (ptr < base + s.len).then_some((base, s))
}

/// The flags `ptr`'s spilled memory was made or registered with.
pub(crate) fn flags(ptr: u64) -> Option<c_uint> {
    holding(ptr).map(|(_, s)| s.flags)
}

/// `cuMemHostGetDevicePointer` of spilled memory: refused, saying why.
pub(crate) fn device_pointer(ptr: u64) -> Option<CuResult> {
    holding(ptr)?;
    Some(crate::not_supported(
        "a device pointer of page-locked memory made beyond the vGPU's pinned pool (it is used \
         up; the host sets its size: [layout] pinned_size or the VM's pinned_mib)",
    ))
}

/// What `cuPointerGetAttribute` says of spilled memory at `ptr`: host
/// memory the device does not map.
pub(crate) fn attribute(ptr: u64, attr: i32) -> Option<Result<Attr, CuResult>> {
    let (base, s) = holding(ptr)?;
    Some(Ok(match attr {
        2 => Attr::U32(crate::memtype::HOST), // MEMORY_TYPE
        1 => Attr::U64(crate::state::thread::current() as u64), // CONTEXT
        4 => Attr::U64(ptr),                  // HOST_POINTER
        6 => Attr::I32(1),                    // SYNC_MEMOPS
        7 | 20 => Attr::U64(base),            // BUFFER_ID, MEMORY_BLOCK_ID
        8 | 9 | 10 | 15 | 21 => Attr::I32(0),
        11 | 19 => Attr::U64(base), // RANGE_START_ADDR, MAPPING_BASE_ADDR
        12 | 18 => Attr::U64(s.len), // RANGE_SIZE, MAPPING_SIZE
        13 => Attr::I32(0),         // MAPPED: not on the device
        14 | 17 => Attr::U64(0),
        16 => Attr::I32(3),
        3 => return device_pointer(ptr).map(Err), // DEVICE_POINTER
        _ => {
            return Some(Err(crate::not_supported(&format!(
                "cuPointerGetAttribute({attr})"
            ))))
        }
    }))
}
