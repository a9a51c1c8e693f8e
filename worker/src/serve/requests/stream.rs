//! The stream family: streams and events, the context's synchronize and
//! limits. A synchronize is parked until the device is there (`wait.rs`),
//! closing the busy period it drains.

use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::super::channel::{refuse, reply, ChannelState};
use super::super::shared::{Shared, Slice};
use super::super::wait::{self, Parked, Then, Wait};
use super::{one, ready, unit};
use crate::executor::Handle;
use crate::session::Session;
use crate::Error;

/// Runs a stream-family request of session `s` and replies if it expects
/// one.
pub(super) fn handle(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    let (tag, opc) = (d.tag, d.opcode);
    match req {
        Request::CtxSynchronize => park_drain(sh, c, s, d, None),
        Request::StreamSynchronize { stream } => match s.check_stream(stream) {
            Ok(()) => park_drain(sh, c, s, d, Some(stream)),
            Err(e) => reply(&sh.port, c, tag, opc, Err(e), &[]),
        },
        Request::EventSynchronize { event } => match s.check_event(event) {
            Ok(()) => {
                let p = Parked {
                    tag,
                    opcode: opc,
                    wait: Wait::Event(event),
                    then: Then::Reply,
                    period: None,
                };
                wait::park(sh, c, s, p)
            }
            Err(e) => reply(&sh.port, c, tag, opc, Err(e), &[]),
        },
        Request::StreamWaitEvent {
            stream,
            event,
            flags,
        } => {
            let r = s
                .check_stream(stream)
                .and(s.check_event(event))
                .and_then(|()| {
                    sh.slice.in_period(s, stream, None, |x| {
                        x.stream_wait_event(stream, event, flags)
                    })
                });
            if let Err(e) = r {
                s.defer(e);
                refuse(&sh.port, c, "wait on a stream or event it does not own");
            }
            Ok(())
        }
        Request::EventRecord { event, stream } => {
            let r = s
                .check_event(event)
                .and(s.check_stream(stream))
                .and_then(|()| {
                    sh.slice
                        .in_period(s, stream, None, |x| x.event_record(event, stream))
                });
            if let Err(e) = r {
                s.defer(e);
            }
            Ok(())
        }
        req => {
            let r = run(s, req);
            match r {
                Some(r) => reply(&sh.port, c, tag, opc, r, &[]),
                None => super::misrouted(&sh.port, c, d, "stream"),
            }
        }
    }
}

/// The stream-family requests answered at once, from the session alone;
/// `None` for another family's.
fn run(s: &mut Session, req: Request) -> Option<Result<Reply, Status>> {
    Some(match req {
        Request::CtxGetLimit { limit } => one(s.ctx.limit(limit)),
        Request::CtxSetLimit { limit, value } => unit(s.ctx.set_limit(limit, value)),
        Request::StreamCreate { flags, priority } => one(s
            .ctx
            .stream_create(flags, priority)
            .inspect(|&h| s.add_stream(h))),
        Request::StreamSetAttribute { stream, attr } => {
            let r = s.check_stream(stream);
            unit(r.and_then(|()| s.ctx.stream_set_attribute(stream, attr)))
        }
        Request::StreamGetAttribute { stream, attr } => {
            let r = s.check_stream(stream);
            r.and_then(|()| s.ctx.stream_attribute(stream, attr))
                .map(|a| {
                    let raw = a.to_raw();
                    let mut vals = [0u64; 4];
                    for (v, b) in vals.iter_mut().zip(raw.chunks_exact(8)) {
                        *v = u64::from_le_bytes(b.try_into().unwrap_or_default());
                    }
                    Reply { vals }
                })
        }
        Request::StreamDestroy { stream } => {
            let r = if stream == 0 {
                Err(Status::InvalidHandle)
            } else {
                s.check_stream(stream)
            };
            unit(
                r.and_then(|()| s.ctx.stream_destroy(stream))
                    .inspect(|()| s.remove_stream(stream)),
            )
        }
        Request::StreamQuery { stream } => {
            let r = s
                .check_stream(stream)
                .and_then(|()| s.ctx.stream_query(stream));
            r.and_then(ready)
        }
        Request::EventCreate { flags } => {
            one(s.ctx.event_create(flags).inspect(|&h| s.add_event(h)))
        }
        Request::EventDestroy { event } => unit(if s.imported_events.remove(event) {
            // Another process's event it opened (IPC), revoked or not:
            // forgotten here.
            s.ctx.event_destroy(event)
        } else if s.orphan_event_if_opened(event) {
            // Another process has it open (IPC): destroyed once it lets
            // go of it.
            Ok(())
        } else {
            s.check_own_event(event)
                .and_then(|()| s.ctx.event_destroy(event))
                .inspect(|()| s.remove_event(event))
        }),
        Request::EventQuery { event } => {
            let r = s.check_event(event).and_then(|()| s.ctx.event_query(event));
            r.and_then(ready)
        }
        Request::EventElapsedTime { start, end } => s
            .check_event(start)
            .and(s.check_event(end))
            .and_then(|()| s.ctx.event_elapsed(start, end))
            .map(|ms| Reply::one(u64::from(ms.to_bits()))),
        _ => return None,
    })
}

/// Parks a synchronize of `stream` (`None`: the whole context) until the
/// device has done the work submitted before it, marking the end of the
/// busy period it drains (charged once the device is there).
fn park_drain(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    stream: Option<Handle>,
) -> Result<(), Error> {
    let (tag, opc) = (d.tag, d.opcode);
    let period = if Slice::period_ending(s, stream) {
        s.period.take()
    } else {
        None
    };
    match s.ctx.mark(stream) {
        Ok(m) => {
            let p = Parked {
                tag,
                opcode: opc,
                wait: Wait::Mark(m),
                then: Then::Reply,
                period,
            };
            wait::park(sh, c, s, p)
        }
        // The work before failed: so does the drain (its period with it).
        Err(e) => {
            wait::written_at_fault(s, e);
            reply(&sh.port, c, tag, opc, Err(e), &[])
        }
    }
}
