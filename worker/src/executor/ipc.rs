//! The `Ipc` family of [`super::Context`]: memory one context of a worker shares with another (IPC
//! between processes of one VM, `session/ipc.rs`).

use std::sync::Arc;

use protocol::Status;

/// What one context hands another of the same worker so that it reaches
/// memory of the first (IPC between processes of one VM, see
/// `session/ipc.rs`): nothing on a GPU, where every context of a process
/// reaches every device address; the bytes themselves in the sim model.
#[derive(Clone, Default)]
pub struct SharedMem(pub Option<Arc<dyn std::any::Any + Send + Sync>>);

impl std::fmt::Debug for SharedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "SharedMem(bytes)"
        } else {
            "SharedMem"
        })
    }
}

/// What another worker process needs to reach memory or an event of this
/// one (IPC between the workers of a VM with process slots,
/// `exports.rs`): the driver's handle bytes (`cuIpcGetMemHandle`'s,
/// `cuIpcGetEventHandle`'s; zeros if none) and an fd to pass on (a memfd
/// of the sim's, a POSIX-fd shareable handle), if any.
#[derive(Debug)]
pub struct Portable {
    /// The driver's handle bytes.
    pub handle: [u8; 64],
    /// An fd the opener's worker needs.
    pub fd: Option<std::os::fd::OwnedFd>,
}

/// Memory one context of a worker shares with another (IPC between processes of one VM,
/// `session/ipc.rs`), or with a context of another worker of the VM.
pub trait Ipc {
    /// What another context of this worker needs to reach `[base, base +
    /// size)`, the start of an allocation or a mapping of this one (the
    /// worker checked that it is).
    fn share_mem(&mut self, base: u64, size: u64) -> Result<SharedMem, Status> {
        let _ = (base, size);
        Ok(SharedMem::default())
    }
    /// Makes `size` bytes at `base` that another context shared
    /// ([`Self::share_mem`]) reachable from this one.
    fn import_mem(&mut self, base: u64, size: u64, mem: &SharedMem) -> Result<(), Status> {
        let _ = (base, size, mem);
        Ok(())
    }
    /// Its process's other processes are served by other workers of the
    /// VM (process slots): what it makes is to be exportable to them
    /// (interprocess events, VMM memory exportable as a POSIX fd).
    fn set_across(&mut self) {}
    /// Forgets memory imported at `base`.
    fn close_mem(&mut self, base: u64) {
        let _ = base;
    }
    /// What another worker's context needs to reach `[base, base + size)`,
    /// the start of an allocation of this one (the worker checked).
    fn export_mem(&mut self, base: u64, size: u64) -> Result<Portable, Status> {
        let _ = (base, size);
        Err(Status::NotSupported)
    }
    /// Opens `size` bytes another worker exported ([`Self::export_mem`]):
    /// the address this context reaches them at.
    fn open_mem(&mut self, size: u64, p: Portable) -> Result<u64, Status> {
        let _ = (size, p);
        Err(Status::NotSupported)
    }
    /// Closes memory [`Self::open_mem`] opened at `base`.
    fn close_opened(&mut self, base: u64) -> Result<(), Status> {
        let _ = base;
        Err(Status::InvalidValue)
    }
    /// What another worker's context needs to use event `event` (made
    /// interprocess).
    fn export_event(&mut self, event: u64) -> Result<Portable, Status> {
        let _ = event;
        Err(Status::NotSupported)
    }
    /// What another worker's context needs to hold physical memory
    /// `handle` of this one (a shareable handle the guest exported).
    fn export_phys(&mut self, handle: super::Handle) -> Result<Portable, Status> {
        let _ = handle;
        Err(Status::NotSupported)
    }
    /// A handle of this context for `size` bytes of physical memory
    /// another worker exported ([`Self::export_phys`]).
    fn open_phys(&mut self, size: u64, p: Portable) -> Result<super::Handle, Status> {
        let _ = (size, p);
        Err(Status::NotSupported)
    }
    /// An event of this context for one another worker exported.
    fn open_event(&mut self, p: Portable) -> Result<u64, Status> {
        let _ = p;
        Err(Status::NotSupported)
    }
}
