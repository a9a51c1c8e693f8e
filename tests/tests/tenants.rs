//! Hierarchical weights on a real daemon (sim executor): tenant acme
//! (weight 1) has two VMs weighted 1:3 within it, tenant solo (weight 1)
//! one VM. All busy, the GPU splits 1/8 : 3/8 : 1/2 (flat VM weights 1:3:1
//! would give 1/5 : 3/5 : 1/5). When acme's big VM goes idle, its small one
//! takes all of acme's half.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::fixture::{DaemonProc, VmSpec};
use daemon::config::ExecutorKind;
use tests::{cargo_build, spin_guest};

/// Waits until the shares of `names` are within `tol` of `want`.
fn wait_shares(d: &DaemonProc, names: &[&str], want: &[f64], tol: f64) -> Vec<f64> {
    let t = Instant::now();
    let mut got = Vec::new();
    while t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        got = names
            .iter()
            .map(|n| d.vgpu(n).unwrap()["share"].as_f64().unwrap_or(0.0))
            .collect();
        if got.iter().zip(want).all(|(g, w)| (g - w).abs() <= tol) {
            return got;
        }
    }
    panic!("shares {got:?} never came within {tol} of {want:?}");
}

#[test]
fn a_tenant_weight_is_split_among_its_vms() {
    let bin = cargo_build("cli").join("fairvgpu");
    let vm = |name: &str, weight: f64, tenant: &str| VmSpec {
        name: name.into(),
        weight,
        memory_limit_mib: 256,
        tenant: Some(tenant.into()),
        corun: false,
        process_slots: daemon::config::DEFAULT_PROCESS_SLOTS,
        gpu: None,
    };
    let vms = [
        vm("small", 1.0, "acme"),
        vm("big", 3.0, "acme"),
        vm("other", 1.0, "solo"),
    ];
    let tenants =
        "\n[[tenant]]\nname = \"acme\"\nweight = 1\n\n[[tenant]]\nname = \"solo\"\nweight = 1\n";
    let d = DaemonProc::start_with(&bin, "tenants", ExecutorKind::Sim, &vms, tenants).unwrap();
    let stop_all = Arc::new(AtomicBool::new(false));
    let stop_big = Arc::new(AtomicBool::new(false));
    let guests = [
        spin_guest(
            d.socket("small"),
            2_000_000,
            8,
            stop_all.clone(),
            Arc::default(),
        ),
        spin_guest(
            d.socket("big"),
            2_000_000,
            8,
            stop_big.clone(),
            Arc::default(),
        ),
        spin_guest(
            d.socket("other"),
            2_000_000,
            8,
            stop_all.clone(),
            Arc::default(),
        ),
    ];
    let names = ["small", "big", "other"];
    wait_shares(&d, &names, &[0.125, 0.375, 0.5], 0.05);
    let v = d.vgpu("big").unwrap();
    assert_eq!(v["effective_weight"], 0.75, "{v}");
    // The monitor: one-thread kernels occupy a sliver of the 132 SMs.
    let occ = v["occupancy"].as_f64().unwrap();
    assert!(occ > 0.0 && occ < 0.01, "{v}");
    // Always wanting the GPU: its demand is (nearly) the whole window.
    assert!(v["demand"].as_f64().unwrap() > 0.5, "{v}");
    assert!((v["entitlement"].as_f64().unwrap() - 0.375).abs() < 1e-9);

    // acme's big VM idles: the small one gets acme's half (a split fixed at
    // configuration time would leave it 0.125 / 0.625 = 1/5).
    stop_big.store(true, Ordering::Relaxed);
    wait_shares(&d, &["small", "other"], &[0.5, 0.5], 0.05);
    stop_all.store(true, Ordering::Relaxed);
    for g in guests {
        g.join().unwrap();
    }
}
