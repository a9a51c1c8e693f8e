//! `fairvgpu-libvirt watch`: follows libvirt's domains live. A changed
//! weight in a running domain's metadata (`virsh metadata`) is set at
//! once; a domain that stops gives its vGPU back; and every few seconds,
//! and at once after (re)connecting to libvirtd, the daemon's vGPUs are
//! reconciled with the running domains (one missing is declared, one
//! libvirt declared whose domain is gone is given back).

use std::collections::BTreeSet;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;

use anyhow::{Context as _, Result};
use daemon::libvirt_xml::{domain_vgpu, element_declaration, DomainVgpu, NAMESPACE};
use virt::connect::Connect;
use virt::domain::Domain;
use virt_sys as sys;

use crate::api::{Api, Served};
use crate::events::{self, Event};
use crate::saves;

/// What one reconciliation does.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Running domains whose vGPU the daemon lacks (the second look in a
    /// row), or has at another weight.
    pub declare: Vec<DomainVgpu>,
    /// Running domains whose vGPU the daemon lacks this time (declared if
    /// still so next time: a domain being stopped may still be listed as
    /// running after its hook gave its vGPU back).
    pub absent: BTreeSet<String>,
    /// vGPUs libvirt declared whose domain was not running twice in a row.
    pub free: Vec<String>,
    /// Those not running this time (freed if still so next time: a domain
    /// whose hook declared it may not be listed as running yet).
    pub missing: BTreeSet<String>,
}

/// The reconciliation of the running domains' vGPUs `running` with those
/// the daemon serves, `served`; `before`: the last plan.
pub fn plan(running: &[DomainVgpu], served: &[Served], before: &Plan) -> Plan {
    let missing_before = &before.missing;
    let mut p = Plan::default();
    for d in running {
        match served.iter().find(|s| s.name == d.name) {
            Some(s) if !s.by_libvirt => {
                tracing::warn!(
                    domain = d.name,
                    "its vGPU's name is host.toml's or another manager's: left alone"
                );
            }
            Some(s) if s.weight == d.declaration.weight => {}
            Some(_) => p.declare.push(d.clone()),
            None if before.absent.contains(&d.name) => p.declare.push(d.clone()),
            None => {
                p.absent.insert(d.name.clone());
            }
        }
    }
    for s in served.iter().filter(|s| s.by_libvirt) {
        if !running.iter().any(|d| d.name == s.name) {
            if missing_before.contains(&s.name) {
                p.free.push(s.name.clone());
            } else {
                p.missing.insert(s.name.clone());
            }
        }
    }
    p
}

/// The vCPU thread ids of domain `name`'s QEMU, in vCPU order: its threads
/// named `CPU <n>/KVM` (or `/TCG`), found through the pid file libvirt
/// keeps in `pid_dir` (`/run/libvirt/qemu`). Empty if none are found.
pub fn vcpu_threads(pid_dir: &std::path::Path, name: &str) -> Vec<u32> {
    let Some(pid) = std::fs::read_to_string(pid_dir.join(format!("{name}.pid")))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
    else {
        return Vec::new();
    };
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, u32)> = tasks
        .flatten()
        .filter_map(|t| {
            let tid = t.file_name().to_str()?.parse::<u32>().ok()?;
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            Some((vcpu_index(&comm)?, tid))
        })
        .collect();
    found.sort_unstable();
    found.into_iter().map(|(_, tid)| tid).collect()
}

/// The vCPU index of a QEMU thread named `CPU <n>/<accel>`.
fn vcpu_index(comm: &str) -> Option<u32> {
    let rest = comm.trim().strip_prefix("CPU ")?;
    let (n, _) = rest.split_once('/')?;
    n.parse().ok()
}

/// Where libvirt's QEMU driver keeps its domains' pid files.
const PID_DIR: &str = "/run/libvirt/qemu";

/// The running domains' vGPUs (a domain whose metadata is malformed is
/// logged and left out).
fn running(conn: &Connect) -> Result<Vec<DomainVgpu>> {
    let doms = conn
        .list_all_domains(sys::VIR_CONNECT_LIST_DOMAINS_ACTIVE)
        .context("listing the running domains")?;
    let mut out = Vec::new();
    for d in doms {
        let Ok(xml) = d.get_xml_desc(0) else { continue };
        match domain_vgpu(&xml) {
            Ok(Some(v)) => out.push(v),
            Ok(None) => {}
            Err(e) => tracing::warn!(domain = d.get_name().unwrap_or_default(), "{e}"),
        }
    }
    Ok(out)
}

