//! Initialization, the device, versions and error strings.
//!
//! A vGPU is one device, ordinal 0. Its name, memory (the vGPU's limit) and
//! attributes come from the host at attach time and are answered here; a
//! few attributes describe what a vGPU can do rather than the physical GPU
//! (`vgpu_attribute`).

use std::ffi::{c_char, c_int, c_uint, CStr};

use cudarc::driver::sys::{CUdevice, CUuuid};

use crate::state::{driver, out};
use crate::{code, CuResult, DRIVER_VERSION};

include!(concat!(env!("OUT_DIR"), "/errors.rs"));

/// `CUdevice_attribute` values this library decides, whatever the physical
/// GPU says.
mod attr {
    pub const MULTI_GPU_BOARD: u32 = 84;
    pub const MULTI_GPU_BOARD_GROUP_ID: u32 = 85;
    pub const PCI_BUS_ID: u32 = 33;
    pub const PCI_DEVICE_ID: u32 = 34;
    pub const PCI_DOMAIN_ID: u32 = 50;
    pub const TCC_DRIVER: u32 = 35;
    pub const UNIFIED_ADDRESSING: u32 = 41;
    pub const CAN_MAP_HOST_MEMORY: u32 = 19;
    pub const HOST_NATIVE_ATOMIC_SUPPORTED: u32 = 86;
    pub const CONCURRENT_MANAGED_ACCESS: u32 = 89;
    pub const PAGEABLE_MEMORY_ACCESS: u32 = 88;
    pub const PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: u32 = 100;
    pub const CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: u32 = 91;
    pub const DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: u32 = 101;
    pub const GPU_DIRECT_RDMA_SUPPORTED: u32 = 116;
    pub const GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: u32 = 117;
    pub const GPU_DIRECT_RDMA_WRITES_ORDERING: u32 = 118;
    pub const HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: u32 = 103;
    pub const HANDLE_TYPE_FABRIC_SUPPORTED: u32 = 128;
    pub const MEMPOOL_SUPPORTED_HANDLE_TYPES: u32 = 119;
    pub const IPC_EVENT_SUPPORTED: u32 = 125;
    pub const MPS_ENABLED: u32 = 133;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: u32 = 102;
    pub const HOST_NUMA_ID: u32 = 134;
    /// HOST_NUMA_MULTINODE_IPC .. ONLY_PARTIAL_HOST_NATIVE_ATOMIC: host
    /// locations for pools and VMM, dma-buf sharing of host memory.
    pub const HOST_LOCATIONS: std::ops::RangeInclusive<u32> = 143..=147;
    /// One past the last attribute (CU_DEVICE_ATTRIBUTE_MAX).
    pub const MAX: u32 = 148;
}

