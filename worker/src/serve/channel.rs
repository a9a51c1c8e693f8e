//! One channel of the region: claiming and reclaiming, the order in which
//! its requests run, replies, and what a broken channel costs (only itself).

use std::sync::atomic::{fence, Ordering};
use std::time::Duration;

use protocol::{op, Reply, Request, Status, INLINE};
use transport::layout::Direction;
use transport::{ClaimState, Descriptor, HostChannel};

use super::requests::handle;
use super::sessions::{SessionId, Sessions};
use super::shared::{Port, Shared, Slice};
use super::transfer::{continue_transfer, pump_outbound, pump_sliced, Outbound, Sliced, Transfer};
use super::wait::{self, Parked};
use crate::session::Session;
use crate::Error;

/// Requests served per channel before moving to the next (fairness between channels).
const BATCH: usize = 64;

/// What the worker keeps for one channel of the region.
pub(super) struct ChannelState {
    pub host: HostChannel,
    /// The session (guest process) the channel serves, once it said
    /// `Hello` or joined one.
    pub session: Option<SessionId>,
    /// A launch being issued sub-grid by sub-grid (kernel slicing); the
    /// channel's next requests wait for it, to keep their order.
    pub sliced: Option<Sliced>,
    pub transfer: Option<Transfer>,
    pub outbound: Option<Outbound>,
    pub outbox: Option<(Descriptor, Vec<u8>)>,
    /// A request waiting for the device (see `wait`).
    pub parked: Option<Parked>,
    /// The tag of the request last held back (see [`hold_for_departed`]):
    /// the next time it is answered, whatever it finds.
    pub held_back: Option<u64>,
    /// Set by a handler that held its request back (see
    /// [`hold_for_departed`]): it stays in the ring for the next turn.
    pub hold: bool,
}

impl ChannelState {
    pub fn new(host: HostChannel) -> ChannelState {
        ChannelState {
            host,
            session: None,
            sliced: None,
            transfer: None,
            outbound: None,
            outbox: None,
            parked: None,
            held_back: None,
            hold: false,
        }
    }

    /// Whether a request of the channel waits for the device.
    pub fn waiting(&self) -> bool {
        self.parked.as_ref().is_some_and(Parked::on_device)
    }
}

/// Polls one channel; true if it did any work.
pub(super) fn service(sh: &mut Shared, c: &mut ChannelState, ss: &mut Sessions) -> bool {
    let state = match c.host.state() {
        Ok(s) => s,
        Err(_) => return false,
    };
    if state.needs_reclaim() {
        teardown(sh, c, ss, state);
        return true;
    }
    if state != ClaimState::Claimed {
        return false;
    }
    let r = serve_channel(sh, c, ss);
    if let (Ok(true), Some(id)) = (&r, c.session) {
        sh.port.output.borrow_mut().touch(id);
    }
    // A launch's fault kept for the process's next call poisons the
    // worker as a reply's does (before its output is given to anyone), and
    // its context synchronizes now, so that the driver's message of the
    // fault is written and held for the process: a poisoned worker stays
    // only while a process has text to take, and the call that gets the
    // error may come after it would have gone.
    if let Some(e) = c.session.and_then(|id| ss.get_mut(id)) {
        if let Some(s) = e.s.pending_error.filter(|s| s.is_sticky()) {
            sh.port.note_fault(s, c.host.index());
            super::wait::written_at_fault(&mut e.s, s);
        }
    }
    // What the pass's calls made the driver write is this process's. A
    // pass that ran nothing made the driver write nothing: the worker polls
    // every channel on every turn, and this costs two reads of the pipes.
    if !matches!(r, Ok(false)) {
        sh.port.collect_output(c.session);
    }
    match r {
        Ok(did) => did,
        Err(e) => {
            // Corrupt rings: the guest broke its own channel. End it.
            transport::rate_limited!(
                sh.port.log.borrow_mut(),
                warn,
                channel = c.host.index(),
                "channel ended: {e}"
            );
            teardown(sh, c, ss, state);
            // Counted once done, so that whoever reads it sees the channel freed.
            sh.port
                .stats
                .broken_channels
                .fetch_add(1, Ordering::Relaxed);
            true
        }
    }
}

