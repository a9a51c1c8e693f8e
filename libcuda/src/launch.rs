//! Kernel launches, function attributes and occupancy.
//!
//! A launch carries its parameters by value: each is read here by the size
//! the module's metadata gives (reported by the host when the kernel was
//! looked up) and packed, in order, into the launch request.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::{CUdevice, CUfunction, CUstream};
use protocol::Dim3;

use crate::module::kernel;
use crate::state::thread::need_ctx;
use crate::state::thread::resolve;
use crate::state::{driver, gpu, out};
use crate::{code, CuResult};

/// `extra` markers of `cuLaunchKernel` (`CU_LAUNCH_PARAM_*`).
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

/// The parameter values of a launch, packed back to back.
///
/// # Safety
/// `params` must be null or hold one pointer per kernel parameter, each to
/// that parameter's value; `extra` must be null or a `CU_LAUNCH_PARAM_END`
/// terminated list (the driver API's contract).
unsafe fn pack(
    f: &guest::Function,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<Vec<u8>, CuResult> {
    let sizes = &f.param_sizes;
    let total: usize = sizes.iter().map(|&s| s as usize).sum();
    let mut packed = Vec::with_capacity(total);
    if !params.is_null() {
        // SAFETY: one pointer per kernel parameter (this function's contract).
        let slots = unsafe { std::slice::from_raw_parts(params, sizes.len()) };
        for (&slot, &size) in slots.iter().zip(sizes) {
            if slot.is_null() {
                return Err(code::INVALID_VALUE);
            }
            // SAFETY: each pointer addresses its parameter's value, whose
            // size the module's metadata gives.
            packed.extend_from_slice(unsafe {
                std::slice::from_raw_parts(slot as *const u8, size as usize)
            });
        }
        return Ok(packed);
    }
    if extra.is_null() {
        return if sizes.is_empty() {
            Ok(packed)
        } else {
            Err(code::INVALID_VALUE)
        };
    }
    // The whole argument buffer at once, laid out as the kernel's parameters.
    let (mut buf, mut len) = (std::ptr::null::<u8>(), None::<usize>);
    let mut at = 0usize;
    loop {
        // SAFETY: a terminated list of (marker, value) pairs (contract).
        let marker = unsafe { extra.wrapping_add(at).read() } as usize;
        if marker == PARAM_END {
            break;
        }
        // SAFETY: every marker but the end is followed by its value.
        let value = unsafe { extra.wrapping_add(at + 1).read() };
        match marker {
            PARAM_BUFFER_POINTER => buf = value as *const u8,
            PARAM_BUFFER_SIZE if !value.is_null() => {
                // SAFETY: the size marker's value points to a size_t (contract).
                len = Some(unsafe { *(value as *const usize) });
            }
            _ => return Err(code::INVALID_VALUE),
        }
        at += 2;
        if at > 64 {
            return Err(code::INVALID_VALUE);
        }
    }
    let offs: Vec<usize> = f.param_offsets.iter().map(|&o| o as usize).collect();
    let needed = offs
        .last()
        .zip(sizes.last())
        .map_or(0, |(o, s)| o + *s as usize);
    let len = len.ok_or(code::INVALID_VALUE)?;
    if buf.is_null() && needed > 0 || len < needed {
        return Err(code::INVALID_VALUE);
    }
    for (&o, &s) in offs.iter().zip(sizes) {
        // SAFETY: `len` readable bytes at `buf` (contract), and `o + s <= len`.
        packed.extend_from_slice(unsafe {
            std::slice::from_raw_parts(buf.wrapping_add(o), s as usize)
        });
    }
    Ok(packed)
}

/// What a launch asks beyond its shape: thread block clusters and
/// `protocol::launch_flags`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Extras {
    cluster: Dim3,
    flags: u32,
}

