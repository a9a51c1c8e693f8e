//! A worker's checkpoint written in place into the daemon's memfd: the
//! stream's layout is known from the image's description, so the memfd is
//! sized and mapped first and the device memory the image left out
//! (`Checkpoint::checkpoint_shape`) is read straight into its place in the
//! stream. Device memory then crosses host memory once, not three times (a
//! buffer of its own, a buffered writer, the memfd). The stream is the one
//! [`super::write`] gives for the same image with its bytes, but for its
//! tag: it has none of its own ([`super::Check::Carried`]), as the daemon
//! carries it in a save file or handover under that one's tag.

use std::os::fd::OwnedFd;

use super::format::carried_front;
use super::mapped::{KeptMap, MappedMut};
use super::{FormatError, VgpuImage};
use crate::executor::checkpoint::LeftOut;

/// What reads a left-out blob into its place: the session's index in the
/// image, the blob, where.
pub type ReadLeftOut<'a> = dyn FnMut(usize, LeftOut, &mut [u8]) -> std::io::Result<()> + 'a;

/// One piece of the stream after its description.
enum Piece<'a> {
    /// Bytes the image holds.
    Held(&'a [u8]),
    /// `len` bytes the image left out: session `session`'s `blob`.
    LeftOut {
        session: usize,
        blob: LeftOut,
        len: usize,
    },
}

impl Piece<'_> {
    fn len(&self) -> usize {
        match self {
            Piece::Held(b) => b.len(),
            Piece::LeftOut { len, .. } => *len,
        }
    }
}

/// The pieces in the stream's order (as `format::blobs`): a blob with no
/// bytes that its length says has some was left out.
fn pieces(image: &VgpuImage) -> Result<Vec<Piece<'_>>, FormatError> {
    let mut v = Vec::new();
    for (session, s) in image.sessions.iter().enumerate() {
        for m in &s.context.modules {
            v.push(Piece::Held(&m.image));
            for g in &m.globals {
                v.push(device(session, &g.bytes, g.len, LeftOut::Global(g.addr))?);
            }
        }
        for a in &s.context.memory {
            v.push(device(
                session,
                &a.bytes,
                a.len,
                LeftOut::Allocation(a.addr),
            )?);
        }
        v.extend(s.context.graphs.iter().map(|g| Piece::Held(&g.nodes)));
    }
    Ok(v)
}

/// Session `session`'s device memory `blob` of `n` bytes: `bytes` held,
/// or left out where there are none.
fn device(session: usize, bytes: &[u8], n: u64, blob: LeftOut) -> Result<Piece<'_>, FormatError> {
    if !bytes.is_empty() || n == 0 {
        return Ok(Piece::Held(bytes));
    }
    let len =
        usize::try_from(n).map_err(|_| FormatError::Description(format!("a blob of {n} bytes")))?;
    Ok(Piece::LeftOut { session, blob, len })
}

