//! A vGPU handed from one host's daemon to another's over TCP, when its VM
//! moves between hosts (the supervisor's `checkpoint.rs` decides when).
//!
//! ```text
//! receiver -> sender: "FVGPUHO2" | nonce (32 bytes, fresh)
//! sender -> receiver: purpose (1 byte: 0 the vGPU, 1 ahead) |
//!                     proof = HMAC-SHA-256(key, "fairvgpu handover" | nonce | purpose)
//! receiver -> sender: 2 (go on), or a verdict refusing it (below)
//! sender -> receiver: a save file (`save_file.rs`) with the region (none
//!                     ahead), its tag under the key over the nonce and every byte
//! receiver -> sender: verdict: 0 taken / 1 refused | length u16 | why (UTF-8)
//! ```
//!
//! A vGPU sent *ahead* is a checkpoint taken while its guest still runs on
//! the source: the receiver loads its modules into a spare, so that the
//! restore of the vGPU itself, during the guest's pause, finds them loaded
//! ([`Purpose::Ahead`]).
//!
//! Both hosts hold the same key (`[daemon] checkpoint_key_file`); a
//! receiver listens only with one. It reads nothing past the proof from a
//! peer without the key, nothing past its limits from one with it, and a
//! replayed stream fails its tag under a fresh nonce.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Duration;

use worker::checkpoint::Tag;

use crate::save_file::{self, FileLimits, Saved};

const HELLO: [u8; 8] = *b"FVGPUHO2";
/// The receiver's word that the proof matched.
const GO_ON: u8 = 2;
const PROOF: &[u8] = b"fairvgpu handover";
/// Longest reason a verdict gives, bytes.
const WHY_MAX: usize = 4096;
/// How long either side waits for the other's next bytes.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a receiver waits for its supervisor's word on what came.
const TAKE_WAIT: Duration = Duration::from_secs(60);
/// Peers a receiver serves at once; one past them is closed at once, so
/// that strangers opening connections cost a bounded number of threads.
const PEERS_AT_ONCE: usize = 4;

/// What a stream handed over is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The vGPU itself, its guest paused: the receiver serves on from it.
    Handover,
    /// A checkpoint taken while the guest still runs on the sender: the
    /// receiver loads its modules ahead of the handover.
    Ahead,
}

impl Purpose {
    fn byte(self) -> u8 {
        match self {
            Purpose::Handover => 0,
            Purpose::Ahead => 1,
        }
    }

    fn of(b: u8) -> Option<Purpose> {
        match b {
            0 => Some(Purpose::Handover),
            1 => Some(Purpose::Ahead),
            _ => None,
        }
    }
}

/// What a receiving daemon does with what came: the limits for a VM
/// (None: not here), and the supervisor's word on a stream that passed
/// (Ok: a line for the sender).
pub trait Receiver: Send + Sync + 'static {
    /// The limits a stream for `vm` must keep.
    fn limits(&self, vm: &str) -> Option<FileLimits>;
    /// Hands `saved`, sent for `purpose`, to the supervisor; its word
    /// comes on `answer`.
    fn arrived(&self, saved: Saved, purpose: Purpose, answer: Sender<Result<String, String>>);
}