#[allow(clippy::too_many_arguments)]
fn launch(
    f: CUfunction,
    grid: Dim3,
    block: Dim3,
    shared: c_uint,
    st: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    x: Extras,
) -> Result<(), CuResult> {
    need_ctx()?;
    // Captured: the node keeps the launch; otherwise it goes straight to
    // the vGPU, with no node made on the launch path.
    let node = || kernel_op(f, grid, block, shared, params, extra, x).map(crate::graph::Op::Kernel);
    if crate::graph::capture::add(st, node)? {
        return Ok(());
    }
    let k = kernel(f)?;
    check_block(&k, block)?;
    let stream = resolve(st)?;
    // SAFETY: the caller's arguments, per the driver API's contract.
    let packed = unsafe { pack(&k.func, params, extra) }?;
    let h = k.func.handle;
    crate::managed::work(stream, |g| {
        g.launch_ex(h, grid, block, shared, stream, x.cluster, x.flags, &packed)
    })
}

/// Every GPU the host serves (compute capability 5.0 on): a block of at
/// most 1024 threads, 1024 along x and y, 64 along z.
const MAX_BLOCK: (u32, u32, u32, u64) = (1024, 1024, 64, 1024);

/// `CUDA_ERROR_INVALID_VALUE` for a block larger than the device's or the
/// kernel's limit, as `cuLaunchKernel` answers it, at once: launches reach
/// the host asynchronously, where an error would come back only at a later
/// call (Numba's `test_max_threads_exceeded` expects it from the launch).
/// The kernel's limit is asked once and kept.
fn check_block(k: &crate::state::Kernel, b: Dim3) -> Result<(), CuResult> {
    use std::sync::atomic::Ordering;
    let (x, y, z) = (b.x, b.y, b.z);
    let threads = u64::from(x) * u64::from(y) * u64::from(z);
    if threads == 0
        || x > MAX_BLOCK.0
        || y > MAX_BLOCK.1
        || z > MAX_BLOCK.2
        || threads > MAX_BLOCK.3
    {
        return Err(code::INVALID_VALUE);
    }
    let known = k.max_threads.load(Ordering::Relaxed);
    if threads <= u64::from(known) {
        return Ok(());
    }
    let h = k.func.handle;
    // MAX_THREADS_PER_BLOCK; if the host cannot say, the device's limit
    // (the host's driver still checks the launch).
    let max = gpu(|g| g.func_attribute(h, 0))
        .ok()
        .and_then(|m| u32::try_from(m).ok())
        .filter(|&m| m > 0)
        .unwrap_or(MAX_BLOCK.0);
    k.max_threads.store(max, Ordering::Relaxed);
    if threads > u64::from(max) {
        return Err(code::INVALID_VALUE);
    }
    Ok(())
}

/// A launch with its parameter values read (what a graph's kernel node
/// keeps).
#[allow(clippy::too_many_arguments)]
pub(crate) fn kernel_op(
    f: CUfunction,
    grid: Dim3,
    block: Dim3,
    shared: c_uint,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    x: Extras,
) -> Result<crate::graph::KernelOp, CuResult> {
    let k = kernel(f)?;
    // SAFETY: the caller's arguments, per the driver API's contract.
    let packed = unsafe { pack(&k.func, params, extra) }?;
    Ok(crate::graph::KernelOp {
        func: f as usize,
        handle: k.func.handle,
        grid,
        block,
        shared,
        cluster: x.cluster,
        flags: x.flags,
        params: packed,
        sizes: k.func.param_sizes.clone(),
        ptrs: Vec::new(),
    })
}

/// Sends a launch to `st`.
pub(crate) fn run_kernel(k: &crate::graph::KernelOp, st: CUstream) -> Result<(), CuResult> {
    let stream = resolve(st)?;
    crate::managed::work(stream, |g| {
        g.launch_ex(
            k.handle, k.grid, k.block, k.shared, stream, k.cluster, k.flags, &k.params,
        )
    })
}

/// `CUlaunchAttributeID` values a launch may carry.
mod launch_attr {
    pub const ACCESS_POLICY_WINDOW: u32 = 1;
    pub const COOPERATIVE: u32 = 2;
    pub const CLUSTER_DIMENSION: u32 = 4;
    pub const CLUSTER_SCHEDULING_POLICY_PREFERENCE: u32 = 5;
    pub const SYNCHRONIZATION_POLICY: u32 = 3;
    pub const PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;
    pub const PRIORITY: u32 = 8;
    pub const MEM_SYNC_DOMAIN_MAP: u32 = 9;
    pub const MEM_SYNC_DOMAIN: u32 = 10;
    pub const PREFERRED_SHARED_MEMORY_CARVEOUT: u32 = 14;
}

