//! How each field type of a request sits in the inline payload: written
//! with the [`Writer`], read with the [`Reader`]. A composite field (launch
//! dimensions, an image kind, a stream attribute, an array description or
//! copy) reads and checks itself here, beside its own type, rather than
//! in the decoder.

use crate::array::{ArrayCopy, ArrayDesc};
use crate::stream_attr::{StreamAttr, RAW_LEN};
use crate::{bad, Dim3, ImageKind, ProtoError, Reader, Writer};

/// A type a request's field may have.
pub(crate) trait Wire: Sized {
    /// What the payload holds, and what the table's checks see: the field
    /// itself, or the `u32` a `u8` or a `bool` is sent as.
    type Raw;
    /// Reads the raw value (an error only for a truncated payload, or a
    /// composite that fails its own checks).
    fn read_raw(r: &mut Reader<'_>) -> Result<Self::Raw, ProtoError>;
    /// The field from its checked raw value; `field` names it in an error.
    fn from_raw(field: &'static str, raw: Self::Raw) -> Result<Self, ProtoError>;
    /// Writes the field.
    fn write(&self, w: &mut Writer<'_>);
}

/// A type that is its own raw value.
macro_rules! plain {
    ($ty:ty, |$r:ident| $read:expr, |$v:ident, $w:ident| $write:expr) => {
        impl Wire for $ty {
            type Raw = $ty;
            fn read_raw($r: &mut Reader<'_>) -> Result<$ty, ProtoError> {
                $read
            }
            fn from_raw(_: &'static str, raw: $ty) -> Result<$ty, ProtoError> {
                Ok(raw)
            }
            fn write(&self, $w: &mut Writer<'_>) {
                let $v = self;
                $write
            }
        }
    };
}

plain!(u32, |r| r.u32(), |v, w| w.u32(*v));
plain!(u64, |r| r.u64(), |v, w| w.u64(*v));
// An i32 travels as its two's complement bits.
plain!(i32, |r| Ok(r.u32()?.cast_signed()), |v, w| w
    .u32(v.cast_unsigned()));
plain!(Dim3, |r| read_dim(r), |v, w| {
    w.u32(v.x);
    w.u32(v.y);
    w.u32(v.z);
});
plain!([u64; 2], |r| Ok([r.u64()?, r.u64()?]), |v, w| {
    w.u64(v[0]);
    w.u64(v[1]);
});
plain!(
    [u8; 32],
    |r| {
        let mut hash = [0u8; 32];
        hash.copy_from_slice(r.bytes(32)?);
        Ok(hash)
    },
    |v, w| w.bytes(v)
);
plain!(
    ImageKind,
    |r| {
        let k = r.u32()?;
        ImageKind::from_code(k).ok_or_else(|| bad("kind", format!("unknown image kind {k}")))
    },
    |v, w| w.u32(v.code())
);
plain!(
    StreamAttr,
    |r| {
        let id = r.u32()?;
        let mut raw = [0u8; RAW_LEN];
        raw.copy_from_slice(r.bytes(RAW_LEN)?);
        StreamAttr::from_raw(id, &raw)
    },
    |v, w| {
        w.u32(v.id());
        w.bytes(&v.to_raw());
    }
);
plain!(ArrayDesc, |r| ArrayDesc::read(r), |v, w| v.write(w));
plain!(ArrayCopy, |r| ArrayCopy::read(r), |v, w| v.write(w));

/// Sent as a `u32`, 0 or 1.
impl Wire for bool {
    type Raw = u32;
    fn read_raw(r: &mut Reader<'_>) -> Result<u32, ProtoError> {
        r.u32()
    }
    fn from_raw(field: &'static str, raw: u32) -> Result<bool, ProtoError> {
        match raw {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(bad(field, format!("{v}"))),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(u32::from(*self));
    }
}

/// Sent as a `u32`; the table's check bounds it first (a larger value is
/// refused here all the same).
impl Wire for u8 {
    type Raw = u32;
    fn read_raw(r: &mut Reader<'_>) -> Result<u32, ProtoError> {
        r.u32()
    }
    fn from_raw(field: &'static str, raw: u32) -> Result<u8, ProtoError> {
        u8::try_from(raw).map_err(|_| bad(field, format!("{raw} does not fit a byte")))
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(u32::from(*self));
    }
}

/// Launch dimensions, x then y then z (graphs' kernel nodes read them too).
pub(crate) fn read_dim(r: &mut Reader<'_>) -> Result<Dim3, ProtoError> {
    Ok(Dim3 {
        x: r.u32()?,
        y: r.u32()?,
        z: r.u32()?,
    })
}
