//! The state each thread of the process keeps: every `thread_local!` of
//! the stand-in is declared here, in the one block below, with what it
//! holds and who changes it. The functions after it are the only ways to
//! read or change them.
//!
//! Three of them must outlive other libraries' thread-exit destructors
//! that still call the driver (cudart's, a framework's): the context stack
//! and the capture mode own nothing to drop, so they are never destroyed;
//! the others are reached with `try_with`, which fails quietly once the
//! thread is ending.

use std::cell::{Cell, RefCell};
use std::ffi::c_uint;

use cudarc::driver::sys::CUstream;

use super::{driver, gpu, objects};
use crate::{code, CuResult};

thread_local! {
    /// The calling thread's context stack; the current context is its top.
    /// Changed by the context entry points (`cuCtxPushCurrent`,
    /// `cuCtxSetCurrent`, `cuCtxDestroy`, ..., in `context.rs`) through
    /// [`push`], [`pop`], [`set_current`] and [`remove`].
    static STACK: Stack = const {
        Stack { len: Cell::new(0), items: [const { Cell::new(0) }; STACK_DEPTH] }
    };
    /// Whether the entry point running on this thread is a per-thread
    /// default stream variant (`_ptds`/`_ptsz`): set for the call by
    /// [`per_thread`], which the `export!` macro wraps those aliases in.
    static PTDS: Cell<bool> = const { Cell::new(false) };
    /// This thread's own default stream on the host (0: not made yet);
    /// made by [`resolve`] on first use, destroyed when the thread ends.
    static OWN: ThreadStream = const { ThreadStream(Cell::new(0)) };
    /// The channel slot this thread is bound to (see [`super::Driver`]);
    /// set on the thread's first call to the host, given back when the
    /// thread ends.
    static SLOT: Binding = const { Binding(Cell::new(None)) };
    /// Calls to the host the thread is inside: counted by [`InCall`]
    /// around each call, read by the managed-memory fault handler, which
    /// must not wait on the call's own lock.
    static IN_CALL: Cell<u32> = const { Cell::new(0) };
    /// This thread's `CUstreamCaptureMode`, exchanged by
    /// `cuThreadExchangeStreamCaptureMode` (`graph/capture.rs`).
    static CAPTURE_MODE: Cell<c_uint> = const { Cell::new(0) };
    /// The dependencies last handed out by `cuStreamGetCaptureInfo` on this
    /// thread (the caller reads them through the pointer it was given);
    /// replaced by each such call.
    static DEPS_OUT: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

// Contexts.

/// How deep a thread's context stack may grow.
pub(crate) const STACK_DEPTH: usize = 64;

/// A thread's context stack. It owns nothing to drop, so the thread-local
/// holding it is never destroyed: other libraries' thread-exit destructors
/// (cudart's, a framework's) that call the driver still see it.
struct Stack {
    len: Cell<usize>,
    items: [Cell<usize>; STACK_DEPTH],
}

/// The calling thread's current context (0: none).
pub(crate) fn current() -> usize {
    STACK.with(|s| {
        s.len
            .get()
            .checked_sub(1)
            .map_or(0, |top| s.items[top].get())
    })
}

pub(crate) fn set_current(h: usize) {
    STACK.with(|s| match s.len.get() {
        0 if h != 0 => {
            s.items[0].set(h);
            s.len.set(1);
        }
        0 => {}
        n if h == 0 => s.len.set(n - 1),
        n => s.items[n - 1].set(h),
    })
}

/// Pushes `h`; `CUDA_ERROR_OUT_OF_MEMORY` past `STACK_DEPTH` contexts.
pub(crate) fn push(h: usize) -> Result<(), CuResult> {
    STACK.with(|s| {
        let n = s.len.get();
        if n == STACK_DEPTH {
            return Err(code::OUT_OF_MEMORY);
        }
        s.items[n].set(h);
        s.len.set(n + 1);
        Ok(())
    })
}

/// Pops the top context, if any.
pub(crate) fn pop() -> Option<usize> {
    STACK.with(|s| {
        let n = s.len.get().checked_sub(1)?;
        s.len.set(n);
        Some(s.items[n].get())
    })
}

/// Takes `h` out of this thread's stack wherever it is.
pub(crate) fn remove(h: usize) {
    STACK.with(|s| {
        let mut kept = 0;
        for i in 0..s.len.get() {
            let c = s.items[i].get();
            if c != h {
                s.items[kept].set(c);
                kept += 1;
            }
        }
        s.len.set(kept);
    })
}

/// `CUDA_ERROR_INVALID_CONTEXT` unless the calling thread has a current
/// context (after `cuInit`).
pub(crate) fn need_ctx() -> Result<(), CuResult> {
    driver()?;
    if current() == 0 {
        return Err(code::INVALID_CONTEXT);
    }
    Ok(())
}

// Default streams.

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`.
const LEGACY: u64 = 0x1;
const PER_THREAD: u64 = 0x2;

/// A thread's own default stream, destroyed on the host when the thread ends.
struct ThreadStream(Cell<u64>);

impl Drop for ThreadStream {
    fn drop(&mut self) {
        let h = self.0.get();
        if h != 0 {
            let _ = gpu(|g| g.stream_destroy(h));
        }
    }
}

/// Runs `f` (an entry point) with the per-thread default stream as the
/// default stream.
pub(crate) fn per_thread(f: impl FnOnce() -> CuResult) -> CuResult {
    let was = PTDS.with(|p| p.replace(true));
    let r = f();
    PTDS.with(|p| p.set(was));
    r
}

/// This thread's default stream on the host.
fn thread_stream() -> Result<u64, CuResult> {
    if let Some(h) = OWN.try_with(|s| s.0.get()).ok().filter(|&h| h != 0) {
        return Ok(h);
    }
    let h = gpu(|g| g.stream_create(0, 0))?;
    if OWN.try_with(|s| s.0.set(h)).is_err() {
        // The thread is ending: use the stream once and let it go.
        let _ = gpu(|g| g.stream_destroy(h));
        return Ok(0);
    }
    objects()?.streams.insert(h, (0, 0));
    Ok(h)
}

/// The host stream a `CUstream` argument names.
pub(crate) fn resolve(st: CUstream) -> Result<u64, CuResult> {
    match st as u64 {
        0 if PTDS.with(Cell::get) => thread_stream(),
        0 | LEGACY => Ok(0),
        PER_THREAD => thread_stream(),
        h => {
            if !objects()?.streams.contains_key(&h) {
                return Err(code::INVALID_HANDLE);
            }
            Ok(h)
        }
    }
}

// Channel slots.

/// A thread's slot, given back when the thread ends.
struct Binding(Cell<Option<usize>>);

impl Drop for Binding {
    fn drop(&mut self) {
        if let Some(s) = self.0.get() {
            super::unbind(s);
        }
    }
}

/// The slot this thread is bound to, if any.
pub(super) fn bound_slot() -> Option<usize> {
    SLOT.try_with(|b| b.0.get()).ok().flatten()
}

/// Binds this thread to `slot`; false if the thread is ending (it keeps no
/// binding then).
pub(super) fn bind_slot(slot: usize) -> bool {
    SLOT.try_with(|b| b.0.set(Some(slot))).is_ok()
}

/// Whether the calling thread is inside a call to the host.
pub(crate) fn in_call() -> bool {
    IN_CALL.try_with(Cell::get).unwrap_or(0) > 0
}

/// Counts the thread in a call to the host while alive.
pub(super) struct InCall;

impl InCall {
    pub(super) fn enter() -> InCall {
        let _ = IN_CALL.try_with(|c| c.set(c.get() + 1));
        InCall
    }
}

impl Drop for InCall {
    fn drop(&mut self) {
        let _ = IN_CALL.try_with(|c| c.set(c.get() - 1));
    }
}

// Stream capture.

/// Sets this thread's capture mode to `new`; returns the one it had.
pub(crate) fn exchange_capture_mode(new: c_uint) -> c_uint {
    CAPTURE_MODE.with(|m| m.replace(new))
}

/// Keeps `deps` for the caller of `cuStreamGetCaptureInfo` to read, until
/// this thread's next such call; returns where they are. A thread-exit
/// destructor finds this thread's list gone: `CUDA_ERROR_DEINITIALIZED`.
pub(crate) fn hand_out_deps(deps: Vec<u64>) -> Result<*const u64, CuResult> {
    DEPS_OUT
        .try_with(|v| {
            *v.borrow_mut() = deps;
            v.borrow().as_ptr()
        })
        .map_err(|_| code::DEINITIALIZED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_current_replaces_the_top_and_null_pops() {
        set_current(5);
        assert_eq!(current(), 5);
        push(7).unwrap();
        assert_eq!(current(), 7);
        set_current(9);
        assert_eq!(current(), 9);
        set_current(0);
        assert_eq!(current(), 5);
        set_current(0);
        assert_eq!(current(), 0);
        set_current(0);
        assert_eq!(current(), 0);
    }

    #[test]
    fn the_stack_is_bounded_and_removal_keeps_the_order() {
        for h in 1..=STACK_DEPTH {
            push(h).unwrap();
        }
        assert_eq!(push(99), Err(code::OUT_OF_MEMORY));
        remove(STACK_DEPTH);
        remove(3);
        assert_eq!(current(), STACK_DEPTH - 1);
        assert_eq!(pop(), Some(STACK_DEPTH - 1));
        while pop().is_some() {}
        assert_eq!(current(), 0);
    }
}
