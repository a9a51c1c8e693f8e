//! Module images shared between the daemon's workers (every VM's), by
//! content: the second VM to load a library's fat binaries (hundreds of MB
//! for cuBLAS or cuDNN) gets them from here instead of over its ring, and
//! the bytes exist once on the host however many workers map them.
//!
//! A worker that received an image's bytes from its guest hands the daemon
//! a sealed memfd of them ([`worker::sealed`]) with the hash its guest will
//! ask by (`PUT`); the daemon hashes the bytes itself and keeps the fd only
//! if they match, so no worker can make another load anything but the
//! bytes of the hash it asks for. A worker whose guest asks for a hash its
//! own cache misses asks here (`GET`) and maps the fd it gets back.
//!
//! Bounded: at most `cap` bytes in all, and what each worker's connection
//! brought at most `quota` bytes. Making room evicts first images whose
//! worker is gone, then the least recently used of the one adding; never
//! another live worker's images, so one VM cannot push out another's.
//!
//! What a guest can learn here: whether some worker on the host has an
//! image of a hash it presents, i.e. only about images whose bytes it has
//! itself. Operators who want no such sharing set
//! `[daemon] share_images = false`.
//!
//! Messages on each worker's connection: the ivshmem framing (an `i64`
//! with an optional fd: [`PUT`] with the memfd or [`GET`]), then 48 bytes
//! `[kind u32][0 u32][len u64][hash 32]`. A `GET` is answered [`FOUND`]
//! with the fd or [`MISSING`]; a `PUT` is not answered.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::ImageKind;
use transport::server::{recv_msg, send_msg};

use crate::Error;
use wire::image::{parse, FOUND, GET, MISSING, PUT};
pub use worker::image_client::StoreClient;
use worker::sealed::SealedBytes;

/// Workers connected at once, at most (more are refused).
const MAX_CONNECTIONS: usize = 256;

/// Why the store refused an image a worker offered.
#[derive(Debug, thiserror::Error)]
pub enum ImageRefused {
    /// Its bytes do not hash to the hash it was offered under.
    #[error("bytes not of their hash")]
    NotOfItsHash,
    /// Keeping it would pass the store's size or the worker's quota.
    #[error("over the store's bounds")]
    OverBounds,
    /// Its length does not fit this host's address space.
    #[error("an image of {0} bytes")]
    TooLong(u64),
}

/// The store's figures, for the status and metrics.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Images kept.
    pub images: AtomicU64,
    /// Their bytes.
    pub bytes: AtomicU64,
    /// `GET`s answered with an image.
    pub hits: AtomicU64,
    /// `PUT`s refused (bytes not of their hash, not sealed, over quota).
    pub refused: AtomicU64,
}

struct Entry {
    kind: ImageKind,
    image: Arc<SealedBytes>,
    owner: u64,
    used: u64,
}

#[derive(Default)]
struct Images {
    map: HashMap<[u8; 32], Entry>,
    /// Bytes each connection brought (live ones only).
    live: HashMap<u64, u64>,
    bytes: u64,
    tick: u64,
}

impl Images {
    fn remove(&mut self, hash: &[u8; 32]) {
        if let Some(e) = self.map.remove(hash) {
            let n = e.image.len() as u64;
            self.bytes -= n;
            if let Some(b) = self.live.get_mut(&e.owner) {
                *b -= n;
            }
        }
    }

    /// Makes room for `len` more bytes from `owner` within `cap` and
    /// `quota`; false if it cannot without evicting another live owner's.
    fn make_room(&mut self, owner: u64, len: u64, cap: u64, quota: u64) -> bool {
        if len > quota || len > cap {
            return false;
        }
        loop {
            let mine = self.live.get(&owner).copied().unwrap_or(0);
            let over_cap = self.bytes + len > cap;
            if !over_cap && mine + len <= quota {
                return true;
            }
            // Orphans first (their worker is gone), then the adder's own,
            // least recently used first; the quota only ever evicts its own.
            let victim = self
                .map
                .iter()
                .filter(|(_, e)| {
                    let orphan = !self.live.contains_key(&e.owner);
                    (over_cap && mine + len <= quota && orphan) || e.owner == owner
                })
                .min_by_key(|(_, e)| (self.live.contains_key(&e.owner), e.used))
                .map(|(h, _)| *h);
            match victim {
                Some(h) => self.remove(&h),
                None => return false,
            }
        }
    }
}

