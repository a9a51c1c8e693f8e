//! A vGPU's save file: the checkpoint stream of each of its process slots'
//! workers (`worker::checkpoint`), under one tag.
//!
//! ```text
//! magic "FVGPUSAV" | version u32 | flags u32 (bit 0: keyed, bit 1: region)
//! | name length u16 | VM name | [region length u64 | its blocks] | lanes u32
//! | per lane: slot u32 | length u64 | that many bytes of stream, in blocks
//! | tag: 32 bytes, HMAC-SHA-256 under the operator's key, else SHA-256,
//!   over a handover's nonce (`handover.rs`), each 4 MiB chunk's own tag of
//!   every byte before it, and their length (`tag.rs`)
//! ```
//!
//! A region and each stream go in blocks, those of zeros as one byte
//! (`region.rs`): most of a training's device memory is zeros (152 of
//! 166 MiB of a PyTorch checkpoint on an H200, `docs/measured.md`).
//! Version 3 (streams whole) is still read.
//! Integers are little-endian. The daemon checks the tag before any worker
//! sees a byte; each worker then reads its own stream within the vGPU's
//! limits, in its sandbox.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use tag::ChunkTag;

/// The first bytes of every save file.
pub const MAGIC: [u8; 8] = *b"FVGPUSAV";
/// The version this build writes; it reads it and the one before.
pub const VERSION: u32 = 4;
/// The version whose streams went whole, not in blocks.
const WHOLE_STREAMS: u32 = 3;
const KEYED: u32 = 1;
const REGION: u32 = 2;

/// Why a save file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// A read or write failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// Not a save file, or one of another version.
    #[error("{0}: not a fairvgpu save file of version {VERSION} or 3")]
    NotOne(PathBuf),
    /// Keyed on one side and not the other.
    #[error("{path}: {why}")]
    Key {
        /// The file.
        path: PathBuf,
        /// Which side has the key.
        why: &'static str,
    },
    /// A vGPU's other than the one it is restored into.
    #[error("{path} holds {held}'s vGPU, not {vm}'s")]
    OtherVm {
        /// The file.
        path: PathBuf,
        /// The VM it holds.
        held: String,
        /// The VM asked for.
        vm: String,
    },
    /// A VM this host does not have.
    #[error("{path} holds {vm}'s vGPU, which this host has no [[vm]] for")]
    NoVm {
        /// The file.
        path: PathBuf,
        /// The VM it holds.
        vm: String,
    },
    /// A lane past the VM's slots, twice, too many, or too long.
    #[error("{path}: {why}")]
    Lanes {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The tag does not match: damaged, cut, or not tagged under this key.
    #[error("{0}: its tag does not match (damaged, cut short, or tagged under another key)")]
    Tag(PathBuf),
}

/// One process slot's checkpoint stream, in a memfd.
#[derive(Debug)]
pub struct Lane {
    /// The slot.
    pub slot: u32,
    /// The memfd holding the stream.
    pub stream: OwnedFd,
    /// The stream's length, bytes.
    pub len: u64,
}

/// What a file may hold to be read.
#[derive(Debug, Clone, Copy)]
pub struct FileLimits {
    /// The VM's process slots: every lane is one below it.
    pub slots: u32,
    /// Bytes of one lane's stream.
    pub lane_bytes: u64,
    /// Bytes of the VM's region here: what a region carried must be.
    pub region: u64,
}

/// What a save file holds: the VM's name, its region's bytes where it
/// carries them (a handover between hosts; a file leaves the region to
/// QEMU's saved state), and each process slot's checkpoint stream.
#[derive(Debug)]
pub struct Saved {
    /// The VM.
    pub vm: String,
    /// The region's bytes in a memfd, and their length.
    pub region: Option<(OwnedFd, u64)>,
    /// Each process slot's stream.
    pub lanes: Vec<Lane>,
}

