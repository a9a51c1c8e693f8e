//! Parsing and validating `host.toml`: what serde cannot check, each
//! error naming the key and, where the key is in the text, its line.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use transport::Layout;

use super::{Config, ExecutorKind};
use crate::Error;

/// Why host.toml cannot be used. The complaint itself (`what`) stays text:
/// it names the key and what it may be, for the operator.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// There is no such file.
    #[error(
        "config: {}: no such file; pass --config with the path of host.toml \
         (docs/host.example.toml is one)",
        path.display()
    )]
    NotFound {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be read.
    #[error("config: {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The text is not TOML, or not a config (an unknown key, a value of
    /// the wrong type); `what` is the parser's complaint with its line and
    /// column.
    #[error("config: {}{what}", in_file(file.as_deref()))]
    Syntax {
        /// The file, when one was read.
        file: Option<PathBuf>,
        /// The complaint.
        what: String,
    },
    /// A value the config may not have (a check serde cannot make).
    #[error("config: {}{}{what}", in_file(file.as_deref()), at_line(*line))]
    Invalid {
        /// The file, when one was read.
        file: Option<PathBuf>,
        /// The line of the key, when it is in the text.
        line: Option<usize>,
        /// The complaint, naming the key.
        what: String,
    },
}

impl ConfigError {
    /// The same error, said of the file `path`.
    fn in_file(self, path: &Path) -> ConfigError {
        match self {
            ConfigError::Syntax { what, .. } => ConfigError::Syntax {
                file: Some(path.to_owned()),
                what,
            },
            ConfigError::Invalid { line, what, .. } => ConfigError::Invalid {
                file: Some(path.to_owned()),
                line,
                what,
            },
            e @ (ConfigError::NotFound { .. } | ConfigError::Read { .. }) => e,
        }
    }
}

fn in_file(file: Option<&Path>) -> String {
    file.map(|f| format!("{}: ", f.display()))
        .unwrap_or_default()
}

fn at_line(line: Option<usize>) -> String {
    line.map(|n| format!("line {n}: ")).unwrap_or_default()
}

/// The longest time slice a config may set, µs (one second).
const MAX_SLICE_US: u64 = 1_000_000;

/// Whether a time slice (µs) is one a config may set.
fn slice_ok(us: u64) -> bool {
    (1..=MAX_SLICE_US).contains(&us)
}

/// A problem `m`, found at `at`.
fn bad(m: String, at: Loc) -> Result<(), (String, Loc)> {
    Err((m, at))
}

/// Where a problem found after parsing is, for the error message.
#[derive(Debug, Clone, Copy)]
enum Loc {
    /// A `[table]`, and a key in it.
    Table(&'static str, Option<&'static str>),
    /// A key of the i-th `[[vm]]`.
    Vm(usize, &'static str),
    /// A key of the i-th `[[tenant]]`.
    Tenant(usize, &'static str),
    /// A key of the i-th `[[gpu]]`.
    Gpu(usize, &'static str),
}

impl Loc {
    /// The 1-based line of the key (else of its table) in `text`, for
    /// files written the usual way (one key per line, tables by header).
    fn line_in(self, text: &str) -> Option<usize> {
        let (header, nth, key) = match self {
            Loc::Table(t, k) => (format!("[{t}]"), 0, k),
            Loc::Vm(i, k) => ("[[vm]]".to_owned(), i, Some(k)),
            Loc::Tenant(i, k) => ("[[tenant]]".to_owned(), i, Some(k)),
            Loc::Gpu(i, k) => ("[[gpu]]".to_owned(), i, Some(k)),
        };
        let lines: Vec<&str> = text.lines().collect();
        let start = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trim() == header)
            .nth(nth)?
            .0;
        let end = lines[start + 1..]
            .iter()
            .position(|l| l.trim_start().starts_with('['))
            .map_or(lines.len(), |p| start + 1 + p);
        let found = key.and_then(|k| {
            (start + 1..end).find(|&n| {
                lines[n]
                    .trim_start()
                    .strip_prefix(k)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            })
        });
        Some(found.unwrap_or(start) + 1)
    }
}

impl Config {
    /// Parses and validates TOML text. Errors name the key and, where the
    /// key is in the text, its line.
    pub fn parse(text: &str) -> Result<Config, Error> {
        if let Some((what, at)) = removed_key(text) {
            return Err(ConfigError::Invalid {
                file: None,
                line: at.line_in(text),
                what,
            }
            .into());
        }
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            file: None,
            what: toml_error(text, &e),
        })?;
        cfg.check().map_err(|(what, at)| ConfigError::Invalid {
            file: None,
            line: at.line_in(text),
            what,
        })?;
        Ok(cfg)
    }

