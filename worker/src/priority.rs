//! GPU-centric coscheduling, the host's half: when the worker wakes a guest
//! that blocked waiting for a reply, the doorbell it rings is the guest's
//! vCPU-affine vector (the guest wrote it before sleeping), so the MSI-X
//! interrupt lands on the vCPU that waits. For a CPU-GPU interactive vGPU
//! (more than 10 synchronous calls per 10 ms) the worker also gives that
//! vCPU's host thread a short priority boost, so that the host scheduler
//! runs it now rather than at its next turn.
//!
//! The vCPU thread ids come from QMP `query-cpus-fast` (`fairvgpu attach`),
//! through the daemon, in `<run_dir>/<vm>.vcpus`. Lowering a nice value needs
//! CAP_SYS_NICE; where the host does not allow it the boost turns itself
//! off (once, with a log line) and the doorbell alone remains.

use nix::errno::Errno;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

/// How much a kicked vCPU thread is boosted (nice levels).
pub const BOOST_NICE: i32 = 5;
/// How long a boost lasts at least (it is undone at the worker's next look
/// at the clock after this).
pub const BOOST_FOR: Duration = Duration::from_millis(1);
/// How often the vCPU file is looked at.
const REFRESH_EVERY: Duration = Duration::from_millis(200);

/// A VM's vCPU threads and the one boost in flight.
#[derive(Debug)]
pub struct VcpuBooster {
    file: Option<PathBuf>,
    mtime: Option<SystemTime>,
    last_refresh: Option<Instant>,
    last_sync_calls: u64,
    threads: Vec<u32>,
    /// (thread, its nice before the boost, when boosted).
    boosted: Option<(u32, i32, Instant)>,
    enabled: bool,
    /// Whether the vGPU is CPU-GPU interactive (set from the call rate).
    pub interactive: bool,
    /// Kicks of a known vCPU thread.
    pub kicks: u64,
    /// Boosts applied.
    pub boosts: u64,
}

impl VcpuBooster {
    /// A booster reading its threads from `file` (None: no VM, no boost).
    pub fn new(file: Option<PathBuf>) -> VcpuBooster {
        VcpuBooster {
            file,
            mtime: None,
            last_refresh: None,
            last_sync_calls: 0,
            threads: Vec::new(),
            boosted: None,
            enabled: true,
            interactive: false,
            kicks: 0,
            boosts: 0,
        }
    }

    /// The same with kicks off if not `kick`: the vCPU threads are read,
    /// never boosted (where the vCPU lift owns their nice values).
    pub fn with_kicks(mut self, kick: bool) -> VcpuBooster {
        self.enabled &= kick;
        self
    }

    /// The vCPU threads known now.
    pub fn threads(&self) -> &[u32] {
        &self.threads
    }

    /// Undoes a boost that has lasted [`BOOST_FOR`]; every 200 ms, re-reads
    /// the vCPU file if it changed and classifies the vGPU from its count of
    /// synchronous calls so far (FairGV: interactive above 10 per 10 ms).
    pub fn tick(&mut self, sync_calls: u64) {
        if let Some((tid, nice, at)) = self.boosted {
            if at.elapsed() >= BOOST_FOR {
                set_nice(tid, nice);
                self.boosted = None;
            }
        }
        let Some(file) = &self.file else { return };
        let since = self.last_refresh.map(|t| t.elapsed());
        if since.is_some_and(|d| d < REFRESH_EVERY) {
            return;
        }
        if let Some(d) = since {
            let rate = sync_calls.saturating_sub(self.last_sync_calls) as f64 / d.as_secs_f64();
            self.interactive = rate > sched::classify::INTERACTIVE_SYNC_PER_SECOND;
        }
        self.last_sync_calls = sync_calls;
        self.last_refresh = Some(Instant::now());
        let mtime = std::fs::metadata(file).and_then(|m| m.modified()).ok();
        if mtime != self.mtime {
            self.mtime = mtime;
            self.threads = wire::vcpus::read_vcpus(file);
            tracing::info!(threads = ?self.threads, "vCPU threads for coscheduling");
        }
    }

