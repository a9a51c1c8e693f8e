//! Migrations between GPUs: those the control API or the balancer asked
//! for start here, and the workers' reports of those done are collected.
//!
//! A vGPU has a worker per running process: each is
//! told to move, over a grant connection of its own, and the vGPU's
//! placement changes once all have moved. If one cannot move, those that
//! moved are moved back, so that a vGPU never runs on two GPUs (its place
//! in the fair queue and its memory limit are one GPU's): the migration
//! fails naming the slot that could not move, and a worker that cannot
//! move back either is ended (its process sees the error, as after a
//! fault). Slots claimed meanwhile get their workers once it has ended,
//! on the GPU the vGPU is then on. One with no running process moves at
//! once: it has nothing on any GPU.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::Supervisor;
use crate::config::Config;
use crate::control::ControlPlane;
use crate::link::MigrationReport;
use crate::setup::grant_socket;

/// How long a migration's workers have to report.
const MIGRATION_LIMIT: Duration = Duration::from_secs(30);

/// A migration of a vGPU, under way.
pub(super) struct Moving {
    from: u32,
    to: u32,
    /// The lanes (slots) whose worker has not reported yet.
    waiting: BTreeSet<u32>,
    /// Those that moved (forward), with their reports.
    moved: BTreeMap<u32, MigrationReport>,
    /// Why it failed, once a worker could not move.
    failed: Option<String>,
    /// Moving back (after a worker could not move): why the migration
    /// failed.
    back: Option<String>,
    /// Moving back, the lanes whose worker could not.
    stuck: BTreeSet<u32>,
    since: Instant,
}

impl Supervisor {
    /// Migrations: start those asked for, collect the workers' reports,
    /// and give up on those that never report.
    pub(super) fn on_migrations(&mut self) {
        for (vm, to) in self.plane.take_requested() {
            if let Err(e) = self.start_moving(&vm, to) {
                self.plane.finish_migration(&vm, Err(e));
            }
        }
        for (name, host) in &self.hosts {
            let reports = host.take_reports();
            match self.moves.get_mut(name) {
                Some(m) => {
                    for (lane, r) in reports {
                        m.report(lane, r);
                    }
                    // A worker that ended meanwhile has nothing to move.
                    let live = host.lanes();
                    m.waiting.retain(|l| live.contains(l));
                }
                None => {
                    for (_, r) in reports {
                        self.plane.finish_migration(name, Ok(r));
                    }
                }
            }
        }
        self.advance_moves();
        self.plane
            .expire_migrations(MIGRATION_LIMIT + Duration::from_secs(5));
    }

    /// Moves every running worker of `vm` to GPU `to`.
    fn start_moving(&mut self, vm: &str, to: u32) -> Result<(), String> {
        let host = self
            .hosts
            .get(vm)
            .ok_or_else(|| format!("{vm} has no host side"))?;
        let from = self.plane.gpu_of(vm).unwrap_or(0);
        let lanes = host.lanes();
        if lanes.is_empty() {
            // Nothing of it is on any GPU.
            self.plane
                .finish_migration(vm, Ok(moved_report(to, [].iter())));
            return Ok(());
        }
        let cfg = self.plane.config();
        let grant = prepare_target(&self.plane, &cfg, vm, from, to)?;
        self.plane.event(
            "migration",
            format!(
                "{vm}: moving its {} workers from GPU {from} to GPU {to}",
                lanes.len()
            ),
        );
        let mut waiting = BTreeSet::new();
        for lane in lanes {
            let s = grant.as_ref().map(|_| connect(&cfg, to)).transpose()?;
            match host.migrate_lane(lane, to, s.as_ref()) {
                Ok(()) => {
                    waiting.insert(lane);
                }
                Err(e) => tracing::debug!(vm, lane, "not moved (its worker is gone): {e}"),
            }
        }
        self.moves.insert(
            vm.to_owned(),
            Moving {
                from,
                to,
                waiting,
                moved: BTreeMap::new(),
                failed: None,
                back: None,
                stuck: BTreeSet::new(),
                since: Instant::now(),
            },
        );
        Ok(())
    }

    /// Ends the migrations whose workers have all reported (or that ran
    /// past their time): the placement changes, or the moved workers are
    /// moved back.
    fn advance_moves(&mut self) {
        let names: Vec<String> = self.moves.keys().cloned().collect();
        for vm in names {
            let Some(m) = self.moves.get(&vm) else {
                continue;
            };
            let late = m.since.elapsed() > MIGRATION_LIMIT;
            if !m.waiting.is_empty() && !late {
                continue;
            }
            let Some(m) = self.moves.remove(&vm) else {
                continue;
            };
            if late {
                // Its workers may be on either GPU: all are ended, so that
                // none runs where the vGPU is not.
                self.end_workers(
                    &vm,
                    &m.waiting.iter().chain(m.moved.keys()).copied().collect(),
                );
                let e = format!("{vm}: a worker did not answer; the vGPU's workers were ended");
                self.plane.finish_migration(&vm, Err(e));
                continue;
            }
            if let Some(why) = m.back {
                self.end_workers(&vm, &m.stuck);
                self.plane.finish_migration(&vm, Err(why));
                continue;
            }
            match m.failed {
                None => {
                    let r = moved_report(m.to, m.moved.values());
                    self.plane.finish_migration(&vm, Ok(r));
                }
                Some(why) if m.moved.is_empty() => {
                    self.plane
                        .finish_migration(&vm, Err(format!("{vm}: {why}")));
                }
                Some(why) => {
                    self.move_back(&vm, m.from, m.to, m.moved.keys().copied().collect(), why)
                }
            }
        }
    }

