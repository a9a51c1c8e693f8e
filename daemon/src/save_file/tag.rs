//! A save file's tag, its bytes hashed in chunks on several threads.
//!
//! One HMAC-SHA-256 over every byte runs on one thread, about 1.6 GB/s on
//! an H200 host: a 300 MB handover spent about 190 ms on it on each side,
//! within the guest's pause. Here each chunk of [`CHUNK`] bytes gets its
//! own tag (under the same key, over its index and bytes) on a thread of
//! its own, and the file's tag is taken over the chunks' tags in order and
//! the stream's length. Chunks start at fixed offsets, so the stream and
//! its tag bind each other as a tag over every byte does.
//!
//! The chunk being filled is also the stream's buffer: a reader reads
//! ahead into it and passes the bytes on from there, a writer gathers its
//! writes in it and writes them out from there (`save_file.rs`), so no
//! byte is copied for the tag alone. Chunks' buffers are used again once
//! hashed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;

use worker::checkpoint::Tag;

/// Bytes of one chunk.
pub(super) const CHUNK: usize = 4 << 20;

/// At most this many chunks are hashed at once (bounded by the host's
/// CPUs too): the memory held is this many chunks.
const AT_ONCE: usize = 8;

/// A chunk being hashed: it gives its tag and its buffer back.
type Hashing = JoinHandle<([u8; 32], Arc<Vec<u8>>)>;

/// A tag being taken over the bytes that pass (see the module's doc).
pub(super) struct ChunkTag {
    key: Option<Arc<[u8]>>,
    /// Over the nonce, then each chunk's tag, then the length.
    outer: Tag,
    /// The chunk being filled: [`CHUNK`] bytes, the first `filled` of
    /// them taken in. A reader may read ahead into the rest ([`room`]).
    ///
    /// [`room`]: ChunkTag::room
    buf: Vec<u8>,
    filled: usize,
    /// Chunks' buffers hashed and given back, for the next chunks.
    free: Vec<Vec<u8>>,
    /// Chunks handed out so far.
    chunks: u64,
    /// Bytes taken in.
    len: u64,
    /// Chunks being hashed, oldest first; each gives its buffer back.
    hashing: VecDeque<Hashing>,
    at_once: usize,
}

impl std::fmt::Debug for ChunkTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkTag")
            .field("keyed", &self.key.is_some())
            .field("chunks", &self.chunks)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl ChunkTag {
    /// A tag under `key` (SHA-256 where none), over `nonce` first.
    pub fn new(key: Option<&[u8]>, nonce: &[u8]) -> ChunkTag {
        let mut outer = Tag::new(key);
        outer.update(b"fvgpu-save-file");
        outer.update(&(nonce.len() as u64).to_le_bytes());
        outer.update(nonce);
        ChunkTag {
            key: key.map(Arc::from),
            outer,
            buf: vec![0; CHUNK],
            filled: 0,
            free: Vec::new(),
            chunks: 0,
            len: 0,
            hashing: VecDeque::new(),
            at_once: std::thread::available_parallelism()
                .map_or(1, std::num::NonZeroUsize::get)
                .clamp(1, AT_ONCE),
        }
    }

    /// Takes in the next bytes (a copy of them).
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = self.room();
            let k = room.len().min(bytes.len());
            room[..k].copy_from_slice(&bytes[..k]);
            bytes = &bytes[k..];
            self.took(k);
        }
    }

    /// The rest of the chunk being filled, never empty: a reader reads
    /// ahead into it, then takes in what it passes on ([`ChunkTag::took`]),
    /// so the bytes are copied nowhere for the tag.
    pub fn room(&mut self) -> &mut [u8] {
        &mut self.buf[self.filled..]
    }

    /// The first `n` bytes of [`ChunkTag::room`] (at most its length).
    pub fn ahead(&self, n: usize) -> &[u8] {
        self.recent(0, n)
    }

    /// The last `back` bytes taken in and the first `fwd` of
    /// [`ChunkTag::room`], in one piece (a writer writes them out from here).
    pub fn recent(&self, back: usize, fwd: usize) -> &[u8] {
        let from = self.filled.saturating_sub(back);
        &self.buf[from..(self.filled + fwd).min(CHUNK)]
    }

    /// Takes in the first `n` bytes of [`ChunkTag::room`] (at most its
    /// length); the chunk goes to be hashed once full.
    pub fn took(&mut self, n: usize) {
        let n = n.min(CHUNK - self.filled);
        self.filled += n;
        self.len += n as u64;
        if self.filled == CHUNK {
            self.hand_out();
        }
    }

    /// The full chunk goes to a thread of its own; the oldest one hashing
    /// is waited for while as many as may be are.
    fn hand_out(&mut self) {
        while self.hashing.len() >= self.at_once {
            self.take_oldest();
        }
        let next = self.free.pop().unwrap_or_else(|| vec![0; CHUNK]);
        let bytes = Arc::new(std::mem::replace(&mut self.buf, next));
        self.filled = 0;
        let (key, index, theirs) = (self.key.clone(), self.chunks, Arc::clone(&bytes));
        self.chunks += 1;
        let spawned = std::thread::Builder::new()
            .name("save-file-tag".into())
            .spawn(move || (chunk_tag(key.as_deref(), index, &theirs), theirs));
        match spawned {
            Ok(h) => self.hashing.push_back(h),
            // No thread to be had: hashed here, in order all the same.
            Err(_) => {
                self.drain();
                let t = chunk_tag(self.key.as_deref(), index, &bytes);
                self.outer.update(&t);
            }
        }
        self.give_back(bytes);
    }

    /// A chunk's buffer, once no thread holds it, kept for a next chunk.
    fn give_back(&mut self, bytes: Arc<Vec<u8>>) {
        if let Ok(v) = Arc::try_unwrap(bytes) {
            self.free.push(v);
        }
    }

    fn take_oldest(&mut self) {
        if let Some(h) = self.hashing.pop_front() {
            // A hashing thread does not panic; were it to, the tag must
            // not match.
            let t = match h.join() {
                Ok((t, bytes)) => {
                    self.give_back(bytes);
                    t
                }
                Err(_) => [0xff; 32],
            };
            self.outer.update(&t);
        }
    }

    fn drain(&mut self) {
        while !self.hashing.is_empty() {
            self.take_oldest();
        }
    }

    /// The outer tag, every chunk (the last, short one included) and the
    /// length taken in.
    fn done(mut self) -> Tag {
        self.drain();
        if self.filled > 0 {
            let t = chunk_tag(self.key.as_deref(), self.chunks, &self.buf[..self.filled]);
            self.outer.update(&t);
        }
        self.outer.update(&self.len.to_le_bytes());
        self.outer
    }

    /// The tag over every byte taken in.
    pub fn finish(self) -> [u8; 32] {
        self.done().finish()
    }

    /// Whether `tag` is this one's (in constant time where keyed).
    pub fn matches(self, tag: &[u8; 32]) -> bool {
        self.done().matches(tag)
    }
}