struct Shared {
    images: Mutex<Images>,
    stats: Arc<StoreStats>,
    cap: u64,
    quota: u64,
    connections: AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Images> {
        self.images.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, i: &Images) {
        self.stats
            .images
            .store(i.map.len() as u64, Ordering::Relaxed);
        self.stats.bytes.store(i.bytes, Ordering::Relaxed);
    }

    fn put(&self, owner: u64, fd: OwnedFd, kind: ImageKind, len: u64, hash: [u8; 32]) {
        let ok = (|| {
            if len < protocol::CACHED_IMAGE || self.lock().map.contains_key(&hash) {
                return Ok(false);
            }
            let len_bytes = usize::try_from(len).map_err(|_| ImageRefused::TooLong(len))?;
            let image = SealedBytes::from_fd(fd, len_bytes)?;
            // Hashed outside the lock: another worker's GET waits for no one.
            if protocol::image_hash(image.bytes()) != hash {
                return Err(ImageRefused::NotOfItsHash.into());
            }
            let mut i = self.lock();
            if i.map.contains_key(&hash) {
                return Ok(false);
            }
            if !i.make_room(owner, len, self.cap, self.quota) {
                return Err(ImageRefused::OverBounds.into());
            }
            i.tick += 1;
            let used = i.tick;
            i.bytes += len;
            *i.live.entry(owner).or_default() += len;
            i.map.insert(
                hash,
                Entry {
                    kind,
                    image: Arc::new(image),
                    owner,
                    used,
                },
            );
            self.publish(&i);
            Ok::<_, Error>(true)
        })();
        if let Err(e) = ok {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(owner, "image store: a PUT refused: {e}");
        }
    }

    fn get(&self, kind: ImageKind, len: u64, hash: &[u8; 32]) -> Option<Arc<SealedBytes>> {
        let mut i = self.lock();
        i.tick += 1;
        let tick = i.tick;
        let e = i.map.get_mut(hash)?;
        if e.kind != kind || e.image.len() as u64 != len {
            return None;
        }
        e.used = tick;
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        Some(e.image.clone())
    }
}

/// The daemon's store, serving workers on a unix socket.
pub struct ImageStore {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    stats: Arc<StoreStats>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageStore")
            .field("path", &self.path)
            .finish()
    }
}

impl ImageStore {
    /// Serves at `path`: at most `cap` bytes in all, `quota` per worker.
    pub fn start(path: &Path, cap: u64, quota: u64) -> Result<ImageStore, Error> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|source| Error::Io {
            what: "binding the image store socket",
            source,
        })?;
        listener.set_nonblocking(true).map_err(|source| Error::Io {
            what: "image store socket",
            source,
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(StoreStats::default());
        let shared = Arc::new(Shared {
            images: Mutex::default(),
            stats: stats.clone(),
            cap,
            quota,
            connections: AtomicU64::new(0),
        });
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("image-store".into())
            .spawn(move || accept_loop(&listener, &shared, &stop2))
            .map_err(|source| Error::Io {
                what: "spawning the image store",
                source,
            })?;
        Ok(ImageStore {
            path: path.to_owned(),
            stop,
            stats,
            thread: Some(thread),
        })
    }

    /// Its socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its figures.
    pub fn stats(&self) -> &Arc<StoreStats> {
        &self.stats
    }
}

