//! The grant service's messages between a GPU's service (in the daemon)
//! and each vGPU's worker (its gate).
//!
//! Messages are 24 bytes, little-endian: `[kind u32][vgpu u32][a u64][b u64]`.

#![allow(missing_docs)]

pub const HELLO: u32 = 1; // a = weight in millis, b = 0 or MEMBER
pub const WANT: u32 = 2;
pub const RELEASE: u32 = 3; // a = used ns, b = still busy (0/1)
pub const GRANT: u32 = 4; // a = slice ns, b = LONE and/or SHARED bits
pub const REPORT: u32 = 5; // a = device memory used, b = synchronous calls so far
pub const QUEUE: u32 = 6; // a = requests waiting in the rings, b = launches so far
pub const SERVED: u32 = 7; // a = requests served so far, b = requests refused so far
pub const PROCESS: u32 = 8; // a = worker resident memory (bytes), b = worker open fds
pub const OCCUPANCY: u32 = 9; // a = mean occupied fraction of the GPU's cores, parts per million
pub const SLICED: u32 = 10; // a = launches run as sub-grids so far
pub const LOGS: u32 = 11; // a = log lines suppressed so far (rate-limited guest-triggered logs)
pub const CONTEXTS: u32 = 14; // a = contexts made for guest processes so far, b = contexts reused
pub const COPIES: u32 = 15; // a = share of its device work that was copies, parts per million
pub const EXTEND: u32 = 12; // a = ns added to the holder's slice
pub const CONTENDED: u32 = 13; // another vGPU wants the GPU: no more extensions this grant
pub const DRAINING: u32 = 16; // the holder is giving the GPU back: its last work is finishing
pub const IDLE: u32 = 17; // a shared holder has nothing to run; it keeps the grant (WANT: work again)
pub const CHARGE: u32 = 18; // a = ns of GPU time a shared holder used since its last charge, b = in how many stretches

/// `GRANT`'s `b` bit: no other vGPU waits for the GPU (the holder keeps the
/// grant through its guests' pauses and waits for `EXTEND` at its slice's
/// end).
pub const LONE: u64 = 1;
/// `GRANT`'s `b` bit: the GPU is shared (`sched::Sharing::Concurrent`):
/// other vGPUs hold it at the same time; the holder charges what it uses
/// as it goes (`CHARGE`) and says when it has nothing to run (`IDLE`) and
/// when it has again (`WANT`), keeping the grant.
pub const SHARED: u64 = 2;
/// `GRANT`'s `b` bit, with `SHARED`: this holder holds the GPU alone (a
/// heavy vGPU's turn): as under exclusive sharing, it keeps the grant a
/// little for a late guest while others wait, and pays for the wait.
pub const ALONE: u64 = 4;

/// `HELLO`'s `b` from one of several workers serving one vGPU (a worker per
/// guest process): the service treats them as one place in its queue,
/// sharing the vGPU's grants (the daemon's `grant/group.rs`).
pub const MEMBER: u64 = 1;
/// A 24-byte message.
pub fn encode(kind: u32, vgpu: u32, a: u64, b: u64) -> [u8; 24] {
    let mut m = [0u8; 24];
    m[..4].copy_from_slice(&kind.to_le_bytes());
    m[4..8].copy_from_slice(&vgpu.to_le_bytes());
    m[8..16].copy_from_slice(&a.to_le_bytes());
    m[16..].copy_from_slice(&b.to_le_bytes());
    m
}

/// A 24-byte message's kind, vGPU and two values.
pub fn decode(m: &[u8; 24]) -> (u32, u32, u64, u64) {
    let u32_at = |o: usize| u32::from_le_bytes([m[o], m[o + 1], m[o + 2], m[o + 3]]);
    let u64_at = |o: usize| u64::from_le_bytes(m[o..o + 8].try_into().unwrap_or([0; 8]));
    (u32_at(0), u32_at(4), u64_at(8), u64_at(16))
}

/// A worker's live figures, sent with the worker's gate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Device memory in use, bytes.
    pub mem_used: u64,
    /// Synchronous calls served so far.
    pub sync_calls: u64,
    /// Requests waiting in the rings.
    pub queued: u64,
    /// Kernel launches so far.
    pub launches: u64,
    /// Requests served so far.
    pub requests: u64,
    /// Requests refused so far.
    pub refused: u64,
    /// Resident memory of the worker process, bytes.
    pub rss_bytes: u64,
    /// Open file descriptors of the worker process.
    pub open_fds: u64,
    /// Mean fraction of the GPU's cores its recent launches could occupy
    /// (occupancy API x grid size), parts per million.
    pub occupancy_ppm: u64,
    /// Launches run as sub-grids so far (kernel slicing).
    pub sliced_launches: u64,
    /// Log lines its guests triggered that the worker suppressed so far
    /// (rate-limited).
    pub log_suppressed: u64,
    /// Contexts made for its guest processes so far.
    pub contexts_created: u64,
    /// Guest processes that got an ended one's context (made clean).
    pub contexts_reused: u64,
    /// Share of its recent device work that was copies (their time at a
    /// copy engine's rate against its kernels'), parts per million (phase
    /// selection, `grant/corun.rs`).
    pub copy_ppm: u64,
}
