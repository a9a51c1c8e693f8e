//! NVML in the guest: NVIDIA's `nvidia-ml-py` (pynvml, in
//! `FAIRVGPU_PYTHONPATH`, which `scripts/check` installs) calls the NVML
//! stand-in beside the CUDA one, on the sim: one device, the vGPU's memory
//! limit as its memory, CUDA's name, UUID and PCI address, used memory
//! that grows when another process allocates through the CUDA stand-in,
//! that process listed with its memory and gone once it exits; the UUID is
//! the one the host gives the vGPU, the driver version the host's (the
//! sim's), NVML's version made of it, and `nvmlInternalGetExportTable`
//! gives nvidia-smi's table (offering no entry) and no other. Skipped
//! where pynvml is missing, unless `FAIRVGPU_REQUIRE_CUPY` is set.

use std::path::PathBuf;

use tests::{assert_lines, nvml_standin, run_program, standin, workspace, Host};

fn pynvml_path() -> Option<PathBuf> {
    let p = std::env::var_os("FAIRVGPU_PYTHONPATH").map(PathBuf::from);
    if !p.as_ref().is_some_and(|p| p.join("pynvml.py").is_file()) {
        assert!(
            std::env::var_os("FAIRVGPU_REQUIRE_CUPY").is_none(),
            "FAIRVGPU_REQUIRE_CUPY is set but FAIRVGPU_PYTHONPATH has no pynvml (nvidia-ml-py)"
        );
        eprintln!("skipped: no pynvml in FAIRVGPU_PYTHONPATH");
        return None;
    }
    p
}

#[test]
fn nvidia_ml_py_sees_the_vgpu_through_the_standin() {
    let Some(py) = pynvml_path() else { return };
    let limit: u64 = 256 << 20;
    let host = Host::start("nvml", limit);
    let dir = host.socket.parent().unwrap().to_owned();
    let lib = standin(&dir);
    nvml_standin(&lib);
    let script = workspace().join("tests/py/nvml_probe.py");
    let py = py.display().to_string();
    // A worker outside a daemon names its vGPU by its socket and VM name.
    let uuid = guest::uuid_string(&wire::identity::vgpu_uuid(
        host.socket.as_os_str().as_encoded_bytes(),
        "nvml",
    ));
    let release = worker::executor::sim::SIM_DRIVER_RELEASE;
    let stdout = run_program(
        std::path::Path::new("python3"),
        &[
            script.display().to_string(),
            limit.to_string(),
            uuid.clone(),
            release.to_owned(),
        ],
        &lib.display().to_string(),
        &host.socket,
        &[("PYTHONPATH", py.as_str())],
    );
    assert_lines(
        &stdout,
        &[
            "nvml: devices 1",
            &format!("nvml: total {limit}"),
            &format!("nvml: name and uuid as CUDA's (fairvgpu sim GPU, {uuid})"),
            "nvml: pci as CUDA's",
            "nvml: used grows by the other process's allocation",
            "nvml: the CUDA process listed with its memory",
            &format!("nvml: versions, utilization, unsupported figures (driver {release})"),
            "nvml: nvidia-smi's table given, offering no entry",
            "nvml: the process gone once it exits",
            "nvml: all checks passed",
        ],
    );
}
