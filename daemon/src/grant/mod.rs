//! Fair sharing of one GPU between vGPU worker processes.
//!
//! The daemon runs a [`GrantService`] per GPU: the start-tag fair queue of
//! `scheduler` decides which vGPU may submit work, for one slice. Each worker
//! holds a `Gate` (the worker's `gate.rs`): before device work it asks for the grant and waits for
//! it; at the end of its slice, or when it has had nothing to do for a
//! bounded spin, it synchronizes its contexts (so that the GPU is really
//! free), and releases, reporting the GPU time it used. Non-preemptive GPUs
//! make the release collaborative; a kernel that overruns is charged in full.
//!
//! A grant's slice is the configured one times the vGPU's weight over the
//! lightest waiting vGPU's, at most four times ([`GpuScheduler::slice_for`]):
//! at 1:2:3 the GPU changes hands three times a round instead of five, and
//! each change costs the GPU a context switch.
//!
//! While no other vGPU waits, the holder (and its co-holders, see
//! `corun.rs`) is told whenever less than a slice is left that it has one
//! slice more (`EXTEND`): it neither drains the device nor gives the GPU
//! back and takes it again, which for a lone tenant would empty the
//! device's queue once a slice for nothing. It is charged at its release
//! for all it held; once another vGPU wants the GPU, the holders are told
//! (`CONTENDED`) and the slice ends as usual (at most one slice later than
//! without extensions).
//!
//! A holder that gives the GPU back while others wait says so as its last
//! work starts draining (`DRAINING`). On a GPU whose vGPUs are MPS clients
//! (one hardware context, nothing to switch) the vGPU first in line is
//! granted at once, its first work running beside the drain, and the
//! drainer is charged at its release as ever. Elsewhere the next vGPU
//! waits for the release, blocked, as for any grant: the vGPU first in
//! line was once told to spin for it and to wake its guests early, which
//! on a busy host took the CPU from the guests and cost the lightest vGPU
//! its share (`results/2026-11-26-h100-busy-host-bisect.md`).
//!
//! Messages are 24 bytes, little-endian: `[kind u32][vgpu u32][a u64][b u64]`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use sched::GpuScheduler;

use crate::hostcpu::ServiceLift;
use crate::Error;

mod corun;

pub use wire::grant::Report;
use wire::grant::*;

/// How long a new connection may take to say HELLO.
const HELLO_WAIT: Duration = Duration::from_secs(2);

/// A connection whose HELLO has not all arrived.
struct Pending {
    s: UnixStream,
    since: Instant,
    m: [u8; 24],
    got: usize,
}

/// What the service knows of one vGPU, live.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VgpuLive {
    /// GPU time charged so far (ns).
    pub charged_ns: u64,
    /// What its worker reported last (its counters count from the worker
    /// process's start).
    pub report: Report,
    /// Current weight (the VM's, as configured or set).
    pub weight: f64,
    /// The weight it runs under: its tenant's weight split among the
    /// tenant's active vGPUs (its own weight when the tenant has none).
    pub effective_weight: f64,
    /// Time it has spent wanting or holding the GPU (ns): its demand for
    /// the GPU's time, which placement balances between GPUs.
    pub active_ns: u64,
    /// Whether its worker is connected.
    pub connected: bool,
    /// Whether it holds the GPU now.
    pub holding: bool,
    /// Grants taken back because its worker kept the GPU past
    /// [`hold_limit`].
    pub revoked: u64,
    /// Grants it got at a hand-off: the GPU was given back while it (or
    /// another vGPU) waited, and the next grant went to it.
    pub handoffs: u64,
    /// The service's own time at those hand-offs, from receiving the
    /// release that freed the GPU to sending this vGPU's grant (ns).
    pub handoff_ns: u64,
}

/// How long a worker may keep the grant before the service takes it back:
/// ten slices, and never less than 2 s (a long kernel overruns its slice
/// legitimately; it is charged in full).
pub fn hold_limit(slice_ns: u64) -> Duration {
    Duration::from_nanos(slice_ns.saturating_mul(10)).max(Duration::from_secs(2))
}

/// Live figures per vGPU, readable while the service runs.
pub type Usage = Arc<Mutex<HashMap<u32, VgpuLive>>>;

