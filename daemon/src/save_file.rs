//! A vGPU's save file: the checkpoint stream of each of its process slots'
//! workers (`worker::checkpoint`), under one tag.
//!
//! ```text
//! magic "FVGPUSAV" | version u32 | flags u32 (bit 0: keyed)
//! | name length u16 | VM name | lanes u32
//! | per lane: slot u32 | length u64 | that many bytes of stream
//! | tag: 32 bytes, HMAC-SHA-256 under the operator's key, else SHA-256,
//!   over every byte before it
//! ```
//!
//! Integers are little-endian. The daemon checks the tag before any worker
//! sees a byte; each worker then reads its own stream within the vGPU's
//! limits, in its sandbox.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use worker::checkpoint::Tag;

/// The first bytes of every save file.
pub const MAGIC: [u8; 8] = *b"FVGPUSAV";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;
const KEYED: u32 = 1;

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
    #[error("{0}: not a fairvgpu save file of version {VERSION}")]
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
}

/// Writes `lanes` of `vm` to a new file at `path` (never over one that is
/// there), tagged under `key`; returns its length. A file left half
/// written is removed.
pub fn write(path: &Path, vm: &str, lanes: &[Lane], key: Option<&[u8]>) -> Result<u64, FileError> {
    let io = |source| FileError::Io {
        path: path.to_owned(),
        source,
    };
    let f = File::options()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io)?;
    let r = write_to(f, vm, lanes, key).map_err(io);
    if r.is_err() {
        let _ = std::fs::remove_file(path);
    }
    r
}

fn write_to(f: File, vm: &str, lanes: &[Lane], key: Option<&[u8]>) -> std::io::Result<u64> {
    let mut w = Tagged {
        inner: BufWriter::with_capacity(1 << 20, f),
        tag: Tag::new(key),
        n: 0,
    };
    let name = u16::try_from(vm.len()).unwrap_or(u16::MAX);
    w.write_all(&MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&(if key.is_some() { KEYED } else { 0 }).to_le_bytes())?;
    w.write_all(&name.to_le_bytes())?;
    w.write_all(&vm.as_bytes()[..usize::from(name)])?;
    w.write_all(&u32::try_from(lanes.len()).unwrap_or(u32::MAX).to_le_bytes())?;
    for l in lanes {
        w.write_all(&l.slot.to_le_bytes())?;
        w.write_all(&l.len.to_le_bytes())?;
        let mut s = File::from(l.stream.try_clone()?);
        s.rewind()?;
        let copied = std::io::copy(&mut (&mut s).take(l.len), &mut w)?;
        if copied != l.len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("slot {}'s stream is {copied} bytes, not {}", l.slot, l.len),
            ));
        }
    }
    let Tagged { mut inner, tag, n } = w;
    inner.write_all(&tag.finish())?;
    inner.flush()?;
    inner.get_ref().sync_all()?;
    Ok(n + 32)
}

/// Reads the save file at `path` for `vm`: each lane's stream in a memfd
/// of its own, returned only once the tag under `key` matched. Refuses a
/// file of another VM, keyed otherwise than `key`, or past `limits`.
pub fn read(
    path: &Path,
    vm: &str,
    key: Option<&[u8]>,
    limits: FileLimits,
) -> Result<Vec<Lane>, FileError> {
    let f = File::open(path).map_err(|source| FileError::Io {
        path: path.to_owned(),
        source,
    })?;
    read_from(BufReader::with_capacity(1 << 20, f), path, vm, key, limits)
}

/// [`read`] from `r`, its errors naming `path`.
pub fn read_from<R: Read>(
    r: R,
    path: &Path,
    vm: &str,
    key: Option<&[u8]>,
    limits: FileLimits,
) -> Result<Vec<Lane>, FileError> {
    let io = |source| FileError::Io {
        path: path.to_owned(),
        source,
    };
    let mut r = TaggedReader {
        inner: r,
        tag: Tag::new(key),
    };
    let lanes_err = |why: String| FileError::Lanes {
        path: path.to_owned(),
        why,
    };
    let mut head = [0u8; 18];
    r.read_exact(&mut head).map_err(io)?;
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    if head[..8] != MAGIC || word(8) != VERSION || word(12) & !KEYED != 0 {
        return Err(FileError::NotOne(path.to_owned()));
    }
    match (word(12) & KEYED != 0, key.is_some()) {
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
    let held = String::from_utf8_lossy(&name).into_owned();
    if held != vm {
        return Err(FileError::OtherVm {
            path: path.to_owned(),
            held,
            vm: vm.to_owned(),
        });
    }
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
        let stream = memfd(&format!("fairvgpu-{vm}-restore-{slot}")).map_err(io)?;
        let mut out = File::from(stream.try_clone().map_err(io)?);
        let copied = std::io::copy(&mut (&mut r).take(len), &mut out).map_err(io)?;
        if copied != len {
            return Err(FileError::Tag(path.to_owned()));
        }
        lanes.push(Lane { slot, stream, len });
    }
    let TaggedReader { mut inner, tag } = r;
    let mut want = [0u8; 32];
    inner
        .read_exact(&mut want)
        .map_err(|_| FileError::Tag(path.to_owned()))?;
    let mut rest = [0u8; 1];
    if !matches!(inner.read(&mut rest), Ok(0)) || !tag.matches(&want) {
        return Err(FileError::Tag(path.to_owned()));
    }
    Ok(lanes)
}

/// A memfd named `name`, closed on exec.
pub fn memfd(name: &str) -> std::io::Result<OwnedFd> {
    nix::sys::memfd::memfd_create(name, nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(std::io::Error::from)
}

/// A writer that tags what passes.
struct Tagged<W: Write> {
    inner: W,
    tag: Tag,
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
    tag: Tag,
}

impl<R: Read> Read for TaggedReader<R> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(b)?;
        self.tag.update(&b[..k]);
        Ok(k)
    }
}

impl<R: Read> TaggedReader<R> {
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

#[cfg(test)]
mod tests;
