//! The lock that makes a run_dir one daemon's: `serve` takes an exclusive
//! `flock` on `<run_dir>/fairvgpu.lock` before it binds any socket there, so
//! a second `serve` on the same run_dir is refused instead of taking the
//! first one's sockets. The OS releases the lock if the daemon dies; the
//! file (it holds the owner's pid, for the message) is removed on a clean
//! exit.

use std::io::{Read as _, Seek as _, Write as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::Error;

/// The lock file's name in run_dir.
pub const LOCK_FILE: &str = "fairvgpu.lock";

/// Why a run_dir cannot be taken; each message names the thing and what to
/// do, on one line.
#[derive(Debug, thiserror::Error)]
pub enum RunLockError {
    /// This user may not create run_dir or its lock file.
    #[error(
        "run_dir {}: permission denied; run as root or set [daemon] run_dir",
        run_dir.display()
    )]
    Denied {
        /// The run_dir.
        run_dir: PathBuf,
    },
    /// run_dir cannot be created.
    #[error(
        "run_dir {}: {source}; set [daemon] run_dir to a writable directory",
        run_dir.display()
    )]
    RunDir {
        /// The run_dir.
        run_dir: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The lock file cannot be opened or written.
    #[error("lock file {}: {source}", path.display())]
    LockFile {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another daemon holds the lock.
    #[error(
        "run_dir {} is in use by another fairvgpu serve{}; stop it first or set another [daemon] run_dir",
        run_dir.display(),
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    InUse {
        /// The run_dir.
        run_dir: PathBuf,
        /// The holder's pid, as its lock file says.
        pid: Option<u32>,
    },
    /// flock failed other than by the lock being held.
    #[error("locking {}: {source}", path.display())]
    Locking {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: nix::errno::Errno,
    },
    /// The lock file was replaced under us again and again.
    #[error(
        "lock file {} keeps being replaced; is another fairvgpu serve starting?",
        path.display()
    )]
    Replaced {
        /// The lock file.
        path: PathBuf,
    },
}

/// A run_dir held by this process; dropping it removes the file and
/// releases the lock.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    _lock: Flock<std::fs::File>,
}

impl RunLock {
    /// Creates `run_dir` if needed and takes its lock, or says who holds it.
    pub fn take(run_dir: &Path) -> Result<RunLock, Error> {
        let denied = || RunLockError::Denied {
            run_dir: run_dir.to_owned(),
        };
        std::fs::create_dir_all(run_dir).map_err(|source| match source.kind() {
            std::io::ErrorKind::PermissionDenied => denied(),
            _ => RunLockError::RunDir {
                run_dir: run_dir.to_owned(),
                source,
            },
        })?;
        let path = run_dir.join(LOCK_FILE);
        // A file another daemon removed between our open and our lock is
        // not the lock any more: open again.
        for _ in 0..10 {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|source| match source.kind() {
                    std::io::ErrorKind::PermissionDenied => denied(),
                    _ => RunLockError::LockFile {
                        path: path.clone(),
                        source,
                    },
                })?;
            let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(l) => l,
                Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                    let mut pid = String::new();
                    let _ = file.read_to_string(&mut pid);
                    return Err(RunLockError::InUse {
                        run_dir: run_dir.to_owned(),
                        pid: pid.trim().parse().ok(),
                    }
                    .into());
                }
                Err((_, source)) => return Err(RunLockError::Locking { path, source }.into()),
            };
            let same = match (lock.metadata(), std::fs::metadata(&path)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if !same {
                continue;
            }
            let io = |source| RunLockError::LockFile {
                path: path.clone(),
                source,
            };
            lock.set_len(0).map_err(io)?;
            lock.rewind().map_err(io)?;
            writeln!(lock, "{}", std::process::id()).map_err(io)?;
            return Ok(RunLock { path, _lock: lock });
        }
        Err(RunLockError::Replaced { path }.into())
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Removed while still locked: a daemon that opened it meanwhile
        // finds it replaced and opens the new one (see `take`).
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_run_dir_is_refused_until_the_first_is_dropped() {
        let dir = scratch::dir("fvg-runlock");
        let first = RunLock::take(&dir).expect("first lock");
        let pid = std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap();
        assert_eq!(pid.trim(), std::process::id().to_string());
        let e = RunLock::take(&dir).expect_err("second lock refused");
        let me = std::process::id();
        assert!(
            matches!(&e, Error::RunLock(RunLockError::InUse { run_dir, pid: Some(p) })
                if *run_dir == dir && *p == me),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.contains("is in use by another fairvgpu serve (pid"),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        drop(first);
        assert!(!dir.join(LOCK_FILE).exists(), "removed on drop");
        let again = RunLock::take(&dir).expect("free again");
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