enum Command {
    SetShare {
        vgpu: u32,
        tenant: String,
        weight: f64,
        tenant_weight: Option<f64>,
    },
    /// Whether a vGPU's VM opted in to co-running (see `corun.rs`).
    SetCorun { vgpu: u32, ok: bool },
    /// How far ahead of virtual time a vGPU is (it is leaving this GPU).
    Lag {
        vgpu: u32,
        reply: std::sync::mpsc::Sender<Option<u128>>,
    },
    /// A vGPU arriving from another GPU: place it this far ahead.
    Expect { vgpu: u32, lag: u128 },
    /// The daemon ended a vGPU's worker: forget its connection now.
    Forget { vgpu: u32 },
}

/// What the service knows of a vGPU's place among the tenants.
#[derive(Debug, Clone)]
struct Share {
    tenant: String,
    weight: f64,
    tenant_weight: Option<f64>,
}

/// Recomputes every connected vGPU's effective weight (see
/// `sched::tenants`) and hands the changed ones to the fair queue.
fn apply_shares(
    sched: &mut GpuScheduler,
    shares: &HashMap<u32, Share>,
    active: &std::collections::HashSet<u32>,
    connected: &HashMap<u32, UnixStream>,
    usage: &Usage,
) {
    let ids: Vec<u32> = connected.keys().copied().collect();
    let members: Vec<sched::tenants::Member<'_>> = ids
        .iter()
        .map(|id| match shares.get(id) {
            Some(s) => sched::tenants::Member {
                tenant: &s.tenant,
                weight: s.weight,
                tenant_weight: s.tenant_weight,
                active: active.contains(id),
            },
            None => sched::tenants::Member {
                tenant: "",
                weight: sched.queue().weight(*id).unwrap_or(1.0),
                tenant_weight: None,
                active: active.contains(id),
            },
        })
        .collect();
    let eff = sched::tenants::effective_weights(&members);
    let mut u = usage.lock().unwrap_or_else(|e| e.into_inner());
    for (id, w) in ids.iter().zip(eff) {
        if sched.queue().weight(*id) != Some(w) {
            let _ = sched.queue().set_weight(*id, w);
        }
        let v = u.entry(*id).or_default();
        v.effective_weight = w;
        if let Some(s) = shares.get(id) {
            v.weight = s.weight;
        }
    }
}

