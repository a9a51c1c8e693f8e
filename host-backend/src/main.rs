//! `fairvgpu`: the host daemon and its tools.

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

use std::path::PathBuf;

use host_backend::{attach, bench, cli, config::Config, control, daemon, demo};

#[derive(Parser)]
#[command(
    name = "fairvgpu",
    version,
    about = "Fair sharing of NVIDIA GPUs between KVM virtual machines"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// On an error, print its whole chain and where it came from; log at
    /// debug level unless RUST_LOG says otherwise.
    #[arg(long, global = true)]
    debug: bool,
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
        /// Its vGPU id at the grant service (set by the daemon).
        #[arg(long)]
        id: Option<u32>,
        /// The fd of the daemon's feed (region and doorbells); without it
        /// the worker serves its own region and socket.
        #[arg(long)]
        feed_fd: Option<i32>,
        /// The GPU the vGPU is on now (set by the daemon; default: the
        /// config's).
        #[arg(long)]
        gpu: Option<u32>,
        /// Start as a standby (set by the daemon for an MPS GPU): make the
        /// contexts ahead, then wait on the feed until promoted.
        #[arg(long, requires = "feed_fd")]
        standby: bool,
    },
    /// Move a running vGPU to another GPU of the host (through the API).
    Migrate {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM whose vGPU moves.
        #[arg(long)]
        vm: String,
        /// The target GPU.
        #[arg(long)]
        gpu: u32,
    },
    /// Forbid moving a vGPU (or, with --off, allow it again).
    Pin {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM.
        #[arg(long)]
        vm: String,
        /// Allow moving it again.
        #[arg(long)]
        off: bool,
    },
    /// Live status of the GPUs and vGPUs, from the running daemon.
    Status {
        #[command(flatten)]
        api: ApiArgs,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// A live terminal view of the status (Ctrl-C to leave).
    Top {
        #[command(flatten)]
        api: ApiArgs,
        /// Refresh interval, seconds.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// Sets a vGPU's weight in the running daemon (until the next reload).
    SetWeight {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM.
        vm: String,
        /// The new weight (> 0).
        weight: f64,
    },
    /// Sets a VM's device-memory limit now (until the next reload or restart).
    SetLimit {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM.
        vm: String,
        /// The new limit, MiB.
        mib: u64,
    },
    /// Makes the running daemon re-read its config (as SIGHUP does).
    Reload {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Attach a VM's vGPU to QEMU: hot-plug it through QMP (done by the
    /// daemon, over its API), or print the QEMU arguments / libvirt element
    /// to start the VM with.
    Attach {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM (as named in host.toml).
        #[arg(long)]
        vm: String,
        /// QMP socket of the running QEMU to hot-plug into.
        #[arg(long, required_unless_present = "print")]
        qmp: Option<PathBuf>,
        /// Print instead: `qemu` arguments or the `libvirt` <shmem> element.
        #[arg(long, value_parser = ["qemu", "libvirt"])]
        print: Option<String>,
    },
    /// Hot-unplug a VM's vGPU from a running QEMU (the guest releases it first);
    /// done by the daemon, over its API.
    Detach {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM.
        #[arg(long)]
        vm: String,
        /// QMP socket of the running QEMU.
        #[arg(long)]
        qmp: PathBuf,
        /// Seconds the guest gets to release the device.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Three tenants at weights 1:2:3 on a daemon (sim executor by default),
    /// each a CUDA program (built with cc) in its own process through the
    /// stand-in libcuda.so.1; their shares live, the dashboard served, a
    /// weight changed midway.
    Demo {
        /// Executor the daemon uses.
        #[arg(long, value_enum, default_value = "sim")]
        executor: host_backend::config::ExecutorKind,
        /// Seconds of load (the weight changes at 60% of them).
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
    },
    /// Benchmarks (each prints a baseline measured in the same run).
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
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

/// Where the daemon's API is.
#[derive(clap::Args)]
struct ApiArgs {
    /// The daemon's host.toml (its [api] socket is used).
    #[arg(long, default_value = "/etc/fairvgpu/host.toml")]
    config: PathBuf,
    /// Or the API's unix socket directly.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Or a TCP address (host:port) of the API, with --token-file.
    #[arg(long)]
    tcp: Option<String>,
    /// File with the bearer token for --tcp.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

impl ApiArgs {
    fn target(&self) -> Result<control::ApiTarget> {
        if let Some(addr) = &self.tcp {
            let token = match &self.token_file {
                Some(p) => Some(control::token_from_file(p)?),
                None => None,
            };
            return Ok(control::ApiTarget::Tcp {
                addr: addr.clone(),
                token,
            });
        }
        if let Some(p) = &self.socket {
            return Ok(control::ApiTarget::Unix(p.clone()));
        }
        Ok(control::ApiTarget::Unix(
            Config::load(&self.config)?.api_socket(),
        ))
    }

    fn call(&self, method: &str, path: &str, body: &[u8]) -> Result<serde_json::Value> {
        let (status, body) = control::client_call(&self.target()?, method, path, body)?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .with_context(|| format!("the API answered {status} with no JSON"))?;
        if status != 200 {
            bail!("{}", v["error"].as_str().unwrap_or("request failed"));
        }
        Ok(v)
    }
}

/// A switch given as `on` or `off`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Isolation: one VM under every kind of guest abuse at once, the
    /// guests of two other VMs checked and timed (a baseline phase first).
    Hostile {
        /// Executor the daemon uses.
        #[arg(long, value_enum, default_value = "sim")]
        executor: host_backend::config::ExecutorKind,
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
        /// Which launches go as CUDA graph launches (`[daemon] graph_launches`).
        #[arg(long, value_enum, default_value = "all")]
        graph_launches: host_backend::config::GraphLaunches,
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
    },
    /// Accounting of GPU time: its error against the guest's CUDA events, and its cost.
    Accounting {
        /// Executor to measure.
        #[arg(long, value_enum, default_value = "sim")]
        executor: host_backend::config::ExecutorKind,
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
        executor: host_backend::config::ExecutorKind,
        /// Seconds per phase.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// Migration: a running guest with 1 GiB and 8 GiB moved between two
    /// GPUs; pause and copy rate against the peer bandwidth.
    Migrate {
        /// Executor to run on (cuda needs two GPUs).
        #[arg(long, value_enum, default_value = "sim")]
        executor: host_backend::config::ExecutorKind,
        /// Device memory sizes to move, GiB.
        #[arg(long, value_delimiter = ',', default_values_t = vec![1u64, 8])]
        gib: Vec<u64>,
    },
    /// Kernel slicing: a small tenant's latency beside long kernels, with
    /// launches whole and sliced.
    Slicing {
        /// Executor to run on.
        #[arg(long, value_enum, default_value = "sim")]
        executor: host_backend::config::ExecutorKind,
        /// Seconds per configuration.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// Faults: a guest's out-of-bounds kernel poisons its worker, later the
    /// worker is killed; the other VM's guest must not notice.
    Recovery {
        /// Executor to run on.
        #[arg(long, value_enum, default_value = "sim")]
        executor: host_backend::config::ExecutorKind,
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
        /// Which launches go as CUDA graph launches (`[daemon] graph_launches`).
        #[arg(long, value_enum, default_value = "all")]
        graph_launches: host_backend::config::GraphLaunches,
    },
}

fn parse_pin(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once(',').ok_or("expected GUEST_CPU,WORKER_CPU")?;
    Ok((
        a.trim().parse().map_err(|e| format!("{e}"))?,
        b.trim().parse().map_err(|e| format!("{e}"))?,
    ))
}

/// A path the daemon can use whatever its working directory.
fn absolute(p: &std::path::Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("{}", p.display()))
}

/// An error as one line for the user: each cause once (an error whose text
/// already holds its cause's is not followed by it again), a cause's own
/// lines joined.
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        let c = c.split_whitespace().collect::<Vec<_>>().join(" ");
        if c.is_empty() || msg.contains(&c) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&c);
    }
    msg
}

fn main() {
    let cli = Cli::parse();
    let debug = cli.debug;
    if let Err(e) = run(cli) {
        // Printed here rather than by returning it from main: anyhow would
        // add a backtrace wherever RUST_BACKTRACE is set.
        eprintln!("error: {}", one_line(&e));
        if debug {
            eprintln!("{e:?}");
        }
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let level = if cli.debug { "debug" } else { "info" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into()),
        )
        // Standard error, or in a worker process the copy of it kept when
        // the guests' kernel output took descriptor 2 (`worker/output.rs`).
        .with_writer(host_backend::worker::log_writer)
        // Colour only for a terminal: a log file or journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.cmd {
        Cmd::Serve { config } => Ok(daemon::serve(&Config::load(&config)?, &config)?),
        Cmd::Worker {
            config,
            vm,
            id,
            feed_fd,
            gpu,
            standby,
        } => match daemon::run_worker(
            &Config::load(&config)?,
            &vm,
            id,
            feed_fd.map(|fd| (fd, standby)),
            gpu,
        ) {
            // The daemon tells this exit apart from a crash.
            Err(host_backend::Error::Poisoned(_)) => std::process::exit(daemon::EXIT_POISONED),
            r => Ok(r?),
        },
        Cmd::Migrate { api, vm, gpu } => {
            let body = serde_json::json!({ "gpu": gpu }).to_string();
            let r = api.call(
                "POST",
                &format!("/api/v1/vgpus/{vm}/migrate"),
                body.as_bytes(),
            )?;
            println!(
                "{vm}: on GPU {} (paused {} ms, {} bytes copied)",
                r["gpu"], r["pause_ms"], r["copied_bytes"]
            );
            Ok(())
        }
        Cmd::Pin { api, vm, off } => {
            let body = serde_json::json!({ "pinned": !off }).to_string();
            api.call("POST", &format!("/api/v1/vgpus/{vm}/pin"), body.as_bytes())?;
            println!("{vm}: {}", if off { "may move" } else { "pinned" });
            Ok(())
        }
        Cmd::Status { api, json } => {
            let st = api.call("GET", "/api/v1/status", b"")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print!("{}", cli::render_status(&st));
            }
            Ok(())
        }
        Cmd::Top { api, interval } => loop {
            let st = api.call("GET", "/api/v1/status", b"")?;
            // Clear the screen and home the cursor, then redraw.
            print!("\x1b[2J\x1b[H{}", cli::render_status(&st));
            std::io::Write::flush(&mut std::io::stdout())?;
            std::thread::sleep(std::time::Duration::from_secs_f64(interval.max(0.1)));
        },
        Cmd::SetWeight { api, vm, weight } => {
            let body = serde_json::json!({ "weight": weight }).to_string();
            api.call(
                "POST",
                &format!("/api/v1/vgpus/{vm}/weight"),
                body.as_bytes(),
            )?;
            println!("{vm}: weight {weight}");
            Ok(())
        }
        Cmd::SetLimit { api, vm, mib } => {
            let body = serde_json::json!({ "mib": mib }).to_string();
            api.call(
                "POST",
                &format!("/api/v1/vgpus/{vm}/memory_limit"),
                body.as_bytes(),
            )?;
            println!("{vm}: memory limit {mib} MiB");
            Ok(())
        }
        Cmd::Reload { api } => {
            let r = api.call("POST", "/api/v1/reload", b"")?;
            for n in r["notes"].as_array().into_iter().flatten() {
                println!("{}", n.as_str().unwrap_or_default());
            }
            Ok(())
        }
        Cmd::Attach {
            api,
            vm,
            qmp,
            print,
        } => {
            match (print.as_deref(), qmp) {
                (Some(kind), _) => {
                    let plug = attach::Plug::for_vm(&Config::load(&api.config)?, &vm)?;
                    if kind == "qemu" {
                        println!("{}", plug.qemu_args().join(" "));
                    } else {
                        print!("{}", plug.libvirt_xml());
                    }
                }
                (None, Some(qmp)) => {
                    // The daemon does it: it serves the vGPU and keeps the vCPU threads.
                    let body = serde_json::json!({ "qmp": absolute(&qmp)? }).to_string();
                    let r = api.call(
                        "POST",
                        &format!("/api/v1/vgpus/{vm}/attach"),
                        body.as_bytes(),
                    )?;
                    println!("{vm}: vGPU attached; vCPU threads {}", r["vcpu_threads"]);
                    if let Some(w) = r["warning"].as_str() {
                        eprintln!("warning: {w}");
                    }
                }
                (None, None) => bail!("--qmp or --print is needed"),
            }
            Ok(())
        }
        Cmd::Detach {
            api,
            vm,
            qmp,
            timeout,
        } => {
            let body = serde_json::json!({ "qmp": absolute(&qmp)?, "timeout_seconds": timeout })
                .to_string();
            api.call(
                "POST",
                &format!("/api/v1/vgpus/{vm}/detach"),
                body.as_bytes(),
            )?;
            println!("{vm}: vGPU detached");
            Ok(())
        }
        Cmd::Demo { executor, seconds } => demo::run(executor, seconds),
        Cmd::Bench {
            which: BenchCmd::Ring { mode, iters },
        } => bench::ring::run(mode, iters),
        Cmd::Bench {
            which:
                BenchCmd::Fairness {
                    executor,
                    seconds,
                    sim,
                    graph_launches,
                    slice_us,
                    mps,
                    mps_control,
                    hogs,
                    lift,
                },
        } => {
            if sim {
                bench::fairness_sim::run(seconds)
            } else {
                bench::fairness::run(
                    executor,
                    seconds,
                    transport::SpinPolicy::default(),
                    graph_launches,
                    slice_us.map(|us| us.clamp(100, 1_000_000) * 1000),
                    mps.then_some(mps_control.as_path()),
                    hogs,
                    lift == OnOff::On,
                )
                .map(drop)
            }
        }
        Cmd::Bench {
            which:
                BenchCmd::Overhead {
                    executor,
                    scale,
                    pin,
                    graph_launches,
                },
        } => {
            let n = |x: f64| ((x * scale) as usize).max(2);
            let sizes = bench::overhead::Sizes {
                sync_empty: n(20_000.0),
                sync_20us: n(10_000.0),
                async_launches: 10_000,
                copies: n(10.0),
                probes: n(5.0),
            };
            bench::overhead::run(executor, sizes, pin, graph_launches)
        }
        Cmd::Bench {
            which: BenchCmd::Accounting { executor, seconds },
        } => bench::accounting::run(executor, seconds, transport::SpinPolicy::default()),
        Cmd::Bench {
            which: BenchCmd::Placement { sim, orders },
        } => {
            anyhow::ensure!(
                sim,
                "the placement experiment runs on simulated GPUs: pass --sim"
            );
            bench::placement::run(orders)
        }
        Cmd::Bench {
            which:
                BenchCmd::Space {
                    sim,
                    executor,
                    seconds,
                },
        } => {
            if sim {
                print!("{}", sched_sim::space::report::report()?);
                Ok(())
            } else {
                bench::space::run(executor, seconds)
            }
        }
        Cmd::Bench {
            which: BenchCmd::Migrate { executor, gib },
        } => bench::migrate::run(executor, &gib),
        Cmd::Bench {
            which: BenchCmd::Slicing { executor, seconds },
        } => bench::slicing::run(executor, seconds),
        Cmd::Bench {
            which: BenchCmd::Recovery { executor },
        } => bench::recovery::run(executor),
        Cmd::Bench {
            which:
                BenchCmd::Soak {
                    sim,
                    minutes,
                    guests,
                },
        } => {
            anyhow::ensure!(sim, "the soak runs on the sim executor: pass --sim");
            bench::soak::run(minutes, guests)
        }
        Cmd::Bench {
            which:
                BenchCmd::Hostile {
                    executor,
                    seconds,
                    log,
                },
        } => bench::hostile::run(executor, seconds, log.as_deref()),
        Cmd::GoodGuest { socket } => bench::hostile::good_guest(&socket),
        Cmd::HostileGuest {
            socket,
            seconds,
            seed,
        } => bench::hostile::abuse(&socket, seconds, seed),
        Cmd::SoakGuest {
            socket,
            seed,
            out,
            stop,
        } => bench::soak::guest(&socket, seed, &out, &stop),
        Cmd::Echo { kind, target } => bench::ring::echo(&kind, &target),
    }
}
