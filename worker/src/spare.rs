//! A spare worker's socket to the daemon: the daemon keeps one spare per
//! GPU started ahead (its executor open, a context made) and bound to no
//! VM; a guest process that claims a process slot with no worker gets one
//! bound to it. The spare says it is ready ([`say_ready`]), then gets its
//! [`SpareBinding`] with two fds, the slot's feed and the VM's memory
//! ledger ([`send_binding`], [`recv_order`]), over `SCM_RIGHTS` as the
//! feed passes the region; a restore's binding brings a third, the
//! checkpoint stream the slot's worker serves on from. Before its binding,
//! a spare may be given a *stage* ([`Order::Stage`]): the checkpoint stream
//! of a vGPU another host is about to hand over, whose modules it loads
//! ahead into its context (`serve/stage.rs`).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use wire::feed::{BindingError, SpareBinding, BINDING_MAX, SPARE_READY};

use crate::Error;

/// What the daemon's binding message did that it should not have.
#[derive(Debug, thiserror::Error)]
pub enum SpareError {
    /// The bytes are not a binding (see [`SpareBinding::decode`]).
    #[error(transparent)]
    Binding(#[from] BindingError),
    /// It came without the feed and the ledger (and the stream, for a
    /// restore), a stage without its stream, or either with more fds.
    #[error("spare binding: {0} fds, not the feed, the ledger and a restore's stream, or a stage's stream")]
    Fds(usize),
    /// The daemon closed the socket before a whole binding came.
    #[error("spare binding: the daemon closed the socket")]
    Closed,
}

/// Tells the daemon that the spare is ready to be bound.
pub fn say_ready(sock: &UnixStream) -> Result<(), Error> {
    transport::server::send_msg(sock, SPARE_READY << 40, None)?;
    Ok(())
}

/// Tells the daemon that the spare staged `modules` modules of the
/// checkpoint it was given.
pub fn say_staged(sock: &UnixStream, modules: usize) -> Result<(), Error> {
    let v = wire::feed::encode_value(wire::feed::SPARE_STAGED, modules as u64);
    transport::server::send_msg(sock, v, None)?;
    Ok(())
}

/// What a spare is bound with: the binding and its fds.
#[derive(Debug)]
pub struct Bound {
    /// The VM, its slot and whether it is a restore.
    pub binding: SpareBinding,
    /// The slot's feed.
    pub feed: OwnedFd,
    /// The VM's memory ledger.
    pub ledger: OwnedFd,
    /// The checkpoint stream a restore serves on from.
    pub stream: Option<OwnedFd>,
}

/// What a spare is told on its socket.
#[derive(Debug)]
pub enum Order {
    /// Load ahead the modules of `vm`'s checkpoint `stream`, then wait on.
    Stage {
        /// The VM whose vGPU is coming.
        vm: String,
        /// Its checkpoint stream (a memfd).
        stream: OwnedFd,
    },
    /// Serve this binding.
    Bind(Bound),
}

/// Sends `b` with the slot's `feed`, the VM's `ledger` and, for a restore,
/// the checkpoint `stream` (the daemon); `b.restore` is set from it.
pub fn send_binding(
    sock: &UnixStream,
    b: &SpareBinding,
    feed: &OwnedFd,
    ledger: &OwnedFd,
    stream: Option<&OwnedFd>,
) -> Result<(), Error> {
    let b = SpareBinding {
        restore: stream.is_some(),
        stage: false,
        ..b.clone()
    };
    let mut fds = vec![feed.as_raw_fd(), ledger.as_raw_fd()];
    fds.extend(stream.map(AsRawFd::as_raw_fd));
    send_with(sock, &b.encode(), &fds)
}

/// Sends a stage of `vm`'s checkpoint `stream` (the daemon, before any
/// binding; a spare that cannot use it ignores it).
pub fn send_stage(sock: &UnixStream, vm: &str, stream: &OwnedFd) -> Result<(), Error> {
    let b = SpareBinding {
        vm: vm.to_owned(),
        id: 0,
        slot: 0,
        declared: None,
        restore: false,
        stage: true,
    };
    send_with(sock, &b.encode(), &[stream.as_raw_fd()])
}

/// Sends `bytes` with `fds` as their first part's rights.
fn send_with(sock: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> Result<(), Error> {
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [IoSlice::new(&bytes[sent..])];
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if sent == 0 { &rights } else { &[] };
        sent +=
            sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).map_err(|e| {
                Error::Io {
                    what: "sending a spare its binding",
                    source: e.into(),
                }
            })?;
    }
    Ok(())
}

