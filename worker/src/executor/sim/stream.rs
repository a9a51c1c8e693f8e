//! Streams, events, synchronization, and the marks the worker waits on:
//! on the model, times on the device's one in-order queue.

use std::time::Instant;

use protocol::stream_attr::StreamAttr;
use protocol::Status;

use super::bytes::Bytes;
use super::context::{SimContext, SimEvent};
use crate::executor::{Events, Handle, Portable, SharedMem, StreamAttributes, Streams};

/// When the device passes event `e`'s last record.
fn when(e: &SimEvent) -> Option<Instant> {
    *e.lock().unwrap_or_else(|e| e.into_inner())
}

/// `CLOCK_MONOTONIC` now, in nanoseconds, with the `Instant` of the same
/// moment (the clock every process of the host shares).
fn clock_now() -> (u64, Instant) {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok();
    let ns = ts.map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    });
    (ns, Instant::now())
}

/// `t` on the shared clock (never 0).
fn to_ns(t: Instant) -> u64 {
    let (ns, now) = clock_now();
    let ns = if t >= now {
        ns.saturating_add(u64::try_from((t - now).as_nanos()).unwrap_or(u64::MAX))
    } else {
        ns.saturating_sub(u64::try_from((now - t).as_nanos()).unwrap_or(u64::MAX))
    };
    ns.max(1)
}

/// A time on the shared clock as an `Instant` (0: none).
fn from_ns(v: u64) -> Option<Instant> {
    if v == 0 {
        return None;
    }
    let (ns, now) = clock_now();
    Some(if v >= ns {
        now + std::time::Duration::from_nanos(v - ns)
    } else {
        now.checked_sub(std::time::Duration::from_nanos(ns - v))
            .unwrap_or(now)
    })
}

