//! Set-up: what a worker makes before it serves (the region registered
//! with the device, the contexts made ahead, the image cache), and the
//! ways it comes to serve a region: on its own ([`Worker::new`]), or
//! taking over its slot of the region the daemon feeds ([`Worker::adopt`],
//! and [`Worker::adopt_warm`] for a spare bound to the slot).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use protocol::DeviceInfo;
use transport::layout::Direction;
use transport::server::serve;
use transport::{ClaimState, Region};

use super::channel::{wake_owner, ChannelState};
use super::sessions::Sessions;
use super::shared::{self, Shared};
use super::{contexts, image_cache, output, pinned, Stats, Worker, WorkerConfig};
use crate::executor::Executor;
use crate::feed::{Feed, PeerLink};
use crate::Error;

/// Where a worker maps its VM's pinned pool (and its guests map it too when
/// that address is free in their processes), so that a pinned pointer is
/// the same value in the guest, on the host and on the device: an address
/// far from where programs, their heaps and their libraries usually lie.
const PINNED_ADDR: usize = 0x3f00_0000_0000;

/// What a worker makes on the device before it serves: the region
/// registered with it (response arenas, pinned pool) and the contexts made
/// ahead.
pub(super) struct Device {
    exec: Box<dyn Executor>,
    region: Region,
    pinned_map: Option<transport::shm::FixedMapping>,
    /// Whether the pool's blocks are registered one by one (else it was
    /// registered whole here).
    per_block: bool,
    info: DeviceInfo,
    /// The device's whole memory (`info.total_mem` is the vGPU's limit).
    device_mem: u64,
    contexts: contexts::ContextPool,
    /// Connected to the daemon's image store here, before the worker is
    /// confined (no `connect`).
    images: image_cache::ImageCache,
}

impl Device {
    /// Registers `region` with the device and makes the contexts ahead,
    /// or takes those a spare made (`made`).
    pub(super) fn prepare(
        cfg: &WorkerConfig,
        exec: Box<dyn Executor>,
        region: Region,
        made: Option<contexts::ContextPool>,
    ) -> Result<Device, Error> {
        let mut exec = exec;
        let t = std::time::Instant::now();
        // Its own channels' arenas alone: a process slot's worker reaches
        // no other slot's memory from the device.
        let arenas = cfg
            .served()?
            .map(|i| region.arena(i, Direction::ToGuest))
            .collect::<Result<Vec<_>, _>>()?;
        if let Err(s) = exec.register_host_memory(&arenas) {
            tracing::warn!(
                "response arenas not registered for DMA ({s:?}); copies stay correct, only slower"
            );
        }
        drop(arenas);
        let mut info: DeviceInfo = exec.info();
        info.uuid = Some(cfg.uuid);
        let pinned_size = cfg.layout.pinned_size;
        let (pinned_map, per_block) = if pinned_size > 0 {
            let m = region.map_pinned_at(PINNED_ADDR)?;
            info.pinned_size = pinned_size;
            let (base, per_block) = register_pool(exec.as_mut(), &m);
            info.pinned_base = base;
            (Some(m), per_block)
        } else {
            (None, false)
        };
        tracing::debug!(
            ms = crate::millis(t.elapsed()),
            "arenas and pinned pool registered"
        );
        let device_mem = info.total_mem;
        let mut contexts = contexts::ContextPool::default();
        if let Some(made) = made {
            contexts = made;
        } else if cfg.prefill_contexts > 0 {
            contexts
                .prefill(exec.as_mut(), cfg.prefill_contexts)
                .map_err(Error::Prefill)?;
        } else if cfg.warm_contexts > 0 {
            contexts.warm(exec.as_mut(), cfg.warm_contexts);
        }
        let images = image_cache::ImageCache::new(
            cfg.image_cache,
            cfg.image_store.as_deref().and_then(|p| {
                crate::image_client::StoreClient::connect(p)
                    .inspect_err(|e| tracing::warn!("images not shared: {e}"))
                    .ok()
            }),
        );
        Ok(Device {
            exec,
            region,
            pinned_map,
            per_block,
            info,
            device_mem,
            contexts,
            images,
        })
    }
}

