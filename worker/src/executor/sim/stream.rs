//! Streams, events, synchronization, and the marks the worker waits on:
//! on the model, times on the device's one in-order queue.

use std::time::Instant;

use protocol::stream_attr::StreamAttr;
use protocol::Status;

use super::context::{SimContext, SimEvent};
use crate::executor::{Events, Handle, SharedMem, StreamAttributes, Streams};

/// When the device passes event `e`'s last record.
fn when(e: &SimEvent) -> Option<Instant> {
    *e.lock().unwrap_or_else(|e| e.into_inner())
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
        Ok(())
    }

    fn event_synchronize(&mut self, event: Handle) -> Result<(), Status> {
        self.flush_printed();
        self.alive()?;
        if let Some(t) = when(self.events.get(&event).ok_or(Status::InvalidHandle)?) {
            Self::wait_until(t);
        }
        Ok(())
    }

    fn event_query(&mut self, event: Handle) -> Result<bool, Status> {
        Ok(when(self.events.get(&event).ok_or(Status::InvalidHandle)?)
            .is_none_or(|t| Instant::now() >= t))
    }

    fn event_elapsed(&mut self, start: Handle, end: Handle) -> Result<f32, Status> {
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
