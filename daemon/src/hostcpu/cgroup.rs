//! Workers in a cgroup v2 child of the daemon's own cgroup, with a higher
//! `cpu.weight` (`[daemon] cgroup_cpu_weight`).
//!
//! cgroup v2 lets a cgroup hand the cpu controller to its children only
//! while it holds no process itself, so the daemon first moves itself into
//! a leaf `fairvgpu-daemon` and enables `+cpu` in its cgroup's
//! `cgroup.subtree_control`; the workers then go into `fairvgpu-workers`,
//! whose `cpu.weight` is set. That works where the daemon has a cgroup of
//! its own that it may write (a systemd unit with `Delegate=yes`); where it
//! shares its cgroup with other processes, where the cpu controller is not
//! given to it (a hybrid v1/v2 host, no delegation) or where the files are
//! not writable, nothing is changed and the reason is reported.
//!
//! What it buys: within the daemon's subtree the workers win the CPU
//! against the daemon's other threads. Against other VMs, what counts is
//! the weight of the daemon's cgroup beside theirs, which its parent sets
//! (systemd's `CPUWeight=` on the unit): see docs/operator-guide.md.

use std::path::{Path, PathBuf};

/// The leaf the daemon moves into.
pub const DAEMON_LEAF: &str = "fairvgpu-daemon";
/// The workers' cgroup.
pub const WORKERS: &str = "fairvgpu-workers";

/// The workers' cgroup, once made.
#[derive(Debug, Clone)]
pub struct WorkerCgroup {
    dir: PathBuf,
}

impl WorkerCgroup {
    /// Where it is.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes it, if no process is left in it (at the daemon's end).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }

    /// Moves process `pid` (a worker just started) into it.
    pub fn add(&self, pid: u32) -> Result<(), String> {
        write(&self.dir.join("cgroup.procs"), &pid.to_string())
    }
}

/// The cgroup v2 mount point in `/proc/self/mounts`' text.
pub fn mount_point(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 3 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
    })
}

/// This process's cgroup v2 path in `/proc/self/cgroup`'s text (`0::/x`).
pub fn own_path(proc_cgroup: &str) -> Option<String> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
}

/// Sets up the workers' cgroup for this process, from the kernel's view
/// of its mounts and cgroup.
pub fn setup(weight: u64) -> Result<WorkerCgroup, String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mount = mount_point(&mounts).ok_or("no cgroup v2 hierarchy is mounted")?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| own_path(&t))
        .ok_or("this process is in no cgroup v2 cgroup")?;
    setup_at(&mount, &own, std::process::id(), weight)
}

/// [`setup`] for process `pid` in cgroup `own` under `mount`.
pub fn setup_at(mount: &Path, own: &str, pid: u32, weight: u64) -> Result<WorkerCgroup, String> {
    if own.trim_matches('/').is_empty() {
        // Every process no one placed is there: not the daemon's to split.
        return Err(
            "the daemon runs in the root cgroup: give it a cgroup of its own (systemd: Delegate=yes)"
                .into(),
        );
    }
    let dir = mount.join(own.trim_start_matches('/'));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let has_cpu = |text: &str| text.split_whitespace().any(|c| c == "cpu");
    if !has_cpu(&read("cgroup.controllers")) {
        return Err(format!(
            "the cpu controller is not available in the daemon's cgroup {own} (a hybrid cgroup v1/v2 host, or not delegated)"
        ));
    }
    if !has_cpu(&read("cgroup.subtree_control")) {
        let others = read("cgroup.procs")
            .split_whitespace()
            .any(|p| p != pid.to_string());
        if others {
            return Err(format!(
                "the daemon's cgroup {own} holds other processes: run the daemon in a cgroup of its own (systemd: Delegate=yes)"
            ));
        }
        let leaf = dir.join(DAEMON_LEAF);
        mkdir(&leaf)?;
        write(&leaf.join("cgroup.procs"), &pid.to_string())?;
        if let Err(e) = write(&dir.join("cgroup.subtree_control"), "+cpu") {
            // Back where it was, the leaf left empty.
            let _ = write(&dir.join("cgroup.procs"), &pid.to_string());
            let _ = std::fs::remove_dir(&leaf);
            return Err(e);
        }
    }
    let workers = dir.join(WORKERS);
    mkdir(&workers)?;
    write(&workers.join("cpu.weight"), &weight.to_string())?;
    Ok(WorkerCgroup { dir: workers })
}

