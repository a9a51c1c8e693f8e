//! Fixtures for the end-to-end tests: a sim worker on a thread of the test
//! process, serving a real ivshmem-server socket that guests attach to.

pub mod faults;
pub mod hostile;
pub mod ipc;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use guest::Gpu;
use transport::{LayoutParams, SpinPolicy};
use worker::executor::sim::{SimExecutor, SimParams};
use worker::serve::{spawn, Running, Stats, WorkerConfig};

/// Holds the tests of one test binary that must not run beside each other
/// (a daemon or a VM each, timings on a machine of two CPUs) to one at a
/// time, until the guard drops. A test that panicked holding it does not
/// stop the others.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `text` to the file at `rel` under `root`, making its folders
/// (a fixture's files, for the lints' tests).
pub fn write_under(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().expect("a file under root")).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

/// Builds a workspace package (debug) and returns the folder its outputs
/// land in (`$CARGO_TARGET_DIR/debug` or `target/debug`).
pub fn cargo_build(package: &str) -> PathBuf {
    let root = workspace();
    let st = std::process::Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", package])
        .current_dir(&root)
        .status()
        .expect("cargo build");
    assert!(st.success(), "building {package} failed");
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or(root.join("target"))
        .join("debug")
}

/// Builds the stand-in and gives a directory holding it as libcuda.so.1.
pub fn standin(dir: &Path) -> PathBuf {
    let so = cargo_build("libcuda").join("libcuda.so");
    assert!(so.exists(), "{} missing", so.display());
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        let _ = std::fs::remove_file(lib.join(name));
        std::fs::copy(&so, lib.join(name)).unwrap();
    }
    lib
}

/// Builds the NVML stand-in and puts it as libnvidia-ml.so.1 beside the
/// CUDA one in `lib` (a directory from [`standin`]).
pub fn nvml_standin(lib: &Path) {
    let so = cargo_build("libnvml").join("libnvidia_ml.so");
    assert!(so.exists(), "{} missing", so.display());
    for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
        let _ = std::fs::remove_file(lib.join(name));
        std::fs::copy(&so, lib.join(name)).unwrap();
    }
}

/// Builds `tests/c/NAME.c` with the system C compiler against the stand-in
/// in `lib` (the driver's ABI only: no CUDA toolkit), with `extra`
/// arguments before the libraries, into `dir/NAME`.
pub fn build_c_standin(name: &str, dir: &Path, lib: &Path, extra: &[&str]) -> PathBuf {
    let exe = dir.join(name);
    let out = std::process::Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&exe)
        .arg(workspace().join(format!("tests/c/{name}.c")))
        .args(extra)
        .arg(format!("-L{}", lib.display()))
        .args(["-lcuda", "-lm"])
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs the program `exe` with `args`, its libraries looked up in
/// `library_path` first (the stand-in's folder), on the vGPU at `socket`,
/// with `env` set too; its standard output (the test fails, showing both
/// outputs, if it did not exit 0).
pub fn run_program<S: AsRef<std::ffi::OsStr>>(
    exe: &Path,
    args: &[S],
    library_path: &str,
    socket: &Path,
    env: &[(&str, &str)],
) -> String {
    let out = std::process::Command::new(exe)
        .args(args)
        .env("LD_LIBRARY_PATH", library_path)
        .env("FAIRVGPU_SOCKET", socket)
        .envs(env.iter().copied())
        .output()
        .expect("program runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed\nstdout:\n{stdout}\nstderr:\n{stderr}",
        exe.display()
    );
    // A panic in the stand-in is a defect even where the program goes on.
    assert!(
        !stderr.contains("panicked"),
        "{} panicked\nstderr:\n{stderr}",
        exe.display()
    );
    stdout
}

/// Spin budgets small enough that several tests share two cores.
pub const TEST_SPIN: SpinPolicy = SpinPolicy {
    spins: 2_000,
    max_block_us: 2_000,
};

/// The tests' worker: four channels, a 32 MiB pinned pool, spin budgets
/// for two cores, no scheduler, no contexts made ahead.
pub fn worker_config(name: &str, socket: PathBuf, mem_limit: u64) -> WorkerConfig {
    let layout = LayoutParams {
        channels: 4,
        ring_entries: 64,
        arena_size: 1 << 20,
        vectors: 4,
        pinned_size: 32 << 20,
        partitions: 1,
    };
    WorkerConfig {
        spin: TEST_SPIN,
        ..WorkerConfig::new(name, socket, layout, mem_limit)
    }
}

/// A running sim worker and the socket guests attach to.
#[derive(Debug)]
pub struct Host {
    /// The socket.
    pub socket: PathBuf,
    dir: PathBuf,
    running: Option<Running>,
}

