//! A worker's side of the grant service: it asks for the grant, waits for
//! it, knows when its slice is over (extensions counted) and releases it,
//! reporting what it used and its live figures (see the module above for
//! the messages).

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use wire::grant::{
    decode, encode, Report, ALONE, CHARGE, CONTENDED, CONTEXTS, COPIES, DRAINING, EXTEND, GRANT,
    HELLO, IDLE, LOGS, LONE, MEMBER, OCCUPANCY, PROCESS, QUEUE, RELEASE, REPORT, SERVED, SHARED,
    SLICED, WANT,
};

use crate::Error;

/// A worker's side: asks for the grant, knows when its slice is over.
#[derive(Debug)]
pub struct Gate {
    stream: UnixStream,
    vgpu: u32,
    wanted: bool,
    held_since: Option<Instant>,
    slice: Duration,
    /// Grants received so far.
    grants: u64,
    /// Slices added by `EXTEND` so far.
    extensions: u64,
    /// See [`Gate::alone`].
    alone: bool,
    /// See [`Gate::shared`].
    shared: bool,
    /// See [`Gate::shared_alone`].
    alone_on_shared: bool,
    /// A shared holder said it has nothing to run (`IDLE`) and has not
    /// said since that it has again.
    idle_said: bool,
    /// The serving thread in `SCHED_FIFO` while it holds a grant another
    /// vGPU waits for, up to the slice's end (the real-time lift).
    fifo: crate::priority::OwnFifo,
}

impl Gate {
    /// Registers vGPU `vgpu` with `weight` at the service listening on `path`.
    pub fn connect(path: &Path, vgpu: u32, weight: f64) -> Result<Gate, Error> {
        let stream = UnixStream::connect(path).map_err(|e| Error::Io {
            what: "connecting to grant service",
            source: e,
        })?;
        Self::over(stream, vgpu, weight)
    }

    /// Registers as one of the workers serving vGPU `vgpu` (a worker per
    /// guest process), which share its place in the service's queue and
    /// its grants (`wire::grant::MEMBER`).
    pub fn connect_member(path: &Path, vgpu: u32, weight: f64) -> Result<Gate, Error> {
        let stream = UnixStream::connect(path).map_err(|e| Error::Io {
            what: "connecting to grant service",
            source: e,
        })?;
        Self::hello(stream, vgpu, weight, MEMBER)
    }

    /// Registers over a connection made for us (a confined worker cannot
    /// connect: when it moves to another GPU the daemon connects to that
    /// GPU's service and passes the socket).
    pub fn over(stream: UnixStream, vgpu: u32, weight: f64) -> Result<Gate, Error> {
        Self::hello(stream, vgpu, weight, 0)
    }

    /// [`Gate::over`], as one of the workers serving vGPU `vgpu` (see
    /// [`Gate::connect_member`]) where `member`.
    pub fn over_as(
        stream: UnixStream,
        vgpu: u32,
        weight: f64,
        member: bool,
    ) -> Result<Gate, Error> {
        Self::hello(stream, vgpu, weight, if member { MEMBER } else { 0 })
    }

    /// Says `HELLO` (`member`: 0 or `MEMBER`) and makes the gate.
    fn hello(mut stream: UnixStream, vgpu: u32, weight: f64, member: u64) -> Result<Gate, Error> {
        let w = crate::sat_u64((weight * 1000.0).round().max(1.0));
        stream
            .write_all(&encode(HELLO, vgpu, w, member))
            .map_err(|e| Error::Io {
                what: "grant hello",
                source: e,
            })?;
        Ok(Gate {
            stream,
            vgpu,
            wanted: false,
            held_since: None,
            grants: 0,
            extensions: 0,
            alone: false,
            shared: false,
            alone_on_shared: false,
            idle_said: false,
            slice: Duration::ZERO,
            fifo: crate::priority::OwnFifo::default(),
        })
    }

    /// With the real-time lift (`[daemon] realtime`): the calling thread,
    /// the worker's serving thread, goes into `SCHED_FIFO` while it holds
    /// a grant another vGPU waits for, until the slice's end.
    pub fn with_realtime(mut self, on: bool) -> Gate {
        self.fifo = crate::priority::OwnFifo::new(on);
        self
    }

    /// Whether the real-time lift is on for this gate (and was not refused).
    pub fn realtime(&self) -> bool {
        self.fifo.on()
    }

