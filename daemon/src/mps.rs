//! NVIDIA's Multi-Process Service for a GPU the daemon manages
//! (`[[gpu]] mps = true`): the daemon starts one MPS control daemon per
//! such GPU, with the GPU as its only visible device and its pipes and logs
//! under `<run_dir>/mps-gpu<N>/`, and stops it when it exits. The workers
//! of that GPU's vGPUs are its clients: they find it by the pipe directory
//! in their environment, and see the GPU as their device 0.
//!
//! What it gives: the vGPUs' contexts become clients of one MPS server, so
//! the GPU does not switch between them as between processes when the
//! grant passes from one vGPU to the next. What it costs: MPS clients share
//! fault fate (one client's fatal fault can end every client on that GPU,
//! so every guest process whose worker it was sees the error, as every
//! client process would natively), and a client cannot move to another
//! GPU, so these vGPUs are never migrated. After a client's fatal fault
//! the server takes no new client until every client it had has exited,
//! so the daemon then ends every worker of that GPU
//! (`supervisor/faults.rs`). An MPS client cannot make a context once the
//! sandbox confines it (it must connect to the server): such a worker
//! makes its context ahead (`serve/contexts.rs`). Measured on an H100:
//! `results/2026-11-23-h100-verify-2.md`.
//!
//! A second server (`[[gpu]] mps_standby`, on by default): the daemon runs
//! a second control daemon for the GPU (`<run_dir>/mps-gpu<N>-b/`). When a
//! client's fault ends the serving side's workers, the sides swap: the
//! GPU's next workers (its spare, and those of processes that attach) are
//! clients of the other server at once, while the driver still tears the
//! ended clients down, instead of waiting for that teardown (about 1.3 s
//! for four clients on an H100, `results/2026-11-23-h100-mps-recovery.md`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Error;

/// How long a `quit` to a control daemon may take.
const QUIT_WAIT: Duration = Duration::from_secs(5);

/// Why a GPU's MPS control daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// `control -d` exited with a failure.
    #[error(
        "config: {} -d for GPU {gpu} failed ({status}); see {}",
        control.display(),
        logs.display()
    )]
    Failed {
        /// The control program.
        control: PathBuf,
        /// The GPU.
        gpu: u32,
        /// How it exited.
        status: std::process::ExitStatus,
        /// Its log directory.
        logs: PathBuf,
    },
    /// It made no control pipe in time.
    #[error(
        "config: the MPS control daemon of GPU {gpu} made no control pipe in {}",
        pipes.display()
    )]
    NoPipe {
        /// The GPU.
        gpu: u32,
        /// The pipe directory.
        pipes: PathBuf,
    },
}

/// The MPS control daemon of one GPU.
#[derive(Debug)]
pub struct MpsDaemon {
    gpu: u32,
    control: PathBuf,
    pipes: PathBuf,
    logs: PathBuf,
    running: bool,
    /// How long [`MpsDaemon::stop`] waits for `quit` to be answered.
    quit_wait: Duration,
}

fn io(what: &'static str, e: std::io::Error) -> Error {
    Error::Io { what, source: e }
}

impl MpsDaemon {
    /// Starts `control` (`nvidia-cuda-mps-control`) as a daemon for GPU
    /// `gpu` under `run_dir`, and waits until its control pipe exists.
    pub fn start(control: &Path, run_dir: &Path, gpu: u32) -> Result<MpsDaemon, Error> {
        Self::start_in(control, &run_dir.join(format!("mps-gpu{gpu}")), gpu)
    }