    /// The worker rang vector `vcpu` of a sleeping guest.
    pub fn kick(&mut self, vcpu: u32) {
        let Some(&tid) = self.threads.get(vcpu as usize) else {
            return;
        };
        self.kicks += 1;
        if !self.enabled || !self.interactive {
            return;
        }
        if let Some((old, nice, _)) = self.boosted.take() {
            set_nice(old, nice);
        }
        let Some(nice) = get_nice(tid) else { return };
        let boosted = (nice - BOOST_NICE).max(-20);
        if boosted == nice {
            return;
        }
        match try_set_nice(tid, boosted) {
            Ok(()) => {
                self.boosts += 1;
                self.boosted = Some((tid, nice, Instant::now()));
            }
            Err(e) => {
                self.enabled = false;
                tracing::info!(
                    "vCPU priority boost not permitted ({e}); coscheduling kicks by doorbell only"
                );
            }
        }
    }
}

impl Drop for VcpuBooster {
    fn drop(&mut self) {
        if let Some((tid, nice, _)) = self.boosted.take() {
            set_nice(tid, nice);
        }
    }
}

/// The most threads whose waits for a CPU [`run_delays`] reads: a VM with
/// more vCPUs is not looked at (its late guests get the allowance alone).
pub const MAX_RUN_DELAY_THREADS: usize = 16;

/// How long each of threads `tids` has waited on a run queue for a CPU so
/// far (ns, `/proc/<tid>/schedstat`'s second field), in their order;
/// `None` for more than [`MAX_RUN_DELAY_THREADS`] threads or none, or a
/// thread not readable (gone, or a kernel without schedstats).
pub fn run_delays(tids: &[u32]) -> Option<Vec<(u32, u64)>> {
    if tids.is_empty() || tids.len() > MAX_RUN_DELAY_THREADS {
        return None;
    }
    tids.iter()
        .map(|&t| {
            let s = std::fs::read_to_string(format!("/proc/{t}/schedstat")).ok()?;
            Some((t, s.split_whitespace().nth(1)?.parse().ok()?))
        })
        .collect()
}

/// The longest any one thread waited for a CPU between two readings of
/// [`run_delays`] (threads in only one of them are skipped).
pub fn longest_run_wait(before: &[(u32, u64)], after: &[(u32, u64)]) -> u64 {
    after
        .iter()
        .filter_map(|(t, d)| {
            let (_, d0) = before.iter().find(|(t0, _)| t0 == t)?;
            Some(d.saturating_sub(*d0))
        })
        .max()
        .unwrap_or(0)
}

/// Thread `tid`'s nice value; `None` if it is gone.
pub fn get_nice(tid: u32) -> Option<i32> {
    // getpriority can return -1 legitimately: errno tells.
    nix::errno::Errno::clear();
    // SAFETY: getpriority only reads its integer arguments.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
    (n != -1 || nix::errno::Errno::last_raw() == 0).then_some(n)
}

/// Sets thread `tid`'s nice value.
pub fn try_set_nice(tid: u32, nice: i32) -> Result<(), nix::errno::Errno> {
    // SAFETY: setpriority only reads its integer arguments.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
    if r == 0 {
        Ok(())
    } else {
        Err(nix::errno::Errno::last())
    }
}

fn set_nice(tid: u32, nice: i32) {
    // Undoing a boost: the thread may have exited meanwhile.
    let _ = try_set_nice(tid, nice);
}

