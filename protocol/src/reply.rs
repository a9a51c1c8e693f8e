//! Replies: the inline values of a reply, the device description
//! `Hello` answers with, and the vGPU's figures `VgpuStatus` answers with.

use crate::codec::len_u32;
use crate::{ProtoError, Reader, Writer, INLINE};

/// A reply: the status travels in the descriptor, up to ten u64 values inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reply {
    /// Values, meaning per request (a pointer, a handle, free/total, f32 bits).
    pub vals: [u64; 4],
}

impl Reply {
    /// A reply with one value.
    pub fn one(v: u64) -> Reply {
        Reply { vals: [v, 0, 0, 0] }
    }

    /// Encodes into an inline payload.
    pub fn encode(&self, out: &mut [u8; INLINE]) {
        let mut w = Writer::new(out);
        for v in self.vals {
            w.u64(v);
        }
    }

    /// Decodes (a reply comes from the trusted host; still total).
    pub fn decode(inline: &[u8; INLINE]) -> Reply {
        let mut r = Reader::new(inline);
        let mut vals = [0u64; 4];
        for v in &mut vals {
            *v = r.u64().unwrap_or(0);
        }
        Reply { vals }
    }
}

/// What `Hello` answers: the device as the guest should see it. Encoded in the
/// reply's data as little-endian fields.
///
/// The vGPU's identity ([`DeviceInfo::uuid`], [`DeviceInfo::driver_version`],
/// [`DeviceInfo::cuda_version`]) comes last, after the fields older hosts
/// send: an older guest stops reading before it, and a guest reading an
/// older host's description finds none (no UUID, an empty driver version,
/// CUDA version 0).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Memory this vGPU may allocate (its limit).
    pub total_mem: u64,
    /// Compute capability major, minor.
    pub cc: (u32, u32),
    /// Multiprocessors.
    pub sm_count: u32,
    /// `(CUdevice_attribute, value)` pairs answered in the guest without a round trip.
    pub attributes: Vec<(u32, i32)>,
    /// Bytes of the region's pinned pool (0: none).
    pub pinned_size: u64,
    /// The device address of the pool's first byte (where kernels reach
    /// it); guests map the pool at this address too when they can, so that
    /// a pinned pointer is the same on both sides.
    pub pinned_base: u64,
    /// The vGPU's own UUID, stable for the VM across worker restarts and
    /// migrations, different between VMs (`None`: the host did not say).
    pub uuid: Option<[u8; 16]>,
    /// The host's NVIDIA driver release, as NVML writes it ("580.65.06";
    /// empty: the host did not say). At most [`MAX_DRIVER_VERSION`] bytes.
    pub driver_version: String,
    /// The CUDA version the host's driver implements, as
    /// `cuDriverGetVersion` gives it (13000 for 13.0; 0: the host did not say).
    pub cuda_version: u32,
}

/// Longest driver version a [`DeviceInfo`] carries (NVML's buffer for it,
/// `NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`, less its NUL).
pub const MAX_DRIVER_VERSION: usize = 79;

