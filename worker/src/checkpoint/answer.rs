//! A worker's answers to its daemon about checkpoints, over the feed: the
//! stream written into the memfd the daemon gave (`CHECKPOINTED`), or why
//! there is none (`CHECKPOINT_FAILED`, the reason in the memfd), and that
//! a worker started from a checkpoint serves on (`RESTORED`).

use std::fs::File;
use std::io::{Seek, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use transport::server::send_msg;
use wire::feed::{encode_value, CHECKPOINTED, CHECKPOINT_FAILED, CHECKPOINT_WHY_MAX, RESTORED};

use super::VgpuImage;

/// Writes `image`'s stream into `memfd` in place, each blob it left out
/// read by `read` (`in_place.rs`; through `kept`'s mapping, kept where
/// `keep`), and says so on `back`; if it cannot be written, says why
/// instead.
pub fn taken(
    memfd: OwnedFd,
    back: &UnixStream,
    image: &VgpuImage,
    read: &mut super::in_place::ReadLeftOut<'_>,
    (kept, keep): (&mut Option<super::KeptMap>, bool),
) {
    let t = std::time::Instant::now();
    match super::write_in_place(&memfd, image, read, kept, keep) {
        Ok(n) => {
            tracing::debug!(
                bytes = n,
                ms = crate::millis(t.elapsed()),
                "checkpoint stream written"
            );
            let _ = send_msg(back, encode_value(CHECKPOINTED, n), None);
        }
        Err(e) => failed_in(
            File::from(memfd),
            back,
            &format!("writing the checkpoint: {e}"),
        ),
    }
}

/// Writes `why` into `memfd` (cut at [`CHECKPOINT_WHY_MAX`] bytes, on a
/// character's boundary) and says on `back` that there is no checkpoint.
pub fn failed(memfd: OwnedFd, back: &UnixStream, why: &str) {
    failed_in(File::from(memfd), back, why);
}

fn failed_in(mut f: File, back: &UnixStream, why: &str) {
    let mut end = why.len().min(usize::from(CHECKPOINT_WHY_MAX));
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    let why = &why.as_bytes()[..end];
    // Over its start, not cut: a restore's stream may be sealed against
    // shrinking (`mapped.rs`); the message says how many bytes are the
    // reason.
    let ok = f.rewind().and_then(|()| f.write_all(why));
    let n = if ok.is_ok() { why.len() as u64 } else { 0 };
    let _ = send_msg(back, encode_value(CHECKPOINT_FAILED, n), None);
}

/// Says on `back` that the worker serves on from its checkpoint, with how
/// many of its modules a spare had loaded ahead.
pub fn restored(back: &UnixStream, ahead: usize) {
    let _ = send_msg(back, encode_value(RESTORED, ahead as u64), None);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use transport::server::recv_msg;

    fn memfd() -> (OwnedFd, File) {
        let fd =
            nix::sys::memfd::memfd_create(c"ckp-test", nix::sys::memfd::MFdFlags::empty()).unwrap();
        let dup = fd.try_clone().unwrap();
        (fd, File::from(dup))
    }

    #[test]
    fn a_checkpoint_is_written_whole_and_its_length_said() {
        let (fd, mut f) = memfd();
        let (a, b) = UnixStream::pair().unwrap();
        let mut kept = None;
        taken(
            fd,
            &a,
            &VgpuImage::default(),
            &mut |_, _, _| unreachable!("an image with no memory leaves none out"),
            (&mut kept, false),
        );
        assert!(kept.is_none(), "not kept unless asked");
        let (v, _) = recv_msg(&b).unwrap().unwrap();
        assert_eq!(v >> 40, CHECKPOINTED);
        let mut bytes = Vec::new();
        f.rewind().unwrap();
        f.read_to_end(&mut bytes).unwrap();
        assert_eq!(wire::feed::decode_value(v), bytes.len() as u64);
        let back = super::super::read(
            &mut &bytes[..],
            super::super::Check::Carried,
            &Default::default(),
        )
        .unwrap();
        assert_eq!(back, VgpuImage::default());
    }

    #[test]
    fn a_reason_is_cut_at_its_most_on_a_character() {
        let (fd, mut f) = memfd();
        let (a, b) = UnixStream::pair().unwrap();
        let why = "é".repeat(usize::from(CHECKPOINT_WHY_MAX));
        failed(fd, &a, &why);
        let (v, _) = recv_msg(&b).unwrap().unwrap();
        assert_eq!(v >> 40, CHECKPOINT_FAILED);
        let mut text = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut text).unwrap();
        assert_eq!(wire::feed::decode_value(v), text.len() as u64);
        assert!(
            text.len() <= usize::from(CHECKPOINT_WHY_MAX)
                && text.len() >= usize::from(CHECKPOINT_WHY_MAX) - 1
        );
    }
}