/// Makes the pinned pool `m` reachable by the device: its blocks
/// registered one by one as they are handed out (`pinned.rs`), where the
/// device reaches registered memory at its host address; else the whole
/// pool registered now, as any worker of the VM may hand out any part of
/// it. The pool's device address, and whether blocks are registered one
/// by one.
fn register_pool(exec: &mut dyn Executor, m: &transport::shm::FixedMapping) -> (u64, bool) {
    match exec.pinned_blocks(&m.slice()) {
        Ok(true) => return (m.addr() as u64, true),
        Ok(false) => tracing::info!(
            "the GPU reaches registered host memory at another address than its host one: \
             the pinned pool is registered whole (pinned all the time, and slower to migrate)"
        ),
        Err(s) => tracing::warn!("pinned pool blocks cannot be registered one by one ({s:?})"),
    }
    match exec.register_pinned(&m.slice()) {
        Ok(base) => (base, false),
        Err(s) => {
            tracing::warn!(
                "pinned pool not registered with the device ({s:?}): copies stay correct, kernels cannot reach it"
            );
            (m.addr() as u64, false)
        }
    }
}

/// The worker's limit on the log lines its guests cause: its own, and for a
/// process slot's worker also the VM's, shared with its other workers.
fn log_limiter(cfg: &WorkerConfig) -> Result<transport::LogLimiter, Error> {
    let own = transport::LogLimiter::default();
    let (Some(fd), true) = (&cfg.shared_vgpu, cfg.ends_with_process) else {
        return Ok(own);
    };
    let ledger = crate::ledger::Ledger::shared(fd.try_clone().map_err(|e| Error::Io {
        what: "the vGPU's memory ledger",
        source: e,
    })?)?;
    let burst = u64::from(transport::ratelimit::DEFAULT_BURST);
    let period = transport::ratelimit::DEFAULT_PERIOD.as_secs();
    Ok(own.with_shared(std::sync::Arc::new(move || ledger.log_line(burst, period))))
}

/// What a spare worker makes before it is bound to a VM (the daemon keeps
/// one per GPU, see its `supervisor/spares.rs`): its executor open and a
/// context made ahead for the process it will serve, nothing of any VM.
pub struct Warm {
    pub(super) exec: Box<dyn Executor>,
    pub(super) contexts: Option<contexts::ContextPool>,
}

impl std::fmt::Debug for Warm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warm").finish_non_exhaustive()
    }
}

impl Warm {
    /// `exec` with no context made ahead: a worker started for its slot,
    /// which makes its own as it starts.
    pub fn cold(exec: Box<dyn Executor>) -> Warm {
        Warm {
            exec,
            contexts: None,
        }
    }

    /// Makes one context ahead on `exec`: on this thread, all it ever
    /// makes where `fixed` (an MPS client, which cannot make one once
    /// confined), else one to start with, more made as needed.
    pub fn make(exec: Box<dyn Executor>, fixed: bool) -> Result<Warm, Error> {
        let mut exec = exec;
        let mut pool = contexts::ContextPool::default();
        if fixed {
            pool.prefill(exec.as_mut(), 1).map_err(Error::Prefill)?;
        } else {
            pool.warm(exec.as_mut(), 1);
        }
        Ok(Warm {
            exec,
            contexts: Some(pool),
        })
    }
}

/// The worker's connection to its GPU's grant service, if the scheduler runs.
pub(super) fn connect_gate(cfg: &WorkerConfig) -> Result<Option<crate::gate::Gate>, Error> {
    match &cfg.grant {
        Some((path, id, weight)) if cfg.shared_vgpu.is_some() => {
            Ok(Some(crate::gate::Gate::connect_member(path, *id, *weight)?))
        }
        Some((path, id, weight)) => Ok(Some(crate::gate::Gate::connect(path, *id, *weight)?)),
        None => Ok(None),
    }
}

