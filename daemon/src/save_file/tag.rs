//! A save file's tag, its bytes hashed in chunks on several threads.
//!
//! One HMAC-SHA-256 over every byte runs on one thread, about 1.6 GB/s on
//! an H200 host: a 300 MB handover spent about 190 ms on it on each side,
//! within the guest's pause. Here each chunk of [`CHUNK`] bytes gets its
//! own tag (under the same key, over its index and bytes) on a thread of
//! its own, and the file's tag is taken over the chunks' tags in order and
//! the stream's length. Chunks start at fixed offsets, so the stream and
//! its tag bind each other as a tag over every byte does.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;

use worker::checkpoint::Tag;

/// Bytes of one chunk.
pub(super) const CHUNK: usize = 4 << 20;

/// At most this many chunks are hashed at once (bounded by the host's
/// CPUs too): the memory held is this many chunks.
const AT_ONCE: usize = 8;

/// A tag being taken over the bytes that pass (see the module's doc).
pub(super) struct ChunkTag {
    key: Option<Arc<[u8]>>,
    /// Over the nonce, then each chunk's tag, then the length.
    outer: Tag,
    /// The chunk being filled.
    buf: Vec<u8>,
    /// Chunks handed out so far.
    chunks: u64,
    /// Bytes taken in.
    len: u64,
    /// Chunks being hashed, oldest first.
    hashing: VecDeque<JoinHandle<[u8; 32]>>,
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
            buf: Vec::with_capacity(CHUNK),
            chunks: 0,
            len: 0,
            hashing: VecDeque::new(),
            at_once: std::thread::available_parallelism()
                .map_or(1, std::num::NonZeroUsize::get)
                .clamp(1, AT_ONCE),
        }
    }

    /// Takes in the next bytes.
    pub fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        while !bytes.is_empty() {
            let k = (CHUNK - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..k]);
            bytes = &bytes[k..];
            if self.buf.len() == CHUNK {
                self.hand_out();
            }
        }
    }

    /// The full chunk in `buf` goes to a thread of its own; the oldest one
    /// hashing is waited for while as many as may be are.
    fn hand_out(&mut self) {
        while self.hashing.len() >= self.at_once {
            self.take_oldest();
        }
        let data = Arc::new(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        let (key, bytes, index) = (self.key.clone(), Arc::clone(&data), self.chunks);
        self.chunks += 1;
        match std::thread::Builder::new()
            .name("save-file-tag".into())
            .spawn(move || chunk_tag(key.as_deref(), index, &bytes))
        {
            Ok(h) => self.hashing.push_back(h),
            // No thread to be had: hashed here, in order all the same.
            Err(_) => {
                self.drain();
                let t = chunk_tag(self.key.as_deref(), index, &data);
                self.outer.update(&t);
            }
        }
    }

    fn take_oldest(&mut self) {
        if let Some(h) = self.hashing.pop_front() {
            // A hashing thread does not panic; were it to, the tag must
            // not match.
            let t = h.join().unwrap_or([0xff; 32]);
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
        if !self.buf.is_empty() {
            let t = chunk_tag(self.key.as_deref(), self.chunks, &self.buf);
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
