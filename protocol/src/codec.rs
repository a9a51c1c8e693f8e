//! Little-endian field writer and bounds-checked reader.

use crate::ProtoError;

/// Writes fields in order into a fixed buffer; writing past the end is a
/// programming error caught by the round-trip tests, and is ignored.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    /// A writer at the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }
    fn put(&mut self, b: &[u8]) {
        if let Some(dst) = self.buf.get_mut(self.pos..self.pos + b.len()) {
            dst.copy_from_slice(b);
        }
        debug_assert!(
            self.pos + b.len() <= self.buf.len(),
            "inline payload overflow"
        );
        self.pos += b.len();
    }
    /// Writes a u32.
    pub fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    /// Writes a u64.
    pub fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
    /// Writes bytes as they are.
    pub fn bytes(&mut self, b: &[u8]) {
        self.put(b);
    }
}

/// A length or count as the wire's `u32`, saturated: one past `u32::MAX`
/// (above every limit a decoder accepts) then reads back as too large,
/// never as a smaller, wrong length that would shift every later field.
pub(crate) fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Reads fields in order; running off the end is [`ProtoError::Truncated`].
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let end = self.pos.checked_add(n).ok_or(ProtoError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(ProtoError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
    /// Reads a u32.
    pub fn u32(&mut self) -> Result<u32, ProtoError> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// Reads a u64.
    pub fn u64(&mut self) -> Result<u64, ProtoError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }
}
