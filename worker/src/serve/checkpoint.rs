//! A checkpoint of the vGPU this worker serves, and a worker that serves on
//! from one over the same region.
//!
//! Asked for one, the worker *holds*: it starts no request (a new one waits
//! in its ring, in the region), and those under way finish: data still
//! coming, replies going out, waits for the device. Once every channel is
//! between requests, it takes each guest process's image (`checkpoint/`)
//! and stays held until it is told to go on (the checkpoint was not used)
//! or to hand over: its loop ends without retiring its channels, and the
//! region goes to the worker that serves on from the checkpoint
//! ([`Worker::take_over`]).

use std::collections::VecDeque;
use std::io::{BufReader, Seek};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use protocol::Status;
use transport::Region;

use super::{Worker, WorkerConfig};
use crate::checkpoint::{
    answer, ChannelImage, Check, DeviceFacts, FormatError, SessionImage, VgpuImage,
};
use crate::executor::{Executor, Keeper};
use crate::feed::{CheckpointAsk, Feed, PeerLink};
use crate::session::Session;
use crate::Error;

/// Why a checkpoint was not taken, or not served on from.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A request was still under way when the wait for it ended.
    #[error("a guest request was still under way after {0:?}")]
    Busy(Duration),
    /// A guest process holds what cannot be put in a checkpoint.
    #[error("guest process {pid} holds {keeper}")]
    Kept {
        /// The process.
        pid: u32,
        /// What it holds.
        keeper: Keeper,
    },
    /// The executor failed to take or make a context.
    #[error("guest process {pid}: the executor answered {status:?}")]
    Executor {
        /// The process.
        pid: u32,
        /// What the executor said.
        status: Status,
    },
    /// The checkpoint was taken on another kind of device.
    #[error("taken on {taken}, this worker's GPU is {here}")]
    Device {
        /// Where it was taken.
        taken: DeviceFacts,
        /// This worker's.
        here: DeviceFacts,
    },
    /// It names a channel this worker does not serve.
    #[error("channel {0} is not this worker's")]
    Channel(u32),
    /// Its processes hold more device memory than the vGPU may here.
    #[error("its processes hold {0} bytes, more than the vGPU's limit here")]
    Memory(u64),
    /// The worker is already handing over, or ended.
    #[error("the worker is handing over its region")]
    HandingOver,
    /// Another checkpoint was asked for before this one was taken.
    #[error("another checkpoint was asked for")]
    Superseded,
    /// The checkpoint's stream was refused.
    #[error(transparent)]
    Stream(#[from] FormatError),
    /// Its stream could not be read.
    #[error("reading the checkpoint: {0}")]
    Io(#[source] std::io::Error),
}

/// How long a worker the daemon asked for a checkpoint waits for the
/// requests under way to finish.
const FED_WAIT: Duration = Duration::from_secs(10);

/// What the worker is told about checkpoints.
#[derive(Debug)]
pub enum Order {
    /// Hold, take a checkpoint, and send it (or why not) here.
    Checkpoint(Duration, Sender<Result<VgpuImage, CheckpointError>>),
    /// Go on serving (the checkpoint is not used).
    Resume,
    /// End the loop without retiring the channels, and send the region here.
    /// Sent once a checkpoint was taken: the worker then holds, and every
    /// channel is between requests.
    HandOver(Sender<Handover>),
}

/// Orders waiting for the serving loop (from the daemon's feed, or the
/// thread that runs the worker).
#[derive(Debug, Default)]
pub struct Orders {
    pending: AtomicBool,
    queue: Mutex<VecDeque<Order>>,
}

impl Orders {
    /// Queues an order; the loop takes it at its next turn.
    pub fn send(&self, o: Order) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(o);
        self.pending.store(true, Ordering::Release);
    }

    fn take(&self) -> Option<Order> {
        if !self.pending.load(Ordering::Acquire) {
            return None;
        }
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let o = q.pop_front();
        self.pending.store(!q.is_empty(), Ordering::Release);
        o
    }
}

