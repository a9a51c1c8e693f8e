//! The grant service with real workers' gates over its socket.

use super::*;

const EXCLUSIVE: sched::Sharing = sched::Sharing::Exclusive;
use worker::gate::Gate;

use crate::hostcpu::lift::Holders;

/// A grant service of `slice_ns` slices for one test, its socket in a
/// folder of its own (removed at the test's end); `mps`: its vGPUs are MPS
/// clients (see [`GrantService::start_with`]).
fn service(name: &str, slice_ns: u64, mps: bool) -> (PathBuf, GrantService) {
    let dir = scratch::dir(&format!("fvg-grant-{name}"));
    let policy = sched::DevicePolicy::default();
    let svc = GrantService::start_with(&dir.join("g.sock"), slice_ns, policy, mps).unwrap();
    (dir, svc)
}

/// Waits until `g` holds the grant, for at most 5 s.
fn granted(g: &mut Gate) {
    let t = Instant::now();
    while !g.acquire(Duration::from_millis(1)).unwrap() {
        assert!(t.elapsed() < Duration::from_secs(5), "never granted");
    }
}

/// What the service knows once `done` holds of it, waiting `limit` at most.
fn live_when(
    svc: &GrantService,
    limit: Duration,
    done: impl Fn(&HashMap<u32, VgpuLive>) -> bool,
) -> HashMap<u32, VgpuLive> {
    let t = Instant::now();
    loop {
        let live = svc.live();
        if done(&live) {
            return live;
        }
        assert!(t.elapsed() < limit, "{live:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// vGPU 1 holds the GPU and has heard that vGPU 2 wants it.
fn contended(svc: &GrantService) -> (Gate, Gate) {
    let mut a = Gate::connect(svc.path(), 1, 1.0).unwrap();
    granted(&mut a);
    let mut b = Gate::connect(svc.path(), 2, 1.0).unwrap();
    assert!(!b.acquire(Duration::from_millis(1)).unwrap());
    until_contended(&mut a);
    (a, b)
}

/// A busy worker's turns until `end`: takes the grant whenever it comes,
/// "works" until its slice is over (or `end`: a lone holder's slice is
/// extended), hands it back still wanting it. `turn(true)` as it takes the
/// grant, `turn(false)` as it gives it back. Returns the time it held.
pub(super) fn busy_until(g: &mut Gate, end: Instant, mut turn: impl FnMut(bool)) -> u64 {
    let mut held = 0u64;
    while Instant::now() < end {
        if g.acquire(Duration::from_millis(5)).unwrap() {
            turn(true);
            while !g.slice_over() && Instant::now() < end {
                std::thread::sleep(Duration::from_micros(200));
            }
            turn(false);
            let used = g.held_ns();
            g.release(used, true).unwrap();
            held += used;
        }
    }
    held
}

#[test]
fn grants_follow_weights_between_busy_workers() {
    let (dir, svc) = service("weights", 2_000_000, false);
    let weights = [1.0, 2.0, 3.0];
    // All registered before any asks: a vGPU alone holds the GPU for
    // as long as it is alone, which is no share of anything.
    let all = Arc::new(std::sync::Barrier::new(weights.len()));
    let threads: Vec<_> = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            let (path, all) = (svc.path().to_owned(), all.clone());
            std::thread::spawn(move || {
                let mut g = Gate::connect(&path, u32::try_from(i).unwrap(), w).unwrap();
                all.wait();
                std::thread::sleep(Duration::from_millis(20));
                busy_until(&mut g, Instant::now() + Duration::from_millis(1500), |_| {})
            })
        })
        .collect();
    let held: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let total: u64 = held.iter().sum();
    let x: Vec<f64> = held
        .iter()
        .zip(weights)
        .map(|(&h, w)| h as f64 / total as f64 / (w / 6.0))
        .collect();
    let mmr = x.iter().cloned().fold(f64::MAX, f64::min) / x.iter().cloned().fold(0.0, f64::max);
    assert!(mmr > 0.85, "MMR {mmr}, held {held:?}");
    let usage = svc.usage();
    assert_eq!(usage.len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_heavier_vgpu_is_granted_a_longer_slice_while_a_lighter_one_waits() {
    let (dir, svc) = service("weighted", 2_000_000, false);
    let mut light = Gate::connect(svc.path(), 1, 1.0).unwrap();
    granted(&mut light);
    assert_eq!(light.slice_ns(), 2_000_000, "alone: the base slice");
    let mut heavy = Gate::connect(svc.path(), 2, 3.0).unwrap();
    assert!(!heavy.acquire(Duration::from_millis(1)).unwrap());
    until_contended(&mut light);
    light.release(light.held_ns(), true).unwrap();
    granted(&mut heavy);
    assert_eq!(heavy.slice_ns(), 6_000_000, "three base slices at 3:1");
    heavy.release(heavy.held_ns(), true).unwrap();
    granted(&mut light);
    assert_eq!(light.slice_ns(), 2_000_000);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_forgotten_worker_gives_way_to_its_successor_at_once() {
    let (dir, svc) = service("forget", 2_000_000, false);
    // The old worker, its connection still open (a killed process the
    // driver is still tearing down), idle for now.
    let mut old = Gate::connect(svc.path(), 1, 1.0).unwrap();
    assert!(old.acquire(Duration::from_secs(5)).unwrap());
    old.release(1000, false).unwrap();
    // A second registration of vGPU 1 is refused meanwhile: the GPU is
    // free, yet it gets no grant.
    let mut early = Gate::connect(svc.path(), 1, 1.0).unwrap();
    assert!(
        !early.acquire(Duration::from_millis(300)).unwrap_or(false),
        "two workers of one vGPU registered"
    );
    // The old one holds the grant again when the daemon ends it: once
    // forgotten, its successor registers and gets the GPU at once.
    assert!(old.acquire(Duration::from_secs(5)).unwrap());
    svc.forget(1).unwrap();
    let mut new = Gate::connect(svc.path(), 1, 1.0).unwrap();
    assert!(new.acquire(Duration::from_secs(5)).unwrap());
    assert!(svc.live()[&1].connected);
    new.release(1000, false).unwrap();
    drop(old);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits (5 s at most) until holder `g` has heard that another vGPU waits.
fn until_contended(g: &mut Gate) {
    let t = Instant::now();
    while g.alone() {
        g.extended();
        assert!(t.elapsed() < Duration::from_secs(5), "never contended");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_connection_that_says_nothing_holds_up_no_vgpu() {
    use std::io::Read;
    let (dir, svc) = service("silent", 2_000_000, false);
    let mut silent = UnixStream::connect(svc.path()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // A worker registering after it is served at once.
    let t = Instant::now();
    let mut a = Gate::connect(svc.path(), 1, 1.0).unwrap();
    assert!(a.acquire(Duration::from_secs(5)).unwrap());
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "held up {:?}",
        t.elapsed()
    );
    a.release(1000, false).unwrap();
    // The silent one is refused once its time to say HELLO is over.
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 1];
    assert_eq!(silent.read(&mut b).unwrap(), 0, "closed");
    assert!(t.elapsed() >= HELLO_WAIT - Duration::from_millis(100));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lone_holder_is_extended_until_another_vgpu_wants_the_gpu() {
    let slice = Duration::from_millis(4);
    let (dir, svc) = service("ext", crate::nanos(slice), false);
    let mut lone = Gate::connect(svc.path(), 1, 1.0).unwrap();
    assert!(lone.acquire(Duration::from_secs(5)).unwrap());
    assert!(lone.alone());
    // Five slices' time and its slice has not ended: it was extended.
    let t = Instant::now();
    while t.elapsed() < 5 * slice {
        assert!(!lone.slice_over(), "ended after {:?}", t.elapsed());
        std::thread::sleep(Duration::from_micros(300));
    }
    assert!(lone.extensions() >= 4, "{} extensions", lone.extensions());
    // Another vGPU wants the GPU: the holder hears of it, and its slice
    // ends within the extension it had (at most two slices).
    let mut other = Gate::connect(svc.path(), 2, 1.0).unwrap();
    assert!(!other.acquire(Duration::from_millis(1)).unwrap());
    let t = Instant::now();
    while !lone.slice_over() {
        assert!(
            t.elapsed() < 3 * slice,
            "still not over after {:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_micros(300));
    }
    assert!(!lone.alone());
    let held = lone.held_ns();
    lone.release(held, true).unwrap();
    assert!(other.acquire(Duration::from_secs(5)).unwrap());
    assert!(!other.alone(), "vGPU 1 still wants the GPU");
    // All it held is charged at its release, extensions included.
    std::thread::sleep(Duration::from_millis(20));
    assert!(svc.live()[&1].charged_ns >= 5 * crate::nanos(slice));
    other.release(1000, false).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_grant_after_a_release_while_another_waited_counts_as_a_hand_off() {
    let (dir, svc) = service("handoff", 2_000_000, false);
    let mut a = Gate::connect(svc.path(), 1, 1.0).unwrap();
    assert!(a.acquire(Duration::from_secs(5)).unwrap());
    // A's first grant found the GPU free: no hand-off.
    let mut b = Gate::connect(svc.path(), 2, 1.0).unwrap();
    assert!(!b.acquire(Duration::from_millis(20)).unwrap());
    a.release(1000, false).unwrap();
    assert!(b.acquire(Duration::from_secs(5)).unwrap());
    let live = live_when(&svc, Duration::from_secs(5), |l| l[&2].handoffs == 1);
    assert_eq!(live[&2].handoffs, 1, "{:?}", live[&2]);
    assert_eq!(live[&1].handoffs, 0);
    // The service's own part: it grants in the turn that read the release.
    assert!(live[&2].handoff_ns < 100_000_000, "{:?}", live[&2]);
    b.release(1000, false).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_that_keeps_the_grant_loses_it() {
    let (dir, svc) = service("keep", 2_000_000, false);
    let mut stuck = Gate::connect(svc.path(), 1, 1.0).unwrap();
    assert!(stuck.acquire(Duration::from_secs(5)).unwrap());
    // It never gives the grant back; the other vGPU gets it all the same.
    let mut other = Gate::connect(svc.path(), 2, 1.0).unwrap();
    let t = Instant::now();
    while !other.acquire(Duration::from_millis(100)).unwrap() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the other vGPU waits for ever"
        );
    }
    let live = svc.live();
    assert_eq!(live[&1].revoked, 1);
    assert!(live[&1].charged_ns >= 2_000_000_000, "{:?}", live[&1]);
    // The late release is ignored; the other vGPU keeps its grant.
    stuck.release(1000, false).unwrap();
    other.release(1000, false).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn under_mps_the_next_vgpu_is_granted_as_the_holder_drains() {
    let (dir, svc) = service("overlap", 2_000_000, true);
    let (mut a, mut b) = contended(&svc);
    // Until the holder drains, the other waits; then it holds the GPU
    // while the drainer's last work finishes.
    assert!(!b.acquire(Duration::from_millis(20)).unwrap());
    a.draining().unwrap();
    granted(&mut b);
    // The drainer's release is taken, and charged to it.
    a.release(7_000_000, true).unwrap();
    live_when(&svc, Duration::from_secs(5), |l| {
        l[&1].charged_ns == 7_000_000
    });
    // It is not granted again beside the holder, but after it.
    assert!(!a.acquire(Duration::from_millis(20)).unwrap());
    b.release(1_000_000, false).unwrap();
    granted(&mut a);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn under_mps_a_drainer_that_never_releases_is_charged_and_forgotten() {
    let (dir, svc) = service("drainer", 2_000_000, true);
    let (mut a, mut b) = contended(&svc);
    a.draining().unwrap();
    granted(&mut b);
    b.release(1_000_000, true).unwrap();
    // The drainer's grant is taken back past the hold limit (2 s), charged
    // all it held; its late release changes nothing.
    let live = live_when(&svc, Duration::from_secs(10), |l| l[&1].revoked > 0);
    assert!(live[&1].charged_ns >= 2_000_000_000, "{:?}", live[&1]);
    a.release(1000, false).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(svc.live()[&1].charged_ns, live[&1].charged_ns);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn under_mps_a_holder_granted_beside_a_drainer_keeps_the_gpu_to_its_release() {
    let (dir, svc) = service("drain2", 2_000_000, true);
    let (mut a, mut b) = contended(&svc);
    let mut c = Gate::connect(svc.path(), 3, 1.0).unwrap();
    a.draining().unwrap();
    granted(&mut b);
    // A grant as the holder drains is a hand-off.
    live_when(&svc, Duration::from_secs(5), |l| l[&2].handoffs == 1);
    // One drainer at a time: b's drain hands nothing on while a drains.
    until_contended(&mut b);
    b.draining().unwrap();
    assert!(!c.acquire(Duration::from_millis(50)).unwrap());
    b.release(1_000_000, true).unwrap();
    granted(&mut c);
    a.release(1_000_000, false).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_mps_the_next_vgpu_waits_for_the_release() {
    let (dir, svc) = service("nolap", 2_000_000, false);
    let (mut a, mut b) = contended(&svc);
    a.draining().unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(100) {
        assert!(!b.acquire(Duration::from_millis(1)).unwrap());
    }
    a.release(1_000_000, false).unwrap();
    granted(&mut b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_vcpu_lift_is_told_of_each_change_of_holder_and_only_then() {
    let dir = scratch::dir("fvg-grant-lift");
    let (tx, rx) = std::sync::mpsc::channel();
    let lift = ServiceLift {
        nice: None,
        holders: Some(tx),
        realtime: false,
    };
    let policy = sched::DevicePolicy::default();
    let svc = GrantService::start_lifted(
        &dir.join("g.sock"),
        2_000_000,
        policy,
        false,
        EXCLUSIVE,
        lift,
    )
    .unwrap();
    let next = || rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let t0 = Instant::now();
    let (mut a, mut b) = contended(&svc);
    // vGPU 1 holds, nobody waits; then vGPU 2 waits: the same holder, now
    // with the round's deadline, the real-time lift's bound (at most two
    // slices of 2 ms away: a lone holder's is extended by one whenever
    // less than one is left).
    let first = next();
    assert_eq!((first.vgpus, first.realtime_until), (vec![1], None));
    let waited = next();
    assert_eq!(waited.vgpus, vec![1]);
    let until = waited.realtime_until.expect("another vGPU waits");
    assert!(until > t0 && until <= Instant::now() + Duration::from_millis(4));
    // Nothing more while vGPU 1 holds the GPU, however often the service
    // goes round.
    std::thread::sleep(Duration::from_millis(20));
    assert!(rx.try_recv().is_err());
    let used = a.held_ns();
    a.release(used, false).unwrap();
    granted(&mut b);
    // Released (no holder), then vGPU 2 alone (vGPU 1 wants nothing); the
    // service may have granted within the pass that took the release.
    let mut seen = vec![next()];
    if seen[0].vgpus.is_empty() {
        seen.push(next());
    }
    let last = seen.last().unwrap();
    assert_eq!(
        (&last.vgpus, last.realtime_until),
        (&vec![2], None),
        "{seen:?}"
    );
    let used = b.held_ns();
    b.release(used, false).unwrap();
    assert_eq!(next(), Holders::default());
    drop((a, b, svc));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_claiming_huge_use_saturates_its_charge_and_the_service_serves_on() {
    let (dir, svc) = service("huge", 2_000_000, false);
    let mut g = Gate::connect(svc.path(), 1, 1.0).unwrap();
    for _ in 0..2 {
        granted(&mut g);
        g.release(u64::MAX, true).unwrap();
    }
    let live = live_when(&svc, Duration::from_secs(5), |l| {
        l.get(&1).is_some_and(|v| v.charged_ns == u64::MAX)
    });
    assert_eq!(live[&1].charged_ns, u64::MAX);
    // Still serving: another vGPU gets the GPU.
    let mut other = Gate::connect(svc.path(), 2, 1.0).unwrap();
    granted(&mut other);
    other.release(1000, false).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two workers of one vGPU (a worker per guest process, `group.rs`) are
/// one place in the queue: busy beside another vGPU of the same weight,
/// the other holds the GPU about half the time (as two places it would
/// hold a third; charged the sum of its members' times, two thirds).
#[test]
fn a_vgpus_workers_share_its_place_in_the_queue() {
    let (dir, svc) = service("members", 2_000_000, false);
    let all = Arc::new(std::sync::Barrier::new(3));
    let run = Duration::from_millis(1500);
    let threads: Vec<_> = [(1, true), (1, true), (2, false)]
        .into_iter()
        .map(|(vgpu, member)| {
            let (path, all) = (svc.path().to_owned(), all.clone());
            std::thread::spawn(move || {
                let mut g = if member {
                    Gate::connect_member(&path, vgpu, 1.0).unwrap()
                } else {
                    Gate::connect(&path, vgpu, 1.0).unwrap()
                };
                all.wait();
                std::thread::sleep(Duration::from_millis(20));
                let start = Instant::now();
                let held = busy_until(&mut g, start + run, |_| {});
                held as f64 / crate::nanos(start.elapsed()) as f64
            })
        })
        .collect();
    let share: Vec<f64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        share[0] > 0.2 && share[1] > 0.2,
        "both members granted: {share:?}"
    );
    assert!(
        (0.4..0.6).contains(&share[2]),
        "the other vGPU's share {share:?}"
    );
    let live = svc.live();
    assert_eq!(live.len(), 2, "{live:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
