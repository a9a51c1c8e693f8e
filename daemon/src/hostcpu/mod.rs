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
//! - real-time lift (`[daemon] realtime`, off by default): while another
//!   vGPU waits for the GPU, the holder's vCPU threads, its worker's
//!   serving thread and the grant services' threads run in `SCHED_FIFO`
//!   (priorities 1, 2, 3), each only until the round's deadline. A lifted
//!   fair-class thread still cedes about a tenth of its CPU to a busy
//!   nice-0 thread, in pieces up to a tick long, and a guest launching
//!   short kernels loses its GPU time with it; in `SCHED_FIFO` it does
//!   not. The cost: other threads on those CPUs (other VMs' vCPUs, the
//!   host's own) wait up to a slice (the kernel keeps them 5% of each
//!   CPU). A thread made meanwhile starts in the fair class (reset on
//!   fork). Needs CAP_SYS_NICE and, where the kernel has real-time group
//!   scheduling, real-time runtime for the daemon's and the VMs' cgroups.
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
    /// A contended holder's threads in `SCHED_FIFO`.
    pub realtime: Opt,
    /// Reserved CPUs.
    pub cpus: Opt,
    /// Workers in a cgroup v2 child with a higher `cpu.weight`.
    pub cgroup: Opt,
}

/// Each option's key in the status (`host_cpu`) and its name in a line,
/// in [`Report::lines`]' order (`fairvgpu status` renders the same).
pub const OPTIONS: [(&str, &str); 5] = [
    ("priority", "priority lift"),
    ("vcpu_lift", "vCPU lift"),
    ("realtime", "real-time lift"),
    ("cpus", "reserved CPUs"),
    ("cgroup", "cgroup"),
];

impl Report {
    /// One line per option, as `fairvgpu status` and the bench print them.
    pub fn lines(&self) -> Vec<String> {
        let opts = [
            &self.priority,
            &self.vcpu_lift,
            &self.realtime,
            &self.cpus,
            &self.cgroup,
        ];
        OPTIONS
            .iter()
            .zip(opts)
            .map(|((_, name), o)| {
                format!("{name}: {} ({})", if o.on { "on" } else { "off" }, o.detail)
            })
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
    pub holders: Option<Sender<lift::Holders>>,
    /// Its thread in `SCHED_FIFO` (the real-time lift).
    pub realtime: bool,
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

/// Whether threads may go into `SCHED_FIFO` here: tried on thread `tid`
/// (the probe's own), which goes back after.
fn probe_realtime(p: &impl PrioritySetter, tid: u32) -> Opt {
    let prio = worker::priority::REALTIME_SERVICE;
    match p.enter_fifo(tid, prio) {
        Ok(()) => {
            let _ = p.leave_fifo(tid, prio, 0);
            Opt::on(
                "while another vGPU waits, the holder's vCPU threads, its worker's serving thread and the grant services in SCHED_FIFO 1/2/3 until the round's deadline",
            )
        }
        Err(e) => Opt::off(worker::priority::fifo_refusal(e, prio)),
    }
}

/// The options a daemon runs with, and what they need at run time.
#[derive(Debug)]
pub struct HostCpu {
    report: Mutex<Report>,
    /// The lifted nice value, if the priority lift is on.
    nice: Option<i32>,
    /// The real-time lift is on.
    realtime: bool,
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
        let mut h = Self::lifts(d.priority, d.vcpu_lift, SysPriority, d.realtime);
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

    /// The priority, vCPU and (with `realtime`) real-time lifts alone
    /// (what the bench uses: no pinning, no cgroup), with `setter` for the
    /// vCPU threads.
    pub fn lifts<P: PrioritySetter>(
        priority: i32,
        vcpu_lift: bool,
        setter: P,
        realtime: bool,
    ) -> HostCpu {
        let (probe, rt_probe) = std::thread::spawn(move || {
            let tid = own_tid();
            let rt = realtime.then(|| probe_realtime(&SysPriority, tid));
            (probe_priority(&SysPriority, tid, priority), rt)
        })
        .join()
        .unwrap_or_else(|_| (Opt::off("the probe failed"), None));
        let nice = probe.on.then_some(priority);
        let registry = Registry::default();
        let (lift_nice, vcpu) = match (vcpu_lift, nice) {
            (false, _) => (None, Opt::off("[daemon] vcpu_lift = false")),
            (true, None) => (
                None,
                Opt::off(format!(
                    "needs the priority lift, which is off: {}",
                    probe.detail
                )),
            ),
            (true, Some(n)) => (
                Some(n),
                Opt::on(format!(
                    "the threads of the VM holding a GPU at nice {n} while it holds it"
                )),
            ),
        };
        // The real-time lift lifts the threads the vCPU lift chooses.
        let realtime = match (rt_probe, lift_nice) {
            (None, _) => Opt::off("[daemon] realtime = false"),
            (Some(_), None) => Opt::off(format!(
                "needs the vCPU lift, which is off: {}",
                vcpu.detail
            )),
            (Some(p), Some(_)) => p,
        };
        let lifter = lift_nice.map(|n| Lifter::start(registry.clone(), n, setter, realtime.on));
        HostCpu {
            report: Mutex::new(Report {
                priority: probe,
                vcpu_lift: vcpu,
                realtime: realtime.clone(),
                cpus: Opt::off("not set"),
                cgroup: Opt::off("not set"),
            }),
            nice,
            realtime: realtime.on,
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
                realtime: Opt::off(why),
                cpus: Opt::off(why),
                cgroup: Opt::off(why),
            }),
            nice: None,
            realtime: false,
            lifter: None,
            registry: Registry::default(),
            cgroup: None,
        }
    }