/// Chunk `index`'s own tag.
fn chunk_tag(key: Option<&[u8]>, index: u64, bytes: &[u8]) -> [u8; 32] {
    let mut t = Tag::new(key);
    t.update(b"fvgpu-save-chunk");
    t.update(&index.to_le_bytes());
    t.update(bytes);
    t.finish()
}

#[cfg(test)]
mod tests {
    use super::{ChunkTag, CHUNK};

    fn tag(key: Option<&[u8]>, nonce: &[u8], pieces: &[&[u8]]) -> [u8; 32] {
        let mut t = ChunkTag::new(key, nonce);
        for p in pieces {
            t.update(p);
        }
        t.finish()
    }

    #[test]
    fn the_tag_is_the_bytes_not_how_they_came() {
        let data: Vec<u8> = (0..3 * CHUNK + 12_345)
            .map(|i| (i * 7 % 251).to_le_bytes()[0])
            .collect();
        let whole = tag(Some(b"k"), b"n", &[&data]);
        let (a, b) = data.split_at(CHUNK - 1);
        let (b, c) = b.split_at(CHUNK + 2);
        assert_eq!(whole, tag(Some(b"k"), b"n", &[a, b, c]));
        let mut bytewise = ChunkTag::new(Some(b"k"), b"n");
        for piece in data.chunks(999_983) {
            bytewise.update(piece);
        }
        assert!(bytewise.matches(&whole));
    }

    #[test]
    fn any_change_changes_the_tag() {
        let data: Vec<u8> = (0..2 * CHUNK + 5)
            .map(|i| (i % 13).to_le_bytes()[0])
            .collect();
        let t = tag(Some(b"k"), b"n", &[&data]);
        // A byte in a middle chunk, the stream cut at a chunk's end or
        // grown by a zero, another key, another nonce, no key.
        let mut flipped = data.clone();
        flipped[CHUNK + 17] ^= 1;
        assert_ne!(t, tag(Some(b"k"), b"n", &[&flipped]));
        assert_ne!(t, tag(Some(b"k"), b"n", &[&data[..2 * CHUNK]]));
        let mut longer = data.clone();
        longer.push(0);
        assert_ne!(t, tag(Some(b"k"), b"n", &[&longer]));
        assert_ne!(t, tag(Some(b"j"), b"n", &[&data]));
        assert_ne!(t, tag(Some(b"k"), b"m", &[&data]));
        assert_ne!(t, tag(None, b"n", &[&data]));
        // Empty and exactly one chunk differ from their neighbours.
        assert_ne!(tag(None, b"", &[]), tag(None, b"", &[&[0]]));
        assert_ne!(
            tag(None, b"", &[&data[..CHUNK]]),
            tag(None, b"", &[&data[..CHUNK + 1]])
        );
    }
}
