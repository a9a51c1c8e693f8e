//! The values requests carry: module image kinds, kernel parameter
//! layouts, launch geometry, `Link` records.

use crate::{bad, link_input, ProtoError, Reader};

/// Which kind of module image follows in the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// PTX text.
    Ptx,
    /// A cubin or fatbin.
    Cubin,
}

impl ImageKind {
    /// Its number on the wire.
    pub fn code(self) -> u32 {
        match self {
            ImageKind::Ptx => 0,
            ImageKind::Cubin => 1,
        }
    }

    /// The kind of a wire number, if it names one.
    pub fn from_code(code: u32) -> Option<ImageKind> {
        match code {
            0 => Some(ImageKind::Ptx),
            1 => Some(ImageKind::Cubin),
            _ => None,
        }
    }
}

/// Where a kernel parameter lies in the kernel's parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Param {
    /// Byte offset in the parameter buffer (as the C ABI lays it out).
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

impl Param {
    /// Encodes a kernel's parameters for `ModuleGetFunction`'s reply data.
    pub fn encode_all(params: &[Param]) -> Vec<u8> {
        params
            .iter()
            .flat_map(|p| {
                p.size
                    .to_le_bytes()
                    .into_iter()
                    .chain(p.offset.to_le_bytes())
            })
            .collect()
    }

    /// Decodes `ModuleGetFunction`'s reply data.
    pub fn decode_all(data: &[u8]) -> Vec<Param> {
        data.chunks_exact(8)
            .map(|c| Param {
                size: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                offset: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect()
    }
}

/// Launch geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dim3 {
    /// x
    pub x: u32,
    /// y
    pub y: u32,
    /// z
    pub z: u32,
}

impl Dim3 {
    /// Product of the three, as u64, saturating: the dimensions come from the
    /// guest, and a wrapped product could pass a bounds check.
    pub fn count(&self) -> u64 {
        (u64::from(self.x) * u64::from(self.y)).saturating_mul(u64::from(self.z))
    }
}

/// Parses `Link` records; an error for any record that does not fit.
pub fn link_records(data: &[u8]) -> Result<Vec<(u32, &[u8])>, ProtoError> {
    let mut r = Reader::new(data);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        let kind = r.u32()?;
        if kind > link_input::FATBINARY {
            return Err(bad(
                "link input",
                format!("input type {kind} not supported"),
            ));
        }
        let len = r.u32()? as usize;
        out.push((kind, r.bytes(len)?));
    }
    Ok(out)
}
