//! Waiting for the device without blocking the worker.
//!
//! A request that must wait for work on the device (a synchronize, an event
//! synchronize, a device-to-host copy, which reads what the work before it
//! wrote) marks its point in the work ([`crate::executor::Streams::mark`])
//! and is *parked* on its channel. The worker goes on serving every other
//! channel, its guest's other threads included, and looks at the mark on
//! each pass; when the device passes it, the request is answered (or the
//! copy streams out). One guest waiting on a long kernel holds up nobody.

use protocol::{Reply, Status};

use super::channel::{reply, ChannelState};
use super::shared::Shared;
use super::transfer::{pump_outbound, Outbound};
use crate::executor::{Handle, Marker};
use crate::session::{Period, Session};
use crate::Error;

/// What a parked request waits for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Wait {
    /// A mark of the context's work.
    Mark(Marker),
    /// An event's last record (`cuEventSynchronize`).
    Event(Handle),
    /// A guest host function to hand out (`Request::WaitHostFn`), until
    /// the deadline (then: none yet).
    HostFn { until: std::time::Instant },
    /// The fd of another worker's export it opens, from the daemon
    /// (`requests/ipc_across.rs`).
    IpcFd(super::requests::ipc_across::OpenWait),
}

/// What follows once it is there.
#[derive(Debug)]
pub(super) enum Then {
    /// The reply (success).
    Reply,
    /// A device-to-host copy streams out.
    Dtoh { src: u64, len: u64, stream: Handle },
}

/// A request waiting on its channel.
#[derive(Debug)]
pub(super) struct Parked {
    pub tag: u64,
    pub opcode: u32,
    pub wait: Wait,
    pub then: Then,
    /// The busy period the wait drains, charged when the device is there.
    pub period: Option<Period>,
}

/// Parks a request on `c` and looks at it once (the device may be there
/// already).
pub(super) fn park(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    p: Parked,
) -> Result<(), Error> {
    c.parked = Some(p);
    poll(sh, c, s).map(drop)
}

/// Whether the device passed what the channel's parked request waits for;
/// if so, finishes it. True when it finished.
pub(super) fn poll(sh: &mut Shared, c: &mut ChannelState, s: &mut Session) -> Result<bool, Error> {
    let Some(p) = c.parked.as_ref() else {
        return Ok(false);
    };
    let r = match p.wait {
        Wait::Mark(m) => s.ctx.reached(m),
        // Done: synchronized as well, which is where the driver writes the
        // context's kernel printf text (the query does not).
        Wait::Event(e) => match s.ctx.event_query(e) {
            Ok(true) => s.ctx.event_synchronize(e).map(|()| true),
            r => r,
        },
        Wait::HostFn { until } => return hand_out_host_fn(sh, c, s, until),
        Wait::IpcFd(w) => return super::requests::ipc_across::poll_open(sh, c, s, w),
    };
    if let Ok(false) = r {
        return Ok(false);
    }
    let p = c.parked.take().expect("checked above");
    match (r, p.then) {
        (Ok(_), Then::Reply) => {
            reply(&sh.port, c, p.tag, p.opcode, Ok(Reply::default()), &[])?;
            if let Some(period) = p.period {
                sh.slice.charge_period(s, period);
            }
        }
        (Ok(_), Then::Dtoh { src, len, stream }) => {
            if let Some(period) = p.period {
                sh.slice.charge_period(s, period);
            }
            c.outbound = Some(Outbound {
                tag: p.tag,
                src,
                len,
                off: 0,
                stream,
            });
            pump_outbound(sh, c, s)?;
        }
        // The work before the mark failed: so does the call (its period
        // is dropped: there is nothing more to charge).
        (Err(e), _) => {
            written_at_fault(s, e);
            reply(&sh.port, c, p.tag, p.opcode, Err::<Reply, Status>(e), &[])?
        }
    }
    Ok(true)
}

/// Hands the session's host function to the callback thread parked on
/// `c` once its stream is there (with the error of the work before it, if
/// any, in the reply's second value), or "none" (id 0) at the deadline.
fn hand_out_host_fn(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    until: std::time::Instant,
) -> Result<bool, Error> {
    let ready = match s.host_fn.as_mut() {
        Some(h) if !h.delivered => h.poll(&mut *s.ctx).map(|r| (h.id, r)),
        _ => None,
    };
    let vals = match ready {
        Some((id, r)) => {
            if let Some(h) = s.host_fn.as_mut() {
                h.delivered = true;
            }
            [id, u64::from(r.err().map_or(0, Status::code)), 0, 0]
        }
        None if std::time::Instant::now() >= until => [0; 4],
        None => return Ok(false),
    };
    let p = c.parked.take().expect("the caller found it parked");
    reply(&sh.port, c, p.tag, p.opcode, Ok(Reply { vals }), &[])?;
    Ok(true)
}

/// A synchronize that meets a kernel fault: the driver writes the
/// context's kernel output (the failed assert's message among it) when
/// the context synchronizes, which a query does not do. Past a sticky
/// error a synchronize returns at once.
pub(super) fn written_at_fault(s: &mut Session, e: Status) {
    if e.is_sticky() {
        let _ = s.ctx.synchronize();
    }
}

/// Lets a parked request go unanswered (its channel or session is going).
pub(super) fn abandon(c: &mut ChannelState, s: Option<&mut Session>) {
    if let (Some(p), Some(s)) = (c.parked.take(), s) {
        if let Wait::Mark(m) = p.wait {
            s.ctx.forget(m);
        }
    }
}

impl Parked {
    /// Whether it waits for the device (not for a guest's host function
    /// that may never come).
    pub fn on_device(&self) -> bool {
        !matches!(self.wait, Wait::HostFn { .. } | Wait::IpcFd(_))
    }
}
