//! The demo's tenants: one process per vGPU running an unmodified CUDA
//! driver-API program (`cli/src/demo/tenant.c`), built with the
//! system's C compiler against the stand-in `libcuda.so.1` and loaded
//! through it, attached to its VM's socket (`FAIRVGPU_SOCKET`), as a program
//! in that VM would be.
//!
//! The stand-in comes from the demo's own build: in a cargo target folder
//! (the binary run from a clone) cargo builds `libcuda` beside the
//! running binary, with the profile the binary was built with; elsewhere (an
//! installed binary) it is looked for beside the binary and in `../lib`.

use std::io::BufRead as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

/// The tenant program's source.
const TENANT_C: &str = include_str!("tenant.c");

/// The stand-in's build, named as the user would type it.
fn build_hint(release: bool) -> String {
    format!(
        "cargo build{} -p libcuda",
        if release { " --release" } else { "" }
    )
}

/// The stand-in `libcuda.so` for the running binary: built by cargo where
/// the binary lies in a cargo target folder of this clone, else found
/// beside it. Its path.
fn standin() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding the running binary")?;
    let bin_dir = exe.parent().context("the running binary's folder")?;
    let release = bin_dir.file_name().is_some_and(|n| n == "release");
    let target = bin_dir.parent();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent();
    // A cargo profile folder (`target/release`) keeps its fingerprints.
    let in_target = bin_dir.join(".fingerprint").is_dir();
    if let (true, Some(target), Some(ws)) = (in_target, target, workspace) {
        if ws.join("libcuda/Cargo.toml").is_file() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            println!(
                "building the stand-in libcuda.so.1 the tenants load: {}",
                build_hint(release)
            );
            let mut cmd = Command::new(&cargo);
            cmd.args(["build", "-q", "-p", "libcuda"]);
            if release {
                cmd.arg("--release");
            }
            match cmd
                .current_dir(ws)
                .env("CARGO_TARGET_DIR", target)
                .stdout(Stdio::null())
                .status()
            {
                Ok(st) if st.success() => {}
                Ok(st) => bail!(
                    "building the stand-in libcuda failed ({st}): {}",
                    build_hint(release)
                ),
                // No cargo here (a binary copied with its target folder):
                // the stand-in beside it, if any, is used as it is.
                Err(e) => println!(
                    "  (no cargo to run: {e}; using the stand-in beside {})",
                    exe.display()
                ),
            }
        }
    }
    let lib_dir = bin_dir.join("../lib");
    let candidates = [
        bin_dir.join("libcuda.so"),
        bin_dir.join("libcuda.so.1"),
        lib_dir.join("libcuda.so.1"),
    ];
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "the demo's tenants need the stand-in libcuda.so.1 and none is beside {} or in \
                 its ../lib: build it ({}) and put its libcuda.so beside the binary",
                exe.display(),
                build_hint(release)
            )
        })
}

/// The tenant program, built: its path, the stand-in's folder, the kernels.
pub struct Program {
    exe: PathBuf,
    lib: PathBuf,
    ptx: PathBuf,
}

/// Puts the stand-in in `dir/lib` (as `libcuda.so.1`, and `libcuda.so` to
/// link against), writes the kernels and the tenant's source into `dir`,
/// and builds the tenant with `$CC` (default `cc`).
pub fn build(dir: &Path, ptx: &str) -> Result<Program> {
    let so = standin()?;
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).with_context(|| format!("making {}", lib.display()))?;
    for name in ["libcuda.so.1", "libcuda.so"] {
        std::fs::copy(&so, lib.join(name))
            .with_context(|| format!("copying {} into {}", so.display(), lib.display()))?;
    }
    let ptx_path = dir.join("fairvgpu.ptx");
    std::fs::write(&ptx_path, ptx)?;
    let src = dir.join("tenant.c");
    std::fs::write(&src, TENANT_C)?;
    let exe = dir.join("tenant");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let out = Command::new(&cc)
        .args(["-O2", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", lib.display()))
        .arg("-lcuda")
        .output()
        .with_context(|| {
            format!(
                "running the C compiler `{}`: the demo builds its tenant program with it \
                 (install one: apt install gcc, or set CC)",
                Path::new(&cc).display()
            )
        })?;
    if !out.status.success() {
        bail!(
            "compiling the tenant program failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    println!(
        "tenant program: {} (cc -lcuda against the stand-in in {})",
        exe.display(),
        lib.display()
    );
    Ok(Program {
        exe,
        lib,
        ptx: ptx_path,
    })
}

/// One tenant's process and the thread relaying its output.
pub struct Tenant {
    pub name: String,
    child: Child,
    relay: Option<std::thread::JoinHandle<()>>,
}

impl Program {
    /// Starts the tenant of `vm` on `socket` for at most `seconds` (a bound in
    /// case the demo dies without stopping it). Its output lines are printed
    /// prefixed by `vm`; its `running` line adds one to `ready`.
    pub fn spawn(
        &self,
        vm: &str,
        socket: &Path,
        seconds: f64,
        check: bool,
        ready: &Arc<AtomicUsize>,
    ) -> Result<Tenant> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg(&self.ptx).arg(format!("{seconds:.0}"));
        if check {
            cmd.arg("check");
        }
        let mut child = cmd
            .env("LD_LIBRARY_PATH", &self.lib)
            .env("FAIRVGPU_SOCKET", socket)
            // A small spin budget: three tenants share a small machine with
            // their workers.
            .env("FAIRVGPU_SPINS", "2000")
            .stdout(Stdio::piped())
            // Its own process group: Ctrl-C reaches the demo, which stops the
            // tenants itself before the daemon.
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", self.exe.display()))?;
        let out = child.stdout.take().context("the tenant's output")?;
        let (who, ready) = (vm.to_owned(), ready.clone());
        let relay = std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if line == "running" {
                    ready.fetch_add(1, Ordering::SeqCst);
                } else {
                    println!("  {who}'s tenant: {line}");
                }
            }
        });
        Ok(Tenant {
            name: vm.to_owned(),
            child,
            relay: Some(relay),
        })
    }
}

impl Tenant {
    /// An error if the tenant's process has ended.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(st) = self.child.try_wait()? {
            bail!("{}'s tenant ended ({st})", self.name);
        }
        Ok(())
    }

    /// Asks the tenant to stop (SIGTERM), waits for it (SIGKILL after
    /// `grace`), and gives its exit status.
    pub fn stop(&mut self, grace: Duration) -> Result<ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        if self.child.try_wait()?.is_none() {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        let t = Instant::now();
        let st = loop {
            if let Some(st) = self.child.try_wait()? {
                break st;
            }
            if t.elapsed() > grace {
                let _ = self.child.kill();
                break self.child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(r) = self.relay.take() {
            let _ = r.join();
        }
        Ok(st)
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        if self.relay.is_some() {
            let _ = self.stop(Duration::from_secs(5));
        }
    }
}
