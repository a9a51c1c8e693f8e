//! The feed: what the daemon and a VM's worker say over their socket pair
//! (see the daemon's `link` and the worker's `fed`).
//!
//! Feed messages reuse the ivshmem-server framing (one `i64`, optionally one
//! fd): kind in bits 40..48, peer in bits 16..32, vector in bits 0..16.

#![allow(missing_docs)]

pub const REGION: i64 = 1;
pub const HOST_BELL: i64 = 2;
pub const PEER_BELL: i64 = 3;
pub const PEER_GONE: i64 = 4;
pub const SYNCED: i64 = 5;
/// The vGPU's device-memory limit changed: the low 40 bits are MiB.
pub const LIMIT: i64 = 6;
pub const LIMIT_MASK: i64 = (1 << 40) - 1;
/// Daemon -> worker: move to GPU (low 16 bits), with the socket of that
/// GPU's grant service when the scheduler runs.
pub const MIGRATE: i64 = 7;
/// Worker -> daemon, after a migration: its pause in microseconds, then the
/// KiB it copied (low 40 bits each), then MIGRATED with the GPU it is on
/// (low 16 bits), bit 16 set if it moved, and why not if it did not
/// (`MigrationReport::encode`).
pub const MIGRATION_PAUSE_US: i64 = 8;
pub const MIGRATION_KIB: i64 = 9;
pub const MIGRATED: i64 = 10;
/// Worker -> daemon: a sticky CUDA error poisoned its GPU contexts; it
/// exits. Said first, so that the daemon need not wait for that exit to
/// restart the other clients of the GPU's MPS server (the daemon's `supervisor/faults.rs`).
pub const POISONED: i64 = 11;
/// Standby worker -> daemon: its GPU contexts are made and the region is
/// registered; it waits to be promoted (see the daemon's `VmHost::standby_feed`).
pub const READY: i64 = 12;
/// Daemon -> promoted standby, before `SYNCED`: its connection to the GPU's
/// grant service (a confined worker cannot connect).
pub const GRANT: i64 = 13;

// IPC between the workers of a VM with process slots (the worker's
// `exports.rs`, the daemon's `ipc_relay.rs`). An entry of the VM's export
// table is named by its index (bits 24..40) and generation (bits 0..24).
/// Daemon -> a process slot's worker, in its snapshot: the VM's export
/// table (a memfd only the VM's workers share).
pub const IPC_TABLE: i64 = 20;
/// Worker -> daemon: it exported the entry, with the fd an opener needs
/// (if any); the entry is revoked when the worker's feed ends.
pub const IPC_EXPORTED: i64 = 21;
/// Worker -> daemon: it opens the entry and needs its fd.
pub const IPC_WANT: i64 = 22;
/// Daemon -> worker: the entry's fd it asked for (none: none kept).
pub const IPC_FD: i64 = 23;

/// Whether `kind` is one of the IPC messages.
pub fn is_ipc(kind: i64) -> bool {
    (IPC_TABLE..=IPC_FD).contains(&kind)
}

/// An IPC message naming entry `index` of generation `gen` (its low 24
/// bits).
pub fn encode_entry(kind: i64, index: u16, gen: u32) -> i64 {
    (kind << 40) | (i64::from(index) << 24) | i64::from(gen & 0xff_ffff)
}

/// The entry an IPC message names: (index, generation's low 24 bits).
pub fn decode_entry(v: i64) -> (u16, u32) {
    let gen = u32::from(u16_at(v, 0)) | (u32::from(u16_at(v, 16) & 0xff) << 16);
    (u16_at(v, 24), gen)
}

/// What a worker reported of a migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrationReport {
    /// The GPU the vGPU is on now.
    pub gpu: u32,
    /// Whether it moved (false: it stayed where it was).
    pub moved: bool,
    /// From the last work on the source to being ready on the target, µs.
    pub pause_us: u64,
    /// Device memory copied, KiB.
    pub kib: u64,
    /// Why it did not move: the object that kept it on its GPU, if one did.
    pub kept_by: Option<crate::Keeper>,
    /// Why it did not move: the error a context's move (or the target)
    /// answered, if no object kept it.
    pub failed: Option<protocol::Status>,
}

impl MigrationReport {
    /// The MIGRATED message: the GPU (low 16 bits), bit 16 if it moved, the
    /// keeper's code in bits 17..24, the failure's status code in bits
    /// 24..40 (0: none).
    pub fn encode(&self) -> i64 {
        let moved = if self.moved { 1 << 16 } else { 0 };
        let kept = i64::from(self.kept_by.map_or(0, |k| k.code() & 0x7f)) << 17;
        let failed = i64::from(self.failed.map_or(0, |s| s.code().min(0xffff))) << 24;
        // A GPU past 16 bits (none is) saturates rather than naming another.
        let gpu = u16::try_from(self.gpu).unwrap_or(u16::MAX);
        (MIGRATED << 40) | failed | kept | moved | i64::from(gpu)
    }

