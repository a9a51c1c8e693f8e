//! CUDA arrays and the texture and surface objects over them: what an
//! `ArrayCreate` describes, what an `ArrayCopy` moves, and the parameters
//! a `TexCreate` sends in its data.
//!
//! Decoding checks every dimension, format, channel count and flag against
//! the limits of CUDA's devices, and gives each copy side's byte extent, so
//! that the host checks an array copy lies inside the array and inside the
//! caller's own memory before any device sees it.

use crate::{bad, ProtoError, Reader, Writer, MAX_LEN};

/// `CUDA_ARRAY3D_LAYERED`.
pub const LAYERED: u32 = 0x01;
/// `CUDA_ARRAY3D_SURFACE_LDST`.
pub const SURFACE_LDST: u32 = 0x02;
/// `CUDA_ARRAY3D_CUBEMAP`.
pub const CUBEMAP: u32 = 0x04;
/// `CUDA_ARRAY3D_TEXTURE_GATHER`.
pub const TEXTURE_GATHER: u32 = 0x08;
/// Widest array (elements; the H100's 1D and 2D texture width).
pub const MAX_WIDTH: u32 = 131_072;
/// Tallest 2D array.
pub const MAX_HEIGHT: u32 = 65_536;
/// Largest 3D array side.
pub const MAX_3D: u32 = 16_384;
/// Widest and tallest layered or cubemap array.
pub const MAX_LAYERED: u32 = 32_768;
/// Most layers.
pub const MAX_LAYERS: u32 = 2_048;
/// Widest row of any array, bytes (16-byte elements).
pub const MAX_ROW: u32 = MAX_WIDTH * 16;

/// Bytes per channel of a `CUarray_format` the host serves.
pub fn format_size(format: u32) -> Option<u32> {
    Some(match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    })
}

fn check_format(format: u32, channels: u32) -> Result<u32, ProtoError> {
    let size = format_size(format).ok_or_else(|| bad("format", format!("{format:#x}")))?;
    if !matches!(channels, 1 | 2 | 4) {
        return Err(bad("channels", format!("{channels}")));
    }
    Ok(size * channels)
}

/// A CUDA array (`CUDA_ARRAY3D_DESCRIPTOR`): height 0 is a 1D array,
/// depth 0 a 2D one; with [`LAYERED`], depth counts layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArrayDesc {
    /// Elements per row.
    pub width: u32,
    /// Rows (0: 1D).
    pub height: u32,
    /// Slices or layers (0: none).
    pub depth: u32,
    /// `CUarray_format`.
    pub format: u32,
    /// Channels per element: 1, 2 or 4.
    pub channels: u32,
    /// `CUDA_ARRAY3D_*` flags.
    pub flags: u32,
}

impl ArrayDesc {
    /// Bytes of one element.
    pub fn elem_size(&self) -> u64 {
        u64::from(format_size(self.format).unwrap_or(1) * self.channels)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        u64::from(self.width) * self.elem_size()
    }

    /// Rows per slice (at least one).
    pub fn rows(&self) -> u64 {
        u64::from(self.height.max(1))
    }

    /// Slices (at least one).
    pub fn slices(&self) -> u64 {
        u64::from(self.depth.max(1))
    }

    /// Bytes of the array laid out row after row, slice after slice.
    pub fn bytes(&self) -> u64 {
        self.row_bytes() * self.rows() * self.slices()
    }

