//! What each request does, by driver-API family: [`handle`] takes a
//! channel's request, reports an earlier asynchronous failure first, and
//! hands the request to the handler of its family (the table row's `in`,
//! [`protocol::Family`]), one file each:
//!
//! | file | family |
//! | --- | --- |
//! | `session.rs` | the process's session: `Hello` again, `Join`, `VgpuStatus`, `TakeOutput` |
//! | `memory.rs` | allocations, frees, copies, memset, the pinned pool |
//! | `module.rs` | modules, functions, globals, attributes, occupancy, tensor maps |
//! | `launch.rs` | kernel launches (batched, sliced, timed), host functions |
//! | `stream.rs` | streams, events, the context's synchronize and limits |
//! | `graph.rs` | graphs and conditional scopes |
//! | `vmm.rs` | virtual memory management |
//! | `ipc.rs` | IPC memory and event handles |
//! | `ipc_across.rs` | IPC between the workers of a VM with process slots |
//! | `share.rs` | shareable handles: VMM memory and pools |
//! | `arrays.rs` | CUDA arrays, texture and surface objects |
//!
//! A handler gets the pieces of [`Shared`] it uses (the port to answer
//! on, the vGPU's memory, the grant's slice, the export tables); a
//! request that waits for the device (`wait.rs`) or streams data
//! (`transfer.rs`) hands the whole of it on, as the serving loop does.

mod arrays;
mod graph;
mod ipc;
pub(super) mod ipc_across;
mod launch;
mod memory;
mod module;
mod session;
pub(super) mod share;
mod stream;
mod vmm;

use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::channel::{refuse, reply, ChannelState};
use super::shared::{Port, Shared};
use super::transfer::{skip_data, start_module};
use crate::session::Session;
use crate::Error;

pub(super) use memory::deferred_frees;

/// Runs a channel's request (its first descriptor; the data chunks that
/// follow go to [`super::transfer::continue_transfer`]) for session `s`.
pub(super) fn handle(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
) -> Result<(), Error> {
    if c.transfer.is_some() {
        // A new request while data was still owed: the guest broke the stream.
        c.transfer = None;
        refuse(
            &sh.port,
            c,
            "request before the previous one's data was complete",
        );
        s.defer(Status::InvalidValue);
    }
    let req = match Request::decode(d.opcode, &d.inline) {
        Ok(r) => r,
        Err(e) => {
            refuse(&sh.port, c, &e.to_string());
            if d.flags & transport::FLAG_NO_REPLY == 0 {
                return reply(&sh.port, c, d.tag, d.opcode, Err(Status::InvalidValue), &[]);
            }
            s.defer(Status::InvalidValue);
            return Ok(());
        }
    };
    // Synchronous calls first report an earlier asynchronous failure.
    if req.expects_reply() && !matches!(req, Request::Hello { .. }) {
        if let Some(err) = s.pending_error.take() {
            if let Request::ModuleLoad { len, kind } = req {
                // Still swallow the image that follows.
                start_module(c, d.tag, kind, len, d)?;
                c.transfer = None;
                skip_data(c, d, len);
            }
            super::wait::written_at_fault(s, err);
            return reply(&sh.port, c, d.tag, d.opcode, Err(err), &[]);
        }
    }
    use protocol::Family as F;
    match req.family() {
        F::Session => session::handle(&sh.port, c, d, req),
        F::Memory => memory::handle(sh, c, s, d, req),
        F::Module => module::handle(sh, c, s, d, req),
        F::Launch => launch::handle(sh, c, s, d, req),
        F::Stream => stream::handle(sh, c, s, d, req),
        F::Graph => graph::handle(sh, c, s, d, req),
        F::Vmm => vmm::handle(&sh.port, &mut sh.mem, &mut sh.tables, c, s, d, req),
        F::Ipc => ipc::handle(sh, c, s, d, req),
        F::Share => share::handle(sh, c, s, d, req),
        F::Arrays => arrays::handle(&sh.port, &mut sh.mem, &mut sh.slice, c, s, d, req),
    }
}

/// A request its family's handler does not serve: refused (the table
/// names each request's family, and [`handle`] gives each family only its
/// own, so only a row whose family's file lacks its handler comes here).
fn misrouted(port: &Port, c: &mut ChannelState, d: &Descriptor, family: &str) -> Result<(), Error> {
    refuse(port, c, &format!("not a {family} request"));
    reply(port, c, d.tag, d.opcode, Err(Status::InvalidValue), &[])
}

/// A call's value as a reply.
fn one(r: Result<u64, Status>) -> Result<Reply, Status> {
    r.map(Reply::one)
}

/// A call's success as a reply.
fn unit(r: Result<(), Status>) -> Result<Reply, Status> {
    r.map(|()| Reply::default())
}

/// A query's answer: success when done, `NotReady` otherwise (as CUDA reports it).
fn ready(done: bool) -> Result<Reply, Status> {
    if done {
        Ok(Reply::default())
    } else {
        Err(Status::NotReady)
    }
}
