//! Busy-loop processes beside a bench (`bench fairness --hogs N`): a busy
//! host, where other VMs' vCPUs and other tenants' threads compete with the
//! guests, their workers and the grant service for the CPUs.
//!
//! Each hog is `sh -c 'while :; do :; done'` (what `scripts/gpu/lib.sh`'s
//! `hogs_start` runs), a child of the bench that dies with it: [`Hogs`]
//! kills and reaps them when dropped (at the end, on an error's return and
//! while a panic unwinds), and each child is also asked to be sent SIGKILL
//! when the thread that started it ends (a bench killed outright).

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, Result};

/// What each hog runs.
const BUSY_LOOP: &str = "while :; do :; done";

/// Running hogs; killed and reaped on drop.
#[derive(Debug)]
pub struct Hogs {
    children: Vec<Child>,
}

impl Hogs {
    /// Starts `n` busy-loop processes (none for 0). Where one fails to
    /// start, those already started are killed (the drop of the partial
    /// set) and the error returned.
    pub fn start(n: usize) -> Result<Hogs> {
        Self::start_script(n, BUSY_LOOP, None)
    }

    /// As [`Hogs::start`], each pinned to `cpus` (as other VMs' vCPUs kept
    /// off a host's reserved CPUs).
    pub fn start_on(n: usize, cpus: &[usize]) -> Result<Hogs> {
        Self::start_script(n, BUSY_LOOP, Some(cpus))
    }

    /// Starts `n` children running the shell script `script`, as
    /// [`Hogs::start`], each pinned to `cpus` where given.
    fn start_script(n: usize, script: &str, cpus: Option<&[usize]>) -> Result<Hogs> {
        let mut hogs = Hogs {
            children: Vec::with_capacity(n),
        };
        for i in 0..n {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", script])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let parent = nix::unistd::Pid::from_raw(std::process::id() as i32);
            // SAFETY: the closure runs in the child between fork and exec
            // and only makes prctl(2) and getppid(2) calls, which are
            // async-signal-safe; it allocates nothing and takes no lock.
            unsafe {
                cmd.pre_exec(move || {
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                        .map_err(std::io::Error::from)?;
                    // The parent may have ended before the line above
                    // (an error made from a code: nothing allocated).
                    if nix::unistd::getppid() != parent {
                        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    Ok(())
                });
            }
            let child = cmd
                .spawn()
                .with_context(|| format!("starting busy-loop process {}", i + 1))?;
            let pid = child.id();
            hogs.children.push(child);
            if let Some(cpus) = cpus {
                daemon::hostcpu::cpus::pin_task(pid as i32, cpus)
                    .map_err(|e| anyhow::anyhow!("pinning busy-loop process {}: {e}", i + 1))?;
            }
        }
        Ok(hogs)
    }

    /// How many are running.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// None running.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// The children's process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.children {
            // Already gone (killed by someone else) is fine: reaped below.
            let _ = c.kill();
        }
        for c in &mut self.children {
            if let Err(e) = c.wait() {
                tracing::warn!(pid = c.id(), "reaping a busy-loop process: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop the shell stays in (a lone command it might exec instead), of
    /// sleeps that end within a second of the shell.
    const IDLE_LOOP: &str = "while :; do sleep 1; done";

    fn alive(pid: u32) -> bool {
        // A reaped child's /proc entry is gone; a zombie's state is Z.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(false)
    }

    #[test]
    fn hogs_run_and_are_gone_after_drop_also_on_unwind() {
        // Their lifecycle with a script that sleeps instead of spinning: the
        // other tests of this binary run beside it, some timing a thread on
        // a CPU of a machine that may have two.
        let hogs = Hogs::start_script(2, IDLE_LOOP, None).unwrap();
        assert_eq!(hogs.len(), 2);
        let pids = hogs.pids();
        for &p in &pids {
            assert!(alive(p), "hog {p} running");
            // Its command, once exec'd (the fork may not have got there yet).
            let t = std::time::Instant::now();
            let mut cmd = String::new();
            while t.elapsed() < std::time::Duration::from_secs(5) {
                cmd = std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default();
                if cmd.contains("while") {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(cmd, format!("sh\0-c\0{IDLE_LOOP}\0"), "hog {p}");
        }
        drop(hogs);
        for &p in &pids {
            assert!(!alive(p), "hog {p} still running after drop");
        }
        // A panic while they run: the unwind's drop ends them too.
        let mut seen = Vec::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let h = Hogs::start_script(1, IDLE_LOOP, None).unwrap();
            seen = h.pids();
            panic!("bench failed");
        }));
        assert!(r.is_err());
        assert_eq!(seen.len(), 1);
        assert!(!alive(seen[0]), "hog still running after a panic");
        assert!(Hogs::start(0).unwrap().is_empty());
    }

    #[test]
    fn pinned_hogs_run_only_on_their_cpus() {
        let allowed = daemon::hostcpu::cpus::current();
        let last = *allowed.last().unwrap();
        let hogs = Hogs::start_script(1, IDLE_LOOP, Some(&[last])).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{}/status", hogs.pids()[0])).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list:"))
            .unwrap();
        assert_eq!(
            line.split_whitespace().nth(1),
            Some(last.to_string().as_str()),
            "{line}"
        );
        // A CPU this process may not use: an error naming the hog.
        let e = Hogs::start_script(1, IDLE_LOOP, Some(&[1023])).unwrap_err();
        assert!(
            format!("{e:#}").contains("pinning busy-loop process 1"),
            "{e:#}"
        );
    }
}
