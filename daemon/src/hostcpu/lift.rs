//! The vCPU lift (FairGV's GPU-centric coscheduling on a busy host): while
//! a vGPU holds its GPU's grant, the threads that feed it work (the VM's
//! vCPU threads, or the guest processes' threads for native guests) run at
//! the lifted nice value; when the grant moves they get their own back.
//!
//! The grant service only hands the set of holders to the lifter's thread
//! ([`Lifter::holders`]) when it changes: the `setpriority` calls (one per
//! thread at a hand-off, and reading `/proc/<pid>/task` for native guests)
//! happen there, never on the service's path between a release and the
//! next grant, and nothing is done per request.
//!
//! With the real-time lift (`[daemon] realtime`) the holders' threads also
//! go into `SCHED_FIFO` while another vGPU waits for the GPU, until the
//! round's deadline that the service sends with them ([`Holders`]): a
//! thread lifted so is back in the fair class at the next change of
//! holders or at that deadline, whichever comes first, even if the service
//! said nothing more.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nix::errno::Errno;
use transport::server::PeerPids;

use worker::priority::{fifo_refusal, REALTIME_VCPU};
pub use worker::priority::{PrioritySetter, SysPriority};

/// What the grant service tells the vCPU lift at each change: the vGPUs
/// holding the GPU, and while another waits for it, the round's deadline
/// (the real-time lift's bound).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    /// The holder and its co-holders.
    pub vgpus: Vec<u32>,
    /// Another vGPU waits: the holders' threads may be real-time until
    /// then. None: nobody waits.
    pub realtime_until: Option<Instant>,
}

/// Which threads are lifted now, and what each had before.
#[derive(Debug)]
pub struct Lifts<P: PrioritySetter> {
    setter: P,
    nice: i32,
    /// The EEVDF slice lifted threads get besides the nice (ns, see
    /// `worker::priority::LIFT_SLICE_NS`), and lose again with it; `None`:
    /// the nice alone.
    slice_ns: Option<u64>,
    /// Lifted thread -> its nice before the lift.
    lifted: BTreeMap<u32, i32>,
    /// The real-time lift is on (and the host has not refused it yet).
    realtime: bool,
    /// Threads in `SCHED_FIFO` by this now.
    fifo: BTreeSet<u32>,
    /// Why lifting stopped (the host refused it), if it did.
    pub refused: Option<String>,
    /// Why the real-time lift stopped, if the host refused it.
    pub realtime_refused: Option<String>,
    /// Threads moved into `SCHED_FIFO` so far.
    pub fifo_entries: u64,
    /// Threads lifted so far.
    pub lifts: u64,
    /// Changes of the set of holders applied.
    pub changes: u64,
}

impl<P: PrioritySetter> Lifts<P> {
    /// Lifts to `nice` with `setter`.
    pub fn new(setter: P, nice: i32) -> Self {
        Self::with_slice(setter, nice, None)
    }

    /// Lifts to `nice` and, if `slice_ns` is given, to that EEVDF slice
    /// (see [`worker::priority::set_slice`]) with `setter`.
    pub fn with_slice(setter: P, nice: i32, slice_ns: Option<u64>) -> Self {
        Lifts {
            setter,
            nice,
            slice_ns,
            lifted: BTreeMap::new(),
            realtime: false,
            fifo: BTreeSet::new(),
            refused: None,
            realtime_refused: None,
            fifo_entries: 0,
            lifts: 0,
            changes: 0,
        }
    }

    /// With the real-time lift: [`Lifts::apply_realtime`] moves the
    /// targets into `SCHED_FIFO` too.
    pub fn with_realtime(mut self, on: bool) -> Self {
        self.realtime = on;
        self
    }

