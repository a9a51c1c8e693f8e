//! Module images this vGPU's processes loaded, by content hash
//! ([`protocol::image_hash`]), so that a process loading an image another
//! already sent (a library's fat binaries, hundreds of MB for the ML
//! libraries) sends the hash and not the bytes (`ModuleLoadCached`).
//!
//! The host computes every hash itself from the bytes it received, so a
//! guest cannot make another process load an image other than the one it
//! hashed. The cache is per vGPU (one tenant's processes), bounded in bytes
//! (`[daemon] image_cache_mib`), the least recently used image going first;
//! its bytes are part of the worker's resident memory in the status.
//!
//! Images are kept in sealed memfds ([`crate::sealed`]) and offered to the
//! daemon's store (the daemon's `image_store`), where the other VMs' workers
//! find them: a hash this cache misses is asked of the store before the
//! guest is told to send the bytes.

use std::collections::HashMap;
use std::sync::Arc;

use protocol::ImageKind;

use crate::image_client::StoreClient;
use crate::sealed::SealedBytes;

/// One cached image.
#[derive(Debug)]
struct Entry {
    kind: ImageKind,
    image: Arc<SealedBytes>,
    used: u64,
}

/// The cache.
#[derive(Debug, Default)]
pub(super) struct ImageCache {
    images: HashMap<[u8; 32], Entry>,
    bytes: u64,
    cap: u64,
    tick: u64,
    /// The daemon's store, when images are shared between VMs.
    store: Option<StoreClient>,
}

impl ImageCache {
    /// A cache of at most `cap` bytes (0: none), sharing through `store`.
    pub fn new(cap: u64, store: Option<StoreClient>) -> ImageCache {
        ImageCache {
            cap,
            store: store.filter(|_| cap > 0),
            ..Default::default()
        }
    }

    /// The image of `hash`, if held (here or in the daemon's store) and of
    /// that kind and length.
    pub fn get(&mut self, hash: &[u8; 32], kind: ImageKind, len: u64) -> Option<Arc<SealedBytes>> {
        self.tick += 1;
        if let Some(e) = self.images.get_mut(hash) {
            if e.kind != kind || e.image.len() as u64 != len {
                return None;
            }
            e.used = self.tick;
            return Some(e.image.clone());
        }
        if !self.keeps(len) {
            return None;
        }
        let store = self.store.as_mut()?;
        match store.get(kind, len, hash) {
            Ok(Some(image)) => {
                let image = Arc::new(image);
                self.keep(*hash, kind, image.clone());
                Some(image)
            }
            Ok(None) => None,
            Err(e) => {
                // The daemon is going away, or broke the protocol: go on
                // without it.
                tracing::warn!("image store: {e}; images are no longer shared");
                self.store = None;
                None
            }
        }
    }

    /// Whether an image of `len` bytes is one this cache holds: not smaller
    /// than guests ask for by hash, not larger than the cache.
    fn keeps(&self, len: u64) -> bool {
        (protocol::CACHED_IMAGE..=self.cap).contains(&len)
    }

    /// Keeps `image` (loaded successfully) under its hash and offers it to
    /// the store; one larger than the cache, or smaller than guests ask for
    /// by hash ([`protocol::CACHED_IMAGE`]), is not kept (nor hashed).
    pub fn insert(&mut self, kind: ImageKind, image: &[u8]) {
        let len = image.len() as u64;
        if !self.keeps(len) {
            return;
        }
        let hash = protocol::image_hash(image);
        self.tick += 1;
        if let Some(e) = self.images.get_mut(&hash) {
            e.used = self.tick;
            return;
        }
        let sealed = match SealedBytes::new("fairvgpu-image", image) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                tracing::warn!("keeping a module image: {e}");
                return;
            }
        };
        if let Some(store) = self.store.as_mut() {
            if let Err(e) = store.put(kind, &hash, &sealed) {
                tracing::warn!("image store: {e}; images are no longer shared");
                self.store = None;
            }
        }
        self.keep(hash, kind, sealed);
    }

    fn keep(&mut self, hash: [u8; 32], kind: ImageKind, image: Arc<SealedBytes>) {
        let len = image.len() as u64;
        while self.bytes + len > self.cap {
            let Some((&oldest, _)) = self.images.iter().min_by_key(|(_, e)| e.used) else {
                break;
            };
            if let Some(e) = self.images.remove(&oldest) {
                self.bytes -= e.image.len() as u64;
            }
        }
        self.bytes += len;
        self.images.insert(
            hash,
            Entry {
                kind,
                image,
                used: self.tick,
            },
        );
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_come_back_by_hash_kind_and_length_and_the_oldest_go_first() {
        let k = protocol::CACHED_IMAGE;
        let n = crate::usize_from(k);
        let mut c = ImageCache::new(2 * k + k / 2, None);
        let (a, b, d) = (vec![1u8; n], vec![2u8; n], vec![3u8; n]);
        c.insert(ImageKind::Cubin, &a);
        c.insert(ImageKind::Ptx, &b);
        assert_eq!(c.bytes(), 2 * k);
        let ha = protocol::image_hash(&a);
        assert_eq!(
            c.get(&ha, ImageKind::Cubin, k)
                .as_deref()
                .map(SealedBytes::bytes),
            Some(&a[..])
        );
        assert!(c.get(&ha, ImageKind::Ptx, k).is_none(), "another kind");
        assert!(
            c.get(&ha, ImageKind::Cubin, k - 1).is_none(),
            "another length"
        );
        // `a` was used last: `b` makes room for `d`.
        c.insert(ImageKind::Cubin, &d);
        assert_eq!(c.bytes(), 2 * k);
        assert!(c
            .get(&protocol::image_hash(&b), ImageKind::Ptx, k)
            .is_none());
        assert!(c.get(&ha, ImageKind::Cubin, k).is_some());
        // Too large for the cache, or smaller than guests ask for by hash:
        // not kept, nothing dropped.
        c.insert(ImageKind::Cubin, &vec![9u8; 2 * n + n / 2 + 1]);
        let small = vec![8u8; n - 1];
        c.insert(ImageKind::Cubin, &small);
        assert_eq!(c.bytes(), 2 * k);
        assert!(c
            .get(&protocol::image_hash(&small), ImageKind::Cubin, k - 1)
            .is_none());
        assert!(ImageCache::new(0, None)
            .get(&ha, ImageKind::Cubin, k)
            .is_none());
    }
}
