//! Values for the requests the table's macro generates, one of every row
//! (tests only; `generated_samples` in `macros.rs`): a new row needs no
//! hand-written sample.
//!
//! The `n`th field of a row (from 1) takes the first of its type's
//! [`Sample::candidates`] that the row's check for it accepts (with the
//! earlier fields as the check's arguments, as decoding runs it) and that
//! the type takes from its raw value. The first candidate differs from
//! field to field and from the type's default; the later ones are values
//! the checks are known to take (a 2 MiB multiple, a divisor of any grid),
//! for fields whose check the first one fails.

// `n` is a field's position in its row (a few dozen at most), so the
// narrowing casts below keep its value.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

use super::wire::Wire;
use crate::array::{ArrayCopy, ArrayDesc, CopySide, SURFACE_LDST};
use crate::stream_attr::StreamAttr;
use crate::{Dim3, ImageKind, VMM_GRANULARITY};

/// A generated request: its variant's name, its fields' names, and the
/// request (`None`: no candidate passed a check of the row).
pub(crate) type Generated = (
    &'static str,
    &'static [&'static str],
    Option<crate::Request>,
);

/// A field type of requests whose values the generated samples take.
pub(crate) trait Sample: Wire {
    /// Raw values for the `n`th field of a row, the most distinct first.
    fn candidates(n: u64) -> Vec<Self::Raw>;
}

/// The first candidate for the `n`th field that `ok` (the row's check)
/// and the type's own `from_raw` accept; `None`: none is, and the row
/// needs a candidate added here.
pub(crate) fn pick<T: Sample>(
    n: u64,
    field: &'static str,
    ok: impl Fn(&T::Raw) -> bool,
) -> Option<T> {
    T::candidates(n)
        .into_iter()
        .filter(|raw| ok(raw))
        .find_map(|raw| T::from_raw(field, raw).ok())
}

/// Small numbers many flag and attribute checks take.
fn small() -> impl Iterator<Item = u32> {
    [1, 3, 8].into_iter().chain(0..=64)
}

impl Sample for u64 {
    fn candidates(n: u64) -> Vec<u64> {
        vec![n, n * VMM_GRANULARITY, 1]
    }
}

impl Sample for u32 {
    fn candidates(n: u64) -> Vec<u32> {
        std::iter::once(n as u32).chain(small()).collect()
    }
}

impl Sample for i32 {
    fn candidates(n: u64) -> Vec<i32> {
        vec![-(n as i32), n as i32, 1, 0]
    }
}

impl Sample for u8 {
    fn candidates(n: u64) -> Vec<u32> {
        std::iter::once(n as u32).chain(small()).collect()
    }
}

impl Sample for bool {
    fn candidates(_: u64) -> Vec<u32> {
        vec![1]
    }
}

impl Sample for Dim3 {
    fn candidates(n: u64) -> Vec<Dim3> {
        let n = n as u32;
        let d = |x, y, z| Dim3 { x, y, z };
        vec![d(n, n + 1, n + 2), d(1, 1, 1), Dim3::default()]
    }
}

impl Sample for [u64; 2] {
    fn candidates(n: u64) -> Vec<[u64; 2]> {
        vec![[n, n + 1]]
    }
}

impl Sample for [u8; 32] {
    fn candidates(n: u64) -> Vec<[u8; 32]> {
        vec![std::array::from_fn(|i| (n as u8).wrapping_add(i as u8))]
    }
}

impl Sample for ImageKind {
    fn candidates(_: u64) -> Vec<ImageKind> {
        vec![ImageKind::Cubin, ImageKind::Ptx]
    }
}

impl Sample for StreamAttr {
    fn candidates(n: u64) -> Vec<StreamAttr> {
        vec![StreamAttr::Priority(-(n as i32)), StreamAttr::SyncPolicy(1)]
    }
}

impl Sample for ArrayDesc {
    fn candidates(n: u64) -> Vec<ArrayDesc> {
        vec![ArrayDesc {
            width: 64 + n as u32,
            height: 32,
            depth: 4,
            format: 0x20,
            channels: 2,
            flags: SURFACE_LDST,
        }]
    }
}

impl Sample for ArrayCopy {
    fn candidates(n: u64) -> Vec<ArrayCopy> {
        vec![ArrayCopy {
            src: CopySide::Device {
                ptr: 0x7000_0000,
                pitch: 512,
                height: 32,
            },
            dst: CopySide::Array {
                array: n,
                x: 8,
                y: 1,
                z: 2,
            },
            width: 256,
            height: 4,
            depth: 2,
        }]
    }
}
