//! IPC between the worker processes of a VM with process slots, through
//! the driver's own inter-process handles (`exports.rs` on the worker's
//! side): memory of `cuMemAlloc` by `cuIpcGetMemHandle` /
//! `cuIpcOpenMemHandle`; VMM memory (the movable ranges of multi-GPU
//! hosts, the guest's own mappings) by a POSIX file descriptor
//! (`cuMemExportToShareableHandle`, which the daemon passes on, and
//! `cuMemImportFromShareableHandle`, mapped at an address of the
//! opener's); events made interprocess by `cuIpcGetEventHandle` /
//! `cuIpcOpenEventHandle`. Contexts of one worker still share by address
//! (`session/ipc.rs`).

use std::ffi::c_void;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys;
use protocol::Status;

use super::check;
use super::context::{CudaContext, Obj};
use super::vmm::vmm_access;
use crate::executor::{Handle, Ipc, Portable};

/// Whether VMM memory is made exportable as a POSIX fd (set once a slot
/// worker serves a process, where it may be opened by another worker).
pub(super) static SHAREABLE_VMM: AtomicBool = AtomicBool::new(false);

/// What the first byte of a VMM range's handle is.
const VMM: u8 = 2;

/// Memory of another worker this context opened.
pub(super) enum Opened {
    /// `cuIpcOpenMemHandle`'s.
    Legacy,
    /// Imported physical memory mapped at the opener's range of `len`.
    Vmm {
        handle: sys::CUmemGenericAllocationHandle,
        len: usize,
    },
}

/// The driver's handle type for POSIX fds.
const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// Whether GPU `ordinal` exports memory as POSIX fds.
pub(super) fn posix_fd_supported(ordinal: u32) -> bool {
    let Ok(dev) = super::device::device(ordinal) else {
        return false;
    };
    let a =
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
    let mut v = 0;
    // SAFETY: out-parameter on our stack; a device of the driver's.
    let r = unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
    r == sys::cudaError_enum::CUDA_SUCCESS && v != 0
}

/// `prop` asks for memory exportable as a POSIX fd, if wanted and GPU
/// `ordinal` can.
pub(super) fn request_fd(prop: &mut sys::CUmemAllocationProp, ordinal: u32) {
    if SHAREABLE_VMM.load(Ordering::Relaxed) && posix_fd_supported(ordinal) {
        prop.requestedHandleTypes = POSIX_FD;
    }
}

/// Handle bytes: `kind`, then `a` and `b` little-endian (offset and
/// length of a VMM range).
fn pack(kind: u8, a: u64, b: u64) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[0] = kind;
    h[8..16].copy_from_slice(&a.to_le_bytes());
    h[16..24].copy_from_slice(&b.to_le_bytes());
    h
}

fn word(h: &[u8; 64], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&h[at..at + 8]);
    u64::from_le_bytes(w)
}

