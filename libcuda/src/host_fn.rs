//! Host functions and stream callbacks (`cuLaunchHostFunc`,
//! `cuStreamAddCallback`), run in the guest in stream order.
//!
//! The function is queued on the host as a point in its stream. A callback
//! thread of the process (started with the first one, on a channel of its
//! own) waits for the host to hand out each function once the work before
//! it is done, runs it, and says so; the host runs none of the process's
//! later work until then, so everything after it in the stream (and, more
//! strictly than CUDA, in the process's other streams) waits for it.
//! Should no channel be free for the thread, a host function runs in the
//! calling thread once its stream is done instead.

use std::ffi::{c_uint, c_void};

use cudarc::driver::sys::CUstream;

use crate::state::process::{lock, HostFns, CALLBACK_THREAD, HOST_FNS};
pub(crate) use crate::state::process::{Call, HostFn, StreamCallback};
use crate::state::thread::need_ctx;
use crate::state::thread::resolve;
use crate::state::{driver, gpu};
use crate::{code, CuResult};

impl Call {
    /// Runs it, with the error of the work before it (callbacks see it).
    fn run(self, status: CuResult) {
        match self {
            // SAFETY: the program's function and data (its contract with
            // cuLaunchHostFunc).
            Call::Fn(f, data) => unsafe { f(data as *mut c_void) },
            // SAFETY: as above, for cuStreamAddCallback.
            Call::Callback(f, stream, data) => unsafe {
                f(stream as CUstream, status, data as *mut c_void)
            },
        }
    }
}

/// Starts the callback thread on a channel of its own, once.
fn callback_thread() -> bool {
    *CALLBACK_THREAD.get_or_init(|| {
        let Ok(d) = driver() else { return false };
        let Ok(mut g) = d.joiner().join() else {
            return false;
        };
        std::thread::Builder::new()
            .name("cuda-callbacks".into())
            .spawn(move || loop {
                match g.wait_host_fn() {
                    Ok((0, _)) => {}
                    Ok((id, status)) => {
                        let call = lock(&HOST_FNS).as_mut().and_then(|r| r.calls.remove(&id));
                        if let Some(call) = call {
                            let _ = std::panic::catch_unwind(|| call.run(status));
                        }
                        if g.host_fn_done(id).is_err() {
                            break;
                        }
                    }
                    // The vGPU went away (the process is exiting, or the
                    // host restarted): nothing more will come.
                    Err(_) => break,
                }
            })
            .is_ok()
    })
}

/// Runs `call` in `st`'s order (or adds it to `st`'s capture).
pub(crate) fn enqueue(st: CUstream, call: Call) -> Result<(), CuResult> {
    need_ctx()?;
    if crate::graph::capture::add(st, || Ok(crate::graph::Op::Host(call)))? {
        return Ok(());
    }
    let stream = resolve(st)?;
    if !callback_thread() {
        // No thread to run it: run it here once its stream is there.
        gpu(|g| g.stream_synchronize(stream))?;
        call.run(code::SUCCESS);
        return Ok(());
    }
    let id = {
        let mut g = lock(&HOST_FNS);
        let r = g.get_or_insert_with(HostFns::default);
        r.next += 1;
        r.calls.insert(r.next, call);
        r.next
    };
    gpu(|g| g.host_fn(stream, id)).inspect_err(|_| {
        if let Some(r) = lock(&HOST_FNS).as_mut() {
            r.calls.remove(&id);
        }
    })
}

export! {
    fn cuLaunchHostFunc [cuLaunchHostFunc_ptsz per_thread] (st: CUstream, f: Option<HostFn>, data: *mut c_void) {
        let f = f.ok_or(code::INVALID_VALUE)?;
        enqueue(st, Call::Fn(f, data as usize))
    }

    fn cuStreamAddCallback [cuStreamAddCallback_ptsz per_thread] (st: CUstream, f: Option<StreamCallback>, data: *mut c_void, flags: c_uint) {
        let f = f.ok_or(code::INVALID_VALUE)?;
        if flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        enqueue(st, Call::Callback(f, st as usize, data as usize))
    }
}