/// Reads and sets the nice value of one thread (a fake in tests, which
/// then need no privilege).
pub trait PrioritySetter: Send + 'static {
    /// The thread's nice value; `None` if it is gone.
    fn get(&self, tid: u32) -> Option<i32>;
    /// Sets it.
    fn set(&self, tid: u32, nice: i32) -> Result<(), Errno>;
    /// Sets its nice value and its EEVDF slice, `slice_ns` (0: the
    /// kernel's default; see [`set_slice`]). A setter that knows no slices
    /// (a fake) sets the nice alone.
    fn set_with_slice(&self, tid: u32, nice: i32, slice_ns: u64) -> Result<(), Errno> {
        let _ = slice_ns;
        self.set(tid, nice)
    }
    /// Moves the thread into `SCHED_FIFO` at `prio` (see [`enter_fifo`]).
    /// A setter that knows no classes refuses.
    fn enter_fifo(&self, tid: u32, prio: u32) -> Result<(), Errno> {
        let _ = (tid, prio);
        Err(Errno::ENOSYS)
    }
    /// Moves the thread back from `SCHED_FIFO` at `prio` (see
    /// [`leave_fifo`]).
    fn leave_fifo(&self, tid: u32, prio: u32, slice_ns: u64) -> Result<(), Errno> {
        let _ = (tid, prio, slice_ns);
        Ok(())
    }
}

/// The kernel's `getpriority`/`setpriority` on a thread id.
#[derive(Debug, Clone, Copy, Default)]
pub struct SysPriority;

impl PrioritySetter for SysPriority {
    fn get(&self, tid: u32) -> Option<i32> {
        get_nice(tid)
    }
    fn set(&self, tid: u32, nice: i32) -> Result<(), Errno> {
        try_set_nice(tid, nice)
    }
    fn set_with_slice(&self, tid: u32, nice: i32, slice_ns: u64) -> Result<(), Errno> {
        set_slice(tid, nice, slice_ns)
    }
    fn enter_fifo(&self, tid: u32, prio: u32) -> Result<(), Errno> {
        enter_fifo(tid, prio)
    }
    fn leave_fifo(&self, tid: u32, prio: u32, slice_ns: u64) -> Result<(), Errno> {
        leave_fifo(tid, prio, slice_ns)
    }
}

/// The EEVDF slice a lifted thread asks for besides its nice (the grant
/// services', the workers' serving threads, the vCPU lift's and the
/// threads it lifts; see [`set_slice`]): woken, it preempts a busy thread
/// sooner. Beside 12 CPU hogs on a 16-CPU H100 host it cut the grant
/// service's wait for a CPU from 301-376 to 91-132 ms per 8 s and raised
/// the fairness bench's MMR from 0.888-0.979 (mean 0.941) to 0.910-0.989
/// (mean 0.969) over eight and sixteen runs, the quiet host unchanged
/// (`results/2026-11-26-h100-busy-host-slices.md`).
pub const LIFT_SLICE_NS: u64 = 100_000;

/// Raises the calling thread to `nice`, with the slice [`LIFT_SLICE_NS`]
/// where the kernel takes one; the error says why the nice was refused (a
/// slice refused, or ignored by a kernel before 6.12, leaves the nice).
pub fn lift_current_thread(nice: i32) -> Result<(), String> {
    let tid = current_tid();
    lift_thread(&SysPriority, tid, nice)?;
    if let Err(e) = set_slice(tid, nice, LIFT_SLICE_NS) {
        tracing::debug!("a lifted thread's slice was refused ({e}): its nice alone");
    }
    Ok(())
}

/// The calling thread's id. Thread ids are positive (gettid(2)); were one
/// not, 0 names the calling thread to setpriority(2) all the same.
fn current_tid() -> u32 {
    u32::try_from(nix::unistd::gettid().as_raw()).unwrap_or(0)
}

/// Raises thread `tid` to `nice` through `p`; the error says why not.
pub fn lift_thread(p: &impl PrioritySetter, tid: u32, nice: i32) -> Result<(), String> {
    match p.set(tid, nice) {
        Ok(()) => Ok(()),
        Err(e @ (Errno::EPERM | Errno::EACCES)) => Err(format!(
            "raising a thread to nice {nice} was refused ({e}): needs CAP_SYS_NICE, root, or RLIMIT_NICE of at least {}",
            20 - nice
        )),
        Err(e) => Err(format!("setpriority: {e}")),
    }
}

