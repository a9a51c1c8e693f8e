//! Unmodified driver-API C programs, built with the system C compiler against
//! the stand-in libcuda.so.1 (no CUDA toolkit), run against a sim worker.

use std::path::Path;
use std::process::Command;

use tests::{assert_lines, build_c_standin, cargo_build, run_program, standin, workspace, Host};

/// Runs the C program on the kernels' PTX with `args` after it, through
/// the stand-in in `lib` on the host at `socket`, with `env` set too.
fn run_driver_api(
    exe: &Path,
    lib: &Path,
    socket: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> String {
    let ptx = workspace().join("worker/kernels/fairvgpu.ptx");
    let mut all = vec![ptx.into_os_string()];
    all.extend(args.iter().map(|a| a.into()));
    run_program(exe, &all, &lib.to_string_lossy(), socket, env)
}

#[test]
fn c_driver_api_program_runs_against_the_standin() {
    let host = Host::start("capi", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c_standin("driver_api", &dir, &lib, &[]);
    let stdout = run_driver_api(&exe, &lib, &host.socket, &[], &[]);
    assert!(
        stdout.contains("vector_add: 1048576 elements correct"),
        "{stdout}"
    );
    assert!(
        stdout.contains("saxpy: 1048576 elements correct"),
        "{stdout}"
    );
    assert!(
        stdout.contains("bad copy refused: CUDA_ERROR_INVALID_VALUE"),
        "{stdout}"
    );
    assert!(stdout.contains("zero-byte copies: success"), "{stdout}");
    assert!(
        stdout.contains("kernels: 8 enumerated, the same through the tools module table"),
        "{stdout}"
    );
    assert!(
        stdout.contains("cluster table: shape 2x1x1 round trip"),
        "{stdout}"
    );
    assert!(stdout.contains("driver_api: all checks passed"), "{stdout}");
    // The program freed everything; the host agrees.
    host.wait_program_freed();
}

/// A child forked after the program attached, exiting normally without a
/// CUDA call, runs the atexit handlers it inherited: they must not let go
/// of the parent's channel (nor wait for the parent's copy thread), and the
/// parent goes on with every later check passing.
/// Device addresses the host picks where the guest process has memory of its
/// own: the program (`tests/c/collide.c`) maps 256 MiB where the host's next
/// allocations go, and its allocations land elsewhere and work as any other.
#[test]
fn device_memory_lands_clear_of_the_processs_own_memory() {
    let host = Host::start("collide", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c_standin("collide", &dir, &lib, &[]);
    let no_args: [&str; 0] = [];
    let stdout = run_program(&exe, &no_args, &lib.to_string_lossy(), &host.socket, &[]);
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert_lines(
        &stdout,
        &[
            "ok: allocated clear of the process's memory",
            "ok: stream-ordered allocation clear too",
            "ok: device to device copy of inferred direction",
            "ok: all the memory back",
            "collide: all checks passed",
        ],
    );
    host.wait_program_freed();
}

#[test]
fn a_forked_child_leaves_the_parents_vgpu_alone() {
    let host = Host::start("capi-fork", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let exe = build_c_standin("driver_api", &dir, &lib, &[]);
    // Two copy threads whatever this machine's CPUs, so the helper thread
    // exists in the parent when it forks.
    let copy_threads = [("FAIRVGPU_COPY_THREADS", "2")];
    let stdout = run_driver_api(&exe, &lib, &host.socket, &["fork"], &copy_threads);
    assert!(
        stdout.contains("fork: child exited, parent goes on"),
        "{stdout}"
    );
    assert!(stdout.contains("driver_api: all checks passed"), "{stdout}");
}

#[test]
fn without_a_vgpu_cuinit_reports_no_device() {
    let dir = scratch::dir("fvg-nodev");
    let lib = standin(&dir);
    let exe = build_c_standin("driver_api", &dir, &lib, &[]);
    let run = Command::new(&exe)
        .arg("/dev/null")
        .env("LD_LIBRARY_PATH", &lib)
        .env_remove("FAIRVGPU_SOCKET")
        .output()
        .unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("CUDA_ERROR_NO_DEVICE"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rust_cudarc_program_runs_against_the_standin() {
    let host = Host::start("cudarc", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let ptx = workspace().join("worker/kernels/fairvgpu.ptx");
    let run = Command::new(env!("CARGO_BIN_EXE_cudarc-guest"))
        .arg(&ptx)
        .env("LD_LIBRARY_PATH", &lib)
        .env("FAIRVGPU_SOCKET", &host.socket)
        .output()
        .expect("program runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "cudarc program failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("cudarc-guest: all checks passed"),
        "{stdout}"
    );
}

/// Every symbol the real driver (580, CUDA 13.0) exports is exported by the
/// stand-in, so no program fails to load or resolve an entry point (one we
/// do not serve answers CUDA_ERROR_NOT_SUPPORTED: the next test), and
/// cuGetProcAddress finds every base name.
#[test]
fn every_driver_symbol_is_exported() {
    use std::ffi::{c_char, c_int, c_void, CString};
    let so = cargo_build("libcuda").join("libcuda.so");
    let list =
        std::fs::read_to_string(workspace().join("libcuda/data/driver-580-exports.txt")).unwrap();
    let path = CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: loading our own library; its initializers do nothing.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null(), "dlopen {}", so.display());
    let sym = |name: &str| {
        let c = CString::new(name).unwrap();
        // SAFETY: a live handle and a NUL-terminated name.
        unsafe { libc::dlsym(lib, c.as_ptr()) }
    };
    let names: Vec<&str> = list.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(names.len(), 674);
    let missing: Vec<&&str> = names.iter().filter(|n| sym(n).is_null()).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");

    type GetProc =
        unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> u32;
    // SAFETY: cuGetProcAddress_v2 has this signature.
    let get_proc: GetProc = unsafe { std::mem::transmute(sym("cuGetProcAddress_v2")) };
    let table = std::fs::read_to_string(workspace().join("libcuda/data/entry_points.tsv")).unwrap();
    let bases: std::collections::BTreeSet<&str> = table
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split('\t').nth(1))
        .collect();
    assert!(bases.len() > 400);
    for base in bases {
        let c = CString::new(base).unwrap();
        let (mut pfn, mut status) = (std::ptr::null_mut(), -1);
        // SAFETY: valid name and out-parameters.
        let r = unsafe { get_proc(c.as_ptr(), &mut pfn, 13000, 0, &mut status) };
        assert_eq!((r, status), (0, 0), "{base}");
        assert!(!pfn.is_null(), "{base}");
    }
    // SAFETY: nothing of the library is in use any more.
    unsafe { libc::dlclose(lib) };
}

/// Set, to the stand-in's path, in the child process of
/// [`an_unserved_entry_point_answers_not_supported_and_says_so_once`].
const UNSERVED_CHILD: &str = "FAIRVGPU_TEST_UNSERVED_CHILD";

/// A graphics-interop entry point is not served: CUDA_ERROR_NOT_SUPPORTED,
/// and one line on standard error saying so however often it is called.
/// The calls are made in a child process (this test again), whose standard
/// error the test reads.
#[test]
fn an_unserved_entry_point_answers_not_supported_and_says_so_once() {
    const NAME: &str = "an_unserved_entry_point_answers_not_supported_and_says_so_once";
    if let Some(so) = std::env::var_os(UNSERVED_CHILD) {
        let path = std::ffi::CString::new(so.into_encoded_bytes()).unwrap();
        // SAFETY: loading our own library; its initializers do nothing.
        let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!lib.is_null());
        // SAFETY: a live handle and a NUL-terminated name.
        let f = unsafe { libc::dlsym(lib, c"cuGLInit".as_ptr()) };
        assert!(!f.is_null());
        // SAFETY: cuGLInit takes no arguments and returns a CUresult.
        let gl_init: extern "C" fn() -> u32 = unsafe { std::mem::transmute(f) };
        println!("cuGLInit answers {} then {}", gl_init(), gl_init());
        return;
    }
    let so = cargo_build("libcuda").join("libcuda.so");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(UNSERVED_CHILD, &so)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("cuGLInit answers 801 then 801"),
        "CUDA_ERROR_NOT_SUPPORTED both times: {stdout}\n{stderr}"
    );
    let said = "fairvgpu libcuda: cuGLInit is not supported; returning CUDA_ERROR_NOT_SUPPORTED";
    assert_eq!(stderr.matches(said).count(), 1, "{stderr}");
}

/// `cuDeviceGetUuid` through the stand-in is the UUID the host gives the
/// vGPU (a worker outside a daemon: from its socket and VM name), not one
/// the guest makes up.
#[test]
fn the_uuid_is_the_one_the_host_gives() {
    let host = Host::start("uuid", 64 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    let code = r#"
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev = ctypes.c_int()
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
uuid = (ctypes.c_ubyte * 16)()
assert cu.cuDeviceGetUuid(uuid, dev) == 0
print("uuid", bytes(uuid).hex())
"#;
    let stdout = run_program(
        Path::new("python3"),
        &["-c", code],
        &lib.to_string_lossy(),
        &host.socket,
        &[],
    );
    let want = wire::identity::vgpu_uuid(host.socket.as_os_str().as_encoded_bytes(), "uuid");
    let want: String = want.iter().map(|b| format!("{b:02x}")).collect();
    assert_lines(&stdout, &[&format!("uuid {want}")]);
}