    /// The driver's limits (those of an H100).
    pub fn check(&self) -> Result<(), ProtoError> {
        check_format(self.format, self.channels)?;
        let (w, h, d, f) = (self.width, self.height, self.depth, self.flags);
        if f & !(LAYERED | SURFACE_LDST | CUBEMAP | TEXTURE_GATHER) != 0 {
            return Err(bad("flags", format!("{f:#x}")));
        }
        if w == 0 {
            return Err(bad("width", "zero"));
        }
        let layered = f & LAYERED != 0;
        let ok = if f & CUBEMAP != 0 {
            w == h
                && w <= MAX_LAYERED
                && if layered {
                    d > 0 && d % 6 == 0 && d / 6 <= MAX_LAYERS
                } else {
                    d == 6
                }
        } else if layered {
            w <= MAX_LAYERED && h <= MAX_LAYERED && (1..=MAX_LAYERS).contains(&d)
        } else if d > 0 {
            h > 0 && w <= MAX_3D && h <= MAX_3D && d <= MAX_3D
        } else {
            w <= MAX_WIDTH && h <= MAX_HEIGHT
        };
        if !ok || (f & TEXTURE_GATHER != 0 && (h == 0 || d != 0)) {
            return Err(bad("extent", format!("{w}x{h}x{d} flags {f:#x}")));
        }
        if self.bytes() > MAX_LEN {
            return Err(bad("extent", format!("{} bytes", self.bytes())));
        }
        Ok(())
    }

    /// Offset in [`ArrayDesc::bytes`]'s layout of byte `x` of row `y` of
    /// slice `z`.
    pub fn offset(&self, x: u64, y: u64, z: u64) -> u64 {
        (z * self.rows() + y) * self.row_bytes() + x
    }

    pub(crate) fn write(&self, w: &mut Writer<'_>) {
        for v in [
            self.width,
            self.height,
            self.depth,
            self.format,
            self.channels,
            self.flags,
        ] {
            w.u32(v);
        }
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<ArrayDesc, ProtoError> {
        let d = ArrayDesc {
            width: r.u32()?,
            height: r.u32()?,
            depth: r.u32()?,
            format: r.u32()?,
            channels: r.u32()?,
            flags: r.u32()?,
        };
        d.check()?;
        Ok(d)
    }
}

/// One end of an array copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopySide {
    /// A box of an array, from byte `x` of row `y` of slice `z`.
    Array {
        /// The array's handle.
        array: u64,
        /// Byte in the row.
        x: u32,
        /// Row.
        y: u32,
        /// Slice or layer.
        z: u32,
    },
    /// Pitched device memory from its first byte.
    Device {
        /// The box's first byte.
        ptr: u64,
        /// Bytes from one row to the next.
        pitch: u64,
        /// Rows from one slice to the next.
        height: u64,
    },
}

/// A box copy with an array at one end or both (the host's
/// `cuMemcpy3D` with `CU_MEMORYTYPE_ARRAY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayCopy {
    /// Source.
    pub src: CopySide,
    /// Destination.
    pub dst: CopySide,
    /// Bytes per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Slices.
    pub depth: u32,
}

impl CopySide {
    fn write(&self, w: &mut Writer<'_>) {
        match *self {
            CopySide::Array { array, x, y, z } => {
                w.u64(array);
                w.u32(x);
                w.u32(y);
                w.u64(u64::from(z));
            }
            CopySide::Device { ptr, pitch, height } => {
                w.u64(ptr);
                w.u64(pitch);
                w.u64(height);
            }
        }
    }

    fn read(r: &mut Reader<'_>, array: bool) -> Result<CopySide, ProtoError> {
        let a = r.u64()?;
        Ok(if array {
            let (x, y, z) = (r.u32()?, r.u32()?, r.u64()?);
            CopySide::Array {
                array: a,
                x,
                y,
                z: u32::try_from(z).map_err(|_| bad("z", format!("{z}")))?,
            }
        } else {
            CopySide::Device {
                ptr: a,
                pitch: r.u64()?,
                height: r.u64()?,
            }
        })
    }

    fn is_array(&self) -> bool {
        matches!(self, CopySide::Array { .. })
    }

    /// Device memory: its first byte and the bytes from it the box spans
    /// (`None` for an array side).
    pub fn span(&self, width: u32, height: u32, depth: u32) -> Option<(u64, u64)> {
        let CopySide::Device {
            ptr,
            pitch,
            height: h,
        } = *self
        else {
            return None;
        };
        let rows = u64::from(depth)
            .checked_sub(1)?
            .checked_mul(h)?
            .checked_add(u64::from(height).checked_sub(1)?)?;
        let len = rows.checked_mul(pitch)?.checked_add(u64::from(width))?;
        Some((ptr, len))
    }
}