    /// After a worker of `vm` could not move to `to`: those that did
    /// (`lanes`) go back to `from`; the migration fails with `why`.
    fn move_back(&mut self, vm: &str, from: u32, to: u32, lanes: BTreeSet<u32>, why: String) {
        let why = format!("{vm}: {why}");
        let cfg = self.plane.config();
        let back = prepare_target(&self.plane, &cfg, vm, to, from);
        let host = self.hosts.get(vm);
        let mut waiting = BTreeSet::new();
        let mut stuck = BTreeSet::new();
        for &lane in &lanes {
            let sent = back.as_ref().map_err(Clone::clone).and_then(|g| {
                let s = g.as_ref().map(|_| connect(&cfg, from)).transpose()?;
                host.ok_or_else(|| "no host side".to_owned())?
                    .migrate_lane(lane, from, s.as_ref())
                    .map_err(|e| e.to_string())
            });
            match sent {
                Ok(()) => {
                    waiting.insert(lane);
                }
                Err(_) => {
                    stuck.insert(lane);
                }
            }
        }
        self.end_workers(vm, &stuck);
        self.plane.event(
            "migration",
            format!(
                "{why}; the {} workers that moved go back to GPU {from}",
                lanes.len()
            ),
        );
        self.moves.insert(
            vm.to_owned(),
            Moving {
                from: to,
                to: from,
                waiting,
                moved: BTreeMap::new(),
                failed: None,
                back: Some(why),
                stuck: BTreeSet::new(),
                since: Instant::now(),
            },
        );
    }

    /// Ends `vm`'s workers of lanes `lanes` (SIGTERM; their exits are
    /// handled as any slot's worker's).
    fn end_workers(&mut self, vm: &str, lanes: &BTreeSet<u32>) {
        for w in &self.children {
            if w.name == vm && lanes.contains(&w.slot) {
                if let Some(c) = &w.child {
                    tracing::warn!(
                        vm,
                        slot = w.slot,
                        "worker ended: it is on neither GPU for sure"
                    );
                    super::workers::signal_child(c, nix::sys::signal::Signal::SIGTERM);
                }
            }
        }
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

impl Moving {
    /// Lane `lane`'s worker reported `r`.
    fn report(&mut self, lane: u32, r: MigrationReport) {
        if !self.waiting.remove(&lane) {
            return;
        }
        if r.moved && r.gpu == self.to {
            self.moved.insert(lane, r);
        } else if self.back.is_some() {
            self.stuck.insert(lane);
        } else if self.failed.is_none() {
            let why = r.reason();
            let (to, from) = (self.to, self.from);
            let why = if why.is_empty() {
                String::new()
            } else {
                format!(": {why}")
            };
            self.failed = Some(format!(
                "could not move to GPU {to}: process slot {lane}'s worker could not{why}; it stays on GPU {from}"
            ));
        }
    }
}

/// The report of a vGPU whose workers all moved to `to`: the longest
/// pause, the memory they copied together.
fn moved_report<'a>(to: u32, rs: impl Iterator<Item = &'a MigrationReport>) -> MigrationReport {
    let mut r = MigrationReport {
        gpu: to,
        moved: true,
        pause_us: 0,
        kib: 0,
        kept_by: None,
        failed: None,
    };
    for x in rs {
        r.pause_us = r.pause_us.max(x.pause_us);
        r.kib += x.kib;
    }
    r
}

/// A new connection to GPU `to`'s grant service.
fn connect(cfg: &Config, to: u32) -> Result<UnixStream, String> {
    UnixStream::connect(grant_socket(cfg, to))
        .map_err(|e| format!("connecting to GPU {to}'s grant service: {e}"))
}

/// Readies GPU `to`'s grant service for `vm` coming from GPU `from`: the
/// target's fair queue takes the vGPU in as far ahead of its virtual time
/// as it was on the source (it neither gains nor loses share by moving).
/// Some(()) where the scheduler runs (its workers then each need a
/// connection to the target's service), None where it does not.
fn prepare_target(
    plane: &ControlPlane,
    cfg: &Config,
    vm: &str,
    from: u32,
    to: u32,
) -> Result<Option<()>, String> {
    if !cfg.daemon.scheduler {
        return Ok(None);
    }
    let id = plane.vgpu_id(vm);
    let vmc = cfg.vm(vm).ok_or_else(|| format!("no vm named {vm:?}"))?;
    let src = plane.service(from).map_err(|e| e.to_string())?;
    let dst = plane
        .service(to)
        .map_err(|e| e.to_string())?
        .ok_or("no grant service on the target GPU")?;
    let lag = src.and_then(|s| s.lag(id)).unwrap_or(0);
    dst.set_share(id, &vmc.tenant, vmc.weight, cfg.tenant_weight(&vmc.tenant))
        .map_err(|e| e.to_string())?;
    dst.expect(id, lag).map_err(|e| e.to_string())?;
    Ok(Some(()))
}
