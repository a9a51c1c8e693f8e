//! Hopper's tensor-map descriptors (`cuTensorMapEncodeTiled`,
//! `cuTensorMapEncodeIm2col`, `cuTensorMapReplaceAddress`): the parameters
//! a guest sends in a `TensorMapEncode` request's data, so that the host's
//! driver encodes the 128-byte descriptor (its format is the driver's).
//!
//! Decoding checks every field against the driver's documented limits and
//! gives the byte extent of the tensor in device memory, which the host
//! checks lies in the caller's own memory: a kernel given the descriptor
//! reads and writes only through it.

use crate::ProtoError;

/// Bytes of an encoded descriptor.
pub const TENSOR_MAP_BYTES: usize = 128;
/// Bytes of the parameters on the wire.
pub const PARAMS_BYTES: usize = 184 + TENSOR_MAP_BYTES;

/// What to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorMapKind {
    /// `cuTensorMapEncodeTiled`.
    Tiled,
    /// `cuTensorMapEncodeIm2col`.
    Im2col,
    /// `cuTensorMapReplaceAddress` of `map` (the other fields describe the
    /// tensor as the guest encoded it, for the extent check).
    Replace,
}

/// A tensor map's parameters (arrays used up to `rank`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMapParams {
    /// What to encode.
    pub kind: TensorMapKind,
    /// `CUtensorMapDataType`.
    pub dtype: u32,
    /// Dimensions used (1..=5; 3..=5 for im2col).
    pub rank: u32,
    /// The tensor's device address (16-byte aligned).
    pub address: u64,
    /// Elements along each dimension.
    pub dims: [u64; 5],
    /// Strides in bytes of dimensions 1.. (`rank - 1` of them).
    pub strides: [u64; 4],
    /// Tiled: the box a copy moves, per dimension.
    pub box_dim: [u32; 5],
    /// Traversal strides, in elements.
    pub elem_strides: [u32; 5],
    /// `CUtensorMapInterleave`.
    pub interleave: u32,
    /// `CUtensorMapSwizzle`.
    pub swizzle: u32,
    /// `CUtensorMapL2promotion`.
    pub l2_promotion: u32,
    /// `CUtensorMapFloatOOBfill`.
    pub oob_fill: u32,
    /// Im2col: the pixel box's lower corner.
    pub lower: [i32; 3],
    /// Im2col: the pixel box's upper corner.
    pub upper: [i32; 3],
    /// Im2col: channels per pixel.
    pub channels_per_pixel: u32,
    /// Im2col: pixels per column.
    pub pixels_per_column: u32,
    /// Replace only: the descriptor to change.
    pub map: [u8; TENSOR_MAP_BYTES],
}

fn bad(field: &'static str, why: String) -> ProtoError {
    ProtoError::BadField { field, why }
}

/// Bytes of one element of `dtype` (the 4- and 6-bit packed types count
/// as whole bytes, which over-states their extent).
pub fn element_size(dtype: u32) -> Option<u64> {
    Some(match dtype {
        0 => 1,
        1 | 6 | 9 => 2,
        2 | 3 | 7 | 10..=12 => 4,
        4 | 5 | 8 => 8,
        13..=15 => 1,
        _ => return None,
    })
}