impl ArrayCopy {
    /// Whether the box lies inside array `a` from side `s` (an array side).
    pub fn inside(&self, s: &CopySide, a: &ArrayDesc) -> bool {
        let CopySide::Array { x, y, z, .. } = *s else {
            return false;
        };
        u64::from(x) + u64::from(self.width) <= a.row_bytes()
            && u64::from(y) + u64::from(self.height) <= a.rows()
            && u64::from(z) + u64::from(self.depth) <= a.slices()
    }

    pub(crate) fn write(&self, w: &mut Writer<'_>) {
        w.u32(u32::from(self.src.is_array()) | u32::from(self.dst.is_array()) << 1);
        self.src.write(w);
        self.dst.write(w);
        w.u32(self.width);
        w.u32(self.height);
        w.u32(self.depth);
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<ArrayCopy, ProtoError> {
        let kinds = r.u32()?;
        if kinds == 0 || kinds > 3 {
            return Err(bad("kinds", format!("{kinds}: no array end")));
        }
        let src = CopySide::read(r, kinds & 1 != 0)?;
        let dst = CopySide::read(r, kinds & 2 != 0)?;
        let c = ArrayCopy {
            src,
            dst,
            width: r.u32()?,
            height: r.u32()?,
            depth: r.u32()?,
        };
        if c.width == 0 || c.height == 0 || c.depth == 0 || c.width > MAX_ROW {
            return Err(bad(
                "extent",
                format!("{}x{}x{}", c.width, c.height, c.depth),
            ));
        }
        if c.height > MAX_HEIGHT || c.depth > MAX_3D.max(MAX_LAYERS * 6) {
            return Err(bad("extent", format!("{}x{}", c.height, c.depth)));
        }
        for s in [src, dst] {
            if let CopySide::Device { pitch, height, .. } = s {
                let short = (c.height > 1 && pitch < u64::from(c.width))
                    || (c.depth > 1 && height < u64::from(c.height));
                match s.span(c.width, c.height, c.depth) {
                    Some((ptr, len))
                        if !short && len <= MAX_LEN && ptr.checked_add(len).is_some() => {}
                    _ => return Err(bad("pitch", format!("{s:?}"))),
                }
            }
        }
        Ok(c)
    }
}

/// `CUresourcetype` values a texture object may be over.
pub mod resource {
    #![allow(missing_docs)]
    pub const ARRAY: u32 = 0;
    pub const LINEAR: u32 = 2;
    pub const PITCH2D: u32 = 3;
}

/// Bytes of [`TexParams`] on the wire.
pub const TEX_PARAMS_BYTES: usize = 152;

/// A texture object's resource, texture and view descriptions
/// (`cuTexObjectCreate`), as a `TexCreate` request's data carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TexParams {
    /// [`resource`] type.
    pub kind: u32,
    /// The resource description's flags (must be 0).
    pub res_flags: u32,
    /// Array: its handle; linear and pitch-2D: the device address.
    pub base: u64,
    /// Linear and pitch-2D: `CUarray_format`.
    pub format: u32,
    /// Linear and pitch-2D: channels.
    pub channels: u32,
    /// Linear: bytes; pitch-2D: width in elements.
    pub width: u64,
    /// Pitch-2D: rows.
    pub height: u64,
    /// Pitch-2D: bytes from row to row.
    pub pitch: u64,
    /// `CUaddress_mode` per dimension.
    pub address_mode: [u32; 3],
    /// `CUfilter_mode`.
    pub filter: u32,
    /// `CU_TRSF_*` flags.
    pub flags: u32,
    /// Anisotropy (0..=16).
    pub max_anisotropy: u32,
    /// Mipmap `CUfilter_mode`.
    pub mipmap_filter: u32,
    /// Mipmap level bias, min and max clamps, border colour: f32 bits.
    pub floats: [u32; 7],
    /// A resource view given (arrays only).
    pub has_view: bool,
    /// `CUresourceViewFormat`.
    pub view_format: u32,
    /// View width, height, depth.
    pub view_extent: [u64; 3],
    /// First and last mipmap level, first and last layer.
    pub view_levels: [u32; 4],
}