    /// The nice lift of [`Lifts::apply`], and with `realtime` (another vGPU waits) the
    /// targets into `SCHED_FIFO` at [`REALTIME_VCPU`] as well, where the
    /// real-time lift is on; without, every thread this put there leaves
    /// it. A thread leaves `SCHED_FIFO` before it gets its nice back. The
    /// first refusal turns the real-time lift off for good, with the
    /// reason in [`Lifts::realtime_refused`]; the nice lift goes on.
    pub fn apply_realtime(&mut self, targets: &[u32], realtime: bool) {
        let keep = realtime && self.realtime;
        let out: Vec<u32> = self
            .fifo
            .iter()
            .filter(|t| !(keep && targets.contains(t)))
            .copied()
            .collect();
        for tid in out {
            self.leave_fifo(tid);
        }
        self.apply_nice(targets);
        if !keep {
            return;
        }
        for &tid in targets {
            if self.fifo.contains(&tid) {
                continue;
            }
            match self.setter.enter_fifo(tid, REALTIME_VCPU) {
                Ok(()) => {
                    self.fifo.insert(tid);
                    self.fifo_entries += 1;
                }
                Err(e @ (Errno::EPERM | Errno::EACCES | Errno::ENOSYS)) => {
                    let why = fifo_refusal(e, REALTIME_VCPU);
                    tracing::warn!("real-time lift off: a vCPU thread's {why}");
                    self.realtime_refused = Some(format!("a vCPU thread's {why}"));
                    self.realtime = false;
                    self.leave_realtime();
                    return;
                }
                Err(_) => {} // gone meanwhile
            }
        }
    }

    /// Every thread this put in `SCHED_FIFO` back in the fair class, its
    /// nice lift kept; true if there was any.
    pub fn leave_realtime(&mut self) -> bool {
        let any = !self.fifo.is_empty();
        for tid in std::mem::take(&mut self.fifo) {
            self.leave_fifo(tid);
        }
        any
    }

    /// Thread `tid` out of `SCHED_FIFO`, at the lifted slice if it keeps
    /// its lift.
    fn leave_fifo(&mut self, tid: u32) {
        self.fifo.remove(&tid);
        let slice = self.slice_ns.unwrap_or(0);
        // Gone meanwhile, or moved by someone else: nothing to undo.
        let _ = self.setter.leave_fifo(tid, REALTIME_VCPU, slice);
    }

    /// Makes `targets` (thread ids) the lifted set: threads lifted before
    /// and not in it get their own nice back (unless something else changed
    /// it meanwhile: then it is left alone), the new ones are lifted. A
    /// thread already at the lifted value or higher is left as it is. The
    /// first refusal (no CAP_SYS_NICE) turns lifting off for good, with the
    /// reason in [`Lifts::refused`]; a thread that has gone is skipped.
    /// Any thread this put in `SCHED_FIFO` leaves it.
    pub fn apply(&mut self, targets: &[u32]) {
        self.apply_realtime(targets, false);
    }

    /// The nice part of [`Lifts::apply`] (threads in `SCHED_FIFO` by this
    /// have left it first, in [`Lifts::apply_realtime`]).
    fn apply_nice(&mut self, targets: &[u32]) {
        self.changes += 1;
        let drop: Vec<u32> = self
            .lifted
            .keys()
            .filter(|t| !targets.contains(t))
            .copied()
            .collect();
        for tid in drop {
            if let Some(before) = self.lifted.remove(&tid) {
                if self.setter.get(tid) == Some(self.nice) {
                    let _ = match self.slice_ns {
                        // The default slice back with its nice.
                        Some(_) => self.setter.set_with_slice(tid, before, 0),
                        None => self.setter.set(tid, before),
                    };
                }
            }
        }
        if self.refused.is_some() {
            return;
        }
        for &tid in targets {
            if self.lifted.contains_key(&tid) {
                continue;
            }
            let Some(before) = self.setter.get(tid) else {
                continue;
            };
            if before <= self.nice {
                continue;
            }
            let set = match self.slice_ns {
                Some(ns) => self.setter.set_with_slice(tid, self.nice, ns),
                None => self.setter.set(tid, self.nice),
            };
            match set {
                Ok(()) => {
                    self.lifted.insert(tid, before);
                    self.lifts += 1;
                }
                Err(e @ (Errno::EPERM | Errno::EACCES)) => {
                    self.refused = Some(format!(
                        "raising a vCPU thread to nice {} was refused ({e}): needs CAP_SYS_NICE",
                        self.nice
                    ));
                    tracing::warn!("vCPU lift off: {}", self.refused.as_deref().unwrap_or(""));
                    return;
                }
                Err(_) => {} // gone meanwhile
            }
        }
    }