/// The kernel's `struct sched_attr` (sched_setattr(2)), as its first
/// version lays it out (56 bytes, `SCHED_ATTR_SIZE_VER1`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    /// For a fair-class thread (Linux 6.12 and later): its EEVDF slice in
    /// ns, 0 for the default (`base_slice_ns`); the kernel clamps it to
    /// 0.1-100 ms.
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
    sched_util_min: u32,
    sched_util_max: u32,
}

/// The kernel's scheduling classes used here (`SCHED_*` of sched(7)).
const SCHED_OTHER: u32 = 0;
const SCHED_FIFO: u32 = 1;
const SCHED_BATCH: u32 = 3;
/// `sched_flags`: a thread's children start in `SCHED_OTHER` at nice 0
/// whatever its own class.
const SCHED_FLAG_RESET_ON_FORK: u64 = 1;

/// The size the kernel is told (a 56-byte struct: the cast cannot truncate).
#[allow(clippy::cast_possible_truncation)]
const SCHED_ATTR_SIZE: u32 = std::mem::size_of::<SchedAttr>() as u32;

/// Thread `tid`'s scheduling attributes (sched_getattr(2)).
fn sched_getattr(tid: u32) -> Result<SchedAttr, Errno> {
    let mut attr = SchedAttr::default();
    // SAFETY: the kernel writes at most `SCHED_ATTR_SIZE` bytes into
    // `attr`, a live, writable `repr(C)` struct of exactly that size laid
    // out as `struct sched_attr`; the other arguments are integers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            libc::c_long::from(tid),
            std::ptr::addr_of_mut!(attr),
            libc::c_long::from(SCHED_ATTR_SIZE),
            0 as libc::c_long,
        )
    };
    if r == 0 {
        Ok(attr)
    } else {
        Err(Errno::last())
    }
}

