//! A `fairvgpu serve` child process for the benches that need the real
//! daemon (workers as processes, restarts, the status API).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use daemon::config::ExecutorKind;
use daemon::control::{client_call, ApiTarget};

/// The daemon's log in its run directory, when it goes to a file.
const LOG_FILE: &str = "daemon.log";

/// A running daemon in its own run directory (removed on drop).
#[derive(Debug)]
pub struct DaemonProc {
    child: Child,
    /// The run directory (sockets, config).
    pub dir: PathBuf,
}

/// One VM of the daemon's config.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// VM name.
    pub name: String,
    /// Weight.
    pub weight: f64,
    /// Device memory limit, MiB.
    pub memory_limit_mib: u64,
    /// Its tenant (default `t-<name>`: one tenant per VM).
    pub tenant: Option<String>,
    /// Opted in to co-running (`[[vm]] corun`).
    pub corun: bool,
    /// A worker per guest process, this many at once (`[[vm]]
    /// process_slots`; the config's default is left unwritten).
    pub process_slots: u32,
    /// The GPU it starts on (`[[vm]] gpu`; None: the daemon places it).
    pub gpu: Option<u32>,
}

impl VmSpec {
    /// A VM of weight 1, its own tenant, with this memory limit.
    pub fn new(name: &str, memory_limit_mib: u64) -> VmSpec {
        VmSpec {
            name: name.into(),
            weight: 1.0,
            memory_limit_mib,
            tenant: None,
            corun: false,
            process_slots: daemon::config::DEFAULT_PROCESS_SLOTS,
            gpu: None,
        }
    }
}

impl DaemonProc {
    /// Starts `bin serve` with these VMs (one GPU, index 0) and waits for
    /// the API and every VM's socket.
    pub fn start(bin: &Path, tag: &str, executor: ExecutorKind, vms: &[VmSpec]) -> Result<Self> {
        Self::start_with(bin, tag, executor, vms, "")
    }

    /// [`DaemonProc::start`] with more TOML put before the VMs (e.g.
    /// `[[tenant]]` tables).
    pub fn start_with(
        bin: &Path,
        tag: &str,
        executor: ExecutorKind,
        vms: &[VmSpec],
        extra: &str,
    ) -> Result<Self> {
        Self::start_full(bin, tag, executor, vms, "", extra)
    }

    /// [`DaemonProc::start_with`], with more keys for `[daemon]` too.
    pub fn start_full(
        bin: &Path,
        tag: &str,
        executor: ExecutorKind,
        vms: &[VmSpec],
        daemon_keys: &str,
        extra: &str,
    ) -> Result<Self> {
        Self::start_opts(bin, tag, executor, vms, daemon_keys, extra, None)
    }

    /// [`DaemonProc::start_full`], logging as [`DaemonProc::start_logged`].
    pub fn start_full_logged(
        bin: &Path,
        tag: &str,
        executor: ExecutorKind,
        vms: &[VmSpec],
        daemon_keys: &str,
        level: &str,
    ) -> Result<Self> {
        Self::start_opts(bin, tag, executor, vms, daemon_keys, "", Some(level))
    }

    /// [`DaemonProc::start`] with the daemon's log (its workers' too) at
    /// `level`, and its standard output, going to [`DaemonProc::log_path`]
    /// instead of ours.
    pub fn start_logged(
        bin: &Path,
        tag: &str,
        executor: ExecutorKind,
        vms: &[VmSpec],
        level: &str,
    ) -> Result<Self> {
        Self::start_opts(bin, tag, executor, vms, "", "", Some(level))
    }

    /// [`DaemonProc::start_with`], logging as [`DaemonProc::start_logged`].
    pub fn start_with_logged(
        bin: &Path,
        tag: &str,
        executor: ExecutorKind,
        vms: &[VmSpec],
        extra: &str,
        level: &str,
    ) -> Result<Self> {
        Self::start_opts(bin, tag, executor, vms, "", extra, Some(level))
    }