/// Writes `saved` to a new file at `path`, tagged under `key`; returns its
/// length. Where `replace`, it is written beside and then renamed over a
/// file there (which stays whole until then); else never over one. A file
/// left half written is removed.
pub fn write(
    path: &Path,
    saved: &Saved,
    key: Option<&[u8]>,
    replace: bool,
) -> Result<u64, FileError> {
    let io = |source| FileError::Io {
        path: path.to_owned(),
        source,
    };
    if replace {
        let mut part = path.as_os_str().to_owned();
        part.push(".part");
        let part = std::path::PathBuf::from(part);
        let _ = std::fs::remove_file(&part);
        let n = write(&part, saved, key, false)?;
        std::fs::rename(&part, path).map_err(|source| {
            let _ = std::fs::remove_file(&part);
            io(source)
        })?;
        return Ok(n);
    }
    let f = File::options()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io)?;
    // Not buffered: the writer gathers a MiB at a time in its chunks.
    let r = write_to(f, saved, key, &[]).and_then(|(f, n)| {
        f.sync_all()?;
        Ok(n)
    });
    if r.is_err() {
        let _ = std::fs::remove_file(path);
    }
    r.map_err(io)
}

/// Writes `saved` to `w`, its tag under `key` also over `nonce` (a
/// handover's, which the reader gave; empty for a file); returns `w`,
/// flushed, and the bytes written.
pub fn write_to<W: Write>(
    w: W,
    saved: &Saved,
    key: Option<&[u8]>,
    nonce: &[u8],
) -> std::io::Result<(W, u64)> {
    let mut w = Tagged::new(w, ChunkTag::new(key, nonce));
    let vm = &saved.vm;
    let name = u16::try_from(vm.len()).unwrap_or(u16::MAX);
    let flags =
        if key.is_some() { KEYED } else { 0 } | if saved.region.is_some() { REGION } else { 0 };
    w.write_all(&MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&flags.to_le_bytes())?;
    w.write_all(&name.to_le_bytes())?;
    w.write_all(&vm.as_bytes()[..usize::from(name)])?;
    if let Some((fd, len)) = &saved.region {
        w.write_all(&len.to_le_bytes())?;
        let (b, ms) = blocks(fd, *len, &mut w, "the region")?;
        tracing::debug!(?b, ms, "the region written");
    }
    w.write_all(
        &u32::try_from(saved.lanes.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    )?;
    for l in &saved.lanes {
        w.write_all(&l.slot.to_le_bytes())?;
        w.write_all(&l.len.to_le_bytes())?;
        let what = format!("slot {}'s stream", l.slot);
        let (b, ms) = blocks(&l.stream, l.len, &mut w, &what)?;
        tracing::debug!(slot = l.slot, ?b, ms, "a stream written");
    }
    // The last bytes and the tag in one write: a peer that refuses what it
    // read and closes with the tag unread would reset the connection, and
    // its verdict with it.
    let mut last = w.tag.recent(w.unsent, 0).to_vec();
    let Tagged {
        mut inner, tag, n, ..
    } = w;
    last.extend_from_slice(&tag.finish());
    inner.write_all(&last)?;
    inner.flush()?;
    Ok((inner, n + 32))
}

/// `len` bytes of `fd` written to `w` in blocks (`region::write`), an error
/// saying `what` failed; what the blocks were, and how many milliseconds
/// it took.
fn blocks(
    fd: &OwnedFd,
    len: u64,
    w: &mut impl Write,
    what: &str,
) -> std::io::Result<(region::Blocks, u128)> {
    let t = std::time::Instant::now();
    let b = region::write(fd, len, w)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{what}: {e}")))?;
    Ok((b, t.elapsed().as_millis()))
}

/// Reads the save file at `path` for `vm`: each lane's stream in a memfd
/// of its own, returned only once the tag under `key` matched. Refuses a
/// file of another VM, keyed otherwise than `key`, or past `limits`.
pub fn read(
    path: &Path,
    vm: &str,
    key: Option<&[u8]>,
    limits: FileLimits,
) -> Result<Saved, FileError> {
    let f = File::open(path).map_err(|source| FileError::Io {
        path: path.to_owned(),
        source,
    })?;
    // Not buffered: the reader reads ahead in chunks of its own.
    let mut r = f;
    let saved = read_from(&mut r, path, key, &[], &|_| Some(limits))?;
    // Nothing after the tag.
    let mut rest = [0u8; 1];
    if !matches!(r.read(&mut rest), Ok(0)) {
        return Err(FileError::Tag(path.to_owned()));
    }
    if saved.vm != vm {
        return Err(FileError::OtherVm {
            path: path.to_owned(),
            held: saved.vm,
            vm: vm.to_owned(),
        });
    }
    Ok(saved)
}

/// Reads a save file from `r` (its errors naming `path`), its tag under
/// `key` also over `nonce` (see [`write_to`]), within the limits `limits`
/// gives for the VM it names (None: no such VM here); nothing is returned
/// until the tag matched. It reads ahead (up to a 4 MiB chunk's end), and
/// refuses a stream with bytes past its tag read so.
pub fn read_from<R: Read>(
    r: R,
    path: &Path,
    key: Option<&[u8]>,
    nonce: &[u8],
    limits: &dyn Fn(&str) -> Option<FileLimits>,
) -> Result<Saved, FileError> {
    let io = |source| FileError::Io {
        path: path.to_owned(),
        source,
    };
    let mut r = TaggedReader::new(r, ChunkTag::new(key, nonce));
    let lanes_err = |why: String| FileError::Lanes {
        path: path.to_owned(),
        why,
    };
    let mut head = [0u8; 18];
    r.read_exact(&mut head).map_err(io)?;
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let flags = word(12);
    let version = word(8);
    if head[..8] != MAGIC
        || ![VERSION, WHOLE_STREAMS].contains(&version)
        || flags & !(KEYED | REGION) != 0
    {
        return Err(FileError::NotOne(path.to_owned()));
    }
    match (flags & KEYED != 0, key.is_some()) {
        (true, false) => {
            return Err(FileError::Key {
                path: path.to_owned(),
                why: "it is tagged under a key and this host has none (checkpoint_key_file)",
            })
        }
        (false, true) => {
            return Err(FileError::Key {
                path: path.to_owned(),
                why:
                    "it is not tagged under a key and this host requires one (checkpoint_key_file)",
            })
        }
        _ => {}
    }
    let mut name = vec![0u8; usize::from(u16::from_le_bytes([head[16], head[17]]))];
    r.read_exact(&mut name).map_err(io)?;
    let vm = String::from_utf8_lossy(&name).into_owned();
    let limits = limits(&vm).ok_or_else(|| FileError::NoVm {
        path: path.to_owned(),
        vm: vm.clone(),
    })?;
    let region = if flags & REGION != 0 {
        let len = r.u64().map_err(io)?;
        if len != limits.region {
            return Err(lanes_err(format!(
                "a region of {len} bytes, the VM's here is {}",
                limits.region
            )));
        }
        let fd = memfd(&format!("fairvgpu-{vm}-region")).map_err(io)?;
        region::read(&mut r, len, &File::from(fd.try_clone().map_err(io)?)).map_err(io)?;
        Some((fd, len))
    } else {
        None
    };
    let n = r.u32().map_err(io)?;
    if n > limits.slots {
        return Err(lanes_err(format!(
            "{n} process slots' checkpoints, the VM has {}",
            limits.slots
        )));
    }
    let mut lanes: Vec<Lane> = Vec::new();
    for _ in 0..n {
        let slot = r.u32().map_err(io)?;
        let len = r.u64().map_err(io)?;
        if slot >= limits.slots || lanes.iter().any(|l| l.slot == slot) {
            return Err(lanes_err(format!(
                "process slot {slot} twice or past the VM's"
            )));
        }
        if len > limits.lane_bytes {
            return Err(lanes_err(format!(
                "slot {slot}'s checkpoint is {len} bytes, past {} here",
                limits.lane_bytes
            )));
        }
        let name = format!("fairvgpu-{vm}-restore-{slot}");
        let stream = if version == WHOLE_STREAMS {
            r.read_memfd(&name, len, path)?
        } else {
            let fd = memfd(&name).map_err(io)?;
            region::read(&mut r, len, &File::from(fd.try_clone().map_err(io)?))
                .map_err(|e| lanes_err(format!("slot {slot}'s stream: {e}")))?;
            fd
        };
        lanes.push(Lane { slot, stream, len });
    }
    // The tag, partly read ahead perhaps; nothing read ahead past it.
    let (tag, rest, mut inner) = r.finish();
    let mut want = [0u8; 32];
    let past = rest.len().saturating_sub(want.len());
    if past > 0
        || (&rest[..]).chain(&mut inner).read_exact(&mut want).is_err()
        || !tag.matches(&want)
    {
        return Err(FileError::Tag(path.to_owned()));
    }
    Ok(Saved { vm, region, lanes })
}

/// The tag a save file of `bytes` (everything before its tag) ends with,
/// under `key`, after `nonce` (see [`write_to`]).
pub fn tag_of(key: Option<&[u8]>, nonce: &[u8], bytes: &[u8]) -> [u8; 32] {
    let mut t = ChunkTag::new(key, nonce);
    t.update(bytes);
    t.finish()
}

/// A memfd named `name`, closed on exec.
pub fn memfd(name: &str) -> std::io::Result<OwnedFd> {
    // Sealable: a restoring worker seals its stream against shrinking and
    // reads it in place (`worker::checkpoint::Mapped`).
    nix::sys::memfd::memfd_create(
        name,
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC | nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(std::io::Error::from)
}

/// Bytes a [`Tagged`] writer gathers before it writes them out (a chunk's
/// end aside).
const WRITE_OUT: usize = 1 << 20;

/// A writer that tags what passes, gathered in the tag's chunk
/// (`ChunkTag::room`) and written out from there: each byte is copied
/// once, for the tag and the writer both, and small writes (a block's
/// marker) do not each reach `inner`.
struct Tagged<W: Write> {
    inner: W,
    tag: ChunkTag,
    /// Bytes taken in and not yet written out: the chunk's last ones.
    unsent: usize,
    n: u64,
}

impl<W: Write> Tagged<W> {
    fn new(inner: W, tag: ChunkTag) -> Tagged<W> {
        Tagged {
            inner,
            tag,
            unsent: 0,
            n: 0,
        }
    }

    /// Writes out what was taken in and not yet written.
    fn write_out(&mut self) -> std::io::Result<()> {
        self.inner.write_all(self.tag.recent(self.unsent, 0))?;
        self.unsent = 0;
        Ok(())
    }
}

impl<W: Write> Write for Tagged<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let room = self.tag.room();
        let k = room.len().min(b.len());
        room[..k].copy_from_slice(&b[..k]);
        // A full chunk goes to be hashed: written out first.
        if k == room.len() || self.unsent + k >= WRITE_OUT {
            self.inner.write_all(self.tag.recent(self.unsent, k))?;
            self.unsent = 0;
        } else {
            self.unsent += k;
        }
        self.tag.took(k);
        self.n += k as u64;
        Ok(k)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.write_out()?;
        self.inner.flush()
    }
}

