//! Table `1734dc26` (`CU_ETID_ClusterPrototype` in NVIDIA's tools
//! headers): thread-block clusters before the public API had them.
//! cuBLASLt asks for it when it picks a Hopper kernel for an fp16 or bf16
//! product; a null table there crashes the process.
//!
//! Each slot served is a public call of the driver under another name: a
//! kernel's cluster shape, policy and non-portable-size permission are its
//! function attributes 10-15 (`CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET`
//! .. `CLUSTER_SCHEDULING_POLICY_PREFERENCE`), kept by the host's driver;
//! the occupancy slots are `cuOccupancyMaxPotentialClusterSize` and
//! `cuOccupancyMaxActiveClusters` for a one-dimensional block. What the
//! hardware's TPC layout is (slots 4, 13, 15) a vGPU does not say: those
//! are refused. Preferred cluster shapes (slot 16) are a launch attribute
//! the stand-in does not serve, so it answers "not supported", as a driver
//! without the feature does.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::{CUdevice, CUfunction};
use protocol::Dim3;

use super::{refused, size, Table};
use crate::module::kernel;
use crate::state::{gpu, out};
use crate::{code, CuResult};

/// `CU_FUNC_ATTRIBUTE_*` the table reads and writes.
mod attr {
    pub const CLUSTER_SIZE_MUST_BE_SET: u32 = 10;
    pub const REQUIRED_CLUSTER_WIDTH: u32 = 11;
    pub const NON_PORTABLE_CLUSTER_SIZE_ALLOWED: u32 = 14;
    pub const CLUSTER_SCHEDULING_POLICY_PREFERENCE: u32 = 15;
}

/// `CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH`.
const DEVICE_CLUSTER_LAUNCH: c_int = 120;

fn logged(slot: u8, r: CuResult) -> CuResult {
    crate::trace(&format!("export table 10 slot {slot}"), r);
    r
}

fn set(f: CUfunction, a: u32, v: c_int) -> Result<(), CuResult> {
    let k = kernel(f)?;
    gpu(|g| g.func_set_attribute(k.func.handle, a, v))
}

fn get(f: CUfunction, a: u32) -> Result<i32, CuResult> {
    let k = kernel(f)?;
    gpu(|g| g.func_attribute(k.func.handle, a))
}

/// Slot 1: the kernel's cluster shape for launches that give none (all
/// zeros: none).
extern "C" fn set_cluster_dim(f: CUfunction, x: c_int, y: c_int, z: c_int) -> CuResult {
    logged(
        1,
        crate::entry(|| {
            for (i, v) in [x, y, z].into_iter().enumerate() {
                set(f, attr::REQUIRED_CLUSTER_WIDTH + i as u32, v)?;
            }
            Ok(())
        }),
    )
}

/// Slot 2: the kernel's cluster scheduling policy.
extern "C" fn set_policy(f: CUfunction, policy: c_int) -> CuResult {
    logged(
        2,
        crate::entry(|| set(f, attr::CLUSTER_SCHEDULING_POLICY_PREFERENCE, policy)),
    )
}

/// Slot 3: whether the kernel may be launched with a non-portable size.
extern "C" fn set_non_portable(f: CUfunction, enable: c_int) -> CuResult {
    logged(
        3,
        crate::entry(|| set(f, attr::NON_PORTABLE_CLUSTER_SIZE_ALLOWED, enable)),
    )
}

/// Slot 5: the kernel's cluster shape.
extern "C" fn cluster_dim(f: CUfunction, x: *mut c_int, y: *mut c_int, z: *mut c_int) -> CuResult {
    logged(
        5,
        crate::entry(|| {
            let mut d = [0; 3];
            for (i, v) in d.iter_mut().enumerate() {
                *v = get(f, attr::REQUIRED_CLUSTER_WIDTH + i as u32)?;
            }
            out(x, d[0])?;
            out(y, d[1])?;
            out(z, d[2])
        }),
    )
}

/// Slot 6: the kernel's cluster scheduling policy.
extern "C" fn policy(f: CUfunction, p: *mut c_int) -> CuResult {
    logged(
        6,
        crate::entry(|| out(p, get(f, attr::CLUSTER_SCHEDULING_POLICY_PREFERENCE)?)),
    )
}

/// Slot 7: whether the kernel may take a non-portable cluster size.
extern "C" fn non_portable(f: CUfunction, e: *mut c_int) -> CuResult {
    logged(
        7,
        crate::entry(|| out(e, get(f, attr::NON_PORTABLE_CLUSTER_SIZE_ALLOWED)?)),
    )
}

