//! Issue 51 on the sim: VMs of a latency-bound loop (a kernel, then a
//! synchronous copy back, checked every round) packed onto one GPU do
//! together about what they do without a scheduler. Under exclusive grants
//! they did what one VM does alone: 0.42-0.55 of unscheduled on the 2-CPU
//! development machine's sim at 4-16 VMs, 0.527 on an H100 at 8
//! (`results/2026-11-27-h100-density.md`); shared at once, 0.87-0.95 on the
//! sim, 0.971 on the H100. The release build runs it: in a debug build the
//! sim's kernels and the rings take the two CPUs, which then bound both
//! ways of sharing alike. The floor leaves room for a loaded CI machine
//! while failing the exclusive behaviour. The mixes (weights 1:2:3; one
//! GPU-bound guest among seven) are checked for what the sim can show:
//! shares by weight, the latency-bound guests protected, the GPU busy.

use tests::workspace;

/// Throughput against unscheduled below which the GPU idles for the
/// scheduler's sake (exclusive grants read 0.42-0.55 here, shared at once
/// 0.72-0.95).
const FLOOR: f64 = 0.6;

// One bench at a time (`tests::one_at_a_time`): each takes both CPUs.

/// Runs `check` (a measurement and what it must show) again once if it
/// fails, and fails with both reasons if it fails twice. The sim's rounds
/// on two CPUs are what the CPUs leave them: in a CI run of 2026-11-29
/// everything read low at once (8 VMs shared at once 0.578 of
/// unscheduled, exclusive grants 0.557; the 1-among-7 mix's latency-bound
/// guests 1.08 times their shares unscheduled), on a build whose earlier
/// runs had passed. What the tests catch, exclusive grants, fails every
/// time.
fn twice(check: impl Fn() -> Result<(), String>) {
    if let Err(first) = check() {
        eprintln!("failed once, measured again: {first}");
        if let Err(second) = check() {
            panic!("failed twice: {first}; then {second}");
        }
    }
}

/// `Err(why)` unless `ok`.
fn hold(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(why())
    }
}