/// What a worker that hands over leaves to the next: the region, its
/// guests' channels still claimed, and the link to its peers.
#[derive(Debug)]
pub struct Handover {
    /// The region.
    pub region: Region,
    /// The peers' doorbells.
    pub link: PeerLink,
}

/// A checkpoint being taken: when to give up waiting, and where it goes.
pub(super) struct Taking {
    until: Instant,
    waited: Duration,
    answer: Answer,
}

/// Where a checkpoint goes once taken.
enum Answer {
    /// To the thread that ordered it.
    Here(Sender<Result<VgpuImage, CheckpointError>>),
    /// Into the daemon's memfd, told over the feed; its mapping kept for
    /// the next checkpoint where true.
    Daemon(OwnedFd, bool),
}

impl Answer {
    /// Says why there is no checkpoint.
    fn refuse(self, link: &PeerLink, e: CheckpointError) {
        match self {
            Answer::Here(tx) => {
                let _ = tx.send(Err(e));
            }
            Answer::Daemon(memfd, _) => {
                if let Some(back) = link.answers() {
                    answer::failed(memfd, &back, &e.to_string());
                }
            }
        }
    }
}

/// The checkpoint in the daemon's memfd `stream`, checked within
/// `limits`: read in place where the memfd takes a seal, else copied out.
/// Its integrity is its carrier's: the daemon checked the save file's or
/// handover's tag before it handed the stream over.
pub(super) fn read_stream(
    stream: &OwnedFd,
    limits: &crate::checkpoint::Limits,
) -> Result<VgpuImage, CheckpointError> {
    let t = Instant::now();
    match crate::checkpoint::Mapped::of(stream) {
        Ok(map) => {
            tracing::debug!(ms = crate::millis(t.elapsed()), "a stream mapped");
            crate::checkpoint::read_mapped(std::sync::Arc::new(map), Check::Carried, limits)
        }
        Err(e) => {
            tracing::debug!("the stream is read, not mapped: {e}");
            let file = stream
                .try_clone()
                .map(std::fs::File::from)
                .and_then(|mut f| f.rewind().map(|()| f))
                .map_err(CheckpointError::Io)?;
            crate::checkpoint::read(&mut BufReader::new(file), Check::Carried, limits)
        }
    }
    .map_err(CheckpointError::from)
}

/// The device of `exec` as a checkpoint names it.
fn device_facts(exec: &dyn Executor) -> DeviceFacts {
    DeviceFacts::of(&exec.info())
}

/// Whether a worker of `cfg` on `exec` can serve on from `image`: taken on
/// the same kind of GPU and driver, its channels the worker's, its memory
/// within the vGPU's limit there, every context whole. Asked before the
/// source lets go of the vGPU, so that a checkpoint that does not fit
/// leaves it running where it was.
pub fn fits(
    cfg: &WorkerConfig,
    exec: &dyn Executor,
    image: &VgpuImage,
) -> Result<(), CheckpointError> {
    let here = device_facts(exec);
    if image.device != here {
        return Err(CheckpointError::Device {
            taken: image.device.clone(),
            here,
        });
    }
    let served = cfg
        .served()
        .map_err(|_| CheckpointError::Channel(u32::MAX))?;
    for ch in image.sessions.iter().flat_map(|s| &s.channels) {
        if !served.contains(&ch.index) {
            return Err(CheckpointError::Channel(ch.index));
        }
    }
    let bytes = image.memory_bytes();
    if bytes > cfg.mem_limit.min(exec.info().total_mem) {
        return Err(CheckpointError::Memory(bytes));
    }
    for s in &image.sessions {
        s.context
            .check()
            .map_err(|status| CheckpointError::Executor { pid: s.pid, status })?;
    }
    Ok(())
}

