//! `fairvgpu bench fairness`: three guests with weights 1:2:3 running a
//! 20 us, a 400 us and a 1.6 ms kernel in launch+synchronize loops on one
//! GPU, under fairvgpu's scheduler and under none (the driver's own
//! first-come first-served), in one run; plus each guest alone, for the
//! aggregate throughput. GPU time of a guest = kernels completed x kernel time.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use guest::Gpu;
use protocol::{Dim3, ImageKind};
use transport::{LayoutParams, SpinPolicy};

use daemon::config::{Config, ExecutorKind, GraphLaunches};
use daemon::grant::GrantService;
use daemon::hostcpu::{cpus, HostCpu, Opt};
use daemon::setup::build_executor;
use worker::executor::{sim::SimExecutor, Executor};
use worker::serve::{spawn, WorkerConfig};
use worker::KERNELS_PTX;

use super::threads::CpuUse;

const WEIGHTS: [f64; 3] = [1.0, 2.0, 3.0];
const KERNELS_NS: [u64; 3] = [20_000, 400_000, 1_600_000];
/// A one-thread grid and block.
pub(crate) const ONE: Dim3 = Dim3 { x: 1, y: 1, z: 1 };

fn executors(
    kind: ExecutorKind,
    n: usize,
    graphs: GraphLaunches,
) -> Result<Vec<Box<dyn Executor>>> {
    match kind {
        ExecutorKind::Sim => {
            // One modeled GPU shared by every worker.
            let dev = SimExecutor::new(Default::default());
            Ok((0..n)
                .map(|_| Box::new(dev.clone()) as Box<dyn Executor>)
                .collect())
        }
        ExecutorKind::Cuda => {
            let cfg = config(kind, graphs)?;
            (0..n)
                .map(|_| build_executor(&cfg, 0).map_err(Into::into))
                .collect()
        }
    }
}

/// The region of each of the bench's VMs: one guest thread, one channel,
/// no pinned pool.
pub const GUEST_LAYOUT: LayoutParams = LayoutParams {
    channels: 1,
    ring_entries: 256,
    arena_size: 1 << 20,
    vectors: 1,
    pinned_size: 0,
    partitions: 1,
};

/// The daemon's defaults, with the bench's executor for GPU 0.
pub(crate) fn config(kind: ExecutorKind, graphs: GraphLaunches) -> Result<Config> {
    let mut cfg = Config::parse("[[vm]]\nname = \"b\"\ntenant = \"b\"\nmemory_limit_mib = 1024\n")?;
    cfg.daemon.executor = kind;
    cfg.daemon.graph_launches = graphs;
    Ok(cfg)
}

/// Prints where the shared round's hand-offs went, per guest and in all
/// (see `worker::Handoff`); returns the mean time per grant that no guest
/// held the GPU, µs.
pub(crate) fn print_handoffs(
    stats: &[Arc<worker::serve::Stats>],
    service: &std::collections::HashMap<u32, daemon::grant::VgpuLive>,
    secs: f64,
) -> f64 {
    use worker::serve::HandoffFigures;
    println!(
        "hand-offs under fairvgpu: per guest, grants (given back idle), mean per grant: held, drain at its end, grant to first submission; drains' sleeps; guest wake-ups; the service's release-to-grant"
    );
    let figs: Vec<HandoffFigures> = stats.iter().map(|s| s.handoff.figures()).collect();
    let svc = |g: usize| {
        service
            .get(&(g as u32))
            .map_or((0, 0), |v| (v.handoffs, v.handoff_ns))
    };
    for (g, f) in figs.iter().enumerate() {
        let (n, ns) = svc(g);
        println!(
            "guest {g}: {} service {:.1} us [{n}]",
            f.line(),
            ns as f64 / n.max(1) as f64 / 1e3
        );
    }
    let all = HandoffFigures::sum(&figs);
    let (n, ns) = (0..figs.len())
        .map(svc)
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    // The guests want the GPU throughout: the time none held it is what
    // the hand-offs cost between a RELEASE sent and the next GRANT read.
    let unheld_ns = (secs * 1e9 - all.held_ns as f64).max(0.0);
    let gap_us = unheld_ns / all.grants.max(1) as f64 / 1e3;
    println!(
        "all: {} service {:.1} us [{n}]; held by none {:.2}% of {secs} s, {gap_us:.1} us a grant",
        all.line(),
        ns as f64 / n.max(1) as f64 / 1e3,
        unheld_ns / (secs * 1e9) * 100.0
    );
    gap_us
}