impl CudaContext {
    /// Exports physical memory `h` as a POSIX fd.
    fn export_fd(h: sys::CUmemGenericAllocationHandle) -> Result<OwnedFd, Status> {
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: out-parameter on our stack (an int, as the POSIX fd type
        // writes); a live handle of ours.
        check(unsafe {
            sys::cuMemExportToShareableHandle((&raw mut fd).cast::<c_void>(), h, POSIX_FD, 0)
        })?;
        if fd < 0 {
            return Err(Status::NotSupported);
        }
        // SAFETY: the driver made this fd for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Imports `fd` and maps `len` bytes of it from `offset` at a new range.
    fn import_fd(&mut self, fd: OwnedFd, offset: u64, len: u64) -> Result<u64, Status> {
        let g = self.granularity as u64;
        if !offset.is_multiple_of(g) || len == 0 || !len.is_multiple_of(g) {
            return Err(Status::InvalidValue);
        }
        let n = usize::try_from(len).map_err(|_| Status::InvalidValue)?;
        let at = usize::try_from(offset).map_err(|_| Status::InvalidValue)?;
        let h = import_shareable(fd)?;
        let va = match super::vmm::vmm_reserve(n) {
            Ok(va) => va,
            Err(e) => {
                // SAFETY: the handle just imported, released once.
                let _ = unsafe { sys::cuMemRelease(h) };
                return Err(e);
            }
        };
        let acc = vmm_access(self.ordinal);
        // SAFETY: `va` is a fresh reservation of `n` bytes; the driver
        // checks `offset + n` against the memory's size.
        let mapped = check(unsafe { sys::cuMemMap(va, n, at, h, 0) }).and_then(|()| {
            // SAFETY: the range just mapped; one descriptor.
            check(unsafe { sys::cuMemSetAccess(va, n, &acc, 1) })
        });
        if let Err(e) = mapped {
            // SAFETY: undoing our own mapping (if made), handle, reservation.
            let _ = unsafe { sys::cuMemUnmap(va, n) };
            // SAFETY: as above.
            let _ = unsafe { sys::cuMemRelease(h) };
            // SAFETY: as above.
            let _ = unsafe { sys::cuMemAddressFree(va, n) };
            return Err(e);
        }
        self.opened.insert(va, Opened::Vmm { handle: h, len: n });
        Ok(va)
    }
}

impl Ipc for CudaContext {
    fn set_across(&mut self) {
        SHAREABLE_VMM.store(true, Ordering::Relaxed);
        self.ipc_events = true;
    }

    fn export_mem(&mut self, base: u64, size: u64) -> Result<Portable, Status> {
        self.bind()?;
        if self.plain.contains(&base) {
            // SAFETY: all-zero is a valid handle to be written.
            let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
            // SAFETY: out-parameter on our stack; a live cuMemAlloc of ours.
            check(unsafe { sys::cuIpcGetMemHandle(&mut h, base) })?;
            let mut handle = [0u8; 64];
            for (d, s) in handle.iter_mut().zip(h.reserved.iter()) {
                *d = u8::from_ne_bytes(s.to_ne_bytes());
            }
            // The driver's bytes, whole: a legacy handle is told by the
            // absent fd.
            return Ok(Portable { handle, fd: None });
        }
        let (h, offset, len) = if let Some(a) = self.allocs.get(&base) {
            (a.handle, 0, a.padded as u64)
        } else if let Some(&(n, ours, offset)) = self.guest_vmm.maps.get(&base) {
            let (p, _) = self.guest_vmm.phys.get(&ours).ok_or(Status::InvalidValue)?;
            (p.0, offset, n as u64)
        } else {
            return Err(Status::InvalidValue);
        };
        if size > len {
            return Err(Status::InvalidValue);
        }
        let fd = Self::export_fd(h)?;
        Ok(Portable {
            handle: pack(VMM, offset, len),
            fd: Some(fd),
        })
    }

    fn open_mem(&mut self, size: u64, p: Portable) -> Result<u64, Status> {
        self.bind()?;
        if let Some(fd) = p.fd {
            if p.handle[0] != VMM {
                return Err(Status::InvalidValue);
            }
            let (offset, len) = (word(&p.handle, 8), word(&p.handle, 16));
            if size > len {
                return Err(Status::InvalidValue);
            }
            return self.import_fd(fd, offset, len);
        }
        // SAFETY: all-zero is a valid handle, filled below.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        for (d, s) in h.reserved.iter_mut().zip(p.handle.iter()) {
            *d = std::ffi::c_char::from_ne_bytes([*s]);
        }
        let mut dptr = 0;
        let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: out-parameter on our stack; the handle's bytes are the
        // exporter's driver's (a forged one is refused by the driver).
        check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut dptr, h, lazy) })?;
        self.opened.insert(dptr, Opened::Legacy);
        Ok(dptr)
    }

    fn close_opened(&mut self, base: u64) -> Result<(), Status> {
        self.bind()?;
        match self.opened.remove(&base).ok_or(Status::InvalidValue)? {
            // SAFETY: an address cuIpcOpenMemHandle gave this context, once.
            Opened::Legacy => check(unsafe { sys::cuIpcCloseMemHandle(base) }),
            Opened::Vmm { handle, len } => {
                // SAFETY: our mapping of imported memory, undone once (the
                // driver waits for work still using it).
                let _ = unsafe { sys::cuMemUnmap(base, len) };
                // SAFETY: as above.
                let _ = unsafe { sys::cuMemRelease(handle) };
                // SAFETY: as above.
                check(unsafe { sys::cuMemAddressFree(base, len) })
            }
        }
    }

    fn export_phys(&mut self, handle: Handle) -> Result<Portable, Status> {
        self.bind()?;
        let (p, n) = self
            .guest_vmm
            .phys
            .get(&handle)
            .ok_or(Status::InvalidHandle)?;
        let fd = Self::export_fd(p.0)?;
        Ok(Portable {
            handle: pack(VMM, 0, *n as u64),
            fd: Some(fd),
        })
    }

    fn open_phys(&mut self, size: u64, p: Portable) -> Result<Handle, Status> {
        self.bind()?;
        let fd = p.fd.ok_or(Status::InvalidValue)?;
        let n = usize::try_from(size).map_err(|_| Status::InvalidValue)?;
        let h = import_shareable(fd)?;
        self.next_handle += 1;
        // Released as the last holder lets go (`Phys::drop`).
        self.guest_vmm.phys.insert(
            self.next_handle,
            (std::sync::Arc::new(super::vmm::Phys(h)), n),
        );
        Ok(self.next_handle)
    }

    fn export_event(&mut self, event: Handle) -> Result<Portable, Status> {
        self.bind()?;
        let Some(&Obj::Event { raw, flags, .. }) = self.objs.get(&event) else {
            return Err(Status::InvalidHandle);
        };
        if flags & sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32 == 0 {
            return Err(Status::NotSupported);
        }
        // SAFETY: all-zero is a valid handle to be written.
        let mut h: sys::CUipcEventHandle = unsafe { std::mem::zeroed() };
        // SAFETY: out-parameter on our stack; an interprocess event of ours.
        check(unsafe { sys::cuIpcGetEventHandle(&mut h, raw) })?;
        let mut handle = [0u8; 64];
        for (d, s) in handle.iter_mut().zip(h.reserved.iter()) {
            *d = u8::from_ne_bytes(s.to_ne_bytes());
        }
        Ok(Portable { handle, fd: None })
    }

    fn open_event(&mut self, p: Portable) -> Result<Handle, Status> {
        self.bind()?;
        // SAFETY: all-zero is a valid handle, filled below.
        let mut h: sys::CUipcEventHandle = unsafe { std::mem::zeroed() };
        for (d, s) in h.reserved.iter_mut().zip(p.handle.iter()) {
            *d = std::ffi::c_char::from_ne_bytes([*s]);
        }
        let mut e: sys::CUevent = null_mut();
        // SAFETY: out-parameter on our stack; the driver checks the bytes.
        check(unsafe { sys::cuIpcOpenEventHandle(&mut e, h) })?;
        // An event of this context's now, destroyed as its own.
        Ok(self.insert(Obj::Event {
            raw: e,
            flags: sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
                | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            relay: null_mut(),
        }))
    }
}

/// Imports a POSIX-fd shareable handle (the fd is closed here; the driver
/// keeps its own reference once imported).
fn import_shareable(fd: OwnedFd) -> Result<sys::CUmemGenericAllocationHandle, Status> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    let raw = fd.into_raw_fd();
    // The driver takes the fd's number in the pointer (an open fd is never
    // negative).
    let os = std::ptr::without_provenance_mut::<c_void>(usize::try_from(raw).unwrap_or(0));
    // SAFETY: out-parameter on our stack; the fd is passed by value in the
    // pointer, as the driver takes a POSIX fd.
    let r = check(unsafe { sys::cuMemImportFromShareableHandle(&mut h, os, POSIX_FD) });
    // SAFETY: ours (taken from the OwnedFd above), closed once.
    drop(unsafe { OwnedFd::from_raw_fd(raw) });
    r.map(|()| h)
}
