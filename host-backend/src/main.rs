//! `fairvgpu`: the host daemon and its tools.

use anyhow::Result;
use clap::{Parser, Subcommand};

use std::path::PathBuf;

use host_backend::{bench, config::Config, daemon, demo};

#[derive(Parser)]
#[command(
    name = "fairvgpu",
    version,
    about = "Fair sharing of NVIDIA GPUs between KVM virtual machines"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the VMs of a config file: one vGPU worker process each.
    Serve {
        /// Path of host.toml.
        #[arg(long)]
        config: PathBuf,
    },
    /// Run one vGPU worker (started by `serve`).
    Worker {
        /// Path of host.toml.
        #[arg(long)]
        config: PathBuf,
        /// Which VM.
        #[arg(long)]
        vm: String,
    },
    /// Start a daemon (sim executor by default) and a demo guest; check its results.
    Demo {
        /// Executor the daemon uses.
        #[arg(long, value_enum, default_value = "sim")]
        executor: host_backend::config::ExecutorKind,
    },
    /// Benchmarks (each prints a baseline measured in the same run).
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
    /// Internal: the peer process of a bench.
    #[command(name = "__echo", hide = true)]
    Echo { kind: String, target: String },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Transport: ring round trip vs unix socket and TCP, or arena throughput vs memcpy.
    Ring {
        /// What to measure.
        #[arg(long, value_enum, default_value = "latency")]
        mode: bench::ring::Mode,
        /// Measured iterations.
        #[arg(long, default_value_t = 200_000)]
        iters: usize,
    },
    /// Scheduling: three guests 1:2:3 with 20 us / 400 us / 1.6 ms kernels, ours vs none.
    Fairness {
        /// Executor to measure.
        #[arg(long, value_enum, default_value = "sim")]
        executor: host_backend::config::ExecutorKind,
        /// Seconds per policy (simulated seconds with --sim).
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Run FairGV's scenarios in the discrete-event simulator, every
        /// policy side by side, instead of guests on an executor.
        #[arg(long)]
        sim: bool,
    },
    /// Sampled accounting: its error against CUDA events on every launch, and its cost.
    Accounting {
        /// Executor to measure.
        #[arg(long, value_enum, default_value = "sim")]
        executor: host_backend::config::ExecutorKind,
        /// Seconds per run (nine runs).
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
    /// Data path: the same CUDA workload native vs through the ring and a worker.
    Overhead {
        /// Executor to measure.
        #[arg(long, value_enum, default_value = "sim")]
        executor: host_backend::config::ExecutorKind,
        /// Scale all iteration counts (1.0 = the full run).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Pin the guest (and the native loop) and the worker: GUEST_CPU,WORKER_CPU.
        #[arg(long, value_parser = parse_pin)]
        pin: Option<(usize, usize)>,
    },
}

fn parse_pin(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once(',').ok_or("expected GUEST_CPU,WORKER_CPU")?;
    Ok((
        a.trim().parse().map_err(|e| format!("{e}"))?,
        b.trim().parse().map_err(|e| format!("{e}"))?,
    ))
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Serve { config } => Ok(daemon::serve(&Config::load(&config)?, &config)?),
        Cmd::Worker { config, vm } => Ok(daemon::run_worker(&Config::load(&config)?, &vm)?),
        Cmd::Demo { executor } => demo::run(executor),
        Cmd::Bench {
            which: BenchCmd::Ring { mode, iters },
        } => bench::ring::run(mode, iters),
        Cmd::Bench {
            which:
                BenchCmd::Fairness {
                    executor,
                    seconds,
                    sim,
                },
        } => {
            if sim {
                bench::fairness_sim::run(seconds)
            } else {
                bench::fairness::run(executor, seconds, qemu_ivshmem::SpinPolicy::default())
            }
        }
        Cmd::Bench {
            which:
                BenchCmd::Overhead {
                    executor,
                    scale,
                    pin,
                },
        } => {
            let n = |x: f64| ((x * scale) as usize).max(2);
            let sizes = bench::overhead::Sizes {
                sync_empty: n(20_000.0),
                sync_20us: n(10_000.0),
                async_launches: 10_000,
                copies: n(10.0),
            };
            bench::overhead::run(executor, sizes, pin)
        }
        Cmd::Bench {
            which: BenchCmd::Accounting { executor, seconds },
        } => bench::accounting::run(executor, seconds, qemu_ivshmem::SpinPolicy::default()),
        Cmd::Echo { kind, target } => bench::ring::echo(&kind, &target),
    }
}