/// Sets thread `tid`'s scheduling attributes (sched_setattr(2)).
fn sched_setattr(tid: u32, attr: &SchedAttr) -> Result<(), Errno> {
    let attr = SchedAttr {
        size: SCHED_ATTR_SIZE,
        ..*attr
    };
    // SAFETY: the kernel only reads `attr.size` bytes from the pointer, a
    // live `repr(C)` struct of that size laid out as `struct sched_attr`;
    // the other arguments are integers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            libc::c_long::from(tid),
            std::ptr::addr_of!(attr),
            0 as libc::c_long,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// Sets thread `tid`'s nice value and its EEVDF slice, `slice_ns` (0: the
/// kernel's default slice back). On Linux 6.12 and later a fair-class
/// thread with a shorter slice gets an earlier virtual deadline, so that
/// when it wakes it preempts a CPU-bound thread that has run its
/// protected part of a slice sooner (a task's slice is clamped to
/// 0.1-100 ms); older kernels ignore the slice and set the nice alone.
/// The thread keeps its class (`SCHED_OTHER` or `SCHED_BATCH`); one of
/// another class (real-time, deadline, idle) is left alone, with `EINVAL`.
/// Lowering the nice needs CAP_SYS_NICE, as setpriority(2) does.
pub fn set_slice(tid: u32, nice: i32, slice_ns: u64) -> Result<(), Errno> {
    let policy = sched_getattr(tid)?.sched_policy;
    if policy != SCHED_OTHER && policy != SCHED_BATCH {
        return Err(Errno::EINVAL);
    }
    sched_setattr(
        tid,
        &SchedAttr {
            sched_policy: policy,
            sched_nice: nice,
            sched_runtime: slice_ns,
            ..SchedAttr::default()
        },
    )
}

/// The real-time lift's `SCHED_FIFO` priorities (see `daemon::hostcpu`):
/// the holder's vCPU threads lowest, then its worker's serving thread
/// (which its own guest's vCPU thread must not keep waiting on one CPU),
/// then the grant services' threads and the vCPU lift's. All far below the
/// kernel's own real-time threads (interrupt threads run at 50).
pub const REALTIME_VCPU: u32 = 1;
/// See [`REALTIME_VCPU`].
pub const REALTIME_WORKER: u32 = 2;
/// See [`REALTIME_VCPU`].
pub const REALTIME_SERVICE: u32 = 3;

/// Moves thread `tid` into `SCHED_FIFO` at `prio`. Its nice value stays
/// with it for its way back ([`leave_fifo`]); threads it creates meanwhile
/// start in `SCHED_OTHER` (reset on fork), so that no driver thread made
/// during a grant stays real-time. Needs CAP_SYS_NICE (or `RLIMIT_RTPRIO`
/// of at least `prio`) and, where real-time group scheduling is on,
/// real-time runtime in the thread's cgroup: `EPERM` otherwise.
pub fn enter_fifo(tid: u32, prio: u32) -> Result<(), Errno> {
    sched_setattr(
        tid,
        &SchedAttr {
            sched_policy: SCHED_FIFO,
            sched_flags: SCHED_FLAG_RESET_ON_FORK,
            sched_priority: prio,
            ..SchedAttr::default()
        },
    )
}

/// Moves thread `tid` back to `SCHED_OTHER` at the nice value it kept, with
/// the EEVDF slice `slice_ns` (0: the default), if it is still in
/// `SCHED_FIFO` at `prio`; a thread someone else moved meanwhile is left
/// alone (`Ok`).
pub fn leave_fifo(tid: u32, prio: u32, slice_ns: u64) -> Result<(), Errno> {
    let now = sched_getattr(tid)?;
    if now.sched_policy != SCHED_FIFO || now.sched_priority != prio {
        return Ok(());
    }
    // sched_getattr gives a real-time thread's nice as 0; getpriority its
    // kept one.
    let nice = get_nice(tid).ok_or(Errno::ESRCH)?;
    sched_setattr(
        tid,
        &SchedAttr {
            sched_policy: SCHED_OTHER,
            sched_nice: nice,
            sched_runtime: slice_ns,
            ..SchedAttr::default()
        },
    )
}

/// Moves the calling thread into `SCHED_FIFO` at `prio` (see
/// [`enter_fifo`]); the error says why not, as [`fifo_refusal`] words it.
pub fn fifo_current_thread(prio: u32) -> Result<(), String> {
    enter_fifo(current_tid(), prio).map_err(|e| fifo_refusal(e, prio))
}

/// Thread `tid`'s `SCHED_FIFO` priority, `None` in any other class.
pub fn fifo_priority(tid: u32) -> Result<Option<u32>, Errno> {
    let a = sched_getattr(tid)?;
    Ok((a.sched_policy == SCHED_FIFO).then_some(a.sched_priority))
}

/// Why moving a thread into `SCHED_FIFO` at `prio` failed, for the log and
/// `status`.
pub fn fifo_refusal(e: Errno, prio: u32) -> String {
    match e {
        Errno::EPERM | Errno::EACCES => format!(
            "SCHED_FIFO {prio} was refused ({e}): needs CAP_SYS_NICE (or RLIMIT_RTPRIO of at least {prio}) and, where the kernel has real-time group scheduling, real-time runtime for the thread's cgroup"
        ),
        e => format!("SCHED_FIFO {prio}: {e}"),
    }
}

/// The calling thread in `SCHED_FIFO` while its worker holds a grant
/// another vGPU waits for (the real-time lift): entered and left by the
/// worker's gate, never twice, and off for good at the first refusal.
#[derive(Debug, Default)]
pub struct OwnFifo {
    /// Whether to enter at all (`[daemon] realtime`).
    on: bool,
    /// The thread entered and the slice it leaves with, while inside.
    inside: Option<(u32, u64)>,
    /// Times entered.
    pub entered: u64,
}

impl OwnFifo {
    /// Enters only where `on`.
    pub fn new(on: bool) -> OwnFifo {
        OwnFifo {
            on,
            ..OwnFifo::default()
        }
    }

    /// Into `SCHED_FIFO` at [`REALTIME_WORKER`], if not already.
    pub fn enter(&mut self) {
        if !self.on || self.inside.is_some() {
            return;
        }
        let tid = current_tid();
        let slice = slice_of(tid).unwrap_or(0);
        match enter_fifo(tid, REALTIME_WORKER) {
            Ok(()) => {
                self.inside = Some((tid, slice));
                self.entered += 1;
            }
            Err(e) => {
                self.on = false;
                tracing::warn!(
                    "worker: real-time lift off: {}",
                    fifo_refusal(e, REALTIME_WORKER)
                );
            }
        }
    }

    /// Back to the class it had, if inside.
    pub fn leave(&mut self) {
        if let Some((tid, slice)) = self.inside.take() {
            if let Err(e) = leave_fifo(tid, REALTIME_WORKER, slice) {
                tracing::warn!("worker: leaving SCHED_FIFO: {e}");
            }
        }
    }

    /// Whether it still enters (`on`, and never refused).
    pub fn on(&self) -> bool {
        self.on
    }

    /// Whether a thread is in `SCHED_FIFO` by this now.
    pub fn inside(&self) -> bool {
        self.inside.is_some()
    }
}

impl Drop for OwnFifo {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Thread `tid`'s slice as the kernel reports it (ns; for a fair-class
/// thread on Linux 6.12 and later its slice, default or set).
pub fn slice_of(tid: u32) -> Result<u64, Errno> {
    Ok(sched_getattr(tid)?.sched_runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread of our own stands in for a vCPU thread.
    fn spawn_vcpu() -> (
        u32,
        std::sync::mpsc::Sender<()>,
        std::thread::JoinHandle<()>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ttx, trx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            ttx.send(current_tid()).unwrap();
            let _ = rx.recv();
        });
        (trx.recv().unwrap(), tx, h)
    }

    #[test]
    fn the_longest_wait_for_a_cpu_is_one_threads_not_their_sum() {
        let before = [(1, 100), (2, 1_000), (3, 5)];
        // Thread 2 waited 700 ns, thread 1 300; thread 4 came meanwhile.
        let after = [(1, 400), (2, 1_700), (4, 9_999)];
        assert_eq!(longest_run_wait(&before, &after), 700);
        assert_eq!(longest_run_wait(&before, &[]), 0);
        // Too many threads, or none: not read.
        assert!(run_delays(&[]).is_none());
        let many: Vec<u32> = (1..=u32::try_from(MAX_RUN_DELAY_THREADS).unwrap() + 1).collect();
        assert!(run_delays(&many).is_none());
        // This thread's own count, where the kernel keeps one.
        let me = current_tid();
        if let Some(d) = run_delays(&[me]) {
            assert_eq!(d[0].0, me);
        }
    }

    #[test]
    fn a_slice_is_set_read_back_and_put_back() {
        let (tid, stop, h) = spawn_vcpu();
        let nice = get_nice(tid).unwrap();
        // The same nice: no privilege needed.
        set_slice(tid, nice, 300_000).unwrap();
        let ns = slice_of(tid).unwrap();
        // Linux 6.12 and later keep the slice; older kernels ignore it.
        if ns != 0 {
            assert_eq!(ns, 300_000);
        }
        set_slice(tid, nice, 0).unwrap();
        assert_ne!(slice_of(tid).unwrap(), 300_000);
        assert_eq!(get_nice(tid), Some(nice));
        stop.send(()).unwrap();
        h.join().unwrap();
    }

    #[test]
    fn a_thread_enters_fifo_and_leaves_it_with_its_nice_and_slice() {
        let (tid, stop, h) = spawn_vcpu();
        // A nice of its own (raising it needs no privilege): kept inside
        // SCHED_FIFO and had again after.
        try_set_nice(tid, 7).unwrap();
        let nice = 7;
        match enter_fifo(tid, REALTIME_VCPU) {
            Ok(()) => {
                assert_eq!(fifo_priority(tid), Ok(Some(REALTIME_VCPU)));
                // Moved by someone else meanwhile (another priority): left.
                leave_fifo(tid, REALTIME_SERVICE, 0).unwrap();
                assert_eq!(fifo_priority(tid), Ok(Some(REALTIME_VCPU)));
                leave_fifo(tid, REALTIME_VCPU, LIFT_SLICE_NS).unwrap();
                assert_eq!(fifo_priority(tid), Ok(None));
                assert_eq!(get_nice(tid), Some(nice));
                let slice = slice_of(tid).unwrap();
                // Linux 6.12 and later keep the slice; older kernels none.
                assert!(slice == LIFT_SLICE_NS || slice == 0, "{slice}");
            }
            // Without the privilege: refused, and the reason says what
            // it needs.
            Err(e) => {
                assert!(fifo_refusal(e, 1).contains("CAP_SYS_NICE"), "{e}");
                assert_eq!(fifo_priority(tid), Ok(None));
            }
        }
        stop.send(()).unwrap();
        h.join().unwrap();
    }

    #[test]
    fn own_fifo_enters_once_leaves_on_drop_and_stays_off_when_off() {
        std::thread::spawn(|| {
            let me = current_tid();
            try_set_nice(me, 3).unwrap();
            let mut f = OwnFifo::new(true);
            f.enter();
            f.enter();
            let inside = f.inside();
            assert_eq!(fifo_priority(me), Ok(inside.then_some(REALTIME_WORKER)));
            assert_eq!(f.entered, u64::from(inside));
            // A thread made meanwhile (a driver's) starts outside.
            let child = std::thread::spawn(|| fifo_priority(current_tid()))
                .join()
                .unwrap();
            assert_eq!(child, Ok(None));
            drop(f);
            assert_eq!(fifo_priority(me), Ok(None));
            assert_eq!(get_nice(me), Some(3), "its nice had again");
        })
        .join()
        .unwrap();
        std::thread::spawn(|| {
            let mut off = OwnFifo::new(false);
            off.enter();
            assert!(!off.inside());
            assert_eq!(fifo_priority(current_tid()), Ok(None));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn threads_come_from_the_file_and_kicks_boost_then_restore() {
        let dir = scratch::dir("fvg-cosched");
        let file = dir.join("vm.vcpus");
        let (tid, stop, h) = spawn_vcpu();
        // Start the thread at nice 10 so that a boost of 5 needs no privilege
        // beyond our own (down to our RLIMIT_NICE / original nice).
        try_set_nice(tid, 10).unwrap();
        std::fs::write(&file, format!("{tid}\n")).unwrap();

        let mut b = VcpuBooster::new(Some(file.clone()));
        b.tick(0);
        assert_eq!(b.threads(), [tid]);
        b.kick(3); // no such vCPU
        assert_eq!(b.kicks, 0);
        b.kick(0); // not interactive: counted, not boosted
        assert_eq!((b.kicks, b.boosts), (1, 0));
        assert_eq!(get_nice(tid), Some(10));

        // 100 synchronous calls in a bit over 200 ms (< 500/s) is not
        // interactive; 10,000 (< 50,000/s) is.
        std::thread::sleep(REFRESH_EVERY);
        b.tick(100);
        assert!(!b.interactive);
        std::thread::sleep(REFRESH_EVERY);
        b.tick(10_100);
        assert!(b.interactive);
        b.kick(0);
        if b.boosts == 1 {
            assert_eq!(get_nice(tid), Some(10 - BOOST_NICE));
            std::thread::sleep(BOOST_FOR * 2);
            b.tick(0);
            assert_eq!(get_nice(tid), Some(10), "the boost must be undone");
        } else {
            // Without CAP_SYS_NICE lowering nice is refused: the boost turns off.
            assert!(!b.enabled);
            assert_eq!(get_nice(tid), Some(10));
        }
        stop.send(()).unwrap();
        h.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