    fn start_opts(
        bin: &Path,
        tag: &str,
        executor: ExecutorKind,
        vms: &[VmSpec],
        daemon_keys: &str,
        extra: &str,
        log_level: Option<&str>,
    ) -> Result<Self> {
        // Inside the cargo target folder for tests and the benches run
        // from it; the system's temporary folder for an installed binary.
        let dir = scratch::root().join(format!("fvg-{tag}-{}", std::process::id()));
        if let Err(e) = scratch::fits_socket(&dir.join("grant-gpu0.sock")) {
            bail!("run_dir for the daemon: {e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let exec = match executor {
            ExecutorKind::Sim => "sim",
            ExecutorKind::Cuda => "cuda",
        };
        let mut cfg = format!(
            "[daemon]\nrun_dir = {:?}\nexecutor = \"{exec}\"\n{daemon_keys}\n\n[spin]\nspins = 2000\nmax_block_us = 2000\n",
            dir.display().to_string()
        );
        cfg.push_str(extra);
        for v in vms {
            let tenant = v.tenant.clone().unwrap_or_else(|| format!("t-{}", v.name));
            cfg.push_str(&format!(
                "\n[[vm]]\nname = \"{}\"\ntenant = \"{tenant}\"\nweight = {}\nmemory_limit_mib = {}\ncorun = {}\n",
                v.name, v.weight, v.memory_limit_mib, v.corun
            ));
            if v.process_slots != daemon::config::DEFAULT_PROCESS_SLOTS {
                cfg.push_str(&format!("process_slots = {}\n", v.process_slots));
            }
            if let Some(g) = v.gpu {
                cfg.push_str(&format!("gpu = {g}\n"));
            }
        }
        std::fs::write(dir.join("host.toml"), cfg)?;
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--config"]).arg(dir.join("host.toml"));
        match log_level {
            Some(level) => {
                // Everything the daemon and its workers write, standard
                // output too (where nothing of a guest's may appear).
                let log = std::fs::File::create(dir.join(LOG_FILE))?;
                cmd.env("RUST_LOG", level)
                    .stdout(log.try_clone()?)
                    .stderr(log);
            }
            None => {
                cmd.env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
                );
            }
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let d = DaemonProc { child, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut want = vec!["api.sock".to_owned()];
        want.extend(vms.iter().map(|v| format!("{}.sock", v.name)));
        for s in want {
            while !d.dir.join(&s).exists() {
                if Instant::now() > deadline {
                    bail!("{s} did not appear");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(d)
    }

    /// Where [`DaemonProc::start_logged`] puts the daemon's log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    /// Lines in the daemon's log so far (0 if it has none).
    pub fn log_lines(&self) -> u64 {
        std::fs::read(self.log_path())
            .map(|b| b.iter().filter(|&&c| c == b'\n').count() as u64)
            .unwrap_or(0)
    }

    /// The socket of a VM.
    pub fn socket(&self, vm: &str) -> PathBuf {
        self.dir.join(format!("{vm}.sock"))
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the daemon still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the daemon outright (SIGKILL) and reaps it.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The daemon's API socket.
    pub fn api(&self) -> ApiTarget {
        ApiTarget::Unix(self.dir.join("api.sock"))
    }

    /// `POST path` with a JSON `body`: the HTTP status and the answer (JSON,
    /// or `null` if it is not).
    pub fn post(&self, path: &str, body: &str) -> Result<(u16, Value)> {
        let (code, b) = client_call(&self.api(), "POST", path, body.as_bytes())?;
        Ok((code, serde_json::from_slice(&b).unwrap_or(Value::Null)))
    }

    /// `GET /api/v1/status`.
    pub fn status(&self) -> Result<Value> {
        let (code, body) = client_call(&self.api(), "GET", "/api/v1/status", b"")?;
        if code != 200 {
            bail!("status answered {code}");
        }
        Ok(serde_json::from_slice(&body)?)
    }

    /// Every vGPU of the status, in config order.
    pub fn vgpus(&self) -> Result<Vec<Value>> {
        Ok(self.status()?["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["vgpus"].as_array().cloned().unwrap_or_default())
            .collect())
    }

    /// The status entry of one vGPU.
    pub fn vgpu(&self, name: &str) -> Result<Value> {
        self.vgpus()?
            .into_iter()
            .find(|v| v["name"] == name)
            .with_context(|| format!("{name} not in the status"))
    }

    /// Waits until `f` holds for the status, or fails after `timeout`.
    pub fn wait(&self, what: &str, timeout: Duration, f: impl Fn(&Self) -> bool) -> Result<()> {
        let t = Instant::now();
        while !f(self) {
            if t.elapsed() > timeout {
                bail!("timed out waiting for {what}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Waits up to `timeout` until `vm`'s status counts `n` workers that
    /// ended by a fault (`worker_faults`).
    pub fn wait_worker_faults(&self, vm: &str, n: u64, timeout: Duration) -> Result<()> {
        let faults = |d: &Self| d.vgpu(vm).ok().and_then(|v| v["worker_faults"].as_u64());
        self.wait(&format!("{n} worker faults of {vm}"), timeout, |d| {
            faults(d) == Some(n)
        })
        .with_context(|| {
            format!(
                "{vm}'s status counts {:?} worker faults, workers {:?}",
                faults(self),
                self.worker_pids(vm)
            )
        })
    }

    /// The pids of the workers of `vm`'s running processes (status
    /// `worker_pids`); empty while it runs none, or the API does not answer.
    /// One that exited before the daemon noticed is left out: the status
    /// lags the workers by up to one round of the daemon's supervisor.
    pub fn worker_pids(&self, vm: &str) -> Vec<i32> {
        let live = crate::procfs::live_children(self.pid());
        self.vgpu(vm)
            .ok()
            .and_then(|v| {
                v["worker_pids"].as_array().map(|a| {
                    a.iter()
                        .filter_map(|p| p.as_u64().and_then(|p| u32::try_from(p).ok()))
                        .filter(|p| live.contains(p))
                        .filter_map(|p| i32::try_from(p).ok())
                        .collect()
                })
            })
            .unwrap_or_default()
    }
}

impl Drop for DaemonProc {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        // A failing test shows the log it captured before it goes.
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.log_path()) {
                eprintln!("--- daemon log ({}):\n{log}---", self.log_path().display());
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
