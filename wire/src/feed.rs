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
        (MIGRATED << 40) | failed | kept | moved | i64::from(self.gpu as u16)
    }

    /// The report a MIGRATED message `v` ends, after its pause and KiB.
    pub fn decode(v: i64, pause_us: u64, kib: u64) -> MigrationReport {
        let failed = ((v >> 24) & 0xffff) as u32;
        MigrationReport {
            gpu: (v & 0xffff) as u32,
            moved: v & (1 << 16) != 0,
            pause_us,
            kib,
            kept_by: crate::Keeper::from_code(((v >> 17) & 0x7f) as u8),
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

/// One feed message's word: kind, peer, vector.
pub fn encode(kind: i64, peer: u16, vector: u16) -> i64 {
    (kind << 40) | (i64::from(peer) << 16) | i64::from(vector)
}

/// A feed message's kind, peer and vector.
pub fn decode(v: i64) -> (i64, u16, u16) {
    ((v >> 40) & 0xff, (v >> 16) as u16, v as u16)
}