/// Each guest's loop alone and inside its holds in the shared round: the
/// aggregate throughput is the sum over the guests of the share of the
/// round each held times how close to its rate alone it ran meanwhile.
fn print_rates(
    solo: &[f64],
    counts: &[u64],
    stats: &[Arc<worker::serve::Stats>],
    loop_secs: &[f64],
) {
    println!("per guest under fairvgpu: us an iteration alone; share of the round held, us an iteration while holding, rate while holding vs alone");
    for (g, (&rate, &n)) in solo.iter().zip(counts).enumerate() {
        let held_ns = stats[g].handoff.figures().held_ns as f64;
        let held_us = held_ns / 1e3 / n.max(1) as f64;
        println!(
            "guest {g}: alone {:.2} us; held {:.1}%, {held_us:.2} us, {:.3}",
            1e6 / rate.max(1e-9),
            held_ns / (loop_secs[g] * 1e9) * 100.0,
            n as f64 / (held_ns / 1e9).max(1e-9) / rate.max(1e-9)
        );
    }
}

/// Each guest's thread and its worker's CPU: alone (both solo rounds) and
/// in the fair round; then the fair round's other threads and the steal.
fn print_cpu(before: &[Round], after: &[Round], fair: &Round) {
    println!("CPU of each guest's thread and its worker: on a CPU / waiting for one, involuntary switches; alone (both rounds), then under fairvgpu");
    let worker = |r: &Round, g: usize| {
        r.threads
            .0
            .get(&format!("worker-vm{g}"))
            .copied()
            .unwrap_or_default()
    };
    for g in 0..fair.guest_cpu.len() {
        let mut alone = (CpuUse::default(), CpuUse::default());
        for r in [&before[g], &after[g]] {
            alone.0.add(r.guest_cpu[0]);
            alone.1.add(worker(r, g));
        }
        println!(
            "guest {g}: alone guest {} worker {}  shared guest {} worker {}",
            alone.0.line(),
            alone.1.line(),
            fair.guest_cpu[g].line(),
            worker(fair, g).line()
        );
    }
    let (names, steal) = &fair.threads;
    let others: Vec<String> = names
        .iter()
        .filter(|(n, c)| !n.starts_with("worker-vm") && !n.starts_with("guest-") && c.run_ns > 0)
        .map(|(n, c)| format!("{n} {}", c.line()))
        .collect();
    println!(
        "fair round, other threads: {}; steal {:.1} ms of all CPUs",
        others.join("; "),
        *steal as f64 / 1e6
    );
}

/// What the grant service charged each guest in the fair round, as shares
/// of all it charged, beside each one's device time (kernels x its kernel's
/// time alone) and the ratio of the two: a guest whose charges exceed its
/// device time gets less than its weight's share of the device.
fn print_charged(fair: &Round, kernel_ns: &[f64; 3]) {
    let charged: Vec<f64> = (0..3)
        .map(|g| {
            fair.service
                .get(&(g as u32))
                .map_or(0.0, |v| v.charged_ns as f64)
        })
        .collect();
    let total: f64 = charged.iter().sum();
    let parts: Vec<String> = (0..3)
        .map(|g| {
            let device = fair.kernels[g] as f64 * kernel_ns[g];
            format!(
                "guest {g} {:.3} ({:.3} of its device time)",
                charged[g] / total.max(1.0),
                charged[g] / device.max(1.0)
            )
        })
        .collect();
    println!(
        "charged by the grant service, share of all: {}",
        parts.join(", ")
    );
}

