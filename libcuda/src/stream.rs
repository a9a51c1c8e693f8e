//! Streams and events.
//!
//! Stream handles are the host's. The legacy default stream is the host's
//! default stream (handle 0). The per-thread default stream of a thread
//! (`CU_STREAM_PER_THREAD`, and the null stream in the `_ptds`/`_ptsz`
//! entry points) is a host stream made for that thread when it first uses
//! it: a blocking stream, which synchronizes with the legacy stream as
//! CUDA's per-thread stream does.

use std::ffi::{c_int, c_uint, c_ulonglong};

use cudarc::driver::sys::{CUcontext, CUdevice, CUevent, CUstream};

use crate::state::thread::{current, need_ctx, resolve};
use crate::state::{driver, gpu, objects, out};
use crate::{code, CuResult, GREATEST_PRIORITY};
use protocol::stream_attr::{self, StreamAttr, RAW_LEN};

/// `CU_STREAM_NON_BLOCKING`.
const NON_BLOCKING: u32 = 0x1;

/// Flags and priority of a stream argument (the default streams are
/// blocking, of priority 0).
fn stream_info(st: CUstream) -> Result<(u32, i32), CuResult> {
    let h = resolve(st)?;
    Ok(objects()?.streams.get(&h).copied().unwrap_or((0, 0)))
}

fn create(p: *mut CUstream, flags: c_uint, priority: c_int) -> Result<(), CuResult> {
    need_ctx()?;
    if p.is_null() || flags & !NON_BLOCKING != 0 {
        return Err(code::INVALID_VALUE);
    }
    // Out-of-range priorities are clamped, as the driver does.
    let priority = priority.clamp(GREATEST_PRIORITY, 0);
    let h = gpu(|g| g.stream_create(flags, priority))?;
    objects()?.streams.insert(h, (flags, priority));
    out(p, h as CUstream)
}

/// Records `e` in `st`'s order (or marks `st`'s place in its capture).
pub(crate) fn record(e: CUevent, st: CUstream) -> Result<(), CuResult> {
    if crate::graph::capture::record(e, st)? {
        return Ok(());
    }
    let h = resolve(st)?;
    gpu(|g| g.event_record(e as u64, h))
}

/// Makes `st` wait for `e` (or joins `st` to the capture `e` was recorded in).
pub(crate) fn wait(st: CUstream, e: CUevent) -> Result<(), CuResult> {
    wait_flags(st, e, 0)
}

fn wait_flags(st: CUstream, e: CUevent, flags: u32) -> Result<(), CuResult> {
    if crate::graph::capture::wait(st, e)? {
        return Ok(());
    }
    let h = resolve(st)?;
    gpu(|g| g.stream_wait_event(h, e as u64, flags))
}

/// A stream attribute from the first bytes of a `CUstreamAttrValue`.
fn read_attr(attr: c_uint, value: *const [u8; 64]) -> Result<StreamAttr, CuResult> {
    if value.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: a 64-byte CUstreamAttrValue (API contract).
    let v = unsafe { value.read_unaligned() };
    let mut raw = [0u8; RAW_LEN];
    raw.copy_from_slice(&v[..RAW_LEN]);
    StreamAttr::from_raw(attr, &raw).map_err(|_| code::INVALID_VALUE)
}

