//! `cuGetExportTable`: the driver's private tables, which the CUDA runtime
//! (`libcudart`, static and shared) and the libraries built on it ask for
//! by 16-byte identifier.

use std::ffi::c_void;

use cudarc::driver::sys::CUuuid;

use crate::code;

fn hex(id: &CUuuid) -> String {
    id.bytes
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect()
}

export! {
    fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) {
        if table.is_null() || id.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a 16-byte identifier (API contract).
        let id = unsafe { &*id };
        crate::log_once(&format!("no export table {}", hex(id)));
        Err(code::INVALID_VALUE)
    }
}