/// "first / timed / host / estimated" mean charges per period, with their
/// counts.
fn period_kinds(st: &worker::serve::Stats) -> String {
    let part = |k: usize| {
        let n = st.periods[k].load(Ordering::Relaxed);
        let ns = st.period_charges[k].load(Ordering::Relaxed);
        format!("{:.2} [{n}]", ns as f64 / n.max(1) as f64 / 1e3)
    };
    format!("{} / {} / {} / {}", part(0), part(1), part(2), part(3))
}

/// A guest's loop: given its index, device and kernel, runs until the
/// deadline and returns how many kernels it completed.
pub(crate) type GuestBody =
    dyn Fn(usize, &mut Gpu, &guest::Function, Instant) -> Result<u64> + Send + Sync;

/// What one round measured per guest.
pub(crate) struct Round {
    /// Kernels completed.
    pub kernels: Vec<u64>,
    /// The worker's counters after the round (charged GPU time, launches).
    pub stats: Vec<Arc<worker::serve::Stats>>,
    /// Wall time of the round, the guests' attaching included.
    pub secs: f64,
    /// Each guest's loop alone: from the start they share to its last
    /// kernel's completion (a rate per second of this excludes attaching
    /// and making the context, which a round of a few seconds would feel).
    pub loop_secs: Vec<f64>,
    /// What the grant service knew of each vGPU (by guest index) at the
    /// round's end; empty without the scheduler.
    pub service: std::collections::HashMap<u32, daemon::grant::VgpuLive>,
    /// Each guest thread's CPU over its loop.
    pub guest_cpu: Vec<CpuUse>,
    /// The process's other threads' CPU over the round, by name, and the
    /// machine's steal time, ns.
    pub threads: (std::collections::BTreeMap<String, CpuUse>, u64),
}

/// How a round runs.
#[derive(Clone, Copy)]
pub(crate) struct Setup<'a> {
    pub kind: ExecutorKind,
    /// Weight of each guest index.
    pub weights: &'a [f64],
    /// Under the scheduler (else none: first come first served).
    pub fair: bool,
    /// One busy period in this many timed with events.
    pub sample_every: u64,
    /// Every launch timed with events too.
    pub time_launches: bool,
    /// The scheduler's time slice, ns.
    pub slice_ns: u64,
    pub secs: f64,
    pub spin: SpinPolicy,
    /// Which launches the executor submits as graph launches.
    pub graphs: GraphLaunches,
    /// The guests' contexts are MPS clients: the service knows (see
    /// `GrantService::start_with`).
    pub mps: bool,
    /// How the scheduled guests hold the GPU (see `sched::Sharing`).
    pub sharing: sched::Sharing,
    /// The host CPU options' lifts (see `hostcpu`): the grant service's and
    /// the workers' threads at the lifted nice, and each guest's thread
    /// (as a VM's vCPU thread) while its vGPU holds the GPU; None: neither.
    pub lift: Option<&'a HostCpu>,
    /// The CPUs each guest's thread is pinned to (a host whose VMs are
    /// kept off the CPUs it reserves for itself); None: not pinned.
    pub guest_cpus: Option<&'a [usize]>,
}