    /// The threads lifted now.
    pub fn lifted(&self) -> Vec<u32> {
        self.lifted.keys().copied().collect()
    }
}

impl<P: PrioritySetter> Drop for Lifts<P> {
    fn drop(&mut self) {
        self.apply(&[]);
    }
}

/// Where a vGPU's threads to lift are found.
#[derive(Debug, Default, Clone)]
struct Source {
    /// The VM's vCPU threads (QMP, `fairvgpu attach`; or a bench's guest
    /// threads); when known, only these are lifted.
    vcpus: Vec<u32>,
    /// The peers of the VM's ivshmem server: without vCPU threads, every
    /// thread of each peer process is lifted (native guest processes).
    peers: Option<PeerPids>,
}

/// vGPU id -> where its threads are found; shared by the daemon (which
/// learns vCPU threads and serves the peers) and the lifter.
#[derive(Debug, Default, Clone)]
pub struct Registry(Arc<Mutex<HashMap<u32, Source>>>);

impl Registry {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<u32, Source>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// `vgpu`'s vCPU threads (empty: none known; the peers count again).
    pub fn set_vcpus(&self, vgpu: u32, threads: Vec<u32>) {
        self.with(|m| m.entry(vgpu).or_default().vcpus = threads);
    }

    /// The peers of `vgpu`'s VM.
    pub fn set_peers(&self, vgpu: u32, peers: PeerPids) {
        self.with(|m| m.entry(vgpu).or_default().peers = Some(peers));
    }

    /// The threads to lift while `vgpu` holds its GPU: its vCPU threads, or
    /// else every thread of its peer processes (from `/proc/<pid>/task`).
    pub fn threads(&self, vgpu: u32) -> Vec<u32> {
        let Some(src) = self.with(|m| m.get(&vgpu).cloned()) else {
            return Vec::new();
        };
        if !src.vcpus.is_empty() {
            return src.vcpus;
        }
        let pids: Vec<u32> = src.peers.map_or_else(Vec::new, |p| {
            let own = std::process::id();
            p.lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                // Never the daemon's own threads (a peer in this process).
                .filter(|&&pid| pid != own)
                .copied()
                .collect()
        });
        pids.into_iter().flat_map(tasks).collect()
    }
}

