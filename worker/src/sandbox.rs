//! Least privilege for worker processes.
//!
//! A worker parses everything its guest writes; if a bug there ever let a
//! guest run code in the worker, that code must not reach other tenants or
//! the host. Once a worker has set up (region mapped, doorbells received,
//! connected to its GPU's scheduler, CUDA initialized) it calls [`confine`]:
//!
//! - it becomes non-dumpable: processes of the same user cannot ptrace it
//!   or open its `/proc/<pid>/fd` (the daemon, which holds every VM's
//!   region, is made non-dumpable at start for the same reason);
//! - `no_new_privs`, then a seccomp filter that fails with `EPERM`: running
//!   programs (`execve`), debugging or reading other processes (`ptrace`,
//!   `process_vm_*`), opening or accepting any connection (`connect`, `bind`,
//!   `listen`, `accept*`, and `socket` for anything but `AF_UNIX`), changing
//!   identity or namespaces, loading kernel modules or BPF, mounting, and
//!   the other calls of system administration.
//!
//! With `connect` gone, a confined worker cannot reach another VM's
//! ivshmem-server socket (the only way to another region), nor the network.
//! The filter is a deny-list: the CUDA driver's own calls (`ioctl` on the
//! `/dev/nvidia*` nodes, `mmap`, threads) stay allowed, whatever it needs.

use std::collections::BTreeMap;

use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

use crate::Error;

/// System calls a confined worker may not make, whatever their arguments.
const DENIED: &[i64] = &[
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setgroups,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_quotactl,
];

/// Why the worker's seccomp filter could not be made or installed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// seccompiler knows no filter for this architecture.
    #[error("config: sandbox: {0}")]
    Arch(#[source] seccompiler::BackendError),
    /// The filter could not be compiled.
    #[error("config: sandbox filter: {0}")]
    Filter(#[source] seccompiler::BackendError),
    /// The kernel refused the filter.
    #[error("config: installing the worker's seccomp filter: {0}")]
    Install(#[source] seccompiler::Error),
}

fn arch() -> Result<seccompiler::TargetArch, Error> {
    Ok(seccompiler::TargetArch::try_from(std::env::consts::ARCH).map_err(SandboxError::Arch)?)
}

/// The worker's filter, compiled.
fn program() -> Result<seccompiler::BpfProgram, Error> {
    let err = |e: seccompiler::BackendError| Error::from(SandboxError::Filter(e));
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    // socket(domain, ...) with a domain other than AF_UNIX.
    let not_unix = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Ne,
        libc::AF_UNIX as u64,
    )
    .map_err(err)?;
    rules.insert(
        libc::SYS_socket,
        vec![SeccompRule::new(vec![not_unix]).map_err(err)?],
    );
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(err)?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| err(e))
}

/// Makes this process non-dumpable (see the module documentation).
pub fn not_dumpable() -> Result<(), Error> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| Error::Io {
        what: "prctl(PR_SET_DUMPABLE)",
        source: e.into(),
    })
}

/// Confines the calling thread, and the threads it starts from now on, for
/// good; the process's other threads stay as they are until [`confine`]
/// (the worker's thread that makes MPS contexts ahead, which must still
/// connect to the MPS server). Those threads share its memory, so until
/// then this bounds what a guest's bug in the worker could do, but less
/// firmly than [`confine`] does.
pub fn confine_thread() -> Result<(), Error> {
    not_dumpable()?;
    let prog = program()?;
    Ok(seccompiler::apply_filter(&prog).map_err(SandboxError::Install)?)
}

