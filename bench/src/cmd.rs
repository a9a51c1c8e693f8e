//! The `fairvgpu bench` command line: which benchmark, with what, and the
//! internal subcommands a benchmark starts its helper processes with.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

/// `[[gpu]] sharing` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sharing {
    /// Every vGPU with work at once, one ahead of its share held back.
    Concurrent,
    /// One vGPU a slice.
    Exclusive,
}

impl From<Sharing> for sched::Sharing {
    fn from(s: Sharing) -> Self {
        match s {
            Sharing::Concurrent => sched::Sharing::Concurrent,
            Sharing::Exclusive => sched::Sharing::Exclusive,
        }
    }
}

/// A switch given as `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Isolation: one VM under every kind of guest abuse at once, the
    /// guests of two other VMs checked and timed (a baseline phase first).
    Hostile {
        /// Executor the daemon uses.
        #[arg(long, value_enum, default_value = "sim")]
        executor: daemon::config::ExecutorKind,
        /// Seconds per phase (baseline, then abuse).
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        /// Keep the daemon's log (its workers' too) in this file.
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Transport: ring round trip vs unix socket and TCP, or arena throughput vs memcpy.
    Ring {
        /// What to measure.
        #[arg(long, value_enum, default_value = "latency")]
        mode: crate::ring::Mode,
        /// Measured iterations.
        #[arg(long, default_value_t = 200_000)]
        iters: usize,
    },
    /// Scheduling: three guests 1:2:3 with 20 us / 400 us / 1.6 ms kernels, ours vs none.
    Fairness {
        /// Executor to measure.
        #[arg(long, value_enum, default_value = "sim")]
        executor: daemon::config::ExecutorKind,
        /// Seconds per policy (simulated seconds with --sim).
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Run FairGV's scenarios in the discrete-event simulator, every
        /// policy side by side, instead of guests on an executor.
        #[arg(long)]
        sim: bool,
        /// Which launches go as CUDA graph launches (`[daemon] graph_launches`).
        #[arg(long, value_enum, default_value = "all")]
        graph_launches: daemon::config::GraphLaunches,
        /// How the scheduled guests hold the GPU (`[[gpu]] sharing`).
        #[arg(long, value_enum, default_value = "concurrent")]
        sharing: Sharing,
        /// After the three guests, the density scenario with these VM
        /// counts (latency-bound loops, equal weights) and the two mixes;
        /// the last line then gives all their figures.
        #[arg(long, value_delimiter = ',', conflicts_with = "sim")]
        density: Vec<usize>,
        /// With --density: that scenario alone, a line per VM count.
        #[arg(long, requires = "density")]
        density_only: bool,
        /// The two mixes alone (1:2:3 weights; one GPU-bound guest among
        /// seven latency-bound), their last line their figures.
        #[arg(long, conflicts_with_all = ["density", "sim"])]
        mix_only: bool,
        /// The scheduler's base time slice, µs; by default the daemon's for
        /// GPU 0 (`[daemon] preemptive_slice_us`, 30 ms, where it can
        /// preempt a running kernel; `slice_us`, 6 ms, where it cannot, as
        /// on the sim).
        #[arg(long)]
        slice_us: Option<u64>,
        /// Run the guests' contexts as clients of an MPS control daemon
        /// started for the bench, as on a GPU with `[[gpu]] mps = true`.
        #[arg(long)]
        mps: bool,
        /// The MPS control program (`[daemon] mps_control`).
        #[arg(long, default_value = "nvidia-cuda-mps-control")]
        mps_control: std::path::PathBuf,
        /// Busy-loop processes run beside the guests for the whole bench
        /// (a busy host; each guest's alone rate is measured beside them
        /// too); the last line then starts with `hogs=N`.
        #[arg(long, default_value_t = 0, conflicts_with = "sim")]
        hogs: usize,
        /// The host CPU options' lifts (`[daemon] priority`, `vcpu_lift`):
        /// the grant service and workers at nice -10, and each guest's
        /// thread while its vGPU holds the GPU; "on" where this process may
        /// raise priorities (it prints which options are on).
        #[arg(long, value_enum, default_value = "on", conflicts_with = "sim")]
        lift: OnOff,
        /// CPUs reserved for the host's side, as `[daemon] cpus` (a list
        /// like "0-1"): the grant service and workers run there, the guests'
        /// threads and the busy-loop processes on the other CPUs, as on a
        /// host that keeps its VMs off the CPUs it reserves.
        #[arg(long, conflicts_with = "sim")]
        cpus: Option<String>,
        /// The nice value of the lifts (`[daemon] priority`, -20..=-1).
        #[arg(long, default_value_t = -10, allow_negative_numbers = true,
              value_parser = clap::value_parser!(i32).range(-20..=-1), conflicts_with = "sim")]
        priority: i32,
        /// The real-time lift (`[daemon] realtime`) besides the lifts:
        /// while another guest waits for the GPU, the holder's thread, its
        /// worker's and the grant service's run in SCHED_FIFO until the
        /// round's deadline, where this process may (it prints whether).
        #[arg(long, conflicts_with = "sim")]
        realtime: bool,
    },
    /// Accounting of GPU time: its error against the guest's CUDA events, and its cost.
    Accounting {
        /// Executor to measure.
        #[arg(long, value_enum, default_value = "sim")]
        executor: daemon::config::ExecutorKind,
        /// Seconds per run (twelve runs).
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
    /// Load and leaks: guest processes with random call mixes (bad inputs
    /// among them) killed and replaced at random, on the sim executor.
    Soak {
        /// Run on the sim executor (the only one the soak uses).
        #[arg(long)]
        sim: bool,
        /// Minutes of load.
        #[arg(long, default_value_t = 10.0)]
        minutes: f64,
        /// Guest processes (4 per VM).
        #[arg(long, default_value_t = 32)]
        guests: usize,
    },
    /// Placement: DCUDA's experiment, least-loaded static placement vs
    /// fairvgpu's balancing, on simulated GPUs.
    Placement {
        /// Simulated GPUs (the only kind the experiment uses).
        #[arg(long)]
        sim: bool,
        /// Random arrival orders.
        #[arg(long, default_value_t = 50)]
        orders: usize,
    },
    /// Space sharing: time slices against co-running (MPS-like) with SM-time
    /// charges, phase selection, and LAS/TFS beside the fair queue, on a
    /// simulated GPU of SMs and copy engines.
    Space {
        /// The simulated experiment (a model of a GPU's SMs and copy
        /// engines) instead of guests on a daemon.
        #[arg(long)]
        sim: bool,
        /// Executor of the daemon's run (cuda: co-running under MPS).
        #[arg(long, value_enum, default_value = "sim")]
        executor: daemon::config::ExecutorKind,
        /// Seconds per phase.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// Migration: a running guest with 1 GiB and 8 GiB moved between two
    /// GPUs; pause and copy rate against the peer bandwidth.
    Migrate {
        /// Executor to run on (cuda needs two GPUs).
        #[arg(long, value_enum, default_value = "sim")]
        executor: daemon::config::ExecutorKind,
        /// Device memory sizes to move, GiB.
        #[arg(long, value_delimiter = ',', default_values_t = vec![1u64, 8])]
        gib: Vec<u64>,
    },
    /// Checkpoint: a running vGPU's checkpoint sent over TCP to another
    /// worker (on another GPU where there is one), which serves on from it;
    /// the guest's pause against the link's rate.
    Checkpoint {
        /// Executor to run on.
        #[arg(long, value_enum, default_value = "sim")]
        executor: daemon::config::ExecutorKind,
        /// Device memory the guest holds, MiB.
        #[arg(long, default_value_t = 1024)]
        mib: u64,
    },
    /// Kernel slicing: a small tenant's latency beside long kernels, with
    /// launches whole and sliced.
    Slicing {
        /// Executor to run on.
        #[arg(long, value_enum, default_value = "sim")]
        executor: daemon::config::ExecutorKind,
        /// Seconds per configuration.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// Faults: a guest's out-of-bounds kernel poisons its worker, later the
    /// worker is killed; the other VM's guest must not notice.
    Recovery {
        /// Executor to run on.
        #[arg(long, value_enum, default_value = "sim")]
        executor: daemon::config::ExecutorKind,
    },
    /// The daemons' handover path (a save file under a key over loopback
    /// TCP, as a live move sends a vGPU) against the bare link, in turn.
    HandoverLink {
        /// MiB of data a round.
        #[arg(long, default_value_t = 256)]
        mib: usize,
        /// Rounds, each the bare link then the handover path.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Of every 5 blocks of 64 KiB, how many are zero pages (written,
        /// so read and compared; a PyTorch handover's stream had 3 in 5).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=4))]
        zeros: u8,
    },
    /// The host side at density: a daemon with N VMs over G GPUs, its and
    /// its workers' CPU and memory with no guests, idle guests and busy
    /// ones, and its CPU per grant.
    Scale {
        /// Executor the daemon uses.
        #[arg(long, value_enum, default_value = "sim")]
        executor: daemon::config::ExecutorKind,
        /// VMs, spread over the GPUs in turn.
        #[arg(long, default_value_t = 64)]
        vms: usize,
        /// GPUs (on the sim, simulated ones).
        #[arg(long, default_value_t = 4)]
        gpus: u32,
        /// Seconds per phase.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// Data path: the same CUDA workload native vs through the ring and a worker.
    Overhead {
        /// Executor to measure.
        #[arg(long, value_enum, default_value = "sim")]
        executor: daemon::config::ExecutorKind,
        /// Scale all iteration counts (1.0 = the full run).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Pin the guest (and the native loop) and the worker: GUEST_CPU,WORKER_CPU.
        #[arg(long, value_parser = parse_pin)]
        pin: Option<(usize, usize)>,
        /// Which launches go as CUDA graph launches (`[daemon] graph_launches`).
        #[arg(long, value_enum, default_value = "all")]
        graph_launches: daemon::config::GraphLaunches,
    },
}

impl BenchCmd {
    /// Runs the benchmark.
    pub fn run(self) -> Result<()> {
        match self {
            BenchCmd::Ring { mode, iters } => crate::ring::run(mode, iters),
            BenchCmd::HandoverLink { mib, rounds, zeros } => {
                crate::handover_link::run(mib, rounds, zeros)
            }
            BenchCmd::Scale {
                executor,
                vms,
                gpus,
                seconds,
            } => crate::scale::run(crate::scale::Options {
                kind: executor,
                vms,
                gpus,
                secs: seconds,
            }),
            BenchCmd::Fairness {
                executor,
                seconds,
                sim,
                graph_launches,
                sharing,
                density,
                density_only,
                mix_only,
                slice_us,
                mps,
                mps_control,
                hogs,
                lift,
                cpus,
                priority,
                realtime,
            } => {
                if sim {
                    crate::fairness_sim::run(seconds)
                } else {
                    let slice_ns = slice_us.map(|us| us.clamp(100, 1_000_000) * 1000);
                    let dense = crate::density::Options {
                        kind: executor,
                        secs: seconds,
                        graphs: graph_launches,
                        slice_ns: slice_ns.unwrap_or_else(|| crate::fairness::slice_ns(executor)),
                        vms: &density,
                        sharing: sharing.into(),
                    };
                    if mix_only {
                        let (t, s) = crate::density::mixes(&dense)?;
                        println!("mix_throughput={t:.3} mix_min_share={s:.3}");
                        return Ok(());
                    }
                    if density_only {
                        for &n in &density {
                            let (t, m) = crate::density::density(&dense, n)?;
                            println!("vms={n} throughput_vs_unscheduled={t:.3} mmr={m:.3}");
                        }
                        return Ok(());
                    }
                    let three = crate::fairness::run(crate::fairness::Options {
                        kind: executor,
                        secs: seconds,
                        spin: transport::SpinPolicy::default(),
                        graphs: graph_launches,
                        slice_ns,
                        mps: mps.then_some(mps_control.as_path()),
                        hogs,
                        lift: (lift == OnOff::On).then_some(priority),
                        realtime,
                        cpus: cpus.as_deref(),
                        sharing: sharing.into(),
                    })?;
                    if density.is_empty() {
                        return Ok(());
                    }
                    let f = crate::density::run(dense)?;
                    println!(
                        "vms={} throughput_vs_unscheduled={:.3} mmr={:.3} mix_throughput={:.3} mix_min_share={:.3} bench_mmr={:.3} bench_throughput={:.3}",
                        f.vms, f.throughput, f.mmr, f.mix_throughput, f.mix_min_share, three.mmr, three.throughput
                    );
                    Ok(())
                }
            }
            BenchCmd::Overhead {
                executor,
                scale,
                pin,
                graph_launches,
            } => {
                let n = |x: f64| ((x * scale) as usize).max(2);
                let sizes = crate::overhead::Sizes {
                    sync_empty: n(20_000.0),
                    sync_20us: n(10_000.0),
                    async_launches: 10_000,
                    copies: n(10.0),
                    probes: n(5.0),
                };
                crate::overhead::run(executor, sizes, pin, graph_launches)
            }
            BenchCmd::Accounting { executor, seconds } => {
                crate::accounting::run(executor, seconds, transport::SpinPolicy::default())
            }
            BenchCmd::Placement { sim, orders } => {
                anyhow::ensure!(
                    sim,
                    "the placement experiment runs on simulated GPUs: pass --sim"
                );
                crate::placement::run(orders)
            }
            BenchCmd::Space {
                sim,
                executor,
                seconds,
            } => {
                if sim {
                    print!("{}", sched_sim::space::report::report()?);
                    Ok(())
                } else {
                    crate::space::run(executor, seconds)
                }
            }
            BenchCmd::Migrate { executor, gib } => crate::migrate::run(executor, &gib),
            BenchCmd::Checkpoint { executor, mib } => crate::checkpoint::run(executor, mib),
            BenchCmd::Slicing { executor, seconds } => crate::slicing::run(executor, seconds),
            BenchCmd::Recovery { executor } => crate::recovery::run(executor),
            BenchCmd::Soak {
                sim,
                minutes,
                guests,
            } => {
                anyhow::ensure!(sim, "the soak runs on the sim executor: pass --sim");
                crate::soak::run(minutes, guests)
            }
            BenchCmd::Hostile {
                executor,
                seconds,
                log,
            } => crate::hostile::run(executor, seconds, log.as_deref()),
        }
    }
}

/// The helper processes benchmarks start (`current_exe` with these).
#[derive(Subcommand, Debug)]
pub enum Internal {
    /// Internal: the peer process of a bench.
    #[command(name = "__echo", hide = true)]
    Echo { kind: String, target: String },
    /// Internal: a new good guest process of the hostile bench.
    #[command(name = "__good-guest", hide = true)]
    GoodGuest {
        #[arg(long)]
        socket: PathBuf,
    },
    /// Internal: the hostile process of the hostile bench.
    #[command(name = "__hostile-guest", hide = true)]
    HostileGuest {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        seconds: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Internal: one guest process of the soak bench.
    #[command(name = "__soak-guest", hide = true)]
    SoakGuest {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        stop: PathBuf,
    },
}

impl Internal {
    /// Runs the helper process.
    pub fn run(self) -> Result<()> {
        match self {
            Internal::GoodGuest { socket } => crate::hostile::good_guest(&socket),
            Internal::HostileGuest {
                socket,
                seconds,
                seed,
            } => crate::hostile::abuse(&socket, seconds, seed),
            Internal::SoakGuest {
                socket,
                seed,
                out,
                stop,
            } => crate::soak::guest(&socket, seed, &out, &stop),
            Internal::Echo { kind, target } => crate::ring::echo(&kind, &target),
        }
    }
}

fn parse_pin(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once(',').ok_or("expected GUEST_CPU,WORKER_CPU")?;
    Ok((
        a.trim().parse().map_err(|e| format!("{e}"))?,
        b.trim().parse().map_err(|e| format!("{e}"))?,
    ))
}