/// The value of attribute `a`: what the host reported for the GPU, except
/// where the vGPU differs from it.
pub(crate) fn vgpu_attribute(a: u32, host: Option<i32>) -> i32 {
    match a {
        // One device of its own, reached through shared memory.
        attr::MULTI_GPU_BOARD | attr::MULTI_GPU_BOARD_GROUP_ID | attr::TCC_DRIVER => 0,
        attr::PCI_BUS_ID | attr::PCI_DEVICE_ID | attr::PCI_DOMAIN_ID => 0,
        attr::MPS_ENABLED => 0,
        attr::HOST_NUMA_ID => -1,
        // Device pointers share one address space with the process.
        attr::UNIFIED_ADDRESSING => 1,
        attr::CAN_MAP_HOST_MEMORY => 1,
        // Served by the `vmm` module.
        attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => 1,
        // Host memory is reached through the shared region, not the
        // process's page tables; registered memory has a device address of
        // its own.
        attr::PAGEABLE_MEMORY_ACCESS
        | attr::PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
        | attr::CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
        | attr::HOST_NATIVE_ATOMIC_SUPPORTED
        | attr::DIRECT_MANAGED_MEM_ACCESS_FROM_HOST => 0,
        // Managed memory lives on the device and migrates to the process
        // when the CPU touches it (`crate::managed`): the CPU may touch it
        // at any time, also while kernels run (the touch waits for them and
        // sees their results), and any kernel may reach any managed memory
        // whatever it is attached to, as on an H100 in an x86 machine. What
        // that GPU lacks, so does the vGPU: the device cannot reach the
        // process's pageable memory, the CPU cannot reach device memory
        // without a migration, and there are no host-native atomics (the
        // CPU's and the device's atomics are exact because a migration
        // never lets them run at once).
        attr::CONCURRENT_MANAGED_ACCESS => 1,
        // Nothing outside the VM can reach its GPU memory.
        attr::GPU_DIRECT_RDMA_SUPPORTED
        | attr::GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS
        | attr::GPU_DIRECT_RDMA_WRITES_ORDERING
        | attr::HANDLE_TYPE_FABRIC_SUPPORTED => 0,
        // Shareable handles as file descriptors, for VMM memory and pools,
        // between the VM's processes (`shareable.rs`: a descriptor that
        // carries the host's token; every process of a VM is a context of
        // one host worker, which hands the exporter's memory to the
        // importer).
        attr::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED => 1,
        // Interprocess events between the VM's processes are served
        // (cuIpcGetEventHandle / cuIpcOpenEventHandle, records relayed to
        // the owner's context on the host).
        attr::IPC_EVENT_SUPPORTED => 1,
        // Pools shareable as file descriptors
        // (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), as above; no
        // fabric or Windows handles.
        attr::MEMPOOL_SUPPORTED_HANDLE_TYPES => crate::vmm::HANDLE_TYPE_POSIX_FD as i32,
        a if attr::HOST_LOCATIONS.contains(&a) => 0,
        // The driver answers 0 for attributes a device lacks. Generic
        // compression is the GPU's own: the host makes VMM memory
        // compressible with its driver (`vmm`), and a migration keeps it
        // so or is refused.
        _ => host.unwrap_or(0),
    }
}

fn check_dev(d: CUdevice) -> Result<(), CuResult> {
    if d == 0 {
        Ok(())
    } else {
        Err(code::INVALID_DEVICE)
    }
}

/// Writes `text` NUL-terminated into the caller's `len`-byte buffer,
/// truncated to fit.
fn write_c_string(buf: *mut c_char, len: c_int, text: &[u8]) -> Result<(), CuResult> {
    if buf.is_null() || len <= 0 {
        return Err(code::INVALID_VALUE);
    }
    let n = text.len().min(len as usize - 1);
    // SAFETY: the caller provides `len` writable bytes at `buf` (API contract).
    let dst = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len as usize) };
    dst[..n].copy_from_slice(&text[..n]);
    dst[n] = 0;
    Ok(())
}

/// The PCI bus id a vGPU reports (shared with the NVML stand-in).
const PCI_BUS_ID: &[u8] = guest::PCI_BUS_ID.as_bytes();

