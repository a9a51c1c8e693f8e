//! Host CPU options for a busy host (issue 32): on a KVM host every VM's
//! vCPUs compete with the daemon, the grant services and the workers for
//! the CPUs, and the GPU's fair share must not depend on who wins them.
//! Each option is optional, detected at start and reported in `status`
//! (on, or off with the reason):
//!
//! - priority lift (`[daemon] priority`, nice -10 by default): the grant
//!   services' threads and each worker's serving thread run at a raised
//!   nice value. A nice value, not a real-time class: these threads poll
//!   (the service every millisecond, a worker spins on its rings before it
//!   sleeps), and a SCHED_FIFO thread that polls can starve its CPU's
//!   other threads (the VMs' vCPUs among them) outright, where CFS/EEVDF
//!   still gives a nice-0 thread about a tenth of a CPU beside a nice -10
//!   one that never sleeps. Needs CAP_SYS_NICE (or root, or RLIMIT_NICE).
//! - vCPU lift (`[daemon] vcpu_lift`, FairGV's GPU-centric coscheduling):
//!   while a VM holds its GPU's grant, its vCPU threads (or its native guest
//!   processes' threads) run at the lifted value too (`lift.rs`).
//! - reserved CPUs (`[daemon] cpus = "0-1"`): the daemon pins itself at
//!   start, and its threads and workers inherit the mask (`cpus.rs`).
//! - cgroup v2 (`[daemon] cgroup_cpu_weight`): workers in a child cgroup
//!   with a higher `cpu.weight` (`cgroup.rs`).

pub mod cgroup;
pub mod cpus;
pub mod lift;

use std::sync::mpsc::Sender;
use std::sync::Mutex;

use serde::Serialize;

use crate::config::DaemonConfig;
use lift::{Lifter, PrioritySetter, Registry, SysPriority};

/// One option's state: on, with what it does; off, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Opt {
    /// In force.
    pub on: bool,
    /// What it does when on; the reason when off.
    pub detail: String,
}

impl Opt {
    /// On, doing `detail`.
    pub fn on(detail: impl Into<String>) -> Opt {
        Opt {
            on: true,
            detail: detail.into(),
        }
    }
    /// Off, for `why`.
    pub fn off(why: impl Into<String>) -> Opt {
        Opt {
            on: false,
            detail: why.into(),
        }
    }
}

/// Every host CPU option's state (the `host_cpu` object of the status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The grant services' and workers' serving threads at a raised nice.
    pub priority: Opt,
    /// The grant holder's vCPU threads at a raised nice.
    pub vcpu_lift: Opt,
    /// Reserved CPUs.
    pub cpus: Opt,
    /// Workers in a cgroup v2 child with a higher `cpu.weight`.
    pub cgroup: Opt,
}

impl Report {
    /// One line per option, as `fairvgpu status` and the bench print them.
    pub fn lines(&self) -> Vec<String> {
        [
            ("priority lift", &self.priority),
            ("vCPU lift", &self.vcpu_lift),
            ("reserved CPUs", &self.cpus),
            ("cgroup", &self.cgroup),
        ]
        .iter()
        .map(|(name, o)| format!("{name}: {} ({})", if o.on { "on" } else { "off" }, o.detail))
        .collect()
    }
}

/// What a grant service does for the host's CPUs (see `grant::service`).
#[derive(Debug, Clone, Default)]
pub struct ServiceLift {
    /// Its thread's nice value, if lifted.
    pub nice: Option<i32>,
    /// Where it sends the set of holders each time it changes (the vCPU
    /// lift's thread), if the vCPU lift is on.
    pub holders: Option<Sender<Vec<u32>>>,
}

pub use worker::priority::lift_current_thread;
use worker::priority::lift_thread;

/// The calling thread's id. A thread id is positive; were it not, 0 is
/// what `setpriority` takes for the calling thread as well.
pub(crate) fn own_tid() -> u32 {
    u32::try_from(nix::unistd::gettid().as_raw()).unwrap_or(0)
}

