//! Fair sharing of one GPU between vGPU worker processes.
//!
//! The daemon runs a [`GrantService`] per GPU: the start-tag fair queue of
//! `scheduler` decides which vGPU may submit work, for one slice. Each worker
//! holds a `Gate` (the worker's `gate.rs`): before device work it asks for the grant and waits for
//! it; at the end of its slice, or when it has had nothing to do for a
//! bounded spin while another vGPU wants the GPU (alone, it keeps the grant
//! through its guests' short pauses), it synchronizes its contexts (so that
//! the GPU is really free), and releases, reporting the GPU time it used. Non-preemptive GPUs
//! make the release collaborative; a kernel that overruns is charged in full.
//!
//! A grant's slice is the configured one times the vGPU's weight over the
//! lightest waiting vGPU's, at most four times (`GpuScheduler::slice_for`):
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
//! A vGPU may be served by several workers, one per guest process (their
//! `HELLO` says `MEMBER`): they are one place in the queue, sharing its
//! grants (`group.rs`).
//!
//! Messages are 24 bytes, little-endian: `[kind u32][vgpu u32][a u64][b u64]`.

use std::collections::HashMap;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
// What the tests (`tests.rs`, `use super::*`) use besides.
#[cfg(test)]
use std::{os::unix::net::UnixStream, time::Instant};

use crate::hostcpu::ServiceLift;
use crate::Error;

mod conn;
mod corun;
mod group;
mod service;

use service::{Command, Service};

pub use wire::grant::Report;

/// How long a new connection may take to say HELLO.
const HELLO_WAIT: Duration = Duration::from_secs(2);

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
    /// Grants sent to it, all kinds.
    pub grants: u64,
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

/// The per-GPU grant service.
#[derive(Debug)]
pub struct GrantService {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    usage: Usage,
    commands: Mutex<std::sync::mpsc::Sender<Command>>,
    /// Rung after each command and at the stop: a quiet service sleeps on it.
    wake: Arc<transport::EventFdBell>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GrantService {
    /// Starts serving at `path` with slices of `slice_ns`, fair queuing.
    pub fn start(path: &Path, slice_ns: u64) -> Result<GrantService, Error> {
        Self::start_with(path, slice_ns, sched::DevicePolicy::default(), false)
    }

    /// Starts serving at `path` with slices of `slice_ns`, fair queuing,
    /// the GPU held under `sharing` (see `service/share.rs`).
    pub fn start_sharing(
        path: &Path,
        slice_ns: u64,
        sharing: sched::Sharing,
    ) -> Result<GrantService, Error> {
        let policy = sched::DevicePolicy::default();
        Self::start_lifted(
            path,
            slice_ns,
            policy,
            false,
            sharing,
            ServiceLift::default(),
        )
    }

    /// Starts serving at `path` with slices of `slice_ns` under `policy`,
    /// one vGPU a slice (`Sharing::Exclusive`); `corun`: the GPU's vGPUs
    /// are MPS clients: those that opted in may hold it together (see
    /// `corun.rs`), and the next vGPU is granted as the holder drains (see
    /// the module's doc).
    pub fn start_with(
        path: &Path,
        slice_ns: u64,
        policy: sched::DevicePolicy,
        corun: bool,
    ) -> Result<GrantService, Error> {
        let exclusive = sched::Sharing::Exclusive;
        Self::start_lifted(
            path,
            slice_ns,
            policy,
            corun,
            exclusive,
            ServiceLift::default(),
        )
    }

    /// [`GrantService::start_with`], with the host CPU options `lift`: its
    /// thread at a raised priority, and each change of the GPU's holders
    /// sent to the vCPU lift (see `hostcpu`).
    pub fn start_lifted(
        path: &Path,
        slice_ns: u64,
        policy: sched::DevicePolicy,
        corun: bool,
        sharing: sched::Sharing,
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
        let wake = Arc::new(transport::EventFdBell::new().map_err(|e| Error::Io {
            what: "grant service's wake-up eventfd",
            source: std::io::Error::other(e),
        })?);
        let w2 = wake.clone();
        let thread = std::thread::Builder::new()
            .name("grant-service".into())
            .spawn(move || {
                if let Some(nice) = lift.nice {
                    if let Err(e) = crate::hostcpu::lift_current_thread(nice) {
                        tracing::warn!("grant service: priority lift refused: {e}");
                    }
                }
                if lift.realtime {
                    let prio = worker::priority::REALTIME_SERVICE;
                    if let Err(why) = worker::priority::fifo_current_thread(prio) {
                        tracing::warn!("grant service: {why}");
                    }
                }
                let svc = Service::new(listener, slice_ns, policy, corun, u2, lift.holders);
                svc.sharing(sharing).run(&s2, &rx, &w2)
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
            wake,
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
                return Err(Error::BadWeight(w));
            }
        }
        self.send(Command::SetShare {
            vgpu,
            tenant: tenant.to_owned(),
            weight,
            tenant_weight,
        })
    }

    /// Whether `vgpu`'s VM opted in to co-running (see `corun.rs`).
    pub fn set_corun(&self, vgpu: u32, ok: bool) -> Result<(), Error> {
        self.send(Command::SetCorun { vgpu, ok })
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
    /// grant with it, so that its successor can register (see `supervisor/`).
    pub fn forget(&self, vgpu: u32) -> Result<(), Error> {
        self.send(Command::Forget { vgpu })
    }

    fn send(&self, c: Command) -> Result<(), Error> {
        self.commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(c)
            .map_err(|_| Error::GrantStopped)?;
        let _ = transport::Bell::ring(&*self.wake);
        Ok(())
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for GrantService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = transport::Bell::ring(&*self.wake);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests;