/// Runs guests `which` (indices into the weights) at once, each through its
/// own worker; returns what each achieved.
pub(crate) fn run_guests(setup: Setup<'_>, which: &[usize], body: Arc<GuestBody>) -> Result<Round> {
    let Setup {
        kind,
        weights,
        fair,
        sample_every,
        time_launches,
        slice_ns,
        secs,
        spin,
        graphs,
        mps,
        sharing,
        lift,
        guest_cpus,
    } = setup;
    let dir = std::env::temp_dir().join(format!(
        "fairvgpu-fair-{}-{}",
        std::process::id(),
        which.len()
    ));
    std::fs::create_dir_all(&dir)?;
    let svc = if fair {
        let policy = sched::DevicePolicy::default();
        Some(GrantService::start_lifted(
            &dir.join("grant.sock"),
            slice_ns,
            policy,
            mps,
            sharing,
            lift.map(HostCpu::service_lift).unwrap_or_default(),
        )?)
    } else {
        None
    };
    let mut workers = Vec::new();
    let mut socks = Vec::new();
    for (exec, &g) in executors(kind, which.len(), graphs)?.into_iter().zip(which) {
        let sock = dir.join(format!("vm{g}.sock"));
        let layout = GUEST_LAYOUT;
        let wc = WorkerConfig {
            spin,
            grant: svc
                .as_ref()
                .map(|s| (s.path().to_owned(), g as u32, weights[g])),
            sample_every,
            time_launches,
            lift_nice: lift.and_then(HostCpu::nice),
            realtime: lift.is_some_and(HostCpu::realtime),
            // Its guest's thread, as a VM's vCPU thread (written below), for
            // whether a late guest waits for a CPU. No kicks: the bench's
            // vCPU lift moves the same thread's nice value, and a kick's
            // undo after the grant moved would leave the lift's value on a
            // thread that no longer holds the GPU.
            vcpus_file: Some(vcpus_file(&dir, g)),
            vcpu_kick: false,
            ..WorkerConfig::new(&format!("vm{g}"), sock.clone(), layout, 1 << 30)
        };
        workers.push(spawn(&wc, exec)?);
        socks.push(sock);
    }
    let start = Arc::new(Barrier::new(which.len()));
    let cpu0 = super::threads::snapshot();
    let t0 = Instant::now();
    let guests: Vec<_> = which
        .iter()
        .zip(socks)
        .map(|(&g, sock)| {
            let (start, body) = (start.clone(), body.clone());
            // The guest's thread stands in for its VM's vCPU thread.
            let registry = lift.map(|l| l.registry.clone());
            let cpus = guest_cpus.map(<[usize]>::to_vec);
            let vdir = dir.clone();
            std::thread::Builder::new()
                .name(format!("guest-{g}"))
                .spawn(move || -> Result<(u64, f64, CpuUse)> {
                    if let Some(cpus) = cpus {
                        daemon::hostcpu::cpus::pin_current_thread(&cpus)
                            .map_err(|e| anyhow::anyhow!("pinning guest {g}'s thread: {e}"))?;
                    }
                    let tid = nix::unistd::gettid().as_raw() as u32;
                    if let Some(r) = registry {
                        r.set_vcpus(g as u32, vec![tid]);
                    }
                    wire::vcpus::write_vcpus(&vcpus_file(&vdir, g), &[tid])
                        .context("writing a guest's vCPU file")?;
                    let mut gpu = Gpu::connect_with(&sock, spin).context("guest attach")?;
                    let m = gpu.module_load(ImageKind::Ptx, KERNELS_PTX.as_bytes())?;
                    let f = gpu.get_function(m, "spin_ns")?;
                    start.wait();
                    let (t, cpu) = (Instant::now(), CpuUse::this_thread());
                    let n = body(g, &mut gpu, &f, t + Duration::from_secs_f64(secs))?;
                    let cpu = CpuUse::this_thread().since(cpu);
                    Ok((n, t.elapsed().as_secs_f64(), cpu))
                })
                .context("spawning a guest thread")
        })
        .collect::<Result<Vec<_>>>()?;
    let loops = guests
        .into_iter()
        .map(|t| {
            t.join()
                .map_err(|_| anyhow::anyhow!("guest thread panicked"))?
        })
        .collect::<Result<Vec<(u64, f64, CpuUse)>>>();
    let secs = t0.elapsed().as_secs_f64();
    let threads = super::threads::snapshot().since(&cpu0);
    let mut stats = Vec::new();
    for w in workers {
        stats.push(w.stats.clone());
        w.shutdown()?;
    }
    let service = svc.as_ref().map(GrantService::live).unwrap_or_default();
    drop(svc);
    let _ = std::fs::remove_dir_all(&dir);
    let (mut kernels, mut loop_secs, mut guest_cpu) = (Vec::new(), Vec::new(), Vec::new());
    for (n, s, c) in loops? {
        kernels.push(n);
        loop_secs.push(s);
        guest_cpu.push(c);
    }
    Ok(Round {
        kernels,
        stats,
        secs,
        loop_secs,
        service,
        guest_cpu,
        threads,
    })
}

