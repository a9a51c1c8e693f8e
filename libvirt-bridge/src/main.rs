//! `fairvgpu-libvirt`: libvirt's domains get and give back their vGPUs,
//! through the daemon's control API. The one binary of fairvgpu that links
//! libvirt (the `fairvgpu` binary goes to hosts without it).
//!
//! - `hook`: libvirt's qemu hook (`packaging/libvirt-hook`), the synchronous
//!   start and stop of each domain (see `hook.rs`);
//! - `watch`: the live side, domain events and reconciliation (`watch.rs`,
//!   `events.rs`; `packaging/fairvgpu-libvirt.service`), and the vGPU saved
//!   and restored with its domain (`saves.rs`).

use std::io::Read as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use daemon::control::ApiTarget;

mod api;
mod events;
mod hook;
mod saves;
mod watch;

#[derive(Debug, Parser)]
#[command(name = "fairvgpu-libvirt", version, about)]
struct Cli {
    /// The daemon's control API socket.
    #[arg(long, default_value = "/run/fairvgpu/api.sock")]
    api: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// libvirt's qemu hook: the domain XML on stdin.
    Hook {
        /// The domain's name.
        domain: String,
        /// libvirt's operation (prepare, release, reconnect, migrate, ...).
        op: String,
        /// Its phase (begin, end).
        phase: String,
        /// What libvirt passes beyond (ignored).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        rest: Vec<String>,
    },
    /// Follow libvirt's domains: live metadata changes, stops, and
    /// reconciliation with the daemon (runs until killed).
    Watch {
        /// libvirt's connection URI.
        #[arg(long, default_value = "qemu:///system")]
        uri: String,
        /// Seconds between reconciliations.
        #[arg(long, default_value_t = 5.0)]
        every: f64,
    },
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        // libvirt shows a failed hook's output as the domain's start error.
        eprintln!("{e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let api = api::Api(ApiTarget::Unix(cli.api));
    match cli.cmd {
        Cmd::Hook {
            domain, op, phase, ..
        } => {
            let mut xml = String::new();
            std::io::stdin().read_to_string(&mut xml)?;
            hook::run(&api, &domain, &op, &phase, &xml)
        }
        Cmd::Watch { uri, every } => {
            if !(every.is_finite() && every > 0.0) {
                bail!("--every must be a positive number of seconds");
            }
            watch::run(api, &uri, Duration::from_secs_f64(every))
        }
    }
}