    /// The options' state now (a vCPU lift the host refused later reads off).
    pub fn report(&self) -> Report {
        let mut r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(st) = self.lifter.as_ref().map(Lifter::state) {
            if let Some(why) = st.refused {
                r.vcpu_lift = Opt::off(why);
            }
            if let Some(why) = st.realtime_refused {
                r.realtime = Opt::off(why);
            }
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

    /// Whether the real-time lift is on (a worker's serving thread then
    /// goes into `SCHED_FIFO` while it holds a contended grant).
    pub fn realtime(&self) -> bool {
        self.realtime
    }

    /// What the vCPU lift's thread has done, if it runs.
    pub fn lift_state(&self) -> Option<lift::LiftState> {
        self.lifter.as_ref().map(Lifter::state)
    }

    /// Every thread the vCPU lift raised gets its own nice and class back
    /// (the daemon stopping); waits up to a second for it.
    pub fn put_back(&self) {
        if let Some(l) = &self.lifter {
            if !l.put_back(std::time::Duration::from_secs(1)) {
                tracing::warn!("the vCPU lift did not put its threads back within 1 s");
            }
        }
    }

    /// What a grant service gets.
    pub fn service_lift(&self) -> ServiceLift {
        ServiceLift {
            nice: self.nice,
            holders: self.lifter.as_ref().and_then(Lifter::holders),
            realtime: self.realtime,
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
        let h = HostCpu::lifts(0, true, Fixed(Ok(())), true);
        let r = h.report();
        assert!(!r.priority.on && !r.vcpu_lift.on);
        assert!(
            r.vcpu_lift.detail.contains("needs the priority lift"),
            "{r:?}"
        );
        assert!(h.service_lift().holders.is_none() && h.nice().is_none());
        assert!(!r.realtime.on && r.realtime.detail.contains("needs the vCPU lift"));
        assert!(!h.realtime() && !h.service_lift().realtime);
        let h = HostCpu::lifts(0, false, Fixed(Ok(())), false);
        assert_eq!(h.report().vcpu_lift, Opt::off("[daemon] vcpu_lift = false"));
        assert_eq!(h.report().realtime, Opt::off("[daemon] realtime = false"));
    }

    #[test]
    fn the_report_prints_a_line_per_option() {
        let h = HostCpu::off("not in this test");
        h.set(|r| r.cpus = Opt::on("daemon on CPUs 0-1"));
        let lines = h.report().lines();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[3], "reserved CPUs: on (daemon on CPUs 0-1)");
        assert_eq!(lines[2], "real-time lift: off (not in this test)");
        assert_eq!(lines[0], "priority lift: off (not in this test)");
        let json = serde_json::to_value(h.report()).unwrap();
        // The status's keys are the ones `fairvgpu status` looks up.
        for (key, _) in OPTIONS {
            assert!(json[key].is_object(), "{key} in {json}");
        }
        assert_eq!(json["cpus"]["on"], true);
        assert_eq!(json["cgroup"]["detail"], "not in this test");
    }

    #[test]
    fn where_this_process_may_raise_priorities_the_lifts_are_on() {
        // As root or with CAP_SYS_NICE (the CI machine) on; otherwise off
        // with the reason. Either way the report says which.
        let h = HostCpu::lifts(-5, true, SysPriority, true);
        let r = h.report();
        let allowed = std::thread::spawn(|| lift_current_thread(-5).is_ok())
            .join()
            .unwrap();
        assert_eq!(r.priority.on, allowed, "{r:?}");
        assert_eq!(r.vcpu_lift.on, allowed, "{r:?}");
        assert_eq!(h.service_lift().holders.is_some(), allowed);
        let fifo = std::thread::spawn(|| {
            let tid = own_tid();
            let ok = worker::priority::enter_fifo(tid, 3).is_ok();
            let _ = worker::priority::leave_fifo(tid, 3, 0);
            ok
        })
        .join()
        .unwrap();
        assert_eq!(r.realtime.on, allowed && fifo, "{r:?}");
        assert_eq!(h.service_lift().realtime, r.realtime.on);
    }

    /// Refuses `SCHED_FIFO`, or lets it.
    struct Rt(Result<(), Errno>);
    impl PrioritySetter for Rt {
        fn get(&self, _: u32) -> Option<i32> {
            Some(0)
        }
        fn set(&self, _: u32, _: i32) -> Result<(), Errno> {
            Ok(())
        }
        fn enter_fifo(&self, _: u32, _: u32) -> Result<(), Errno> {
            self.0
        }
    }

    #[test]
    fn the_real_time_probe_reports_on_or_off_with_the_reason() {
        let on = probe_realtime(&Rt(Ok(())), 1);
        assert!(on.on && on.detail.contains("SCHED_FIFO 1/2/3"), "{on:?}");
        let off = probe_realtime(&Rt(Err(Errno::EPERM)), 1);
        assert!(!off.on, "{off:?}");
        assert!(off.detail.contains("CAP_SYS_NICE"), "{off:?}");
        assert!(off.detail.contains("real-time group scheduling"), "{off:?}");
    }
}