/// Whether a launch attribute is a hint the host may drop without changing
/// what the launch computes (it only shapes scheduling, caching or
/// overlap).
fn is_hint(id: u32) -> bool {
    use launch_attr::*;
    matches!(
        id,
        ACCESS_POLICY_WINDOW
            | SYNCHRONIZATION_POLICY
            | PROGRAMMATIC_STREAM_SERIALIZATION
            | PRIORITY
            | MEM_SYNC_DOMAIN_MAP
            | MEM_SYNC_DOMAIN
            | PREFERRED_SHARED_MEMORY_CARVEOUT
            | CLUSTER_SCHEDULING_POLICY_PREFERENCE
    )
}

/// `CUlaunchConfig` with the attribute id read as a plain integer.
#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: CUstream,
    attrs: *const LaunchAttribute,
    num_attrs: c_uint,
}

/// `CUlaunchAttribute`: an id, padding, and a 64-byte value union.
#[repr(C)]
struct LaunchAttribute {
    id: u32,
    _pad: [u8; 4],
    value: [u8; 64],
}

/// A launch configuration's shape and the extras its attributes ask for
/// (hints dropped, unknown attributes refused).
///
/// # Safety
/// `cfg` must be null or point to a `CUlaunchConfig` whose `attrs` hold
/// `num_attrs` attributes (the driver API's contract).
unsafe fn read_config(
    cfg: *const c_void,
) -> Result<(Dim3, Dim3, c_uint, CUstream, Extras), CuResult> {
    if cfg.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: a CUlaunchConfig (contract), read with plain integers.
    let c = unsafe { &*(cfg as *const LaunchConfig) };
    let mut x = Extras::default();
    if c.num_attrs > 0 {
        if c.attrs.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: `num_attrs` attributes (contract).
        let attrs = unsafe { std::slice::from_raw_parts(c.attrs, c.num_attrs as usize) };
        for a in attrs {
            let word = |i: usize| {
                u32::from_le_bytes([
                    a.value[4 * i],
                    a.value[4 * i + 1],
                    a.value[4 * i + 2],
                    a.value[4 * i + 3],
                ])
            };
            match a.id {
                launch_attr::COOPERATIVE if word(0) != 0 => {
                    x.flags |= protocol::launch_flags::COOPERATIVE
                }
                launch_attr::COOPERATIVE => {}
                launch_attr::CLUSTER_DIMENSION => {
                    x.cluster = Dim3 {
                        x: word(0),
                        y: word(1),
                        z: word(2),
                    }
                }
                id if is_hint(id) || id == 0 => {}
                id => return Err(crate::not_supported(&format!("launch attribute {id}"))),
            }
        }
    }
    let grid = Dim3 {
        x: c.grid[0],
        y: c.grid[1],
        z: c.grid[2],
    };
    let block = Dim3 {
        x: c.block[0],
        y: c.block[1],
        z: c.block[2],
    };
    Ok((grid, block, c.shared, c.stream, x))
}

/// Clusters of a launch configuration, asked of the host's driver.
fn clusters(f: CUfunction, cfg: *const c_void, potential: bool) -> Result<i32, CuResult> {
    // SAFETY: the caller's configuration (API contract).
    let (grid, block, shared, _, x) = unsafe { read_config(cfg) }?;
    let k = kernel(f)?;
    let h = k.func.handle;
    gpu(|g| g.occupancy_clusters(h, (grid, block, shared), x.cluster, potential))
}

/// Occupancy of `f` at `block` threads and `smem` bytes of dynamic shared
/// memory per block.
fn occupancy(f: CUfunction, block: c_int, smem: usize) -> Result<i32, CuResult> {
    let k = kernel(f)?;
    let b = u32::try_from(block).map_err(|_| code::INVALID_VALUE)?;
    let m = u32::try_from(smem).map_err(|_| code::INVALID_VALUE)?;
    gpu(|g| g.occupancy(k.func.handle, b, m))
}

