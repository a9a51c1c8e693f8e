//! Requests on the channel: descriptors and their data pushed into the
//! ring, replies waited for (spinning, then on the doorbell).

use std::time::Duration;

use protocol::{op, Reply, Request, Status};
use transport::layout::Direction;
use transport::wait::{notify_if_sleeping, wait_for};
use transport::{Descriptor, FLAG_MORE, FLAG_NO_REPLY};

use crate::{current_cpu, Gpu, GuestError, Result, CALL_TIMEOUT};

/// `req` as the descriptor that carries it, numbered `tag`: its opcode,
/// its fields inline, and whether the host is to reply.
pub fn descriptor(req: &Request, tag: u64) -> Descriptor {
    let mut d = Descriptor::new(tag, req.opcode());
    req.encode(&mut d.inline);
    if !req.expects_reply() {
        d.flags |= FLAG_NO_REPLY;
    }
    d
}

impl Gpu {
    pub(crate) fn descriptor(&mut self, req: &Request) -> Descriptor {
        // Some requests are outside the process's numbering.
        let tag = if req.unnumbered() { 0 } else { self.seq.take() };
        let mut d = descriptor(req, tag);
        d.vcpu = current_cpu();
        d
    }

    /// Largest chunk of data one descriptor carries.
    pub(crate) fn chunk(&self) -> usize {
        (self.ch.req.max_data() / 4).max(4096)
    }

