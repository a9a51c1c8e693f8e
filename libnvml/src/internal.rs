//! `nvmlInternalGetExportTable`: NVML's private table, which NVIDIA's
//! `nvidia-smi` asks for before anything else it shows.
//!
//! What is publicly recorded about it (nothing here is NVIDIA's own
//! documentation; these are the observations of projects that made the real
//! `nvidia-smi` run over a substitute NVML):
//!
//! - `nvidia-smi` asks for one table, id `6c3efec4-8fc9-4e6c-a327-ee696e12f7c4`
//!   (bytes [`SMI_TABLE_ID`]). If `nvmlInternalGetExportTable` fails for it
//!   (or is missing), it prints "Mismatch in versions between nvidia-smi and
//!   NVML" and stops; it compares no version strings (substitutes reporting
//!   another driver release than its own are shown as they report).
//! - The table begins with its size, then function pointers; `nvidia-smi`
//!   calls an entry only where the size covers it (NVIDIA's k8s-test-infra
//!   mock NVML: slot 81, at byte 648, is called only for a size above 648).
//!   A table whose size is 0 makes it show everything from the public entry
//!   points (lupine's NVML shim, with `nvidia-smi` 535 and 580).
//! - Entries recorded with `nvidia-smi` 580.65.06 (k8s-test-infra): 81, a
//!   device handle by index `(index, *handle, 0x22)`; 213 to 215, process
//!   lists `(device, *count in/out, entries)` with 4,128-byte entries
//!   (pid, memory, instance ids, then an inline 4,096-byte name); 230, the
//!   host's maximum PCIe generation; 249, the sparse operation mode; 20 and
//!   197, a GPU reset. The other entries' meaning is not recorded.
//!
//! So the table given here offers no entry (its size is 0): `nvidia-smi`
//! takes everything from the public entry points this library serves. Its
//! entries are still functions, not null: a caller that ignores the size
//! gets slot 81 as recorded and `NVML_ERROR_NOT_SUPPORTED` from every other
//! slot (named in the log with `FAIRVGPU_NVML_DEBUG` set), never a jump to
//! address 0. Another table id is `NVML_ERROR_FUNCTION_NOT_FOUND`, which
//! real NVML answers for an id it does not have.

use std::ffi::{c_uint, c_void};

use crate::system::Device;
use crate::{code, Ret};

/// The id `nvidia-smi` asks for (`6c3efec4-8fc9-4e6c-a327-ee696e12f7c4`,
/// its first three fields little-endian, as a `GUID` lies in memory).
pub const SMI_TABLE_ID: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];

/// Entries behind the size (none offered: see the module's text).
pub const SLOTS: usize = 256;

/// The size the table declares: no entry (0 bytes, 0 entries, whichever
/// way a caller reads it).
pub const DECLARED_SIZE: usize = 0;

/// The recorded device-handle entry.
const SLOT_HANDLE_BY_INDEX: usize = 81;

/// The table as it lies in memory: the size, then the entries.
#[repr(C)]
struct Table {
    size: usize,
    slots: [*const c_void; SLOTS],
}

// SAFETY: the table is immutable (a static no code writes), and its
// pointers are functions of this library, valid for as long as it is loaded.
unsafe impl Sync for Table {}

/// An entry no one has recorded the meaning of: refused, and named once in
/// the log.
extern "C" fn refused<const N: usize>() -> Ret {
    crate::entry(|| {
        crate::log_once(&format!(
            "nvmlInternalGetExportTable slot {N} is not served; returning NVML_ERROR_NOT_SUPPORTED"
        ));
        Err(code::NOT_SUPPORTED)
    })
}

/// Slot 81: the device handle of `index` (`flags`, observed 0x22, unused).
extern "C" fn handle_by_index(index: c_uint, handle: *mut Device, _flags: c_uint) -> Ret {
    // SAFETY: the caller keeps nvmlDeviceGetHandleByIndex_v2's contract
    // (`handle` writable or null, which it refuses).
    unsafe { crate::system::nvmlDeviceGetHandleByIndex_v2(index, handle) }
}