impl DeviceInfo {
    /// Serializes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        let name = self.name.as_bytes();
        v.extend_from_slice(&len_u32(name.len()).to_le_bytes());
        v.extend_from_slice(name);
        v.extend_from_slice(&self.total_mem.to_le_bytes());
        v.extend_from_slice(&self.cc.0.to_le_bytes());
        v.extend_from_slice(&self.cc.1.to_le_bytes());
        v.extend_from_slice(&self.sm_count.to_le_bytes());
        v.extend_from_slice(&len_u32(self.attributes.len()).to_le_bytes());
        for (a, val) in &self.attributes {
            v.extend_from_slice(&a.to_le_bytes());
            v.extend_from_slice(&val.to_le_bytes());
        }
        v.extend_from_slice(&self.pinned_size.to_le_bytes());
        v.extend_from_slice(&self.pinned_base.to_le_bytes());
        // The identity, after everything older guests read.
        v.extend_from_slice(&self.uuid.unwrap_or([0; 16]));
        v.extend_from_slice(&self.cuda_version.to_le_bytes());
        let dv =
            &self.driver_version.as_bytes()[..self.driver_version.len().min(MAX_DRIVER_VERSION)];
        v.extend_from_slice(&len_u32(dv.len()).to_le_bytes());
        v.extend_from_slice(dv);
        v
    }

    /// Parses, bounds-checked. A description that ends before the identity
    /// (an older host's) has none; one cut inside it is an error.
    pub fn from_bytes(b: &[u8]) -> Result<DeviceInfo, ProtoError> {
        let mut r = Reader::new(b);
        let n = r.u32()? as usize;
        let name = String::from_utf8_lossy(r.bytes(n)?).into_owned();
        let total_mem = r.u64()?;
        let cc = (r.u32()?, r.u32()?);
        let sm_count = r.u32()?;
        let count = r.u32()? as usize;
        let mut attributes = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            attributes.push((r.u32()?, r.u32()?.cast_signed()));
        }
        let pinned_size = r.u64()?;
        let pinned_base = r.u64()?;
        let mut info = DeviceInfo {
            name,
            total_mem,
            cc,
            sm_count,
            attributes,
            pinned_size,
            pinned_base,
            ..DeviceInfo::default()
        };
        if r.remaining() == 0 {
            return Ok(info);
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.bytes(16)?);
        info.uuid = (uuid != [0; 16]).then_some(uuid);
        info.cuda_version = r.u32()?;
        let n = r.u32()? as usize;
        if n > MAX_DRIVER_VERSION {
            return Err(crate::bad("driver_version", format!("{n} bytes")));
        }
        info.driver_version = String::from_utf8_lossy(r.bytes(n)?).into_owned();
        Ok(info)
    }
}

/// One guest process a vGPU serves, as `VgpuStatus` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VgpuProcess {
    /// The process id the guest gave when it claimed its channel (the
    /// guest's own numbering; unverified, shown back to the same VM only).
    pub pid: u32,
    /// Device memory its allocations take, bytes (as counted against the
    /// vGPU's limit).
    pub mem_used: u64,
}

/// Bytes of one [`VgpuProcess`] on the wire.
const PROCESS_BYTES: usize = 12;

/// What `VgpuStatus` answers in its data: the device (as `Hello` describes
/// it) and some of the vGPU's processes. Encoded as the device's length
/// (u32), the device, then 12 bytes a process (pid u32, memory u64).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VgpuStatus {
    /// The device.
    pub info: DeviceInfo,
    /// Processes, from the one the request asked for on.
    pub processes: Vec<VgpuProcess>,
}

impl VgpuStatus {
    /// How many processes fit in `budget` bytes after a device of
    /// `info_len` bytes.
    pub fn fit(info_len: usize, budget: usize) -> usize {
        budget.saturating_sub(4 + info_len) / PROCESS_BYTES
    }