/// A reader that tags what passes, read ahead into the tag's chunk
/// (`ChunkTag::room`): what it passes on is copied once, by the kernel,
/// from `inner` into the chunk, and not again for the tag.
struct TaggedReader<R: Read> {
    inner: R,
    tag: ChunkTag,
    /// Bytes read ahead into the chunk and not yet passed on.
    ahead: usize,
}

impl<R: Read> TaggedReader<R> {
    fn new(inner: R, tag: ChunkTag) -> TaggedReader<R> {
        TaggedReader {
            inner,
            tag,
            ahead: 0,
        }
    }

    /// The tag over what was passed on, the bytes read ahead past it, and
    /// the reader.
    fn finish(self) -> (ChunkTag, Vec<u8>, R) {
        let rest = self.tag.ahead(self.ahead).to_vec();
        (self.tag, rest, self.inner)
    }
}

impl<R: Read> std::io::BufRead for TaggedReader<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.ahead == 0 {
            self.ahead = self.inner.read(self.tag.room())?;
        }
        Ok(self.tag.ahead(self.ahead))
    }

    fn consume(&mut self, n: usize) {
        let n = n.min(self.ahead);
        self.tag.took(n);
        self.ahead -= n;
    }
}

impl<R: Read> Read for TaggedReader<R> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        use std::io::BufRead;
        let got = self.fill_buf()?;
        let k = got.len().min(b.len());
        b[..k].copy_from_slice(&got[..k]);
        self.consume(k);
        Ok(k)
    }
}

impl<R: Read> TaggedReader<R> {
    /// The next `len` bytes, all of them, in a new memfd named `name`; a
    /// stream cut short is one whose tag cannot match.
    fn read_memfd(&mut self, name: &str, len: u64, path: &Path) -> Result<OwnedFd, FileError> {
        let io = |source| FileError::Io {
            path: path.to_owned(),
            source,
        };
        let fd = memfd(name).map_err(io)?;
        let out = File::from(fd.try_clone().map_err(io)?);
        region::pass(self, len, &out, 0).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => FileError::Tag(path.to_owned()),
            _ => io(e),
        })?;
        Ok(fd)
    }

    fn u32(&mut self) -> std::io::Result<u32> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

pub mod region;
mod tag;
#[cfg(test)]
mod tests;
