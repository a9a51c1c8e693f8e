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

/// What one reconciliation does.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Running domains whose vGPU the daemon lacks, or has at another weight.
    pub declare: Vec<DomainVgpu>,
    /// vGPUs libvirt declared whose domain was not running twice in a row.
    pub free: Vec<String>,
    /// Those not running this time (freed if still so next time: a domain
    /// whose hook declared it may not be listed as running yet).
    pub missing: BTreeSet<String>,
}

/// The reconciliation of the running domains' vGPUs `running` with those
/// the daemon serves, `served`; `missing_before`: the last plan's `missing`.
pub fn plan(running: &[DomainVgpu], served: &[Served], missing_before: &BTreeSet<String>) -> Plan {
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
            _ => p.declare.push(d.clone()),
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
    /// vGPUs found without a running domain last time.
    missing: BTreeSet<String>,
}

impl Watch {
    fn reconcile(&mut self, conn: &Connect) -> Result<()> {
        let running = running(conn)?;
        let served = self.api.served().context("the daemon's status")?;
        let p = plan(&running, &served, &self.missing);
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
        for name in &p.free {
            match self.api.undeclare(name) {
                Ok(()) => tracing::info!(domain = name, "domain gone: vGPU given back"),
                Err(e) => tracing::warn!(domain = name, "giving back its vGPU: {e:#}"),
            }
        }
        self.missing = p.missing;
        Ok(())
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
            Event::Lifecycle { name, kind } if kind == events::STARTED => {
                let dom = Domain::lookup_by_name(conn, &name)?;
                if let Some(v) = domain_vgpu(&dom.get_xml_desc(0)?)? {
                    self.api.declare(&v)?;
                }
            }
            Event::Lifecycle { name, kind } if kind == events::STOPPED => {
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
        missing: BTreeSet::new(),
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
        let p = plan(&running, &served_now, &BTreeSet::new());
        let names: Vec<_> = p.declare.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["b", "c"]);
        assert!(p.free.is_empty(), "freed at first sight: {:?}", p.free);
        assert_eq!(p.missing, BTreeSet::from(["gone".to_owned()]));
        let p2 = plan(&running, &served_now, &p.missing);
        assert_eq!(p2.free, ["gone"]);
        // A domain of host.toml's name is left alone, not re-declared.
        let p3 = plan(&[dom("vm1", 1.0)], &served_now, &BTreeSet::new());
        assert!(p3.declare.is_empty());
    }
}