/// VM `vm<g>`'s vCPU file in `dir`, beside its socket: its guest's thread
/// id, which its worker reads as the VM's vCPU threads (whether a late
/// guest waited for a CPU). The tests' sim workers use it too.
pub fn vcpus_file(dir: &std::path::Path, g: usize) -> std::path::PathBuf {
    dir.join(format!("vm{g}.vcpus"))
}

/// The fairness guests: a launch + synchronize loop of their kernel.
fn sync_loop() -> Arc<GuestBody> {
    spin_sync_loop(|g| KERNELS_NS[g])
}

/// Guest `g` launches a spin kernel of `kernel_ns(g)` and synchronizes, in
/// a loop; its kernels completed.
pub(crate) fn spin_sync_loop(
    kernel_ns: impl Fn(usize) -> u64 + Send + Sync + 'static,
) -> Arc<GuestBody> {
    Arc::new(move |g, gpu, f, end| {
        let ns = kernel_ns(g).to_le_bytes();
        let mut n = 0;
        while Instant::now() < end {
            gpu.launch(f, ONE, ONE, 0, 0, &[&ns])?;
            gpu.synchronize()?;
            n += 1;
        }
        Ok(n)
    })
}

/// Starts an MPS control daemon for GPU 0 and makes this process its
/// client (its contexts are made after this, on this thread).
fn mps_clients(control: &std::path::Path) -> Result<daemon::mps::MpsDaemon> {
    let dir = std::env::temp_dir().join(format!("fairvgpu-fair-mps-{}", std::process::id()));
    let d = daemon::mps::MpsDaemon::start(control, &dir, 0)?;
    for (k, v) in d.client_env() {
        std::env::set_var(k, v);
    }
    println!("as clients of an MPS control daemon ({})", dir.display());
    Ok(d)
}

/// The scheduler's base slice the daemon gives GPU 0 on `kind`, ns.
pub fn slice_ns(kind: ExecutorKind) -> u64 {
    config(kind, GraphLaunches::default()).map_or(6_000_000, |c| daemon::setup::gpu_slice_ns(&c, 0))
}