/// Whether threads may be raised to `nice` here: tried on thread `tid`
/// (the probe's own), which gets its value back.
fn probe_priority(p: &impl PrioritySetter, tid: u32, nice: i32) -> Opt {
    if nice == 0 {
        return Opt::off("[daemon] priority = 0");
    }
    let before = p.get(tid).unwrap_or(0);
    match lift_thread(p, tid, nice) {
        Ok(()) => {
            let _ = p.set(tid, before);
            Opt::on(format!(
                "grant services and workers' serving threads at nice {nice}"
            ))
        }
        Err(why) => Opt::off(why),
    }
}

/// The options a daemon runs with, and what they need at run time.
#[derive(Debug)]
pub struct HostCpu {
    report: Mutex<Report>,
    /// The lifted nice value, if the priority lift is on.
    nice: Option<i32>,
    lifter: Option<Lifter>,
    /// Where the vCPU lift finds each vGPU's threads.
    pub registry: Registry,
    cgroup: Option<cgroup::WorkerCgroup>,
}

impl HostCpu {
    /// Detects and applies the options of `d`, on the calling thread (the
    /// daemon's main thread, before it starts any other: the CPU mask is
    /// inherited). Nothing here fails: what cannot be had is reported off.
    pub fn start(d: &DaemonConfig) -> HostCpu {
        let cpus = match &d.cpus {
            None => Opt::off("not set ([daemon] cpus)"),
            Some(list) => match cpus::parse(list).and_then(|c| {
                cpus::pin_current_thread(&c)?;
                Ok(c)
            }) {
                Ok(c) => Opt::on(format!(
                    "daemon, grant services and workers on CPUs {}",
                    cpus::format(&c)
                )),
                Err(why) => Opt::off(format!("[daemon] cpus = {list:?}: {why}")),
            },
        };
        let cgroup_weight = d.cgroup_cpu_weight;
        let (cgroup, cg) = if cgroup_weight == 0 {
            (None, Opt::off("[daemon] cgroup_cpu_weight = 0"))
        } else {
            match cgroup::setup(cgroup_weight) {
                Ok(w) => {
                    let o = Opt::on(format!(
                        "workers in {} with cpu.weight {cgroup_weight}",
                        w.dir().display()
                    ));
                    (Some(w), o)
                }
                Err(why) => (None, Opt::off(why)),
            }
        };
        let mut h = Self::lifts(d.priority, d.vcpu_lift, SysPriority);
        h.cgroup = cgroup;
        {
            let mut r = h.report.lock().unwrap_or_else(|e| e.into_inner());
            r.cpus = cpus;
            r.cgroup = cg;
        }
        for l in h.report().lines() {
            tracing::info!("host CPU option {l}");
        }
        h
    }

    /// The priority and vCPU lifts alone (what the bench uses: no pinning,
    /// no cgroup), with `setter` for the vCPU threads.
    pub fn lifts<P: PrioritySetter>(priority: i32, vcpu_lift: bool, setter: P) -> HostCpu {
        let probe = std::thread::spawn(move || {
            let tid = own_tid();
            probe_priority(&SysPriority, tid, priority)
        })
        .join()
        .unwrap_or_else(|_| Opt::off("the probe failed"));
        let nice = probe.on.then_some(priority);
        let registry = Registry::default();
        let (lifter, vcpu) = match (vcpu_lift, nice) {
            (false, _) => (None, Opt::off("[daemon] vcpu_lift = false")),
            (true, None) => (
                None,
                Opt::off(format!(
                    "needs the priority lift, which is off: {}",
                    probe.detail
                )),
            ),
            (true, Some(n)) => (
                Some(Lifter::start(registry.clone(), n, setter)),
                Opt::on(format!(
                    "the threads of the VM holding a GPU at nice {n} while it holds it"
                )),
            ),
        };
        HostCpu {
            report: Mutex::new(Report {
                priority: probe,
                vcpu_lift: vcpu,
                cpus: Opt::off("not set"),
                cgroup: Opt::off("not set"),
            }),
            nice,
            lifter,
            registry,
            cgroup: None,
        }
    }

    /// Every option off, with `why` (a daemon without a scheduler, tests).
    pub fn off(why: &str) -> HostCpu {
        HostCpu {
            report: Mutex::new(Report {
                priority: Opt::off(why),
                vcpu_lift: Opt::off(why),
                cpus: Opt::off(why),
                cgroup: Opt::off(why),
            }),
            nice: None,
            lifter: None,
            registry: Registry::default(),
            cgroup: None,
        }
    }

