//! `fairvgpu`: the host daemon and its tools.

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

use std::os::fd::IntoRawFd as _;
use std::path::PathBuf;

use daemon::{attach, config::Config, control, setup, supervisor};

mod demo;
mod render;

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
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Run one vGPU worker (started by `serve`).
    #[command(hide = true)]
    Worker {
        /// Path of host.toml.
        #[arg(long)]
        config: PathBuf,
        /// Which VM (a spare learns it when it is bound).
        #[arg(long, required_unless_present = "spare_fd")]
        vm: Option<String>,
        /// Start as a spare (set by the daemon): open GPU `--gpu`, make a
        /// context, say so on this fd, and wait there to be bound to a
        /// VM's process slot (`worker::spare`).
        #[arg(long, requires = "gpu", conflicts_with_all = ["vm", "feed_fd", "slot"])]
        spare_fd: Option<i32>,
        /// Its vGPU id at the grant service (set by the daemon).
        #[arg(long)]
        id: Option<u32>,
        /// Its `[[vm]]` entry, TOML, for a vGPU declared through the API
        /// rather than listed in host.toml (set by the daemon).
        #[arg(long)]
        declared: Option<String>,
        /// The fd of the daemon's feed (region and doorbells); without it
        /// the worker serves its own region and socket.
        #[arg(long)]
        feed_fd: Option<i32>,
        /// The GPU the vGPU is on now (set by the daemon; default: the
        /// config's).
        #[arg(long)]
        gpu: Option<u32>,
        /// The process slot it serves, in a VM with them (set by the
        /// daemon).
        #[arg(long, requires = "ledger_fd")]
        slot: Option<u32>,
        /// The fd of the VM's memory ledger, for a process slot's worker
        /// (set by the daemon).
        #[arg(long, requires = "slot")]
        ledger_fd: Option<i32>,
        /// The fd of a checkpoint to serve on from (set by the daemon's
        /// restore).
        #[arg(long, requires = "slot")]
        restore_fd: Option<i32>,
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
    /// Hold a vGPU and write its checkpoint to a file of `[daemon]
    /// checkpoint_dir`, before QEMU saves or migrates the VM; it stays held
    /// until `fairvgpu resume` or its VM is gone.
    Checkpoint {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM.
        #[arg(long)]
        vm: String,
        /// The file's name in the checkpoint folder.
        #[arg(long)]
        file: String,
        /// The VM is paused already and stays so until QEMU has saved it:
        /// the region goes into the file too, written over QEMU's copy at
        /// the restore.
        #[arg(long)]
        paused: bool,
        /// Replace a file of that name.
        #[arg(long)]
        replace: bool,
    },
    /// Let a vGPU held by `fairvgpu checkpoint` go on.
    Resume {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM.
        #[arg(long)]
        vm: String,
    },
    /// Serve a VM's processes on from a checkpoint file, or from what
    /// another host handed over, once its QEMU has loaded the VM
    /// (`-incoming`, paused) and before it runs on.
    Restore {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM.
        #[arg(long)]
        vm: String,
        /// The file's name in the checkpoint folder.
        #[arg(
            long,
            required_unless_present = "received",
            conflicts_with = "received"
        )]
        file: Option<String>,
        /// What another host's daemon handed over (`fairvgpu handover`).
        #[arg(long)]
        received: bool,
    },
    /// Hold a vGPU and hand its checkpoint and region to another host's
    /// daemon (`[daemon] handover_listen` there), while QEMU's migration of
    /// the VM waits before its switch-over; held until the VM is gone.
    Handover {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM.
        #[arg(long)]
        vm: String,
        /// The other daemon's address (host:port).
        #[arg(long)]
        to: String,
        /// Send a checkpoint ahead, before QEMU's migration pauses the VM,
        /// and let the vGPU go on: the other host loads its modules then,
        /// and the handover's pause is shorter.
        #[arg(long)]
        ahead: bool,
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
        /// The new weight (> 0; a negative one is refused by the daemon).
        #[arg(allow_negative_numbers = true)]
        weight: f64,
    },
    /// Sets a VM's device-memory limit now (until the next reload or restart).
    SetLimit {
        #[command(flatten)]
        api: ApiArgs,
        /// The VM.
        vm: String,
        /// The new limit, MiB.
        #[arg(allow_negative_numbers = true)]
        mib: i64,
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
    /// Add a vGPU to a libvirt domain's XML, read on stdin and written to
    /// stdout: fairvgpu's metadata element (what `fairvgpu-libvirt` declares
    /// when the domain starts) and the `<shmem>` device; the vGPU is named
    /// after the domain. Then `virsh define` the result.
    LibvirtXml {
        /// The daemon's host.toml (its run_dir and [layout] vectors).
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// The tenant the domain belongs to.
        #[arg(long)]
        tenant: String,
        /// Scheduling weight (> 0).
        #[arg(long, default_value_t = 1.0)]
        weight: f64,
        /// Device memory the vGPU may allocate, MiB.
        #[arg(long)]
        memory_limit_mib: u64,
        /// The GPU it runs on (left out: the daemon places it).
        #[arg(long)]
        gpu: Option<u32>,
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
        executor: daemon::config::ExecutorKind,
        /// Seconds of load (the weight changes at 60% of them).
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
    },
    /// Benchmarks (each prints a baseline measured in the same run).
    #[cfg(feature = "bench")]
    Bench {
        #[command(subcommand)]
        which: bench::cmd::BenchCmd,
    },
    #[cfg(feature = "bench")]
    #[command(flatten)]
    Internal(bench::cmd::Internal),
}