impl TexParams {
    /// The wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = vec![0u8; TEX_PARAMS_BYTES];
        let mut w = Writer::new(&mut o);
        for v in [self.kind, self.res_flags] {
            w.u32(v);
        }
        w.u64(self.base);
        w.u32(self.format);
        w.u32(self.channels);
        for v in [self.width, self.height, self.pitch] {
            w.u64(v);
        }
        for v in self.address_mode {
            w.u32(v);
        }
        for v in [
            self.filter,
            self.flags,
            self.max_anisotropy,
            self.mipmap_filter,
        ] {
            w.u32(v);
        }
        for v in self.floats {
            w.u32(v);
        }
        w.u32(u32::from(self.has_view));
        w.u32(self.view_format);
        for v in self.view_extent {
            w.u64(v);
        }
        for v in self.view_levels {
            w.u32(v);
        }
        o
    }

    /// Reads and checks the wire form.
    pub fn decode(b: &[u8]) -> Result<TexParams, ProtoError> {
        if b.len() != TEX_PARAMS_BYTES {
            return Err(bad("texture", format!("{} bytes", b.len())));
        }
        let mut r = Reader::new(b);
        let mut p = TexParams {
            kind: r.u32()?,
            res_flags: r.u32()?,
            base: r.u64()?,
            format: r.u32()?,
            channels: r.u32()?,
            width: r.u64()?,
            height: r.u64()?,
            pitch: r.u64()?,
            ..TexParams::default()
        };
        for v in &mut p.address_mode {
            *v = r.u32()?;
        }
        p.filter = r.u32()?;
        p.flags = r.u32()?;
        p.max_anisotropy = r.u32()?;
        p.mipmap_filter = r.u32()?;
        for v in &mut p.floats {
            *v = r.u32()?;
        }
        p.has_view = match r.u32()? {
            0 => false,
            1 => true,
            v => return Err(bad("has_view", format!("{v}"))),
        };
        p.view_format = r.u32()?;
        for v in &mut p.view_extent {
            *v = r.u64()?;
        }
        for v in &mut p.view_levels {
            *v = r.u32()?;
        }
        p.check()?;
        Ok(p)
    }

    fn check(&self) -> Result<(), ProtoError> {
        if self.res_flags != 0 {
            return Err(bad("res_flags", format!("{:#x}", self.res_flags)));
        }
        match self.kind {
            resource::ARRAY => {}
            resource::LINEAR | resource::PITCH2D => {
                check_format(self.format, self.channels)?;
                if self.span().is_none() {
                    return Err(bad("extent", format!("{self:?}")));
                }
            }
            k => return Err(bad("kind", format!("resource type {k}"))),
        }
        if self.has_view && self.kind != resource::ARRAY {
            return Err(bad("view", "a view over memory that is not an array"));
        }
        if self.address_mode.iter().any(|&m| m > 3) || self.filter > 1 || self.mipmap_filter > 1 {
            return Err(bad("mode", format!("{self:?}")));
        }
        // READ_AS_INTEGER, NORMALIZED_COORDINATES, SRGB,
        // DISABLE_TRILINEAR_OPTIMIZATION, SEAMLESS_CUBEMAP.
        if self.flags & !0x73 != 0 || self.max_anisotropy > 16 {
            return Err(bad("flags", format!("{:#x}", self.flags)));
        }
        if self.view_format > 0x22
            || self.view_extent.iter().any(|&e| e > u64::from(MAX_WIDTH))
            || self.view_levels.iter().any(|&l| l > MAX_LAYERS * 6)
        {
            return Err(bad("view", format!("{self:?}")));
        }
        Ok(())
    }

    /// Linear and pitch-2D: the device memory the texture reads, its
    /// first byte and length (`None` for an array, or when it overflows).
    pub fn span(&self) -> Option<(u64, u64)> {
        let elem = u64::from(format_size(self.format)? * self.channels);
        let len = match self.kind {
            resource::LINEAR => (self.width > 0 && self.width <= MAX_LEN).then_some(self.width)?,
            resource::PITCH2D => {
                let row = self.width.checked_mul(elem)?;
                let ok = self.width > 0
                    && self.width <= u64::from(MAX_WIDTH)
                    && (1..=u64::from(MAX_HEIGHT)).contains(&self.height)
                    && self.pitch >= row;
                let len = self
                    .height
                    .checked_sub(1)?
                    .checked_mul(self.pitch)?
                    .checked_add(row)?;
                (ok && len <= MAX_LEN).then_some(len)?
            }
            _ => return None,
        };
        self.base.checked_add(len)?;
        Some((self.base, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(width: u32, height: u32, depth: u32, flags: u32) -> ArrayDesc {
        ArrayDesc {
            width,
            height,
            depth,
            format: 0x20,
            channels: 4,
            flags,
        }
    }

    #[test]
    fn arrays_within_the_device_limits_and_no_others() {
        assert!(desc(64, 0, 0, 0).check().is_ok());
        assert!(desc(64, 32, 0, SURFACE_LDST).check().is_ok());
        assert!(desc(64, 32, 8, 0).check().is_ok());
        assert!(desc(64, 0, 8, LAYERED).check().is_ok());
        assert!(desc(64, 64, 6, CUBEMAP).check().is_ok());
        assert_eq!(desc(3, 5, 7, 0).bytes(), 3 * 16 * 5 * 7);
        for bad in [
            desc(0, 1, 0, 0),
            desc(64, 0, 8, 0),
            desc(MAX_WIDTH + 1, 0, 0, 0),
            desc(MAX_3D, MAX_3D, MAX_3D, 0),
            desc(64, 32, 0, LAYERED),
            desc(64, 32, 5, CUBEMAP),
            desc(64, 32, 0, 0x10),
            ArrayDesc {
                format: 0x40,
                ..desc(1, 1, 0, 0)
            },
            ArrayDesc {
                channels: 3,
                ..desc(1, 1, 0, 0)
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn device_spans_count_every_row_and_slice() {
        let s = CopySide::Device {
            ptr: 0x1000,
            pitch: 256,
            height: 10,
        };
        assert_eq!(s.span(100, 4, 2), Some((0x1000, (10 + 3) * 256 + 100)));
        let c = ArrayCopy {
            src: s,
            dst: CopySide::Array {
                array: 1,
                x: 16,
                y: 2,
                z: 0,
            },
            width: 48,
            height: 4,
            depth: 1,
        };
        assert!(c.inside(&c.dst, &desc(4, 6, 0, 0)));
        assert!(!c.inside(&c.dst, &desc(4, 5, 0, 0)));
        assert!(!c.inside(&c.dst, &desc(3, 6, 0, 0)));
    }

    #[test]
    fn texture_params_round_trip_and_spans_are_checked() {
        let p = TexParams {
            kind: resource::PITCH2D,
            base: 0x7000_0000,
            format: 0x20,
            channels: 1,
            width: 64,
            height: 16,
            pitch: 512,
            address_mode: [1, 1, 0],
            filter: 1,
            flags: 2,
            floats: [0, 0, 0x3f80_0000, 0, 0, 0, 0],
            ..TexParams::default()
        };
        assert_eq!(TexParams::decode(&p.encode()), Ok(p));
        assert_eq!(p.span(), Some((0x7000_0000, 15 * 512 + 256)));
        for bad in [
            TexParams { pitch: 255, ..p },
            TexParams { height: 0, ..p },
            TexParams { kind: 1, ..p },
            TexParams {
                has_view: true,
                ..p
            },
            TexParams {
                base: u64::MAX - 10,
                ..p
            },
            TexParams { flags: 0x80, ..p },
        ] {
            assert!(TexParams::decode(&bad.encode()).is_err(), "{bad:?}");
        }
    }
}