impl Worker {
    /// Where checkpoint orders go.
    pub fn orders(&self) -> std::sync::Arc<Orders> {
        self.orders.clone()
    }

    /// Between two turns of the serving loop: the orders, and the
    /// checkpoint under way once every channel is between requests. True
    /// when the loop must end to hand over.
    pub(super) fn checkpoints(&mut self) -> bool {
        while let Some(ask) = self.sh.port.link.take_checkpoint_ask() {
            match ask {
                CheckpointAsk::Take(memfd, keep) => {
                    self.start_taking(FED_WAIT, Answer::Daemon(memfd, keep));
                }
                CheckpointAsk::Resume => self.resume(),
            }
        }
        while let Some(o) = self.orders.take() {
            match o {
                Order::Checkpoint(wait, answer) => self.start_taking(wait, Answer::Here(answer)),
                Order::Resume => self.resume(),
                Order::HandOver(to) => {
                    self.handing_over = Some(to);
                    return true;
                }
            }
        }
        let Some((until, waited)) = self.taking.as_ref().map(|t| (t.until, t.waited)) else {
            return false;
        };
        // Into the daemon's memfd, the device memory is read in place.
        let in_place = matches!(
            self.taking.as_ref().map(|t| &t.answer),
            Some(Answer::Daemon(..))
        );
        let r = if self.between_requests() {
            self.take_checkpoint(in_place)
        } else if Instant::now() >= until {
            Err(CheckpointError::Busy(waited))
        } else {
            return false;
        };
        let t = self.taking.take().expect("checked above");
        if r.is_err() {
            // Not taken: the guests go on.
            self.sh.port.held.set(false);
        }
        match (t.answer, r) {
            (Answer::Daemon(memfd, keep), Ok(image)) => self.answer_in_place(memfd, keep, &image),
            (Answer::Here(tx), r) => {
                let _ = tx.send(r);
            }
            (answer, Err(e)) => answer.refuse(&self.sh.port.link, e),
        }
        false
    }

    /// Writes `image` (its device memory left out) into the daemon's
    /// `memfd`, each process's memory read from its context into place;
    /// its mapping kept for the next checkpoint where `keep`.
    fn answer_in_place(&mut self, memfd: OwnedFd, keep: bool, image: &VgpuImage) {
        let Some(back) = self.sh.port.link.answers() else {
            return;
        };
        let sessions = &mut self.sessions;
        let mut read = |i: usize, blob, dst: &mut [u8]| {
            let token = image.sessions[i].token;
            let e = sessions
                .iter_mut()
                .map(|(_, e)| e)
                .find(|e| e.token() == token)
                .ok_or_else(|| std::io::Error::other("its process is gone"))?;
            e.s.ctx
                .read_left_out(blob, dst)
                .map_err(|s| std::io::Error::other(format!("reading device memory: {s:?}")))
        };
        answer::taken(memfd, &back, image, &mut read, (&mut self.kept_map, keep));
    }

    /// Holds, and takes a checkpoint for `answer` once every channel is
    /// between requests (within `wait`).
    fn start_taking(&mut self, wait: Duration, answer: Answer) {
        self.sh.port.held.set(true);
        let before = self.taking.replace(Taking {
            until: Instant::now() + wait,
            waited: wait,
            answer,
        });
        if let Some(t) = before {
            t.answer
                .refuse(&self.sh.port.link, CheckpointError::Superseded);
        }
    }

    /// Goes on serving: a checkpoint under way is dropped, one taken is
    /// not used.
    fn resume(&mut self) {
        self.sh.port.held.set(false);
        if let Some(t) = self.taking.take() {
            t.answer
                .refuse(&self.sh.port.link, CheckpointError::Superseded);
        }
    }