    /// Serializes (the device already serialized, as the host keeps it).
    pub fn encode(info: &[u8], processes: &[VgpuProcess]) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + info.len() + processes.len() * PROCESS_BYTES);
        v.extend_from_slice(&len_u32(info.len()).to_le_bytes());
        v.extend_from_slice(info);
        for p in processes {
            v.extend_from_slice(&p.pid.to_le_bytes());
            v.extend_from_slice(&p.mem_used.to_le_bytes());
        }
        v
    }

    /// Parses, bounds-checked: a device cut short or a partial process is
    /// an error.
    pub fn from_bytes(b: &[u8]) -> Result<VgpuStatus, ProtoError> {
        let mut r = Reader::new(b);
        let n = r.u32()? as usize;
        let info = DeviceInfo::from_bytes(r.bytes(n)?)?;
        if !r.remaining().is_multiple_of(PROCESS_BYTES) {
            return Err(ProtoError::Truncated);
        }
        let mut processes = Vec::with_capacity(r.remaining() / PROCESS_BYTES);
        while r.remaining() > 0 {
            processes.push(VgpuProcess {
                pid: r.u32()?,
                mem_used: r.u64()?,
            });
        }
        Ok(VgpuStatus { info, processes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn device_info_round_trips_and_truncation_is_an_error() {
        let info = DeviceInfo {
            name: "sim GPU".into(),
            total_mem: 1 << 30,
            cc: (9, 0),
            sm_count: 132,
            attributes: vec![(1, 1024), (16, 132)],
            pinned_size: 64 << 20,
            pinned_base: 0x3f00_0000_0000,
            uuid: Some([7; 16]),
            driver_version: "580.159.04".into(),
            cuda_version: 13000,
        };
        let b = info.to_bytes();
        assert_eq!(DeviceInfo::from_bytes(&b).unwrap(), info);
        // Where an older host's description ends, the identity is absent.
        let old_end = b.len() - (16 + 4 + 4 + "580.159.04".len());
        let old = DeviceInfo::from_bytes(&b[..old_end]).unwrap();
        assert_eq!(
            old,
            DeviceInfo {
                uuid: None,
                driver_version: String::new(),
                cuda_version: 0,
                ..info.clone()
            }
        );
        for cut in (0..b.len()).filter(|&c| c != old_end) {
            assert!(DeviceInfo::from_bytes(&b[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn an_older_guest_reads_a_newer_description_up_to_what_it_knows() {
        // An older guest parses the fields it knows and ignores what follows
        // (no check that the reader is exhausted): the identity's bytes are
        // only a tail. Here: the fields before the identity are unchanged.
        let info = DeviceInfo {
            name: "GPU".into(),
            uuid: Some([1; 16]),
            driver_version: "580.65.06".into(),
            cuda_version: 13000,
            ..DeviceInfo::default()
        };
        let without = DeviceInfo {
            uuid: None,
            driver_version: String::new(),
            cuda_version: 0,
            ..info.clone()
        };
        let (b, old) = (info.to_bytes(), without.to_bytes());
        assert_eq!(b[..old.len() - 24], old[..old.len() - 24]);
        // A driver version too long for NVML's buffer is cut on the host and
        // refused from a host that sends one anyway.
        let long = DeviceInfo {
            driver_version: "9".repeat(200),
            ..info.clone()
        };
        let parsed = DeviceInfo::from_bytes(&long.to_bytes()).unwrap();
        assert_eq!(parsed.driver_version.len(), MAX_DRIVER_VERSION);
        let mut bad = info.to_bytes();
        let at = bad.len() - "580.65.06".len() - 4;
        bad[at..at + 4].copy_from_slice(&200u32.to_le_bytes());
        bad.extend_from_slice(&[b'9'; 200]);
        assert!(DeviceInfo::from_bytes(&bad).is_err());
    }

    #[test]
    fn vgpu_status_round_trips_and_truncation_is_an_error() {
        let info = DeviceInfo {
            name: "sim GPU".into(),
            total_mem: 1 << 30,
            ..DeviceInfo::default()
        };
        let procs = [
            VgpuProcess {
                pid: 41,
                mem_used: 2 << 20,
            },
            VgpuProcess {
                pid: 42,
                mem_used: 0,
            },
        ];
        let b = VgpuStatus::encode(&info.to_bytes(), &procs);
        let st = VgpuStatus::from_bytes(&b).unwrap();
        assert_eq!(st.info, info);
        assert_eq!(st.processes, procs);
        let info_len = info.to_bytes().len();
        for cut in 0..b.len() {
            let r = VgpuStatus::from_bytes(&b[..cut]);
            match cut.checked_sub(4 + info_len) {
                // Whole processes only: fewer of them.
                Some(p) if p % 12 == 0 => assert_eq!(r.unwrap().processes, procs[..p / 12]),
                _ => assert!(r.is_err(), "cut at {cut}"),
            }
        }
        assert_eq!(VgpuStatus::fit(info_len, info_len + 4 + 25), 2);
        assert_eq!(VgpuStatus::fit(info_len, 3), 0);
    }

    proptest! {
        #[test]
        fn vgpu_status_parse_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = VgpuStatus::from_bytes(&bytes);
        }

        #[test]
        fn device_info_parse_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = DeviceInfo::from_bytes(&bytes);
        }
    }
}
