//! Worker faults under a real `fairvgpu serve` (sim executor), two VMs: a
//! guest's kernel fault poisons its vGPU's worker, then that worker is
//! killed outright. Each time the daemon restarts the worker on the same
//! region, the VM's guests get `VgpuReset` and recover by opening the GPU
//! again, and the other VM's guest runs on, checked element by element,
//! without one error. (The same scenario is `fairvgpu bench recovery`,
//! which runs it on a real GPU with `--executor cuda`.)

use fairvgpu_tests::cargo_build;
use host_backend::bench::recovery::measure;
use host_backend::config::ExecutorKind;

#[test]
fn poisoned_or_killed_worker_is_replaced_and_only_its_guests_see_it() {
    let bin = cargo_build("fairvgpu").join("fairvgpu");
    let r = measure(&bin, ExecutorKind::Sim).expect("scenario runs");
    assert_eq!(r.fault, "IllegalAddress");
    assert!(r.reset_seen, "vm1's guests were told VgpuReset");
    assert_eq!(r.restarts, (2, 0), "vm1 restarted twice, vm2 never");
    assert_eq!(
        r.other_errors, 0,
        "vm2 undisturbed: {:?}",
        r.other_first_error
    );
    assert!(
        r.other_rounds_during_restarts > 0,
        "vm2 ran during the restarts"
    );
    assert_eq!(r.leaked_bytes, 0, "vm1's memory freed");
}
