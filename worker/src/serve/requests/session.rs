//! The session family on a channel already serving one: a second `Hello`
//! (the device again; the session stays), `TakeOutput` (what the process's
//! kernels printed), and the two that belong before a session (`Join`,
//! `VgpuStatus`: see `channel.rs`), refused here.

use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::super::channel::{refuse, reply, ChannelState};
use super::super::shared::Port;
use crate::Error;

/// Runs a session request on `c` and replies.
pub(super) fn handle(
    port: &Port,
    c: &mut ChannelState,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    let (tag, opc) = (d.tag, d.opcode);
    match req {
        // A second Hello on a channel: the device again (its session stays).
        Request::Hello { version } => {
            let r = if version == protocol::PROTOCOL_VERSION {
                Ok(Reply::default())
            } else {
                Err(Status::NotSupported)
            };
            reply(port, c, tag, opc, r, &port.info_bytes)
        }
        Request::TakeOutput => {
            // A message's worth of the process's oldest text, with its
            // stream; stream 0 and no bytes: nothing held.
            let max = port.chunk;
            let taken = c
                .session
                .and_then(|id| port.output.borrow_mut().take(id, max));
            let (stream, text) = taken.unwrap_or((0, Vec::new()));
            reply(port, c, tag, opc, Ok(Reply::one(u64::from(stream))), &text)
        }
        Request::VgpuStatus { .. } => {
            refuse(
                port,
                c,
                "VgpuStatus on a session's channel (ask before Hello)",
            );
            reply(port, c, tag, opc, Err(Status::InvalidValue), &[])
        }
        Request::Join { .. } => {
            refuse(port, c, "join on a channel already serving a session");
            reply(port, c, tag, opc, Err(Status::InvalidValue), &[])
        }
        _ => super::misrouted(port, c, d, "session"),
    }
}
