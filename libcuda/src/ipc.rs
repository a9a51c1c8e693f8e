//! IPC memory and event handles between the processes of one VM
//! (cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle,
//! cuIpcGetEventHandle, cuIpcOpenEventHandle).
//!
//! A handle names memory the host exported for this process
//! (`protocol::Request::IpcExport`): a token, the memory's start and size.
//! Another process of the same VM opens it (`IpcOpen`) and reaches it at
//! the address the host answers: the exporter's own where the VM's
//! processes are contexts of one worker, one its own worker chose where
//! each has a worker of its own (process slots; see the host's
//! `session/ipc.rs` and `serve/requests/ipc_across.rs`). Memory the exporter
//! frees stays until the last opener closes it, as the driver keeps it;
//! once the exporter's process ends, the host refuses the opener's copies
//! and memsets on it. A handle from another VM names nothing there
//! (`CUDA_ERROR_INVALID_VALUE`).
//!
//! An event handle names an event made with `CU_EVENT_INTERPROCESS`
//! (`IpcExportEvent`); the opener gets an event of its own for it
//! (`IpcOpenEvent`) to wait on, query, synchronize and record, which
//! `cuEventDestroy` lets go of. It works until then, even if the exporter
//! destroys its event meanwhile, unless the exporter's process ends or the
//! vGPU migrates (a migration remakes every event).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::c_uint;
use std::sync::MutexGuard;

use cudarc::driver::sys::{CUdeviceptr, CUevent};
use protocol::Request;

use crate::state::process::{lock, IPC_EVENTS, IPC_OPENED};
use crate::state::thread::need_ctx;
use crate::state::{gpu, objects, out, Range, RangeKind};
use crate::{code, CuResult};

/// `CUipcMemHandle`: 64 opaque bytes, ours `MAGIC`, then the token, the
/// memory's start and size.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IpcMemHandle {
    reserved: [u8; 64],
}

/// `CUipcEventHandle`: 64 opaque bytes, ours `EVENT_MAGIC`, then the token.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IpcEventHandle {
    reserved: [u8; 64],
}

/// What a memory handle of ours starts with.
const MAGIC: &[u8; 8] = b"fvgipc01";

/// What an event handle of ours starts with.
const EVENT_MAGIC: &[u8; 8] = b"fvgipce1";

/// `CU_EVENT_INTERPROCESS`: the events that may be exported.
const EVENT_INTERPROCESS: c_uint = 4;

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: the flag an open must give (the
/// driver refuses 0 too; a vGPU has one device, so nothing to enable).
const LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// A handle's bytes: `magic`, then `values` little-endian.
fn pack(magic: &[u8; 8], values: &[u64]) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[..8].copy_from_slice(magic);
    for (i, v) in values.iter().enumerate() {
        b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// The token of a handle of ours starting with `magic` (never 0).
fn token_of(b: &[u8; 64], magic: &[u8; 8]) -> Option<u64> {
    if &b[..8] != magic {
        return None;
    }
    let t = u64::from_le_bytes(b[8..16].try_into().ok()?);
    (t != 0).then_some(t)
}

impl IpcMemHandle {
    fn new(token: u64, base: u64, size: u64) -> Self {
        IpcMemHandle {
            reserved: pack(MAGIC, &[token, base, size]),
        }
    }

    fn token(&self) -> Option<u64> {
        token_of(&self.reserved, MAGIC)
    }
}

impl IpcEventHandle {
    fn new(token: u64) -> Self {
        IpcEventHandle {
            reserved: pack(EVENT_MAGIC, &[token]),
        }
    }

    fn token(&self) -> Option<u64> {
        token_of(&self.reserved, EVENT_MAGIC)
    }
}

/// Events of this process made with `CU_EVENT_INTERPROCESS`.
fn interprocess() -> MutexGuard<'static, BTreeSet<u64>> {
    lock(&IPC_EVENTS)
}

/// An event was made (`cuEventCreate`) with `flags`.
pub(crate) fn event_created(event: u64, flags: c_uint) {
    if flags & EVENT_INTERPROCESS != 0 {
        interprocess().insert(event);
    }
}

/// An event was destroyed.
pub(crate) fn event_destroyed(event: u64) {
    interprocess().remove(&event);
}

/// Ranges this process opened: start -> opens.
fn opened() -> MutexGuard<'static, BTreeMap<u64, u32>> {
    lock(&IPC_OPENED)
}

fn call(req: Request) -> Result<[u64; 4], CuResult> {
    gpu(|g| g.request(&req)).map(|r| r.vals)
}

