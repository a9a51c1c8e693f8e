//! The vGPU's figures: its identity (name, UUID, PCI address, compute
//! capability), its memory (the limit as the total, what its processes
//! hold as the host counts it), its share of the GPU, its processes, and
//! the modes a vGPU has or lacks. What the host does not pass on about the
//! physical GPU (temperature, power, fans, clocks, ECC, serial,
//! performance state) is `NVML_ERROR_NOT_SUPPORTED`.

use std::ffi::{c_char, c_int, c_uint};

use crate::abi::{self, Memory, MemoryV2, PciInfo, ProcessInfo, ProcessInfoV1, Utilization};
use crate::system::{device0, vgpu_bus, Device};
use crate::{code, out, out_str, state, Ret};

/// Checks that `d` is our device.
pub(crate) fn check(d: Device) -> Result<(), Ret> {
    dev(d).map(drop)
}

/// The device's description, for a handle of ours.
fn dev(d: Device) -> Result<std::sync::Arc<protocol::DeviceInfo>, Ret> {
    let info = state::info()?;
    if d != device0() {
        return Err(code::INVALID_ARGUMENT);
    }
    Ok(info)
}

/// The PCI data CUDA's attributes give for the vGPU.
fn pci_info() -> PciInfo {
    let (domain, bus, device) = vgpu_bus();
    let mut p = PciInfo {
        bus_id_legacy: [0; 16],
        domain,
        bus,
        device,
        pci_device_id: abi::VENDOR_NVIDIA,
        pci_sub_system_id: 0,
        bus_id: [0; 32],
    };
    let legacy = format!("{domain:04x}:{bus:02x}:{device:02x}.0");
    let long = format!("{domain:08X}:{bus:02X}:{device:02X}.0");
    for (dst, src) in [
        (&mut p.bus_id_legacy[..], legacy.as_bytes()),
        (&mut p.bus_id[..], long.as_bytes()),
    ] {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as c_char;
        }
    }
    p
}

/// Fills a caller's process array the way NVML does: `*count` in, how
/// many there are out; too small an array is `INSUFFICIENT_SIZE` (with the
/// count needed), and a zero count with a null array asks only the count.
fn fill_processes<T>(
    count: *mut c_uint,
    infos: *mut T,
    procs: &[protocol::VgpuProcess],
    make: impl Fn(&protocol::VgpuProcess) -> T,
) -> Result<(), Ret> {
    if count.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    // SAFETY: a non-null in/out count (NVML's contract).
    let room = unsafe { count.read_unaligned() } as usize;
    let n = c_uint::try_from(procs.len()).map_err(|_| code::UNKNOWN)?;
    out(count, n)?;
    if room < procs.len() {
        return Err(code::INSUFFICIENT_SIZE);
    }
    if procs.is_empty() {
        return Ok(());
    }
    if infos.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    for (i, p) in procs.iter().enumerate() {
        let slot = infos.wrapping_add(i);
        // SAFETY: the caller's array holds `room` >= procs.len() entries,
        // so `slot` is one of them.
        unsafe { slot.write_unaligned(make(p)) };
    }
    Ok(())
}

fn not_supported() -> Result<(), Ret> {
    Err(code::NOT_SUPPORTED)
}

