//! NVML's structures and constants as `nvml.h` (NVML 13) lays them out.

#![allow(dead_code)]

use std::ffi::c_char;

/// `nvmlPciInfo_t` (`nvmlDeviceGetPciInfo_v3`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfo {
    /// `domain:bus:device.function`, 4-digit domain.
    pub bus_id_legacy: [c_char; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    /// Device id (high 16 bits) and vendor id (low 16 bits).
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    /// `domain:bus:device.function`, 8-digit domain.
    pub bus_id: [c_char; 32],
}

/// `nvmlPciInfoExt_v1_t` (`nvmlDeviceGetPciInfoExt`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfoExt {
    pub version: u32,
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    /// The 8-bit PCI base class code.
    pub base_class: u32,
    /// The 8-bit PCI sub class code.
    pub sub_class: u32,
    /// `domain:bus:device.function`, 8-digit domain.
    pub bus_id: [c_char; 32],
}

/// `nvmlPciInfoExt_v1`: its size, and 1 in the top byte.
pub const PCI_INFO_EXT_V1: u32 = std::mem::size_of::<PciInfoExt>() as u32 | (1 << 24);

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2`: the version the caller writes into `MemoryV2`
/// (its size, and 2 in the top byte).
pub const MEMORY_V2: u32 = std::mem::size_of::<MemoryV2>() as u32 | (2 << 24);

/// `nvmlUtilization_t` (percentages).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessInfoV1 {
    pub pid: u32,
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` (`_v2`, also what `_v3` entry points fill).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessInfo {
    pub pid: u32,
    pub used_gpu_memory: u64,
    /// 0xFFFFFFFF without MIG.
    pub gpu_instance_id: u32,
    /// 0xFFFFFFFF without MIG.
    pub compute_instance_id: u32,
}

/// A GPU or compute instance id where MIG is off.
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// `nvmlBrandType_t`: NVML_BRAND_NVIDIA.
pub const BRAND_NVIDIA: u32 = 14;
/// `nvmlComputeMode_t`: NVML_COMPUTEMODE_DEFAULT.
pub const COMPUTEMODE_DEFAULT: u32 = 0;
/// `nvmlEnableState_t`: NVML_FEATURE_DISABLED.
pub const FEATURE_DISABLED: u32 = 0;
/// `NVML_DEVICE_MIG_DISABLE`.
pub const MIG_DISABLE: u32 = 0;
/// `NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH`.
pub const INIT_FLAGS: u32 = 0x3;
/// The PCI vendor id of NVIDIA.
pub const VENDOR_NVIDIA: u32 = 0x10de;

/// `nvmlDeviceArchitecture_t` of compute capability `major.minor`.
pub fn architecture(major: u32, minor: u32) -> u32 {
    match (major, minor) {
        (3, _) => 2,        // Kepler
        (5, _) => 3,        // Maxwell
        (6, _) => 4,        // Pascal
        (7, 0 | 2) => 5,    // Volta
        (7, _) => 6,        // Turing
        (8, 9) => 8,        // Ada
        (8, _) => 7,        // Ampere
        (9, _) => 9,        // Hopper
        (10 | 12, _) => 10, // Blackwell
        _ => 0xffff_ffff,   // unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The layouts of nvml.h (x86-64).
    #[test]
    fn layouts_are_nvmls() {
        assert_eq!(size_of::<PciInfo>(), 68);
        assert_eq!(offset_of!(PciInfo, domain), 16);
        assert_eq!(offset_of!(PciInfo, bus_id), 36);
        assert_eq!(size_of::<Memory>(), 24);
        assert_eq!(size_of::<MemoryV2>(), 40);
        assert_eq!(offset_of!(MemoryV2, total), 8);
        assert_eq!(MEMORY_V2, 0x0200_0028);
        assert_eq!(size_of::<Utilization>(), 8);
        assert_eq!(size_of::<ProcessInfoV1>(), 16);
        assert_eq!(size_of::<ProcessInfo>(), 24);
        assert_eq!(offset_of!(ProcessInfo, gpu_instance_id), 16);
    }

    #[test]
    fn architectures() {
        assert_eq!(architecture(9, 0), 9);
        assert_eq!(architecture(8, 0), 7);
        assert_eq!(architecture(8, 9), 8);
        assert_eq!(architecture(7, 5), 6);
        assert_eq!(architecture(10, 0), 10);
        assert_eq!(architecture(1, 0), 0xffff_ffff);
    }
}