/// Serves a channel bound to no session: its first request must open one
/// (`Hello`) or join one (`Join`).
fn serve_unbound(sh: &mut Shared, c: &mut ChannelState, ss: &mut Sessions) -> Result<bool, Error> {
    let Some(d) = c.host.req.peek()? else {
        return Ok(false);
    };
    let r = match Request::decode(d.opcode, &d.inline) {
        Ok(Request::Hello { .. }) if sh.port.slot.is_some() && !ss.is_empty() => {
            // A process slot is one process's: a second would share its
            // worker process, and so its faults and its address space.
            refuse(&sh.port, c, "a second process in a process slot");
            Err(Status::NotPermitted)
        }
        Ok(Request::Hello { version }) if version == protocol::PROTOCOL_VERSION => {
            match sh.gpu.contexts.take(sh.gpu.exec.as_mut()) {
                // No spare and no token: the Hello waits in its ring.
                Ok(None) => {
                    sh.port.stats.count_contexts(&sh.gpu.contexts.counts);
                    return Ok(false);
                }
                Ok(Some(mut ctx)) => {
                    if sh.tables.vm.is_some() && sh.port.slot.is_some() {
                        // Its IPC handles go to other workers (`ipc_across.rs`).
                        ctx.set_across();
                    }
                    sh.port.stats.requests.fetch_add(1, Ordering::Relaxed);
                    sh.port.stats.count_contexts(&sh.gpu.contexts.counts);
                    let pid = sh.port.region.owner_pid(c.host.index()).unwrap_or(0);
                    let (id, token) = ss.open(Session::new(ctx), d.tag.wrapping_add(1), pid);
                    c.session = Some(id);
                    let _ = c.host.mark_serving();
                    let info = sh.port.info_bytes.clone();
                    let r = Reply {
                        vals: [token[0], token[1], 0, 0],
                    };
                    reply(&sh.port, c, d.tag, d.opcode, Ok(r), &info)?;
                    c.host.req.consume(&d)?;
                    return Ok(true);
                }
                // A process that has gone still holds its context: the
                // Hello waits in its ring for the teardown.
                Err(s)
                    if s == Status::MpsMaxClientsReached
                        && hold_for_departed(&sh.port, c, d.tag) =>
                {
                    return Ok(false);
                }
                Err(s) if s == Status::MpsMaxClientsReached => {
                    transport::rate_limited!(
                        sh.port.log.borrow_mut(),
                        warn,
                        channel = c.host.index(),
                        "a guest process was turned away: the vGPU runs as many at once as [[gpu]] mps_processes allows"
                    );
                    Err(s)
                }
                Err(s) => {
                    transport::rate_limited!(
                        sh.port.log.borrow_mut(),
                        error,
                        channel = c.host.index(),
                        "cannot create a context: {s:?}"
                    );
                    Err(s)
                }
            }
        }
        Ok(Request::Hello { .. }) => Err(Status::NotSupported),
        // A monitor's question: answered without a session.
        Ok(Request::VgpuStatus { first }) => {
            // Served here: should this worker go, the monitor is told.
            let _ = c.host.mark_serving();
            sh.port.stats.requests.fetch_add(1, Ordering::Relaxed);
            let (r, data) = super::status::answer(sh, ss, first);
            reply(&sh.port, c, d.tag, d.opcode, Ok(r), &data)?;
            c.host.req.consume(&d)?;
            return Ok(true);
        }
        Ok(Request::Join { token }) => match ss.join(token) {
            Some(id) => {
                c.session = Some(id);
                let _ = c.host.mark_serving();
                Ok(Reply::default())
            }
            None => {
                refuse(&sh.port, c, "join with a token of no session");
                Err(Status::InvalidValue)
            }
        },
        Ok(_) => {
            refuse(&sh.port, c, "request before Hello");
            Err(Status::NotInitialized)
        }
        Err(e) => {
            refuse(&sh.port, c, &e.to_string());
            Err(Status::InvalidValue)
        }
    };
    sh.port.stats.requests.fetch_add(1, Ordering::Relaxed);
    if d.flags & transport::FLAG_NO_REPLY == 0 {
        reply(&sh.port, c, d.tag, d.opcode, r, &[])?;
    }
    c.host.req.consume(&d)?;
    Ok(true)
}