fn mkdir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("making {}: {e}", dir.display())),
    }
}

fn write(file: &Path, text: &str) -> Result<(), String> {
    std::fs::write(file, text).map_err(|e| format!("writing {text:?} to {}: {e}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory laid out as a cgroup v2 mount with the daemon's cgroup
    /// `/svc` (regular files stand in for the kernel's).
    fn fake(controllers: &str, subtree: &str, procs: &str) -> (PathBuf, PathBuf) {
        let root = scratch::dir(&format!("fvg-cg-{}", rand_suffix()));
        let svc = root.join("svc");
        std::fs::create_dir_all(&svc).unwrap();
        std::fs::write(svc.join("cgroup.controllers"), controllers).unwrap();
        std::fs::write(svc.join("cgroup.subtree_control"), subtree).unwrap();
        std::fs::write(svc.join("cgroup.procs"), procs).unwrap();
        (root, svc)
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    #[test]
    fn mounts_and_own_cgroup_are_read_from_procs_text() {
        let mounts = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        assert_eq!(
            mount_point(mounts),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(mount_point("proc /proc proc rw 0 0\n"), None);
        assert_eq!(
            own_path("4:memory:/x\n0::/system.slice/fairvgpu.service\n").as_deref(),
            Some("/system.slice/fairvgpu.service")
        );
        assert_eq!(own_path("1:cpu:/\n"), None);
    }

    #[test]
    fn a_cgroup_of_its_own_gets_a_daemon_leaf_and_weighted_workers() {
        let (root, svc) = fake("cpuset cpu io memory pids", "", "77\n");
        let w = setup_at(&root, "/svc", 77, 1000).unwrap();
        assert_eq!(w.dir(), svc.join(WORKERS));
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(svc.join(DAEMON_LEAF).join("cgroup.procs")), "77");
        assert_eq!(read(svc.join("cgroup.subtree_control")), "+cpu");
        assert_eq!(read(svc.join(WORKERS).join("cpu.weight")), "1000");
        w.add(4242).unwrap();
        assert_eq!(read(svc.join(WORKERS).join("cgroup.procs")), "4242");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn what_stops_it_is_reported_and_nothing_is_moved() {
        let (root, svc) = fake("memory pids", "", "77\n");
        let e = setup_at(&root, "/svc", 77, 1000).unwrap_err();
        assert!(e.contains("cpu controller is not available"), "{e}");
        let e = setup_at(&root, "/", 77, 1000).unwrap_err();
        assert!(e.contains("root cgroup"), "{e}");
        let (root2, svc2) = fake("cpu memory", "", "77\n78\n");
        let e = setup_at(&root2, "/svc", 77, 1000).unwrap_err();
        assert!(e.contains("holds other processes"), "{e}");
        for s in [&svc, &svc2] {
            assert!(!s.join(DAEMON_LEAF).exists());
            assert!(!s.join(WORKERS).exists());
        }
        // cpu already delegated to the children (the daemon in a leaf of
        // its own already): only the workers' cgroup is made.
        let (root3, svc3) = fake("cpu", "cpu memory", "");
        setup_at(&root3, "/svc", 77, 500).unwrap();
        assert!(!svc3.join(DAEMON_LEAF).exists());
        assert_eq!(
            std::fs::read_to_string(svc3.join(WORKERS).join("cpu.weight")).unwrap(),
            "500"
        );
        for r in [root, root2, root3] {
            let _ = std::fs::remove_dir_all(r);
        }
    }
}
