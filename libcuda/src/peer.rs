//! Peer access and peer copies, as the driver answers them on a machine
//! with one GPU.
//!
//! A vGPU is one device, so every context of the process is on device 0 and
//! a "peer" copy between two of them is a device-to-device copy within the
//! one device (the driver runs it as such too). No device is its own peer:
//! `cuDeviceCanAccessPeer` answers 0 (in `device`), and enabling access to a
//! context of the same device is refused with `CUDA_ERROR_INVALID_DEVICE`,
//! as the driver refuses it.

use std::ffi::c_uint;

use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUstream};

use crate::state::objects;
use crate::state::thread::need_ctx;
use crate::{code, CuResult};

/// `CUDA_ERROR_INVALID_CONTEXT` unless `ctx` is a live context of this
/// process (a peer copy names both contexts; null is not one).
fn check_ctx(ctx: CUcontext) -> Result<(), CuResult> {
    if ctx.is_null() || !objects()?.contexts.contains_key(&(ctx as usize)) {
        return Err(code::INVALID_CONTEXT);
    }
    Ok(())
}

/// A copy of `n` bytes from `src` in `src_ctx` to `dst` in `dst_ctx`: both
/// contexts are on the vGPU's one device, so a copy within it.
fn peer_copy(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    st: CUstream,
    sync: bool,
) -> Result<(), CuResult> {
    need_ctx()?;
    check_ctx(dst_ctx)?;
    check_ctx(src_ctx)?;
    if n == 0 {
        return Ok(());
    }
    crate::memory::dtod(dst, src, n, st, sync)
}

export! {
    fn cuMemcpyPeer [cuMemcpyPeer_ptds per_thread] (dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) {
        peer_copy(dst, dst_ctx, src, src_ctx, n, std::ptr::null_mut(), true)
    }

    fn cuMemcpyPeerAsync [cuMemcpyPeerAsync_ptsz per_thread] (dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, st: CUstream) {
        peer_copy(dst, dst_ctx, src, src_ctx, n, st, false)
    }

    /// Every context is on the current context's own device, which is no
    /// peer of itself.
    fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) {
        need_ctx()?;
        check_ctx(peer)?;
        if flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        Err(code::INVALID_DEVICE)
    }

    /// Access was never enabled (it cannot be, see above).
    fn cuCtxDisablePeerAccess(peer: CUcontext) {
        need_ctx()?;
        check_ctx(peer)?;
        Err(code::PEER_ACCESS_NOT_ENABLED)
    }
}
