//! `fairvgpu bench hostile`: one VM under every kind of guest abuse at once
//! while the guests of two other VMs on the same daemon run, checked.
//!
//! The daemon serves three VMs on one GPU: `evil`, `good1` and `good2`. In
//! each good VM a long-lived guest runs checked vector adds back to back,
//! and new guest processes start one after another, each attaching, running
//! one checked vector add and leaving (a new process must get going however
//! the other VMs behave). The run has two phases of `--seconds` each: a
//! baseline without abuse, then the same with a hostile process attached to
//! `evil`'s socket ([`abuse`]): random words anywhere in the region, forged
//! claim states, ring indices past the ring, published descriptors with
//! out-of-range offsets and lengths, arena garbage, header rewrites, a flood
//! of the host's doorbells, a session sending refused requests, and
//! connections made and dropped (half of them kept open and never read).
//!
//! The last line: `good_runs=… good_failures=… good_p99_ms=… good_max_ms=…
//! baseline_max_ms=… log_lines_per_min=… daemon_alive=…`, latencies being
//! the good guests' rounds (a long-lived guest's vector add; a new
//! process's attach and vector add, as the process times it), and the log
//! lines those the daemon and its workers wrote during the abuse, at the
//! daemon's default level (`info`).

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use guest::Gpu;
use protocol::Request;
use transport::layout::{ctl, desc, hdr, ringctl, Direction, DESC_SIZE, HEADER_SIZE};
use transport::server::{recv_msg, HOST_PEER, PROTOCOL_VERSION};
use transport::{Bell, EventFdBell, Region, SpinPolicy};

use super::fixture::{DaemonProc, VmSpec};
use super::percentile;
use daemon::config::ExecutorKind;

const SPIN: SpinPolicy = SpinPolicy {
    spins: 2_000,
    max_block_us: 2_000,
};
/// A new good process that has not finished by then has hung.
const PROCESS_TIMEOUT: Duration = Duration::from_secs(10);
const GOOD_VMS: [&str; 2] = ["good1", "good2"];
/// Connections the hostile process keeps open without ever reading them.
const HELD_OPEN: usize = 32;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn u32(&mut self) -> u32 {
        self.next() as u32
    }
}

/// What the good guests of one phase saw.
#[derive(Debug, Default)]
pub struct Tally {
    /// Round latencies, µs, sorted.
    pub lat_us: Vec<u64>,
    /// Rounds run (a long-lived guest's vector add, or a new process).
    pub runs: u64,
    /// Rounds that failed: an error, a wrong result, a hang.
    pub failures: u64,
    /// The first failure.
    pub first_failure: Option<String>,
}

impl Tally {
    /// The worst round, ms.
    pub fn max_ms(&self) -> f64 {
        ms(self.lat_us.last().copied().unwrap_or(0))
    }

    /// A percentile of the rounds, ms.
    pub fn pct_ms(&self, p: f64) -> f64 {
        ms(percentile(&self.lat_us, p))
    }

    fn ok(&mut self, us: u64) {
        self.runs += 1;
        self.lat_us.push(us);
    }
    fn fail(&mut self, what: String) {
        self.runs += 1;
        self.failures += 1;
        self.first_failure.get_or_insert(what);
    }
}

type Shared = Arc<Mutex<Tally>>;

fn record(t: &Shared, r: Result<u64, String>) {
    let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
    match r {
        Ok(us) => t.ok(us),
        Err(e) => t.fail(e),
    }
}

/// `fairvgpu __good-guest`: attaches, runs one checked vector add, prints
/// how long that took (`us=…`).
pub fn good_guest(socket: &Path) -> Result<()> {
    let t = Instant::now();
    let mut gpu = Gpu::connect_with(socket, SPIN).context("attaching")?;
    super::recovery::vector_add(&mut gpu, 2.0).context("vector add")?;
    println!("us={}", t.elapsed().as_micros());
    Ok(())
}

