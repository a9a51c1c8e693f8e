//! The README's worked example of an unmodified CUDA program on the host
//! (the block between `<!-- host-example -->` and `<!-- /host-example -->`),
//! run as written on the sim, with three changes only: the debug build
//! instead of `--release` (the tests' own build), the build folder where
//! cargo puts it, and a scratch folder of this run instead of
//! `/tmp/fairvgpu-example`.

use std::process::Command;

use tests::{cargo_build, workspace};

#[test]
fn readme_host_example_runs_as_written() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let start = readme
        .find("<!-- host-example -->")
        .expect("marker in README");
    let end = readme.find("<!-- /host-example -->").expect("end marker");
    let block = &readme[start..end];
    let script = block
        .split_once("```sh\n")
        .and_then(|(_, b)| b.split_once("```"))
        .map(|(b, _)| b)
        .expect("a sh block");
    assert!(script.contains("-lcuda") && script.contains("FAIRVGPU_SOCKET="));
    // The build folder the test's own cargo uses (`<dir>/debug`).
    let debug = cargo_build("cli");
    let target = debug.parent().unwrap().to_string_lossy().into_owned();
    let scratch = scratch::dir("fvg-readme");
    let script = script
        .replace("--release ", "")
        .replace("./target/release/", &format!("{target}/debug/"))
        .replace("target/release/", &format!("{target}/debug/"))
        .replace("/tmp/fairvgpu-example", &scratch.to_string_lossy());
    // Bounded: a daemon that never serves would leave the wait loop waiting.
    let out = Command::new("timeout")
        .args(["300", "bash", "-euo", "pipefail", "-c", &script])
        .current_dir(workspace())
        .env_remove("RUST_LOG")
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A daemon the script left running (it failed before its `kill %1`)
    // is found by its run_dir's lock.
    if let Ok(pid) = std::fs::read_to_string(scratch.join("fairvgpu.lock")) {
        if let Ok(pid) = pid.trim().parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(
        out.status.success(),
        "the README's example failed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(
        stdout.contains("vector_add: 1048576 elements correct")
            && stdout.contains("driver_api: all checks passed"),
        "the program's success line:\n{stdout}\n{stderr}"
    );
}