pub(super) fn serve_channel(
    sh: &mut Shared,
    c: &mut ChannelState,
    ss: &mut Sessions,
) -> Result<bool, Error> {
    if let Some((d, data)) = c.outbox.take() {
        if !c.host.resp.try_send(&d, &data)? {
            c.outbox = Some((d, data));
            return Ok(false);
        }
        notify_guest(&sh.port, c.host.index())?;
    }
    let Some(id) = c.session else {
        if sh.port.held.get() {
            // Held for a checkpoint: a new process waits in the ring.
            return Ok(false);
        }
        return serve_unbound(sh, c, ss);
    };
    let Some(e) = ss.get_mut(id) else {
        c.session = None;
        return Ok(false);
    };
    let s = &mut e.s;
    super::requests::deferred_frees(sh, s);
    if c.outbound.is_some() {
        pump_outbound(sh, c, s)?;
        return Ok(true);
    }
    let mut did = false;
    if c.parked.is_some() {
        did = wait::poll(sh, c, s)?;
        if c.parked.is_some() || c.outbound.is_some() {
            return Ok(did);
        }
    }
    if c.sliced.is_some() {
        let r = pump_sliced(sh, c, s);
        if c.sliced.is_none() && e.holder == Some(c.host.index()) {
            e.holder = None;
        }
        return r;
    }
    let ch = c.host.index();
    for _ in 0..BATCH {
        if c.outbox.is_some() || c.outbound.is_some() || c.sliced.is_some() || c.parked.is_some() {
            break;
        }
        if sh.port.held.get() && c.transfer.is_none() {
            // Held for a checkpoint: the next request waits in the ring.
            break;
        }
        let Some(d) = c.host.req.peek()? else { break };
        let numbered = d.opcode != op::DATA && !unnumbered(&d);
        // Another channel of the process is mid-request, the process's
        // next request is not this one, or a host function of it has not
        // run yet: wait.
        if numbered
            && (e.holder.is_some_and(|h| h != ch)
                || (e.channels > 1 && d.tag != e.next_seq)
                || e.s.host_fn.is_some())
        {
            break;
        }
        // A request that does not decode is refused without the GPU: a
        // guest's garbage must not take the grant from other vGPUs.
        if op::needs_device(d.opcode)
            && (d.opcode == op::DATA || Request::decode(d.opcode, &d.inline).is_ok())
        {
            if sh.slice.releasing {
                break;
            }
            if sh.slice.slice_filled() {
                sh.slice.budget_spent = true;
                break;
            }
            if let Some(g) = sh.slice.gate.as_mut() {
                if g.slice_over() || !g.acquire(Duration::from_millis(1))? {
                    break;
                }
            }
        }
        did = true;
        sh.port.stats.requests.fetch_add(1, Ordering::Relaxed);
        if sh.slice.gate.as_ref().is_some_and(|g| g.holding()) {
            sh.slice.worked = true;
        }
        if d.opcode != op::LAUNCH {
            // Launches queued before go first: the stream order is the guest's.
            sh.slice.flush_launches(&mut e.s);
        }
        if d.opcode == op::DATA {
            continue_transfer(sh, c, &mut e.s, &d)?;
        } else {
            handle(sh, c, &mut e.s, &d)?;
            if std::mem::take(&mut c.hold) {
                // Held back (see `hold_for_departed`): served again on the
                // next turn, once the departed process's teardown is done.
                break;
            }
            if numbered {
                e.next_seq = d.tag.wrapping_add(1);
            }
        }
        if sh.slice.gate.is_some() && op::drains_device(d.opcode) {
            sh.port.stats.sync_calls.fetch_add(1, Ordering::Relaxed);
            Slice::collect_timings(&mut e.s);
        }
        // A request still taking its data (or issuing sub-grids) holds the
        // session's other channels back.
        if c.transfer.is_some() || c.sliced.is_some() {
            e.holder = Some(ch);
        } else if e.holder == Some(ch) {
            e.holder = None;
        }
        c.host.req.consume(&d)?;
    }
    // Nothing waits in the ring behind the queued launches (or the pass is
    // over): submit them now, still under the grant they were taken in.
    sh.slice.flush_launches(&mut e.s);
    Ok(did)
}

