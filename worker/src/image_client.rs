//! A worker's connection to the daemon's module image store (the store is
//! the daemon's `image_store`): images another VM's worker already loaded
//! come from it instead of over the ring.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use protocol::ImageKind;
use transport::server::{recv_msg, send_msg};
use wire::image::{header, FOUND, GET, MISSING, PUT};

use crate::sealed::SealedBytes;
use crate::{Error, ImageError};

/// A worker's side of the store.
#[derive(Debug)]
pub struct StoreClient {
    stream: UnixStream,
}

impl StoreClient {
    /// Connects to the store at `path` (before the worker is confined: a
    /// confined process cannot connect).
    pub fn connect(path: &Path) -> Result<StoreClient, Error> {
        let stream = UnixStream::connect(path).map_err(|source| Error::Io {
            what: "connecting to the image store",
            source,
        })?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|source| Error::Io {
                what: "image store socket",
                source,
            })?;
        Ok(StoreClient { stream })
    }

    /// Offers an image (kept if its bytes are of `hash`).
    pub fn put(
        &mut self,
        kind: ImageKind,
        hash: &[u8; 32],
        image: &SealedBytes,
    ) -> Result<(), Error> {
        send_msg(&self.stream, PUT, Some(image.fd().as_raw_fd()))?;
        self.send_header(kind, image.len() as u64, hash)
    }

    /// The image of `hash`, kind and length, if the store has it.
    pub fn get(
        &mut self,
        kind: ImageKind,
        len: u64,
        hash: &[u8; 32],
    ) -> Result<Option<SealedBytes>, Error> {
        send_msg(&self.stream, GET, None)?;
        self.send_header(kind, len, hash)?;
        match recv_msg(&self.stream)? {
            Some((FOUND, Some(fd))) => {
                let len = usize::try_from(len).map_err(|_| ImageError::TooLong)?;
                SealedBytes::from_fd(fd, len).map(Some)
            }
            Some((MISSING, _)) => Ok(None),
            _ => Err(ImageError::Nonsense.into()),
        }
    }

    fn send_header(&mut self, kind: ImageKind, len: u64, hash: &[u8; 32]) -> Result<(), Error> {
        self.stream
            .write_all(&header(kind, len, hash))
            .map_err(|source| Error::Io {
                what: "image store request",
                source,
            })
    }

    /// The connection (to tell it from others in tests).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }
}
