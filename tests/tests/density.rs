//! Issue 51 on the sim: VMs of a latency-bound loop (a kernel, then a
//! synchronous copy back, checked every round) packed onto one GPU do
//! together about what they do without a scheduler. Under exclusive grants
//! they did what one VM does alone: 0.42-0.55 of unscheduled on the 2-CPU
//! development machine's sim at 4-16 VMs, 0.527 on an H100 at 8
//! (`results/2026-11-27-h100-density.md`); shared at once, 0.87-0.95 on the
//! sim, 0.971 on the H100. The release build runs it: in a debug build the
//! sim's kernels and the rings take the two CPUs, which then bound both
//! ways of sharing alike. The floor leaves room for a loaded CI machine
//! while failing the exclusive behaviour.

use tests::workspace;

/// Throughput against unscheduled below which the GPU idles for the
/// scheduler's sake (exclusive grants read 0.42-0.55 here, shared at once
/// 0.72-0.95).
const FLOOR: f64 = 0.6;

/// One bench at a time: each takes both CPUs.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `bench fairness --density N --density-only` on the sim, under `sharing`:
/// (throughput against unscheduled, MMR).
fn vms(n: usize, sharing: &str) -> (f64, f64) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = workspace();
    let st = std::process::Command::new(env!("CARGO"))
        .args(["build", "--release", "-q", "-p", "cli"])
        .current_dir(&root)
        .status()
        .expect("cargo build");
    assert!(st.success(), "building the release fairvgpu failed");
    let bin = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or(root.join("target"))
        .join("release/fairvgpu");
    let out = std::process::Command::new(bin)
        .args(["bench", "fairness", "--executor", "sim", "--seconds", "2"])
        .args([
            "--lift",
            "off",
            "--density",
            &n.to_string(),
            "--density-only",
        ])
        .args(["--sharing", sharing])
        .env("RUST_LOG", "warn")
        .output()
        .expect("running the bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let figure = |k: &str| -> f64 {
        last.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {last:?}"))
    };
    (figure("throughput_vs_unscheduled="), figure("mmr="))
}

#[test]
fn eight_latency_bound_vms_keep_the_unscheduled_throughput() {
    let (shared, mmr) = vms(8, "concurrent");
    let (exclusive, _) = vms(8, "exclusive");
    eprintln!("8 VMs: shared {shared:.3} (MMR {mmr:.3}), exclusive {exclusive:.3} of unscheduled");
    assert!(
        shared >= FLOOR,
        "shared at once, 8 VMs did {shared:.3} of what they do unscheduled"
    );
    assert!(
        shared > exclusive * 1.2,
        "sharing at once ({shared:.3}) gained nothing over exclusive grants ({exclusive:.3})"
    );
    // Every VM got rounds: none starved.
    assert!(mmr > 0.2, "MMR {mmr:.3}");
}

/// At 32 VMs their contexts' interleaved work stretches every VM's device
/// work alike. Counting each such VM as heavy gave some turns alone and
/// the rest a quarter of their rounds: 0.46-0.50 of unscheduled, MMR
/// 0.13-0.15 here. With heaviness judged by a VM's own length (its
/// stretches over the VMs beside it) or against the others', eight at
/// once: 0.74-0.80, MMR 0.52-0.57 (on an H200 1.49-1.65 and 0.82-0.87,
/// `results/2026-11-28-h200-density-at-once.md`, `-own-length.md`).
#[test]
fn thirty_two_alike_vms_hold_together_and_none_falls_behind() {
    let (shared, mmr) = vms(32, "concurrent");
    eprintln!("32 VMs: shared {shared:.3} (MMR {mmr:.3}) of unscheduled");
    assert!(shared >= 0.65, "32 VMs did {shared:.3} of unscheduled");
    assert!(mmr >= 0.25, "MMR {mmr:.3}: some VMs held the GPU alone");
}