export! {
    fn nvmlDeviceGetName(d: Device, buf: *mut c_char, len: c_uint) {
        out_str(buf, len, &dev(d)?.name)
    }

    /// The UUID `cuDeviceGetUuid` gives through the CUDA stand-in.
    fn nvmlDeviceGetUUID(d: Device, buf: *mut c_char, len: c_uint) {
        let info = dev(d)?;
        out_str(buf, len, &guest::uuid_string(&guest::vgpu_uuid(&info)))
    }

    fn nvmlDeviceGetPciInfo_v3(d: Device, pci: *mut PciInfo) {
        dev(d)?;
        out(pci, pci_info())
    }

    /// `nvmlPciInfoExt_v1_t`: the same address, with the class of a
    /// datacenter GPU (3D controller: base class 3, sub class 2). The
    /// caller sets the version; another one is `ARGUMENT_VERSION_MISMATCH`.
    fn nvmlDeviceGetPciInfoExt(d: Device, pci: *mut abi::PciInfoExt) {
        dev(d)?;
        if pci.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked for null; the caller's structure, whose first
        // word is its version.
        let version = unsafe { (pci as *const u32).read_unaligned() };
        if version != abi::PCI_INFO_EXT_V1 {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        let p = pci_info();
        let mut ext = abi::PciInfoExt {
            version,
            domain: p.domain,
            bus: p.bus,
            device: p.device,
            pci_device_id: p.pci_device_id,
            pci_sub_system_id: p.pci_sub_system_id,
            base_class: 3,
            sub_class: 2,
            bus_id: [0; 32],
        };
        ext.bus_id = p.bus_id;
        out(pci, ext)
    }

    fn nvmlDeviceGetIndex(d: Device, index: *mut c_uint) {
        dev(d)?;
        out(index, 0)
    }

    fn nvmlDeviceGetMinorNumber(d: Device, minor: *mut c_uint) {
        dev(d)?;
        out(minor, 0)
    }

    fn nvmlDeviceGetCudaComputeCapability(d: Device, major: *mut c_int, minor: *mut c_int) {
        let info = dev(d)?;
        out(major, info.cc.0 as c_int)?;
        out(minor, info.cc.1 as c_int)
    }

    fn nvmlDeviceGetArchitecture(d: Device, arch: *mut c_uint) {
        let info = dev(d)?;
        out(arch, abi::architecture(info.cc.0, info.cc.1))
    }

    fn nvmlDeviceGetBrand(d: Device, brand: *mut c_uint) {
        dev(d)?;
        out(brand, abi::BRAND_NVIDIA)
    }

    /// Total: the vGPU's limit; used: what its processes hold, as the
    /// host counts it against the limit.
    fn nvmlDeviceGetMemoryInfo(d: Device, m: *mut Memory) {
        dev(d)?;
        if m.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let r = state::report()?;
        out(m, Memory {
            total: r.mem_limit,
            free: r.mem_limit.saturating_sub(r.mem_used),
            used: r.mem_used,
        })
    }

    fn nvmlDeviceGetMemoryInfo_v2(d: Device, m: *mut MemoryV2) {
        dev(d)?;
        if m.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller set the version field (NVML's contract).
        let version = unsafe { m.cast::<u32>().read_unaligned() };
        if version != abi::MEMORY_V2 {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        let r = state::report()?;
        out(m, MemoryV2 {
            version,
            total: r.mem_limit,
            reserved: 0,
            free: r.mem_limit.saturating_sub(r.mem_used),
            used: r.mem_used,
        })
    }

    /// GPU: the vGPU's share of its GPU's time over the host's last
    /// interval; memory: 0 (the host does not sample memory traffic).
    fn nvmlDeviceGetUtilizationRates(d: Device, u: *mut Utilization) {
        dev(d)?;
        if u.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let r = state::report()?;
        out(u, Utilization {
            gpu: ((r.util_ppm + 5_000) / 10_000) as u32,
            memory: 0,
        })
    }

    /// The vGPU's processes (the guest processes with a CUDA session), with
    /// the memory each holds.
    fn nvmlDeviceGetComputeRunningProcesses_v3 [nvmlDeviceGetComputeRunningProcesses_v2] (d: Device, count: *mut c_uint, infos: *mut ProcessInfo) {
        dev(d)?;
        let r = state::report()?;
        fill_processes(count, infos, &r.processes, |p| ProcessInfo {
            pid: p.pid,
            used_gpu_memory: p.mem_used,
            gpu_instance_id: abi::NO_INSTANCE,
            compute_instance_id: abi::NO_INSTANCE,
        })
    }

    fn nvmlDeviceGetComputeRunningProcesses(d: Device, count: *mut c_uint, infos: *mut ProcessInfoV1) {
        dev(d)?;
        let r = state::report()?;
        fill_processes(count, infos, &r.processes, |p| ProcessInfoV1 {
            pid: p.pid,
            used_gpu_memory: p.mem_used,
        })
    }

    /// No graphics and no MPS clients on a vGPU.
    fn nvmlDeviceGetGraphicsRunningProcesses_v3 [nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlDeviceGetMPSComputeRunningProcesses_v2] (d: Device, count: *mut c_uint, infos: *mut ProcessInfo) {
        dev(d)?;
        fill_processes(count, infos, &[], |_| unreachable!("no processes"))
    }

    fn nvmlDeviceGetComputeMode(d: Device, mode: *mut c_uint) {
        dev(d)?;
        out(mode, abi::COMPUTEMODE_DEFAULT)
    }

    fn nvmlDeviceGetPersistenceMode(d: Device, mode: *mut c_uint) {
        dev(d)?;
        out(mode, abi::FEATURE_DISABLED)
    }

    /// One device of its own, as CUDA's MULTI_GPU_BOARD attribute says.
    fn nvmlDeviceGetMultiGpuBoard(d: Device, multi: *mut c_uint) {
        dev(d)?;
        out(multi, 0)
    }

    fn nvmlDeviceGetDisplayMode [nvmlDeviceGetDisplayActive] (d: Device, mode: *mut c_uint) {
        dev(d)?;
        out(mode, abi::FEATURE_DISABLED)
    }

    /// A vGPU is not a MIG instance and cannot be split into them.
    fn nvmlDeviceGetMigMode(d: Device, current: *mut c_uint, pending: *mut c_uint) {
        dev(d)?;
        out(current, abi::MIG_DISABLE)?;
        out(pending, abi::MIG_DISABLE)
    }

    fn nvmlDeviceIsMigDeviceHandle(d: Device, is_mig: *mut c_uint) {
        dev(d)?;
        out(is_mig, 0)
    }

    /// No NVLink: a vGPU has no peers.
    fn nvmlDeviceGetNvLinkState(d: Device, _link: c_uint, _active: *mut c_uint) {
        dev(d)?;
        not_supported()
    }

    fn nvmlDeviceGetTemperature(d: Device, _sensor: c_uint, _t: *mut c_uint) {
        dev(d)?;
        not_supported()
    }

    fn nvmlDeviceGetPowerUsage(d: Device, _mw: *mut c_uint) {
        dev(d)?;
        not_supported()
    }

    fn nvmlDeviceGetClockInfo(d: Device, _ty: c_uint, _mhz: *mut c_uint) {
        dev(d)?;
        not_supported()
    }

    fn nvmlDeviceGetSerial(d: Device, _buf: *mut c_char, _len: c_uint) {
        dev(d)?;
        not_supported()
    }

    fn nvmlDeviceGetPerformanceState(d: Device, _p: *mut c_uint) {
        dev(d)?;
        not_supported()
    }

    fn nvmlDeviceGetFanSpeed(d: Device, _speed: *mut c_uint) {
        dev(d)?;
        not_supported()
    }

    fn nvmlDeviceGetEccMode(d: Device, _current: *mut c_uint, _pending: *mut c_uint) {
        dev(d)?;
        not_supported()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_info_matches_cudas_bus_id() {
        let p = pci_info();
        let s = |b: &[c_char]| {
            let b: Vec<u8> = b
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8(b).unwrap()
        };
        assert_eq!(s(&p.bus_id_legacy), guest::PCI_BUS_ID);
        assert_eq!(s(&p.bus_id), "00000000:00:00.0");
        assert_eq!((p.domain, p.bus, p.device), (0, 0, 0));
    }

    #[test]
    fn process_arrays_as_nvml_fills_them() {
        let procs = [
            protocol::VgpuProcess {
                pid: 7,
                mem_used: 10,
            },
            protocol::VgpuProcess {
                pid: 8,
                mem_used: 20,
            },
        ];
        let make = |p: &protocol::VgpuProcess| ProcessInfoV1 {
            pid: p.pid,
            used_gpu_memory: p.mem_used,
        };
        // Asking for the count only.
        let mut n: c_uint = 0;
        let r = fill_processes(&mut n, std::ptr::null_mut(), &procs, make);
        assert_eq!((r, n), (Err(code::INSUFFICIENT_SIZE), 2));
        let mut arr = [ProcessInfoV1 {
            pid: 0,
            used_gpu_memory: 0,
        }; 4];
        let mut n: c_uint = 4;
        fill_processes(&mut n, arr.as_mut_ptr(), &procs, make).unwrap();
        assert_eq!(n, 2);
        assert_eq!((arr[1].pid, arr[1].used_gpu_memory), (8, 20));
        let mut n: c_uint = 0;
        assert_eq!(
            fill_processes(&mut n, std::ptr::null_mut(), &[], make),
            Ok(())
        );
        assert_eq!(n, 0);
        assert_eq!(
            fill_processes(std::ptr::null_mut(), arr.as_mut_ptr(), &procs, make),
            Err(code::INVALID_ARGUMENT)
        );
    }
}
