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
        let shown = run_dir.display();
        std::fs::create_dir_all(run_dir).map_err(|e| {
            Error::Setup(match e.kind() {
                std::io::ErrorKind::PermissionDenied => format!(
                    "run_dir {shown}: permission denied; run as root or set [daemon] run_dir"
                ),
                _ => format!("run_dir {shown}: {e}; set [daemon] run_dir to a writable directory"),
            })
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
                .map_err(|e| {
                    Error::Setup(match e.kind() {
                        std::io::ErrorKind::PermissionDenied => format!(
                            "run_dir {shown}: permission denied; run as root or set [daemon] run_dir"
                        ),
                        _ => format!("lock file {}: {e}", path.display()),
                    })
                })?;
            let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(l) => l,
                Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                    let mut pid = String::new();
                    let _ = file.read_to_string(&mut pid);
                    let who = match pid.trim() {
                        "" => "another fairvgpu serve".to_owned(),
                        p => format!("another fairvgpu serve (pid {p})"),
                    };
                    return Err(Error::Setup(format!(
                        "run_dir {shown} is in use by {who}; stop it first or set another [daemon] run_dir"
                    )));
                }
                Err((_, e)) => {
                    return Err(Error::Setup(format!("locking {}: {e}", path.display())))
                }
            };
            let same = match (lock.metadata(), std::fs::metadata(&path)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if !same {
                continue;
            }
            let io = |e: std::io::Error| Error::Setup(format!("lock file {}: {e}", path.display()));
            lock.set_len(0).map_err(io)?;
            lock.rewind().map_err(io)?;
            writeln!(lock, "{}", std::process::id()).map_err(io)?;
            return Ok(RunLock { path, _lock: lock });
        }
        Err(Error::Setup(format!(
            "lock file {} keeps being replaced; is another fairvgpu serve starting?",
            path.display()
        )))
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
        let e = RunLock::take(&dir)
            .expect_err("second lock refused")
            .to_string();
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
