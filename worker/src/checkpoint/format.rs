//! A checkpoint as a stream of bytes, for a file or a connection between
//! two hosts' daemons:
//!
//! | field | bytes |
//! | --- | --- |
//! | [`MAGIC`] | 8 |
//! | [`VERSION`], little-endian | 4 |
//! | flags: bit 0 set where the tag is keyed, bit 1 where the stream has no tag of its own | 4 |
//! | the description's length `n`, little-endian | 8 |
//! | the description: the [`VgpuImage`] as JSON, without bytes of images or memory | `n` |
//! | each session's module images (each followed by its globals' bytes), then its allocations' bytes, then its graphs' encoded nodes, in the description's order | as it says |
//! | the tag (below), or zeros where it has none | 32 |
//!
//! The tag is HMAC-SHA-256 under the operator's key (SHA-256 without one)
//! of the header, the description and each 4 MiB chunk's own tag in order,
//! a chunk's tag being that of `b"fvgpu-chunk"`, its number (8 bytes,
//! little-endian) and its bytes (all the bytes after the description, cut in
//! chunks as one run). The chunks' tags are computed on several threads at
//! both ends.
//!
//! A stream the daemon carries (a save file's or handover's lane) has no
//! tag of its own: the carrier's keyed tag covers it, and the daemon checks
//! that before any worker sees a byte ([`Check::Carried`]). Tagging it
//! again cost about 30 ms at each end of a handover, in the guest's pause.
//!
//! A reader takes nothing from a stream until its tag matches, checks every
//! context ([`ContextImage::check`]) and keeps what it reads within its
//! [`Limits`] before it allocates for it: a stream may come from a hostile
//! peer.

use std::io::{Read, Write};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::mapped::{Blob, Mapped, MappedReader};
use super::VgpuImage;
use crate::executor::ContextImage;

/// The first bytes of every checkpoint.
pub const MAGIC: [u8; 8] = *b"FVGPUCKP";
/// The version this build writes; it reads it and the two before.
pub const VERSION: u32 = 3;
/// The version before streams could go without a tag of their own.
const ALWAYS_TAGGED: u32 = 2;
/// The version before graphs were carried (its images hold none).
const WITHOUT_GRAPHS: u32 = 1;
/// The flag of a keyed tag.
const KEYED: u32 = 1;
/// The flag of a stream without a tag of its own: its carrier's covers it.
const CARRIED: u32 = 2;

/// What a reader checks a stream's integrity by.
#[derive(Debug, Clone, Copy)]
pub enum Check<'a> {
    /// Its own tag: HMAC-SHA-256 under this key, or SHA-256 where none. A
    /// stream without one is refused.
    Own(Option<&'a [u8]>),
    /// Its carrier's: the save file or handover that held it, whose tag the
    /// daemon checked before handing the stream on. Its own tag, where it
    /// has one, is not checked again.
    Carried,
}

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
    #[error("checkpoint version {0}, this build reads {VERSION}, 2 and 1 (which holds no graphs)")]
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

/// A tag being computed over the bytes that pass: HMAC-SHA-256 under a
/// key, SHA-256 without one (a checkpoint's, and a save file's in the
/// daemon).
pub enum Tag {
    /// Under a key.
    Keyed(Box<Hmac<Sha256>>),
    /// No key.
    Plain(Sha256),
}

impl std::fmt::Debug for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tag::Keyed(_) => "Tag::Keyed",
            Tag::Plain(_) => "Tag::Plain",
        })
    }
}

impl Tag {
    /// A tag under `key`, or a plain digest.
    pub fn new(key: Option<&[u8]>) -> Tag {
        match key {
            // HMAC takes a key of any length.
            Some(k) => Tag::Keyed(Box::new(
                Hmac::<Sha256>::new_from_slice(k).expect("HMAC takes any key length"),
            )),
            None => Tag::Plain(Sha256::new()),
        }
    }