export! {
    /// Stream attributes (the L2 access policy window, the priority, the
    /// memory synchronization domains, the synchronization policy) are
    /// set on the host's stream, which applies them to every kernel
    /// launched into it, and read back from it.
    fn cuStreamSetAttribute [cuStreamSetAttribute_ptsz per_thread] (st: CUstream, attr: c_uint, value: *const [u8; 64]) {
        need_ctx()?;
        let h = resolve(st)?;
        let a = read_attr(attr, value)?;
        gpu(|g| g.stream_set_attribute(h, a))
    }

    fn cuStreamGetAttribute [cuStreamGetAttribute_ptsz per_thread] (st: CUstream, attr: c_uint, value: *mut [u8; 64]) {
        need_ctx()?;
        let h = resolve(st)?;
        if !stream_attr::id::ALL.contains(&attr) || value.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let a = gpu(|g| g.stream_attribute(h, attr))?;
        let mut v = [0u8; 64];
        v[..RAW_LEN].copy_from_slice(&a.to_raw());
        out(value, v)
    }

    fn cuStreamCopyAttributes [cuStreamCopyAttributes_ptsz per_thread] (dst: CUstream, src: CUstream) {
        need_ctx()?;
        let (d, s) = (resolve(dst)?, resolve(src)?);
        for attr in stream_attr::id::ALL {
            let a = gpu(|g| g.stream_attribute(s, attr))?;
            gpu(|g| g.stream_set_attribute(d, a))?;
        }
        Ok(())
    }

    fn cuStreamCreate(p: *mut CUstream, flags: c_uint) {
        create(p, flags, 0)
    }

    fn cuStreamCreateWithPriority(p: *mut CUstream, flags: c_uint, priority: c_int) {
        create(p, flags, priority)
    }

    fn cuStreamDestroy_v2 [cuStreamDestroy] (st: CUstream) {
        need_ctx()?;
        let h = st as u64;
        if !objects()?.streams.contains_key(&h) {
            return Err(code::INVALID_HANDLE);
        }
        gpu(|g| g.stream_destroy(h))?;
        objects()?.streams.remove(&h);
        Ok(())
    }

    fn cuStreamSynchronize [cuStreamSynchronize_ptsz per_thread] (st: CUstream) {
        need_ctx()?;
        let h = resolve(st)?;
        crate::graph::capture::refuse_sync(h)?;
        gpu(|g| g.stream_synchronize(h))
    }

    fn cuStreamQuery [cuStreamQuery_ptsz per_thread] (st: CUstream) {
        need_ctx()?;
        let h = resolve(st)?;
        crate::graph::capture::refuse_sync(h)?;
        match gpu(|g| g.stream_query(h))? {
            true => Ok(()),
            false => Err(code::NOT_READY),
        }
    }

    fn cuStreamGetFlags [cuStreamGetFlags_ptsz per_thread] (st: CUstream, flags: *mut c_uint) {
        need_ctx()?;
        out(flags, stream_info(st)?.0)
    }

    fn cuStreamGetPriority [cuStreamGetPriority_ptsz per_thread] (st: CUstream, priority: *mut c_int) {
        need_ctx()?;
        out(priority, stream_info(st)?.1)
    }

    fn cuStreamGetCtx [cuStreamGetCtx_ptsz per_thread] (st: CUstream, ctx: *mut CUcontext) {
        need_ctx()?;
        resolve(st)?;
        out(ctx, current() as CUcontext)
    }

    fn cuStreamGetDevice [cuStreamGetDevice_ptsz per_thread] (st: CUstream, d: *mut CUdevice) {
        need_ctx()?;
        resolve(st)?;
        out(d, 0)
    }

    fn cuStreamGetId [cuStreamGetId_ptsz per_thread] (st: CUstream, id: *mut c_ulonglong) {
        need_ctx()?;
        let h = resolve(st)?;
        out(id, h)
    }

    fn cuStreamWaitEvent [cuStreamWaitEvent_ptsz per_thread] (st: CUstream, e: CUevent, flags: c_uint) {
        need_ctx()?;
        if flags > 1 {
            return Err(code::INVALID_VALUE);
        }
        wait_flags(st, e, flags)
    }

    fn cuEventCreate(p: *mut CUevent, flags: c_uint) {
        need_ctx()?;
        if p.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let h = gpu(|g| g.event_create(flags))?;
        crate::ipc::event_created(h, flags);
        out(p, h as CUevent)
    }

    fn cuEventDestroy_v2 [cuEventDestroy] (e: CUevent) {
        driver()?;
        gpu(|g| g.event_destroy(e as u64))?;
        crate::ipc::event_destroyed(e as u64);
        Ok(())
    }

    fn cuEventRecord [cuEventRecord_ptsz per_thread] (e: CUevent, st: CUstream) {
        need_ctx()?;
        record(e, st)
    }

    /// `CU_EVENT_RECORD_EXTERNAL` makes a record in a capture a node of
    /// its graph rather than a mark other streams may join at.
    fn cuEventRecordWithFlags [cuEventRecordWithFlags_ptsz per_thread] (e: CUevent, st: CUstream, flags: c_uint) {
        need_ctx()?;
        if flags & 1 != 0 && crate::graph::capture::add(st, || Ok(crate::graph::Op::EventRecord(e as u64)))? {
            return Ok(());
        }
        record(e, st)
    }

    fn cuEventSynchronize(e: CUevent) {
        driver()?;
        gpu(|g| g.event_synchronize(e as u64))
    }

    fn cuEventQuery(e: CUevent) {
        driver()?;
        match gpu(|g| g.event_query(e as u64))? {
            true => Ok(()),
            false => Err(code::NOT_READY),
        }
    }

    fn cuEventElapsedTime_v2 [cuEventElapsedTime] (ms: *mut f32, a: CUevent, b: CUevent) {
        driver()?;
        if ms.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let v = gpu(|g| g.event_elapsed_ms(a as u64, b as u64))?;
        out(ms, v)
    }
}
