//! Streams, events, synchronization, and the marks the worker waits on.

use std::ptr::null_mut;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use protocol::Status;

use super::check;
use super::context::{CudaContext, Obj};
use crate::executor::{Events, Handle, SharedMem, Streams};

/// An event of one context shared with another of the process, with the
/// owner's relay stream for it (as addresses: the worker thread alone uses
/// them, while their owner holds them).
struct RawEvent {
    event: usize,
    relay: usize,
}

impl Streams for CudaContext {
    fn stream_create(&mut self, flags: u32, priority: i32) -> Result<Handle, Status> {
        self.bind()?;
        let mut st: sys::CUstream = null_mut();
        // SAFETY: out-parameter on our stack; the driver clamps the priority.
        check(unsafe { sys::cuStreamCreateWithPriority(&mut st, flags, priority) })?;
        Ok(self.insert(Obj::Stream {
            raw: st,
            flags,
            priority,
        }))
    }

    fn stream_wait_event(&mut self, s: Handle, e: Handle, flags: u32) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        let ev = self.event(e)?;
        // SAFETY: a stream and an event of this context.
        check(unsafe { sys::cuStreamWaitEvent(st, ev, flags) })
    }

    fn stream_destroy(&mut self, s: Handle) -> Result<(), Status> {
        self.bind()?;
        if s == 0 {
            return Err(Status::InvalidHandle);
        }
        let st = self.stream(s)?;
        // SAFETY: a stream of this context, destroyed once.
        check(unsafe { sys::cuStreamDestroy_v2(st) })?;
        self.objs.remove(&s);
        self.templates.forget_stream(s);
        self.stream_attrs.forget(s);
        Ok(())
    }

    fn stream_synchronize(&mut self, s: Handle) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        // SAFETY: a stream of this context (or the default one).
        check(unsafe { sys::cuStreamSynchronize(st) })
    }

    fn stream_query(&mut self, s: Handle) -> Result<bool, Status> {
        self.bind()?;
        let st = self.stream(s)?;
        // SAFETY: a stream of this context.
        match unsafe { sys::cuStreamQuery(st) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(Status::from_code(e as u32)),
        }
    }

    fn synchronize(&mut self) -> Result<(), Status> {
        self.bind()?;
        // SAFETY: no arguments; our context is current.
        check(unsafe { sys::cuCtxSynchronize() })
    }

    fn mark(&mut self, stream: Option<Handle>) -> Result<crate::executor::Marker, Status> {
        self.bind()?;
        let streams: Vec<sys::CUstream> = match stream {
            Some(s) => vec![self.stream(s)?],
            None => std::iter::once(null_mut())
                .chain(self.objs.values().filter_map(|o| match o {
                    Obj::Stream { raw, .. } => Some(*raw),
                    _ => None,
                }))
                .collect(),
        };
        let mut events = Vec::with_capacity(streams.len());
        for st in streams {
            let e = self.pooled_event()?;
            // SAFETY: our own event and a stream of this context.
            let r = check(unsafe { sys::cuEventRecord(e, st) });
            events.push(e);
            if let Err(err) = r {
                self.event_pool.extend(events);
                return Err(err);
            }
        }
        self.next_mark += 1;
        self.marks.insert(self.next_mark, events);
        Ok(self.next_mark)
    }

    fn reached(&mut self, m: crate::executor::Marker) -> Result<bool, Status> {
        self.bind()?;
        let events = self.marks.get(&m).ok_or(Status::InvalidHandle)?;
        let mut outcome = Ok(true);
        for &e in events {
            // SAFETY: our own recorded event.
            match unsafe { sys::cuEventQuery(e) } {
                CUresult::CUDA_SUCCESS => {}
                CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                r => {
                    outcome = Err(Status::from_code(r as u32));
                    break;
                }
            }
        }
        if outcome.is_ok() {
            if let Some(&e) = events.last() {
                // The guest synchronized: the driver writes the context's
                // kernel printf text at an event's synchronize (even of a
                // finished one), not at a query (see `serve/output.rs`).
                // SAFETY: our own recorded event, finished.
                outcome = check(unsafe { sys::cuEventSynchronize(e) }).map(|()| true);
            }
        }
        self.forget(m);
        outcome
    }

    fn forget(&mut self, m: crate::executor::Marker) {
        if let Some(events) = self.marks.remove(&m) {
            self.event_pool.extend(events);
        }
    }
}

impl Events for CudaContext {
    fn event_create(&mut self, flags: u32) -> Result<Handle, Status> {
        self.bind()?;
        // Made without CU_EVENT_INTERPROCESS: the guests' IPC event handles
        // are the worker's own (`session::ipc`), and the driver's
        // interprocess event, used from another context of the process,
        // crashes it (an H100 with driver 580, `scripts/gpu/ipc.sh`: a
        // segfault in cuStreamWaitEvent; a plain event works there).
        // Kept where each process has a worker of its own (process slots):
        // another process opens it in its own worker (`ipc.rs`).
        let flags = if self.ipc_events {
            flags
        } else {
            flags & !(sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32)
        };
        let mut e: sys::CUevent = null_mut();
        // SAFETY: out-parameter on our stack.
        check(unsafe { sys::cuEventCreate(&mut e, flags) })?;
        Ok(self.insert(Obj::Event {
            raw: e,
            flags,
            relay: null_mut(),
        }))
    }