    /// Takes in the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Tag::Keyed(m) => m.update(bytes),
            Tag::Plain(d) => d.update(bytes),
        }
    }

    /// The tag over every byte taken in.
    pub fn finish(self) -> [u8; 32] {
        match self {
            Tag::Keyed(m) => m.finalize().into_bytes().into(),
            Tag::Plain(d) => d.finalize().into(),
        }
    }

    /// Whether `tag` is this one's (in constant time where keyed).
    pub fn matches(self, tag: &[u8; 32]) -> bool {
        match self {
            Tag::Keyed(m) => m.verify_slice(tag).is_ok(),
            Tag::Plain(d) => d.finalize().as_slice() == tag,
        }
    }
}

/// Writes `image` to `w`, tagged under `key` (HMAC-SHA-256) or with
/// SHA-256 where none (see the module's doc); returns the bytes written.
pub fn write<W: Write>(
    w: &mut W,
    image: &VgpuImage,
    key: Option<&[u8]>,
) -> Result<u64, FormatError> {
    let front = front(image, if key.is_some() { KEYED } else { 0 })?;
    w.write_all(&front)?;
    let mut n = front.len() as u64;
    let blobs = blobs(image);
    for b in &blobs {
        w.write_all(b)?;
        n += b.len() as u64;
    }
    w.write_all(&stream_tag(key, &front, &blobs))?;
    w.flush()?;
    Ok(n + 32)
}

/// The stream's header and description (see the module's doc), under
/// `flags`.
fn front(image: &VgpuImage, flags: u32) -> Result<Vec<u8>, FormatError> {
    let description =
        serde_json::to_vec(image).map_err(|e| FormatError::Description(e.to_string()))?;
    let mut front = Vec::with_capacity(24 + description.len());
    front.extend_from_slice(&MAGIC);
    front.extend_from_slice(&VERSION.to_le_bytes());
    front.extend_from_slice(&flags.to_le_bytes());
    front.extend_from_slice(&(description.len() as u64).to_le_bytes());
    front.extend_from_slice(&description);
    Ok(front)
}

/// Bytes of one chunk of a blob, tagged on its own.
const CHUNK: usize = 4 << 20;

/// The image's bytes that follow its description, in the stream's order.
fn blobs(image: &VgpuImage) -> Vec<&[u8]> {
    let mut v = Vec::new();
    for s in &image.sessions {
        for m in &s.context.modules {
            v.push(&*m.image);
            v.extend(m.globals.iter().map(|g| &*g.bytes));
        }
        v.extend(s.context.memory.iter().map(|a| &*a.bytes));
        v.extend(s.context.graphs.iter().map(|g| g.nodes.as_slice()));
    }
    v
}

/// `blobs` cut in chunks of [`CHUNK`] bytes across their boundaries: each
/// chunk the slices it is made of.
fn chunks<'a>(blobs: &[&'a [u8]]) -> Vec<Vec<&'a [u8]>> {
    let mut out: Vec<Vec<&[u8]>> = Vec::new();
    let mut room = 0;
    for b in blobs {
        let mut b: &[u8] = b;
        while !b.is_empty() {
            if room == 0 {
                out.push(Vec::new());
                room = CHUNK;
            }
            let n = b.len().min(room);
            out.last_mut().expect("pushed above").push(&b[..n]);
            b = &b[n..];
            room -= n;
        }
    }
    out
}

/// The tag state over `front` (the header and the description) and each
/// chunk's own tag, chunks being tagged on up to 16 threads: what the
/// stream's last 32 bytes must be (see the module's doc).
pub fn stream_tag(key: Option<&[u8]>, front: &[u8], blobs: &[&[u8]]) -> [u8; 32] {
    tag_over(key, front, blobs).finish()
}