/// Where `serve` and the API's clients look for host.toml unless told.
const DEFAULT_CONFIG: &str = "/etc/fairvgpu/host.toml";

/// Where the daemon's API is.
#[derive(clap::Args)]
struct ApiArgs {
    /// The daemon's host.toml (its [api] socket is used).
    #[arg(long, default_value = DEFAULT_CONFIG)]
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
        // the guests' kernel output took descriptor 2 (`serve/output.rs`).
        .with_writer(worker::serve::log_writer)
        // Colour only for a terminal: a log file or journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.cmd {
        Cmd::Serve { config } => Ok(supervisor::serve(&Config::load(&config)?, &config)?),
        Cmd::Worker {
            config,
            vm,
            id,
            declared,
            feed_fd,
            gpu,
            slot,
            ledger_fd,
            restore_fd,
            spare_fd,
        } => {
            log_panics();
            match (spare_fd, vm, gpu) {
                (Some(fd), _, Some(gpu)) => spare_process(&config, fd, gpu),
                (_, Some(vm), _) => worker_process(
                    &config,
                    declared.as_deref(),
                    &vm,
                    (id, gpu),
                    WorkerFds {
                        feed: feed_fd,
                        slot: slot.zip(ledger_fd),
                        restore: restore_fd,
                    },
                ),
                _ => anyhow::bail!("a worker needs --vm, or --spare-fd and --gpu"),
            }
        }
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
        cmd @ (Cmd::Checkpoint { .. }
        | Cmd::Resume { .. }
        | Cmd::Restore { .. }
        | Cmd::Handover { .. }) => save_cmd(cmd),
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
                print!("{}", render::render_status(&st));
            }
            Ok(())
        }
        Cmd::Top { api, interval } => loop {
            let st = api.call("GET", "/api/v1/status", b"")?;
            // Clear the screen and home the cursor, then redraw.
            print!("\x1b[2J\x1b[H{}", render::render_status(&st));
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
            anyhow::ensure!(mib > 0, "memory limit {mib}: give a positive number of MiB");
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
        } => attach_vm(&api, &vm, qmp, print),
        Cmd::Detach {
            api,
            vm,
            qmp,
            timeout,
        } => detach_vm(&api, &vm, &qmp, timeout),
        Cmd::LibvirtXml {
            config,
            tenant,
            weight,
            memory_limit_mib,
            gpu,
        } => {
            let d = daemon::control::VgpuDeclaration {
                tenant,
                weight,
                memory_limit_mib,
                gpu,
                owner: Some(daemon::libvirt_xml::OWNER.into()),
            };
            libvirt_xml(&Config::load(&config)?, &d)
        }
        Cmd::Demo { executor, seconds } => demo::run(executor, seconds),
        #[cfg(feature = "bench")]
        Cmd::Bench { which } => which.run(),
        #[cfg(feature = "bench")]
        Cmd::Internal(i) => i.run(),
    }
}

