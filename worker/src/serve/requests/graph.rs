//! The graph family: graphs instantiated from the data the guest sends
//! (built when the last of it is in, `transfer.rs`), launched and
//! destroyed, and conditional scopes with the handles made in them
//! (`crate::session::cond`).

use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::super::channel::{refuse, reply, ChannelState};
use super::super::shared::{Port, Shared, Slice};
use super::super::transfer::{continue_transfer, skip_data, Inbound, Transfer};
use super::unit;
use crate::session::Session;
use crate::Error;

/// Bytes of graph data the host takes (a graph of `protocol::graph::MAX_NODES`
/// nodes with a few hundred parameter bytes each).
const MAX_GRAPH_BYTES: usize = 16 << 20;

/// Runs a graph request of session `s` and replies if it expects one.
pub(super) fn handle(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    match req {
        Request::GraphInstantiate { len } => graph_data(sh, c, s, d, len, None),
        Request::GraphInstantiateIn { scope, len } => {
            if let Err(e) = s.conds.check_scope(scope) {
                refuse(
                    &sh.port,
                    c,
                    "graph for a conditional scope the process does not hold",
                );
                skip_data(c, d, u64::from(len));
                return reply(&sh.port, c, d.tag, d.opcode, Err(e), &[]);
            }
            graph_data(sh, c, s, d, len, Some(scope))
        }
        Request::GraphLaunch { exec, stream } => {
            launch(&sh.port, &mut sh.slice, c, s, exec, stream);
            Ok(())
        }
        req => run(&sh.port, c, s, d, req),
    }
}

/// Takes a graph's data (`GraphInstantiate`, or `GraphInstantiateIn` in
/// `scope`): built when the last of it is in.
fn graph_data(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    len: u32,
    scope: Option<u64>,
) -> Result<(), Error> {
    if len as usize > MAX_GRAPH_BYTES {
        refuse(&sh.port, c, "graph larger than the host takes");
        skip_data(c, d, u64::from(len));
        return reply(&sh.port, c, d.tag, d.opcode, Err(Status::InvalidValue), &[]);
    }
    c.transfer = Some(Transfer {
        inbound: Inbound::Graph {
            buf: Vec::new(),
            tag: d.tag,
            scope,
        },
        remaining: u64::from(len),
        offset: 0,
    });
    continue_transfer(sh, c, s, d)
}

/// Launches executable graph `exec` on `stream`; a failure is reported at
/// the next synchronous call.
fn launch(
    port: &Port,
    slice: &mut Slice,
    c: &mut ChannelState,
    s: &mut Session,
    exec: u64,
    stream: u64,
) {
    let r = s
        .check_graph(exec)
        .and(s.check_stream(stream))
        .and_then(|()| slice.in_period(s, stream, None, |x| x.graph_launch(exec, stream)));
    if let Err(e) = r {
        s.defer(e);
        refuse(port, c, "graph launch refused");
    }
}

/// The graph requests answered at once, from the session alone.
fn run(
    port: &Port,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    let r = match req {
        Request::GraphDestroy { exec } => {
            let r = s.check_graph(exec).and_then(|()| s.ctx.graph_destroy(exec));
            if r.is_ok() {
                s.remove_graph(exec);
            }
            unit(r)
        }
        Request::CondScopeCreate => s
            .conds
            .room()
            .and_then(|()| s.ctx.cond_scope_create())
            .inspect(|&h| s.conds.add_scope(h))
            .map(Reply::one),
        Request::CondHandleCreate {
            scope,
            default_value,
            flags,
        } => s
            .conds
            .handle_room(scope)
            .and_then(|()| s.ctx.cond_handle_create(scope, default_value, flags))
            .inspect(|&h| s.conds.add_handle(scope, h))
            .map(Reply::one),
        Request::CondScopeDestroy { scope } => {
            let r = s
                .conds
                .check_scope(scope)
                .and_then(|()| s.ctx.cond_scope_destroy(scope));
            if r.is_ok() {
                s.conds.remove_scope(scope);
            }
            unit(r)
        }
        _ => return super::misrouted(port, c, d, "graph"),
    };
    reply(port, c, d.tag, d.opcode, r, &[])
}