fn tag_over(key: Option<&[u8]>, front: &[u8], blobs: &[&[u8]]) -> Tag {
    let chunks = chunks(blobs);
    let tag = |i: usize, c: &[&[u8]]| {
        let mut t = Tag::new(key);
        t.update(b"fvgpu-chunk");
        t.update(&(i as u64).to_le_bytes());
        for s in c {
            t.update(s);
        }
        t.finish()
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .clamp(1, 16)
        .min(chunks.len().max(1));
    let mut tags = vec![[0u8; 32]; chunks.len()];
    if threads == 1 {
        for (i, (slot, c)) in tags.iter_mut().zip(&chunks).enumerate() {
            *slot = tag(i, c);
        }
    } else {
        std::thread::scope(|sc| {
            let per = chunks.len().div_ceil(threads);
            for (k, part) in tags.chunks_mut(per).enumerate() {
                let chunks = &chunks;
                sc.spawn(move || {
                    for (j, slot) in part.iter_mut().enumerate() {
                        let i = k * per + j;
                        *slot = tag(i, &chunks[i]);
                    }
                });
            }
        });
    }
    let mut t = Tag::new(key);
    t.update(front);
    for c in &tags {
        t.update(c);
    }
    t
}

/// Where a stream is read from: any reader, each blob copied out of it, or
/// a mapped memfd, whose memory blobs stay in place (`mapped.rs`).
trait Source: Read {
    /// The next `len` bytes, of device memory or a module's image.
    fn memory(&mut self, len: u64) -> std::io::Result<Blob>;
}

/// Any reader, each blob copied out.
struct Copying<'a, R>(&'a mut R);

impl<R: Read> Read for Copying<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl<R: Read> Source for Copying<'_, R> {
    fn memory(&mut self, len: u64) -> std::io::Result<Blob> {
        // Grown as the bytes come: a stream that claims more than it
        // holds ends before its claim is allocated.
        let mut v = Vec::new();
        (&mut *self.0).take(len).read_to_end(&mut v)?;
        if v.len() as u64 != len {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        Ok(Blob::Owned(v))
    }
}

impl Source for MappedReader {
    fn memory(&mut self, len: u64) -> std::io::Result<Blob> {
        MappedReader::memory(self, len)
    }
}

/// A reader that keeps the header and description it read, for the tag.
struct Reading<'a, R> {
    r: &'a mut R,
    front: Vec<u8>,
}