    /// Starts `control` for GPU `gpu` with its pipes and logs under `base`.
    fn start_in(control: &Path, base: &Path, gpu: u32) -> Result<MpsDaemon, Error> {
        let (pipes, logs) = (base.join("pipe"), base.join("log"));
        for d in [&pipes, &logs] {
            std::fs::create_dir_all(d).map_err(|e| io("creating MPS directories", e))?;
        }
        let mut d = MpsDaemon {
            gpu,
            control: control.to_owned(),
            pipes,
            logs,
            running: false,
            quit_wait: QUIT_WAIT,
        };
        let st = d
            .command()
            .arg("-d")
            .stdin(Stdio::null())
            .status()
            .map_err(|e| io("starting the MPS control daemon", e))?;
        if !st.success() {
            return Err(MpsError::Failed {
                control: control.to_owned(),
                gpu,
                status: st,
                logs: d.logs.clone(),
            }
            .into());
        }
        d.running = true;
        let t = Instant::now();
        while !d.pipes.join("control").exists() {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(MpsError::NoPipe {
                    gpu,
                    pipes: d.pipes.clone(),
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::info!(gpu, pipes = %d.pipes.display(), "MPS control daemon started");
        Ok(d)
    }

    /// The control program with this GPU's environment.
    fn command(&self) -> Command {
        let mut c = Command::new(&self.control);
        c.env("CUDA_VISIBLE_DEVICES", self.gpu.to_string())
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipes)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.logs);
        c
    }

    /// What a client's environment needs to find this daemon (a client
    /// must not set `CUDA_VISIBLE_DEVICES`: the server already did).
    pub fn client_env(&self) -> [(&'static str, &Path); 2] {
        [
            ("CUDA_MPS_PIPE_DIRECTORY", &self.pipes),
            ("CUDA_MPS_LOG_DIRECTORY", &self.logs),
        ]
    }

    /// Tells the control daemon to quit (its server goes once its clients
    /// are gone).
    pub fn stop(&mut self) {
        if !std::mem::take(&mut self.running) {
            return;
        }
        let r = self
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .and_then(|mut child| {
                if let Some(mut i) = child.stdin.take() {
                    i.write_all(b"quit\n")?;
                }
                // A control daemon whose server a fault left wedged may
                // never answer: the shutdown goes on without it.
                let t = Instant::now();
                while child.try_wait()?.is_none() {
                    if t.elapsed() > self.quit_wait {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no answer to quit in {:?}", self.quit_wait),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(())
            });
        if let Err(e) = r {
            tracing::warn!(gpu = self.gpu, "stopping the MPS control daemon: {e}");
        }
    }
}

/// The MPS control daemons of one GPU: one, or two with `mps_standby`
/// (new workers are clients of the serving side; the sides swap after a
/// fault).
#[derive(Debug)]
pub struct MpsGpu {
    sides: Vec<MpsDaemon>,
    serving: usize,
}

impl MpsGpu {
    /// Starts the GPU's control daemon, and with `standby` a second one
    /// (`[[gpu]] mps_standby`).
    pub fn start(control: &Path, run_dir: &Path, gpu: u32, standby: bool) -> Result<MpsGpu, Error> {
        let mut sides = vec![MpsDaemon::start(control, run_dir, gpu)?];
        if standby {
            let base = run_dir.join(format!("mps-gpu{gpu}-b"));
            sides.push(MpsDaemon::start_in(control, &base, gpu)?);
        }
        Ok(MpsGpu { sides, serving: 0 })
    }

    /// The side whose clients serve.
    pub fn serving(&self) -> usize {
        self.serving
    }

    /// The side that is not serving, if there is one.
    pub fn standby(&self) -> Option<usize> {
        (self.sides.len() > 1).then(|| 1 - self.serving)
    }

    /// The other side serves from now on (after a fault ended this side's
    /// clients); false if there is no other side.
    pub fn swap(&mut self) -> bool {
        match self.standby() {
            Some(s) => {
                self.serving = s;
                true
            }
            None => false,
        }
    }

    /// The control daemon of side `side`.
    pub fn side(&self, side: usize) -> &MpsDaemon {
        &self.sides[side.min(self.sides.len() - 1)]
    }
}

impl Drop for MpsDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for `nvidia-cuda-mps-control`: `-d` makes the control
    /// pipe and records its environment; `quit` on its input removes it.
    const FAKE: &str = r#"#!/bin/sh
if [ "$1" = "-d" ]; then
  env | grep -E '^CUDA_(VISIBLE_DEVICES|MPS_)' | sort > "$CUDA_MPS_LOG_DIRECTORY/env"
  mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit 0
fi
read cmd
[ "$cmd" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control" && echo quit > "$CUDA_MPS_LOG_DIRECTORY/stopped"
"#;

    #[test]
    fn the_daemon_runs_for_its_gpu_and_quits_when_dropped() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch::dir("fvg-mps");
        let fake = dir.join("mps-control");
        std::fs::write(&fake, FAKE).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = MpsDaemon::start(&fake, &dir, 3).unwrap();
        let base = dir.join("mps-gpu3");
        let env = std::fs::read_to_string(base.join("log/env")).unwrap();
        assert!(env.contains("CUDA_VISIBLE_DEVICES=3"), "{env}");
        assert!(env.contains(&format!(
            "CUDA_MPS_PIPE_DIRECTORY={}",
            base.join("pipe").display()
        )));
        let client: Vec<_> = d.client_env().iter().map(|(k, _)| *k).collect();
        assert_eq!(
            client,
            ["CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"]
        );
        drop(d);
        assert!(!base.join("pipe/control").exists());
        assert!(base.join("log/stopped").exists());
        // A control program that fails is an error that says where to look.
        std::fs::write(&fake, "#!/bin/sh\nexit 1\n").unwrap();
        let e = MpsDaemon::start(&fake, &dir, 4).unwrap_err();
        assert!(
            matches!(&e, Error::Mps(MpsError::Failed { gpu: 4, status, logs, .. })
                if status.code() == Some(1) && *logs == dir.join("mps-gpu4/log")),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(e.contains("GPU 4") && e.contains("mps-gpu4"), "{e}");
        std::fs::write(&fake, FAKE).unwrap();
        // With standby workers: a second daemon of its own; the sides swap.
        let mut g = MpsGpu::start(&fake, &dir, 5, true).unwrap();
        assert_eq!((g.serving(), g.standby()), (0, Some(1)));
        let b = dir.join("mps-gpu5-b");
        assert!(b.join("pipe/control").exists());
        assert_eq!(g.side(1).client_env()[0].1, b.join("pipe"));
        assert!(g.swap());
        assert_eq!((g.serving(), g.standby()), (1, Some(0)));
        drop(g);
        assert!(!b.join("pipe/control").exists());
        let mut one = MpsGpu::start(&fake, &dir, 6, false).unwrap();
        assert_eq!(one.standby(), None);
        assert!(!one.swap());
        assert_eq!(one.serving(), 0);
        drop(one);
        // A control daemon that never answers `quit` (wedged by a fault)
        // holds up a stop only so long.
        let wedged = FAKE.replace("read cmd", "sleep 30; read cmd");
        std::fs::write(&fake, wedged).unwrap();
        let mut d = MpsDaemon::start(&fake, &dir, 7).unwrap();
        d.quit_wait = Duration::from_millis(200);
        let t = Instant::now();
        d.stop();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert!(dir.join("mps-gpu7/pipe/control").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
