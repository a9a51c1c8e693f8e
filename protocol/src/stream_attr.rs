//! Stream attributes (`CUstreamAttrID` and `CUstreamAttrValue`), as a guest
//! sets them and the host applies them to its stream: the L2 access policy
//! window, the synchronization policy, the priority and the memory
//! synchronization domains.
//!
//! On the wire a value is the first [`RAW_LEN`] bytes of the driver's
//! 64-byte union, in its own layout (little-endian), which the host hands
//! back to its driver as it is once [`StreamAttr::from_raw`] checked it.
//! Bytes a kind of value does not use are ignored and sent as zeros.

use crate::{bad, ProtoError};

/// Bytes of a value on the wire: the largest member the host takes (the
/// access policy window, 28 bytes, padded to 8).
pub const RAW_LEN: usize = 32;

/// `CUstreamAttrID`s the host takes.
pub mod id {
    #![allow(missing_docs)]
    pub const ACCESS_POLICY_WINDOW: u32 = 1;
    pub const SYNCHRONIZATION_POLICY: u32 = 3;
    pub const PRIORITY: u32 = 8;
    pub const MEM_SYNC_DOMAIN_MAP: u32 = 9;
    pub const MEM_SYNC_DOMAIN: u32 = 10;
    /// All of them.
    pub const ALL: [u32; 5] = [
        ACCESS_POLICY_WINDOW,
        SYNCHRONIZATION_POLICY,
        PRIORITY,
        MEM_SYNC_DOMAIN_MAP,
        MEM_SYNC_DOMAIN,
    ];
}

/// Memory synchronization domains a device has at most (Hopper: 4).
pub const MAX_MEM_SYNC_DOMAINS: u8 = 4;

/// A `CUaccessPolicyWindow`: accesses to `bytes` bytes from `base` hit L2
/// with `hit_prop` in a fraction `hit_ratio` of them, else `miss_prop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AccessPolicyWindow {
    /// `base_ptr`: a device address (a hint: nothing is read there).
    pub base: u64,
    /// `num_bytes`.
    pub bytes: u64,
    /// `hitRatio`, an `f32` in [0, 1], by its bits.
    pub hit_ratio_bits: u32,
    /// `hitProp`: `CUaccessProperty` 0 normal, 1 streaming, 2 persisting.
    pub hit_prop: u32,
    /// `missProp`, likewise.
    pub miss_prop: u32,
}

/// One stream attribute and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamAttr {
    /// The L2 access policy window of the stream's kernels.
    AccessPolicyWindow(AccessPolicyWindow),
    /// `CUsynchronizationPolicy` (1 auto .. 4 blocking sync).
    SyncPolicy(u32),
    /// The stream's priority (lower is greater).
    Priority(i32),
    /// `CUlaunchMemSyncDomainMap`: the domains of the default and remote
    /// domain.
    MemSyncDomainMap {
        /// `default_`.
        default: u8,
        /// `remote`.
        remote: u8,
    },
    /// `CUlaunchMemSyncDomain`: 0 default, 1 remote.
    MemSyncDomain(u32),
}

fn word(raw: &[u8; RAW_LEN], at: usize) -> u32 {
    u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]])
}

fn dword(raw: &[u8; RAW_LEN], at: usize) -> u64 {
    u64::from(word(raw, at)) | u64::from(word(raw, at + 4)) << 32
}

impl StreamAttr {
    /// The attribute's `CUstreamAttrID`.
    pub fn id(&self) -> u32 {
        match self {
            StreamAttr::AccessPolicyWindow(_) => id::ACCESS_POLICY_WINDOW,
            StreamAttr::SyncPolicy(_) => id::SYNCHRONIZATION_POLICY,
            StreamAttr::Priority(_) => id::PRIORITY,
            StreamAttr::MemSyncDomainMap { .. } => id::MEM_SYNC_DOMAIN_MAP,
            StreamAttr::MemSyncDomain(_) => id::MEM_SYNC_DOMAIN,
        }
    }

    /// Whether it shapes how the stream's kernels run (and so must reach
    /// each kernel launched into it), rather than how the host waits.
    pub fn shapes_kernels(&self) -> bool {
        !matches!(self, StreamAttr::SyncPolicy(_))
    }

    /// Reads and checks attribute `attr` from its value's bytes.
    pub fn from_raw(attr: u32, raw: &[u8; RAW_LEN]) -> Result<StreamAttr, ProtoError> {
        Ok(match attr {
            id::ACCESS_POLICY_WINDOW => {
                let w = AccessPolicyWindow {
                    base: dword(raw, 0),
                    bytes: dword(raw, 8),
                    hit_ratio_bits: word(raw, 16),
                    hit_prop: word(raw, 20),
                    miss_prop: word(raw, 24),
                };
                let ratio = f32::from_bits(w.hit_ratio_bits);
                if !(0.0..=1.0).contains(&ratio) {
                    return Err(bad("hit_ratio", format!("{ratio} is not in [0, 1]")));
                }
                if w.hit_prop > 2 || w.miss_prop > 2 {
                    return Err(bad(
                        "access_property",
                        format!("hit {} miss {}", w.hit_prop, w.miss_prop),
                    ));
                }
                if w.bytes > crate::MAX_LEN || w.base.checked_add(w.bytes).is_none() {
                    return Err(bad("num_bytes", format!("{:#x}+{:#x}", w.base, w.bytes)));
                }
                StreamAttr::AccessPolicyWindow(w)
            }
            id::SYNCHRONIZATION_POLICY => match word(raw, 0) {
                p @ 1..=4 => StreamAttr::SyncPolicy(p),
                p => return Err(bad("sync_policy", format!("unknown policy {p}"))),
            },
            id::PRIORITY => match word(raw, 0).cast_signed() {
                p @ -64..=64 => StreamAttr::Priority(p),
                p => return Err(bad("priority", format!("{p}"))),
            },
            id::MEM_SYNC_DOMAIN_MAP => {
                let (default, remote) = (raw[0], raw[1]);
                if default >= MAX_MEM_SYNC_DOMAINS || remote >= MAX_MEM_SYNC_DOMAINS {
                    return Err(bad("domain_map", format!("{default}, {remote}")));
                }
                StreamAttr::MemSyncDomainMap { default, remote }
            }
            id::MEM_SYNC_DOMAIN => match word(raw, 0) {
                d @ 0..=1 => StreamAttr::MemSyncDomain(d),
                d => return Err(bad("domain", format!("unknown domain {d}"))),
            },
            a => return Err(bad("attr", format!("unknown stream attribute {a}"))),
        })
    }