/// Slot 8: whether the device launches clusters.
extern "C" fn cluster_launch(dev: CUdevice, supported: *mut c_int) -> CuResult {
    let mut v = 0;
    // SAFETY: a local out-parameter; the device is checked by the call.
    let r = unsafe { crate::device::cuDeviceGetAttribute(&mut v, DEVICE_CLUSTER_LAUNCH, dev) };
    if r != code::SUCCESS {
        return logged(8, r);
    }
    logged(8, crate::entry(|| out(supported, v)))
}

/// The launch shape the occupancy slots describe: a one-dimensional
/// block of `block` threads, `smem` bytes of dynamic shared memory, and a
/// grid of one cluster.
fn shape(block: c_int, smem: usize, cluster: u32) -> Result<(Dim3, Dim3, u32), CuResult> {
    let b = u32::try_from(block).map_err(|_| code::INVALID_VALUE)?;
    let m = u32::try_from(smem).map_err(|_| code::INVALID_VALUE)?;
    let one = |x| Dim3 { x, y: 1, z: 1 };
    Ok((one(cluster.max(1)), one(b), m))
}

/// Slot 9: the largest cluster the kernel can be launched with at this
/// block size (`cuOccupancyMaxPotentialClusterSize`).
extern "C" fn max_cluster_size(
    f: CUfunction,
    block: c_int,
    smem: usize,
    n: *mut c_int,
) -> CuResult {
    logged(
        9,
        crate::entry(|| {
            let k = kernel(f)?;
            let s = shape(block, smem, 1)?;
            let v = gpu(|g| g.occupancy_clusters(k.func.handle, s, Dim3::default(), true))?;
            out(n, v)
        }),
    )
}

/// Slot 10: how many clusters of `cluster` blocks can be resident at once
/// (`cuOccupancyMaxActiveClusters`).
extern "C" fn max_active_clusters(
    f: CUfunction,
    block: c_int,
    smem: usize,
    cluster: c_int,
    n: *mut c_int,
) -> CuResult {
    logged(
        10,
        crate::entry(|| {
            let k = kernel(f)?;
            let c = u32::try_from(cluster).map_err(|_| code::INVALID_VALUE)?;
            let s = shape(block, smem, c)?;
            let dims = Dim3 { x: c, y: 1, z: 1 };
            let v = gpu(|g| g.occupancy_clusters(k.func.handle, s, dims, false))?;
            out(n, v)
        }),
    )
}

/// Slot 11: overrides the device's largest cluster and answers the old
/// limit. A vGPU's tenant does not change the device: nothing is
/// overridden and the answer is 0 (no limit known).
extern "C" fn override_max_cluster(_dev: c_int, _size: c_uint) -> c_uint {
    crate::log_once("export table 10 slot 11 (cluster size override) ignored");
    0
}

/// Slot 12: whether the kernel needs a cluster shape before it launches.
extern "C" fn must_be_set(f: CUfunction, m: *mut c_int) -> CuResult {
    logged(
        12,
        crate::entry(|| out(m, get(f, attr::CLUSTER_SIZE_MUST_BE_SET)?)),
    )
}

/// Slot 14: whether device-side launches take cluster attributes. The
/// stand-in passes kernels through unchanged; the host's driver decides.
extern "C" fn cnp_cluster_attrs(supported: *mut c_int) -> CuResult {
    logged(14, crate::entry(|| out(supported, 0)))
}

/// Slot 16: whether launches may give a preferred cluster shape (a launch
/// attribute the stand-in does not serve).
extern "C" fn preferred_cluster(dev: CUdevice, supported: *mut c_int) -> CuResult {
    if dev != 0 {
        return logged(16, code::INVALID_DEVICE);
    }
    logged(16, crate::entry(|| out(supported, 0)))
}

/// Slots of driver 580's table (its first word: 17 words).
pub(super) const SLOTS: usize = 17;

pub(super) static CLUSTERS: Table<SLOTS> = {
    let mut t = [refused::<10, 0> as *const c_void; SLOTS];
    t[0] = size(SLOTS);
    t[1] = set_cluster_dim as *const c_void;
    t[2] = set_policy as *const c_void;
    t[3] = set_non_portable as *const c_void;
    t[4] = refused::<10, 4> as *const c_void;
    t[5] = cluster_dim as *const c_void;
    t[6] = policy as *const c_void;
    t[7] = non_portable as *const c_void;
    t[8] = cluster_launch as *const c_void;
    t[9] = max_cluster_size as *const c_void;
    t[10] = max_active_clusters as *const c_void;
    t[11] = override_max_cluster as *const c_void;
    t[12] = must_be_set as *const c_void;
    t[13] = refused::<10, 13> as *const c_void;
    t[14] = cnp_cluster_attrs as *const c_void;
    t[15] = refused::<10, 15> as *const c_void;
    t[16] = preferred_cluster as *const c_void;
    Table(t)
};