impl Worker {
    /// Creates the region, starts serving the socket (a worker on its own).
    pub fn new(cfg: &WorkerConfig, exec: Box<dyn Executor>) -> Result<Worker, Error> {
        let (region, fd) = Region::create(&format!("fairvgpu-{}", cfg.name), cfg.layout)?;
        let server = serve(&cfg.socket, fd, &region)?;
        let dev = Device::prepare(cfg, exec, region, None)?;
        Self::build(cfg, dev, PeerLink::Local(server), connect_gate(cfg)?)
    }

    /// Adopts the region the daemon feeds (see the daemon's `link`): channels
    /// whose owners' GPU state died with a previous worker become LOST, and
    /// their owners are woken to find out.
    pub fn adopt(
        cfg: &WorkerConfig,
        exec: Box<dyn Executor>,
        feed: std::os::fd::OwnedFd,
    ) -> Result<Worker, Error> {
        Self::adopt_warm(
            cfg,
            Warm {
                exec,
                contexts: None,
            },
            feed,
        )
    }

    /// [`Worker::adopt`] by a spare bound to the VM (see [`Warm`]): its
    /// executor open and its context made before it knew the VM.
    pub fn adopt_warm(
        cfg: &WorkerConfig,
        warm: Warm,
        feed: std::os::fd::OwnedFd,
    ) -> Result<Worker, Error> {
        let (fd, fed) = Feed::receive(feed)?;
        let region = Region::map_existing(fd, cfg.layout)?;
        region.take_over_channels(cfg.served()?)?;
        let dev = Device::prepare(cfg, warm.exec, region, warm.contexts)?;
        let w = Self::build(cfg, dev, PeerLink::Feed(fed), connect_gate(cfg)?)?;
        w.wake_lost()?;
        Ok(w)
    }

    /// Wakes the owners of the channels whose GPU state died with the
    /// previous worker, to find out.
    fn wake_lost(&self) -> Result<(), Error> {
        let w = self;
        for ch in w.chans.iter().map(|c| c.host.index()) {
            if w.sh.port.region.claim_state(ch)? != ClaimState::Lost {
                continue;
            }
            if w.ends_with_process {
                // The daemon said that the slot's previous worker ended.
                tracing::debug!(
                    channel = ch,
                    "its GPU state died with the slot's previous worker"
                );
            } else {
                transport::rate_limited!(
                    w.sh.port.log.borrow_mut(),
                    warn,
                    channel = ch,
                    "its GPU state died with the previous worker; its guest must claim again"
                );
            }
            wake_owner(&w.sh.port, ch);
        }
        Ok(())
    }