/// Runs the bench; the last line is machine-readable.
///
/// A guest's GPU time is its kernels times the GPU time one of its kernels
/// takes, measured in its solo rounds (half of them before the shared
/// rounds, half after the fair one) by the same accounting as in the
/// shared rounds (busy periods, one in `SAMPLE_EVERY` timed with events,
/// which `bench accounting` checks against the guest's own events). Timing
/// every period instead would add its event marks' device time, some 1.5 us,
/// to each 20 us kernel of the solo round only. A spin kernel occupies the
/// GPU somewhat longer than the time it spins.
/// `graphs`: which launches the executor submits as graph launches;
/// `slice_ns`: the scheduler's base time slice (by default the one the
/// daemon would give GPU 0: docs/design.md's 6 ms where it cannot preempt a
/// kernel, as on the sim, 30 ms where it can); `mps`: the MPS control program to start, whose clients the
/// guests' contexts then are, as on a GPU with `[[gpu]] mps = true` (one
/// hardware context: no context switch at a hand-off); `hogs`: busy-loop
/// processes run beside the guests for the whole bench, solo rounds
/// included (a busy host: [`super::hogs`]), and then every round again
/// without them (the quiet host), the last line
/// `hogs=N fairvgpu_mmr=… fairvgpu_throughput=… quiet_mmr=… quiet_throughput=…`;
/// `lift`: the host CPU options' priority and vCPU lifts at this nice value (see `hostcpu`)
/// where this process may raise priorities (it prints which are on);
/// `cpus`: CPUs reserved for the host's side as `[daemon] cpus` does (the
/// grant service, the workers and their driver threads pinned there), the
/// guests' threads and the hogs pinned to the others, as VMs kept off them.
pub fn run(o: Options<'_>) -> Result<Summary> {
    let Options {
        kind,
        secs,
        spin,
        graphs,
        slice_ns,
        mps,
        hogs,
        lift,
        realtime,
        cpus,
        sharing,
    } = o;
    // First: every thread and process the bench starts after this (the MPS
    // daemon, the lift's thread, the grant service, the workers) inherits it.
    let machine_cpus = cpus::current().len();
    let reserved = cpus.map(reserve).transpose()?;
    // Started before any context exists, and quit at the end (its drop).
    let _mps = match mps {
        Some(control) => Some(mps_clients(control)?),
        None => None,
    };
    let slice_ns = match slice_ns {
        Some(ns) => ns,
        None => daemon::setup::gpu_slice_ns(&config(kind, graphs)?, 0),
    };
    if realtime && lift.is_none() {
        anyhow::bail!("--realtime needs the lifts (--lift on): it lifts the threads they choose");
    }
    let host_cpu = match lift {
        Some(nice) => HostCpu::lifts(nice, true, daemon::hostcpu::lift::SysPriority, realtime),
        None => HostCpu::off("--lift off"),
    };
    let threads = "not used by the bench: its grant service and workers are threads of the bench";
    host_cpu.set(|r| {
        r.cpus = match &reserved {
            Some((host, vms)) => Opt::on(format!(
                "grant service and workers on CPUs {}; the guests' threads (as VMs' vCPUs) and busy-loop processes on {}",
                cpus::format(host),
                cpus::format(vms)
            )),
            None => Opt::off("not set (--cpus)"),
        };
        r.cgroup = Opt::off(threads);
    });
    println!(
        "host CPU options (--lift {}):",
        if lift.is_some() { "on" } else { "off" }
    );
    let reported = host_cpu.report();
    for l in reported.lines() {
        println!("  {l}");
    }
    let guest_cpus = reserved.as_ref().map(|(_, vms)| vms.as_slice());
    // Killed on every way out of this function (their drop).
    let running = match guest_cpus {
        Some(vms) => super::hogs::Hogs::start_on(hogs, vms)?,
        None => super::hogs::Hogs::start(hogs)?,
    };
    let n = running.len();
    if n > 0 {
        println!(
            "{n} busy-loop processes beside the guests on {machine_cpus} CPUs, solo rounds included"
        );
    }
    let at = Params {
        kind,
        secs,
        spin,
        graphs,
        slice_ns,
        mps: mps.is_some(),
        sharing,
        lift: &host_cpu,
        guest_cpus,
    };
    let prefix = if n == 0 {
        String::new()
    } else {
        format!("hogs={n} ")
    };
    let busy = measure(at, &prefix)?;
    drop(running);
    if n == 0 {
        return Ok(busy);
    }
    println!("the same on a quiet host: the busy-loop processes ended");
    let quiet = measure(at, "quiet ")?;
    // The host may have refused the vCPU lift along the way.
    if host_cpu.report() != reported {
        for l in host_cpu.report().lines() {
            println!("at the end, {l}");
        }
    }
    if let (true, Some(st)) = (host_cpu.realtime(), host_cpu.lift_state()) {
        println!(
            "real-time lift: guests' threads moved into SCHED_FIFO {} times, {} of those out at the round's deadline (before the next holder)",
            st.fifo_entries, st.deadlines_passed
        );
    }
    println!(
        "hogs={n} fairvgpu_mmr={:.3} fairvgpu_throughput={:.3} quiet_mmr={:.3} quiet_throughput={:.3}",
        busy.mmr, busy.throughput, quiet.mmr, quiet.throughput
    );
    Ok(Summary {
        quiet: Some((quiet.mmr, quiet.throughput)),
        ..busy
    })
}

