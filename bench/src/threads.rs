//! Where a bench round's CPU time went, thread by thread (from procfs): time
//! on a CPU, time runnable but waiting for one, and involuntary context
//! switches; and the machine's steal time (a virtual machine's vCPUs kept
//! off their physical CPUs). A round whose guests slowed down while their
//! threads waited for CPUs measured the machine as much as the scheduler.

use std::collections::{BTreeMap, HashMap};

/// One thread's scheduling counters, or their growth over a round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuUse {
    /// Time on a CPU, ns.
    pub run_ns: u64,
    /// Time runnable, waiting for a CPU, ns.
    pub wait_ns: u64,
    /// Times the kernel took the CPU from it.
    pub involuntary: u64,
}

impl CpuUse {
    /// The counters of the thread whose procfs directory is `dir`; `None`
    /// where they cannot be read (the thread is gone, or no schedstat).
    fn read(dir: &str) -> Option<CpuUse> {
        let sched = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
        let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
        parse(&sched, &status)
    }

    /// The calling thread's counters (zeros where procfs has none).
    pub fn this_thread() -> CpuUse {
        CpuUse::read("/proc/thread-self").unwrap_or_default()
    }

    /// What grew since `earlier`.
    pub fn since(self, earlier: CpuUse) -> CpuUse {
        CpuUse {
            run_ns: self.run_ns.saturating_sub(earlier.run_ns),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
            involuntary: self.involuntary.saturating_sub(earlier.involuntary),
        }
    }

    /// Adds `o`'s counters.
    pub fn add(&mut self, o: CpuUse) {
        self.run_ns += o.run_ns;
        self.wait_ns += o.wait_ns;
        self.involuntary += o.involuntary;
    }

    /// "run / waiting ms, involuntary switches".
    pub fn line(&self) -> String {
        format!(
            "{:.0} / {:.1} ms, {}",
            self.run_ns as f64 / 1e6,
            self.wait_ns as f64 / 1e6,
            self.involuntary
        )
    }
}

/// `schedstat` ("run_ns wait_ns timeslices") and `status` of one thread.
fn parse(sched: &str, status: &str) -> Option<CpuUse> {
    let mut f = sched.split_whitespace().map(str::parse::<u64>);
    let run_ns = f.next()?.ok()?;
    let wait_ns = f.next()?.ok()?;
    let involuntary = status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some(CpuUse {
        run_ns,
        wait_ns,
        involuntary,
    })
}

/// Every thread of this process (by thread id: its name and counters) and
/// the machine's steal time so far.
#[derive(Debug, Default)]
pub struct Snapshot {
    threads: HashMap<u32, (String, CpuUse)>,
    steal_ns: u64,
}

/// Takes a [`Snapshot`] now.
pub fn snapshot() -> Snapshot {
    let mut threads = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else {
                continue;
            };
            let path = format!("/proc/self/task/{tid}");
            let name = std::fs::read_to_string(format!("{path}/comm")).unwrap_or_default();
            if let Some(c) = CpuUse::read(&path) {
                threads.insert(tid, (name.trim().to_owned(), c));
            }
        }
    }
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    Snapshot {
        threads,
        steal_ns: steal_ns(&stat),
    }
}

impl Snapshot {
    /// What each thread name's threads used since `before` (threads of one
    /// name summed; a thread that started since counts from zero, one that
    /// ended is missing), and the machine's steal time over every CPU, ns.
    pub fn since(&self, before: &Snapshot) -> (BTreeMap<String, CpuUse>, u64) {
        let mut by_name: BTreeMap<String, CpuUse> = BTreeMap::new();
        for (tid, (name, now)) in &self.threads {
            let was = before.threads.get(tid).map(|t| t.1).unwrap_or_default();
            by_name.entry(name.clone()).or_default().add(now.since(was));
        }
        (by_name, self.steal_ns.saturating_sub(before.steal_ns))
    }
}

/// The steal time of all CPUs together in `/proc/stat`, ns (its eighth
/// figure on the `cpu` line, in the kernel's fixed 100 ticks a second).
fn steal_ns(stat: &str) -> u64 {
    stat.lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |ticks| ticks * 10_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_steal_are_read_from_procfs_text() {
        let c = parse(
            "1500 250 7\n",
            "Name:\tw\nvoluntary_ctxt_switches:\t9\nnonvoluntary_ctxt_switches:\t4\n",
        )
        .unwrap();
        assert_eq!(
            c,
            CpuUse {
                run_ns: 1500,
                wait_ns: 250,
                involuntary: 4
            }
        );
        assert_eq!(parse("x 1", ""), None);
        let stat = "cpu  10 0 5 900 1 0 2 3 0 0\ncpu0 5 0 2 450 0 0 1 2 0 0\n";
        assert_eq!(steal_ns(stat), 30_000_000);
        assert_eq!(steal_ns("intr 1\n"), 0);
    }

    #[test]
    fn a_thread_that_spins_shows_its_time_on_a_cpu() {
        let before = snapshot();
        let mine = CpuUse::this_thread();
        if before.threads.is_empty() {
            return; // no schedstat on this kernel
        }
        // Spins until its own account shows 20 ms on a CPU: on a loaded
        // machine that takes longer than 20 ms of wall time. An account that
        // never grows fails after 10 s.
        let t = std::time::Instant::now();
        let mut used = CpuUse::this_thread().since(mine);
        while used.run_ns < 20_000_000 && t.elapsed() < std::time::Duration::from_secs(10) {
            for _ in 0..10_000 {
                std::hint::spin_loop();
            }
            used = CpuUse::this_thread().since(mine);
        }
        assert!(used.run_ns >= 20_000_000, "{used:?}");
        let (by_name, _) = snapshot().since(&before);
        let all: u64 = by_name.values().map(|c| c.run_ns).sum();
        assert!(all >= used.run_ns, "{by_name:?} vs {used:?}");
    }
}