/// The per-GPU grant service.
#[derive(Debug)]
pub struct GrantService {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    usage: Usage,
    commands: Mutex<std::sync::mpsc::Sender<Command>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GrantService {
    /// Starts serving at `path` with slices of `slice_ns`, fair queuing.
    pub fn start(path: &Path, slice_ns: u64) -> Result<GrantService, Error> {
        Self::start_with(path, slice_ns, sched::DevicePolicy::default(), false)
    }

    /// Starts serving at `path` with slices of `slice_ns` under `policy`;
    /// `corun`: the GPU's vGPUs are MPS clients: those that opted in may
    /// hold it together (see `corun.rs`), and the next vGPU is granted as
    /// the holder drains (see the module's doc).
    pub fn start_with(
        path: &Path,
        slice_ns: u64,
        policy: sched::DevicePolicy,
        corun: bool,
    ) -> Result<GrantService, Error> {
        Self::start_lifted(path, slice_ns, policy, corun, ServiceLift::default())
    }

    /// [`GrantService::start_with`], with the host CPU options `lift`: its
    /// thread at a raised priority, and each change of the GPU's holders
    /// sent to the vCPU lift (see `hostcpu`).
    pub fn start_lifted(
        path: &Path,
        slice_ns: u64,
        policy: sched::DevicePolicy,
        corun: bool,
        lift: ServiceLift,
    ) -> Result<GrantService, Error> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|e| Error::Io {
            what: "binding grant socket",
            source: e,
        })?;
        listener.set_nonblocking(true).map_err(|e| Error::Io {
            what: "grant socket",
            source: e,
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let usage: Usage = Arc::default();
        let (s2, u2) = (stop.clone(), usage.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("grant-service".into())
            .spawn(move || {
                if let Some(nice) = lift.nice {
                    if let Err(e) = crate::hostcpu::lift_current_thread(nice) {
                        tracing::warn!("grant service: priority lift refused: {e}");
                    }
                }
                serve(
                    listener,
                    slice_ns,
                    policy,
                    corun,
                    &s2,
                    &u2,
                    &rx,
                    lift.holders,
                )
            })
            .map_err(|e| Error::Io {
                what: "spawning grant service",
                source: e,
            })?;
        Ok(GrantService {
            path: path.to_owned(),
            stop,
            usage,
            commands: Mutex::new(tx),
            thread: Some(thread),
        })
    }

    /// Live figures per vGPU.
    pub fn live(&self) -> HashMap<u32, VgpuLive> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// GPU time charged per vGPU so far.
    pub fn usage(&self) -> HashMap<u32, u64> {
        self.live()
            .into_iter()
            .map(|(k, v)| (k, v.charged_ns))
            .collect()
    }

    /// Sets a vGPU's weight and its tenant (with the tenant's weight, if it
    /// has one: then the tenant's weight is split among its active vGPUs by
    /// their weights), now if it is connected and whenever its worker
    /// (re)connects: the daemon's weight wins over the one a worker brings.
    /// Applies from the vGPU's next charge, i.e. within one slice.
    pub fn set_share(
        &self,
        vgpu: u32,
        tenant: &str,
        weight: f64,
        tenant_weight: Option<f64>,
    ) -> Result<(), Error> {
        for w in std::iter::once(weight).chain(tenant_weight) {
            if !(w.is_finite() && w > 0.0) {
                return Err(Error::Config(format!(
                    "weight must be a positive number, not {w}"
                )));
            }
        }
        self.commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::SetShare {
                vgpu,
                tenant: tenant.to_owned(),
                weight,
                tenant_weight,
            })
            .map_err(|_| Error::Config("the grant service has stopped".into()))
    }

    /// Whether `vgpu`'s VM opted in to co-running (see `corun.rs`).
    pub fn set_corun(&self, vgpu: u32, ok: bool) -> Result<(), Error> {
        self.commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::SetCorun { vgpu, ok })
            .map_err(|_| Error::Config("the grant service has stopped".into()))
    }

    /// How far ahead of this GPU's virtual time `vgpu` is (tag units), as
    /// it leaves for another GPU; `None` if it is not connected here.
    pub fn lag(&self, vgpu: u32) -> Option<u128> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.send(Command::Lag { vgpu, reply: tx }).ok()?;
        rx.recv_timeout(Duration::from_secs(1)).ok().flatten()
    }

    /// `vgpu` is on its way here from another GPU with `lag`: it takes its
    /// place in the fair queue that far ahead of this GPU's virtual time.
    pub fn expect(&self, vgpu: u32, lag: u128) -> Result<(), Error> {
        self.send(Command::Expect { vgpu, lag })
    }

    /// The daemon ended `vgpu`'s worker, whose connection may stay open
    /// until the driver has torn the process down: it is forgotten now, its
    /// grant with it, so that its successor can register (see `supervisor.rs`).
    pub fn forget(&self, vgpu: u32) -> Result<(), Error> {
        self.send(Command::Forget { vgpu })
    }

    fn send(&self, c: Command) -> Result<(), Error> {
        self.commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(c)
            .map_err(|_| Error::Config("the grant service has stopped".into()))
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for GrantService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What [`forget_worker`] changes of the service's state.
type Registry<'a> = (
    &'a mut HashMap<u32, UnixStream>,
    &'a mut GpuScheduler,
    &'a mut std::collections::HashSet<u32>,
    &'a mut Option<u32>,
    &'a mut corun::CoRun,
);

/// Forgets vGPU `id`'s worker (it went away, or the daemon ended it): its
/// connection, its place in the queue, and its grant.
fn forget_worker(id: u32, st: &mut Registry<'_>, shares: &HashMap<u32, Share>, usage: &Usage) {
    let (conns, sched, active, holder, co) = st;
    conns.remove(&id);
    let _ = sched.remove(id);
    active.remove(&id);
    apply_shares(sched, shares, active, conns, usage);
    if **holder == Some(id) {
        **holder = None;
    }
    co.forget(id);
    let mut u = usage.lock().unwrap_or_else(|e| e.into_inner());
    let v = u.entry(id).or_default();
    v.connected = false;
    v.holding = false;
    v.report.queued = 0;
}