    /// Times the serving thread went into `SCHED_FIFO` so far.
    pub fn realtime_entries(&self) -> u64 {
        self.fifo.entered
    }

    /// Asks for the grant.
    fn want(&mut self) -> Result<(), Error> {
        self.stream
            .write_all(&encode(WANT, self.vgpu, 0, 0))
            .map_err(|e| Error::Io {
                what: "grant want",
                source: e,
            })?;
        self.wanted = true;
        Ok(())
    }

    /// Whether a request for the grant is outstanding (a grant may arrive).
    pub fn wanted(&self) -> bool {
        self.wanted
    }

    /// The socket, to wait on together with other events.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// Whether the grant is held.
    pub fn holding(&self) -> bool {
        self.held_since.is_some()
    }

    /// Asks for the grant (once) and waits up to `wait` for it, blocked;
    /// true if held.
    pub fn acquire(&mut self, wait: Duration) -> Result<bool, Error> {
        if self.holding() {
            return Ok(true);
        }
        if !self.wanted {
            self.want()?;
        }
        let timeout = PollTimeout::from(u16::try_from(wait.as_millis()).unwrap_or(u16::MAX));
        let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, timeout).unwrap_or(0) == 0 {
            return Ok(false);
        }
        let mut m = [0u8; 24];
        self.stream.read_exact(&mut m).map_err(|e| Error::Io {
            what: "grant read",
            source: e,
        })?;
        let (kind, _, slice_ns, bits) = decode(&m);
        if kind != GRANT {
            // An extension sent as this vGPU gave its grant back is stale.
            return Ok(false);
        }
        self.wanted = false;
        self.alone = bits & LONE != 0;
        self.shared = bits & SHARED != 0;
        self.alone_on_shared = bits & ALONE != 0;
        self.idle_said = false;
        self.slice = Duration::from_nanos(slice_ns);
        self.held_since = Some(Instant::now());
        self.grants += 1;
        if !self.alone {
            self.fifo.enter();
        }
        Ok(true)
    }

    /// Tells the service that this holder is giving the GPU back: its last
    /// work is finishing on the device. Said only while another vGPU waits
    /// (under MPS the service then grants the next one at once).
    pub fn draining(&mut self) -> Result<(), Error> {
        if !self.holding() || self.alone {
            return Ok(());
        }
        self.stream
            .write_all(&encode(DRAINING, self.vgpu, 0, 0))
            .map_err(|e| Error::Io {
                what: "grant draining",
                source: e,
            })
    }

    /// Whether the grant held is one of several on a shared GPU
    /// (`wire::grant::SHARED`): the worker charges what it uses as it goes
    /// and says when it has nothing to run and when it has again.
    pub fn shared(&self) -> bool {
        self.holding() && self.shared
    }

    /// Whether the grant held is a heavy vGPU's turn on a shared GPU
    /// (`wire::grant::ALONE`): no other vGPU holds beside it.
    pub fn shared_alone(&self) -> bool {
        self.shared() && self.alone_on_shared
    }

    /// Whether holding this grant keeps another vGPU off the GPU: an
    /// exclusive grant, a heavy vGPU's turn, or any grant once the service
    /// said another vGPU wants the GPU (`CONTENDED`).
    pub fn keeps_others_off(&self) -> bool {
        self.holding() && (!self.shared || self.alone_on_shared || !self.alone)
    }

    /// A shared holder with nothing to run says so once (`IDLE`), keeping
    /// the grant: a vGPU between calls for long holds back no other one.
    /// No-op otherwise.
    pub fn idle(&mut self) -> Result<(), Error> {
        if !self.shared() || self.idle_said {
            return Ok(());
        }
        self.idle_said = true;
        self.send(IDLE, 0, 0, "grant idle")
    }

    /// A shared holder that said `IDLE` has work again (`WANT`); it runs it
    /// at once, under the grant it kept. No-op otherwise.
    pub fn busy(&mut self) -> Result<(), Error> {
        if !self.shared() || !self.idle_said {
            return Ok(());
        }
        self.idle_said = false;
        self.send(WANT, 0, 0, "grant busy")
    }

    /// A shared holder charges `used_ns` of GPU time used since its last
    /// charge, in `bursts` stretches of device work (busy periods, chunks
    /// of copies out), keeping the grant (`CHARGE`).
    pub fn charge(&mut self, used_ns: u64, bursts: u64) -> Result<(), Error> {
        if !self.shared() || used_ns == 0 {
            return Ok(());
        }
        self.send(CHARGE, used_ns, bursts, "grant charge")
    }

    fn send(&mut self, kind: u32, a: u64, b: u64, what: &'static str) -> Result<(), Error> {
        self.stream
            .write_all(&encode(kind, self.vgpu, a, b))
            .map_err(|e| Error::Io { what, source: e })
    }

    /// How many grants this vGPU has received (tells one grant from the next).
    pub fn grants(&self) -> u64 {
        self.grants
    }

    /// Whether the slice has run out (extensions the service sent counted).
    pub fn slice_over(&mut self) -> bool {
        if self.held_since.is_none_or(|t| t.elapsed() < self.slice) {
            return false;
        }
        let over = !self.extended();
        if over {
            // What is left is the drain: no more need to be first.
            self.fifo.leave();
        }
        over
    }

    /// Takes the extensions waiting on the socket, if any; true if there
    /// were (the slice is longer by them). Reads only while holding: any
    /// other message is the next grant's, which [`Gate::acquire`] reads.
    pub fn extended(&mut self) -> bool {
        let mut more = false;
        while self.holding() {
            let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
            if poll(&mut fds, PollTimeout::ZERO).unwrap_or(0) == 0 {
                break;
            }
            let mut m = [0u8; 24];
            if self.stream.read_exact(&mut m).is_err() {
                break;
            }
            let (kind, _, ns, _) = decode(&m);
            match kind {
                EXTEND => {
                    // No other vGPU waits: a co-holder granted while one
                    // did learns it here.
                    self.slice += Duration::from_nanos(ns);
                    self.extensions += 1;
                    self.alone = true;
                    more = true;
                    self.fifo.leave();
                }
                CONTENDED => {
                    self.alone = false;
                    self.fifo.enter();
                }
                _ => {}
            }
        }
        more
    }

    /// Whether no other vGPU has wanted the GPU since this grant (as far
    /// as the messages read so far tell): the service then extends the
    /// slice instead of having it end.
    pub fn alone(&self) -> bool {
        self.holding() && self.alone
    }

    /// Slices added to grants so far by extensions.
    pub fn extensions(&self) -> u64 {
        self.extensions
    }

    /// The length of the current slice, ns.
    pub fn slice_ns(&self) -> u64 {
        crate::nanos(self.slice)
    }

    /// Time since the grant was received.
    pub fn held_ns(&self) -> u64 {
        self.held_since.map_or(0, |t| crate::nanos(t.elapsed()))
    }

    /// Reports live figures to the service (for the operator's view).
    pub fn report(&mut self, r: &Report) -> Result<(), Error> {
        let mut m = [0u8; 216];
        m[..24].copy_from_slice(&encode(REPORT, self.vgpu, r.mem_used, r.sync_calls));
        m[24..48].copy_from_slice(&encode(QUEUE, self.vgpu, r.queued, r.launches));
        m[48..72].copy_from_slice(&encode(SERVED, self.vgpu, r.requests, r.refused));
        m[72..96].copy_from_slice(&encode(PROCESS, self.vgpu, r.rss_bytes, r.open_fds));
        m[96..120].copy_from_slice(&encode(OCCUPANCY, self.vgpu, r.occupancy_ppm, 0));
        m[120..144].copy_from_slice(&encode(SLICED, self.vgpu, r.sliced_launches, 0));
        m[144..168].copy_from_slice(&encode(LOGS, self.vgpu, r.log_suppressed, 0));
        m[168..192].copy_from_slice(&encode(
            CONTEXTS,
            self.vgpu,
            r.contexts_created,
            r.contexts_reused,
        ));
        m[192..].copy_from_slice(&encode(COPIES, self.vgpu, r.copy_ppm, 0));
        self.stream.write_all(&m).map_err(|e| Error::Io {
            what: "grant report",
            source: e,
        })
    }

    /// Gives the grant back after the caller synchronized, charging `used_ns`
    /// of GPU time. `busy`: the vGPU still has work (stays in the run queue).
    pub fn release(&mut self, used_ns: u64, busy: bool) -> Result<(), Error> {
        if self.held_since.take().is_none() {
            return Ok(());
        }
        self.fifo.leave();
        self.stream
            .write_all(&encode(RELEASE, self.vgpu, used_ns, u64::from(busy)))
            .map_err(|e| Error::Io {
                what: "grant release",
                source: e,
            })?;
        if busy {
            // Still runnable: the service keeps it queued; ask again.
            self.want()?;
        }
        Ok(())
    }
}