/// Runs one new good process to its end; its time, or why it failed.
fn one_process(bin: &Path, socket: &Path) -> Result<u64, String> {
    let mut child: Child = Command::new(bin)
        .arg("__good-guest")
        .arg("--socket")
        .arg(socket)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning a good guest: {e}"))?;
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => {
                let mut out = String::new();
                if let Some(mut o) = child.stdout.take() {
                    let _ = std::io::Read::read_to_string(&mut o, &mut out);
                }
                if !st.success() {
                    return Err(format!("a new good process failed ({st})"));
                }
                return out
                    .trim()
                    .strip_prefix("us=")
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("a new good process printed {out:?}"));
            }
            Ok(None) if t.elapsed() > PROCESS_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("a new good process hung past {PROCESS_TIMEOUT:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(format!("waiting for a good guest: {e}")),
        }
    }
}

/// The good load of one phase: per good VM a long-lived guest and a stream
/// of new processes, until `stop`.
fn good_load(
    bin: &Path,
    sockets: &[PathBuf],
    stop: &Arc<AtomicBool>,
    tally: &Shared,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    for s in sockets {
        let (s1, stop1, t1) = (s.clone(), stop.clone(), tally.clone());
        threads.push(std::thread::spawn(move || {
            let mut gpu: Option<Gpu> = None;
            let mut seed = 0.0;
            while !stop1.load(Ordering::Relaxed) {
                let t = Instant::now();
                let g = match gpu.as_mut() {
                    Some(g) => g,
                    None => match Gpu::connect_with(&s1, SPIN) {
                        Ok(g) => gpu.insert(g),
                        Err(e) => {
                            record(&t1, Err(format!("long-lived guest attaching: {e}")));
                            std::thread::sleep(Duration::from_millis(100));
                            continue;
                        }
                    },
                };
                seed += 1.0;
                match super::recovery::vector_add(g, seed) {
                    Ok(()) => record(&t1, Ok(t.elapsed().as_micros() as u64)),
                    Err(e) => {
                        record(&t1, Err(format!("long-lived guest: {e}")));
                        gpu = None;
                    }
                }
            }
        }));
        let (bin, s2, stop2, t2) = (bin.to_owned(), s.clone(), stop.clone(), tally.clone());
        threads.push(std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                record(&t2, one_process(&bin, &s2));
            }
        }));
    }
    threads
}

/// Runs the good load for `secs`.
fn phase(bin: &Path, sockets: &[PathBuf], secs: f64) -> Tally {
    let stop = Arc::new(AtomicBool::new(false));
    let tally: Shared = Arc::default();
    let threads = good_load(bin, sockets, &stop, &tally);
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let mut t = std::mem::take(&mut *tally.lock().unwrap_or_else(|e| e.into_inner()));
    t.lat_us.sort_unstable();
    t
}

fn ms(us: u64) -> f64 {
    us as f64 / 1e3
}

/// What [`measure`] found.
#[derive(Debug)]
pub struct Report {
    /// The good guests without abuse.
    pub baseline: Tally,
    /// The good guests while `evil` was abused.
    pub abuse: Tally,
    /// Lines the daemon and its workers logged during the abuse.
    pub log_lines: u64,
    /// How long the abuse lasted, minutes.
    pub abuse_minutes: f64,
    /// Whether the daemon was still running at the end.
    pub daemon_alive: bool,
    /// `evil`'s entry in the daemon's status at the end.
    pub evil: serde_json::Value,
}

