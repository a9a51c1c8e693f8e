//! CUDA's virtual memory management API (cuMemAddressReserve, cuMemCreate,
//! cuMemMap, ...) from a C program through the stand-in, against a sim
//! worker: mapped memory works for copies, memsets and kernels; a foreign
//! or released handle, a foreign reservation, overlapping maps and partial
//! unmaps are refused; compressible memory is made, says so and holds its
//! bytes, and an undefined compression type is refused; physical memory
//! counts against the vGPU's limit and all of it comes back, also when the
//! process dies holding it.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use guest::Gpu;
use protocol::{Request, VMM_GRANULARITY as G};
use tests::{build_c_standin, run_program, standin, workspace, Host, TEST_SPIN};

/// Builds `tests/c/vmm.c` into `dir` (`cuda_h`: against this CUDA
/// toolkit's `cuda.h` rather than the program's own declarations).
fn build(dir: &Path, lib: &Path, cuda_h: Option<&Path>) -> PathBuf {
    match cuda_h {
        None => build_c_standin("vmm", dir, lib, &[]),
        Some(inc) => {
            let d = dir.join("cuda-h");
            std::fs::create_dir_all(&d).unwrap();
            let inc = format!("-I{}", inc.display());
            build_c_standin("vmm", &d, lib, &["-DHAVE_CUDA_H", &inc])
        }
    }
}

/// Runs `vmm.c`'s program on the kernels' PTX with `args` after it.
fn run(exe: &Path, lib: &Path, socket: &Path, args: &[String]) -> String {
    let ptx = workspace().join("worker/kernels/fairvgpu.ptx");
    let mut all = vec![ptx.display().to_string()];
    all.extend(args.iter().cloned());
    run_program(exe, &all, &lib.to_string_lossy(), socket, &[])
}

#[test]
fn vmm_through_the_standin_maps_copies_refuses_and_leaks_nothing() {
    let host = Host::start("vmm", 256 << 20);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    // Another process of the VM, with a handle and a reservation of its own.
    let mut other = Gpu::connect_with(&host.socket, TEST_SPIN).unwrap();
    let foreign = other
        .request(&Request::VmmCreate {
            size: G,
            compression: 0,
        })
        .unwrap()
        .vals[0];
    let reserve = |g: &mut Gpu, addr: u64| {
        g.request(&Request::VmmReserve {
            size: G,
            align: 0,
            addr,
        })
        .unwrap()
        .vals[0]
    };
    let foreign_va = reserve(&mut other, 0);
    // An address asked for is a hint; the sim takes it where it has handed
    // out nothing yet (the stand-in asks for addresses the process has free
    // when the host's land on its own memory).
    let hint = foreign_va + (64 << 30);
    assert_eq!(reserve(&mut other, hint), hint);
    other
        .request(&Request::VmmAddressFree { ptr: hint, size: G })
        .unwrap();
    let mem = |s: &worker::serve::Stats| s.mem_used.load(Ordering::Relaxed);
    host.wait_until("the other's memory", Duration::from_secs(10), |s| {
        mem(s) == G
    });
    let args = vec![format!("{foreign:#x}"), format!("{foreign_va:#x}")];

    let mut exes = vec![build(&dir, &lib, None)];
    // Against CUDA 13's own cuda.h too, where the wheels are unpacked.
    if let Some(root) = std::env::var_os("FAIRVGPU_CUDA_ROOT").map(PathBuf::from) {
        if root.join("include/cuda.h").exists() {
            exes.push(build(&dir, &lib, Some(&root.join("include"))));
        }
    }
    for exe in &exes {
        let stdout = run(exe, &lib, &host.socket, &args);
        println!("{}:\n{stdout}", exe.display());
        for line in [
            "bytes round trip across two mappings",
            "kernel on mapped memory correct",
            "map of a foreign handle refused",
            "map of a released handle refused",
            "overlapping map refused",
            "map into a foreign reservation refused",
            "unmap of part of a mapping refused",
            "unmap of unmapped memory refused",
            "copy to reserved, unmapped memory refused",
            "memory over the vGPU's limit refused: CUDA_ERROR_OUT_OF_MEMORY",
            "use after free refused",
            "vmm: compressible memory made, mapped, written and read back (4194304 bytes)",
            "compression type 2 refused: CUDA_ERROR_INVALID_VALUE",
            "granularity of compression type 2 refused: CUDA_ERROR_INVALID_VALUE",
            "vmm: all checks passed",
        ] {
            assert!(stdout.contains(line), "{line}\n{stdout}");
        }
        // All its memory back; the other process's untouched.
        host.wait_until("the program's memory back", Duration::from_secs(10), |s| {
            mem(s) == G
        });
    }

    // A process that dies holding a reservation, mappings and handles.
    let mut leaky = args.clone();
    leaky.push("leak".into());
    let stdout = run(&exes[0], &lib, &host.socket, &leaky);
    assert!(stdout.contains("leaving without freeing"), "{stdout}");
    host.wait_until(
        "the dead process's memory back",
        Duration::from_secs(10),
        |s| mem(s) == G,
    );
    // The other process's handle still works, and goes with it.
    let va = other
        .request(&Request::VmmMap {
            ptr: foreign_va,
            size: G,
            offset: 0,
            handle: foreign,
        })
        .map(|_| foreign_va)
        .unwrap();
    other.memcpy_htod(va, &[7u8; 64]).unwrap();
    let mut back = [0u8; 64];
    other.memcpy_dtoh(&mut back, va, 0).unwrap();
    assert_eq!(back, [7u8; 64]);
    drop(other);
    host.wait_until("everything back", Duration::from_secs(10), |s| mem(s) == 0);
}
