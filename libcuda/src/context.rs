//! Contexts and the primary context.
//!
//! A guest process has one host context per vGPU; the CUDA contexts made
//! here are names for it, with the per-thread stack of current contexts
//! the driver API promises. Context-wide settings that only shape a query
//! (cache and shared-memory configuration) are kept here.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::{CUcontext, CUdevice};

use crate::state::thread::{current, need_ctx, pop, push, remove, set_current};
use crate::state::{driver, gpu, objects, out, ContextInfo};
use crate::{code, CuResult, DRIVER_VERSION};

fn check_dev(d: CUdevice) -> Result<(), CuResult> {
    if d == 0 {
        Ok(())
    } else {
        Err(code::INVALID_DEVICE)
    }
}

/// Makes a new context with `flags` current (pushed on the thread's stack).
fn create(ctx: *mut CUcontext, flags: c_uint, d: CUdevice) -> Result<(), CuResult> {
    driver()?;
    check_dev(d)?;
    if ctx.is_null() {
        return Err(code::INVALID_VALUE);
    }
    let h = objects()?.new_context(ContextInfo {
        flags,
        primary: false,
    });
    if let Err(e) = push(h) {
        objects()?.contexts.remove(&h);
        return Err(e);
    }
    out(ctx, h as CUcontext)
}

/// The context `ctx` names, or the current one if it is null.
fn ctx_or_current(ctx: CUcontext) -> Result<usize, CuResult> {
    let h = if ctx.is_null() {
        current()
    } else {
        ctx as usize
    };
    if h == 0 || !objects()?.contexts.contains_key(&h) {
        return Err(code::INVALID_CONTEXT);
    }
    Ok(h)
}

/// The host's number for `CUlimit` `limit`; `None` for the limits a vGPU
/// leaves at zero (shared-memory size and CIG).
fn host_limit(limit: c_int) -> Result<Option<u32>, CuResult> {
    match limit {
        0..=6 => Ok(Some(limit as u32)),
        7..=9 => Ok(None),
        _ => Err(code::INVALID_VALUE),
    }
}

type ClsEntries = Vec<(usize, usize, crate::state::ClsDtor)>;

/// Takes the context-local storage of context `h`: (key, value, destructor).
fn take_cls(o: &mut crate::state::Objects, h: usize) -> ClsEntries {
    let keys: Vec<(usize, usize)> = o.cls.keys().filter(|(c, _)| *c == h).copied().collect();
    keys.into_iter()
        .filter_map(|k| {
            let (v, d) = o.cls.remove(&k)?;
            d.map(|d| (k.1, v, d))
        })
        .collect()
}

/// Runs the destructors the runtime gave for context `h`'s storage (with
/// no lock held: they may call back into the driver).
fn run_cls_dtors(h: usize, entries: ClsEntries) {
    for (key, value, dtor) in entries {
        dtor(h as CUcontext, key as *mut c_void, value as *mut c_void);
    }
}