    /// Whether every channel is between requests: nothing coming in or
    /// going out, no request waiting for the device or a host function,
    /// no launch queued, no free waiting for the device, no move under way.
    fn between_requests(&mut self) -> bool {
        let chans_idle = self.chans.iter().all(|c| {
            c.outbox.is_none()
                && c.outbound.is_none()
                && c.parked.is_none()
                && c.sliced.is_none()
                && c.transfer.is_none()
        });
        chans_idle
            && self.moving.is_none()
            && self.sessions.iter_mut().all(|(_, e)| {
                e.s.run.is_empty() && e.s.host_fn.is_none() && e.s.deferred_frees.is_empty()
            })
    }

    /// The checkpoint of every guest process this worker serves; its
    /// device memory left out where `shape` ([`answer_in_place`] reads it).
    ///
    /// [`answer_in_place`]: Worker::answer_in_place
    fn take_checkpoint(&mut self, shape: bool) -> Result<VgpuImage, CheckpointError> {
        let device = device_facts(self.sh.gpu.exec.as_ref());
        let mut sessions = Vec::new();
        let chans = &self.chans;
        for (&id, e) in self.sessions.iter_mut() {
            let (pid, token, next_seq) = (e.pid, e.token(), e.next_seq);
            let s = &mut e.s;
            let keeper = s.ctx.checkpoint_keeper().or_else(|| {
                if s.ipc_across() {
                    Some(Keeper::IpcAcrossWorkers)
                } else {
                    s.shares.any().then_some(Keeper::SharedHandle)
                }
            });
            if let Some(keeper) = keeper {
                return Err(CheckpointError::Kept { pid, keeper });
            }
            let t = Instant::now();
            let context = if shape {
                s.ctx.checkpoint_shape()
            } else {
                s.ctx.checkpoint()
            }
            .map_err(|status| CheckpointError::Executor { pid, status })?;
            tracing::debug!(
                pid,
                ms = crate::millis(t.elapsed()),
                bytes = context.memory.iter().map(|a| a.len).sum::<u64>(),
                "a context's image taken"
            );
            let channels = chans
                .iter()
                .filter(|c| c.session == Some(id))
                .map(|c| ChannelImage {
                    index: c.host.index(),
                    position: c.host.position(),
                })
                .collect();
            sessions.push(SessionImage {
                pid,
                channels,
                next_seq,
                token,
                pending_error: s.pending_error.map(Status::code),
                context,
                pinned: self.sh.gpu.pinned.blocks_of(s.id),
            });
        }
        sessions.sort_by_key(|s| s.channels.first().map(|c| c.index));
        Ok(VgpuImage {
            device,
            mem_limit: self.sh.mem.mem_limit,
            sessions,
        })
    }

    /// What the loop leaves to the next worker when it ended to hand over
    /// (its channels were not retired).
    pub(super) fn into_handover(self) -> Handover {
        let port = self.sh.port;
        Handover {
            region: port.region,
            link: port.link,
        }
    }

    /// A worker that serves on from `image` over the region another
    /// worker handed over: its executor makes each process's context
    /// again, and each process's channels go on where its rings stand.
    pub fn take_over(
        cfg: &WorkerConfig,
        exec: Box<dyn Executor>,
        handover: Handover,
        image: &VgpuImage,
    ) -> Result<Worker, Error> {
        fits(cfg, exec.as_ref(), image)?;
        let dev = super::setup::Device::prepare(cfg, exec, handover.region, None)?;
        let gate = super::setup::connect_gate(cfg)?;
        let mut w = Self::build(cfg, dev, handover.link, gate)?;
        w.restore(image)?;
        Ok(w)
    }