/// Whether a descriptor is one of the requests outside the process's
/// numbering (tag 0: see `protocol::Request::unnumbered`).
fn unnumbered(d: &Descriptor) -> bool {
    d.tag == 0 && matches!(d.opcode, op::JOIN | op::WAIT_HOST_FN | op::HOST_FN_DONE)
}

/// Unbinds the channel from its session, freeing the session (everything
/// its process held on the GPU) if it was the last channel.
fn drop_session(sh: &mut Shared, c: &mut ChannelState, ss: &mut Sessions) {
    let ch = c.host.index();
    if let Some(id) = c.session.take() {
        wait::abandon(c, ss.get_mut(id).map(|e| &mut e.s));
        if let Some(mut s) = ss.leave(id, ch) {
            super::requests::share::keep_at_end(&mut sh.tables, &mut s);
            super::pinned::release(&mut sh.gpu, s.id);
            sh.port
                .stats
                .pinned_used
                .store(sh.gpu.pinned.used(), Ordering::Relaxed);
            sh.mem.sub(s.mem_used);
            // The context frees its device memory and is kept for the
            // vGPU's next process, or destroyed (see `contexts.rs`).
            let poisoned = sh.port.poisoned.get().is_some();
            sh.gpu.contexts.give_back(s.ctx, poisoned);
            // What a context prints as it is destroyed has nobody to go to.
            sh.port.output.borrow_mut().collect(None, false);
            sh.port.output.borrow_mut().forget(id);
        }
        // What it held of other processes' memory is let go of.
        super::requests::share::settle_kept(&mut sh.mem, &mut sh.tables);
    }
    c.parked = None;
    c.transfer = None;
    c.outbound = None;
    c.outbox = None;
    c.sliced = None;
    // The next owner numbers its requests from the start again.
    c.held_back = None;
    c.hold = false;
}

/// Frees what the channel's owner held and returns the channel to FREE,
/// if its claim is still in the state `seen` that the caller read.
pub(super) fn teardown(sh: &mut Shared, c: &mut ChannelState, ss: &mut Sessions, seen: ClaimState) {
    drop_session(sh, c, ss);
    if c.host.reclaim(seen).unwrap_or(false) {
        sh.port.stats.reclaimed.fetch_add(1, Ordering::Relaxed);
    }
    // What the departed guest's buffers took stays with the allocator
    // otherwise (the sim executor keeps device memory in host RAM).
    crate::procfs::release_free_memory();
}

/// The worker is going away: frees what the channel's owner held; a
/// channel still claimed becomes LOST and its owner is woken (unless no
/// worker served its claim yet), one that needed reclaiming is reclaimed.
pub(super) fn retire(sh: &mut Shared, c: &mut ChannelState, ss: &mut Sessions) {
    match c.host.state() {
        // Claimed as this worker went, its Hello not served: it lost
        // nothing, and the next worker serves it from the start.
        Ok(ClaimState::Claimed) if c.session.is_none() && !c.host.served().unwrap_or(true) => {}
        Ok(ClaimState::Claimed) => {
            drop_session(sh, c, ss);
            if c.host.mark_lost().unwrap_or(false) {
                wake_owner(&sh.port, c.host.index());
            }
        }
        Ok(st) if st.needs_reclaim() => teardown(sh, c, ss, st),
        _ => drop_session(sh, c, ss),
    }
}

