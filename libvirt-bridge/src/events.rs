//! libvirt's domain events, as messages on a channel: the lifecycle of each
//! domain, changes of its fairvgpu metadata, and the connection's close.
//! The `virt` crate has no safe binding for these callbacks; the unsafe
//! code is here alone.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::mpsc::Sender;
use std::sync::Mutex;

use anyhow::{bail, Result};
use daemon::libvirt_xml::NAMESPACE;
use virt::connect::Connect;
use virt_sys as sys;

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Domain `name` started, stopped, was defined, ... (`kind`: libvirt's
    /// `virDomainEventType`).
    Lifecycle {
        /// The domain.
        name: String,
        /// `VIR_DOMAIN_EVENT_*`.
        kind: i32,
        /// Its detail (`VIR_DOMAIN_EVENT_STARTED_RESTORED`, ...).
        detail: i32,
    },
    /// Domain `name`'s fairvgpu metadata changed.
    Metadata {
        /// The domain.
        name: String,
    },
    /// The connection to libvirtd closed.
    Closed,
}

/// libvirt's `VIR_DOMAIN_EVENT_STOPPED`.
pub const STOPPED: i32 = sys::VIR_DOMAIN_EVENT_STOPPED as i32;
/// libvirt's `VIR_DOMAIN_EVENT_STARTED`.
pub const STARTED: i32 = sys::VIR_DOMAIN_EVENT_STARTED as i32;
/// libvirt's `VIR_DOMAIN_EVENT_SUSPENDED`.
pub const SUSPENDED: i32 = sys::VIR_DOMAIN_EVENT_SUSPENDED as i32;
/// libvirt's `VIR_DOMAIN_EVENT_STARTED_RESTORED`: started from a saved state.
pub const STARTED_RESTORED: i32 = sys::VIR_DOMAIN_EVENT_STARTED_RESTORED as i32;

/// Where the callbacks send (one watch per process).
static SINK: Mutex<Option<Sender<Event>>> = Mutex::new(None);

fn send(e: Event) {
    if let Some(tx) = SINK.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        let _ = tx.send(e);
    }
}

/// The name of `dom`, if it has one.
///
/// # Safety
/// `dom` is a domain libvirt handed a callback, valid during the call.
unsafe fn name_of(dom: sys::virDomainPtr) -> Option<String> {
    // SAFETY: `dom` is valid for the callback (the caller's contract);
    // the name is owned by `dom` and copied before the call returns.
    let p = unsafe { sys::virDomainGetName(dom) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null name from libvirt is a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

unsafe extern "C" fn on_lifecycle(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    event: c_int,
    detail: c_int,
    _opaque: *mut c_void,
) -> c_int {
    // SAFETY: libvirt calls with a domain valid during the call.
    if let Some(name) = unsafe { name_of(dom) } {
        send(Event::Lifecycle {
            name,
            kind: event,
            detail,
        });
    }
    0
}

unsafe extern "C" fn on_metadata(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    _kind: c_int,
    nsuri: *const c_char,
    _opaque: *mut c_void,
) {
    // SAFETY: a non-null namespace from libvirt is a NUL-terminated string.
    let ours =
        !nsuri.is_null() && unsafe { CStr::from_ptr(nsuri) }.to_bytes() == NAMESPACE.as_bytes();
    if !ours {
        return;
    }
    // SAFETY: libvirt calls with a domain valid during the call.
    if let Some(name) = unsafe { name_of(dom) } {
        send(Event::Metadata { name });
    }
}

unsafe extern "C" fn on_close(_conn: sys::virConnectPtr, _reason: c_int, _opaque: *mut c_void) {
    send(Event::Closed);
}

/// Sends `conn`'s domain events and its close to `tx` (libvirt's default
/// event loop must run: `virt::event::event_run_default_impl`).
pub fn watch(conn: &Connect, tx: Sender<Event>) -> Result<()> {
    *SINK.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    type Lifecycle = unsafe extern "C" fn(
        sys::virConnectPtr,
        sys::virDomainPtr,
        c_int,
        c_int,
        *mut c_void,
    ) -> c_int;
    type Metadata = unsafe extern "C" fn(
        sys::virConnectPtr,
        sys::virDomainPtr,
        c_int,
        *const c_char,
        *mut c_void,
    );
    type Generic = unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *mut c_void);
    // SAFETY (both): libvirt's C API takes each event's callback as the
    // generic type and calls it with the signature of its event id (C's
    // VIR_DOMAIN_EVENT_CALLBACK cast); the ids below match the signatures.
    // SAFETY: see above (VIR_DOMAIN_EVENT_ID_LIFECYCLE).
    let lifecycle = unsafe { std::mem::transmute::<Lifecycle, Generic>(on_lifecycle) };
    // SAFETY: see above (VIR_DOMAIN_EVENT_ID_METADATA_CHANGE).
    let metadata = unsafe { std::mem::transmute::<Metadata, Generic>(on_metadata) };
    for (id, cb) in [
        (sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE, lifecycle),
        (sys::VIR_DOMAIN_EVENT_ID_METADATA_CHANGE, metadata),
    ] {
        // SAFETY: `conn` is an open connection; no opaque data and no free
        // callback; a null domain asks for every domain's events.
        let r = unsafe {
            sys::virConnectDomainEventRegisterAny(
                conn.as_ptr(),
                std::ptr::null_mut(),
                id as c_int,
                Some(cb),
                std::ptr::null_mut(),
                None,
            )
        };
        if r < 0 {
            bail!(
                "registering for domain events {id}: {}",
                virt::error::Error::last_error()
            );
        }
    }
    // SAFETY: as above; the callback takes the close-callback signature.
    let r = unsafe {
        sys::virConnectRegisterCloseCallback(
            conn.as_ptr(),
            Some(on_close),
            std::ptr::null_mut(),
            None,
        )
    };
    if r < 0 {
        bail!(
            "registering for the connection's close: {}",
            virt::error::Error::last_error()
        );
    }
    // SAFETY: `conn` is open; keepalive needs the event loop, which runs.
    unsafe { sys::virConnectSetKeepAlive(conn.as_ptr(), 5, 3) };
    Ok(())
}