/// Waits for the next order (the spare): a binding, checked, with its
/// feed, ledger and (a restore's) stream fds, or a stage with its stream.
/// Any other number of fds, or bytes that do not read as a binding, is an
/// error (the spare then exits; the daemon starts a worker for the slot
/// instead).
pub fn recv_order(sock: &UnixStream) -> Result<Order, Error> {
    let mut buf = vec![0u8; SpareBinding::head_len()];
    let mut got = 0;
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut total = None;
    loop {
        let want = match total {
            Some(t) => t,
            None if got < buf.len() => buf.len(),
            None => {
                let t = SpareBinding::total_len(&buf).map_err(SpareError::from)?;
                buf.resize(t.min(BINDING_MAX), 0);
                total = Some(t);
                continue;
            }
        };
        if got >= want {
            break;
        }
        let mut iov = [IoSliceMut::new(&mut buf[got..want])];
        let mut space = nix::cmsg_space!([RawFd; 4]);
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| Error::Io {
            what: "receiving a spare's binding",
            source: e.into(),
        })?;
        for c in msg.cmsgs().map_err(|e| Error::Io {
            what: "a spare binding's fds",
            source: e.into(),
        })? {
            if let ControlMessageOwned::ScmRights(rights) = c {
                // SAFETY: the kernel just installed each of these in our
                // table for us; nothing else owns them.
                fds.extend(
                    rights
                        .into_iter()
                        .map(|f| unsafe { OwnedFd::from_raw_fd(f) }),
                );
            }
        }
        if msg.bytes == 0 {
            return Err(SpareError::Closed.into());
        }
        got += msg.bytes;
    }
    let b = SpareBinding::decode(&buf).map_err(SpareError::from)?;
    let n = fds.len();
    let mut it = fds.into_iter();
    match (it.next(), it.next(), it.next(), it.next()) {
        (Some(stream), None, None, None) if b.stage => Ok(Order::Stage { vm: b.vm, stream }),
        (Some(feed), Some(ledger), stream, None) if stream.is_some() == b.restore && !b.stage => {
            Ok(Order::Bind(Bound {
                binding: b,
                feed,
                ledger,
                stream,
            }))
        }
        _ => Err(SpareError::Fds(n).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> SpareBinding {
        SpareBinding {
            vm: "vm1".into(),
            id: 2,
            slot: 1,
            declared: None,
            restore: false,
            stage: false,
        }
    }

    /// The order received, which must be a binding.
    fn recv_binding(sock: &UnixStream) -> Result<Bound, Error> {
        match recv_order(sock)? {
            Order::Bind(b) => Ok(b),
            Order::Stage { .. } => panic!("a stage, not a binding"),
        }
    }

    fn memfd() -> OwnedFd {
        transport::shm::create_memfd("fvg-spare-test", 4096).unwrap()
    }

    #[test]
    fn a_binding_arrives_with_its_feed_and_ledger() {
        let (a, b) = UnixStream::pair().unwrap();
        send_binding(&a, &binding(), &memfd(), &memfd(), None).unwrap();
        let got = recv_binding(&b).unwrap();
        assert_eq!(got.binding, binding());
        assert!(got.stream.is_none());
    }

    #[test]
    fn a_restores_binding_brings_its_stream() {
        let (a, b) = UnixStream::pair().unwrap();
        let stream = memfd();
        std::io::Write::write_all(
            &mut &std::fs::File::from(stream.try_clone().unwrap()),
            b"FVG",
        )
        .unwrap();
        send_binding(&a, &binding(), &memfd(), &memfd(), Some(&stream)).unwrap();
        let got = recv_binding(&b).unwrap();
        assert!(got.binding.restore);
        let mut head = [0u8; 3];
        let f = std::fs::File::from(got.stream.expect("the stream"));
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut head, 0).unwrap();
        assert_eq!(&head, b"FVG", "the same memfd");
    }

    #[test]
    fn a_stage_brings_its_stream_alone_and_a_binding_follows() {
        let (a, b) = UnixStream::pair().unwrap();
        let stream = memfd();
        send_stage(&a, "vm1", &stream).unwrap();
        send_binding(&a, &binding(), &memfd(), &memfd(), None).unwrap();
        match recv_order(&b).unwrap() {
            Order::Stage { vm, .. } => assert_eq!(vm, "vm1"),
            Order::Bind(_) => panic!("a binding, not the stage"),
        }
        assert_eq!(recv_binding(&b).unwrap().binding, binding());
        // A stage with the feed and the ledger too is refused.
        let (a, b) = UnixStream::pair().unwrap();
        let stage = SpareBinding {
            stage: true,
            ..binding()
        };
        let (f, l) = (memfd(), memfd());
        send_raw(&a, &stage, &[f.as_raw_fd(), l.as_raw_fd()]);
        assert!(matches!(
            recv_order(&b),
            Err(Error::Spare(SpareError::Fds(2)))
        ));
    }

    /// Sends `b`'s bytes as they are with `fds`.
    fn send_raw(sock: &UnixStream, b: &SpareBinding, fds: &[RawFd]) {
        let bytes = b.encode();
        let iov = [IoSlice::new(&bytes)];
        let rights = [ControlMessage::ScmRights(fds)];
        sendmsg::<()>(sock.as_raw_fd(), &iov, &rights, MsgFlags::empty(), None).unwrap();
    }

    #[test]
    fn a_restore_without_its_stream_or_a_stream_without_a_restore_is_refused() {
        let (feed, ledger, stream) = (memfd(), memfd(), memfd());
        let restore = SpareBinding {
            restore: true,
            ..binding()
        };
        let (a, b) = UnixStream::pair().unwrap();
        send_raw(&a, &restore, &[feed.as_raw_fd(), ledger.as_raw_fd()]);
        assert!(matches!(
            recv_binding(&b),
            Err(Error::Spare(SpareError::Fds(2)))
        ));
        let (a, b) = UnixStream::pair().unwrap();
        let three = [feed.as_raw_fd(), ledger.as_raw_fd(), stream.as_raw_fd()];
        send_raw(&a, &binding(), &three);
        assert!(matches!(
            recv_binding(&b),
            Err(Error::Spare(SpareError::Fds(3)))
        ));
    }

    #[test]
    fn a_binding_without_its_fds_or_cut_short_is_refused() {
        // No fds at all.
        let (a, b) = UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut &a, &binding().encode()).unwrap();
        assert!(matches!(
            recv_binding(&b),
            Err(Error::Spare(SpareError::Fds(0)))
        ));
        // Cut short: the daemon closed the socket.
        let (a, b) = UnixStream::pair().unwrap();
        let bytes = binding().encode();
        std::io::Write::write_all(&mut &a, &bytes[..bytes.len() - 1]).unwrap();
        drop(a);
        assert!(matches!(
            recv_binding(&b),
            Err(Error::Spare(SpareError::Closed))
        ));
        // Bytes that are no binding.
        let (a, b) = UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut &a, &[0u8; 64]).unwrap();
        assert!(matches!(
            recv_binding(&b),
            Err(Error::Spare(SpareError::Binding(BindingError::Magic)))
        ));
    }
}
