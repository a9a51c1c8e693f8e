//! Stream attributes a guest set (`cuStreamSetAttribute`), applied to our
//! streams as it gave them and kept, to be applied again after a move.
//!
//! A stream attribute reaches the kernels launched into the stream with
//! `cuLaunchKernel`, not the kernel nodes of a graph launched into it
//! (each node has attributes of its own). So a stream that carries one
//! that shapes its kernels (an L2 access policy window, a priority, memory
//! synchronization domains) gets its launches one by one, not through the
//! launch templates (`batch.rs`), and its kernels run as natively.

use std::collections::HashMap;

use cudarc::driver::sys::{self, CUlaunchAttributeID as Id};
use protocol::stream_attr::{id, StreamAttr, RAW_LEN};
use protocol::Status;

use super::check;
use super::context::CudaContext;
use crate::executor::{Handle, StreamAttributes};

/// The attributes set on each stream, one per `CUstreamAttrID`.
#[derive(Default)]
pub(super) struct StreamAttrs {
    set: HashMap<Handle, Vec<StreamAttr>>,
    /// The default stream's values before the guest set any: the context
    /// outlives the process (`recycle`), its default stream too.
    default_before: Vec<StreamAttr>,
}

impl StreamAttrs {
    fn record(&mut self, s: Handle, a: StreamAttr) {
        let v = self.set.entry(s).or_default();
        v.retain(|o| o.id() != a.id());
        v.push(a);
    }

    /// Whether stream `s` carries an attribute its kernels must run with.
    pub(super) fn shapes_kernels(&self, s: Handle) -> bool {
        self.set
            .get(&s)
            .is_some_and(|v| v.iter().any(StreamAttr::shapes_kernels))
    }

    /// The attributes set on stream `s`.
    pub(super) fn of(&self, s: Handle) -> &[StreamAttr] {
        self.set.get(&s).map_or(&[], Vec::as_slice)
    }

    /// Stream `s` is gone.
    pub(super) fn forget(&mut self, s: Handle) {
        self.set.remove(&s);
    }

    pub(super) fn clear(&mut self) {
        self.set.clear();
        self.default_before.clear();
    }
}

/// The driver's id for one of `stream_attr::id::ALL`.
fn driver_id(attr: u32) -> Result<Id, Status> {
    Ok(match attr {
        id::ACCESS_POLICY_WINDOW => Id::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
        id::SYNCHRONIZATION_POLICY => Id::CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY,
        id::PRIORITY => Id::CU_LAUNCH_ATTRIBUTE_PRIORITY,
        id::MEM_SYNC_DOMAIN_MAP => Id::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
        id::MEM_SYNC_DOMAIN => Id::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
        _ => return Err(Status::InvalidValue),
    })
}

/// Sets `a` on `st` (a stream of the current context, or null).
fn apply(st: sys::CUstream, a: &StreamAttr) -> Result<(), Status> {
    let raw = a.to_raw();
    // SAFETY: a plain C union of at least RAW_LEN bytes, all-zero valid.
    let mut v: sys::CUstreamAttrValue = unsafe { std::mem::zeroed() };
    // SAFETY: `raw` is the value in the union's own layout (see
    // `protocol::stream_attr`); the union is larger than RAW_LEN bytes.
    unsafe { std::ptr::copy_nonoverlapping(raw.as_ptr(), (&mut v as *mut _) as *mut u8, RAW_LEN) };
    // SAFETY: the caller's stream; `v` lives across the call, which copies it.
    check(unsafe { sys::cuStreamSetAttribute(st, driver_id(a.id())?, &v) })
}

impl CudaContext {
    /// Gives the default stream back its values before the guest set any
    /// and forgets the rest (the context is current; its other streams
    /// are gone).
    pub(super) fn reset_stream_attrs(&mut self) -> Result<(), Status> {
        let before = std::mem::take(&mut self.stream_attrs.default_before);
        self.stream_attrs.clear();
        before
            .iter()
            .try_for_each(|a| apply(std::ptr::null_mut(), a))
    }

    /// Sets every stream's attributes again (on the streams of a new
    /// context, after a move); the context is current.
    pub(super) fn apply_stream_attrs(&self) -> Result<(), Status> {
        for (&s, attrs) in &self.stream_attrs.set {
            let st = self.stream(s)?;
            for a in attrs {
                apply(st, a)?;
            }
        }
        Ok(())
    }
}

impl StreamAttributes for CudaContext {
    fn stream_set_attribute(&mut self, s: Handle, a: StreamAttr) -> Result<(), Status> {
        self.bind()?;
        let st = self.stream(s)?;
        let saved = &self.stream_attrs.default_before;
        if s == 0 && !saved.iter().any(|o| o.id() == a.id()) {
            let before = self.stream_attribute(0, a.id())?;
            self.stream_attrs.default_before.push(before);
        }
        apply(st, &a)?;
        self.stream_attrs.record(s, a);
        Ok(())
    }

    fn stream_attribute(&mut self, s: Handle, attr: u32) -> Result<StreamAttr, Status> {
        self.bind()?;
        let st = self.stream(s)?;
        // SAFETY: as in `apply`.
        let mut v: sys::CUstreamAttrValue = unsafe { std::mem::zeroed() };
        // SAFETY: a stream of this context; out-parameter on our stack.
        check(unsafe { sys::cuStreamGetAttribute(st, driver_id(attr)?, &mut v) })?;
        let mut raw = [0u8; RAW_LEN];
        // SAFETY: the union is larger than RAW_LEN bytes, all initialized
        // (zeroed, then written by the driver).
        unsafe {
            std::ptr::copy_nonoverlapping((&v as *const _) as *const u8, raw.as_mut_ptr(), RAW_LEN)
        };
        StreamAttr::from_raw(attr, &raw).map_err(|e| {
            tracing::debug!("stream attribute {attr} as the driver gave it: {e}");
            Status::Unknown
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_keeps_one_value_per_attribute_and_says_if_kernels_need_it() {
        let mut k = StreamAttrs::default();
        k.record(3, StreamAttr::SyncPolicy(4));
        // How the host waits is no reason to leave the templates.
        assert!(!k.shapes_kernels(3));
        k.record(3, StreamAttr::Priority(-1));
        k.record(3, StreamAttr::Priority(-2));
        assert!(k.shapes_kernels(3) && !k.shapes_kernels(4));
        assert_eq!(
            k.set[&3],
            [StreamAttr::SyncPolicy(4), StreamAttr::Priority(-2)]
        );
        k.forget(3);
        assert!(!k.shapes_kernels(3));
        for a in id::ALL {
            assert_eq!(driver_id(a).unwrap() as u32, a);
        }
        assert!(driver_id(2).is_err());
    }
}