    /// The report a MIGRATED message `v` ends, after its pause and KiB.
    pub fn decode(v: i64, pause_us: u64, kib: u64) -> MigrationReport {
        let failed = u32::from(u16_at(v, 24));
        let [kept, _] = (u16_at(v, 17) & 0x7f).to_le_bytes();
        MigrationReport {
            gpu: u32::from(u16_at(v, 0)),
            moved: v & (1 << 16) != 0,
            pause_us,
            kib,
            kept_by: crate::Keeper::from_code(kept),
            failed: (failed != 0).then(|| protocol::Status::from_code(failed)),
        }
    }

    /// Why it did not move, in words (empty if it moved).
    pub fn reason(&self) -> String {
        match (self.kept_by, self.failed) {
            (Some(k), _) => format!("{k} stays on its GPU"),
            (None, Some(s)) => format!("{s:?}"),
            (None, None) => String::new(),
        }
    }
}

/// A message of `kind` whose low 40 bits carry `value` (`LIMIT`,
/// `MIGRATION_PAUSE_US`, `MIGRATION_KIB`), saturated at [`LIMIT_MASK`]: a
/// larger value goes as the largest, never wrapped into a small one or
/// into the kind's bits.
pub fn encode_value(kind: i64, value: u64) -> i64 {
    let value = i64::try_from(value).map_or(LIMIT_MASK, |v| v.min(LIMIT_MASK));
    (kind << 40) | value
}

/// The value in a message's low 40 bits (see [`encode_value`]).
pub fn decode_value(v: i64) -> u64 {
    // Masked to 40 bits, so non-negative: the bits are the value.
    (v & LIMIT_MASK).cast_unsigned()
}

/// Bits `at..at + 16` of a message word.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // keeping 16 bits is the point
fn u16_at(v: i64, at: u32) -> u16 {
    (v >> at) as u16
}

/// One feed message's word: kind, peer, vector.
pub fn encode(kind: i64, peer: u16, vector: u16) -> i64 {
    (kind << 40) | (i64::from(peer) << 16) | i64::from(vector)
}

/// A feed message's kind, peer and vector.
pub fn decode(v: i64) -> (i64, u16, u16) {
    ((v >> 40) & 0xff, u16_at(v, 16), u16_at(v, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_their_fields() {
        for (kind, peer, vector) in [
            (REGION, 0, 0),
            (PEER_BELL, 7, 3),
            (GRANT, u16::MAX, u16::MAX),
        ] {
            assert_eq!(decode(encode(kind, peer, vector)), (kind, peer, vector));
        }
    }

    #[test]
    fn ipc_entries_round_trip() {
        for (k, i, g) in [
            (IPC_EXPORTED, 0, 0),
            (IPC_FD, u16::MAX, 0xff_ffff),
            (IPC_WANT, 7, 9),
        ] {
            let v = encode_entry(k, i, g);
            assert_eq!(decode(v).0, k);
            assert!(is_ipc(decode(v).0));
            assert_eq!(decode_entry(v), (i, g));
        }
        assert_eq!(
            decode_entry(encode_entry(IPC_FD, 1, 1 << 24 | 5)),
            (1, 5),
            "24 bits kept"
        );
        assert!(!is_ipc(GRANT));
    }

    #[test]
    fn values_saturate_rather_than_wrap_into_the_kind() {
        assert_eq!(decode_value(encode_value(LIMIT, 81920)), 81920);
        let max = LIMIT_MASK.cast_unsigned();
        for big in [max, max + 1, 1 << 40 | 5, u64::MAX] {
            let v = encode_value(LIMIT, big);
            assert_eq!(decode(v).0, LIMIT, "{big}: kind kept");
            assert_eq!(decode_value(v), max, "{big}: saturated");
        }
    }

    #[test]
    fn migration_reports_round_trip() {
        let r = MigrationReport {
            gpu: 3,
            moved: false,
            pause_us: 1200,
            kib: 4096,
            kept_by: Some(crate::Keeper::Array),
            failed: Some(protocol::Status::from_code(700)),
        };
        assert_eq!(MigrationReport::decode(r.encode(), 1200, 4096), r);
        let moved = MigrationReport {
            moved: true,
            kept_by: None,
            failed: None,
            ..r
        };
        assert_eq!(MigrationReport::decode(moved.encode(), 1200, 4096), moved);
        // A GPU past 16 bits is sent as the last one, not as GPU 1.
        let far = MigrationReport { gpu: 65537, ..r };
        assert_eq!(MigrationReport::decode(far.encode(), 0, 0).gpu, 65535);
    }
}
