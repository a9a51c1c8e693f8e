//! Event sets: a vGPU raises none of the events NVML reports (Xid errors,
//! ECC, clock or power changes belong to the physical GPU, which the host
//! watches), so a set is made, takes registrations of no event type, and
//! its wait times out. `nvidia-smi` makes a set before it prints anything
//! and stops with "Internal NVML error" where it cannot.

use std::collections::HashSet;
use std::ffi::{c_uint, c_ulonglong, c_void};
use std::sync::Mutex;
use std::time::Duration;

use crate::system::Device;
use crate::{code, out, state, Ret};

/// `NVML_ERROR_TIMEOUT`.
const TIMEOUT: Ret = 10;

/// The sets made and not freed, by their handles' addresses.
static SETS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// An event set's handle: a distinct, never-dereferenced address.
#[repr(C)]
struct EventSet {
    _one: u8,
}

fn known(set: *mut c_void) -> Result<(), Ret> {
    let g = SETS.lock().unwrap_or_else(|e| e.into_inner());
    match g.as_ref() {
        Some(s) if s.contains(&(set as usize)) => Ok(()),
        _ => Err(code::INVALID_ARGUMENT),
    }
}

export! {
    fn nvmlEventSetCreate(set: *mut *mut c_void) {
        state::info()?;
        let p = Box::into_raw(Box::new(EventSet { _one: 0 })) as *mut c_void;
        SETS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashSet::new)
            .insert(p as usize);
        out(set, p)
    }

    fn nvmlEventSetFree(set: *mut c_void) {
        let mut g = SETS.lock().unwrap_or_else(|e| e.into_inner());
        if !g.as_mut().is_some_and(|s| s.remove(&(set as usize))) {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: made by Box::into_raw in nvmlEventSetCreate and just
        // taken out of the set of live handles, so freed once.
        drop(unsafe { Box::from_raw(set as *mut EventSet) });
        Ok(())
    }

    /// The event types the vGPU raises: none.
    fn nvmlDeviceGetSupportedEventTypes(d: Device, types: *mut c_ulonglong) {
        crate::device::check(d)?;
        out(types, 0)
    }

    /// Registering no type is accepted; any type is one the vGPU never
    /// raises (`NOT_SUPPORTED`, as NVML answers for an unsupported type).
    fn nvmlDeviceRegisterEvents(d: Device, types: c_ulonglong, set: *mut c_void) {
        crate::device::check(d)?;
        known(set)?;
        if types != 0 {
            return Err(code::NOT_SUPPORTED);
        }
        Ok(())
    }

    /// Nothing happens: the wait lasts its timeout, then says so.
    fn nvmlEventSetWait_v2 [nvmlEventSetWait] (set: *mut c_void, data: *mut c_void, timeout_ms: c_uint) {
        known(set)?;
        if data.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        std::thread::sleep(Duration::from_millis(u64::from(timeout_ms.min(10_000))));
        Err(TIMEOUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_freed_once_and_a_bogus_one_refused() {
        // No vGPU in unit tests: made by hand as nvmlEventSetCreate would.
        let p = Box::into_raw(Box::new(EventSet { _one: 0 })) as *mut c_void;
        SETS.lock()
            .unwrap()
            .get_or_insert_with(HashSet::new)
            .insert(p as usize);
        let mut data = [0u8; 64];
        // SAFETY: a live set and a buffer for the event's data.
        let r = unsafe { nvmlEventSetWait_v2(p, data.as_mut_ptr().cast(), 1) };
        assert_eq!(r, TIMEOUT);
        // SAFETY: a live set.
        assert_eq!(unsafe { nvmlEventSetFree(p) }, code::SUCCESS);
        // SAFETY: freed: refused, not freed again.
        assert_eq!(unsafe { nvmlEventSetFree(p) }, code::INVALID_ARGUMENT);
        let bogus = 0x1000 as *mut c_void;
        assert_eq!(
            // SAFETY: an unknown handle is refused before any use.
            unsafe { nvmlEventSetWait_v2(bogus, data.as_mut_ptr().cast(), 1) },
            code::INVALID_ARGUMENT
        );
    }
}