/// `fairvgpu libvirt-xml`: the domain XML on stdin, with `d` added, to stdout.
fn libvirt_xml(cfg: &Config, d: &daemon::control::VgpuDeclaration) -> Result<()> {
    use daemon::libvirt_xml as lx;
    let mut xml = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut xml)?;
    let name = lx::domain_name(&xml)?;
    // What the domain's start would be refused for, said now.
    let meta = lx::vgpu_element_xml(d);
    lx::element_declaration(&meta)?;
    let plug = attach::Plug::declared(cfg, &name);
    print!("{}", lx::add_vgpu(&xml, d, &plug.libvirt_xml())?);
    Ok(())
}

/// `fairvgpu attach`: prints the QEMU arguments or libvirt element, or has
/// the daemon hot-plug the vGPU.
fn attach_vm(api: &ApiArgs, vm: &str, qmp: Option<PathBuf>, print: Option<String>) -> Result<()> {
    match (print.as_deref(), qmp) {
        (Some(kind), _) => {
            let plug = attach::Plug::for_vm(&Config::load(&api.config)?, vm)?;
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

/// `fairvgpu detach`: has the daemon hot-unplug the vGPU.
fn detach_vm(api: &ApiArgs, vm: &str, qmp: &std::path::Path, timeout: u64) -> Result<()> {
    let body = serde_json::json!({ "qmp": absolute(qmp)?, "timeout_seconds": timeout }).to_string();
    api.call(
        "POST",
        &format!("/api/v1/vgpus/{vm}/detach"),
        body.as_bytes(),
    )?;
    println!("{vm}: vGPU detached");
    Ok(())
}

/// `fairvgpu worker`: one vGPU worker process, as the daemon's config says.
/// `fairvgpu checkpoint`, `resume`, `restore` and `handover`.
fn save_cmd(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Checkpoint {
            api,
            vm,
            file,
            paused,
            replace,
        } => save_command(
            &api,
            &vm,
            "checkpoint",
            &serde_json::json!({ "file": file, "paused": paused, "replace": replace }),
        ),
        Cmd::Resume { api, vm } => save_command(&api, &vm, "resume", &serde_json::json!({})),
        Cmd::Restore {
            api,
            vm,
            file,
            received,
        } => {
            let body = serde_json::json!({ "file": file, "received": received });
            save_command(&api, &vm, "restore", &body)
        }
        Cmd::Handover { api, vm, to, ahead } => {
            let body = serde_json::json!({ "to": to, "ahead": ahead });
            save_command(&api, &vm, "handover", &body)
        }
        _ => unreachable!("save_cmd is given a save command"),
    }
}

/// `fairvgpu checkpoint`, `resume`, `restore` and `handover`: `verb`
/// asked of `vm`'s vGPU through the API with `body`.
fn save_command(api: &ApiArgs, vm: &str, verb: &str, body: &serde_json::Value) -> Result<()> {
    let r = api.call(
        "POST",
        &format!("/api/v1/vgpus/{vm}/{verb}"),
        body.to_string().as_bytes(),
    )?;
    let text = |k: &str| r[k].as_str().unwrap_or("?").to_owned();
    match verb {
        "checkpoint" => println!(
            "{vm}: held; {} processes' checkpoint in {} ({} bytes)",
            r["processes"],
            text("file"),
            r["bytes"]
        ),
        "restore" => println!(
            "{vm}: {} processes serve on from {} ({} modules loaded ahead)",
            r["processes"],
            text("from"),
            r["modules_loaded_ahead"]
        ),
        "handover" if r["ahead"] == serde_json::Value::Bool(true) => println!(
            "{vm}: sent ahead to {} ({} bytes, in {:.0} ms): {}; it goes on here",
            text("to"),
            r["bytes"],
            r["send_ms"].as_f64().unwrap_or(0.0),
            text("peer")
        ),
        "handover" => println!(
            "{vm}: handed to {} ({} processes, {} bytes of checkpoints and a region of {} bytes, in {:.0} ms); held until it is gone",
            text("to"),
            r["processes"],
            r["bytes"],
            r["region_bytes"],
            r["send_ms"].as_f64().unwrap_or(0.0)
        ),
        _ => println!("{vm}: goes on"),
    }
    Ok(())
}

/// A worker's panic goes to the daemon's log too: the worker's standard
/// error is its guests' (kernel printf), where the default hook writes.
fn log_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!("worker panicked: {info}");
        default(info);
    }));
}