/// Runs the scenario against `bin serve` with `executor`: `baseline_s`
/// seconds without abuse (none if 0), then `abuse_s` with it. The daemon's
/// log is copied to `keep_log` if given.
pub fn measure(
    bin: &Path,
    executor: ExecutorKind,
    baseline_s: f64,
    abuse_s: f64,
    keep_log: Option<&Path>,
) -> Result<Report> {
    let mut vms = vec![VmSpec::new("evil", 1024)];
    vms.extend(GOOD_VMS.iter().map(|n| VmSpec::new(n, 1024)));
    let mut d = DaemonProc::start_logged(bin, "hostile", executor, &vms, "info")?;
    let sockets: Vec<PathBuf> = GOOD_VMS.iter().map(|n| d.socket(n)).collect();
    let baseline = if baseline_s > 0.0 {
        phase(bin, &sockets, baseline_s)
    } else {
        Tally::default()
    };
    let lines0 = d.log_lines();
    let t0 = Instant::now();
    let mut evil = Command::new(bin)
        .arg("__hostile-guest")
        .arg("--socket")
        .arg(d.socket("evil"))
        .args(["--seconds", &format!("{}", abuse_s + 1.0)])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the hostile process")?;
    // Let the abuse get going before the good guests are measured.
    std::thread::sleep(Duration::from_millis(500));
    let abuse = phase(bin, &sockets, abuse_s);
    let _ = evil.kill();
    let _ = evil.wait();
    let abuse_minutes = t0.elapsed().as_secs_f64() / 60.0;
    let log_lines = d.log_lines().saturating_sub(lines0);
    let daemon_alive = d.alive();
    // Reports reach the status every 200 ms.
    std::thread::sleep(Duration::from_millis(500));
    let evil = d.vgpu("evil").unwrap_or_default();
    if let Some(p) = keep_log {
        std::fs::copy(d.log_path(), p)
            .with_context(|| format!("copying the log to {}", p.display()))?;
    }
    Ok(Report {
        baseline,
        abuse,
        log_lines,
        abuse_minutes,
        daemon_alive,
        evil,
    })
}

/// `fairvgpu bench hostile --seconds S`: prints the report; fails if a good
/// guest failed or the daemon died.
pub fn run(executor: ExecutorKind, seconds: f64, keep_log: Option<&Path>) -> Result<()> {
    let bin = std::env::current_exe()?;
    println!(
        "hostile ({executor:?} executor): {seconds} s without abuse, then {seconds} s with a hostile process on evil's socket; in good1 and good2 a long-lived guest and new processes run checked vector adds"
    );
    let r = measure(&bin, executor, seconds, seconds, keep_log)?;
    let (base, hot) = (&r.baseline, &r.abuse);
    for (what, t) in [("baseline", base), ("abuse", hot)] {
        println!(
            "{what}: runs={} failures={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2}",
            t.runs,
            t.failures,
            t.pct_ms(50.0),
            t.pct_ms(99.0),
            t.max_ms(),
        );
        if let Some(e) = &t.first_failure {
            println!("{what}: first failure: {e}");
        }
    }
    println!(
        "evil: gpu_seconds={:.3} requests={} worker_faults={} log_lines_suppressed={} grants_revoked={} refused={} contexts_created={} contexts_reused={}",
        r.evil["gpu_seconds"].as_f64().unwrap_or(0.0),
        r.evil["requests"].as_u64().unwrap_or(0),
        r.evil["worker_faults"].as_u64().unwrap_or(0),
        r.evil["log_lines_suppressed"].as_u64().unwrap_or(0),
        r.evil["grants_revoked"].as_u64().unwrap_or(0),
        r.evil["refused"].as_u64().unwrap_or(0),
        r.evil["contexts_created"].as_u64().unwrap_or(0),
        r.evil["contexts_reused"].as_u64().unwrap_or(0),
    );
    println!(
        "good_runs={} good_failures={} good_p99_ms={:.2} good_max_ms={:.2} baseline_max_ms={:.2} log_lines_per_min={:.0} daemon_alive={}",
        hot.runs,
        hot.failures + base.failures,
        hot.pct_ms(99.0),
        hot.max_ms(),
        base.max_ms(),
        r.log_lines as f64 / r.abuse_minutes.max(1e-9),
        u8::from(r.daemon_alive),
    );
    if !r.daemon_alive || hot.failures + base.failures > 0 {
        bail!("the good VMs were disturbed");
    }
    Ok(())
}

/// A connection to the ivshmem server that, after its first messages, is
/// never read again.
struct RawPeer {
    _stream: UnixStream,
    shm: Option<OwnedFd>,
    host_bells: Vec<EventFdBell>,
}