struct Watch {
    api: Api,
    /// The last reconciliation (what it found missing or absent).
    last: Plan,
}

impl Watch {
    fn reconcile(&mut self, conn: &Connect) -> Result<()> {
        let running = running(conn)?;
        let served = self.api.served().context("the daemon's status")?;
        let p = plan(&running, &served, &self.last);
        for v in &p.declare {
            match self.api.declare(v) {
                Ok(added) => tracing::info!(
                    domain = v.name,
                    weight = v.declaration.weight,
                    added,
                    "vGPU declared"
                ),
                Err(e) => tracing::warn!(domain = v.name, "declaring its vGPU: {e:#}"),
            }
        }
        // The vCPU threads of running domains the daemon lacks them of
        // (a domain just started, or the daemon restarted).
        for v in &running {
            if served
                .iter()
                .any(|s| s.name == v.name && s.by_libvirt && !s.has_vcpus)
            {
                self.give_vcpus(&v.name);
            }
        }
        for name in &p.free {
            match self.api.undeclare(name) {
                Ok(()) => tracing::info!(domain = name, "domain gone: vGPU given back"),
                Err(e) => tracing::warn!(domain = name, "giving back its vGPU: {e:#}"),
            }
        }
        self.last = Plan {
            missing: p.missing,
            absent: p.absent,
            ..Plan::default()
        };
        Ok(())
    }

    fn give_vcpus(&self, name: &str) {
        let threads = vcpu_threads(std::path::Path::new(PID_DIR), name);
        if threads.is_empty() {
            return;
        }
        match self.api.set_vcpus(name, &threads) {
            Ok(()) => tracing::info!(domain = name, ?threads, "vCPU threads given"),
            Err(e) => tracing::warn!(domain = name, "giving its vCPU threads: {e:#}"),
        }
    }

    fn follow(&mut self, conn: &Connect, e: Event) -> Result<()> {
        match e {
            Event::Metadata { name } => {
                let dom = Domain::lookup_by_name(conn, &name)?;
                if !dom.is_active()? {
                    return Ok(());
                }
                let el = dom.get_metadata(
                    sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
                    Some(NAMESPACE),
                    sys::VIR_DOMAIN_AFFECT_LIVE,
                )?;
                let declaration = element_declaration(&el)?;
                let weight = declaration.weight;
                self.api.declare(&DomainVgpu {
                    name: name.clone(),
                    declaration,
                })?;
                tracing::info!(domain = name, weight, "metadata changed: vGPU updated");
            }
            Event::Lifecycle { name, kind, detail } if kind == events::STARTED => {
                let dom = Domain::lookup_by_name(conn, &name)?;
                if let Some(v) = domain_vgpu(&dom.get_xml_desc(0)?)? {
                    self.api.declare(&v)?;
                    self.give_vcpus(&v.name);
                    if detail == events::STARTED_RESTORED {
                        saves::restored(&self.api, &dom, &name)?;
                    }
                }
            }
            Event::Lifecycle { name, kind, .. } if kind == events::SUSPENDED => {
                let dom = Domain::lookup_by_name(conn, &name)?;
                saves::suspended(&self.api, &dom, &name)?;
            }
            Event::Lifecycle { name, kind, .. } if kind == events::STOPPED => {
                let ours = self
                    .api
                    .served()?
                    .iter()
                    .any(|s| s.name == name && s.by_libvirt);
                if ours {
                    self.api.undeclare(&name)?;
                    tracing::info!(domain = name, "domain stopped: vGPU given back");
                }
            }
            Event::Lifecycle { .. } | Event::Closed => {}
        }
        Ok(())
    }