    pub(super) fn build(
        cfg: &WorkerConfig,
        dev: Device,
        mut link: PeerLink,
        gate: Option<crate::gate::Gate>,
    ) -> Result<Worker, Error> {
        // A process slot's worker opens what the VM's other workers export.
        let vm_exports = match (cfg.slot, link.take_ipc_table()) {
            (Some(_), Some(fd)) => Some(Arc::new(crate::exports::VmExports::shared(fd)?)),
            _ => None,
        };
        let Device {
            exec,
            region,
            pinned_map,
            per_block,
            info,
            device_mem,
            contexts,
            images,
        } = dev;
        let mut info = info;
        let mem_limit = cfg.mem_limit.min(device_mem);
        info.total_mem = mem_limit;
        let chans = cfg
            .served()?
            .map(|i| Ok(ChannelState::new(region.host_channel(i)?)))
            .collect::<Result<Vec<_>, transport::Error>>()?;
        let chunk = (crate::usize_from(cfg.layout.arena_size) / 4).max(4096);
        let shared_ledger = || -> Result<Option<crate::ledger::Ledger>, Error> {
            match &cfg.shared_vgpu {
                Some(fd) => Ok(Some(crate::ledger::Ledger::shared(
                    fd.try_clone().map_err(|e| Error::Io {
                        what: "the vGPU's memory ledger",
                        source: e,
                    })?,
                )?)),
                None => Ok(None),
            }
        };
        let ledger = shared_ledger()?;
        // The pool's chunks are claimed in the VM's ledger by a process
        // slot's worker; a vGPU's one worker keeps its own table. Made
        // here, once the worker serves its slot: it frees what the slot's
        // previous worker held.
        let (table, slot) = match (shared_ledger()?, cfg.slot) {
            (Some(l), Some(k)) => (l, k),
            _ => (crate::ledger::Ledger::local(), 0),
        };
        let mut pinned = pinned::PinnedPool::new(cfg.layout.pinned_size, table, slot);
        pinned.set_device_base(info.pinned_base, per_block);
        let stats: Arc<Stats> = Arc::default();
        stats
            .device
            .store(u64::from(exec.device()), Ordering::Relaxed);
        let worker = Worker {
            sh: Shared {
                gpu: shared::Gpu {
                    exec,
                    pinned_map,
                    pinned,

                    images,
                    contexts,
                    sm_count: info.sm_count.max(1),
                },
                tables: shared::Tables {
                    vm: vm_exports,
                    ..Default::default()
                },
                port: shared::Port {
                    region,
                    link,
                    info_bytes: info.to_bytes(),
                    chunk,
                    stats: stats.clone(),
                    booster: std::cell::RefCell::new(
                        crate::priority::VcpuBooster::new(cfg.vcpus_file.clone())
                            .with_kicks(cfg.vcpu_kick),
                    ),
                    // A worker per process (which a guest starts at will):
                    // the VM's workers share one window in its ledger, so
                    // that the VM's lines do not grow with the processes
                    // it starts.
                    log: std::cell::RefCell::new(log_limiter(cfg)?),
                    output: std::cell::RefCell::new(output::Output::new()),
                    poisoned: std::cell::Cell::new(None),
                    slot: cfg.slot,
                    held: std::cell::Cell::new(false),
                },
                mem: shared::Memory {
                    mem_limit,
                    device_mem,
                    used: 0,
                    ledger,
                    slot: cfg.slot,
                    stats: stats.clone(),
                },
                slice: shared::Slice {
                    gate: gate.map(|g| g.with_realtime(cfg.realtime)),
                    grant_id: cfg.grant.as_ref().map(|g| (g.1, g.2)),
                    slice_blocks: cfg.slice_blocks,
                    time_launches: cfg.time_launches,
                    charged_ns: 0,
                    bursts: 0,
                    late: None,
                    late_free_ns: 0,
                    issued_ns: 0,
                    meter: sched::accounting::PeriodMeter::new(cfg.sample_every),
                    params: Vec::new(),
                    period_grant: 0,
                    worked: false,
                    budget_spent: false,
                    releasing: false,
                    stats,
                },
                figures: shared::Figures::default(),
            },
            chans,
            sessions: Sessions::default(),
            releasing: None,
            spin: cfg.spin,
            cpu: cfg.cpu,
            lift_nice: cfg.lift_nice,
            stop: Arc::default(),
            moving: None,
            budget_checked: Instant::now(),
            lone_idle_since: None,
            last_call: None,
            quiet_since: None,
            confine_when_filled: false,
            ends_with_process: cfg.ends_with_process && cfg.slot.is_some(),
            orders: Arc::default(),
            taking: None,
            kept_map: None,
            handing_over: None,
        };
        let counts = worker.sh.gpu.contexts.counts;
        worker.sh.port.stats.count_contexts(&counts);
        Ok(worker)
    }

    /// Confines the worker (`crate::sandbox`) from the thread that will
    /// run it. While contexts are still being made ahead on a thread of
    /// their own (an MPS client must connect to its server for each), only
    /// this thread is confined now, and every thread once they are all
    /// made (the serving loop looks when it reads the clock).
    pub fn confine(&mut self) -> Result<(), Error> {
        if self.sh.gpu.contexts.filled() {
            return crate::sandbox::confine();
        }
        crate::sandbox::confine_thread()?;
        self.confine_when_filled = true;
        Ok(())
    }
}