/// The fds the daemon hands a worker: its feed, its slot with the VM's
/// ledger, and a checkpoint to serve on from.
struct WorkerFds {
    feed: Option<i32>,
    slot: Option<(u32, i32)>,
    restore: Option<i32>,
}

fn worker_process(
    config: &std::path::Path,
    declared: Option<&str>,
    vm: &str,
    (id, gpu): (Option<u32>, Option<u32>),
    fds: WorkerFds,
) -> Result<()> {
    let cfg = worker_config(config, declared, vm)?;
    let mut spec = setup::worker_spec(&cfg, vm, id, fds.feed, gpu, fds.slot)?;
    spec.restore = fds.restore;
    exit_as_worker(worker::process::run(&spec))
}

/// The config a worker of `vm` reads: host.toml, with `declared` (a vGPU
/// declared through the API, which is not in it) in place of its entry.
fn worker_config(config: &std::path::Path, declared: Option<&str>, vm: &str) -> Result<Config> {
    let mut cfg = Config::load(config)?;
    if let Some(entry) = declared {
        let v: daemon::config::VmConfig =
            toml::from_str(entry).context("the declared vGPU's entry")?;
        anyhow::ensure!(
            v.name == vm,
            "the declared entry is {:?}'s, not {vm:?}'s",
            v.name
        );
        cfg.vms.retain(|o| o.name != v.name);
        cfg.vms.push(v);
    }
    Ok(cfg)
}

/// A worker's end: a poisoned one exits with `EXIT_POISONED`.
fn exit_as_worker(r: Result<(), worker::Error>) -> Result<()> {
    match r {
        // The daemon tells this exit apart from a crash.
        Err(worker::Error::Poisoned(_)) => std::process::exit(worker::process::EXIT_POISONED),
        r => Ok(r?),
    }
}

/// A spare worker (see the daemon's `supervisor/spares.rs`): GPU `gpu`
/// opened and a context made, then, once bound over `fd` to a VM's process
/// slot, that slot's worker (as `worker_process` with `--slot`).
fn spare_process(config: &std::path::Path, fd: i32, gpu: u32) -> Result<()> {
    let cfg = Config::load(config)?;
    let mps = cfg.gpu_mps(gpu) && cfg.daemon.executor == daemon::config::ExecutorKind::Cuda;
    let sock = std::os::unix::net::UnixStream::from(worker::feed::feed_from_fd(fd)?);
    let mut warm =
        worker::process::spare(&setup::executor_spec(&cfg), if mps { 0 } else { gpu }, mps)?;
    // Bound while it was starting, its binding waits in the socket and the
    // daemon's end is closed: the word is not heard, and need not be.
    let _ = worker::spare::say_ready(&sock);
    let mut staged_for = None;
    let bound = loop {
        match worker::spare::recv_order(&sock)? {
            worker::spare::Order::Stage { vm, stream } => {
                let t = std::time::Instant::now();
                let n = warm.stage(&stream).unwrap_or_else(|e| {
                    tracing::warn!(vm, gpu, "loading a vGPU's modules ahead: {e}");
                    0
                });
                let ms = t.elapsed().as_millis();
                tracing::debug!(
                    vm,
                    gpu,
                    modules = n,
                    ms,
                    "modules loaded ahead of a restore"
                );
                let _ = worker::spare::say_staged(&sock, n);
                staged_for = Some(vm);
            }
            worker::spare::Order::Bind(b) => break b,
        }
    };
    drop(sock);
    if !bound.binding.restore || staged_for.as_deref() != Some(bound.binding.vm.as_str()) {
        // Another VM's modules are not this one's to keep.
        warm.unstage();
    }
    let b = &bound.binding;
    // Read now, not at the spare's start: the VM may be newer than it.
    let cfg = worker_config(config, b.declared.as_deref(), &b.vm)?;
    let mut spec = setup::worker_spec(
        &cfg,
        &b.vm,
        Some(b.id),
        Some(bound.feed.into_raw_fd()),
        Some(gpu),
        Some((b.slot, bound.ledger.into_raw_fd())),
    )?;
    spec.restore = bound.stream.map(|s| s.into_raw_fd());
    tracing::debug!(
        vm = b.vm,
        slot = b.slot,
        gpu,
        restore = b.restore,
        "spare worker bound"
    );
    exit_as_worker(worker::process::run_warm(&spec, Some(warm)))
}