/// The word of a shared event's page.
fn page_word(p: &Bytes) -> u64 {
    p.get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

impl SimContext {
    /// A shared event's state as its page says (another worker may have
    /// recorded it).
    fn refresh(&self, event: Handle) {
        if let (Some(p), Some(e)) = (self.event_pages.get(&event), self.events.get(&event)) {
            *e.lock().unwrap_or_else(|e| e.into_inner()) = from_ns(page_word(p));
        }
    }
}

impl Streams for SimContext {
    fn stream_create(&mut self, _flags: u32, priority: i32) -> Result<Handle, Status> {
        let h = self.handle();
        self.streams.insert(h, Instant::now());
        // Clamped to the H100's range, as the driver does.
        let p = StreamAttr::Priority(priority.clamp(-5, 0));
        self.stream_attrs.insert((h, p.id()), p);
        Ok(h)
    }

    fn stream_wait_event(
        &mut self,
        stream: Handle,
        event: Handle,
        _flags: u32,
    ) -> Result<(), Status> {
        if stream != 0 && !self.streams.contains_key(&stream) {
            return Err(Status::InvalidHandle);
        }
        // One in-order queue: later work starts after every recorded event.
        self.events
            .contains_key(&event)
            .then_some(())
            .ok_or(Status::InvalidHandle)
    }

    fn stream_destroy(&mut self, stream: Handle) -> Result<(), Status> {
        self.stream_attrs.retain(|&(s, _), _| s != stream);
        self.streams
            .remove(&stream)
            .map(drop)
            .ok_or(Status::InvalidHandle)
    }

    fn stream_synchronize(&mut self, stream: Handle) -> Result<(), Status> {
        self.flush_printed();
        self.alive()?;
        // One hardware queue: a stream is done when everything before it is.
        let t = self.stream_done(stream)?;
        Self::wait_until(t);
        Ok(())
    }

    fn stream_query(&mut self, stream: Handle) -> Result<bool, Status> {
        let t = self.stream_done(stream)?;
        Ok(Instant::now() >= t)
    }

    fn synchronize(&mut self) -> Result<(), Status> {
        self.flush_printed();
        self.alive()?;
        Self::wait_until(self.last_done);
        Ok(())
    }

    fn mark(&mut self, stream: Option<Handle>) -> Result<crate::executor::Marker, Status> {
        self.alive()?;
        let t = match stream {
            Some(s) => self.stream_done(s)?,
            None => self.last_done,
        };
        let m = self.handle();
        self.marks.insert(m, t);
        Ok(m)
    }

    fn reached(&mut self, m: crate::executor::Marker) -> Result<bool, Status> {
        let t = *self.marks.get(&m).ok_or(Status::InvalidHandle)?;
        if let Err(e) = self.alive() {
            self.marks.remove(&m);
            self.flush_printed();
            return Err(e);
        }
        let done = Instant::now() >= t;
        if done {
            self.marks.remove(&m);
            // The worker synchronizes once the mark is passed (see the
            // cuda executor's `reached`): the driver writes then.
            self.flush_printed();
        }
        Ok(done)
    }

    fn forget(&mut self, m: crate::executor::Marker) {
        self.marks.remove(&m);
    }
}

impl Events for SimContext {
    fn event_create(&mut self, _flags: u32) -> Result<Handle, Status> {
        let h = self.handle();
        self.events.insert(h, SimEvent::default());
        Ok(h)
    }

    fn event_destroy(&mut self, event: Handle) -> Result<(), Status> {
        self.event_pages.remove(&event);
        self.events
            .remove(&event)
            .map(drop)
            .ok_or(Status::InvalidHandle)
    }

    fn event_record(&mut self, event: Handle, stream: Handle) -> Result<(), Status> {
        if !self.events.contains_key(&event) {
            return Err(Status::InvalidHandle);
        }
        let t = self.queue_mark(stream);
        if let Some(e) = self.events.get(&event) {
            *e.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        }
        if let Some(p) = self.event_pages.get_mut(&event) {
            if let Some(w) = p.get_mut(..8) {
                w.copy_from_slice(&to_ns(t).to_le_bytes());
            }
        }
        Ok(())
    }

    fn event_synchronize(&mut self, event: Handle) -> Result<(), Status> {
        self.flush_printed();
        self.alive()?;
        self.refresh(event);
        if let Some(t) = when(self.events.get(&event).ok_or(Status::InvalidHandle)?) {
            Self::wait_until(t);
        }
        Ok(())
    }

    fn event_query(&mut self, event: Handle) -> Result<bool, Status> {
        self.refresh(event);
        Ok(when(self.events.get(&event).ok_or(Status::InvalidHandle)?)
            .is_none_or(|t| Instant::now() >= t))
    }

    fn event_elapsed(&mut self, start: Handle, end: Handle) -> Result<f32, Status> {
        self.refresh(start);
        self.refresh(end);
        let s = when(self.events.get(&start).ok_or(Status::InvalidHandle)?)
            .ok_or(Status::InvalidHandle)?;
        let e = when(self.events.get(&end).ok_or(Status::InvalidHandle)?)
            .ok_or(Status::InvalidHandle)?;
        if Instant::now() < e {
            return Err(Status::NotReady);
        }
        Ok(e.saturating_duration_since(s).as_secs_f32() * 1000.0)
    }

    fn share_event(&mut self, event: Handle) -> Result<SharedMem, Status> {
        let e = self.events.get(&event).ok_or(Status::InvalidHandle)?;
        Ok(SharedMem(Some(std::sync::Arc::new(e.clone()))))
    }

    fn import_event(&mut self, shared: &SharedMem) -> Result<Handle, Status> {
        let e = shared
            .0
            .as_ref()
            .and_then(|m| m.downcast_ref::<SimEvent>())
            .ok_or(Status::InvalidValue)?
            .clone();
        let h = self.handle();
        self.events.insert(h, e);
        Ok(h)
    }
}

impl SimContext {
    /// See [`crate::executor::Ipc::export_event`]: the event's state moves
    /// to a memfd word (once) that the other worker maps.
    pub(super) fn export_shared_event(&mut self, event: Handle) -> Result<Portable, Status> {
        let e = self.events.get(&event).ok_or(Status::InvalidHandle)?;
        if let std::collections::hash_map::Entry::Vacant(v) = self.event_pages.entry(event) {
            let mut p = Bytes::Heap(vec![0u8; 8]);
            p.make_shared()?;
            let now = when(e).map_or(0, to_ns);
            p.copy_from_slice(&now.to_le_bytes());
            v.insert(p);
        }
        let fd = self.event_pages.get(&event).and_then(Bytes::fd);
        Ok(Portable {
            handle: [0; 64],
            fd: Some(fd.ok_or(Status::OutOfMemory)?),
        })
    }

    /// See [`crate::executor::Ipc::open_event`]: an event of this context
    /// whose state is the other worker's memfd word.
    pub(super) fn open_shared_event(&mut self, p: Portable) -> Result<Handle, Status> {
        let page = Bytes::map(p.fd.ok_or(Status::InvalidValue)?, 8)?;
        let h = self.handle();
        self.events.insert(h, SimEvent::default());
        self.event_pages.insert(h, page);
        self.refresh(h);
        Ok(h)
    }
}

impl StreamAttributes for SimContext {
    fn stream_set_attribute(&mut self, stream: Handle, attr: StreamAttr) -> Result<(), Status> {
        self.alive()?;
        if stream != 0 && !self.streams.contains_key(&stream) {
            return Err(Status::InvalidHandle);
        }
        let attr = match attr {
            StreamAttr::Priority(p) => StreamAttr::Priority(p.clamp(-5, 0)),
            a => a,
        };
        self.stream_attrs.insert((stream, attr.id()), attr);
        Ok(())
    }

    fn stream_attribute(&mut self, stream: Handle, id: u32) -> Result<StreamAttr, Status> {
        if stream != 0 && !self.streams.contains_key(&stream) {
            return Err(Status::InvalidHandle);
        }
        if let Some(&a) = self.stream_attrs.get(&(stream, id)) {
            return Ok(a);
        }
        use protocol::stream_attr::id;
        Ok(match id {
            id::ACCESS_POLICY_WINDOW => StreamAttr::AccessPolicyWindow(Default::default()),
            id::SYNCHRONIZATION_POLICY => StreamAttr::SyncPolicy(1),
            id::PRIORITY => StreamAttr::Priority(0),
            id::MEM_SYNC_DOMAIN_MAP => StreamAttr::MemSyncDomainMap {
                default: 0,
                remote: 1,
            },
            id::MEM_SYNC_DOMAIN => StreamAttr::MemSyncDomain(0),
            _ => return Err(Status::InvalidValue),
        })
    }
}