/// `bench fairness ARGS` on the sim for `secs` seconds a round with the
/// host CPU lift off: its standard output.
fn bench(secs: &str, args: &[&str]) -> String {
    let _one = tests::one_at_a_time();
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
        .args(["bench", "fairness", "--executor", "sim", "--seconds", secs])
        .args(["--lift", "off"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running the bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The value of `key=` among `line`'s words.
fn figure(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|v| v.trim_end_matches(';').parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// `bench fairness --density N --density-only` on the sim, under `sharing`:
/// (throughput against unscheduled, MMR).
fn vms(n: usize, sharing: &str) -> (f64, f64) {
    let n = n.to_string();
    let stdout = bench(
        "2",
        &["--density", &n, "--density-only", "--sharing", sharing],
    );
    let last = stdout.lines().last().unwrap_or_default();
    (
        figure(last, "throughput_vs_unscheduled="),
        figure(last, "mmr="),
    )
}

/// One guest of a mix line: its GPU share under fairvgpu and unscheduled.
#[derive(Debug, Clone, Copy)]
struct Share {
    got: f64,
    none: f64,
}

/// A mix line of the bench (`mix NAME: GPU share fairvgpu/max-min fair:
/// 0(w1) 0.113/0.177 none 0.254 charged 0.130, ...; throughput_vs_...`):
/// each guest's shares and the mix's throughput against unscheduled.
fn mix_line(line: &str) -> (Vec<Share>, f64) {
    let guests = line
        .split_once("fair: ")
        .and_then(|(_, rest)| rest.split_once("; "))
        .unwrap_or_else(|| panic!("not a mix line: {line:?}"))
        .0;
    let shares = guests
        .split(", ")
        .map(|g| {
            let w: Vec<&str> = g.split_whitespace().collect();
            let (got, _fair) = w[1].split_once('/').expect("got/fair");
            let num = |v: &str| v.parse::<f64>().unwrap_or_else(|_| panic!("{g:?}"));
            Share {
                got: num(got),
                none: num(w[3]),
            }
        })
        .collect();
    (shares, figure(line, "throughput_vs_unscheduled="))
}

#[test]
fn eight_latency_bound_vms_keep_the_unscheduled_throughput() {
    twice(|| {
        let (shared, mmr) = vms(8, "concurrent");
        let (exclusive, _) = vms(8, "exclusive");
        eprintln!(
            "8 VMs: shared {shared:.3} (MMR {mmr:.3}), exclusive {exclusive:.3} of unscheduled"
        );
        hold(shared >= FLOOR, || {
            format!("shared at once, 8 VMs did {shared:.3} of what they do unscheduled")
        })?;
        hold(shared > exclusive * 1.2, || {
            format!("sharing at once ({shared:.3}) gained nothing over exclusive grants ({exclusive:.3})")
        })?;
        // Every VM got rounds: none starved.
        hold(mmr > 0.2, || format!("MMR {mmr:.3}"))
    });
}

/// At 32 VMs their contexts' interleaved work stretches every VM's device
/// work alike. Counting each such VM as heavy gave some turns alone and
/// the rest a quarter of their rounds: 0.46-0.50 of unscheduled, MMR
/// 0.13-0.15 here. With heaviness judged by a VM's own length (its
/// stretches over the VMs beside it) or against the others', eight at
/// once: 0.74-0.80, MMR 0.52-0.57 (on an H200 1.49-1.65 and 0.82-0.87,
/// `results/2026-11-28-h200-density-at-once.md`, `-own-length.md`); five
/// at once: 0.76-0.80, MMR 0.42-0.49 (on an H200 1.64-1.69 and 0.94-0.96,
/// `results/2026-11-29-h200-density-five-at-once.md`). The sim's two CPUs
/// run every guest and worker: which VMs get a CPU decides the rounds more
/// than the GPU's sharing does, and how fast a sleeping thread wakes
/// decides what a hand-off costs. On another 2-CPU machine, whose 20 us
/// sleeps took 124 us, five at once read 0.45-0.60 (MMR 0.04-0.23) and
/// exclusive grants 0.27-0.38 (0.07-0.26): so the two are measured in the
/// same test, and the one checked against the other.
#[test]
fn thirty_two_alike_vms_hold_together_and_none_falls_behind() {
    twice(|| {
        let (exclusive, _) = vms(32, "exclusive");
        let (shared, mmr) = vms(32, "concurrent");
        eprintln!(
            "32 VMs: shared {shared:.3} (MMR {mmr:.3}), exclusive {exclusive:.3} of unscheduled"
        );
        hold(shared >= 1.25 * exclusive, || {
            format!("32 VMs did {shared:.3} of unscheduled, exclusive grants {exclusive:.3}")
        })?;
        hold(mmr > 0.0, || "a VM did no round".into())
    });
}

/// The two mixes on the sim. Weights 1:2:3 among three latency-bound
/// guests: their shares follow the weights (unscheduled they are alike),
/// and the GPU does not idle for it. One GPU-bound guest among seven
/// latency-bound ones: each latency-bound guest gets more than beside it
/// unscheduled, where the GPU-bound one takes most of the GPU, and the
/// GPU-bound one is not starved. Here concurrent sharing read 1:2:3 at
/// 0.80-0.87 of unscheduled with the weight-3 guest at 2.6-2.8 times the
/// weight-1 guest's share, and the other mix at 1.06-1.08 with each
/// latency-bound guest at 2.0-2.8 times its share unscheduled and the
/// GPU-bound guest at 0.87-0.94 of its max-min fair share. Exclusive
/// grants: 0.53 and 0.61 of unscheduled. On the machine of slow wake-ups
/// (above): 1:2:3 at 0.58-0.97, the weight-3 guest at 2.5-2.9 times the
/// weight-1 guest's share; the other mix at 0.79-1.01, each
/// latency-bound guest at 1.1-2.0 times its share unscheduled, the
/// GPU-bound one at 0.43-0.50 of its max-min fair share (the
/// latency-bound ones together 1.4-1.5 times their shares unscheduled);
/// exclusive grants 0.47-0.52, the latency-bound guests below their shares
/// unscheduled and the GPU-bound one at 0.27.
/// (The sim's two CPUs run every guest and worker, so no guest reaches
/// its max-min fair share there.) A CI run of 2026-11-29 at 2 s a round
/// read the weight-2 guest's share equal to the weight-1 guest's, and the
/// GPU-bound guest's max-min share 0.217 (it is 0.125 when the seven
/// others' solo demand reaches an eighth): so 4 s rounds, and the
/// GPU-bound guest checked against an equal split of what the eight got.
/// Here at 4 s: it at 1.03-1.17 of that split, the latency-bound ones at
/// 1.49-1.58 times unscheduled; exclusive grants 0.87 times.
#[test]
fn mixes_follow_the_weights_and_keep_the_gpu_busy() {
    twice(mixes);
}

/// One run of both mixes, and what they must show.
fn mixes() -> Result<(), String> {
    let stdout = bench("4", &["--mix-only"]);
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| format!("no {name:?} in {stdout}"))
    };
    let (s, t) = mix_line(line("mix weights 1:2:3:")?);
    eprintln!("1:2:3 {s:?}, throughput {t:.3}");
    // Not the GPU's figure here: what the two CPUs leave the guests.
    hold(t >= 0.5, || {
        format!("the 1:2:3 mix did {t:.3} of unscheduled")
    })?;
    hold(s[2].got >= 1.8 * s[0].got && s[1].got > s[0].got, || {
        format!("shares not by weight: {s:?}")
    })?;
    let (s, t) = mix_line(line("mix 1 GPU-bound among 7:")?);
    eprintln!("1 among 7 {s:?}, throughput {t:.3}");
    hold(t >= 0.7, || {
        format!("the 1-among-7 mix did {t:.3} of unscheduled")
    })?;
    // The latency-bound guests together: more than beside it unscheduled
    // (exclusive grants left them less).
    let (got, none) = s
        .iter()
        .skip(1)
        .fold((0.0, 0.0), |(g, n), x| (g + x.got, n + x.none));
    hold(got >= 1.2 * none, || {
        format!("the latency-bound guests got {got:.3}, {none:.3} unscheduled: {s:?}")
    })?;
    // The GPU-bound guest: not starved. Its max-min fair share of what the
    // eight together got is at least an equal split of it (the weights are
    // equal and it wants the most). The bench's own max-min share assumes
    // the whole GPU and rests on each kind's demand from a 1 s solo run,
    // which the two CPUs moved 2.4 times between runs (a CI run read it
    // 0.217, then 0.125 here).
    let split = s.iter().map(|x| x.got).sum::<f64>() / s.len() as f64;
    eprintln!(
        "the GPU-bound guest at {:.2} of an equal split, the latency-bound ones at {:.2} of unscheduled",
        s[0].got / split,
        got / none
    );
    hold(s[0].got >= 0.5 * split, || {
        format!(
            "the GPU-bound guest got {:.3}, an equal split of what the eight got {split:.3}",
            s[0].got
        )
    })
}