    pub(crate) fn push(&mut self, d: &Descriptor, data: &[u8]) -> Result<()> {
        let mut spins = 0u32;
        let copier = &mut self.copier;
        while !self.ch.req.try_send_with(d, data.len(), |_, s| {
            copier.copy_in(data, &s);
            Ok(())
        })? {
            // Ring or arena full: the host is behind. Make sure it is awake.
            notify_if_sleeping(
                self.ch.region().host_sleeping_for(self.ch.index())?,
                &*self.host_bell,
            )?;
            spins += 1;
            if spins > 1000 {
                self.ch.check_alive()?;
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
        notify_if_sleeping(
            self.ch.region().host_sleeping_for(self.ch.index())?,
            &*self.host_bell,
        )?;
        Ok(())
    }

    /// Sends a request with its data (chunked through the arena as needed).
    pub(crate) fn send(&mut self, req: &Request, data: &[u8]) -> Result<u64> {
        let chunk = self.chunk();
        let mut d = self.descriptor(req);
        let tag = d.tag;
        let first = data.len().min(chunk);
        if data.len() > first {
            d.flags |= FLAG_MORE;
        }
        self.push(&d, &data[..first])?;
        let mut off = first;
        while off < data.len() {
            let n = (data.len() - off).min(chunk);
            let mut c = Descriptor::new(tag, op::DATA);
            c.flags = if off + n < data.len() { FLAG_MORE } else { 0 };
            c.vcpu = d.vcpu;
            self.push(&c, &data[off..off + n])?;
            off += n;
        }
        Ok(tag)
    }

    /// Waits until the next response is visible (not yet consumed).
    pub(crate) fn wait_reply(&mut self, tag: u64) -> Result<Descriptor> {
        let deadline = Some(std::time::Instant::now() + CALL_TIMEOUT);
        let region = self.ch.region().clone();
        let sleeping = region.ring_sleeping(self.ch.index(), Direction::ToGuest)?;
        let (resp, ch) = (&self.ch.resp, &self.ch);
        let mut polls = 0u32;
        let spins = self.policy.spins;
        let d = wait_for(&self.policy, sleeping, &*self.own_bell, deadline, || {
            if let Some(d) = resp.peek()? {
                return Ok(Some(d));
            }
            // Now and then while spinning, and on every look once blocking,
            // make sure the host that owes the reply is still the one we
            // asked: a restarted worker marks our channel LOST and rings.
            polls = polls.saturating_add(1);
            if polls >= spins || polls.is_multiple_of(64) {
                if let Err(e) = ch.check_alive() {
                    // A reply written before the host went is still ours.
                    return resp.peek()?.map(Some).ok_or(e);
                }
            }
            Ok(None)
        })?;
        if d.tag != tag {
            return Err(GuestError::Protocol(format!(
                "reply tag {} for request {tag}",
                d.tag
            )));
        }
        Ok(d)
    }

    /// Waits for the next response; copies its data into `self.buf`.
    pub(crate) fn recv(&mut self, tag: u64) -> Result<Descriptor> {
        let d = self.wait_reply(tag)?;
        self.buf.clear();
        self.buf.resize(d.data_len as usize, 0);
        self.ch.resp.data(&d)?.copy_to(&mut self.buf[..]);
        self.ch.resp.consume(&d)?;
        self.take_output(&d)?;
        Ok(d)
    }

    /// If the reply says so, takes the text this process's kernels printed
    /// (and the driver's assert messages) from the host and writes it to
    /// the process's own standard output and error, as the driver does
    /// natively at the same call. Keeps the reply's data in `self.buf`.
    pub(crate) fn take_output(&mut self, reply: &Descriptor) -> Result<()> {
        if reply.flags & protocol::REPLY_OUTPUT == 0 || !self.take_output {
            return Ok(());
        }
        let data = std::mem::take(&mut self.buf);
        // Each answer is one stream's text; the last says whether more is
        // held. A bound keeps a host that always says "more" from holding
        // the call forever.
        for _ in 0..4096 {
            let tag = self.send(&Request::TakeOutput, &[])?;
            let d = self.wait_reply(tag)?;
            let mut text = vec![0u8; d.data_len as usize];
            self.ch.resp.data(&d)?.copy_to(&mut text[..]);
            self.ch.resp.consume(&d)?;
            Self::status(&d)?;
            let stream = Reply::decode(&d.inline).vals[0];
            crate::stdio::write(stream, &text);
            if d.flags & protocol::REPLY_OUTPUT == 0 || text.is_empty() {
                break;
            }
        }
        self.buf = data;
        Ok(())
    }

    pub(crate) fn status(d: &Descriptor) -> Result<()> {
        match Status::from_code(d.status) {
            Status::Success => Ok(()),
            s => Err(GuestError::Cuda(s)),
        }
    }

    /// A synchronous call; returns the reply values and data.
    pub(crate) fn call_data(&mut self, req: &Request, data: &[u8]) -> Result<(Reply, Vec<u8>)> {
        let tag = self.send(req, data)?;
        let d = self.recv(tag)?;
        Self::status(&d)?;
        Ok((Reply::decode(&d.inline), std::mem::take(&mut self.buf)))
    }

    pub(crate) fn call(&mut self, req: &Request) -> Result<Reply> {
        let tag = self.send(req, &[])?;
        let d = self.recv(tag)?;
        Self::status(&d)?;
        Ok(Reply::decode(&d.inline))
    }

    /// A query call: `NotReady` means "not yet", not an error.
    pub(crate) fn query(&mut self, req: &Request) -> Result<bool> {
        match self.call(req) {
            Ok(_) => Ok(true),
            Err(GuestError::Cuda(Status::NotReady)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A synchronous request of any kind (calls with no method of their
    /// own here, such as the VMM API's); its reply values.
    pub fn request(&mut self, req: &Request) -> Result<Reply> {
        self.call(req)
    }

    /// A synchronous request of any kind; its reply values and data (what
    /// `TakeOutput` answers, say).
    pub fn request_data(&mut self, req: &Request) -> Result<(Reply, Vec<u8>)> {
        self.call_data(req, &[])
    }

    /// Whether this channel takes the kernel output the host holds for the
    /// process whenever a reply says there is some, writing it to the
    /// process's standard output and error (the default), or leaves it with
    /// the host, to be taken with [`Request::TakeOutput`] or never (as a
    /// process that ignores its output, or a hostile one, does).
    pub fn set_take_output(&mut self, on: bool) {
        self.take_output = on;
    }
}