impl Drop for ImageStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(listener: &UnixListener, shared: &Arc<Shared>, stop: &AtomicBool) {
    let mut next_owner = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                if shared.connections.load(Ordering::Relaxed) >= MAX_CONNECTIONS as u64 {
                    continue;
                }
                next_owner += 1;
                let (owner, shared) = (next_owner, shared.clone());
                shared.connections.fetch_add(1, Ordering::Relaxed);
                let _ = s.set_nonblocking(false);
                let spawned = std::thread::Builder::new()
                    .name("image-store-conn".into())
                    .spawn(move || {
                        serve_worker(&s, owner, &shared);
                        shared.lock().live.remove(&owner);
                        shared.connections.fetch_sub(1, Ordering::Relaxed);
                    });
                if spawned.is_err() {
                    tracing::warn!("image store: could not serve a worker");
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One worker's requests until it goes (or sends anything malformed).
fn serve_worker(s: &UnixStream, owner: u64, shared: &Shared) {
    shared.lock().live.insert(owner, 0);
    let mut conn = s;
    while let Ok(Some((op, fd))) = recv_msg(s) {
        let mut h = [0u8; 48];
        if conn.read_exact(&mut h).is_err() {
            return;
        }
        let Some((kind, len, hash)) = parse(&h) else {
            return;
        };
        match (op, fd) {
            (PUT, Some(fd)) => shared.put(owner, fd, kind, len, hash),
            (GET, None) => {
                let r = match shared.get(kind, len, &hash) {
                    Some(image) => send_msg(s, FOUND, Some(image.fd().as_raw_fd())),
                    None => send_msg(s, MISSING, None),
                };
                if r.is_err() {
                    return;
                }
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(seed: u8) -> Vec<u8> {
        (0..protocol::CACHED_IMAGE + 100)
            .map(|i| i.to_le_bytes()[0].wrapping_mul(seed))
            .collect()
    }

    fn store(name: &str, cap: u64, quota: u64) -> (ImageStore, PathBuf) {
        let dir = scratch::dir(&format!("fvg-store-{name}"));
        let s = ImageStore::start(&dir.join("s.sock"), cap, quota).unwrap();
        (s, dir)
    }

    /// Waits for the store's thread to have taken a PUT.
    fn settle(s: &ImageStore, images: u64, refused: u64) {
        for _ in 0..200 {
            let st = s.stats();
            if st.images.load(Ordering::Relaxed) == images
                && st.refused.load(Ordering::Relaxed) == refused
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!(
            "store never reached {images} images, {refused} refused: {:?}",
            s.stats()
        );
    }

    #[test]
    fn another_worker_gets_what_one_put_and_forged_bytes_are_refused() {
        let (s, dir) = store("share", 1 << 30, 1 << 30);
        let (a, b) = (image(3), image(5));
        let (ha, hb) = (protocol::image_hash(&a), protocol::image_hash(&b));
        let mut one = StoreClient::connect(s.path()).unwrap();
        let mut two = StoreClient::connect(s.path()).unwrap();
        one.put(ImageKind::Ptx, &ha, &SealedBytes::new("a", &a).unwrap())
            .unwrap();
        // Bytes that are not of the hash they come with: refused.
        one.put(ImageKind::Ptx, &hb, &SealedBytes::new("x", &a).unwrap())
            .unwrap();
        settle(&s, 1, 1);
        let got = two
            .get(ImageKind::Ptx, a.len() as u64, &ha)
            .unwrap()
            .unwrap();
        assert_eq!(got.bytes(), &a[..]);
        assert!(two
            .get(ImageKind::Ptx, b.len() as u64, &hb)
            .unwrap()
            .is_none());
        // Another kind or length: a miss.
        assert!(two
            .get(ImageKind::Cubin, a.len() as u64, &ha)
            .unwrap()
            .is_none());
        assert!(two
            .get(ImageKind::Ptx, a.len() as u64 - 1, &ha)
            .unwrap()
            .is_none());
        assert_eq!(s.stats().hits.load(Ordering::Relaxed), 1);
        drop(s);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn one_worker_cannot_push_out_another_live_workers_images() {
        let n = image(1).len() as u64;
        // Room for three images in all, two per worker.
        let (s, dir) = store("bounds", 3 * n, 2 * n);
        let imgs: Vec<Vec<u8>> = (1..=5).map(image).collect();
        let hash = |i: usize| protocol::image_hash(&imgs[i]);
        let put = |c: &mut StoreClient, i: usize| {
            c.put(
                ImageKind::Ptx,
                &hash(i),
                &SealedBytes::new("i", &imgs[i]).unwrap(),
            )
            .unwrap()
        };
        let mut good = StoreClient::connect(s.path()).unwrap();
        let mut greedy = StoreClient::connect(s.path()).unwrap();
        put(&mut good, 0);
        put(&mut good, 1);
        settle(&s, 2, 0);
        // The greedy one's first fits; its next ones evict only its own,
        // and none of the good one's.
        put(&mut greedy, 2);
        settle(&s, 3, 0);
        put(&mut greedy, 3);
        put(&mut greedy, 4);
        // Taken once its own connection answers after it (the image count
        // stays 3 throughout, so it cannot tell; another connection's
        // question may be answered first).
        assert!(greedy.get(ImageKind::Ptx, n, &hash(4)).unwrap().is_some());
        settle(&s, 3, 0);
        for i in [0, 1, 4] {
            assert!(
                good.get(ImageKind::Ptx, n, &hash(i)).unwrap().is_some(),
                "{i}"
            );
        }
        // Once the good worker is gone, its images are the first to go.
        drop(good);
        std::thread::sleep(Duration::from_millis(50));
        put(&mut greedy, 2);
        put(&mut greedy, 3);
        settle(&s, 3, 0);
        assert!(greedy.get(ImageKind::Ptx, n, &hash(3)).unwrap().is_some());
        drop(s);
        let _ = std::fs::remove_dir_all(dir);
    }
}
