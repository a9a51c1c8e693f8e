//! `fairvgpu`: the host daemon and its tools.

use anyhow::Result;
use clap::{Parser, Subcommand};

use host_backend::bench;

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
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Bench {
            which: BenchCmd::Ring { mode, iters },
        } => bench::ring::run(mode, iters),
        Cmd::Echo { kind, target } => bench::ring::echo(&kind, &target),
    }
}