export! {
    /// Attaches to the vGPU (once per process).
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        match crate::state::init() {
            code::SUCCESS => Ok(()),
            e => Err(e),
        }
    }

    fn cuDriverGetVersion(v: *mut c_int) {
        out(v, DRIVER_VERSION)
    }

    fn cuDeviceGetCount(n: *mut c_int) {
        driver()?;
        out(n, 1)
    }

    fn cuDeviceGet(d: *mut CUdevice, ordinal: c_int) {
        driver()?;
        if ordinal != 0 {
            return Err(code::INVALID_DEVICE);
        }
        out(d, 0)
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, d: CUdevice) {
        let drv = driver()?;
        check_dev(d)?;
        write_c_string(name, len, drv.info.name.as_bytes())
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, d: CUdevice) {
        let drv = driver()?;
        check_dev(d)?;
        out(bytes, drv.info.total_mem as usize)
    }

    fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, d: CUdevice) {
        let drv = driver()?;
        check_dev(d)?;
        let a = u32::try_from(attr).map_err(|_| code::INVALID_VALUE)?;
        if a == 0 || a >= attr::MAX {
            return Err(code::INVALID_VALUE);
        }
        out(v, vgpu_attribute(a, drv.attrs.get(&a).copied()))
    }

    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, d: CUdevice) {
        let drv = driver()?;
        check_dev(d)?;
        out(major, drv.info.cc.0 as c_int)?;
        out(minor, drv.info.cc.1 as c_int)
    }

    fn cuDeviceGetUuid_v2 [cuDeviceGetUuid] (uuid: *mut CUuuid, d: CUdevice) {
        let drv = driver()?;
        check_dev(d)?;
        let bytes = guest::vgpu_uuid(&drv.info).map(|b| b as c_char);
        out(uuid, CUuuid { bytes })
    }

    fn cuDeviceGetPCIBusId(bus: *mut c_char, len: c_int, d: CUdevice) {
        driver()?;
        check_dev(d)?;
        if len <= PCI_BUS_ID.len() as c_int {
            return Err(code::INVALID_VALUE);
        }
        write_c_string(bus, len, PCI_BUS_ID)
    }

    fn cuDeviceGetByPCIBusId(d: *mut CUdevice, bus: *const c_char) {
        driver()?;
        // SAFETY: a NUL-terminated string (API contract); null is refused.
        let id = unsafe { crate::state::c_str(bus) }?;
        if !id.eq_ignore_ascii_case(std::str::from_utf8(PCI_BUS_ID).unwrap_or_default()) {
            return Err(code::INVALID_DEVICE);
        }
        out(d, 0)
    }

    /// A single-GPU vGPU has no peers.
    fn cuDeviceCanAccessPeer(can: *mut c_int, d: CUdevice, peer: CUdevice) {
        driver()?;
        check_dev(d)?;
        check_dev(peer)?;
        out(can, 0)
    }

    fn cuDeviceGetP2PAttribute(_v: *mut c_int, _attr: c_int, src: CUdevice, dst: CUdevice) {
        driver()?;
        check_dev(src)?;
        check_dev(dst)?;
        // The driver refuses a device as its own peer.
        Err(code::INVALID_DEVICE)
    }

    fn cuDeviceGetExecAffinitySupport(v: *mut c_int, _ty: c_int, d: CUdevice) {
        driver()?;
        check_dev(d)?;
        out(v, 0)
    }

    fn cuGetErrorName(e: c_uint, s: *mut *const c_char) {
        let (name, _) = error_text(e).ok_or(code::INVALID_VALUE)?;
        out(s, name.as_ptr())
    }

    fn cuGetErrorString(e: c_uint, s: *mut *const c_char) {
        let (_, text) = error_text(e).ok_or(code::INVALID_VALUE)?;
        out(s, text.as_ptr())
    }
}

/// `CUresult` `e`'s name and description, as C strings that live forever.
fn error_text(e: CuResult) -> Option<(&'static CStr, &'static CStr)> {
    use std::collections::HashMap;
    use std::ffi::CString;
    use std::sync::OnceLock;
    static TEXTS: OnceLock<HashMap<u32, (CString, CString)>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        ERROR_NAMES
            .iter()
            .map(|&(c, name)| {
                let text = description(c).map(str::to_owned).unwrap_or_else(|| {
                    name.trim_start_matches("CUDA_ERROR_")
                        .trim_start_matches("CUDA_")
                        .replace('_', " ")
                        .to_lowercase()
                });
                let cs = |s: &str| CString::new(s).unwrap_or_default();
                (c, (cs(name), cs(&text)))
            })
            .collect()
    });
    texts.get(&e).map(|(n, t)| (n.as_c_str(), t.as_c_str()))
}

/// The driver's own wording for the errors programs meet most.
fn description(c: u32) -> Option<&'static str> {
    Some(match c {
        0 => "no error",
        1 => "invalid argument",
        2 => "out of memory",
        3 => "initialization error",
        4 => "driver shutting down",
        100 => "no CUDA-capable device is detected",
        101 => "invalid device ordinal",
        200 => "device kernel image is invalid",
        201 => "invalid device context",
        209 => "no kernel image is available for execution on the device",
        218 => "a PTX JIT compilation failed",
        400 => "invalid resource handle",
        500 => "named symbol not found",
        600 => "device not ready",
        700 => "an illegal memory access was encountered",
        701 => "too many resources requested for launch",
        709 => "context is destroyed",
        719 => "unspecified launch failure",
        801 => "operation not supported",
        999 => "unknown error",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_name_and_a_description() {
        for &(c, name) in ERROR_NAMES {
            let (n, t) = error_text(c).expect("known code");
            assert_eq!(n.to_str().unwrap(), name);
            assert!(!t.to_bytes().is_empty());
        }
        assert_eq!(
            error_text(1).unwrap().1.to_str().unwrap(),
            "invalid argument"
        );
        assert!(error_text(123_456).is_none());
    }
}