/// Writes `image`'s stream (without a tag) into `memfd` from its start, each
/// left-out blob read by `read` (session index, blob, where) into its
/// place; the bytes written. A memfd already longer (one reused) is cut to
/// the stream. The memfd is mapped through `kept` where that maps it
/// already, and its mapping kept there for the next checkpoint where
/// `keep` (one sent ahead, a handover to follow).
pub fn write_in_place(
    memfd: &OwnedFd,
    image: &VgpuImage,
    read: &mut ReadLeftOut<'_>,
    kept: &mut Option<KeptMap>,
    keep: bool,
) -> Result<u64, FormatError> {
    let t0 = std::time::Instant::now();
    let front = carried_front(image)?;
    let pieces = pieces(image)?;
    let total = front.len() + pieces.iter().map(Piece::len).sum::<usize>() + 32;
    MappedMut::reuse(kept, memfd, total, keep, |map| {
        let buf = map.bytes_mut();
        let create_ms = crate::millis(t0.elapsed());
        buf[..front.len()].copy_from_slice(&front);
        let mut at = front.len();
        for p in &pieces {
            let n = p.len();
            let dst = &mut buf[at..at + n];
            match p {
                Piece::Held(b) => dst.copy_from_slice(b),
                Piece::LeftOut { session, blob, .. } => read(*session, *blob, dst)?,
            }
            at += n;
        }
        // No tag of its own; a reused memfd's old bytes are not left there.
        buf[at..at + 32].fill(0);
        tracing::debug!(
            create_ms,
            fill_ms = crate::millis(t0.elapsed()) - create_ms,
            "checkpoint stream laid out and filled"
        );
        Ok(total as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{read, write, Check, SessionImage};
    use crate::executor::checkpoint::{Allocation, ContextImage, GlobalImage, ModuleImage};
    use std::fs::File;
    use std::io::{Read, Seek};

    fn memfd() -> OwnedFd {
        let flags = nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING;
        nix::sys::memfd::memfd_create(c"in-place-test", flags).unwrap()
    }

    fn image(with_bytes: bool) -> VgpuImage {
        let bytes = |b: u8, n: usize| {
            if with_bytes {
                vec![b; n].into()
            } else {
                Default::default()
            }
        };
        let context = ContextImage {
            next_handle: 9,
            memory: vec![
                Allocation {
                    addr: 0x6000_0000_0000,
                    len: 5 << 20,
                    bytes: bytes(7, 5 << 20),
                },
                Allocation {
                    addr: 0x6000_0060_0000,
                    len: 3,
                    bytes: bytes(8, 3),
                },
            ],
            modules: vec![ModuleImage {
                handle: 2,
                ptx: true,
                len: 4,
                globals: vec![GlobalImage {
                    name: "g".into(),
                    addr: 0x7000,
                    len: 4,
                    bytes: bytes(9, 4),
                }],
                image: b"ptx\0".to_vec().into(),
            }],
            ..ContextImage::default()
        };
        VgpuImage {
            sessions: vec![SessionImage {
                pid: 4,
                context,
                ..SessionImage::default()
            }],
            ..VgpuImage::default()
        }
    }

    fn stream_of(fd: &OwnedFd) -> Vec<u8> {
        let mut f = File::from(fd.try_clone().unwrap());
        f.rewind().unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn a_stream_written_in_place_is_the_stream_written_whole() {
        let mut whole = Vec::new();
        write(&mut whole, &image(true), None).unwrap();
        // A new memfd, then the same one again, longer than the stream (as
        // one a checkpoint sent ahead filled), through the mapping kept.
        let fd = memfd();
        let mut kept = None;
        for round in 0..2 {
            if round == 1 {
                File::from(fd.try_clone().unwrap())
                    .set_len(64 << 20)
                    .unwrap();
            }
            let mut asked = Vec::new();
            let n = write_in_place(
                &fd,
                &image(false),
                &mut |s, blob, dst| {
                    asked.push((s, blob, dst.len()));
                    let b = match blob {
                        LeftOut::Allocation(0x6000_0000_0000) => 7,
                        LeftOut::Allocation(_) => 8,
                        LeftOut::Global(_) => 9,
                    };
                    dst.fill(b);
                    Ok(())
                },
                &mut kept,
                round == 0,
            )
            .unwrap();
            assert_eq!(kept.is_some(), round == 0, "kept only where asked");
            let mut got = stream_of(&fd);
            if round == 0 {
                // Kept for a handover: room past the stream, zeros.
                assert!(got.len() > whole.len());
                assert!(got[whole.len()..].iter().all(|&b| b == 0));
                got.truncate(whole.len());
            }
            assert_eq!(n, got.len() as u64, "cut to the stream once not kept");
            // The same bytes but for its flags (no tag of its own) and tag.
            let (end, tag) = got.split_at(got.len() - 32);
            assert!(end[..12] == whole[..12], "round {round}");
            assert_eq!(end[12..16], 2u32.to_le_bytes(), "flagged carried");
            assert!(end[16..] == whole[16..whole.len() - 32], "round {round}");
            assert_eq!(tag, [0; 32], "no tag, none left of the reused memfd's");
            assert_eq!(
                asked,
                [
                    (0, LeftOut::Global(0x7000), 4),
                    (0, LeftOut::Allocation(0x6000_0000_0000), 5 << 20),
                    (0, LeftOut::Allocation(0x6000_0060_0000), 3),
                ]
            );
            let back = read(&mut got.as_slice(), Check::Carried, &Default::default()).unwrap();
            assert_eq!(back, image(true));
            // Read as a stream that must carry its own tag, it is refused.
            let own = read(&mut got.as_slice(), Check::Own(None), &Default::default());
            assert!(own.unwrap_err().to_string().contains("no tag of its own"));
        }
    }

    #[test]
    fn a_failed_read_fails_the_write() {
        let fd = memfd();
        let mut kept = None;
        let e = write_in_place(
            &fd,
            &image(false),
            &mut |_, _, _| Err(std::io::Error::other("the device said no")),
            &mut kept,
            true,
        )
        .unwrap_err();
        assert!(e.to_string().contains("the device said no"), "{e}");
        assert!(kept.is_none(), "a failed write keeps nothing");
    }
}