export! {
    fn cuCtxCreate_v2 [cuCtxCreate] (ctx: *mut CUcontext, flags: c_uint, d: CUdevice) {
        create(ctx, flags, d)
    }

    /// Execution affinity (SM partitions) is the host's to set: refused
    /// unless none is asked for.
    fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut c_void, n: c_int, flags: c_uint, d: CUdevice) {
        if n != 0 || !params.is_null() {
            return Err(crate::not_supported("cuCtxCreate_v3 with execution affinity"));
        }
        create(ctx, flags, d)
    }

    /// CUDA 13's `cuCtxCreate`; execution affinity and CIG parameters are
    /// the host's to set, so only null parameters are served.
    fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, d: CUdevice) {
        if !params.is_null() {
            // SAFETY: a CUctxCreateParams (API contract): two pointers and a count.
            let p = unsafe { &*(params as *const cudarc::driver::sys::CUctxCreateParams) };
            if !p.execAffinityParams.is_null() || !p.cigParams.is_null() {
                return Err(crate::not_supported("cuCtxCreate with execution affinity or CIG"));
            }
        }
        create(ctx, flags, d)
    }

    fn cuCtxDestroy_v2 [cuCtxDestroy] (ctx: CUcontext) {
        let h = ctx as usize;
        let mut o = objects()?;
        match o.contexts.get(&h) {
            Some(info) if !info.primary => {}
            Some(_) => return Err(code::INVALID_CONTEXT),
            None => return Err(code::INVALID_CONTEXT),
        }
        o.contexts.remove(&h);
        let dtors = take_cls(&mut o, h);
        drop(o);
        run_cls_dtors(h, dtors);
        // Popped from this thread's stack wherever it is.
        remove(h);
        Ok(())
    }

    fn cuCtxSetCurrent(ctx: CUcontext) {
        let h = ctx as usize;
        if h != 0 && !objects()?.contexts.contains_key(&h) {
            return Err(code::INVALID_CONTEXT);
        }
        set_current(h);
        Ok(())
    }

    fn cuCtxGetCurrent(ctx: *mut CUcontext) {
        driver()?;
        out(ctx, current() as CUcontext)
    }

    fn cuCtxPushCurrent_v2 [cuCtxPushCurrent] (ctx: CUcontext) {
        let h = ctx as usize;
        if !objects()?.contexts.contains_key(&h) {
            return Err(code::INVALID_CONTEXT);
        }
        push(h)
    }

    fn cuCtxPopCurrent_v2 [cuCtxPopCurrent] (ctx: *mut CUcontext) {
        driver()?;
        let top = pop().ok_or(code::INVALID_CONTEXT)?;
        crate::state::out_opt(ctx, top as CUcontext)
    }

    fn cuCtxGetDevice(d: *mut CUdevice) {
        need_ctx()?;
        out(d, 0)
    }

    fn cuCtxGetDevice_v2(d: *mut CUdevice, ctx: CUcontext) {
        ctx_or_current(ctx)?;
        out(d, 0)
    }

    fn cuCtxGetFlags(flags: *mut c_uint) {
        need_ctx()?;
        let f = objects()?.contexts.get(&current()).map_or(0, |c| c.flags);
        out(flags, f)
    }

    fn cuCtxSetFlags(flags: c_uint) {
        need_ctx()?;
        if let Some(c) = objects()?.contexts.get_mut(&current()) {
            c.flags = flags;
        }
        Ok(())
    }

    fn cuCtxGetId(ctx: CUcontext, id: *mut u64) {
        let h = ctx_or_current(ctx)?;
        out(id, h as u64)
    }

    fn cuCtxGetApiVersion(ctx: CUcontext, v: *mut c_uint) {
        ctx_or_current(ctx)?;
        out(v, DRIVER_VERSION as c_uint)
    }

    fn cuCtxSynchronize() {
        need_ctx()?;
        gpu(|g| g.synchronize())
    }

    fn cuCtxSynchronize_v2(ctx: CUcontext) {
        ctx_or_current(ctx)?;
        gpu(|g| g.synchronize())
    }

    fn cuCtxGetLimit(v: *mut usize, limit: c_int) {
        need_ctx()?;
        let l = host_limit(limit)?;
        if v.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let value = match l {
            Some(l) => gpu(|g| g.limit(l))? as usize,
            None => 0,
        };
        out(v, value)
    }

    /// Limits of the host context (stack, printf buffer, device heap, ...),
    /// set there; the context-isolation limits (CIG) are not offered.
    fn cuCtxSetLimit(limit: c_int, v: usize) {
        need_ctx()?;
        match host_limit(limit)? {
            Some(l) => gpu(|g| g.set_limit(l, v as u64)),
            None if v == 0 => Ok(()),
            None => Err(crate::not_supported("cuCtxSetLimit of a CIG limit")),
        }
    }

    fn cuCtxGetCacheConfig(cfg: *mut c_int) {
        need_ctx()?;
        out(cfg, 0) // CU_FUNC_CACHE_PREFER_NONE
    }

    /// A preference the driver may ignore; kept as a hint only.
    fn cuCtxSetCacheConfig(cfg: c_int) {
        need_ctx()?;
        if !(0..=3).contains(&cfg) {
            return Err(code::INVALID_VALUE);
        }
        Ok(())
    }

    fn cuCtxGetSharedMemConfig(cfg: *mut c_int) {
        need_ctx()?;
        out(cfg, 1) // CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE
    }

    fn cuCtxSetSharedMemConfig(cfg: c_int) {
        need_ctx()?;
        if !(0..=2).contains(&cfg) {
            return Err(code::INVALID_VALUE);
        }
        Ok(())
    }

    /// Priorities as on the GPUs the host runs (0 is the lowest, -5 the highest).
    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        need_ctx()?;
        crate::state::out_opt(least, 0)?;
        crate::state::out_opt(greatest, crate::GREATEST_PRIORITY)
    }

    /// The persisting part of L2 is the host's; nothing to reset for a vGPU.
    fn cuCtxResetPersistingL2Cache() {
        need_ctx()
    }

    fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, d: CUdevice) {
        driver()?;
        check_dev(d)?;
        let mut o = objects()?;
        let p = o.primary();
        o.primary_retains = o.primary_retains.saturating_add(1);
        out(ctx, p as CUcontext)
    }

    fn cuDevicePrimaryCtxRelease_v2 [cuDevicePrimaryCtxRelease] (d: CUdevice) {
        driver()?;
        check_dev(d)?;
        let mut o = objects()?;
        if o.primary_retains == 0 {
            return Err(code::INVALID_CONTEXT);
        }
        o.primary_retains -= 1;
        Ok(())
    }

    fn cuDevicePrimaryCtxGetState(d: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        driver()?;
        check_dev(d)?;
        let o = objects()?;
        out(flags, o.primary_flags)?;
        out(active, c_int::from(o.primary_retains > 0))
    }

    /// Scheduling flags (spin, yield, block) concern the host's thread; the
    /// guest always spins, then blocks on its doorbell. They are kept to be
    /// read back.
    fn cuDevicePrimaryCtxSetFlags_v2 [cuDevicePrimaryCtxSetFlags] (d: CUdevice, flags: c_uint) {
        driver()?;
        check_dev(d)?;
        let mut o = objects()?;
        o.primary_flags = flags;
        let p = o.primary;
        if let Some(c) = o.contexts.get_mut(&p) {
            c.flags = flags;
        }
        Ok(())
    }

    /// Waits for the primary context's work (the host context is the
    /// process's; what it holds is freed when the process lets go of it).
    fn cuDevicePrimaryCtxReset_v2 [cuDevicePrimaryCtxReset] (d: CUdevice) {
        driver()?;
        check_dev(d)?;
        gpu(|g| g.synchronize())?;
        let mut o = objects()?;
        let p = o.primary;
        let dtors = take_cls(&mut o, p);
        drop(o);
        run_cls_dtors(p, dtors);
        Ok(())
    }
}