fn func_attribute(f: CUfunction, attr: c_int) -> Result<i32, CuResult> {
    let a = u32::try_from(attr).map_err(|_| code::INVALID_VALUE)?;
    if a > protocol::MAX_FUNC_ATTRIBUTE {
        return Err(crate::not_supported(&format!("cuFuncGetAttribute({attr})")));
    }
    let k = kernel(f)?;
    gpu(|g| g.func_attribute(k.func.handle, a))
}

/// The block size that gives `f` the most resident threads per
/// multiprocessor (the driver's search: every multiple of the warp size up
/// to the kernel's limit, the largest first on ties), and the smallest grid
/// that fills the device at it.
fn potential_block_size(
    f: CUfunction,
    smem_of: impl Fn(c_int) -> usize,
    limit: c_int,
) -> Result<(c_int, c_int), CuResult> {
    let drv = driver()?;
    let max = func_attribute(f, 0)?; // MAX_THREADS_PER_BLOCK
    let max = if limit > 0 { max.min(limit) } else { max };
    let (mut best, mut best_threads, mut best_blocks) = (0, 0, 0);
    let mut b = max - max % 32;
    while b >= 32 {
        let blocks = occupancy(f, b, smem_of(b))?;
        if blocks * b > best_threads {
            (best, best_threads, best_blocks) = (b, blocks * b, blocks);
        }
        b -= 32;
    }
    if best == 0 {
        return Err(code::INVALID_VALUE);
    }
    Ok((best_blocks * drv.info.sm_count as c_int, best))
}

