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
use std::io::{BufReader, BufWriter, Read, Write};
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
    let r = write_to(BufWriter::with_capacity(1 << 20, f), saved, key, &[]).and_then(|(w, n)| {
        let f = w
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)?;
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
    let tag = ChunkTag::new(key, nonce);
    let mut w = Tagged {
        inner: w,
        tag,
        n: 0,
    };
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
    let Tagged { mut inner, tag, n } = w;
    inner.write_all(&tag.finish())?;
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
    let mut r = BufReader::with_capacity(1 << 20, f);
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
/// until the tag matched. It reads nothing past the tag.
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
    let tag = ChunkTag::new(key, nonce);
    let mut r = TaggedReader { inner: r, tag };
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
    let TaggedReader { mut inner, tag } = r;
    let mut want = [0u8; 32];
    inner
        .read_exact(&mut want)
        .map_err(|_| FileError::Tag(path.to_owned()))?;
    if !tag.matches(&want) {
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

/// Bytes a stream is copied into its memfd at a time.
const COPY_PIECE: usize = 1 << 20;

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

/// A writer that tags what passes.
struct Tagged<W: Write> {
    inner: W,
    tag: ChunkTag,
    n: u64,
}

impl<W: Write> Write for Tagged<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(b)?;
        self.tag.update(&b[..k]);
        self.n += k as u64;
        Ok(k)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that tags what passes.
struct TaggedReader<R: Read> {
    inner: R,
    tag: ChunkTag,
}

impl<R: Read> Read for TaggedReader<R> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(b)?;
        self.tag.update(&b[..k]);
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
        let mut out = File::from(fd.try_clone().map_err(io)?);
        // In pieces of a MiB: a stream is hundreds of MB, and
        // `std::io::copy`'s 8 KiB would take a write for each.
        let mut buf = vec![0u8; COPY_PIECE.min(usize::try_from(len).unwrap_or(COPY_PIECE))];
        let mut left = len;
        while left > 0 {
            let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let got = self.read(&mut buf[..n]).map_err(io)?;
            if got == 0 {
                return Err(FileError::Tag(path.to_owned()));
            }
            out.write_all(&buf[..got]).map_err(io)?;
            left -= got as u64;
        }
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