impl RawPeer {
    /// Connects and reads up to and including the host's bells (`vectors`
    /// of them) when `read` is set; otherwise reads nothing at all.
    fn connect(path: &Path, read: bool) -> Result<RawPeer> {
        let stream = UnixStream::connect(path)?;
        let mut p = RawPeer {
            _stream: stream,
            shm: None,
            host_bells: Vec::new(),
        };
        if !read {
            return Ok(p);
        }
        p._stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let next =
            || -> Result<(i64, Option<OwnedFd>)> { recv_msg(&p._stream)?.context("server closed") };
        let (v, _) = next()?;
        if v != PROTOCOL_VERSION {
            bail!("server speaks {v}");
        }
        let _id = next()?;
        let (_, shm) = next()?;
        let shm = shm.context("no region fd")?;
        let region = Region::open(shm.try_clone()?)?;
        let vectors = region.layout().params.vectors as usize;
        let mut host_bells = Vec::new();
        while host_bells.len() < vectors {
            if let (p, Some(fd)) = next()? {
                if p == i64::from(HOST_PEER) {
                    host_bells.push(EventFdBell::from_fd(fd));
                }
            }
        }
        p.shm = Some(shm);
        p.host_bells = host_bells;
        Ok(p)
    }
}

/// `fairvgpu __hostile-guest`: every kind of abuse at once against the VM
/// of `socket`, for `seconds`.
pub fn abuse(socket: &Path, seconds: f64, seed: u64) -> Result<()> {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut first = RawPeer::connect(socket, true)?;
    let region = Region::open(first.shm.take().context("region")?)?;
    let bells = std::mem::take(&mut first.host_bells);
    let done = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    {
        // One busy thread does the region's abuse and the socket's, turn
        // about: a VM with one vCPU. (More busy threads on a 2-core machine
        // measure how the CPUs are shared, not isolation.)
        let (region, done, ops, socket) =
            (region.clone(), done.clone(), ops.clone(), socket.to_owned());
        threads.push(std::thread::spawn(move || {
            let mut churn = Churn::new(seed ^ 0x55);
            let mut rng = Rng(seed | 1);
            while !done.load(Ordering::Relaxed) {
                scribble(&region, &bells, &mut rng);
                churn.step(&socket);
                ops.fetch_add(64, Ordering::Relaxed);
            }
        }));
    }
    {
        let (socket, done) = (socket.to_owned(), done.clone());
        // Sessions that send refused requests, a call a millisecond; their
        // channels are scribbled on too, so calls may hang: the thread is
        // not waited for.
        std::thread::spawn(move || refused_requests(&socket, &done));
    }
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    done.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    println!("hostile: {} region writes", ops.load(Ordering::Relaxed));
    drop(first);
    Ok(())
}

fn raw(region: &Region, off: usize, v: u32) {
    let off = off & !3;
    if off + 4 <= region.layout().region_size {
        region.raw_u32_for_tests(off).store(v, Ordering::Release);
    }
}