const fn table() -> Table {
    let mut slots: [*const c_void; SLOTS] = include!(concat!(env!("OUT_DIR"), "/slots.rs"));
    slots[SLOT_HANDLE_BY_INDEX] = handle_by_index as *const c_void;
    Table {
        size: DECLARED_SIZE,
        slots,
    }
}

static TABLE: Table = table();

export! {
    /// The table `nvidia-smi` asks for (see the module's text); any other
    /// id is not found.
    fn nvmlInternalGetExportTable(table: *mut *const c_void, id: *const [u8; 16]) {
        if table.is_null() || id.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: a non-null id points at a 16-byte GUID (the caller's
        // contract); read unaligned, as a GUID may lie anywhere.
        let id = unsafe { id.read_unaligned() };
        if id != SMI_TABLE_ID {
            crate::log_once(&format!(
                "nvmlInternalGetExportTable: no table {}; returning NVML_ERROR_FUNCTION_NOT_FOUND",
                id.iter().map(|b| format!("{b:02x}")).collect::<String>()
            ));
            // Nothing is left behind where the table would have gone.
            crate::out(table, std::ptr::null())?;
            return Err(code::FUNCTION_NOT_FOUND);
        }
        crate::out(table, (&raw const TABLE).cast())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Slot = extern "C" fn() -> Ret;

    fn get(id: &[u8; 16]) -> (Ret, *const c_void) {
        let mut t: *const c_void = std::ptr::null();
        // SAFETY: valid out-parameter and id.
        let r = unsafe { nvmlInternalGetExportTable(&mut t, id) };
        (r, t)
    }

    #[test]
    fn nvidia_smis_table_offers_no_entry_and_none_is_null() {
        let (r, t) = get(&SMI_TABLE_ID);
        assert_eq!(r, code::SUCCESS);
        assert!(!t.is_null());
        // SAFETY: the table is a `Table`, as returned.
        let table = unsafe { &*t.cast::<Table>() };
        assert_eq!(table.size, 0);
        assert!(table.slots.iter().all(|p| !p.is_null()));
        // Every entry is its own function.
        let mut seen: Vec<usize> = table.slots.iter().map(|&p| p as usize).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), SLOTS);
        // An unrecorded entry refuses.
        // SAFETY: every entry but 81 is a `refused` taking no argument.
        let f: Slot = unsafe { std::mem::transmute(table.slots[213]) };
        assert_eq!(f(), code::NOT_SUPPORTED);
    }

    #[test]
    fn slot_81_is_the_device_handle_by_index() {
        let (_, t) = get(&SMI_TABLE_ID);
        // SAFETY: as above.
        let table = unsafe { &*t.cast::<Table>() };
        type HandleByIndex = extern "C" fn(c_uint, *mut Device, c_uint) -> Ret;
        // SAFETY: slot 81 is `handle_by_index`.
        let f: HandleByIndex = unsafe { std::mem::transmute(table.slots[81]) };
        let mut d: Device = std::ptr::null_mut();
        // Before nvmlInit, as nvmlDeviceGetHandleByIndex_v2 answers.
        assert_eq!(f(0, &mut d, 0x22), code::UNINITIALIZED);
        assert_eq!(f(0, std::ptr::null_mut(), 0x22), code::UNINITIALIZED);
    }

    #[test]
    fn another_table_is_not_found_and_null_arguments_are_refused() {
        let mut other = SMI_TABLE_ID;
        other[15] ^= 1;
        let (r, t) = get(&other);
        assert_eq!((r, t), (code::FUNCTION_NOT_FOUND, std::ptr::null()));
        // SAFETY: null pointers, which it refuses.
        let r = unsafe { nvmlInternalGetExportTable(std::ptr::null_mut(), &SMI_TABLE_ID) };
        assert_eq!(r, code::INVALID_ARGUMENT);
        let mut t: *const c_void = std::ptr::null();
        // SAFETY: as above.
        let r = unsafe { nvmlInternalGetExportTable(&mut t, std::ptr::null()) };
        assert_eq!(r, code::INVALID_ARGUMENT);
    }
}