    /// The options' state now (a vCPU lift the host refused later reads off).
    pub fn report(&self) -> Report {
        let mut r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = self.lifter.as_ref().and_then(Lifter::refused) {
            r.vcpu_lift = Opt::off(why);
        }
        r.clone()
    }

    /// The report overridden for one option (the bench says what it does
    /// not use).
    pub fn set(&self, f: impl FnOnce(&mut Report)) {
        f(&mut self.report.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The lifted nice value, if the priority lift is on.
    pub fn nice(&self) -> Option<i32> {
        self.nice
    }

    /// What a grant service gets.
    pub fn service_lift(&self) -> ServiceLift {
        ServiceLift {
            nice: self.nice,
            holders: self.lifter.as_ref().and_then(Lifter::holders),
        }
    }

    /// A worker process started: into the workers' cgroup, if there is one.
    pub fn worker_started(&self, pid: u32) {
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.add(pid) {
                tracing::warn!(pid, "worker not moved into its cgroup: {e}");
            }
        }
    }
}

impl Drop for HostCpu {
    fn drop(&mut self) {
        // The workers have ended with the daemon (a worker still exiting
        // keeps it: the kernel refuses to remove a cgroup in use).
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::errno::Errno;

    struct Fixed(Result<(), Errno>);
    impl PrioritySetter for Fixed {
        fn get(&self, _: u32) -> Option<i32> {
            Some(0)
        }
        fn set(&self, _: u32, n: i32) -> Result<(), Errno> {
            if n == 0 {
                Ok(())
            } else {
                self.0
            }
        }
    }

    #[test]
    fn the_priority_probe_reports_on_or_off_with_the_reason() {
        let on = probe_priority(&Fixed(Ok(())), 1, -10);
        assert!(on.on && on.detail.contains("nice -10"), "{on:?}");
        let off = probe_priority(&Fixed(Err(Errno::EPERM)), 1, -10);
        assert!(!off.on && off.detail.contains("CAP_SYS_NICE"), "{off:?}");
        assert!(off.detail.contains("RLIMIT_NICE of at least 30"), "{off:?}");
        let zero = probe_priority(&Fixed(Ok(())), 1, 0);
        assert_eq!(zero, Opt::off("[daemon] priority = 0"));
    }

    #[test]
    fn the_vcpu_lift_needs_the_priority_lift_and_says_so() {
        let h = HostCpu::lifts(0, true, Fixed(Ok(())));
        let r = h.report();
        assert!(!r.priority.on && !r.vcpu_lift.on);
        assert!(
            r.vcpu_lift.detail.contains("needs the priority lift"),
            "{r:?}"
        );
        assert!(h.service_lift().holders.is_none() && h.nice().is_none());
        let h = HostCpu::lifts(0, false, Fixed(Ok(())));
        assert_eq!(h.report().vcpu_lift, Opt::off("[daemon] vcpu_lift = false"));
    }

    #[test]
    fn the_report_prints_a_line_per_option() {
        let h = HostCpu::off("not in this test");
        h.set(|r| r.cpus = Opt::on("daemon on CPUs 0-1"));
        let lines = h.report().lines();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[2], "reserved CPUs: on (daemon on CPUs 0-1)");
        assert_eq!(lines[0], "priority lift: off (not in this test)");
        let json = serde_json::to_value(h.report()).unwrap();
        assert_eq!(json["cpus"]["on"], true);
        assert_eq!(json["cgroup"]["detail"], "not in this test");
    }

    #[test]
    fn where_this_process_may_raise_priorities_the_lifts_are_on() {
        // As root or with CAP_SYS_NICE (the CI machine) on; otherwise off
        // with the reason. Either way the report says which.
        let h = HostCpu::lifts(-5, true, SysPriority);
        let r = h.report();
        let allowed = std::thread::spawn(|| lift_current_thread(-5).is_ok())
            .join()
            .unwrap();
        assert_eq!(r.priority.on, allowed, "{r:?}");
        assert_eq!(r.vcpu_lift.on, allowed, "{r:?}");
        assert_eq!(h.service_lift().holders.is_some(), allowed);
    }
}
