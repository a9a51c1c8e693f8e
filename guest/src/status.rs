//! What a monitor in the guest asks of the vGPU (`VgpuStatus`: the NVML
//! stand-in's memory, utilization and process figures), and the identity
//! the vGPU shows both to CUDA (the `libcuda.so.1` stand-in) and to NVML,
//! kept here so that the two agree.

use protocol::{DeviceInfo, Request, VgpuProcess, VgpuStatus};

use crate::{Gpu, GuestError, Result};

/// The CUDA version the stand-ins implement (13.0): what `cuDriverGetVersion`
/// reports, and the most NVML's CUDA driver version reports (see
/// [`cuda_version`]).
pub const CUDA_DRIVER_VERSION: i32 = 13000;

/// The driver release the stand-ins report where the host does not say
/// (a host older than the identity in `DeviceInfo`): the branch whose
/// symbols they mirror.
pub const FALLBACK_DRIVER_RELEASE: &str = "580.00";

/// The host driver's release, as NVML writes it ("580.159.04").
pub fn driver_release(info: &DeviceInfo) -> &str {
    if info.driver_version.is_empty() {
        FALLBACK_DRIVER_RELEASE
    } else {
        &info.driver_version
    }
}

/// The CUDA version NVML reports: the host driver's, but no more than the
/// stand-in `libcuda.so.1` implements ([`CUDA_DRIVER_VERSION`]); that one
/// where the host does not say.
pub fn cuda_version(info: &DeviceInfo) -> i32 {
    match i32::try_from(info.cuda_version) {
        Ok(v) if v > 0 => v.min(CUDA_DRIVER_VERSION),
        _ => CUDA_DRIVER_VERSION,
    }
}

/// The PCI bus id a vGPU reports to CUDA, as `cuDeviceGetPCIBusId` writes
/// it: domain, bus and device 0 (it has no address of its own on the
/// guest's bus that programs could use).
pub const PCI_BUS_ID: &str = "0000:00:00.0";

/// The vGPU as a monitor sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VgpuReport {
    /// The device (as `Hello` describes it).
    pub info: DeviceInfo,
    /// The memory the vGPU may hold (its limit), bytes.
    pub mem_limit: u64,
    /// The memory its processes hold, as the host counts it against the
    /// limit, bytes.
    pub mem_used: u64,
    /// Its share of its GPU over the host's last interval, parts per million.
    pub util_ppm: u64,
    /// The guest processes it serves, with the memory each holds.
    pub processes: Vec<VgpuProcess>,
}

impl Gpu {
    /// The vGPU's figures (`VgpuStatus`), on a connection from
    /// [`Gpu::monitor_from_env`]: every process, asked a message's worth
    /// at a time.
    pub fn vgpu_status(&mut self) -> Result<VgpuReport> {
        let mut report = VgpuReport::default();
        loop {
            let first = u32::try_from(report.processes.len())
                .ok()
                .filter(|&f| f <= protocol::MAX_STATUS_PROCESSES)
                .ok_or_else(|| GuestError::Protocol("too many processes".into()))?;
            let (r, data) = self.call_data(&Request::VgpuStatus { first }, &[])?;
            let st =
                VgpuStatus::from_bytes(&data).map_err(|e| GuestError::Protocol(e.to_string()))?;
            let [limit, used, util, count] = r.vals;
            let before = report.processes.len();
            report.info = st.info;
            report.mem_limit = limit;
            report.mem_used = used;
            report.util_ppm = util.min(1_000_000);
            report.processes.extend(st.processes);
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            if report.processes.len() >= count {
                report.processes.truncate(count);
                return Ok(report);
            }
            if report.processes.len() == before {
                // The list shrank as we read it, or the host sends none.
                return Ok(report);
            }
        }
    }
}

/// A vGPU has its own identity: the UUID its host gives it (one per VM,
/// kept across worker restarts and migrations), the same for CUDA and
/// NVML. It is not the physical GPU's. A host that gives none (an older
/// one) leaves the guest to derive one from the vGPU's socket (or device
/// path) and device name.
pub fn vgpu_uuid(info: &DeviceInfo) -> [u8; 16] {
    info.uuid.unwrap_or_else(|| derived_uuid(&info.name))
}

/// The UUID guests derived before hosts gave one: from `FAIRVGPU_SOCKET`
/// (or `FAIRVGPU_DEVICE`) and the device name.
fn derived_uuid(name: &str) -> [u8; 16] {
    let mut h: [u64; 2] = [0xcbf2_9ce4_8422_2325, 0x8422_2325_cbf2_9ce4];
    let sock = std::env::var("FAIRVGPU_SOCKET")
        .or_else(|_| std::env::var("FAIRVGPU_DEVICE"))
        .unwrap_or_default();
    for (k, b) in sock.bytes().chain(name.bytes()).enumerate() {
        let w = &mut h[k % 2];
        *w = (*w ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&h[0].to_le_bytes());
    u[8..].copy_from_slice(&h[1].to_le_bytes());
    u[6] = (u[6] & 0x0f) | 0x40; // version 4
    u[8] = (u[8] & 0x3f) | 0x80; // variant 1
    u
}

/// A UUID as NVML and `nvidia-smi` write a GPU's:
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let mut s = String::from("GPU-");
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uuid_is_a_version_4_uuid_written_as_nvml_writes_it() {
        let u = derived_uuid("GPU");
        assert_eq!(u[6] >> 4, 4);
        assert_eq!(u[8] >> 6, 2);
        let s = uuid_string(&[
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0x4d, 0xef, 0x80, 0x01, 0x02, 0x03, 0x04, 0x05,
            0x06, 0xff,
        ]);
        assert_eq!(s, "GPU-12345678-9abc-4def-8001-0203040506ff");
        assert_ne!(derived_uuid("GPU A"), derived_uuid("GPU B"));
    }

    #[test]
    fn the_hosts_identity_wins_and_an_older_host_gets_the_old_one() {
        let old = DeviceInfo {
            name: "GPU A".into(),
            ..DeviceInfo::default()
        };
        assert_eq!(vgpu_uuid(&old), derived_uuid("GPU A"));
        assert_eq!(driver_release(&old), FALLBACK_DRIVER_RELEASE);
        assert_eq!(cuda_version(&old), CUDA_DRIVER_VERSION);
        let new = DeviceInfo {
            uuid: Some([9; 16]),
            driver_version: "580.159.04".into(),
            cuda_version: 12080,
            ..old.clone()
        };
        assert_eq!(vgpu_uuid(&new), [9; 16]);
        assert_eq!(driver_release(&new), "580.159.04");
        assert_eq!(cuda_version(&new), 12080);
        // A newer driver than the stand-in implements: the stand-in's.
        let newer = DeviceInfo {
            cuda_version: 13020,
            ..new
        };
        assert_eq!(cuda_version(&newer), CUDA_DRIVER_VERSION);
    }
}
