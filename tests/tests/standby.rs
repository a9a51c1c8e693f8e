//! A standby worker (`daemon::mps`, `Worker::standby`) on the sim
//! executor, driven as the daemon drives it: it maps and registers the VM's
//! region while the serving worker's guest goes on undisturbed, makes its
//! contexts, says it is ready; when the serving worker has ended and the
//! standby is promoted, the guest is told `VgpuReset`, opens the GPU again
//! and computes through the standby, which made no context after its
//! promotion.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use daemon::link::VmHost;
use guest::{Gpu, GuestError};
use tests::TEST_SPIN;
use transport::LayoutParams;
use worker::executor::sim::SimExecutor;
use worker::serve::{Worker, WorkerConfig};

/// The tests' worker with a 4 MiB pinned pool and two contexts made ahead.
fn config(socket: std::path::PathBuf) -> WorkerConfig {
    let cfg = tests::worker_config("standby", socket, 1 << 30);
    WorkerConfig {
        layout: LayoutParams {
            pinned_size: 4 << 20,
            ..cfg.layout
        },
        prefill_contexts: 2,
        ..cfg
    }
}

/// Writes `v` to fresh device memory and reads it back.
fn round_trip(gpu: &mut Gpu, v: u8) -> Result<Vec<u8>, GuestError> {
    let p = gpu.mem_alloc(4096)?;
    gpu.memcpy_htod(p, &[v; 4096])?;
    let mut out = vec![0u8; 4096];
    gpu.memcpy_dtoh(&mut out, p, 0)?;
    gpu.mem_free(p)?;
    Ok(out)
}

#[test]
fn a_standby_worker_takes_over_its_vms_region_at_once() {
    let dir = scratch::dir("fvg-standby");
    let sock = dir.join("vm.sock");
    let cfg = config(sock.clone());
    let host = VmHost::start("standby", &sock, cfg.layout).unwrap();
    let exec = Box::new(SimExecutor::new(Default::default()));
    let serving = Worker::adopt(&cfg, exec, host.feed().unwrap()).unwrap();
    let stop_serving = serving.stop_flag();
    let serving = std::thread::spawn(move || serving.run());
    let mut gpu = Gpu::connect_with(&sock, TEST_SPIN).expect("guest attaches");
    assert_eq!(round_trip(&mut gpu, 1).unwrap(), vec![1; 4096]);

    // The standby prepares beside it and says it is ready.
    let feed = host.standby_feed().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let standby_cfg = cfg.clone();
    let standby = std::thread::spawn(move || {
        let exec = Box::new(SimExecutor::new(Default::default()));
        let w = Worker::standby(&standby_cfg, exec, feed, false)?;
        let _ = tx.send((w.stop_flag(), w.stats()));
        w.run()
    });
    let t = Instant::now();
    while !host.standby_ready() {
        assert!(t.elapsed() < Duration::from_secs(10), "standby not ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Meanwhile the guest computes through the serving worker as before.
    for v in 2..20 {
        assert_eq!(round_trip(&mut gpu, v).unwrap(), vec![v; 4096]);
    }
    assert!(
        rx.try_recv().is_err(),
        "the standby serves only once promoted"
    );

    // The serving worker ends; the standby takes over.
    stop_serving.store(true, Ordering::Relaxed);
    serving.join().unwrap().unwrap();
    host.promote(None).unwrap();
    let (stop_standby, stats) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let created = stats.contexts_created.load(Ordering::Relaxed);
    assert_eq!(created, 2, "both contexts made ahead");
    let r = round_trip(&mut gpu, 30);
    assert!(matches!(r, Err(GuestError::VgpuReset)), "{:?}", r.err());
    drop(gpu);
    let mut gpu = Gpu::connect_with(&sock, TEST_SPIN).expect("guest attaches again");
    assert_eq!(round_trip(&mut gpu, 31).unwrap(), vec![31; 4096]);
    assert_eq!(
        stats.contexts_created.load(Ordering::Relaxed),
        created,
        "no context made after the promotion"
    );
    drop(gpu);
    stop_standby.store(true, Ordering::Relaxed);
    standby.join().unwrap().unwrap();
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}
