//! Initialization, versions, error strings, and finding the device: one,
//! index 0, whatever the host has.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::{code, out, out_str, state, Ret};

/// `nvmlDevice_t`: an opaque pointer; ours points at `DEVICE0`.
pub type Device = *mut c_void;

/// What the one device's handle points at.
static DEVICE0: u8 = 0;

/// The handle of the vGPU.
pub(crate) fn device0() -> Device {
    (&raw const DEVICE0).cast_mut().cast()
}

/// NVML's version as NVML writes it: the CUDA major version, then the
/// driver's release ("13.580.65.06").
fn nvml_version(info: &protocol::DeviceInfo) -> String {
    format!(
        "{}.{}",
        guest::cuda_version(info) / 1000,
        guest::driver_release(info)
    )
}

/// `domain:bus:device.function` (hex, the domain optional) as numbers.
pub(crate) fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let (rest, func) = s.trim().rsplit_once('.')?;
    u32::from_str_radix(func, 16).ok()?;
    let parts: Vec<&str> = rest.split(':').collect();
    let hex = |p: &str| u32::from_str_radix(p, 16).ok();
    match parts[..] {
        [d, b, dev] => Some((hex(d)?, hex(b)?, hex(dev)?)),
        [b, dev] => Some((0, hex(b)?, hex(dev)?)),
        _ => None,
    }
}

/// The vGPU's (domain, bus, device): CUDA's PCI attributes for it.
pub(crate) fn vgpu_bus() -> (u32, u32, u32) {
    parse_bus_id(guest::PCI_BUS_ID).unwrap_or((0, 0, 0))
}

export! {
    /// Attaches to the vGPU (the first call; later ones count).
    fn nvmlInit_v2 [nvmlInit] () {
        state::init()
    }

    fn nvmlInitWithFlags(flags: c_uint) {
        if flags & !crate::abi::INIT_FLAGS != 0 {
            return Err(code::INVALID_ARGUMENT);
        }
        state::init()
    }

    fn nvmlShutdown() {
        state::shutdown()
    }

    /// The host driver's release.
    fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) {
        let info = state::info()?;
        out_str(buf, len, guest::driver_release(&info))
    }

    fn nvmlSystemGetNVMLVersion(buf: *mut c_char, len: c_uint) {
        out_str(buf, len, &nvml_version(&*state::info_any()?))
    }

    /// The host driver's CUDA version, at most the one the `libcuda.so.1`
    /// stand-in implements.
    fn nvmlSystemGetCudaDriverVersion [nvmlSystemGetCudaDriverVersion_v2] (v: *mut c_int) {
        if v.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        out(v, guest::cuda_version(&*state::info_any()?))
    }

    /// A guest process's name (the processes NVML lists are this
    /// system's own).
    fn nvmlSystemGetProcessName(pid: c_uint, buf: *mut c_char, len: c_uint) {
        state::info()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|_| code::NOT_FOUND)?;
        let first = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        let name = if first.is_empty() {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map_err(|_| code::NOT_FOUND)?
                .trim_end()
                .to_owned()
        } else {
            String::from_utf8_lossy(first).into_owned()
        };
        if len == 0 {
            return Err(code::INVALID_ARGUMENT);
        }
        // NVML truncates a long name to the buffer.
        let mut end = name.len().min(len as usize - 1);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        out_str(buf, len, &name[..end])
    }

    /// Exactly one device: the vGPU.
    fn nvmlDeviceGetCount_v2 [nvmlDeviceGetCount] (n: *mut c_uint) {
        state::info()?;
        out(n, 1)
    }

    fn nvmlDeviceGetHandleByIndex_v2 [nvmlDeviceGetHandleByIndex] (index: c_uint, d: *mut Device) {
        state::info()?;
        if index != 0 {
            return Err(code::INVALID_ARGUMENT);
        }
        out(d, device0())
    }

    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, d: *mut Device) {
        let info = state::info()?;
        // SAFETY: a NUL-terminated string (NVML's contract); null is refused.
        let want = unsafe { crate::c_str(uuid) }?;
        let ours = guest::uuid_string(&guest::vgpu_uuid(&info));
        if !want.trim().eq_ignore_ascii_case(&ours) {
            return Err(code::NOT_FOUND);
        }
        out(d, device0())
    }

    fn nvmlDeviceGetHandleByPciBusId_v2 [nvmlDeviceGetHandleByPciBusId] (bus: *const c_char, d: *mut Device) {
        state::info()?;
        // SAFETY: a NUL-terminated string (NVML's contract); null is refused.
        let id = unsafe { crate::c_str(bus) }?;
        let parsed = parse_bus_id(id).ok_or(code::INVALID_ARGUMENT)?;
        if parsed != vgpu_bus() {
            return Err(code::NOT_FOUND);
        }
        out(d, device0())
    }
}

/// NVML's wording for an `nvmlReturn_t` (a string that lives forever).
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    crate::describe(result).as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_in_cudas_and_nvmls_forms() {
        assert_eq!(parse_bus_id("0000:00:00.0"), Some((0, 0, 0)));
        assert_eq!(parse_bus_id("00000000:00:00.0"), Some((0, 0, 0)));
        assert_eq!(parse_bus_id("00000001:3B:00.0"), Some((1, 0x3b, 0)));
        assert_eq!(parse_bus_id("3b:1f.0"), Some((0, 0x3b, 0x1f)));
        assert_eq!(parse_bus_id("nonsense"), None);
        assert_eq!(parse_bus_id("0:0:0:0.0"), None);
        assert_eq!(vgpu_bus(), (0, 0, 0));
    }

    #[test]
    fn versions_as_nvml_writes_them() {
        let info = protocol::DeviceInfo {
            driver_version: "580.159.04".into(),
            cuda_version: 13000,
            ..Default::default()
        };
        assert_eq!(nvml_version(&info), "13.580.159.04");
        let older_cuda = protocol::DeviceInfo {
            driver_version: "575.57.08".into(),
            cuda_version: 12090,
            ..Default::default()
        };
        assert_eq!(nvml_version(&older_cuda), "12.575.57.08");
        assert_eq!(nvml_version(&Default::default()), "13.580.00");
    }
}