    /// Serves one connection until it closes.
    fn serve(&mut self, conn: &Connect, rx: &Receiver<Event>, every: Duration) {
        if let Err(e) = self.reconcile(conn) {
            tracing::warn!("reconciling: {e:#}");
        }
        loop {
            match rx.recv_timeout(every) {
                Ok(Event::Closed) => return,
                Ok(e) => {
                    if let Err(err) = self.follow(conn, e.clone()) {
                        tracing::warn!(?e, "{err:#}");
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if !conn.is_alive().unwrap_or(false) {
                        return;
                    }
                    if let Err(e) = self.reconcile(conn) {
                        tracing::warn!("reconciling: {e:#}");
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

/// Runs the watch on libvirt at `uri` for the daemon at `api`, reconciling
/// every `every`; reconnects to libvirtd whenever it goes.
pub fn run(api: Api, uri: &str, every: Duration) -> Result<()> {
    // Errors are logged here, with their context, not by libvirt itself.
    virt::error::clear_error_callback();
    virt::event::event_register_default_impl()?;
    std::thread::Builder::new()
        .name("libvirt-events".into())
        .spawn(|| loop {
            if let Err(e) = virt::event::event_run_default_impl() {
                tracing::warn!("libvirt's event loop: {e}");
                std::thread::sleep(Duration::from_secs(1));
            }
        })?;
    let mut w = Watch {
        api,
        last: Plan::default(),
    };
    loop {
        match Connect::open(Some(uri)) {
            Ok(mut conn) => {
                let (tx, rx) = channel();
                match events::watch(&conn, tx) {
                    Ok(()) => {
                        tracing::info!(uri, "connected to libvirt: following its domains");
                        w.serve(&conn, &rx, every);
                        tracing::warn!(uri, "libvirt's connection closed: reconnecting");
                    }
                    Err(e) => tracing::warn!("{e:#}"),
                }
                let _ = conn.close();
            }
            Err(e) => tracing::warn!(uri, "connecting to libvirt: {e}"),
        }
        std::thread::sleep(every.min(Duration::from_secs(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daemon::control::VgpuDeclaration;

    fn dom(name: &str, weight: f64) -> DomainVgpu {
        DomainVgpu {
            name: name.into(),
            declaration: VgpuDeclaration {
                tenant: "t".into(),
                weight,
                memory_limit_mib: 8,
                gpu: None,
                owner: Some("libvirt".into()),
            },
        }
    }

    fn served(name: &str, by_libvirt: bool, weight: f64) -> Served {
        Served {
            name: name.into(),
            by_libvirt,
            weight,
            has_vcpus: false,
        }
    }

    #[test]
    fn vcpu_threads_are_found_by_name_in_vcpu_order() {
        assert_eq!(vcpu_index("CPU 3/KVM\n"), Some(3));
        assert_eq!(vcpu_index("CPU 0/TCG"), Some(0));
        assert_eq!(vcpu_index("qemu-system-x86"), None);
        assert_eq!(vcpu_index("CPU x/KVM"), None);
        // This process, as a domain's QEMU: two threads named as its vCPUs.
        let dir = scratch::dir("bridge-vcpus");
        std::fs::write(dir.join("d.pid"), format!("{}\n", std::process::id())).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut handles = Vec::new();
        let mut tids = Vec::new();
        for n in ["CPU 1/TCG", "CPU 0/TCG"] {
            let (tx, rx) = std::sync::mpsc::channel();
            let stop = stop.clone();
            let h = std::thread::Builder::new()
                .name(n.into())
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    tx.send(unsafe { libc::gettid() }).unwrap();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                })
                .unwrap();
            handles.push(h);
            tids.push(u32::try_from(rx.recv().unwrap()).unwrap());
        }
        assert_eq!(vcpu_threads(&dir, "d"), [tids[1], tids[0]]);
        assert!(vcpu_threads(&dir, "other").is_empty());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn missing_ones_are_declared_and_gone_ones_freed_after_a_second_look() {
        let running = [dom("a", 1.0), dom("b", 2.0), dom("c", 1.0)];
        let served_now = [
            served("a", true, 1.0),    // as it should be
            served("b", true, 1.0),    // weight changed while the watch was away
            served("vm1", false, 1.0), // host.toml's: never touched
            served("gone", true, 1.0),
        ];
        let p = plan(&running, &served_now, &Plan::default());
        let names: Vec<_> = p.declare.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["b"], "only the weight is set at first sight");
        assert_eq!(p.absent, BTreeSet::from(["c".to_owned()]));
        assert!(p.free.is_empty(), "freed at first sight: {:?}", p.free);
        assert_eq!(p.missing, BTreeSet::from(["gone".to_owned()]));
        let p2 = plan(&running, &served_now, &p);
        let names: Vec<_> = p2.declare.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(p2.free, ["gone"]);
        // A domain seen once without its vGPU, then stopped: nothing to do.
        let p3 = plan(&running[..2], &served_now[..2], &p);
        assert!(p3.declare.iter().all(|d| d.name != "c"));
        // A domain of host.toml's name is left alone, not re-declared.
        let p4 = plan(&[dom("vm1", 1.0)], &served_now, &p2);
        assert!(p4.declare.is_empty());
    }
}
