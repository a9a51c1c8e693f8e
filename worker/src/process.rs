//! The worker process's start: its executor, its region (fed by the daemon
//! or its own), its confinement, then the serving loop until SIGTERM.
//!
//! What the process is to do comes from the daemon as a [`Spec`] (the
//! daemon's `setup::worker_spec` reads it from the config), so that
//! nothing of the daemon's configuration is linked into the worker.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::executor::sim::{SimExecutor, SimParams};
use crate::executor::{Executor, ExecutorKind, GraphLaunches};
use crate::serve::{Warm, Worker, WorkerConfig};
use crate::Error;

/// The exit status of a worker whose GPU contexts a sticky CUDA error poisoned.
pub const EXIT_POISONED: i32 = 75;

/// How long a spare worker tries to initialize CUDA.
const SPARE_INIT_TRIES: Duration = Duration::from_secs(10);

/// Which executor a worker opens, on which GPU.
#[derive(Debug, Clone, Copy)]
pub struct ExecutorSpec {
    /// The sim or a real GPU.
    pub kind: ExecutorKind,
    /// The sim's model (its GPUs among them).
    pub sim: SimParams,
    /// Which launches the cuda executor submits as graph launches.
    pub graph_launches: GraphLaunches,
}

impl ExecutorSpec {
    /// Opens the executor for GPU `gpu` (as this process sees it: an MPS
    /// client sees its server's GPU as 0).
    pub fn open(&self, gpu: u32) -> Result<Box<dyn Executor>, Error> {
        match self.kind {
            ExecutorKind::Sim => {
                let mut e = SimExecutor::new(self.sim);
                e.set_device(gpu).map_err(|_| Error::NoGpu {
                    gpu,
                    gpus: self.sim.gpus,
                })?;
                Ok(Box::new(e))
            }
            ExecutorKind::Cuda => crate::executor::cuda::open(gpu, self.graph_launches),
        }
    }
}

/// What one worker process is to do.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Its region, socket, limits and grant service.
    pub worker: WorkerConfig,
    /// Its executor.
    pub executor: ExecutorSpec,
    /// The GPU ordinal it opens (see [`ExecutorSpec::open`]).
    pub ordinal: u32,
    /// The fd of the daemon's feed (region and doorbells); without, it
    /// serves its own region and socket.
    pub feed: Option<i32>,
    /// The fd of the VM's memory ledger, for a process slot's worker
    /// (`WorkerConfig::slot`): it counts in the ledger the VM's workers
    /// share.
    pub ledger: Option<i32>,
    /// The fd of a memfd holding a checkpoint's stream, for a process
    /// slot's worker the daemon starts from one (`Worker::adopt_restored`):
    /// it serves on from it rather than taking its slot's channels over.
    pub restore: Option<i32>,
    /// Whether it confines itself once set up.
    pub sandbox: bool,
}

/// Opens `exec`'s GPU `ordinal`, retrying for a while where `patient` (a
/// spare may start as its MPS server is still being torn down after a
/// fault, `CUDA_ERROR_MPS_SERVER_NOT_READY`: it has time).
fn open_executor(
    exec: &ExecutorSpec,
    ordinal: u32,
    patient: bool,
) -> Result<Box<dyn Executor>, Error> {
    if !patient {
        return exec.open(ordinal);
    }
    let t = Instant::now();
    loop {
        match exec.open(ordinal) {
            Ok(e) => return Ok(e),
            Err(e) if t.elapsed() < SPARE_INIT_TRIES => {
                tracing::debug!("GPU not ready yet: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The guests' kernel printf text goes to them, never to the daemon's
/// log: this process's descriptors 1 and 2 are theirs from here on.
fn capture() -> Result<(), Error> {
    crate::serve::capture_output().map_err(|source| Error::Io {
        what: "capturing kernel output",
        source,
    })
}

/// A spare worker's start, before it knows its VM (see `spare.rs`): its
/// executor open on GPU `ordinal` and a context made ahead, all it makes
/// where `fixed` (an MPS client's, made before it is confined).
pub fn spare(exec: &ExecutorSpec, ordinal: u32, fixed: bool) -> Result<Warm, Error> {
    capture()?;
    Warm::make(open_executor(exec, ordinal, true)?, fixed)
}

/// Runs one worker in this process until SIGTERM.
pub fn run(spec: &Spec) -> Result<(), Error> {
    run_warm(spec, None)
}

/// [`run`], by a spare bound to the VM (`warm`, see [`spare`]) where one
/// is given: the executor it opened and the context it made are used.
pub fn run_warm(spec: &Spec, warm: Option<Warm>) -> Result<(), Error> {
    let started = Instant::now();
    let vm = spec.worker.name.as_str();
    capture()?;
    let (exec, warm) = match warm {
        Some(w) => (None, Some(w)),
        None => (Some(spec.executor.open(spec.ordinal)?), None),
    };
    let init_ms = crate::millis(started.elapsed());
    let mut wc = spec.worker.clone();
    if let Some(fd) = spec.ledger {
        wc.shared_vgpu = Some(std::sync::Arc::new(crate::feed::feed_from_fd(fd)?));
    }
    let wc = &wc;
    let mut worker = match (spec.feed, exec, warm) {
        (Some(fd), exec, warm) if spec.restore.is_some() => {
            let stream = crate::feed::feed_from_fd(spec.restore.unwrap_or(-1))?;
            let warm = match (exec, warm) {
                (_, Some(w)) => w,
                (Some(exec), None) => Warm::cold(exec),
                (None, None) => return Err(Error::SpareNotFed),
            };
            Worker::adopt_restored(wc, warm, crate::feed::feed_from_fd(fd)?, stream)?
        }
        (Some(fd), None, Some(w)) => Worker::adopt_warm(wc, w, crate::feed::feed_from_fd(fd)?)?,
        (Some(fd), Some(exec), _) => Worker::adopt(wc, exec, crate::feed::feed_from_fd(fd)?)?,
        (None, Some(exec), _) => Worker::new(wc, exec)?,
        _ => return Err(Error::SpareNotFed),
    };
    let stop = worker.stop_flag();
    let wake = worker.wake_bells();
    wire::signals::install();
    if spec.sandbox {
        worker.confine()?;
        tracing::debug!(vm, "worker confined");
    }
    std::thread::spawn(move || {
        wire::signals::wait_terminated();
        stop.store(true, Ordering::Relaxed);
        // It may sleep long while idle: woken to see the flag.
        for b in &wake {
            let _ = transport::Bell::ring(&**b);
        }
    });
    let ready_ms = crate::millis(started.elapsed());
    if wc.ends_with_process {
        // One per guest process (which a guest starts at will): debug.
        tracing::debug!(
            vm,
            init_ms,
            ready_ms,
            slot = wc.slot,
            "slot's worker serving"
        );
    } else {
        tracing::info!(
            vm,
            socket = %wc.socket.display(),
            init_ms,
            ready_ms,
            "worker serving"
        );
    }
    worker.run()
}