impl<R: Source> Reading<'_, R> {
    fn take(&mut self, buf: &mut [u8]) -> Result<(), FormatError> {
        self.r.read_exact(buf)?;
        self.front.extend_from_slice(buf);
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

    /// `len` bytes of device memory or a module's image, allocated (where
    /// copied) only once `budget` (what is left of a limit) covers them.
    /// Tagged chunk by chunk once all is read (`tag_over`).
    fn memory(
        &mut self,
        len: u64,
        budget: &mut u64,
        limit: (&'static str, u64),
    ) -> Result<Blob, FormatError> {
        *budget = budget.checked_sub(len).ok_or(FormatError::TooLarge {
            what: limit.0,
            bytes: len,
            limit: limit.1,
        })?;
        Ok(self.r.memory(len)?)
    }

    /// `len` bytes of a graph's nodes, as [`Reading::memory`] but
    /// always copied.
    fn blob(
        &mut self,
        len: u64,
        budget: &mut u64,
        limit: (&'static str, u64),
    ) -> Result<Vec<u8>, FormatError> {
        let b = self.memory(len, budget, limit)?;
        Ok(match b {
            Blob::Owned(v) => v,
            mapped => mapped.to_vec(),
        })
    }
}

/// What [`Reading::blob`] names when device memory is over its limit.
fn device_memory(limits: &Limits) -> (&'static str, u64) {
    ("bytes of device memory", limits.memory)
}

/// The description of the checkpoint `r` begins with (its device, limit,
/// processes and their objects, no bytes), within `limits`, keyed or not.
/// Nothing of it is checked against its tag: trust it only as far as what
/// holds it was checked (a save file's tag, in the daemon), to refuse a
/// restore early; the worker that restores reads it whole ([`read`]).
pub fn describe<R: Read>(r: &mut R, limits: &Limits) -> Result<VgpuImage, FormatError> {
    let mut rd = Reading {
        r: &mut Copying(r),
        front: Vec::new(),
    };
    head(&mut rd)?;
    description(&mut rd, limits)
}

/// The stream's magic and version, checked; its version and flags.
fn head<R: Source>(rd: &mut Reading<'_, R>) -> Result<(u32, u32), FormatError> {
    let mut magic = [0; 8];
    rd.take(&mut magic)?;
    if magic != MAGIC {
        return Err(FormatError::NotACheckpoint);
    }
    let version = rd.u32()?;
    if !(WITHOUT_GRAPHS..=VERSION).contains(&version) {
        return Err(FormatError::Version(version));
    }
    Ok((version, rd.u32()?))
}

/// The description, as the stream's front has it next.
fn description<R: Source>(
    rd: &mut Reading<'_, R>,
    limits: &Limits,
) -> Result<VgpuImage, FormatError> {
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
    let image: VgpuImage = serde_json::from_slice(&description)
        .map_err(|e| FormatError::Description(e.to_string()))?;
    if image.sessions.len() > limits.sessions {
        return Err(FormatError::TooLarge {
            what: "guest processes",
            bytes: image.sessions.len() as u64,
            limit: limits.sessions as u64,
        });
    }
    Ok(image)
}

/// The front of a stream the daemon carries: no tag of its own.
pub(super) fn carried_front(image: &VgpuImage) -> Result<Vec<u8>, FormatError> {
    front(image, CARRIED)
}

/// Reads a checkpoint from `r`, its integrity checked by `check`, within
/// `limits`. Nothing of it is returned unless its tag matches (where
/// checked) and every context passes its check.
pub fn read<R: Read>(
    r: &mut R,
    check: Check<'_>,
    limits: &Limits,
) -> Result<VgpuImage, FormatError> {
    read_from(&mut Copying(r), check, limits)
}

/// [`read`] from a mapped memfd: the image's device memory stays in the
/// mapping ([`Blob::Mapped`]), which the image keeps.
pub fn read_mapped(
    map: Arc<Mapped>,
    check: Check<'_>,
    limits: &Limits,
) -> Result<VgpuImage, FormatError> {
    read_from(&mut MappedReader::new(map), check, limits)
}

/// Refuses a stream whose flags do not fit `check`.
fn flags_fit(flags: u32, check: Check<'_>) -> Result<(), FormatError> {
    let Check::Own(key) = check else {
        return Ok(());
    };
    if flags & CARRIED != 0 {
        return Err(FormatError::Integrity(
            "it has no tag of its own: it is read only from the save file that carries it",
        ));
    }
    match (flags & KEYED != 0, key.is_some()) {
        (true, false) => Err(FormatError::Integrity("written under a key; none given")),
        (false, true) => Err(FormatError::Integrity("written without a key; one given")),
        _ => Ok(()),
    }
}

fn read_from<R: Source>(
    r: &mut R,
    check: Check<'_>,
    limits: &Limits,
) -> Result<VgpuImage, FormatError> {
    let mut rd = Reading {
        r,
        front: Vec::new(),
    };
    let (version, flags) = head(&mut rd)?;
    if version <= ALWAYS_TAGGED && flags & CARRIED != 0 {
        return Err(FormatError::Integrity("a flag its version does not have"));
    }
    flags_fit(flags, check)?;
    let mut image = description(&mut rd, limits)?;
    let graphs = image.sessions.iter().any(|s| !s.context.graphs.is_empty());
    if version == WITHOUT_GRAPHS && graphs {
        return Err(FormatError::Version(version));
    }
    let (mut memory, mut images) = (limits.memory, limits.images);
    for s in &mut image.sessions {
        let c: &mut ContextImage = &mut s.context;
        for m in &mut c.modules {
            m.image = rd.memory(
                m.len,
                &mut images,
                ("bytes of module images and graphs", limits.images),
            )?;
            for g in &mut m.globals {
                g.bytes = rd.memory(g.len, &mut memory, device_memory(limits))?;
            }
        }
        for a in &mut c.memory {
            a.bytes = rd.memory(a.len, &mut memory, device_memory(limits))?;
        }
        for g in &mut c.graphs {
            g.nodes = rd.blob(
                g.len,
                &mut images,
                ("bytes of module images and graphs", limits.images),
            )?;
        }
    }
    let mut tag = [0; 32];
    rd.r.read_exact(&mut tag)?;
    if let Check::Own(key) = check {
        if !tag_over(key, &rd.front, &blobs(&image)).matches(&tag) {
            return Err(FormatError::Integrity(if key.is_some() {
                "altered, or written under another key"
            } else {
                "altered or cut"
            }));
        }
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