    /// Its value's bytes, in the driver's layout (unused bytes zero).
    pub fn to_raw(&self) -> [u8; RAW_LEN] {
        let mut raw = [0u8; RAW_LEN];
        let mut put = |at: usize, b: &[u8]| raw[at..at + b.len()].copy_from_slice(b);
        match *self {
            StreamAttr::AccessPolicyWindow(w) => {
                put(0, &w.base.to_le_bytes());
                put(8, &w.bytes.to_le_bytes());
                put(16, &w.hit_ratio_bits.to_le_bytes());
                put(20, &w.hit_prop.to_le_bytes());
                put(24, &w.miss_prop.to_le_bytes());
            }
            StreamAttr::SyncPolicy(p) | StreamAttr::MemSyncDomain(p) => put(0, &p.to_le_bytes()),
            StreamAttr::Priority(p) => put(0, &p.to_le_bytes()),
            StreamAttr::MemSyncDomainMap { default, remote } => put(0, &[default, remote]),
        }
        raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(base: u64, bytes: u64, ratio: f32, hit: u32, miss: u32) -> [u8; RAW_LEN] {
        StreamAttr::AccessPolicyWindow(AccessPolicyWindow {
            base,
            bytes,
            hit_ratio_bits: ratio.to_bits(),
            hit_prop: hit,
            miss_prop: miss,
        })
        .to_raw()
    }

    #[test]
    fn values_read_back_as_written_in_the_drivers_layout() {
        let raw = window(0x7f00_0000_0000, 16 << 20, 0.6, 2, 1);
        // CUaccessPolicyWindow: base_ptr, num_bytes, hitRatio, hitProp, missProp.
        assert_eq!(raw[..8], 0x7f00_0000_0000u64.to_le_bytes());
        assert_eq!(raw[8..16], (16u64 << 20).to_le_bytes());
        assert_eq!(raw[16..20], 0.6f32.to_le_bytes());
        assert_eq!(raw[20..24], 2u32.to_le_bytes());
        assert_eq!(raw[24..28], 1u32.to_le_bytes());
        let a = StreamAttr::from_raw(id::ACCESS_POLICY_WINDOW, &raw).unwrap();
        assert_eq!(a.to_raw(), raw);
        assert!(a.shapes_kernels());
        for a in [
            StreamAttr::SyncPolicy(4),
            StreamAttr::Priority(-5),
            StreamAttr::MemSyncDomainMap {
                default: 0,
                remote: 1,
            },
            StreamAttr::MemSyncDomain(1),
        ] {
            assert_eq!(StreamAttr::from_raw(a.id(), &a.to_raw()), Ok(a));
        }
        assert!(!StreamAttr::SyncPolicy(1).shapes_kernels());
        // Bytes a value does not use are ignored.
        let mut raw = StreamAttr::Priority(-3).to_raw();
        raw[8] = 0xff;
        assert_eq!(
            StreamAttr::from_raw(id::PRIORITY, &raw),
            Ok(StreamAttr::Priority(-3))
        );
    }

    #[test]
    fn bad_values_are_refused() {
        let bad = |attr, raw: [u8; RAW_LEN]| StreamAttr::from_raw(attr, &raw).unwrap_err();
        let w = id::ACCESS_POLICY_WINDOW;
        bad(w, window(0, 1 << 20, 1.5, 2, 1));
        bad(w, window(0, 1 << 20, -0.1, 2, 1));
        bad(w, window(0, 1 << 20, f32::NAN, 2, 1));
        bad(w, window(0, 1 << 20, 0.5, 3, 1));
        bad(w, window(0, 1 << 20, 0.5, 0, 7));
        bad(w, window(u64::MAX - 10, 1 << 20, 0.5, 2, 1));
        bad(w, window(0, crate::MAX_LEN + 1, 0.5, 2, 1));
        let mut raw = [0u8; RAW_LEN];
        bad(id::SYNCHRONIZATION_POLICY, raw);
        raw[0] = 5;
        bad(id::SYNCHRONIZATION_POLICY, raw);
        bad(id::MEM_SYNC_DOMAIN, raw);
        bad(id::MEM_SYNC_DOMAIN_MAP, raw);
        bad(id::PRIORITY, StreamAttr::Priority(1000).to_raw());
        for attr in [0, 2, 4, 5, 6, 7, 11, 99] {
            bad(attr, [0u8; RAW_LEN]);
        }
    }
}