    /// Reads, parses and validates a file.
    pub fn load(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => ConfigError::NotFound {
                path: path.to_owned(),
            },
            _ => ConfigError::Read {
                path: path.to_owned(),
                source,
            },
        })?;
        Self::parse(&text).map_err(|e| match e {
            Error::Config(c) => c.in_file(path).into(),
            e => e,
        })
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), Error> {
        Ok(self.check().map_err(|(what, _)| ConfigError::Invalid {
            file: None,
            line: None,
            what,
        })?)
    }

    /// [`Config::validate`], also saying where in the file the problem is.
    fn check(&self) -> Result<(), (String, Loc)> {
        self.check_daemon()?;
        self.check_gpus()?;
        self.check_api()?;
        self.check_placement()?;
        self.check_tenants()?;
        self.check_vms()
    }

    /// `[layout]`, `[sim]` and `[daemon]`.
    fn check_daemon(&self) -> Result<(), (String, Loc)> {
        Layout::new(self.layout)
            .map_err(|e| (format!("[layout]: {e}"), Loc::Table("layout", None)))?;
        if let Some(g) = self
            .sim
            .no_compression_gpu
            .filter(|&g| g >= self.sim.gpus.max(1))
        {
            return bad(
                format!(
                    "[sim] no_compression_gpu {g} does not exist ([sim] gpus = {})",
                    self.sim.gpus
                ),
                Loc::Table("sim", Some("no_compression_gpu")),
            );
        }
        for (key, us) in [
            ("slice_us", self.daemon.slice_us),
            ("preemptive_slice_us", self.daemon.preemptive_slice_us),
        ] {
            if !slice_ok(us) {
                return bad(
                    format!("[daemon] {key} must be 1..={MAX_SLICE_US}, not {us}"),
                    Loc::Table("daemon", Some(key)),
                );
            }
        }
        if !(-20..=0).contains(&self.daemon.priority) {
            return bad(
                format!(
                    "[daemon] priority must be a nice value -20..=0 (0: off), not {}",
                    self.daemon.priority
                ),
                Loc::Table("daemon", Some("priority")),
            );
        }
        if self.daemon.realtime && !(self.daemon.vcpu_lift && self.daemon.priority != 0) {
            return bad(
                "[daemon] realtime = true needs the vCPU lift (vcpu_lift = true and a priority below 0): it lifts the threads that one chooses"
                    .to_owned(),
                Loc::Table("daemon", Some("realtime")),
            );
        }
        if let Some(list) = &self.daemon.cpus {
            if let Err(e) = crate::hostcpu::cpus::parse(list) {
                return bad(
                    format!("[daemon] cpus = {list:?}: {e} (a list like \"0-1\" or \"0,2,4-5\")"),
                    Loc::Table("daemon", Some("cpus")),
                );
            }
        }
        if !(1..=86_400).contains(&self.daemon.ahead_keep_s) {
            return bad(
                format!(
                    "[daemon] ahead_keep_s must be 1..=86400 seconds, not {}",
                    self.daemon.ahead_keep_s
                ),
                Loc::Table("daemon", Some("ahead_keep_s")),
            );
        }
        if self.daemon.cgroup_cpu_weight > 10_000 {
            return bad(
                format!(
                    "[daemon] cgroup_cpu_weight must be 1..=10000 (0: off), not {}",
                    self.daemon.cgroup_cpu_weight
                ),
                Loc::Table("daemon", Some("cgroup_cpu_weight")),
            );
        }
        Ok(())
    }

    /// Each `[[gpu]]`.
    fn check_gpus(&self) -> Result<(), (String, Loc)> {
        for (i, g) in self.gpus.iter().enumerate() {
            if let Some(us) = g.slice_us.filter(|&us| !slice_ok(us)) {
                return bad(
                    format!("[[gpu]] slice_us must be 1..={MAX_SLICE_US}, not {us}"),
                    Loc::Gpu(i, "slice_us"),
                );
            }
            if !(1..=32).contains(&g.mps_processes) {
                return bad(
                    format!(
                        "[[gpu]] mps_processes must be 1..=32, not {}",
                        g.mps_processes
                    ),
                    Loc::Gpu(i, "mps_processes"),
                );
            }
            if self.gpus[..i].iter().any(|o| o.index == g.index) {
                return bad(
                    format!("[[gpu]] index {} appears twice", g.index),
                    Loc::Gpu(i, "index"),
                );
            }
        }
        Ok(())
    }

    /// `[api]`.
    fn check_api(&self) -> Result<(), (String, Loc)> {
        if let Some(addr) = &self.api.tcp {
            if addr.parse::<std::net::SocketAddr>().is_err() {
                return bad(
                    format!("[api] tcp: {addr:?} is not an address like 127.0.0.1:9400"),
                    Loc::Table("api", Some("tcp")),
                );
            }
            if self.api.token_file.is_none() {
                return bad(
                    "[api] tcp needs token_file: the TCP API is never open without a token".into(),
                    Loc::Table("api", Some("tcp")),
                );
            }
        }
        if let Some(addr) = &self.daemon.handover_listen {
            if addr.parse::<std::net::SocketAddr>().is_err() {
                return bad(
                    format!(
                        "[daemon] handover_listen: {addr:?} is not an address like 10.0.0.2:7400"
                    ),
                    Loc::Table("daemon", Some("handover_listen")),
                );
            }
            if self.daemon.checkpoint_key_file.is_none() {
                return bad(
                    "[daemon] handover_listen needs checkpoint_key_file: vGPUs are never taken from a peer without the key".into(),
                    Loc::Table("daemon", Some("handover_listen")),
                );
            }
        }
        Ok(())
    }

    /// `[placement]`.
    fn check_placement(&self) -> Result<(), (String, Loc)> {
        let pl = self.placement;
        let sane = pl.under > 0.0
            && pl.under <= pl.over
            && pl.over.is_finite()
            && pl.watermark > 0.0
            && pl.watermark <= 1.0
            && pl.interval_ms >= 100
            && pl.cooldown_s >= 0.0
            && pl.cooldown_s.is_finite();
        if !sane {
            return bad(
                "[placement]: need 0 < under <= over, 0 < watermark <= 1, interval_ms >= 100, cooldown_s >= 0".into(),
                Loc::Table("placement", None),
            );
        }
        Ok(())
    }

    /// Each `[[tenant]]`.
    fn check_tenants(&self) -> Result<(), (String, Loc)> {
        let mut tenants = HashSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if t.name.is_empty() || !tenants.insert(&t.name) {
                return bad(
                    format!("tenant {:?} is empty or given twice", t.name),
                    Loc::Tenant(i, "name"),
                );
            }
            if !(t.weight.is_finite() && t.weight > 0.0) {
                return bad(
                    format!(
                        "tenant {:?}: weight must be a positive number, not {}",
                        t.name, t.weight
                    ),
                    Loc::Tenant(i, "weight"),
                );
            }
        }
        Ok(())
    }

    /// Each `[[vm]]`.
    fn check_vms(&self) -> Result<(), (String, Loc)> {
        let mut names = HashSet::new();
        for (i, vm) in self.vms.iter().enumerate() {
            if let Err(e) = Layout::new(self.layout_for(vm)) {
                return bad(format!("[[vm]] {}: {e}", vm.name), Loc::Vm(i, "pinned_mib"));
            }
            if vm.name.is_empty()
                || !vm
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return bad(
                    format!("vm name {:?}: use letters, digits, '-' and '_'", vm.name),
                    Loc::Vm(i, "name"),
                );
            }
            if !names.insert(&vm.name) {
                return bad(
                    format!("vm name {:?} is used twice", vm.name),
                    Loc::Vm(i, "name"),
                );
            }
            if !(vm.weight.is_finite() && vm.weight > 0.0) {
                return bad(
                    format!(
                        "vm {:?}: weight must be a positive number, not {}",
                        vm.name, vm.weight
                    ),
                    Loc::Vm(i, "weight"),
                );
            }
            if !(1..=transport::layout::MAX_PARTITIONS).contains(&vm.slots()) {
                return bad(
                    format!(
                        "vm {:?}: process_slots must be 1..={}, not {} (it is how many of the VM's processes run at once, each with its own worker)",
                        vm.name,
                        transport::layout::MAX_PARTITIONS,
                        vm.slots()
                    ),
                    Loc::Vm(i, "process_slots"),
                );
            }
            if vm.memory_limit_mib == 0 {
                return bad(
                    format!("vm {:?}: memory_limit_mib must be positive", vm.name),
                    Loc::Vm(i, "memory_limit_mib"),
                );
            }
            let gpu = vm.gpu.unwrap_or(0);
            if self.daemon.executor == ExecutorKind::Sim && gpu >= self.sim.gpus.max(1) {
                return bad(
                    format!(
                        "vm {:?}: gpu {gpu} does not exist ([sim] gpus = {})",
                        vm.name, self.sim.gpus
                    ),
                    Loc::Vm(i, "gpu"),
                );
            }
            if self.daemon.executor == ExecutorKind::Sim
                && vm.memory_limit_mib << 20 > self.sim.memory
            {
                return bad(
                    format!(
                        "vm {:?}: memory_limit_mib {} exceeds the GPU's {} MiB",
                        vm.name,
                        vm.memory_limit_mib,
                        self.sim.memory >> 20
                    ),
                    Loc::Vm(i, "memory_limit_mib"),
                );
            }
        }
        Ok(())
    }
}