/// Rings the vector the owner of channel `ch` waits on, sleeping or not.
pub(super) fn wake_owner(port: &Port, ch: u32) {
    let (Ok(peer), Ok(vector)) = (port.region.owner_peer(ch), port.region.guest_vector(ch)) else {
        return;
    };
    if let Ok(p) = u16::try_from(peer) {
        let _ = port.link.ring_peer(p, vector);
    }
}

pub(super) fn notify_guest(port: &Port, ch: u32) -> Result<(), Error> {
    if ring_if_sleeping(port, ch)? {
        super::handoff::Handoff::add(&port.stats.handoff.guest_bells, 1);
    }
    Ok(())
}

/// Rings the guest of channel `ch` if it announced that it sleeps, and
/// kicks the vCPU it waits on; true if it did.
pub(super) fn ring_if_sleeping(port: &Port, ch: u32) -> Result<bool, Error> {
    let flag = port.region.ring_sleeping(ch, Direction::ToGuest)?;
    fence(Ordering::SeqCst);
    if flag.load(Ordering::Relaxed) == 0 {
        return Ok(false);
    }
    let Ok(p) = u16::try_from(port.region.owner_peer(ch)?) else {
        return Ok(false);
    };
    // The guest's vector is that of the vCPU it waits on.
    let vector = port.region.guest_vector(ch)?;
    port.link.ring_peer(p, vector)?;
    port.booster.borrow_mut().kick(vector);
    Ok(true)
}

/// Whether request `tag` of channel `c`, which found the vGPU short (of
/// memory, or of a context made ahead), is rather held back for a turn,
/// unanswered in its ring: another process of the vGPU has gone and what
/// it held is freed only when the pass reaches its channel, which may come
/// after this one in the pass. Once per request, so that a limit really
/// reached is answered.
pub(super) fn hold_for_departed(port: &Port, c: &mut ChannelState, tag: u64) -> bool {
    if c.held_back == Some(tag) || !port.departed() {
        c.held_back = None;
        return false;
    }
    c.held_back = Some(tag);
    true
}

pub(super) fn refuse(port: &Port, c: &mut ChannelState, what: &str) {
    port.stats.refused.fetch_add(1, Ordering::Relaxed);
    transport::rate_limited!(
        port.log.borrow_mut(),
        info,
        channel = c.host.index(),
        "refused: {what}"
    );
}

/// Replies `result`, counting and logging a refusal (`why`) first if it
/// is an error.
pub(super) fn answer(
    port: &Port,
    c: &mut ChannelState,
    tag: u64,
    opcode: u32,
    result: Result<Reply, Status>,
    why: &str,
) -> Result<(), Error> {
    if result.is_err() {
        refuse(port, c, why);
    }
    reply(port, c, tag, opcode, result, &[])
}

pub(super) fn reply(
    port: &Port,
    c: &mut ChannelState,
    tag: u64,
    opcode: u32,
    result: Result<Reply, Status>,
    data: &[u8],
) -> Result<(), Error> {
    let mut d = Descriptor::new(tag, opcode);
    let mut inline = [0u8; INLINE];
    match result {
        Ok(r) => r.encode(&mut inline),
        Err(s) => {
            d.status = s.code();
            port.note_fault(s, c.host.index());
        }
    }
    // Text the call made the driver write goes with its reply's flag.
    port.collect_output(c.session);
    if c.session.is_some_and(|id| port.output.borrow().has(id)) {
        d.flags |= protocol::REPLY_OUTPUT;
    }
    d.inline = inline;
    let data = if d.status == 0 { data } else { &[] };
    if !c.host.resp.try_send(&d, data)? {
        // The guest is not reading its replies; keep this one and stop
        // serving the channel until there is room.
        c.outbox = Some((d, data.to_vec()));
        return Ok(());
    }
    notify_guest(port, c.host.index())
}