/// Confines every thread of this process, for good.
pub fn confine() -> Result<(), Error> {
    not_dumpable()?;
    let prog = program()?;
    Ok(seccompiler::apply_filter_all_threads(&prog).map_err(SandboxError::Install)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    const CHILD: &str = "FAIRVGPU_SANDBOX_TEST_CHILD";

    /// The checks run in a child process (this test binary again), since a
    /// filter cannot be taken off the process that installed it.
    #[test]
    fn confined_process_cannot_exec_connect_or_read_others() {
        if std::env::var_os(CHILD).is_some() {
            return child();
        }
        in_child(
            "confined_process_cannot_exec_connect_or_read_others",
            CHILD,
            "other-vm.sock",
            "sandbox-checks-passed",
        );
    }

    /// Runs test `name` of this binary again in a child process, with `var`
    /// set to the path of a listening socket named `sock` (which it may try
    /// to connect to); the child must pass and print `passed`.
    fn in_child(name: &str, var: &str, sock: &str, passed: &str) {
        // Named by the socket (each test's differs): the test's name is too
        // long for a socket path.
        let dir = scratch::dir(&format!("fvg-sandbox-{}", sock.trim_end_matches(".sock")));
        let sock = dir.join(sock);
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                &format!("sandbox::tests::{name}"),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(var, &sock)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains(passed), "{text}");
    }

    /// The serving thread confined first, the thread making contexts ahead
    /// later: until then it still connects; then every thread is confined.
    #[test]
    fn a_thread_confined_first_then_every_thread() {
        if let Some(sock) = std::env::var_os(CHILD_THREAD) {
            return thread_first(std::path::PathBuf::from(sock));
        }
        in_child(
            "a_thread_confined_first_then_every_thread",
            CHILD_THREAD,
            "mps.sock",
            "thread-checks-passed",
        );
    }

    const CHILD_THREAD: &str = "FAIRVGPU_SANDBOX_TEST_THREAD";

    fn thread_first(sock: std::path::PathBuf) {
        use std::sync::mpsc::channel;
        let (ask, asked) = channel::<()>();
        let (tell, told) = channel::<bool>();
        let s = sock.clone();
        // Started before any confinement, as the context maker is.
        let maker = std::thread::spawn(move || {
            while asked.recv().is_ok() {
                let r = std::os::unix::net::UnixStream::connect(&s);
                tell.send(r.is_ok()).unwrap();
            }
        });
        confine_thread().expect("the thread's filter installs");
        match std::os::unix::net::UnixStream::connect(&sock) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            other => panic!("the confined thread connected: {other:?}"),
        }
        // A thread it starts is confined too.
        let started = std::thread::spawn({
            let sock = sock.clone();
            move || std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
        assert!(!started.join().unwrap(), "a thread it started connected");
        ask.send(()).unwrap();
        assert!(told.recv().unwrap(), "the other thread still connects");
        confine().expect("then every thread");
        ask.send(()).unwrap();
        assert!(!told.recv().unwrap(), "the other thread is confined now");
        drop(ask);
        maker.join().unwrap();
        println!("thread-checks-passed");
    }

    fn child() {
        let sock = std::path::PathBuf::from(std::env::var_os(CHILD).unwrap());
        // Before: all of it works.
        assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok());
        confine().expect("filter installs");
        let eperm = |r: std::io::Result<()>, what: &str| match r {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            other => panic!("{what}: expected EPERM, got {other:?}"),
        };
        eperm(
            std::os::unix::net::UnixStream::connect(&sock).map(drop),
            "connect to another VM's socket",
        );
        eperm(
            std::net::TcpStream::connect("127.0.0.1:9").map(drop),
            "TCP socket",
        );
        eperm(
            std::net::TcpListener::bind("127.0.0.1:0").map(drop),
            "listening",
        );
        eperm(
            Command::new("/bin/true").status().map(drop),
            "running a program",
        );
        // Reading another process's memory (here: its parent's).
        let mut buf = [0u8; 8];
        let mut local = [std::io::IoSliceMut::new(&mut buf)];
        let remote = [nix::sys::uio::RemoteIoVec {
            base: 0x1000,
            len: 8,
        }];
        match nix::sys::uio::process_vm_readv(nix::unistd::getppid(), &mut local, &remote) {
            Err(nix::errno::Errno::EPERM) => {}
            other => panic!("process_vm_readv: expected EPERM, got {other:?}"),
        }
        // What a worker does keep: files, memory, socket pairs, threads.
        assert!(std::fs::read_to_string("/proc/self/status").is_ok());
        assert!(std::os::unix::net::UnixStream::pair().is_ok());
        assert!(std::thread::spawn(|| 1).join().is_ok());
        assert!(nix::sys::prctl::get_dumpable().is_ok_and(|d| !d));
        println!("sandbox-checks-passed");
    }
}
