//! A checkpoint as a stream of bytes, for a file or a connection between
//! two hosts' daemons:
//!
//! | field | bytes |
//! | --- | --- |
//! | [`MAGIC`] | 8 |
//! | [`VERSION`], little-endian | 4 |
//! | flags: bit 0 set where the tag is keyed | 4 |
//! | the description's length `n`, little-endian | 8 |
//! | the description: the [`VgpuImage`] as JSON, without bytes of images or memory | `n` |
//! | each session's module images (each followed by its globals' bytes), then its allocations' bytes, in the description's order | as it says |
//! | the tag: HMAC-SHA-256 of everything before under the operator's key; SHA-256 without one | 32 |
//!
//! A reader takes nothing from a stream until its tag matches, checks every
//! context ([`ContextImage::check`]) and keeps what it reads within its
//! [`Limits`] before it allocates for it: a stream may come from a hostile
//! peer.

use std::io::{Read, Write};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::VgpuImage;
use crate::executor::ContextImage;

/// The first bytes of every checkpoint.
pub const MAGIC: [u8; 8] = *b"FVGPUCKP";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;
/// The flag of a keyed tag.
const KEYED: u32 = 1;

/// What a reader takes at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of the description.
    pub description: u64,
    /// Bytes of device memory, over all sessions (the vGPU's limit where it
    /// is restored).
    pub memory: u64,
    /// Bytes of module images, over all sessions.
    pub images: u64,
    /// Guest processes.
    pub sessions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            description: 64 << 20,
            memory: 1 << 40,
            images: 4 << 30,
            sessions: 64,
        }
    }
}

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Reading or writing the stream failed (a short stream included).
    #[error("checkpoint stream: {0}")]
    Io(#[from] std::io::Error),
    /// Its first bytes are not [`MAGIC`].
    #[error("not a fairvgpu checkpoint")]
    NotACheckpoint,
    /// Written by a build of another version.
    #[error("checkpoint version {0}, this build reads {VERSION}")]
    Version(u32),
    /// Its tag does not match: altered, cut, or keyed otherwise.
    #[error("checkpoint integrity check failed ({0})")]
    Integrity(&'static str),
    /// It holds more than the reader takes.
    #[error("checkpoint holds {bytes} {what}, more than the {limit} taken here")]
    TooLarge {
        /// Of what.
        what: &'static str,
        /// How much it holds.
        bytes: u64,
        /// How much the reader takes.
        limit: u64,
    },
    /// Its description does not parse.
    #[error("checkpoint description: {0}")]
    Description(String),
    /// A context of it is not one a restore could make.
    #[error("checkpoint of guest process {pid}: {status:?}")]
    Invalid {
        /// The process.
        pid: u32,
        /// What [`ContextImage::check`] said.
        status: protocol::Status,
    },
    /// Two processes bound to one channel.
    #[error("checkpoint binds channel {0} to two processes")]
    ChannelTwice(u32),
}

/// The tag being computed over what passes.
enum Tag {
    Keyed(Box<Hmac<Sha256>>),
    Plain(Sha256),
}

impl Tag {
    fn new(key: Option<&[u8]>) -> Tag {
        match key {
            // HMAC takes a key of any length.
            Some(k) => Tag::Keyed(Box::new(
                Hmac::<Sha256>::new_from_slice(k).expect("HMAC takes any key length"),
            )),
            None => Tag::Plain(Sha256::new()),
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Tag::Keyed(m) => m.update(bytes),
            Tag::Plain(d) => d.update(bytes),
        }
    }

    fn finish(self) -> [u8; 32] {
        match self {
            Tag::Keyed(m) => m.finalize().into_bytes().into(),
            Tag::Plain(d) => d.finalize().into(),
        }
    }

    /// Whether `tag` is this one's (in constant time where keyed).
    fn matches(self, tag: &[u8; 32]) -> bool {
        match self {
            Tag::Keyed(m) => m.verify_slice(tag).is_ok(),
            Tag::Plain(d) => d.finalize().as_slice() == tag,
        }
    }
}

/// A writer that feeds the tag what it writes.
struct Tagged<'a, W> {
    w: &'a mut W,
    tag: Tag,
    n: u64,
}

impl<W: Write> Tagged<'_, W> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        self.tag.update(bytes);
        self.w.write_all(bytes)?;
        self.n += bytes.len() as u64;
        Ok(())
    }
}

/// Writes `image` to `w`, tagged under `key` (HMAC-SHA-256) or with
/// SHA-256 where none; returns the bytes written.
pub fn write<W: Write>(
    w: &mut W,
    image: &VgpuImage,
    key: Option<&[u8]>,
) -> Result<u64, FormatError> {
    let description =
        serde_json::to_vec(image).map_err(|e| FormatError::Description(e.to_string()))?;
    let mut t = Tagged {
        w,
        tag: Tag::new(key),
        n: 0,
    };
    let flags = if key.is_some() { KEYED } else { 0 };
    t.put(&MAGIC)?;
    t.put(&VERSION.to_le_bytes())?;
    t.put(&flags.to_le_bytes())?;
    t.put(&(description.len() as u64).to_le_bytes())?;
    t.put(&description)?;
    for s in &image.sessions {
        for m in &s.context.modules {
            t.put(&m.image)?;
            for g in &m.globals {
                t.put(&g.bytes)?;
            }
        }
        for a in &s.context.memory {
            t.put(&a.bytes)?;
        }
    }
    let tag = std::mem::replace(&mut t.tag, Tag::Plain(Sha256::new())).finish();
    t.w.write_all(&tag)?;
    t.w.flush()?;
    Ok(t.n + 32)
}