/// Parameter `index`'s offset and size.
fn param_info(
    f: &guest::Function,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Result<(), CuResult> {
    let (o, s) = f
        .param_offsets
        .get(index)
        .zip(f.param_sizes.get(index))
        .ok_or(code::INVALID_VALUE)?;
    crate::state::out_opt(offset, *o as usize)?;
    crate::state::out_opt(size, *s as usize)
}

export! {
    fn cuLaunchKernel [cuLaunchKernel_ptsz per_thread] (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, st: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch(f, Dim3 { x: gx, y: gy, z: gz }, Dim3 { x: bx, y: by, z: bz }, shared, st, params, extra, Extras::default())
    }

    /// Every block resident at once, so that the grid can synchronize.
    fn cuLaunchCooperativeKernel [cuLaunchCooperativeKernel_ptsz per_thread] (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, st: CUstream, params: *mut *mut c_void) {
        let x = Extras { cluster: Dim3::default(), flags: protocol::launch_flags::COOPERATIVE };
        launch(f, Dim3 { x: gx, y: gy, z: gz }, Dim3 { x: bx, y: by, z: bz }, shared, st, params, std::ptr::null_mut(), x)
    }

    /// A launch with a configuration. Attributes that only shape how the
    /// work is scheduled are dropped; those that change what a launch means
    /// (cooperative grids, clusters, completion events) are refused until
    /// the host serves them.
    fn cuLaunchKernelEx [cuLaunchKernelEx_ptsz per_thread] (cfg: *const c_void, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) {
        // SAFETY: the caller's configuration (API contract).
        let (grid, block, shared, stream, x) = unsafe { read_config(cfg) }?;
        launch(f, grid, block, shared, stream, params, extra, x)
    }

    fn cuFuncGetAttribute(v: *mut c_int, attr: c_int, f: CUfunction) {
        let val = func_attribute(f, attr)?;
        out(v, val)
    }

    fn cuKernelGetAttribute(v: *mut c_int, attr: c_int, k: CUfunction, d: CUdevice) {
        if d != 0 {
            return Err(code::INVALID_DEVICE);
        }
        let val = func_attribute(k, attr)?;
        out(v, val)
    }

    /// Attributes the host's driver keeps for the kernel: the dynamic
    /// shared memory limit, the carveout, cluster requirements.
    fn cuFuncSetAttribute(f: CUfunction, attr: c_int, value: c_int) {
        let k = kernel(f)?;
        let a = u32::try_from(attr).map_err(|_| code::INVALID_VALUE)?;
        gpu(|g| g.func_set_attribute(k.func.handle, a, value))
    }

    fn cuKernelSetAttribute(attr: c_int, value: c_int, kn: CUfunction, d: CUdevice) {
        if d != 0 {
            return Err(code::INVALID_DEVICE);
        }
        let k = kernel(kn)?;
        let a = u32::try_from(attr).map_err(|_| code::INVALID_VALUE)?;
        gpu(|g| g.func_set_attribute(k.func.handle, a, value))
    }

    /// Cache preferences are hints the driver may ignore.
    fn cuFuncSetCacheConfig(f: CUfunction, cfg: c_int) {
        kernel(f)?;
        if !(0..=3).contains(&cfg) {
            return Err(code::INVALID_VALUE);
        }
        Ok(())
    }

    fn cuKernelSetCacheConfig(k: CUfunction, cfg: c_int, d: CUdevice) {
        if d != 0 {
            return Err(code::INVALID_DEVICE);
        }
        kernel(k)?;
        if !(0..=3).contains(&cfg) {
            return Err(code::INVALID_VALUE);
        }
        Ok(())
    }

    fn cuFuncSetSharedMemConfig(f: CUfunction, cfg: c_int) {
        kernel(f)?;
        if !(0..=2).contains(&cfg) {
            return Err(code::INVALID_VALUE);
        }
        Ok(())
    }

    fn cuFuncGetParamInfo(f: CUfunction, index: usize, offset: *mut usize, size: *mut usize) {
        let k = kernel(f)?;
        param_info(&k.func, index, offset, size)
    }

    fn cuKernelGetParamInfo(k: CUfunction, index: usize, offset: *mut usize, size: *mut usize) {
        let kn = kernel(k)?;
        param_info(&kn.func, index, offset, size)
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut c_int, f: CUfunction, block: c_int, smem: usize) {
        let v = occupancy(f, block, smem)?;
        out(n, v)
    }

    /// The flags only affect caching decisions.
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: *mut c_int, f: CUfunction, block: c_int, smem: usize, _flags: c_uint) {
        let v = occupancy(f, block, smem)?;
        out(n, v)
    }

    fn cuOccupancyAvailableDynamicSMemPerBlock(bytes: *mut usize, f: CUfunction, num_blocks: c_int, block: c_int) {
        let k = kernel(f)?;
        let n = u32::try_from(num_blocks).map_err(|_| code::INVALID_VALUE)?;
        let b = u32::try_from(block).map_err(|_| code::INVALID_VALUE)?;
        let v = gpu(|g| g.available_smem(k.func.handle, n, b))?;
        out(bytes, v as usize)
    }

    fn cuOccupancyMaxActiveClusters(n: *mut c_int, f: CUfunction, cfg: *const c_void) {
        let v = clusters(f, cfg, false)?;
        out(n, v)
    }

    fn cuOccupancyMaxPotentialClusterSize(size: *mut c_int, f: CUfunction, cfg: *const c_void) {
        let v = clusters(f, cfg, true)?;
        out(size, v)
    }

    fn cuOccupancyMaxPotentialBlockSize(min_grid: *mut c_int, block: *mut c_int, f: CUfunction, smem_fn: Option<unsafe extern "C" fn(c_int) -> usize>, smem: usize, limit: c_int) {
        // SAFETY: the caller's callback maps a block size to bytes (API contract).
        let smem_of = |b| smem_fn.map_or(smem, |cb| unsafe { cb(b) });
        let (g, b) = potential_block_size(f, smem_of, limit)?;
        out(min_grid, g)?;
        out(block, b)
    }

    fn cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid: *mut c_int, block: *mut c_int, f: CUfunction, smem_fn: Option<unsafe extern "C" fn(c_int) -> usize>, smem: usize, limit: c_int, _flags: c_uint) {
        // SAFETY: as in cuOccupancyMaxPotentialBlockSize.
        let smem_of = |b| smem_fn.map_or(smem, |cb| unsafe { cb(b) });
        let (g, b) = potential_block_size(f, smem_of, limit)?;
        out(min_grid, g)?;
        out(block, b)
    }
}