export! {
    /// A handle for the allocation holding `dptr`, for another process of
    /// the VM.
    fn cuIpcGetMemHandle(handle: *mut IpcMemHandle, dptr: CUdeviceptr) {
        need_ctx()?;
        if handle.is_null() || dptr == 0 {
            return Err(code::INVALID_VALUE);
        }
        let [token, base, size, _] = call(Request::IpcExport { ptr: dptr })?;
        out(handle, IpcMemHandle::new(token, base, size))
    }

    /// The exporter's memory, at its own address.
    fn cuIpcOpenMemHandle_v2 [cuIpcOpenMemHandle] (dptr: *mut CUdeviceptr, handle: IpcMemHandle, flags: c_uint) {
        need_ctx()?;
        if dptr.is_null() || flags != LAZY_ENABLE_PEER_ACCESS {
            return Err(code::INVALID_VALUE);
        }
        let token = handle.token().ok_or(code::INVALID_VALUE)?;
        let [base, size, ..] = call(Request::IpcOpen { token })?;
        opened_range(base, size)?;
        out(dptr, base)
    }

    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) {
        need_ctx()?;
        close(dptr)
    }
}

/// Memory of another process the host opened for this one (`IpcOpen`,
/// `PoolImportPointer`): counted, and known to this process's pointer
/// queries on its first open.
pub(crate) fn opened_range(base: u64, size: u64) -> Result<(), CuResult> {
    let first = {
        let mut o = opened();
        let n = o.entry(base).or_insert(0);
        *n += 1;
        *n == 1
    };
    if first {
        // The exporter's addresses were kept out of its own process's
        // memory, not necessarily out of this one's.
        if !crate::reserve::reserve(base, size) {
            crate::log_once("opened IPC memory overlaps this process's own memory");
        }
        objects()?.ranges.insert(
            base,
            Range {
                size,
                kind: RangeKind::Imported,
            },
        );
    }
    Ok(())
}

/// Closes memory opened at `dptr` once (`cuIpcCloseMemHandle`, or the
/// free of a pointer imported from a pool).
pub(crate) fn close(dptr: u64) -> Result<(), CuResult> {
    let last = {
        let mut o = opened();
        let n = o.get_mut(&dptr).ok_or(code::INVALID_VALUE)?;
        *n -= 1;
        let last = *n == 0;
        if last {
            o.remove(&dptr);
        }
        last
    };
    let r = call(Request::IpcClose { ptr: dptr }).map(drop);
    if last {
        let mut o = objects()?;
        if let Some(range) = o.ranges.remove(&dptr) {
            crate::reserve::release(dptr, range.size);
        }
    }
    r
}

export! {
    /// A handle for an event made with `CU_EVENT_INTERPROCESS`, for another
    /// process of the VM.
    fn cuIpcGetEventHandle(handle: *mut IpcEventHandle, event: CUevent) {
        need_ctx()?;
        if handle.is_null() || !interprocess().contains(&(event as u64)) {
            return Err(code::INVALID_VALUE);
        }
        let [token, ..] = call(Request::IpcExportEvent { event: event as u64 })?;
        out(handle, IpcEventHandle::new(token))
    }

    /// An event of this process for the exporter's.
    fn cuIpcOpenEventHandle(event: *mut CUevent, handle: IpcEventHandle) {
        need_ctx()?;
        if event.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let token = handle.token().ok_or(code::INVALID_VALUE)?;
        let [h, ..] = call(Request::IpcOpenEvent { token })?;
        out(event, h as CUevent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_has_the_drivers_size_and_carries_its_token() {
        assert_eq!(std::mem::size_of::<IpcMemHandle>(), 64);
        assert_eq!(
            std::mem::size_of::<IpcMemHandle>(),
            std::mem::size_of::<cudarc::driver::sys::CUipcMemHandle>()
        );
        let h = IpcMemHandle::new(0xfeed, 0x7f00_0000_0000, 4096);
        assert_eq!(h.token(), Some(0xfeed));
        let mut other = h;
        other.reserved[0] ^= 1;
        assert_eq!(other.token(), None, "not one of ours");
        assert_eq!(IpcMemHandle::new(0, 1, 1).token(), None);
        let e = IpcEventHandle::new(0xfeed);
        assert_eq!(std::mem::size_of::<IpcEventHandle>(), 64);
        assert_eq!(e.token(), Some(0xfeed));
        assert_eq!(
            IpcEventHandle {
                reserved: h.reserved
            }
            .token(),
            None,
            "a memory handle"
        );
    }
}