    fn event_destroy(&mut self, e: Handle) -> Result<(), Status> {
        self.bind()?;
        match self.objs.get(&e) {
            Some(&Obj::ImportedEvent { local, .. }) => {
                // Another context's: forgotten here, its owner destroys it;
                // only this context's marker of its records goes.
                self.objs.remove(&e);
                check(super::context::destroy_event(local, null_mut()))
            }
            Some(&Obj::Event { raw, relay, .. }) => {
                self.objs.remove(&e);
                check(super::context::destroy_event(raw, relay))
            }
            _ => Err(Status::InvalidHandle),
        }
    }

    /// Records `e` on stream `s`. Another context's event (IPC) cannot be
    /// recorded on a stream of this one (the driver answers an invalid
    /// handle), so its record is relayed: a marker event of this context
    /// is recorded on `s`, the owner's relay stream waits for it and the
    /// owner's event is recorded there. Whoever waits on the event then
    /// waits for `s`'s work up to this point, as with the driver's own
    /// interprocess events.
    fn event_record(&mut self, e: Handle, s: Handle) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        self.templates.recorded(s);
        let (raw, relay, local) = match self.objs.get_mut(&e) {
            Some(Obj::ImportedEvent { raw, relay, local }) => {
                if local.is_null() {
                    let mut m: sys::CUevent = null_mut();
                    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
                    // SAFETY: out-parameter on our stack; this context is current.
                    check(unsafe { sys::cuEventCreate(&mut m, flags) })?;
                    *local = m;
                }
                (*raw, *relay, *local)
            }
            _ => {
                let ev = self.event(e)?;
                // SAFETY: an event and a stream of this context.
                return check(unsafe { sys::cuEventRecord(ev, st) });
            }
        };
        // SAFETY: the marker and `st` are this context's; the relay stream
        // and `raw` are the owner's, alive while its export is (the worker
        // refuses an import whose export was revoked); waiting on another
        // context's event is allowed, recording one on its own stream too.
        check(unsafe { sys::cuEventRecord(local, st) })?;
        // SAFETY: see above.
        check(unsafe { sys::cuStreamWaitEvent(relay, local, 0) })?;
        // SAFETY: see above.
        check(unsafe { sys::cuEventRecord(raw, relay) })
    }

    fn event_synchronize(&mut self, e: Handle) -> Result<(), Status> {
        self.bind()?;
        let ev = self.event(e)?;
        // SAFETY: an event of this context.
        check(unsafe { sys::cuEventSynchronize(ev) })
    }

    fn event_query(&mut self, e: Handle) -> Result<bool, Status> {
        self.bind()?;
        let ev = self.event(e)?;
        // SAFETY: an event of this context.
        match unsafe { sys::cuEventQuery(ev) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(Status::from_code(r as u32)),
        }
    }

    fn event_elapsed(&mut self, start: Handle, end: Handle) -> Result<f32, Status> {
        self.bind()?;
        let (a, b) = (self.event(start)?, self.event(end)?);
        let mut ms = 0f32;
        // SAFETY: events of this context; out-parameter on our stack.
        check(unsafe { sys::cuEventElapsedTime_v2(&mut ms, a, b) })?;
        Ok(ms)
    }

    /// See [`crate::executor::Events::share_event`]: the driver's event,
    /// which every context of the process can wait on, and a stream of
    /// this context (made on the first export) on which the others record
    /// it: the driver records an event only on a stream of its own context.
    fn share_event(&mut self, e: Handle) -> Result<SharedMem, Status> {
        self.bind()?;
        let Some(Obj::Event { raw, relay, .. }) = self.objs.get_mut(&e) else {
            return Err(Status::InvalidHandle);
        };
        if relay.is_null() {
            let mut st: sys::CUstream = null_mut();
            // SAFETY: out-parameter on our stack; this context is current.
            // Non-blocking: records relayed on it wait only for what the
            // recording context's stream has queued, never for this
            // context's legacy default stream.
            check(unsafe {
                sys::cuStreamCreate(&mut st, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            })?;
            *relay = st;
        }
        Ok(SharedMem(Some(Arc::new(RawEvent {
            event: *raw as usize,
            relay: *relay as usize,
        }))))
    }

    /// See [`crate::executor::Events::import_event`].
    fn import_event(&mut self, shared: &SharedMem) -> Result<Handle, Status> {
        let &RawEvent { event, relay } = shared
            .0
            .as_ref()
            .and_then(|m| m.downcast_ref::<RawEvent>())
            .ok_or(Status::InvalidValue)?;
        Ok(self.insert(Obj::ImportedEvent {
            raw: event as sys::CUevent,
            relay: relay as sys::CUstream,
            local: null_mut(),
        }))
    }
}