impl Host {
    /// Starts a worker with `mem_limit` bytes of device memory.
    pub fn start(name: &str, mem_limit: u64) -> Host {
        let dir = scratch::dir(&format!("fvg-e2e-{name}"));
        let cfg = worker_config(name, dir.join("vgpu.sock"), mem_limit);
        let exec = SimExecutor::new(SimParams {
            copy_gbps: 100.0,
            ..SimParams::default()
        });
        let running = spawn(&cfg, Box::new(exec)).expect("worker starts");
        Host {
            socket: cfg.socket,
            dir,
            running: Some(running),
        }
    }

    /// A guest attached natively.
    pub fn guest(&self) -> Gpu {
        Gpu::connect_with(&self.socket, TEST_SPIN).expect("guest attaches")
    }

    /// The worker's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.running.as_ref().expect("running").stats.clone()
    }

    /// Waits until `f(stats)` holds, or panics after `timeout`.
    pub fn wait_until(&self, what: &str, timeout: Duration, f: impl Fn(&Stats) -> bool) {
        let stats = self.stats();
        let start = Instant::now();
        while !f(&stats) {
            assert!(
                start.elapsed() < timeout,
                "timed out waiting for {what}; mem_used={} reclaimed={}",
                stats.mem_used.load(Ordering::Relaxed),
                stats.reclaimed.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until a program that ended has nothing left on the vGPU: the
    /// host agrees that it freed everything.
    pub fn wait_program_freed(&self) {
        self.wait_until(
            "the program's memory to be freed",
            Duration::from_secs(10),
            |s| s.mem_used.load(Ordering::Relaxed) == 0,
        );
    }
}

/// Asserts that a program's output has every one of `lines`.
pub fn assert_lines(stdout: &str, lines: &[&str]) {
    for line in lines {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes as f32 values.
pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The shipped kernels.
pub const PTX: &str = worker::KERNELS_PTX;

/// A guest thread on `socket` that loops `per_sync` launches of a `spin_ns`
/// kernel of `ns` nanoseconds and a synchronize until `stop` is set,
/// counting its rounds in `rounds`; it panics (failing the test on join) at
/// any error.
///
/// A test that checks shares against weights should launch several kernels
/// per synchronize: between a reply and its next call the guest holds no
/// work, and on a loaded 2-core machine that gap can outlast the kernel
/// before it, so a guest entitled to half the GPU that synchronizes after
/// every kernel gets less than half for want of CPU, not of GPU.
pub fn spin_guest(
    socket: PathBuf,
    ns: u64,
    per_sync: u32,
    stop: Arc<std::sync::atomic::AtomicBool>,
    rounds: Arc<std::sync::atomic::AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut gpu = Gpu::connect_with(&socket, TEST_SPIN).expect("guest attaches");
        let m = gpu
            .module_load(protocol::ImageKind::Ptx, PTX.as_bytes())
            .unwrap();
        let f = gpu.get_function(m, "spin_ns").unwrap();
        let one = protocol::Dim3 { x: 1, y: 1, z: 1 };
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..per_sync {
                gpu.launch(&f, one, one, 0, 0, &[&ns.to_le_bytes()])
                    .unwrap();
            }
            gpu.synchronize().unwrap();
            rounds.fetch_add(1, Ordering::Relaxed);
        }
    })
}

/// The headless browser the dashboard tests use, if the machine has one.
pub fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|c| {
            let ok = std::process::Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
            ok.then(|| PathBuf::from(c))
        })
}

