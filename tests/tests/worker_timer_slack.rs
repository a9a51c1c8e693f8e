//! A worker's serving thread asks the kernel for a timer slack of
//! `worker::serve::TIMER_SLACK_NS` (1 us): its sleeps between looks at
//! work on the device end when asked, not up to 50 us later (the default),
//! so a guest waiting on a long kernel or copy learns of its end sooner
//! (`results/2026-11-26-h100-worker-timer-slack.md`). Read back from
//! `/proc` for the serving thread of a sim worker.

use std::time::{Duration, Instant};

use worker::executor::sim::SimExecutor;
use worker::serve::{spawn, WorkerConfig, TIMER_SLACK_NS};

/// The timer slack of this process's thread named `name`, if there is one.
fn slack_of(name: &str) -> Option<u64> {
    let tid = tests::own_thread(name)?;
    std::fs::read_to_string(format!("/proc/{tid}/timerslack_ns"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[test]
fn the_serving_thread_sleeps_with_a_timer_slack_of_one_microsecond() {
    assert_eq!(TIMER_SLACK_NS, 1_000);
    // This process's main thread keeps the default: the setting is the
    // serving thread's own.
    let main = std::fs::read_to_string("/proc/self/timerslack_ns").unwrap();
    let dir = scratch::dir("timer-slack");
    let wc = WorkerConfig::new(
        "slack",
        dir.join("vm.sock"),
        bench::fairness::GUEST_LAYOUT,
        1 << 30,
    );
    let w = spawn(&wc, Box::new(SimExecutor::new(Default::default()))).unwrap();
    // The serving thread sets it as its loop starts, after `spawn` returns.
    let t = Instant::now();
    let mut seen = slack_of("worker-slack");
    while seen != Some(TIMER_SLACK_NS) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
        seen = slack_of("worker-slack");
    }
    assert_eq!(
        seen,
        Some(TIMER_SLACK_NS),
        "the serving thread's timer slack"
    );
    assert_ne!(
        main.trim().parse::<u64>().unwrap(),
        TIMER_SLACK_NS,
        "the main thread keeps the default"
    );
    w.shutdown().unwrap();
}
