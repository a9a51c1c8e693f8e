//! User objects: a pointer and a destroy callback with a reference count
//! (`cuUserObjectCreate`, `cuUserObjectRetain`, `cuUserObjectRelease`),
//! whose references graphs and executable graphs may hold
//! (`cuGraphRetainUserObject`, `cuGraphReleaseUserObject`). They live here,
//! in the process, as graphs do; nothing of them reaches the host.
//!
//! A graph's references ([`Refs`]) go with the graph: destroying it
//! releases them, a clone of it (and a child graph node's copy of it) takes
//! as many new ones, and instantiating it gives the executable its own
//! references to every object of the graph, its child graphs and its
//! conditionals' bodies (released when the executable is destroyed;
//! `cuGraphExecUpdate` swaps in the new graph's). When an object's last
//! reference goes, its callback runs on a thread of its own, after this
//! module's lock is dropped (the driver runs it asynchronously, and it
//! must not call CUDA). References are released when an executable is
//! destroyed, not held until launches of it still running end.

use std::collections::BTreeMap;
use std::ffi::{c_uint, c_void};
use std::sync::{Arc, Mutex};

use super::{graphs, Graph, Op, Store};
use crate::state::out;
use crate::{code, CuResult};

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`: the only flag, and a required one.
const NO_DESTRUCTOR_SYNC: c_uint = 1;

/// `CU_GRAPH_USER_OBJECT_MOVE`: the graph takes the caller's references
/// instead of new ones.
const MOVE: c_uint = 1;

/// Handles issued here start at this value (apart from the graphs').
const FIRST_HANDLE: u64 = 0x6b00_0000_0000;

/// `CUhostFn`: a user object's destroy callback.
type Destroy = unsafe extern "C" fn(*mut c_void);

/// A destroy callback due, with the pointer it is given.
type Due = (Destroy, usize);

/// One user object.
struct Object {
    /// The pointer its callback is given.
    ptr: usize,
    /// Its destroy callback.
    destroy: Destroy,
    /// Its references: the callers', the graphs' and the executables'.
    refs: u64,
}

/// Every user object of the process.
struct Objects {
    /// Each live object by its handle.
    live: BTreeMap<u64, Object>,
    /// The last handle issued, less [`FIRST_HANDLE`].
    next: u64,
}

/// Every user object of the process: changed by the entry points here and
/// by graphs' and executables' [`Refs`] (taken after the graphs' lock,
/// never before it).
static OBJECTS: Mutex<Objects> = Mutex::new(Objects {
    live: BTreeMap::new(),
    next: 0,
});

impl Objects {
    /// A new object with `refs` references.
    fn create(&mut self, ptr: usize, destroy: Destroy, refs: u64) -> u64 {
        self.next += 1;
        let h = FIRST_HANDLE + self.next;
        self.live.insert(h, Object { ptr, destroy, refs });
        h
    }

    /// Adds `n` references to `obj`.
    fn retain(&mut self, obj: u64, n: u64) -> Result<(), CuResult> {
        let o = self.live.get_mut(&obj).ok_or(code::INVALID_VALUE)?;
        o.refs = o.refs.checked_add(n).ok_or(code::INVALID_VALUE)?;
        Ok(())
    }

    /// Takes `n` references from `obj` (no more than it has); the callback
    /// to run if that was its last.
    fn release(&mut self, obj: u64, n: u64) -> Result<Option<Due>, CuResult> {
        let o = self.live.get_mut(&obj).ok_or(code::INVALID_VALUE)?;
        o.refs = o.refs.checked_sub(n).ok_or(code::INVALID_VALUE)?;
        if o.refs > 0 {
            return Ok(None);
        }
        Ok(self.live.remove(&obj).map(|o| (o.destroy, o.ptr)))
    }
}

/// The objects' lock.
fn objects() -> std::sync::MutexGuard<'static, Objects> {
    crate::state::process::lock(&OBJECTS)
}

/// Runs the callbacks due on a thread of their own (the caller holds no
/// lock of this module; if no thread starts, they run here).
fn run_destroyers(due: Vec<Due>) {
    if due.is_empty() {
        return;
    }
    let pending = Arc::new(Mutex::new(due));
    let theirs = pending.clone();
    let started = std::thread::Builder::new()
        .name("cuda-user-objects".into())
        .spawn(move || destroy_all(&theirs))
        .is_ok();
    if !started {
        destroy_all(&pending);
    }
}

/// Runs (once) the callbacks in `due`.
fn destroy_all(due: &Mutex<Vec<Due>>) {
    let due = std::mem::take(&mut *due.lock().unwrap_or_else(|e| e.into_inner()));
    for (f, ptr) in due {
        // SAFETY: the program's destroy callback with the pointer it gave
        // for it (API contract), run once: the object is gone.
        unsafe { f(ptr as *mut c_void) };
    }
}

/// References a graph or an executable graph holds: object -> count.
/// A clone takes as many new references; dropping them releases them.
#[derive(Default)]
pub(crate) struct Refs(BTreeMap<u64, u64>);

impl Refs {
    /// Takes the references `counts` names (of objects still live).
    fn retained(counts: BTreeMap<u64, u64>) -> Refs {
        if !counts.is_empty() {
            let mut o = objects();
            for (obj, n) in &counts {
                if let Some(x) = o.live.get_mut(obj) {
                    x.refs = x.refs.saturating_add(*n);
                }
            }
        }
        Refs(counts)
    }

    /// Adds `n` references to `obj`: new ones, or (`moved`) the caller's.
    fn add(&mut self, obj: u64, n: u64, moved: bool) -> Result<(), CuResult> {
        let held = self.0.get(&obj).copied().unwrap_or(0);
        let total = held.checked_add(n).ok_or(code::INVALID_VALUE)?;
        let mut o = objects();
        if moved {
            o.live.get(&obj).ok_or(code::INVALID_VALUE)?;
        } else {
            o.retain(obj, n)?;
        }
        self.0.insert(obj, total);
        Ok(())
    }

    /// Releases `n` of the references to `obj` held here (no more than
    /// are); the callback to run if that was the object's last.
    fn remove(&mut self, obj: u64, n: u64) -> Result<Option<Due>, CuResult> {
        let held = self.0.get(&obj).copied().unwrap_or(0);
        let left = held.checked_sub(n).ok_or(code::INVALID_VALUE)?;
        let due = objects().release(obj, n)?;
        if left == 0 {
            self.0.remove(&obj);
        } else {
            self.0.insert(obj, left);
        }
        Ok(due)
    }

    /// How many references to `obj` are held here.
    #[cfg(test)]
    fn count(&self, obj: u64) -> u64 {
        self.0.get(&obj).copied().unwrap_or(0)
    }
}

impl Clone for Refs {
    fn clone(&self) -> Refs {
        Refs::retained(self.0.clone())
    }
}

impl Drop for Refs {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let due: Vec<Due> = {
            let mut o = objects();
            let held = std::mem::take(&mut self.0);
            held.into_iter()
                .filter_map(|(obj, n)| o.release(obj, n).ok().flatten())
                .collect()
        };
        run_destroyers(due);
    }
}

/// Adds the references of `g`, its child graphs and its conditionals'
/// bodies (at any depth) to `all`.
fn count_all(s: &Store, g: &Graph, all: &mut BTreeMap<u64, u64>) {
    for (obj, n) in &g.objects.0 {
        let c = all.entry(*obj).or_default();
        *c = c.saturating_add(*n);
    }
    for node in &g.nodes {
        match &node.op {
            Op::Graph(child) => count_all(s, child, all),
            Op::Cond(c) => {
                for b in c.bodies.iter() {
                    if let Some(body) = s.graphs.get(b) {
                        count_all(s, body, all);
                    }
                }
            }
            _ => {}
        }
    }
}

/// New references to every object `g` holds, with its child graphs and
/// conditionals' bodies: an executable graph's of it.
pub(super) fn gather(s: &Store, g: &Graph) -> Refs {
    let mut all = BTreeMap::new();
    count_all(s, g, &mut all);
    Refs::retained(all)
}

/// A reference count the program passes: at least one.
fn count(n: c_uint) -> Result<u64, CuResult> {
    if n == 0 {
        return Err(code::INVALID_VALUE);
    }
    Ok(n.into())
}

export! {
    /// The only flag, `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, is required.
    fn cuUserObjectCreate(obj: *mut u64, ptr: *mut c_void, destroy: Option<Destroy>, refs: c_uint, flags: c_uint) {
        let destroy = destroy.ok_or(code::INVALID_VALUE)?;
        if obj.is_null() || flags != NO_DESTRUCTOR_SYNC {
            return Err(code::INVALID_VALUE);
        }
        let refs = count(refs)?;
        let h = objects().create(ptr as usize, destroy, refs);
        out(obj, h)
    }

    fn cuUserObjectRetain(obj: u64, n: c_uint) {
        let n = count(n)?;
        objects().retain(obj, n)
    }

    /// Releasing more references than the object has is an invalid value.
    fn cuUserObjectRelease(obj: u64, n: c_uint) {
        let n = count(n)?;
        let due = objects().release(obj, n)?;
        run_destroyers(due.into_iter().collect());
        Ok(())
    }

    fn cuGraphRetainUserObject(g: u64, obj: u64, n: c_uint, flags: c_uint) {
        let n = count(n)?;
        if flags & !MOVE != 0 {
            return Err(code::INVALID_VALUE);
        }
        graphs().graph(g)?.objects.add(obj, n, flags == MOVE)
    }

    /// The graph must hold `n` references to `obj`.
    fn cuGraphReleaseUserObject(g: u64, obj: u64, n: c_uint) {
        let n = count(n)?;
        let due = graphs().graph(g)?.objects.remove(obj, n)?;
        run_destroyers(due.into_iter().collect());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use super::*;

    /// Counts its calls in the `AtomicUsize` it is given.
    unsafe extern "C" fn bump(p: *mut c_void) {
        // SAFETY: a leaked `AtomicUsize` of the test's.
        unsafe { &*(p as *const AtomicUsize) }.fetch_add(1, Ordering::SeqCst);
    }

    /// A counter that outlives the test (the callback may run late).
    fn counter() -> &'static AtomicUsize {
        Box::leak(Box::new(AtomicUsize::new(0)))
    }

    fn create(c: &'static AtomicUsize, refs: c_uint) -> u64 {
        let mut h = 0;
        assert_eq!(
            new_object(Some(&mut h), c, Some(bump), refs, 1),
            code::SUCCESS
        );
        h
    }

    /// Waits up to a second for `c` to reach `n`, then says what it is.
    fn settle(c: &AtomicUsize, n: usize) -> usize {
        let end = Instant::now() + Duration::from_secs(1);
        while c.load(Ordering::SeqCst) < n && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        c.load(Ordering::SeqCst)
    }

    fn refs_of(h: u64) -> Option<u64> {
        objects().live.get(&h).map(|o| o.refs)
    }

    /// `cuUserObjectCreate` with a pointer-sized out-parameter of the test's.
    fn new_object(
        h: Option<&mut u64>,
        c: &'static AtomicUsize,
        f: Option<Destroy>,
        refs: c_uint,
        flags: c_uint,
    ) -> CuResult {
        let h = h.map_or(std::ptr::null_mut(), |h| h as *mut u64);
        let p = c as *const AtomicUsize as *mut c_void;
        // SAFETY: `h` is null or the test's; `f` takes `p`.
        unsafe { cuUserObjectCreate(h, p, f, refs, flags) }
    }

    fn retain(h: u64, n: c_uint) -> CuResult {
        // SAFETY: handles are checked; nothing is written.
        unsafe { cuUserObjectRetain(h, n) }
    }

    fn release(h: u64, n: c_uint) -> CuResult {
        // SAFETY: as for `retain`.
        unsafe { cuUserObjectRelease(h, n) }
    }

    fn graph_retain(g: u64, h: u64, n: c_uint, flags: c_uint) -> CuResult {
        // SAFETY: as for `retain`.
        unsafe { cuGraphRetainUserObject(g, h, n, flags) }
    }

    fn graph_release(g: u64, h: u64, n: c_uint) -> CuResult {
        // SAFETY: as for `retain`.
        unsafe { cuGraphReleaseUserObject(g, h, n) }
    }

    #[test]
    fn create_checks_its_arguments() {
        let c = counter();
        let mut h = 0;
        let bad = [
            new_object(None, c, Some(bump), 1, 1),
            new_object(Some(&mut h), c, None, 1, 1),
            new_object(Some(&mut h), c, Some(bump), 0, 1),
            new_object(Some(&mut h), c, Some(bump), 1, 0),
            new_object(Some(&mut h), c, Some(bump), 1, 2),
        ];
        assert_eq!(bad, [code::INVALID_VALUE; 5]);
        assert_eq!(h, 0);
    }

    #[test]
    fn the_last_release_runs_the_callback_once() {
        let c = counter();
        let h = create(c, 2);
        assert_eq!(retain(h, 0), code::INVALID_VALUE);
        assert_eq!(retain(h + 1_000_000, 1), code::INVALID_VALUE);
        assert_eq!(retain(h, 3), code::SUCCESS);
        assert_eq!(release(h, 0), code::INVALID_VALUE);
        assert_eq!(release(h, 6), code::INVALID_VALUE, "more than it has");
        assert_eq!(release(h, 4), code::SUCCESS);
        assert_eq!(refs_of(h), Some(1));
        assert_eq!(settle(c, 1), 0, "not while a reference is left");
        assert_eq!(release(h, 1), code::SUCCESS);
        assert_eq!(settle(c, 1), 1);
        assert_eq!(refs_of(h), None, "forgotten");
        assert_eq!(release(h, 1), code::INVALID_VALUE);
        assert_eq!(settle(c, 2), 1);
    }

    #[test]
    fn graphs_hold_references_moved_or_new() {
        let c = counter();
        let h = create(c, 1);
        let mut r = Refs::default();
        assert_eq!(r.add(h + 1_000_000, 1, true), Err(code::INVALID_VALUE));
        r.add(h, 1, true).unwrap();
        assert_eq!(refs_of(h), Some(1), "moved: no new reference");
        r.add(h, 2, false).unwrap();
        assert_eq!((refs_of(h), r.count(h)), (Some(3), 3));
        assert_eq!(r.remove(h, 4), Err(code::INVALID_VALUE), "more than held");
        assert!(r.remove(h, 1).unwrap().is_none());
        assert_eq!((refs_of(h), r.count(h)), (Some(2), 2));
        let copy = r.clone();
        assert_eq!((refs_of(h), copy.count(h)), (Some(4), 2), "a clone's own");
        drop(r);
        assert_eq!(refs_of(h), Some(2));
        assert_eq!(settle(c, 1), 0);
        drop(copy);
        assert_eq!(settle(c, 1), 1, "released with the last holder");
        assert_eq!(refs_of(h), None);
    }

    #[test]
    fn graph_entry_points_check_the_graph_and_its_count() {
        let c = counter();
        let h = create(c, 1);
        let g = graphs().new_graph();
        assert_eq!(graph_retain(g, h, 1, 2), code::INVALID_VALUE);
        assert_eq!(graph_retain(g, h, 0, 1), code::INVALID_VALUE);
        assert_eq!(graph_retain(g + 1_000_000, h, 1, 1), code::INVALID_VALUE);
        assert_eq!(graph_retain(g, h, 1, 1), code::SUCCESS);
        assert_eq!(graph_release(g, h, 2), code::INVALID_VALUE);
        // A child graph node's copy and a clone hold their own.
        let parent = graphs().new_graph();
        let child = graphs().graphs[&g].clone();
        graphs().add(parent, Op::Graph(child), &[]).unwrap();
        let copy = graphs().clone_graph(g).unwrap();
        assert_eq!(refs_of(h), Some(3));
        // What an executable of the parent holds.
        let ex = {
            let s = graphs();
            gather(&s, &s.graphs[&parent])
        };
        assert_eq!((ex.count(h), refs_of(h)), (1, Some(4)));
        assert_eq!(graph_release(g, h, 1), code::SUCCESS);
        for x in [g, parent, copy] {
            graphs().destroy(x).unwrap();
        }
        assert_eq!(refs_of(h), Some(1), "the executable's is left");
        assert_eq!(settle(c, 1), 0);
        drop(ex);
        assert_eq!(settle(c, 1), 1);
    }
}