/// Loads the dashboard in headless Chromium and returns its DOM after the
/// page's script ran for a few (virtual) seconds.
pub fn dashboard_dom(browser: &Path, url: &str, screenshot: Option<&Path>) -> String {
    let mut cmd = std::process::Command::new(browser);
    cmd.args([
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--window-size=1200,1000",
        "--virtual-time-budget=6000",
    ]);
    match screenshot {
        Some(p) => cmd.arg(format!("--screenshot={}", p.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = cmd
        .arg(url)
        .env("HOME", scratch::child_tmpdir())
        .env("TMPDIR", scratch::child_tmpdir())
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The thread id of this process's thread named `name` (its `comm`), if
/// there is one: its files are under `/proc/<tid>` (a worker's serving
/// thread, for instance, named `worker-<vm>`).
pub fn own_thread(name: &str) -> Option<String> {
    std::fs::read_dir("/proc/self/task").ok()?.find_map(|t| {
        let t = t.ok()?;
        let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
        (comm.trim_end() == name).then(|| t.file_name().into_string().ok())?
    })
}

/// `n` sim workers (VMs `vm0`, `vm1`, ...) sharing one simulated GPU under
/// the grant service listening on `grant`, each of weight 1, idling as
/// `spin` says; their handles, and the sockets their guests attach to
/// (in `dir`). Each reads its VM's vCPU threads from [`vcpus_file`]
/// (absent: none), where a test may write a guest thread's id.
pub fn granted_sim_workers(
    dir: &Path,
    grant: &Path,
    n: u32,
    spin: SpinPolicy,
) -> (Vec<Running>, Vec<PathBuf>) {
    granted_sim_workers_on(dir, grant, n, spin, None)
}

/// [`granted_sim_workers`] with each worker's serving thread pinned to
/// `cpu`, if given.
pub fn granted_sim_workers_on(
    dir: &Path,
    grant: &Path,
    n: u32,
    spin: SpinPolicy,
    cpu: Option<usize>,
) -> (Vec<Running>, Vec<PathBuf>) {
    let dev = SimExecutor::new(SimParams::default());
    let layout = bench::fairness::GUEST_LAYOUT;
    (0..n)
        .map(|g| {
            let socket = dir.join(format!("vm{g}.sock"));
            let wc = WorkerConfig {
                spin,
                cpu,
                grant: Some((grant.to_owned(), g, 1.0)),
                vcpus_file: Some(vcpus_file(dir, g as usize)),
                ..WorkerConfig::new(&format!("vm{g}"), socket.clone(), layout, 1 << 30)
            };
            (spawn(&wc, Box::new(dev.clone())).unwrap(), socket)
        })
        .unzip()
}

/// A guest on `socket` that wants the GPU all along: a small memset and a
/// synchronize, again and again until `stop`; how many it completed.
pub fn memset_loop(socket: &Path, stop: &std::sync::atomic::AtomicBool) -> u64 {
    let mut gpu = Gpu::connect(socket).unwrap();
    let p = gpu.mem_alloc(1 << 20).unwrap();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        gpu.memset_async(p, 3, 1, 4096, 0).unwrap();
        gpu.synchronize().unwrap();
        n += 1;
    }
    n
}

/// VM `vm<g>`'s vCPU file in `dir`, as [`granted_sim_workers`] gives it to
/// its worker (written with `wire::vcpus::write_vcpus`).
pub use bench::fairness::vcpus_file;

/// Where a test's threads run (see [`late_waits_beside_a_busy_thread`]).
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    /// The worker's CPU.
    pub worker: usize,
    /// The guest's CPU; its thread is the VM's one vCPU.
    pub guest: usize,
    /// The CPU a busy thread spins on.
    pub busy: usize,
}

/// One sim worker with its VM's vCPU file, under a grant service with
/// slices of `slice_ns`, its guest running [`memset_loop`] for `run` and
/// a busy thread beside them, as `at` places them: how many rounds the
/// guest completed, and the worker's hand-off figures (its waits for the
/// late guest among them).
pub fn late_waits_beside_a_busy_thread(
    name: &str,
    slice_ns: u64,
    spin: SpinPolicy,
    at: Placement,
    run: Duration,
) -> (u64, worker::serve::HandoffFigures) {
    use daemon::hostcpu::cpus;
    use std::sync::atomic::AtomicBool;
    let dir = scratch::dir(name);
    // The threads started here that `at` does not place (the grant
    // service's, the worker's socket threads) inherit this thread's CPUs:
    // the worker's, so that the guest's CPU holds only what `at` puts there.
    let own = cpus::current();
    cpus::pin_current_thread(&[at.worker]).unwrap();
    let svc = daemon::grant::GrantService::start(&dir.join("grant.sock"), slice_ns).unwrap();
    let (workers, sockets) = granted_sim_workers_on(&dir, svc.path(), 1, spin, Some(at.worker));
    cpus::pin_current_thread(&own).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            cpus::pin_current_thread(&[at.busy]).unwrap();
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let guest = {
        let (socket, stop, vcpus) = (sockets[0].clone(), stop.clone(), vcpus_file(&dir, 0));
        std::thread::spawn(move || {
            cpus::pin_current_thread(&[at.guest]).unwrap();
            let tid = u32::try_from(nix::unistd::gettid().as_raw()).unwrap();
            wire::vcpus::write_vcpus(&vcpus, &[tid]).unwrap();
            memset_loop(&socket, &stop)
        })
    };
    std::thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    let rounds = guest.join().unwrap();
    busy.join().unwrap();
    let stats = workers[0].stats.clone();
    for w in workers {
        w.shutdown().unwrap();
    }
    (rounds, stats.handoff.figures())
}

/// Waits up to 10 s for the daemon to have `n` worker processes; `what`
/// says what they should be.
pub fn wait_for_workers(d: &bench::fixture::DaemonProc, n: usize, what: &str) {
    let t = std::time::Instant::now();
    while worker_processes(d) != n {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{what}: {} worker processes, not {n}",
            worker_processes(d)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The daemon's worker processes (spares, bound or not, and workers
/// started for a slot).
pub fn worker_processes(d: &bench::fixture::DaemonProc) -> usize {
    worker_pids(d).len()
}

/// The pids of the daemon's live worker processes (zombies not counted).
pub fn worker_pids(d: &bench::fixture::DaemonProc) -> Vec<i32> {
    bench::procfs::live_children(d.pid())
        .into_iter()
        .filter(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            cmd.split(|&b| b == 0).any(|a| a == b"worker")
        })
        .filter_map(|p| i32::try_from(p).ok())
        .collect()
}