/// What [`run`] measures, as `bench fairness` is told.
#[derive(Debug)]
pub struct Options<'a> {
    pub kind: ExecutorKind,
    /// Seconds per policy.
    pub secs: f64,
    pub spin: SpinPolicy,
    pub graphs: GraphLaunches,
    /// The scheduler's base slice, ns; None: the daemon's for GPU 0.
    pub slice_ns: Option<u64>,
    /// The MPS control program to start; None: no MPS.
    pub mps: Option<&'a std::path::Path>,
    /// Busy-loop processes beside the guests.
    pub hogs: usize,
    /// The host CPU options' priority and vCPU lifts, at this nice value
    /// (`[daemon] priority`); None: off.
    pub lift: Option<i32>,
    /// The real-time lift besides (`[daemon] realtime`).
    pub realtime: bool,
    /// CPUs reserved for the host's side (a list like `"0-1"`).
    pub cpus: Option<&'a str>,
    /// How the scheduled guests hold the GPU.
    pub sharing: sched::Sharing,
}

/// Pins this thread to the CPUs `list` names (which every thread started
/// after inherits); returns them and the CPUs left for the VMs.
fn reserve(list: &str) -> Result<(Vec<usize>, Vec<usize>)> {
    let why = |e: String| anyhow::anyhow!("--cpus {list:?}: {e}");
    let (host, vms) =
        cpus::split(&cpus::parse(list).map_err(why)?, &cpus::current()).map_err(why)?;
    cpus::pin_current_thread(&host).map_err(why)?;
    Ok((host, vms))
}

/// What one [`measure`] runs with.
#[derive(Clone, Copy)]
struct Params<'a> {
    kind: ExecutorKind,
    secs: f64,
    spin: SpinPolicy,
    graphs: GraphLaunches,
    slice_ns: u64,
    mps: bool,
    sharing: sched::Sharing,
    lift: &'a HostCpu,
    guest_cpus: Option<&'a [usize]>,
}