/// One batch of 64 writes of every kind to the region (and its doorbells).
fn scribble(region: &Region, bells: &[EventFdBell], rng: &mut Rng) {
    let l = *region.layout();
    let chans = l.params.channels;
    let entries = l.params.ring_entries as usize;
    let arena = l.params.arena_size as usize;
    {
        for _ in 0..64 {
            let ch = rng.below(u64::from(chans)) as u32;
            let base = l.channel_offset(ch);
            let up = l.ring_parts(Direction::ToHost);
            let down = l.ring_parts(Direction::ToGuest);
            match rng.below(10) {
                // Random words anywhere in the region.
                0 => raw(region, rng.below(l.region_size as u64) as usize, rng.u32()),
                // Forged claim states, owners and vectors.
                1 => {
                    let st = match rng.below(4) {
                        0 => rng.u32(),
                        _ => rng.below(6) as u32,
                    };
                    raw(region, base + ctl::OWNER_PEER, rng.below(8) as u32);
                    raw(region, base + ctl::GUEST_VECTOR, rng.u32());
                    raw(region, base + ctl::OWNER_PID, rng.u32());
                    raw(region, base + ctl::STATE, st);
                }
                // Ring indices past the ring, either way.
                2 => {
                    let (r, f) = match rng.below(3) {
                        0 => (up.ctl, ringctl::HEAD),
                        1 => (down.ctl, ringctl::TAIL),
                        _ => (down.ctl, ringctl::RELEASED),
                    };
                    raw(region, base + r + f, rng.u32());
                }
                // Descriptors with out-of-range offsets and lengths, published.
                3 | 4 => {
                    let head_off = base + up.ctl + ringctl::HEAD;
                    let head = region.raw_u32_for_tests(head_off).load(Ordering::Acquire);
                    let slot = base + up.descs + (head as usize % entries) * DESC_SIZE;
                    raw(region, slot + desc::OPCODE, rng.below(80) as u32);
                    raw(region, slot + desc::DATA_OFF, rng.u32());
                    raw(region, slot + desc::DATA_LEN, rng.u32());
                    raw(region, slot + desc::DATA_END, rng.u32());
                    raw(region, slot + desc::FLAGS, rng.u32());
                    for i in 0..4 {
                        raw(region, slot + desc::INLINE + 4 * i, rng.u32());
                    }
                    raw(region, head_off, head.wrapping_add(1));
                }
                // Arena garbage.
                5 => {
                    let a = base + up.arena + rng.below(arena as u64) as usize;
                    for i in 0..16 {
                        raw(region, a + 4 * i, rng.u32());
                    }
                }
                // Header rewrites.
                6 => {
                    let f = [
                        hdr::MAGIC,
                        hdr::VERSION,
                        hdr::CHANNELS,
                        hdr::RING_ENTRIES,
                        hdr::ARENA_SIZE,
                        hdr::REGION_SIZE,
                        hdr::HOST_SLEEPING,
                    ];
                    let off = if rng.below(2) == 0 {
                        f[rng.below(f.len() as u64) as usize]
                    } else {
                        rng.below(HEADER_SIZE as u64) as usize
                    };
                    raw(region, off, rng.u32());
                }
                // A claim taken the honest way, then a Hello (a session).
                7 => {
                    if let Ok(mut g) = region.claim(1, std::process::id(), 0) {
                        let hello = Request::Hello {
                            version: protocol::PROTOCOL_VERSION,
                        };
                        let _ = g.req.try_send(&guest::descriptor(&hello, 1), &[]);
                        // Left claimed: the host serves it until it is scribbled over.
                        std::mem::forget(g);
                    }
                }
                // Doorbells.
                _ => {
                    for b in bells {
                        for _ in 0..8 {
                            let _ = b.ring();
                        }
                    }
                }
            }
        }
    }
}

/// Connects and drops the socket over and over; half the connections are
/// kept open (up to [`HELD_OPEN`]) and never read.
struct Churn {
    rng: Rng,
    held: std::collections::VecDeque<RawPeer>,
}

impl Churn {
    fn new(seed: u64) -> Churn {
        Churn {
            rng: Rng(seed | 1),
            held: Default::default(),
        }
    }

    fn step(&mut self, socket: &Path) {
        if let Ok(p) = RawPeer::connect(socket, false) {
            if self.rng.below(2) == 0 {
                self.held.push_back(p);
                if self.held.len() > HELD_OPEN {
                    self.held.pop_front();
                }
            }
        }
    }
}

/// Sessions that send requests the host refuses (bad handles, bad
/// pointers), opened again whenever the channel breaks.
fn refused_requests(socket: &Path, done: &AtomicBool) {
    while !done.load(Ordering::Relaxed) {
        let Ok(mut g) = Gpu::connect_with(socket, SPIN) else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        for i in 0..1000u64 {
            if done.load(Ordering::Relaxed) {
                return;
            }
            let r = match i % 3 {
                0 => g.mem_free(0xdead_0000 + i).map(|_| ()),
                1 => g.mem_alloc(u64::MAX / 2).map(|_| ()),
                _ => g.module_unload(0x1234 + i).map(|_| ()),
            };
            if matches!(
                r,
                Err(guest::GuestError::Transport(_))
                    | Err(guest::GuestError::VgpuReset)
                    | Err(guest::GuestError::Protocol(_))
            ) {
                break;
            }
        }
    }
}