impl TensorMapParams {
    /// The wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(PARAMS_BYTES);
        let kind = match self.kind {
            TensorMapKind::Tiled => 0u32,
            TensorMapKind::Im2col => 1,
            TensorMapKind::Replace => 2,
        };
        for v in [
            kind,
            self.dtype,
            self.rank,
            self.interleave,
            self.swizzle,
            self.l2_promotion,
            self.oob_fill,
            self.channels_per_pixel,
            self.pixels_per_column,
            0,
        ] {
            o.extend_from_slice(&v.to_le_bytes());
        }
        o.extend_from_slice(&self.address.to_le_bytes());
        for v in self.dims.iter().chain(&self.strides) {
            o.extend_from_slice(&v.to_le_bytes());
        }
        for v in self.box_dim.iter().chain(&self.elem_strides) {
            o.extend_from_slice(&v.to_le_bytes());
        }
        for v in self.lower.iter().chain(&self.upper) {
            o.extend_from_slice(&v.to_le_bytes());
        }
        o.extend_from_slice(&self.map);
        debug_assert_eq!(o.len(), PARAMS_BYTES);
        o
    }

    /// Reads and checks the wire form.
    pub fn decode(b: &[u8]) -> Result<TensorMapParams, ProtoError> {
        if b.len() != PARAMS_BYTES {
            return Err(bad("tensor map", format!("{} bytes", b.len())));
        }
        let mut at = 0;
        let mut u32s = |n: usize| -> Vec<u32> {
            let v = b[at..at + 4 * n]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            at += 4 * n;
            v
        };
        let head = u32s(10);
        let address = u64::from_le_bytes(b[40..48].try_into().unwrap_or_default());
        let u64_at = |i: usize| {
            let o = 48 + 8 * i;
            u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default())
        };
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
        let mut p = TensorMapParams {
            kind: match head[0] {
                0 => TensorMapKind::Tiled,
                1 => TensorMapKind::Im2col,
                2 => TensorMapKind::Replace,
                k => return Err(bad("kind", format!("{k}"))),
            },
            dtype: head[1],
            rank: head[2],
            interleave: head[3],
            swizzle: head[4],
            l2_promotion: head[5],
            oob_fill: head[6],
            channels_per_pixel: head[7],
            pixels_per_column: head[8],
            address,
            dims: [0; 5],
            strides: [0; 4],
            box_dim: [0; 5],
            elem_strides: [0; 5],
            lower: [0; 3],
            upper: [0; 3],
            map: [0; TENSOR_MAP_BYTES],
        };
        for i in 0..5 {
            p.dims[i] = u64_at(i);
        }
        for i in 0..4 {
            p.strides[i] = u64_at(5 + i);
        }
        for i in 0..5 {
            p.box_dim[i] = u32_at(120 + 4 * i);
            p.elem_strides[i] = u32_at(140 + 4 * i);
        }
        for i in 0..3 {
            // Signed corners, stored as their two's complement bits.
            p.lower[i] = u32_at(160 + 4 * i).cast_signed();
            p.upper[i] = u32_at(172 + 4 * i).cast_signed();
        }
        p.map.copy_from_slice(&b[184..]);
        p.check()?;
        Ok(p)
    }

    /// The driver's limits.
    fn check(&self) -> Result<(), ProtoError> {
        let r = self.rank as usize;
        let min_rank = if self.kind == TensorMapKind::Im2col {
            3
        } else {
            1
        };
        if !(min_rank..=5).contains(&r) {
            return Err(bad("rank", format!("{r}")));
        }
        let elem =
            element_size(self.dtype).ok_or_else(|| bad("dtype", format!("{}", self.dtype)))?;
        if self.address == 0 || !self.address.is_multiple_of(16) {
            return Err(bad("address", format!("{:#x}", self.address)));
        }
        if self.dims[..r].iter().any(|&d| d == 0 || d > 1 << 32) {
            return Err(bad("dims", format!("{:?}", &self.dims[..r])));
        }
        if self.strides[..r - 1]
            .iter()
            .any(|&s| s == 0 || !s.is_multiple_of(16) || s >= 1 << 40)
        {
            return Err(bad("strides", format!("{:?}", &self.strides[..r - 1])));
        }
        if self.elem_strides[..r].iter().any(|&e| e == 0 || e > 8) {
            return Err(bad(
                "elem_strides",
                format!("{:?}", &self.elem_strides[..r]),
            ));
        }
        if self.kind == TensorMapKind::Tiled && self.box_dim[..r].iter().any(|&d| d == 0 || d > 256)
        {
            return Err(bad("box_dim", format!("{:?}", &self.box_dim[..r])));
        }
        if self.kind == TensorMapKind::Im2col
            && (self.channels_per_pixel == 0
                || self.channels_per_pixel > 256
                || self.pixels_per_column == 0
                || self.pixels_per_column > 1024)
        {
            return Err(bad("im2col", "pixels or channels out of range".into()));
        }
        if self.interleave > 2 || self.swizzle > 7 || self.l2_promotion > 3 || self.oob_fill > 1 {
            return Err(bad(
                "options",
                "interleave, swizzle, L2 or fill out of range".into(),
            ));
        }
        self.extent(elem)?;
        Ok(())
    }

    /// Bytes from `address` the tensor spans: the last element's end.
    pub fn extent(&self, elem: u64) -> Result<u64, ProtoError> {
        let r = self.rank as usize;
        let too_big = || bad("extent", "the tensor's span overflows".into());
        let mut end = self.dims[0].checked_mul(elem).ok_or_else(too_big)?;
        for i in 1..r {
            let more = (self.dims[i] - 1)
                .checked_mul(self.strides[i - 1])
                .ok_or_else(too_big)?;
            end = end.checked_add(more).ok_or_else(too_big)?;
        }
        Ok(end)
    }

    /// [`TensorMapParams::extent`] of a decoded (so checked) tensor.
    pub fn span(&self) -> u64 {
        element_size(self.dtype)
            .and_then(|e| self.extent(e).ok())
            .unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiled() -> TensorMapParams {
        TensorMapParams {
            kind: TensorMapKind::Tiled,
            dtype: 7,
            rank: 2,
            address: 0x7f00_0000_0000,
            dims: [64, 32, 0, 0, 0],
            strides: [256, 0, 0, 0],
            box_dim: [32, 16, 0, 0, 0],
            elem_strides: [1, 1, 0, 0, 0],
            interleave: 0,
            swizzle: 3,
            l2_promotion: 2,
            oob_fill: 0,
            lower: [0; 3],
            upper: [0; 3],
            channels_per_pixel: 0,
            pixels_per_column: 0,
            map: [7; TENSOR_MAP_BYTES],
        }
    }

    #[test]
    fn round_trips_and_spans_its_rows() {
        let p = tiled();
        let b = p.encode();
        assert_eq!(b.len(), PARAMS_BYTES);
        assert_eq!(TensorMapParams::decode(&b), Ok(p));
        // 31 rows of 256 bytes, then one of 64 floats.
        assert_eq!(p.span(), 31 * 256 + 256);
    }

    #[test]
    fn out_of_range_fields_are_refused() {
        let bad_ones = [
            TensorMapParams { rank: 0, ..tiled() },
            TensorMapParams { rank: 6, ..tiled() },
            TensorMapParams {
                dtype: 99,
                ..tiled()
            },
            TensorMapParams {
                address: 0x7f00_0000_0008,
                ..tiled()
            },
            TensorMapParams {
                strides: [8, 0, 0, 0],
                ..tiled()
            },
            TensorMapParams {
                box_dim: [512, 16, 0, 0, 0],
                ..tiled()
            },
            TensorMapParams {
                elem_strides: [9, 1, 0, 0, 0],
                ..tiled()
            },
            TensorMapParams {
                swizzle: 8,
                ..tiled()
            },
            TensorMapParams {
                dims: [1 << 32, u64::MAX / 2, 0, 0, 0],
                strides: [1 << 39, 0, 0, 0],
                ..tiled()
            },
            TensorMapParams {
                kind: TensorMapKind::Im2col,
                ..tiled()
            },
        ];
        for p in bad_ones {
            assert!(TensorMapParams::decode(&p.encode()).is_err(), "{p:?}");
        }
        assert!(TensorMapParams::decode(&[0u8; 10]).is_err());
    }
}
