//! What `/proc` says of the daemon and its worker processes: their CPU
//! time, resident memory and open descriptors, and which processes are a
//! process's children (the benches that measure the host side, and the
//! tests that look for the daemon's workers, read them).

/// One process's CPU time and resident memory.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProcUse {
    pub cpu_ns: u64,
    pub rss: u64,
}

/// `pid`'s CPU time (user and system, ns) and resident set (bytes), from
/// `/proc`; zero for a process that is gone.
pub(crate) fn proc_use(pid: u32) -> ProcUse {
    proc_use_at(&format!("/proc/{pid}"))
}

/// [`proc_use`] of a process's or thread's folder in `/proc`.
fn proc_use_at(dir: &str) -> ProcUse {
    let tick_ns = 1e9 / clock_ticks();
    let cpu_ns = std::fs::read_to_string(format!("{dir}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command's closing parenthesis: state is
            // field 3, utime 14 and stime 15.
            let rest = s.get(s.rfind(')')? + 2..)?;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let t = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            Some((t as f64 * tick_ns) as u64)
        })
        .unwrap_or(0);
    let rss = std::fs::read_to_string(format!("{dir}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib << 10)
        })
        .unwrap_or(0);
    ProcUse { cpu_ns, rss }
}

/// `/proc`'s CPU times are in the kernel's fixed 100 ticks a second
/// (`USER_HZ`); they include the process's threads that ended.
fn clock_ticks() -> f64 {
    100.0
}

/// CPU time (ns) of `pid`'s threads named `name`.
pub(crate) fn threads_cpu_ns(pid: u32, name: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|t| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm"))
                .is_ok_and(|c| c.trim_end() == name)
        })
        .map(|t| proc_use_at(&format!("/proc/{pid}/task/{t}")).cpu_ns)
        .sum()
}

/// The processes whose parent is `pid`, exited ones not yet reaped
/// (zombies) among them.
pub(crate) fn children(pid: u32) -> Vec<u32> {
    children_where(pid, |_| true)
}

/// The processes whose parent is `pid` and that run (zombies left out).
pub fn live_children(pid: u32) -> Vec<u32> {
    children_where(pid, |state| state != "Z")
}

/// The children of `pid` whose state (`/proc/<pid>/stat`'s third field)
/// passes `state_ok`.
fn children_where(pid: u32, state_ok: impl Fn(&str) -> bool) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    // After the command's closing parenthesis: state, ppid.
                    let mut f = s.get(s.rfind(')')? + 2..)?.split_whitespace();
                    let state = f.next()?;
                    let ppid = f.next()?.parse::<u32>().ok()?;
                    Some(ppid == pid && state_ok(state))
                })
                == Some(true)
        })
        .collect()
}

/// How many descriptors `pid` has open; zero for a process that is gone.
pub(crate) fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}
