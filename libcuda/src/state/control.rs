//! The control socket of a guest process on the host itself
//! (`FAIRVGPU_CONTROL`, a path): what stands for QEMU's pause and move of a
//! VM when a process attached through `FAIRVGPU_SOCKET` moves with its vGPU
//! to another daemon (another host's, or one standing for it). One command
//! a line, one answer a line:
//!
//! | command | what it does | answer |
//! | --- | --- | --- |
//! | `pause` | holds the process's calls (those under way finish first) | `paused` |
//! | `copy PATH` | copies the region into the one the daemon at `PATH` serves for this VM (a restore from a file needs it; a handover carries the region itself) | `copied` |
//! | `switch PATH` | every channel follows to the daemon at `PATH` | `switched N` |
//! | `go` | lets the calls go on | `going` |
//!
//! Anything else, or a step out of order, answers `error: ...` and changes
//! nothing. A controller that leaves while the process is paused lets it go
//! on. The socket is the process owner's alone (mode 0600).
//!
//! A pause holds calls, not threads: memory a thread writes outside calls
//! (a pinned buffer filled without a call) between the copy and the switch
//! is not carried, where a paused VM writes nothing.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::MutexGuard;

use guest::Gpu;
use transport::server::Client;

use super::driver;
use super::process::CALLBACK_THREAD;

/// The process's calls held: every channel's lock, and the one under which
/// channels are opened.
struct Paused {
    _opened: MutexGuard<'static, usize>,
    channels: Vec<MutexGuard<'static, Option<Gpu>>>,
    /// The connection the copy went through, kept until the switch.
    copier: Option<Client>,
}

/// Listens on `FAIRVGPU_CONTROL` if it is set; nothing otherwise.
pub(crate) fn start() {
    let Some(path) = std::env::var_os("FAIRVGPU_CONTROL").map(PathBuf::from) else {
        return;
    };
    let listener = match bind(&path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "fairvgpu libcuda: no control socket at {}: {e}",
                path.display()
            );
            return;
        }
    };
    let _ = std::thread::Builder::new()
        .name("fairvgpu-control".into())
        .spawn(move || {
            for s in listener.incoming().flatten() {
                serve(s);
            }
        });
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// One controller, until it leaves; a pause it left behind ends with it.
fn serve(s: UnixStream) {
    let Ok(mut out) = s.try_clone() else { return };
    let mut paused: Option<Paused> = None;
    for line in BufReader::new(s).lines() {
        let Ok(line) = line else { break };
        let answer = command(line.trim(), &mut paused).unwrap_or_else(|e| format!("error: {e}"));
        if writeln!(out, "{answer}").is_err() {
            break;
        }
    }
}

/// Runs one command on the process's state.
fn command(line: &str, paused: &mut Option<Paused>) -> Result<String, String> {
    let (verb, arg) = line.split_once(' ').unwrap_or((line, ""));
    let path = || {
        (!arg.is_empty())
            .then(|| PathBuf::from(arg))
            .ok_or_else(|| format!("{verb} needs the other daemon's socket"))
    };
    match (verb, paused.as_mut()) {
        ("pause", None) => {
            *paused = Some(pause()?);
            Ok("paused".into())
        }
        ("copy", Some(p)) => {
            let first = p.channels.iter().find_map(|g| g.as_ref());
            let gpu = first.ok_or("the process has let go of its vGPU")?;
            p.copier = Some(gpu.copy_region_to(&path()?).map_err(|e| e.to_string())?);
            Ok("copied".into())
        }
        ("switch", Some(p)) => {
            let n = switch(p, &path()?)?;
            Ok(format!("switched {n}"))
        }
        ("go", Some(_)) => {
            *paused = None;
            Ok("going".into())
        }
        ("pause", Some(_)) => Err("already paused".into()),
        ("copy" | "switch" | "go", None) => Err("not paused".into()),
        _ => Err(format!(
            "unknown command {verb:?} (pause, copy, switch, go)"
        )),
    }
}

/// Takes the lock under which channels open, then every channel's: once
/// held, no call of the process is under way or can start.
fn pause() -> Result<Paused, String> {
    let d = driver().map_err(|e| format!("no vGPU attached (CUresult {e})"))?;
    if CALLBACK_THREAD.get().copied().unwrap_or(false) {
        return Err("the process runs host functions, whose channel cannot be held yet".into());
    }
    let (opened, channels) = d.hold_every_channel();
    Ok(Paused {
        _opened: opened,
        channels,
        copier: None,
    })
}

/// Every open channel follows to the daemon at `to`; later ones open there.
/// Each reaches the daemon there first: one that cannot (the daemon gone,
/// out of room, another layout) leaves every channel here, none moved.
fn switch(p: &mut Paused, to: &Path) -> Result<usize, String> {
    let d = driver().map_err(|e| format!("CUresult {e}"))?;
    let mut arrivals = Vec::new();
    for (n, g) in p.channels.iter().filter_map(|g| g.as_ref()).enumerate() {
        arrivals.push(
            g.reach(to)
                .map_err(|e| format!("channel {n}: {e}; none moved"))?,
        );
    }
    let mut n = 0;
    for (g, there) in p
        .channels
        .iter_mut()
        .filter_map(|g| g.as_mut())
        .zip(arrivals)
    {
        // SAFETY: every call of the process is held (`pause`), and the
        // region there holds what this one did (the copy, then what the
        // daemon there wrote over it); see the module's note on memory
        // written outside calls.
        unsafe { g.follow(there, to) }.map_err(|e| format!("channel {n}: {e}"))?;
        n += 1;
    }
    d.follow_joiner(to);
    p.copier = None;
    Ok(n)
}
