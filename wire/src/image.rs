//! The module image store's messages between the daemon's store and a
//! worker's client.

#![allow(missing_docs)]

use protocol::ImageKind;

/// Worker -> daemon: keep this image (with its memfd).
pub const PUT: i64 = 1;
/// Worker -> daemon: the image of this hash, kind and length, if kept.
pub const GET: i64 = 2;
/// Daemon -> worker: here it is (with its memfd).
pub const FOUND: i64 = 3;
/// Daemon -> worker: not kept.
pub const MISSING: i64 = 4;

/// A PUT or GET's header.
pub fn header(kind: ImageKind, len: u64, hash: &[u8; 32]) -> [u8; 48] {
    let mut h = [0u8; 48];
    h[..4].copy_from_slice(&kind.code().to_le_bytes());
    h[8..16].copy_from_slice(&len.to_le_bytes());
    h[16..].copy_from_slice(hash);
    h
}

/// A header's kind, length and hash.
pub fn parse(h: &[u8; 48]) -> Option<(ImageKind, u64, [u8; 32])> {
    let kind = ImageKind::from_code(u32::from_le_bytes(h[..4].try_into().ok()?))?;
    let len = u64::from_le_bytes(h[8..16].try_into().ok()?);
    Some((kind, len, h[16..].try_into().ok()?))
}