/// A TOML error on one line: where, and what (the toml crate's own text
/// draws the line with a caret over several).
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    match e.span().and_then(|r| text.get(..r.start)) {
        Some(before) => {
            let line = before.matches('\n').count() + 1;
            let column = before.chars().rev().take_while(|&c| c != '\n').count() + 1;
            let shown = text.lines().nth(line - 1).unwrap_or("").trim();
            format!("line {line}, column {column} (`{shown}`): {what}")
        }
        _ => what,
    }
}

/// A key a release before this one took and this one refuses, with why
/// and where (so that an old file is never read as something else).
fn removed_key(text: &str) -> Option<(String, Loc)> {
    let table: toml::Table = toml::from_str(text).ok()?;
    let standby_gone = "every guest process has a worker of its own, and each GPU keeps a warm spare worker that the next process after a fault is bound to";
    if table
        .get("daemon")
        .and_then(|d| d.get("fault_standby"))
        .is_some()
    {
        return Some((
            format!("[daemon] fault_standby is no longer a setting: {standby_gone}; remove it"),
            Loc::Table("daemon", Some("fault_standby")),
        ));
    }
    let vms = table.get("vm").and_then(toml::Value::as_array)?;
    let i = vms.iter().position(|v| v.get("standby").is_some())?;
    Some((
        format!("[[vm]] standby is no longer a setting: {standby_gone}; remove it"),
        Loc::Vm(i, "standby"),
    ))
}