    /// A process slot's worker the daemon starts from a checkpoint (the
    /// memfd `stream` holds its stream) over the region it feeds: the
    /// stream read within the vGPU's limits and checked, then served on
    /// from as [`Worker::take_over`] does. Its channels are not taken over:
    /// their processes go on. What came of it is told to the daemon
    /// (`RESTORED`, or why not in `stream`).
    pub fn adopt_restored(
        cfg: &WorkerConfig,
        warm: super::setup::Warm,
        feed: OwnedFd,
        stream: OwnedFd,
    ) -> Result<Worker, Error> {
        let (fd, fed) = Feed::receive(feed)?;
        let link = PeerLink::Feed(fed);
        let back = link.answers();
        let r = Self::restore_fed(cfg, warm, fd, link, &stream);
        if let Some(back) = back {
            match &r {
                Ok((_, ahead)) => answer::restored(&back, *ahead),
                Err(e) => answer::failed(stream, &back, &e.to_string()),
            }
        }
        r.map(|(w, _)| w)
    }

    fn restore_fed(
        cfg: &WorkerConfig,
        warm: super::setup::Warm,
        region: OwnedFd,
        link: PeerLink,
        stream: &OwnedFd,
    ) -> Result<(Worker, usize), Error> {
        let limits = crate::checkpoint::Limits {
            memory: cfg.mem_limit,
            ..Default::default()
        };
        let t = std::time::Instant::now();
        let image = read_stream(stream, &limits)?;
        let read_ms = crate::millis(t.elapsed());
        fits(cfg, warm.exec.as_ref(), &image)?;
        let region = Region::map_existing(region, cfg.layout)?;
        let dev = super::setup::Device::prepare(cfg, warm.exec, region, warm.contexts)?;
        let gate = super::setup::connect_gate(cfg)?;
        let mut w = Self::build(cfg, dev, link, gate)?;
        let prepare_ms = crate::millis(t.elapsed()) - read_ms;
        let ahead = w.restore(&image)?;
        tracing::debug!(
            vm = cfg.name,
            read_ms,
            prepare_ms,
            restore_ms = crate::millis(t.elapsed()) - read_ms - prepare_ms,
            modules_loaded_ahead = ahead,
            "served on from a checkpoint"
        );
        Ok((w, ahead))
    }

    /// Serves on from `image` (which [`fits`] here): each process's session
    /// made again and bound to its channels, its memory counted against the
    /// vGPU's limit. How many modules were taken from those a spare loaded
    /// ahead (`stage.rs`).
    fn restore(&mut self, image: &VgpuImage) -> Result<usize, CheckpointError> {
        let mut ahead = 0;
        for si in &image.sessions {
            let pid = si.pid;
            let gpu = &mut self.sh.gpu;
            let ctx = match gpu.contexts.take_made() {
                Some(mut made) => made.restore_into(&si.context).map(|()| {
                    ahead += made.staged_taken();
                    made.unstage();
                    made
                }),
                None => gpu.exec.restore(&si.context),
            }
            .map_err(|status| CheckpointError::Executor { pid, status })?;
            let mut s = Session::restored(ctx, &si.context)
                .map_err(|status| CheckpointError::Executor { pid, status })?;
            if !self.sh.mem.reserve(s.mem_used, &self.sh.port.link) {
                return Err(CheckpointError::Memory(s.mem_used));
            }
            s.pending_error = si.pending_error.map(Status::from_code);
            let n = u32::try_from(si.channels.len()).unwrap_or(u32::MAX);
            // The pool's blocks are the session's own (its process-unique id).
            let owner = s.id;
            let id = self.sessions.restored(s, si.token, n, pid, si.next_seq);
            for &(off, len) in &si.pinned {
                super::pinned::restore(&mut self.sh.gpu, off, len, owner)
                    .map_err(|status| CheckpointError::Executor { pid, status })?;
            }
            self.sh.port.stats.pinned_used.store(
                self.sh.gpu.pinned.used(),
                std::sync::atomic::Ordering::Relaxed,
            );
            for ch in &si.channels {
                let c = self
                    .chans
                    .iter_mut()
                    .find(|c| c.host.index() == ch.index)
                    .expect("checked above");
                c.session = Some(id);
                c.host.resume_at(ch.position);
                let _ = c.host.mark_serving();
            }
        }
        Ok(ahead)
    }
}
