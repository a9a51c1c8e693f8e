//! Migrations between GPUs: those the control API or the balancer asked
//! for start here, and the workers' reports of those done are collected.

use std::time::{Duration, Instant};

use super::Supervisor;
use crate::config::Config;
use crate::control::ControlPlane;
use crate::link::VmHost;
use crate::setup::grant_socket;

impl Supervisor {
    /// Migrations: start those asked for, collect the workers' reports,
    /// and give up on those that never report.
    pub(super) fn on_migrations(&mut self) {
        for (vm, to) in self.plane.take_requested() {
            if let Err(e) = start_migration(&self.plane, self.hosts.get(&vm), &vm, to) {
                self.plane.finish_migration(&vm, Err(e));
            }
        }
        for (name, host) in &self.hosts {
            for r in host.take_reports() {
                self.plane.finish_migration(name, Ok(r));
            }
        }
        self.plane.expire_migrations(Duration::from_secs(30));
    }

    /// The balancer looks at the GPUs every `[placement] interval_ms` (and
    /// asks for the migrations it wants).
    pub(super) fn balance(&mut self, want: &Config) {
        if self.last_balance.elapsed() >= Duration::from_millis(want.placement.interval_ms) {
            self.last_balance = Instant::now();
            self.plane.balance();
        }
    }
}

/// Tells `vm`'s worker to move to GPU `to`: the target GPU's fair queue
/// takes the vGPU in as far ahead of its virtual time as it was on the
/// source (it neither gains nor loses share by moving), and the worker,
/// which may not connect anywhere itself, gets the target's grant socket.
fn start_migration(
    plane: &ControlPlane,
    host: Option<&VmHost>,
    vm: &str,
    to: u32,
) -> Result<(), String> {
    let host = host.ok_or_else(|| format!("{vm} has no worker"))?;
    let id = plane.vgpu_id(vm);
    let from = plane.gpu_of(vm).unwrap_or(0);
    let cfg = plane.config();
    let vmc = cfg.vm(vm).ok_or_else(|| format!("no vm named {vm:?}"))?;
    if vmc.process_slots > 0 {
        return Err(format!(
            "{vm} has process slots: its workers do not move between GPUs"
        ));
    }
    let grant = if cfg.daemon.scheduler {
        let src = plane.service(from).map_err(|e| e.to_string())?;
        let dst = plane
            .service(to)
            .map_err(|e| e.to_string())?
            .ok_or("no grant service on the target GPU")?;
        let lag = src.and_then(|s| s.lag(id)).unwrap_or(0);
        dst.set_share(id, &vmc.tenant, vmc.weight, cfg.tenant_weight(&vmc.tenant))
            .map_err(|e| e.to_string())?;
        dst.expect(id, lag).map_err(|e| e.to_string())?;
        let s = std::os::unix::net::UnixStream::connect(grant_socket(&cfg, to))
            .map_err(|e| format!("connecting to GPU {to}'s grant service: {e}"))?;
        Some(s)
    } else {
        None
    };
    plane.event(
        "migration",
        format!("{vm}: moving from GPU {from} to GPU {to}"),
    );
    host.migrate(to, grant.as_ref()).map_err(|e| e.to_string())
}