/// The solo rounds, the fair round and the unfair one, printed; the last
/// line (machine-readable) starts with `prefix`.
fn measure(at: Params<'_>, prefix: &str) -> Result<Summary> {
    let Params {
        kind,
        secs,
        spin,
        graphs,
        slice_ns,
        mps,
        sharing,
        lift,
        guest_cpus,
    } = at;
    let setup = |fair: bool, secs: f64| Setup {
        kind,
        weights: &WEIGHTS,
        fair,
        sample_every: worker::serve::SAMPLE_EVERY,
        time_launches: false,
        slice_ns,
        secs,
        spin,
        graphs,
        mps,
        sharing,
        lift: Some(lift),
        guest_cpus,
    };
    // Each guest alone, for its rate in the aggregate throughput and its
    // kernel's measured duration: half of the time before the shared
    // rounds and half right after the fair one, so that a machine whose
    // speed drifts during the run (clocks, its neighbours) moves the
    // baseline with it.
    let alone = || -> Result<Vec<Round>> {
        (0..3)
            .map(|g| run_guests(setup(true, secs / 6.0), &[g], sync_loop()))
            .collect()
    };
    let before = alone()?;
    let fair = run_guests(setup(true, secs), &[0, 1, 2], sync_loop())?;
    let after = alone()?;
    let unfair = run_guests(setup(false, secs), &[0, 1, 2], sync_loop())?;
    let rate = |rs: &[Round], g: usize| rs[g].kernels[0] as f64 / rs[g].loop_secs[0];
    let solo: [f64; 3] = std::array::from_fn(|g| (rate(&before, g) + rate(&after, g)) / 2.0);
    // Launch and synchronize: each kernel is a busy period.
    let kernel_ns: [f64; 3] = std::array::from_fn(|g| {
        let sum = |f: fn(&worker::serve::Stats) -> &std::sync::atomic::AtomicU64| {
            [&before[g], &after[g]]
                .iter()
                .map(|r| f(&r.stats[0]).load(Ordering::Relaxed))
                .sum::<u64>()
        };
        sum(|s| &s.charged_ns) as f64 / sum(|s| &s.launches).max(1) as f64
    });
    let solo_stats: Vec<_> = before.iter().map(|r| r.stats[0].clone()).collect();
    println!(
        "kernels per second alone, before / after the fair round: {}",
        (0..3)
            .map(|g| format!("{:.0} / {:.0}", rate(&before, g), rate(&after, g)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "three guests on one GPU ({kind:?} executor), weights 1:2:3, {secs} s per policy, {} ms slices",
        slice_ns as f64 / 1e6
    );
    println!(
        "GPU time per kernel, each guest alone (us): {:.2} {:.2} {:.2}",
        kernel_ns[0] / 1e3,
        kernel_ns[1] / 1e3,
        kernel_ns[2] / 1e3
    );
    println!(
        "{:<8} {:>5} {:>6} {:>10} {:>10} {:>8} {:>8} {:>10}",
        "policy", "guest", "weight", "kernel_us", "gpu_ms", "share", "fair", "charged_us"
    );
    let mut summary = Vec::new();
    for (name, r) in [("fairvgpu", &fair), ("none", &unfair)] {
        let counts = &r.kernels;
        let gpu_ns: Vec<f64> = counts
            .iter()
            .zip(kernel_ns)
            .map(|(&c, k)| c as f64 * k)
            .collect();
        let total: f64 = gpu_ns.iter().sum();
        for g in 0..3 {
            // What the scheduler charged per launch in this round (none: nothing).
            let st = &r.stats[g];
            let charged = st.charged_ns.load(Ordering::Relaxed) as f64
                / st.launches.load(Ordering::Relaxed).max(1) as f64;
            println!(
                "{name:<8} {g:>5} {:>6} {:>10} {:>10.1} {:>8.3} {:>8.3} {:>10.2}",
                WEIGHTS[g],
                KERNELS_NS[g] / 1000,
                gpu_ns[g] / 1e6,
                gpu_ns[g] / total,
                WEIGHTS[g] / 6.0,
                charged / 1e3
            );
        }
        // Aggregate throughput: each guest's rate relative to running alone, summed (ideal 1.0).
        let throughput: f64 = (0..3)
            .map(|g| counts[g] as f64 / r.loop_secs[g] / solo[g])
            .sum();
        summary.push((name, sched::weighted_mmr(&gpu_ns, &WEIGHTS), throughput));
    }
    println!("charge per busy period (us) [periods] by how it was found: first of a grant / timed / host clock / the kernel's timed mean");
    for (g, (alone, shared)) in solo_stats.iter().zip(&fair.stats).enumerate() {
        println!(
            "guest {g}: alone {}  shared {}",
            period_kinds(alone),
            period_kinds(shared)
        );
    }
    print_charged(&fair, &kernel_ns);
    let gap_us = print_handoffs(&fair.stats, &fair.service, secs);
    print_rates(&solo, &fair.kernels, &fair.stats, &fair.loop_secs);
    print_cpu(&before, &after, &fair);
    for (name, m, t) in &summary {
        println!("{name}: MMR {m:.3}, aggregate throughput vs alone {t:.3}");
    }
    let all = worker::serve::HandoffFigures::sum(
        &fair
            .stats
            .iter()
            .map(|s| s.handoff.figures())
            .collect::<Vec<_>>(),
    );
    println!(
        "{prefix}fairvgpu_mmr={:.3} none_mmr={:.3} fairvgpu_throughput={:.3} none_throughput={:.3} grants={} idle_releases={} drain_us={:.1} submit_us={:.1} gap_us={gap_us:.1}",
        summary[0].1,
        summary[1].1,
        summary[0].2,
        summary[1].2,
        all.grants,
        all.idle_releases,
        all.drain_us(),
        all.first_submit_us()
    );
    Ok(Summary {
        mmr: summary[0].1,
        throughput: summary[0].2,
        idle_releases: all.idle_releases,
        quiet: None,
    })
}

/// What `run` found under fairvgpu's scheduler.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// Weighted max-min ratio of the three guests' GPU time.
    pub mmr: f64,
    /// Aggregate throughput against each guest alone.
    pub throughput: f64,
    /// Grants given back because the guest did not ask again in time.
    pub idle_releases: u64,
    /// With hogs: MMR and aggregate throughput measured after them in the
    /// same run, on the quiet host.
    pub quiet: Option<(f64, f64)>,
}