/// A reader that feeds the tag what it reads.
struct Reading<'a, R> {
    r: &'a mut R,
    tag: Tag,
}

impl<R: Read> Reading<'_, R> {
    fn take(&mut self, buf: &mut [u8]) -> Result<(), FormatError> {
        self.r.read_exact(buf)?;
        self.tag.update(buf);
        Ok(())
    }

    fn u32(&mut self) -> Result<u32, FormatError> {
        let mut b = [0; 4];
        self.take(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, FormatError> {
        let mut b = [0; 8];
        self.take(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// `len` bytes, allocated only once `budget` (what is left of a limit)
    /// covers them.
    fn blob(
        &mut self,
        len: u64,
        budget: &mut u64,
        limit: (&'static str, u64),
    ) -> Result<Vec<u8>, FormatError> {
        *budget = budget.checked_sub(len).ok_or(FormatError::TooLarge {
            what: limit.0,
            bytes: len,
            limit: limit.1,
        })?;
        // Grown as the bytes come: a stream that claims more than it
        // holds ends before its claim is allocated.
        let mut v = Vec::new();
        let mut left = len;
        while left > 0 {
            let n = left.min(1 << 20);
            let at = v.len();
            v.resize(at + crate::usize_from(n), 0);
            self.take(&mut v[at..])?;
            left -= n;
        }
        Ok(v)
    }
}

/// What [`Reading::blob`] names when device memory is over its limit.
fn device_memory(limits: &Limits) -> (&'static str, u64) {
    ("bytes of device memory", limits.memory)
}

/// Reads a checkpoint from `r`, expecting a tag under `key` (HMAC-SHA-256)
/// or a SHA-256 where none, within `limits`. Nothing of it is returned
/// unless its tag matches and every context passes its check.
pub fn read<R: Read>(
    r: &mut R,
    key: Option<&[u8]>,
    limits: &Limits,
) -> Result<VgpuImage, FormatError> {
    let mut rd = Reading {
        r,
        tag: Tag::new(key),
    };
    let mut magic = [0; 8];
    rd.take(&mut magic)?;
    if magic != MAGIC {
        return Err(FormatError::NotACheckpoint);
    }
    let version = rd.u32()?;
    if version != VERSION {
        return Err(FormatError::Version(version));
    }
    let flags = rd.u32()?;
    match (flags & KEYED != 0, key.is_some()) {
        (true, false) => return Err(FormatError::Integrity("written under a key; none given")),
        (false, true) => return Err(FormatError::Integrity("written without a key; one given")),
        _ => {}
    }
    let n = rd.u64()?;
    if n > limits.description {
        return Err(FormatError::TooLarge {
            what: "bytes of description",
            bytes: n,
            limit: limits.description,
        });
    }
    let mut description = vec![0; crate::usize_from(n)];
    rd.take(&mut description)?;
    let mut image: VgpuImage = serde_json::from_slice(&description)
        .map_err(|e| FormatError::Description(e.to_string()))?;
    if image.sessions.len() > limits.sessions {
        return Err(FormatError::TooLarge {
            what: "guest processes",
            bytes: image.sessions.len() as u64,
            limit: limits.sessions as u64,
        });
    }
    let (mut memory, mut images) = (limits.memory, limits.images);
    for s in &mut image.sessions {
        let c: &mut ContextImage = &mut s.context;
        for m in &mut c.modules {
            m.image = rd.blob(
                m.len,
                &mut images,
                ("bytes of module images", limits.images),
            )?;
            for g in &mut m.globals {
                g.bytes = rd.blob(g.len, &mut memory, device_memory(limits))?;
            }
        }
        for a in &mut c.memory {
            a.bytes = rd.blob(a.len, &mut memory, device_memory(limits))?;
        }
    }
    let mut tag = [0; 32];
    rd.r.read_exact(&mut tag)?;
    if !rd.tag.matches(&tag) {
        return Err(FormatError::Integrity(if key.is_some() {
            "altered, or written under another key"
        } else {
            "altered or cut"
        }));
    }
    let mut channels = std::collections::HashSet::new();
    for s in &image.sessions {
        s.context
            .check()
            .map_err(|status| FormatError::Invalid { pid: s.pid, status })?;
        if let Some(ch) = s.channels.iter().find(|ch| !channels.insert(ch.index)) {
            return Err(FormatError::ChannelTwice(ch.index));
        }
    }
    Ok(image)
}

#[cfg(test)]
mod tests;