/// The thread ids of process `pid` (none if it is gone).
fn tasks(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// What the lifter's thread has to say: refusals and counts.
#[derive(Debug, Default, Clone)]
pub struct LiftState {
    /// Why the nice lift stopped, if the host refused it.
    pub refused: Option<String>,
    /// Why the real-time lift stopped, if the host refused it.
    pub realtime_refused: Option<String>,
    /// Threads moved into `SCHED_FIFO` so far.
    pub fifo_entries: u64,
    /// Times a round's deadline passed with threads still in `SCHED_FIFO`
    /// and no word from the service: they left it then.
    pub deadlines_passed: u64,
    /// Sets of holders taken from the channel so far (the newest applied).
    pub taken: u64,
}

/// The lifter's thread: takes each new set of holders and lifts their
/// threads. Dropped, it puts every lifted thread back and ends.
#[derive(Debug)]
pub struct Lifter {
    tx: Option<Sender<Holders>>,
    thread: Option<std::thread::JoinHandle<()>>,
    state: Arc<Mutex<LiftState>>,
}

impl Lifter {
    /// Starts lifting the threads `registry` gives for each holder to
    /// `nice` with `setter`, and with `realtime` into `SCHED_FIFO` while the
    /// GPU is contended; the thread itself runs at `nice` too (where
    /// allowed), so that a hand-off's lift is not late behind the hogs,
    /// and with `realtime` in `SCHED_FIFO` above every thread it lifts.
    pub fn start<P: PrioritySetter>(
        registry: Registry,
        nice: i32,
        setter: P,
        realtime: bool,
    ) -> Lifter {
        let (tx, rx) = std::sync::mpsc::channel();
        let state: Arc<Mutex<LiftState>> = Arc::default();
        let s2 = state.clone();
        let thread = std::thread::Builder::new()
            .name("vcpu-lift".into())
            .spawn(move || {
                let _ = worker::priority::lift_current_thread(nice);
                if realtime {
                    let prio = worker::priority::REALTIME_SERVICE;
                    if let Err(why) = worker::priority::fifo_current_thread(prio) {
                        tracing::warn!("vCPU lift's thread: {why}");
                    }
                }
                let slice = Some(worker::priority::LIFT_SLICE_NS);
                let lifts = Lifts::with_slice(setter, nice, slice).with_realtime(realtime);
                run(&rx, &registry, lifts, &s2);
            })
            .ok();
        Lifter {
            tx: Some(tx),
            thread,
            state,
        }
    }

    /// What the grant service sends the holders on (see `run`).
    pub fn holders(&self) -> Option<Sender<Holders>> {
        self.thread.as_ref().and(self.tx.clone())
    }

    /// Why the lift stopped, if the host refused it.
    pub fn refused(&self) -> Option<String> {
        self.state().refused
    }

    /// Refusals and counts so far.
    pub fn state(&self) -> LiftState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts every lifted thread back (no holders), waiting up to `wait`
    /// for the lift's thread to have done it: a daemon that stops leaves
    /// no VM's thread lifted, real-time least of all. True if done.
    pub fn put_back(&self, wait: std::time::Duration) -> bool {
        let (Some(tx), Some(_)) = (&self.tx, &self.thread) else {
            return true;
        };
        let before = self.state().taken;
        if tx.send(Holders::default()).is_err() {
            return false;
        }
        let t = Instant::now();
        while self.state().taken == before && t.elapsed() < wait {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.state().taken > before
    }
}

impl Drop for Lifter {
    fn drop(&mut self) {
        // The thread ends once every sender is gone (the grant services'
        // too): it is not waited for here.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// The lifter's loop: applies the newest set of holders each time one comes
/// (several queued: only the last counts); at a round's deadline with
/// threads still in `SCHED_FIFO` and nothing newer, takes them out of it;
/// ends, putting everything back, when every sender is gone.
fn run<P: PrioritySetter>(
    rx: &Receiver<Holders>,
    registry: &Registry,
    mut lifts: Lifts<P>,
    state: &Mutex<LiftState>,
) {
    let mut until: Option<Instant> = None;
    loop {
        let next = match until {
            Some(t) => rx.recv_timeout(t.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let (mut passed, mut taken) = (false, 0);
        match next {
            Ok(mut holders) => {
                taken += 1;
                while let Ok(newer) = rx.try_recv() {
                    holders = newer;
                    taken += 1;
                }
                let targets: Vec<u32> = holders
                    .vgpus
                    .iter()
                    .flat_map(|&v| registry.threads(v))
                    .collect();
                until = holders.realtime_until.filter(|&t| t > Instant::now());
                lifts.apply_realtime(&targets, until.is_some());
            }
            Err(RecvTimeoutError::Timeout) => {
                until = None;
                passed = lifts.leave_realtime();
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        st.refused.clone_from(&lifts.refused);
        st.realtime_refused.clone_from(&lifts.realtime_refused);
        st.fifo_entries = lifts.fifo_entries;
        st.deadlines_passed += u64::from(passed);
        st.taken += taken;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nice values per thread in a map, and the `SCHED_FIFO` priority of
    /// those in it; `deny` refuses every raise, `deny_fifo` every move
    /// into `SCHED_FIFO`.
    #[derive(Clone, Default)]
    struct Fake {
        nice: Arc<Mutex<HashMap<u32, i32>>>,
        fifo: Arc<Mutex<HashMap<u32, u32>>>,
        deny: bool,
        deny_fifo: bool,
    }

    impl PrioritySetter for Fake {
        fn get(&self, tid: u32) -> Option<i32> {
            self.nice.lock().unwrap().get(&tid).copied()
        }
        fn set(&self, tid: u32, nice: i32) -> Result<(), Errno> {
            let mut m = self.nice.lock().unwrap();
            let cur = *m.get(&tid).ok_or(Errno::ESRCH)?;
            if self.deny && nice < cur {
                return Err(Errno::EPERM);
            }
            m.insert(tid, nice);
            Ok(())
        }
        fn enter_fifo(&self, tid: u32, prio: u32) -> Result<(), Errno> {
            self.get(tid).ok_or(Errno::ESRCH)?;
            if self.deny_fifo {
                return Err(Errno::EPERM);
            }
            self.fifo.lock().unwrap().insert(tid, prio);
            Ok(())
        }
        fn leave_fifo(&self, tid: u32, prio: u32, _: u64) -> Result<(), Errno> {
            let mut m = self.fifo.lock().unwrap();
            if m.get(&tid) == Some(&prio) {
                m.remove(&tid);
            }
            Ok(())
        }
    }

    fn in_fifo(f: &Fake) -> Vec<u32> {
        let mut v: Vec<u32> = f.fifo.lock().unwrap().keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Polls `what` every millisecond for up to 5 s (the lifter's thread
    /// acts on its own time); its last answer.
    fn wait_for(what: &dyn Fn() -> bool) -> bool {
        let t = Instant::now();
        while !what() && t.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        what()
    }

    /// A lifter to nice -5 (with `realtime`, into `SCHED_FIFO` too) of
    /// vGPU 0's thread 10 and vGPU 1's thread 20, both at nice 0.
    fn lifter_of_two(realtime: bool) -> (Fake, Lifter) {
        let f = fake(&[(10, 0), (20, 0)]);
        let reg = Registry::default();
        reg.set_vcpus(0, vec![10]);
        reg.set_vcpus(1, vec![20]);
        let lifter = Lifter::start(reg, -5, f.clone(), realtime);
        (f, lifter)
    }

    fn held(vgpus: &[u32], realtime_until: Option<Instant>) -> Holders {
        Holders {
            vgpus: vgpus.to_vec(),
            realtime_until,
        }
    }

    fn fake(threads: &[(u32, i32)]) -> Fake {
        let f = Fake::default();
        f.nice.lock().unwrap().extend(threads.iter().copied());
        f
    }

    fn nice_of(f: &Fake, tid: u32) -> i32 {
        f.nice.lock().unwrap()[&tid]
    }

    #[test]
    fn after_a_sequence_of_grants_only_the_holders_threads_are_lifted() {
        // vGPU 0's vCPUs 10, 11; vGPU 1's 20; vGPU 2's 30 (at nice 5).
        let f = fake(&[(10, 0), (11, 0), (20, 0), (30, 5)]);
        let reg = Registry::default();
        reg.set_vcpus(0, vec![10, 11]);
        reg.set_vcpus(1, vec![20]);
        reg.set_vcpus(2, vec![30]);
        let mut l = Lifts::new(f.clone(), -10);
        let grant = |l: &mut Lifts<Fake>, holders: &[u32]| {
            let t: Vec<u32> = holders.iter().flat_map(|&v| reg.threads(v)).collect();
            l.apply(&t);
        };
        grant(&mut l, &[0]);
        assert_eq!(l.lifted(), [10, 11]);
        assert_eq!((nice_of(&f, 10), nice_of(&f, 20)), (-10, 0));
        grant(&mut l, &[1]);
        assert_eq!(l.lifted(), [20]);
        assert_eq!(
            (nice_of(&f, 10), nice_of(&f, 11), nice_of(&f, 20)),
            (0, 0, -10)
        );
        grant(&mut l, &[]); // released, nobody granted yet
        assert!(l.lifted().is_empty());
        grant(&mut l, &[2, 0]); // a holder and a co-holder
        assert_eq!(l.lifted(), [10, 11, 30]);
        grant(&mut l, &[0]);
        assert_eq!(l.lifted(), [10, 11]);
        assert_eq!(nice_of(&f, 30), 5, "vGPU 2's thread gets its own nice back");
        assert_eq!(nice_of(&f, 20), 0);
        // 10, 11; 20; 30, 10, 11 again.
        assert_eq!((l.lifts, l.changes), (6, 5));
        drop(l);
        for (t, n) in [(10, 0), (11, 0), (20, 0), (30, 5)] {
            assert_eq!(nice_of(&f, t), n, "thread {t} after the lifter ends");
        }
    }

    #[test]
    fn contended_holders_threads_are_real_time_only_while_another_waits() {
        let f = fake(&[(10, 0), (11, 0), (20, 0)]);
        let mut l = Lifts::with_slice(f.clone(), -10, Some(100_000)).with_realtime(true);
        l.apply_realtime(&[10, 11], true);
        assert_eq!(in_fifo(&f), [10, 11]);
        assert_eq!((nice_of(&f, 10), f.fifo.lock().unwrap()[&10]), (-10, 1));
        // Nobody waits any more (the service extends the slice): out of
        // SCHED_FIFO, the nice lift kept.
        l.apply_realtime(&[10, 11], false);
        assert!(in_fifo(&f).is_empty());
        assert_eq!(nice_of(&f, 11), -10);
        l.apply_realtime(&[10, 11], true);
        // The grant moves: the old holder's threads leave SCHED_FIFO and
        // get their nice back; the new one's go in.
        l.apply_realtime(&[20], true);
        assert_eq!(in_fifo(&f), [20]);
        assert_eq!((nice_of(&f, 10), nice_of(&f, 20)), (0, -10));
        // Moved by someone else meanwhile: left where it was put.
        f.fifo.lock().unwrap().insert(20, 7);
        l.apply_realtime(&[], false);
        assert_eq!(f.fifo.lock().unwrap().get(&20), Some(&7));
        f.fifo.lock().unwrap().clear();
        l.apply_realtime(&[10], true);
        assert_eq!(l.fifo_entries, 6);
        drop(l);
        assert!(in_fifo(&f).is_empty(), "none left real-time by the lifter");
        assert_eq!(nice_of(&f, 10), 0);
    }

    #[test]
    fn without_the_real_time_lift_or_where_refused_only_the_nice_lift() {
        let f = fake(&[(10, 0)]);
        let mut off = Lifts::new(f.clone(), -10);
        off.apply_realtime(&[10], true);
        assert!(in_fifo(&f).is_empty());
        assert_eq!(nice_of(&f, 10), -10);
        drop(off);
        let f = Fake {
            deny_fifo: true,
            ..fake(&[(10, 0), (20, 0)])
        };
        let mut l = Lifts::new(f.clone(), -10).with_realtime(true);
        l.apply_realtime(&[10], true);
        let why = l.realtime_refused.clone().unwrap();
        assert!(
            why.contains("CAP_SYS_NICE") && why.contains("SCHED_FIFO 1"),
            "{why}"
        );
        assert_eq!(nice_of(&f, 10), -10, "the nice lift goes on");
        l.apply_realtime(&[20], true);
        assert_eq!((nice_of(&f, 10), nice_of(&f, 20)), (0, -10));
        assert!(l.refused.is_none() && l.fifo_entries == 0);
    }

    #[test]
    fn the_lifter_takes_threads_out_of_fifo_at_the_rounds_deadline() {
        let (f, lifter) = lifter_of_two(true);
        let tx = lifter.holders().unwrap();
        let until = Instant::now() + std::time::Duration::from_millis(300);
        tx.send(held(&[0], Some(until))).unwrap();
        assert!(wait_for(&|| in_fifo(&f) == [10]));
        // Nothing more from the service: out at the deadline, not before,
        // the nice lift kept.
        assert!(wait_for(&|| in_fifo(&f).is_empty()));
        assert!(Instant::now() >= until);
        assert_eq!(nice_of(&f, 10), -5);
        let st = lifter.state();
        assert_eq!((st.fifo_entries, st.deadlines_passed), (1, 1));
        // Put back on demand (a daemon that stops): nobody lifted.
        tx.send(held(
            &[0],
            Some(Instant::now() + std::time::Duration::from_secs(9)),
        ))
        .unwrap();
        assert!(wait_for(&|| in_fifo(&f) == [10]));
        assert!(lifter.put_back(std::time::Duration::from_secs(5)));
        assert!(in_fifo(&f).is_empty());
        assert_eq!(nice_of(&f, 10), 0);
        // A deadline already past lifts the nice alone.
        tx.send(held(&[1], Some(Instant::now()))).unwrap();
        assert!(wait_for(&|| nice_of(&f, 20) == -5));
        assert!(in_fifo(&f).is_empty());
        drop(tx);
        drop(lifter);
        assert!(wait_for(&|| nice_of(&f, 20) == 0));
    }

    #[test]
    fn threads_already_high_gone_or_changed_meanwhile_are_left_alone() {
        let f = fake(&[(1, -15), (2, 0), (3, 0)]);
        let mut l = Lifts::new(f.clone(), -10);
        l.apply(&[1, 2, 3, 4]); // 4 does not exist
        assert_eq!(l.lifted(), [2, 3]);
        assert_eq!(nice_of(&f, 1), -15);
        // Someone else set thread 3 while it was lifted: not undone.
        f.nice.lock().unwrap().insert(3, 7);
        l.apply(&[]);
        assert_eq!((nice_of(&f, 2), nice_of(&f, 3)), (0, 7));
    }

    #[test]
    fn a_refusal_turns_the_lift_off_and_says_why() {
        let f = Fake {
            deny: true,
            ..fake(&[(1, 0), (2, 0)])
        };
        let mut l = Lifts::new(f.clone(), -10);
        l.apply(&[1]);
        assert!(l.lifted().is_empty());
        let why = l.refused.clone().unwrap();
        assert!(why.contains("CAP_SYS_NICE"), "{why}");
        l.apply(&[2]);
        assert_eq!(nice_of(&f, 2), 0);
    }

    #[test]
    fn native_peers_threads_come_from_proc() {
        // A peer process that is this one is never lifted (the daemon's
        // own threads); another process's threads are listed.
        let reg = Registry::default();
        let peers: PeerPids = Arc::default();
        peers.lock().unwrap().insert(1, std::process::id());
        reg.set_peers(0, peers.clone());
        assert!(reg.threads(0).is_empty());
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        peers.lock().unwrap().insert(2, child.id());
        assert_eq!(reg.threads(0), [child.id()]);
        // vCPU threads, once known, are what is lifted.
        reg.set_vcpus(0, vec![42]);
        assert_eq!(reg.threads(0), [42]);
        let _ = child.kill();
        let _ = child.wait();
        assert!(reg.threads(7).is_empty());
    }

    #[test]
    fn the_lifter_thread_follows_the_newest_holders() {
        let (f, lifter) = lifter_of_two(false);
        let tx = lifter.holders().unwrap();
        tx.send(held(&[0], None)).unwrap();
        tx.send(held(&[1], None)).unwrap();
        wait_for(&|| nice_of(&f, 20) == -5);
        assert_eq!((nice_of(&f, 10), nice_of(&f, 20)), (0, -5));
        drop(tx);
        drop(lifter);
        wait_for(&|| nice_of(&f, 20) == 0);
        assert_eq!(nice_of(&f, 20), 0, "put back when the lifter ends");
    }
}