#[allow(clippy::too_many_arguments)]
fn serve(
    listener: UnixListener,
    slice_ns: u64,
    policy: sched::DevicePolicy,
    corun: bool,
    stop: &AtomicBool,
    usage: &Usage,
    commands: &std::sync::mpsc::Receiver<Command>,
    lift: Option<std::sync::mpsc::Sender<Vec<u32>>>,
) {
    let epoch = Instant::now();
    // The holders the vCPU lift was last told of (see `hostcpu::lift`).
    let mut lifted: (Option<u32>, Vec<u32>) = (None, Vec::new());
    let mut sched = GpuScheduler::with_policy(slice_ns, policy);
    let mut conns: HashMap<u32, UnixStream> = HashMap::new();
    let mut holder: Option<u32> = None;
    let mut held_since = Instant::now();
    // When the holder's slice ends, extensions included, and whether no
    // vGPU has waited beside those holding since it was granted.
    let mut deadline = held_since;
    let mut alone = false;
    let slice = Duration::from_nanos(slice_ns);
    let hold_limit = hold_limit(slice_ns);
    // What a vGPU's worker does is up to its guests: rate-limited, per vGPU.
    let mut logs: HashMap<u32, transport::LogLimiter> = HashMap::new();
    let mut pending: Vec<Pending> = Vec::new();
    let mut shares: HashMap<u32, Share> = HashMap::new();
    let mut co = corun::CoRun::new(corun);
    let mut active: std::collections::HashSet<u32> = Default::default();
    let mut arriving: HashMap<u32, u128> = HashMap::new();
    let mut last_tick = Instant::now();
    // When the last release freed the GPU while some vGPU waited for it
    // (the hand-off the next grant completes).
    let mut freed: Option<Instant> = None;
    // Since when the holder has been draining (see `DRAINING`).
    let mut draining_since: Option<Instant> = None;
    // Under MPS, a holder that drains while the next vGPU holds the GPU
    // already, and since when it held it (see `DRAINING`).
    let mut drainer: Option<(u32, Instant)> = None;
    let live = |f: &mut dyn FnMut(&mut HashMap<u32, VgpuLive>)| {
        f(&mut usage.lock().unwrap_or_else(|e| e.into_inner()));
    };
    while !stop.load(Ordering::Relaxed) {
        let mut changed = false;
        while let Ok(cmd) = commands.try_recv() {
            match cmd {
                Command::SetShare {
                    vgpu,
                    tenant,
                    weight,
                    tenant_weight,
                } => {
                    shares.insert(
                        vgpu,
                        Share {
                            tenant,
                            weight,
                            tenant_weight,
                        },
                    );
                    live(&mut |u| u.entry(vgpu).or_default().weight = weight);
                    changed = true;
                }
                Command::SetCorun { vgpu, ok } => {
                    if ok {
                        co.ok.insert(vgpu);
                    } else {
                        co.ok.remove(&vgpu);
                    }
                }
                Command::Lag { vgpu, reply } => {
                    let _ = reply.send(sched.queue().lag(vgpu));
                }
                Command::Expect { vgpu, lag } => {
                    arriving.insert(vgpu, lag);
                }
                Command::Forget { vgpu } => {
                    if conns.contains_key(&vgpu) {
                        let mut st = (&mut conns, &mut sched, &mut active, &mut holder, &mut co);
                        forget_worker(vgpu, &mut st, &shares, usage);
                    }
                }
            }
        }
        if changed {
            apply_shares(&mut sched, &shares, &active, &conns, usage);
        }
        // Demand: time each vGPU spends wanting or holding the GPU.
        let tick = last_tick.elapsed().as_nanos() as u64;
        last_tick = Instant::now();
        co.tick(holder, tick);
        if !active.is_empty() {
            live(&mut |u| {
                for id in &active {
                    u.entry(*id).or_default().active_ns += tick;
                }
            });
        }
        // Registration of new workers (their first message is HELLO), read
        // without blocking: a connection that says nothing holds up no
        // vGPU, and is refused after `HELLO_WAIT`.
        while let Ok((s, _)) = listener.accept() {
            let _ = s.set_nonblocking(true);
            pending.push(Pending {
                s,
                since: Instant::now(),
                m: [0; 24],
                got: 0,
            });
        }
        for mut p in std::mem::take(&mut pending) {
            match p.s.read(&mut p.m[p.got..]) {
                Ok(n) if n > 0 => p.got += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // A peer that leaves without a word holds nothing and did
                // nothing wrong (a worker refused a move drops the
                // connection the daemon made for it); one that leaves
                // halfway through its HELLO is worth a warning.
                _ if p.got == 0 => {
                    tracing::debug!("grant service: a connection closed before saying anything");
                    continue;
                }
                _ => {
                    tracing::warn!("grant service: a connection closed before its HELLO");
                    continue;
                }
            }
            if p.got < p.m.len() {
                if p.since.elapsed() < HELLO_WAIT {
                    pending.push(p);
                } else {
                    tracing::warn!("grant service: refused a connection that sent no HELLO");
                }
                continue;
            }
            let (kind, vgpu, weight_milli, _) = decode(&p.m);
            let weight = shares
                .get(&vgpu)
                .map_or(weight_milli as f64 / 1000.0, |s| s.weight);
            if kind == HELLO && !conns.contains_key(&vgpu) && sched.add(vgpu, weight).is_ok() {
                conns.insert(vgpu, p.s);
                if let Some(lag) = arriving.remove(&vgpu) {
                    let _ = sched.queue().set_lag(vgpu, lag);
                }
                live(&mut |u| {
                    let v = u.entry(vgpu).or_default();
                    v.weight = weight;
                    v.connected = true;
                });
                apply_shares(&mut sched, &shares, &active, &conns, usage);
                continue;
            }
            tracing::warn!("grant service: refused a connection without a valid HELLO");
        }
        let ids: Vec<u32> = conns.keys().copied().collect();
        let mut gone = Vec::new();
        {
            let mut fds: Vec<PollFd<'_>> = ids
                .iter()
                .map(|i| PollFd::new(conns[i].as_fd(), PollFlags::POLLIN))
                .collect();
            let _ = poll(&mut fds, PollTimeout::from(1u8));
            for (k, fd) in fds.iter().enumerate() {
                if fd.revents().is_some_and(|r| !r.is_empty()) {
                    gone.push(ids[k]);
                }
            }
        }
        // `gone` holds the readable ones; read what they sent.
        for id in gone {
            let Some(s) = conns.get_mut(&id) else {
                continue;
            };
            let mut m = [0u8; 24];
            match s.read_exact(&mut m) {
                Ok(()) => {
                    let now = epoch.elapsed().as_nanos() as u64;
                    let (kind, _, a, b) = decode(&m);
                    match kind {
                        WANT => {
                            if active.insert(id) {
                                apply_shares(&mut sched, &shares, &active, &conns, usage);
                            }
                            let _ = sched.request(id, now, None);
                        }
                        // The holder drains. Under MPS (one hardware
                        // context: nothing to switch) the next vGPU is
                        // granted at once, its first work running beside
                        // the drain: the GPU idles for no hand-off. The
                        // drainer is charged at its release as ever.
                        // Without MPS the next vGPU waits for the release
                        // as it waits for any grant, blocked: telling it
                        // to spin for the grant (and to wake its guests)
                        // took CPU time from busy hosts' guests and cost
                        // the lightest vGPU its share beside CPU hogs
                        // (MMR 0.80-0.83 against 0.97 on an H100,
                        // `results/2026-11-26-h100-busy-host-bisect.md`).
                        DRAINING
                            if holder == Some(id)
                                && co.holders.is_empty()
                                && draining_since.is_none() =>
                        {
                            draining_since = Some(Instant::now());
                            // One drainer at a time: a holder granted beside
                            // a drainer keeps the GPU to its release.
                            if co.enabled && drainer.is_none() {
                                drainer = Some((id, held_since));
                                holder = None;
                                freed =
                                    (!sched.candidates(now, &[id]).is_empty()).then(Instant::now);
                            }
                        }
                        RELEASE
                            if holder == Some(id)
                                || co.holders.contains_key(&id)
                                || drainer.is_some_and(|d| d.0 == id) =>
                        {
                            drainer = drainer.filter(|d| d.0 != id);
                            let a =
                                co.charge(id, a, &usage.lock().unwrap_or_else(|e| e.into_inner()));
                            let _ = sched.release(id, a);
                            live(&mut |u| {
                                let v = u.entry(id).or_default();
                                v.charged_ns += a;
                                v.holding = false;
                            });
                            if b == 0 {
                                let _ = sched.idle(id, now);
                                if active.remove(&id) {
                                    apply_shares(&mut sched, &shares, &active, &conns, usage);
                                }
                            }
                            if holder == Some(id) {
                                holder = None;
                            }
                            co.forget(id);
                            freed = (holder.is_none()
                                && co.holders.is_empty()
                                && sched.queue().runnable() > 0)
                                .then(Instant::now);
                        }
                        REPORT => live(&mut |u| {
                            let v = u.entry(id).or_default();
                            v.report.mem_used = a;
                            v.report.sync_calls = b;
                        }),
                        QUEUE => live(&mut |u| {
                            let v = u.entry(id).or_default();
                            v.report.queued = a;
                            v.report.launches = b;
                        }),
                        SERVED => live(&mut |u| {
                            let v = u.entry(id).or_default();
                            v.report.requests = a;
                            v.report.refused = b;
                        }),
                        PROCESS => live(&mut |u| {
                            let v = u.entry(id).or_default();
                            v.report.rss_bytes = a;
                            v.report.open_fds = b;
                        }),
                        OCCUPANCY => {
                            live(&mut |u| u.entry(id).or_default().report.occupancy_ppm = a)
                        }
                        SLICED => {
                            live(&mut |u| u.entry(id).or_default().report.sliced_launches = a)
                        }
                        LOGS => live(&mut |u| u.entry(id).or_default().report.log_suppressed = a),
                        COPIES => live(&mut |u| u.entry(id).or_default().report.copy_ppm = a),
                        CONTEXTS => live(&mut |u| {
                            let v = u.entry(id).or_default();
                            v.report.contexts_created = a;
                            v.report.contexts_reused = b;
                        }),
                        _ => {}
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    // The worker went away: forget it, and its grant.
                    let mut st = (&mut conns, &mut sched, &mut active, &mut holder, &mut co);
                    forget_worker(id, &mut st, &shares, usage);
                }
            }
        }
        // A worker that keeps the GPU far past its slice (stuck, or busy
        // with something that never ends) loses it: every other vGPU would
        // wait on it otherwise; so does a co-holder past the round's end.
        // It is charged what it held (as at a release) and counts as idle
        // until it asks again; its late release is ignored.
        let mut revoked: Vec<(u32, u64)> = Vec::new();
        let overrun = Instant::now().saturating_duration_since(deadline);
        if let Some(id) = holder.filter(|_| overrun + slice > hold_limit) {
            revoked.push((id, held_since.elapsed().as_nanos() as u64));
            holder = None;
        }
        for id in co.overdue(hold_limit.saturating_sub(slice)) {
            revoked.push((id, co.held_ns(id)));
        }
        // A drainer that went away, or never releases.
        drainer = drainer.filter(|d| conns.contains_key(&d.0));
        if let Some((id, since)) = drainer.filter(|d| d.1.elapsed() > hold_limit) {
            revoked.push((id, since.elapsed().as_nanos() as u64));
            drainer = None;
        }
        for (id, held) in revoked {
            let charge = co.charge(id, held, &usage.lock().unwrap_or_else(|e| e.into_inner()));
            co.forget(id);
            let now = epoch.elapsed().as_nanos() as u64;
            let _ = sched.release(id, charge);
            let _ = sched.idle(id, now);
            if active.remove(&id) {
                apply_shares(&mut sched, &shares, &active, &conns, usage);
            }
            live(&mut |u| {
                let v = u.entry(id).or_default();
                v.charged_ns += charge;
                v.holding = false;
                v.revoked += 1;
            });
            transport::rate_limited!(
                logs.entry(id).or_default(),
                warn,
                vgpu = id,
                held_ms = held / 1_000_000,
                "grant taken back from a worker that kept it past its slice"
            );
        }
        // A holder that gave the GPU back before its co-holders hands the
        // round to one of them: vGPUs that fit can still join it, and the
        // one that left can come back into it (without, it would wait for
        // the round's end while the GPU has room).
        if holder.is_none() {
            if let Some(next) = co.holders.keys().next().copied() {
                co.holders.remove(&next);
                holder = Some(next);
                held_since = Instant::now()
                    .checked_sub(Duration::from_nanos(co.held_ns(next)))
                    .unwrap_or_else(Instant::now);
            }
        }
        // Beside a holder that opted in, the next vGPUs that did and fit
        // (see `corun.rs`), until the holder's slice ends.
        if let Some(h) = holder {
            let left = deadline.saturating_duration_since(Instant::now());
            if co.enabled && drainer.is_none() && left > Duration::from_millis(1) {
                let now_ns = epoch.elapsed().as_nanos() as u64;
                let snapshot = usage.lock().unwrap_or_else(|e| e.into_inner()).clone();
                for id in co.admit(&mut sched, h, now_ns, &snapshot) {
                    if let Some(s) = conns.get_mut(&id) {
                        if s.write_all(&encode(GRANT, id, left.as_nanos() as u64, 0))
                            .is_ok()
                        {
                            co.holders.insert(id, deadline);
                            live(&mut |u| u.entry(id).or_default().holding = true);
                        }
                    }
                }
            }
        }
        // While no vGPU waits beside those holding the GPU (the holder and
        // its co-holders), they get one slice more whenever less than a
        // slice is left; once one waits, they are told so and the round
        // ends at its deadline (see the module's doc).
        if let (Some(id), true) = (holder, alone) {
            let q = sched.queue();
            let waiting = conns
                .keys()
                .filter(|&&v| v != id && !co.holders.contains_key(&v) && q.is_runnable(v))
                .count();
            let holding: Vec<u32> = std::iter::once(id)
                .chain(co.holders.keys().copied())
                .collect();
            if waiting > 0 {
                alone = false;
                for v in holding {
                    if let Some(s) = conns.get_mut(&v) {
                        let _ = s.write_all(&encode(CONTENDED, v, 0, 0));
                    }
                }
            } else if deadline.saturating_duration_since(Instant::now()) <= slice {
                deadline += slice;
                for v in holding {
                    if let Some(s) = conns.get_mut(&v) {
                        let _ = s.write_all(&encode(EXTEND, v, slice_ns, 0));
                    }
                    if let Some(end) = co.holders.get_mut(&v) {
                        *end = deadline;
                    }
                }
            }
        }
        // A new round once the holder and every co-holder gave the GPU back.
        if holder.is_none() && co.holders.is_empty() {
            let now = epoch.elapsed().as_nanos() as u64;
            // Not the drainer again: it has not been charged yet.
            // Heavier vGPUs hold longer slices (fewer hand-offs).
            let next = match drainer {
                Some((d, _)) => sched
                    .candidates(now, &[d])
                    .first()
                    .map(|&v| (v, sched.slice_for(v))),
                None => sched.grant(now).map(|g| (g.vgpu, g.slice_ns)),
            };
            if let Some((vgpu, granted)) = next {
                let q = sched.queue();
                let others = q.runnable() - usize::from(q.is_runnable(vgpu));
                if let Some(s) = conns.get_mut(&vgpu) {
                    let lone = u64::from(others == 0);
                    if s.write_all(&encode(GRANT, vgpu, granted, lone)).is_ok() {
                        holder = Some(vgpu);
                        draining_since = None;
                        alone = true;
                        held_since = Instant::now();
                        deadline = held_since + Duration::from_nanos(granted);
                        let handoff = freed.take().map(|t| t.elapsed().as_nanos() as u64);
                        live(&mut |u| {
                            let v = u.entry(vgpu).or_default();
                            v.holding = true;
                            if let Some(ns) = handoff {
                                v.handoffs += 1;
                                v.handoff_ns += ns;
                            }
                        });
                    }
                }
            }
        }
        // The vCPU lift follows the holders: told only when they change
        // (after the grant is sent), the syscalls on its own thread.
        if let Some(tx) = &lift {
            let same = holder == lifted.0
                && co.holders.len() == lifted.1.len()
                && co.holders.keys().all(|k| lifted.1.contains(k));
            if !same {
                lifted = (holder, co.holders.keys().copied().collect());
                let _ = tx.send(holder.into_iter().chain(lifted.1.iter().copied()).collect());
            }
        }
    }
}

#[cfg(test)]
mod tests;