/// Listens on `addr` for vGPUs handed over under `key`, one thread per
/// peer; what passes goes to `rx`.
pub fn listen(addr: &str, key: Vec<u8>, rx: Arc<dyn Receiver>) -> std::io::Result<()> {
    let l = TcpListener::bind(addr)?;
    tracing::info!(addr, "taking vGPUs handed over from other hosts");
    let key: Arc<[u8]> = key.into();
    let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("handover".into())
        .spawn(move || {
            use std::sync::atomic::Ordering;
            for s in l.incoming().flatten() {
                if busy.fetch_add(1, Ordering::AcqRel) >= PEERS_AT_ONCE {
                    busy.fetch_sub(1, Ordering::AcqRel);
                    let _ = verdict(&s, Err("this host takes another vGPU now; try again"));
                    continue;
                }
                let (key, rx, done) = (key.clone(), rx.clone(), busy.clone());
                let spawned = std::thread::Builder::new()
                    .name("handover-in".into())
                    .spawn(move || {
                        let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                        match receive(&s, &key, rx.as_ref()) {
                            Ok(line) => tracing::info!(peer, "{line}"),
                            Err(why) => {
                                tracing::warn!(peer, "vGPU handover refused: {why}");
                                let _ = verdict(&s, Err(&why));
                                linger(&s);
                            }
                        }
                        done.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    busy.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })?;
    Ok(())
}

/// One peer: hello, proof, stream, then the supervisor's word.
fn receive(s: &TcpStream, key: &[u8], rx: &dyn Receiver) -> Result<String, String> {
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let nonce = nonce().map_err(|e| format!("no nonce: {e}"))?;
    let mut w = s;
    w.write_all(&HELLO)
        .and_then(|()| w.write_all(&nonce))
        .map_err(|e| e.to_string())?;
    // Not buffered: the save file's reader reads ahead into its chunks.
    let mut r = s;
    let (mut said, mut proof) = ([0u8], [0u8; 32]);
    r.read_exact(&mut said)
        .and_then(|()| r.read_exact(&mut proof))
        .map_err(|e| format!("no proof: {e}"))?;
    if !proof_tag(key, &nonce, said[0]).matches(&proof) {
        return Err("the peer's proof does not match this host's key".into());
    }
    let purpose = Purpose::of(said[0]).ok_or_else(|| format!("purpose {} unknown", said[0]))?;
    w.write_all(&[GO_ON]).map_err(|e| e.to_string())?;
    let label = Path::new("the peer's stream");
    let t = std::time::Instant::now();
    let saved = save_file::read_from(&mut r, label, Some(key), &nonce, &|vm| rx.limits(vm))
        .map_err(|e| e.to_string())?;
    let vm = saved.vm.clone();
    tracing::debug!(
        vm,
        ms = t.elapsed().as_millis(),
        "a handed-over stream read and checked"
    );
    let (tx, word) = channel();
    rx.arrived(saved, purpose, tx);
    let r = word
        .recv_timeout(TAKE_WAIT)
        .unwrap_or_else(|_| Err(format!("{vm}: the daemon did not answer")));
    verdict(s, r.as_deref().map_err(String::as_str)).map_err(|e| e.to_string())?;
    r
}

/// How long a refusing receiver reads on, for the sender to take its
/// verdict and close.
const LINGER: Duration = Duration::from_secs(2);

/// After a refusal mid-stream: reads and drops what the sender still
/// sends, until it closes or [`LINGER`] passes. Closed with bytes unread,
/// the connection would be reset, and the verdict lost with it.
fn linger(mut s: &TcpStream) {
    let _ = s.shutdown(std::net::Shutdown::Write);
    let end = std::time::Instant::now() + LINGER;
    let mut sink = vec![0u8; 64 << 10];
    while let Some(left) = end.checked_duration_since(std::time::Instant::now()) {
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

/// Writes the receiver's verdict.
fn verdict(mut s: &TcpStream, r: Result<&str, &str>) -> std::io::Result<()> {
    let (code, why) = match r {
        Ok(w) => (0u8, w),
        Err(w) => (1u8, w),
    };
    let mut end = why.len().min(WHY_MAX);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    let len = u16::try_from(end).unwrap_or(u16::MAX);
    s.write_all(&[code])?;
    s.write_all(&len.to_le_bytes())?;
    s.write_all(&why.as_bytes()[..usize::from(len)])?;
    s.flush()
}

/// Hands `saved` to the daemon at `to` under `key`, for `purpose`: its
/// verdict's line, or why it did not take it.
pub fn send(to: &str, key: &[u8], saved: &Saved, purpose: Purpose) -> Result<String, String> {
    let addr = to
        .to_socket_addrs()
        .map_err(|e| format!("{to}: {e}"))?
        .next()
        .ok_or_else(|| format!("{to}: no address"))?;
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).map_err(|e| format!("{to}: {e}"))?;
    s.set_read_timeout(Some(IO_TIMEOUT + TAKE_WAIT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut hello = [0u8; 40];
    let not_one = || format!("{to} is not a fairvgpu daemon taking vGPUs");
    (&s).read_exact(&mut hello[..8]).map_err(|_| not_one())?;
    if hello[0] == 1 {
        // Refused before its hello (busy): a verdict of at least 5 bytes.
        let n = usize::from(u16::from_le_bytes([hello[1], hello[2]]));
        let mut why = hello[3..8].to_vec();
        why.resize(n.max(5), 0);
        (&s).read_exact(&mut why[5..]).map_err(|_| not_one())?;
        return Err(format!("{to} refused it: {}", printable(&why[..n])));
    }
    if hello[..8] != HELLO {
        return Err(not_one());
    }
    (&s).read_exact(&mut hello[8..])
        .map_err(|e| format!("{to}: no nonce: {e}"))?;
    let nonce = &hello[8..];
    let p = purpose.byte();
    (&s).write_all(&[p])
        .and_then(|()| (&s).write_all(&proof_tag(key, nonce, p).finish()))
        .map_err(|e| e.to_string())?;
    let mut head = [0u8; 3];
    (&s).read_exact(&mut head[..1])
        .map_err(|e| format!("{to}: no answer to the proof: {e}"))?;
    if head[0] == GO_ON {
        let t = std::time::Instant::now();
        // Not buffered: the save file's writer gathers a MiB at a time.
        let sent = save_file::write_to(&s, saved, Some(key), nonce);
        if let Ok((_, n)) = &sent {
            tracing::debug!(to, bytes = n, ms = t.elapsed().as_millis(), "a stream sent");
        }
        // A peer that refused mid-stream sent its verdict before closing.
        match (&s).read_exact(&mut head) {
            Ok(()) => {}
            Err(e) => {
                return Err(match sent {
                    Err(se) => format!("{to}: sending: {se}"),
                    Ok(_) => format!("{to}: no verdict: {e}"),
                })
            }
        }
    } else {
        (&s).read_exact(&mut head[1..])
            .map_err(|e| format!("{to}: {e}"))?;
    }
    verdict_after(&s, head, to)
}

/// The rest of a receiver's verdict after its first three bytes `head`
/// (word, reason's length): the reason, as its line or its refusal.
fn verdict_after(mut s: &TcpStream, head: [u8; 3], to: &str) -> Result<String, String> {
    let mut why = vec![0u8; usize::from(u16::from_le_bytes([head[1], head[2]]))];
    s.read_exact(&mut why).map_err(|e| format!("{to}: {e}"))?;
    let why = printable(&why);
    match head[0] {
        0 => Ok(why),
        _ => Err(format!("{to} refused it: {why}")),
    }
}

/// Words from another process (a peer, a worker) as UTF-8 text, anything
/// but printable text replaced, for a log line or an answer.
pub(crate) fn printable(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn proof_tag(key: &[u8], nonce: &[u8], purpose: u8) -> Tag {
    let mut t = Tag::new(Some(key));
    t.update(PROOF);
    t.update(nonce);
    t.update(&[purpose]);
    t
}

fn nonce() -> std::io::Result<[u8; 32]> {
    let mut n = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut n)?;
    Ok(n)
}

#[cfg(test)]
mod tests;
