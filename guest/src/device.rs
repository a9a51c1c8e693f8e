//! Inside a VM: the kernel module's `/dev/fairvgpuN` (see
//! `kmod-shim/fairvgpu_shim.h`). It maps the shared region (the ivshmem BAR),
//! rings the host's doorbell, and blocks on the MSI-X interrupt of a vector
//! once the spin budget is spent. This is the only module of the crate that
//! issues `ioctl`s.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use transport::{Bell, PollingBell, Region};

use crate::{GuestError, Result};

/// The host's peer id on every ivshmem server.
const HOST_PEER: u32 = transport::server::HOST_PEER as u32;

// The ioctl numbers of fairvgpu_shim.h, spelled out (Linux's _IOC encoding).
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;
const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((b'F' as u32) << 8) | nr
}
/// `FVGPU_IOC_INFO`.
pub const IOC_INFO: u32 = ioc(IOC_READ, 1, std::mem::size_of::<RawInfo>());
/// `FVGPU_IOC_RING`.
pub const IOC_RING: u32 = ioc(IOC_WRITE, 2, 4);
/// `FVGPU_IOC_SET_VECTOR`.
pub const IOC_SET_VECTOR: u32 = ioc(IOC_WRITE, 3, 4);
/// `FVGPU_IOC_WAIT`.
pub const IOC_WAIT: u32 = ioc(IOC_WRITE, 4, 8);
/// `FVGPU_IOC_BIND`.
pub const IOC_BIND: u32 = ioc(IOC_WRITE, 5, 8);
/// `FVGPU_IOC_UNBIND`.
pub const IOC_UNBIND: u32 = ioc(IOC_WRITE, 6, 4);

/// `struct fvgpu_info`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct RawInfo {
    region_size: u64,
    peer_id: u32,
    vectors: u32,
    interrupts: u64,
    wakeups: u64,
}

/// What the module says about its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Bytes of the shared region (BAR2).
    pub region_size: u64,
    /// This VM's ivshmem peer id.
    pub peer_id: u32,
    /// MSI-X vectors in use; 0 means no interrupts (polling only).
    pub vectors: u32,
    /// Doorbell interrupts received so far.
    pub interrupts: u64,
    /// Waiters that blocked and were woken by an interrupt.
    pub wakeups: u64,
}

/// An open `/dev/fairvgpuN`.
#[derive(Debug)]
pub struct Device {
    file: File,
    path: PathBuf,
}

/// The first vGPU device of this VM, if the module is loaded and one is attached.
pub fn default_device() -> Option<PathBuf> {
    let p = PathBuf::from("/dev/fairvgpu0");
    is_device(&p).then_some(p)
}

/// Whether `path` is a character device (a vGPU) rather than a socket.
pub fn is_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

fn errno(what: &'static str, path: &Path) -> GuestError {
    GuestError::Device {
        what,
        path: path.to_owned(),
        source: std::io::Error::last_os_error(),
    }
}

impl Device {
    /// Opens the device.
    pub fn open(path: &Path) -> Result<Device> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| GuestError::Device {
                what: "open",
                path: path.to_owned(),
                source,
            })?;
        Ok(Device {
            file,
            path: path.to_owned(),
        })
    }

    fn ioctl_val(&self, what: &'static str, req: u32, arg: *mut libc::c_void) -> Result<i32> {
        // SAFETY: `req` is one of this module's requests and `arg` points to a
        // live value of exactly the size encoded in `req` (each caller below
        // passes the matching type); the fd is open for the call's duration.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), req as libc::c_ulong, arg) };
        if r < 0 {
            Err(errno(what, &self.path))
        } else {
            Ok(r)
        }
    }

    /// The module's view of the device, counters included.
    pub fn info(&self) -> Result<DeviceInfo> {
        let mut raw = RawInfo::default();
        self.ioctl_val("FVGPU_IOC_INFO", IOC_INFO, (&raw mut raw).cast())?;
        Ok(DeviceInfo {
            region_size: raw.region_size,
            peer_id: raw.peer_id,
            vectors: raw.vectors,
            interrupts: raw.interrupts,
            wakeups: raw.wakeups,
        })
    }

    /// Maps the shared region (`info.region_size` bytes, from [`Device::info`])
    /// and validates its header.
    pub fn region(&self, info: &DeviceInfo) -> Result<Region> {
        let size = info.region_size;
        let fd: OwnedFd = self
            .file
            .try_clone()
            .map_err(|source| GuestError::Device {
                what: "dup",
                path: self.path.clone(),
                source,
            })?
            .into();
        Ok(Region::open_device(fd, size)?)
    }

    /// Rings `vector` of `peer`.
    pub fn ring(&self, peer: u32, vector: u32) -> Result<()> {
        let mut v = (peer << 16) | (vector & 0xffff);
        self.ioctl_val("FVGPU_IOC_RING", IOC_RING, (&raw mut v).cast())
            .map(drop)
    }

    /// Waits on `vector` from now on.
    pub fn set_vector(&self, vector: u32) -> Result<()> {
        let mut v = vector;
        self.ioctl_val("FVGPU_IOC_SET_VECTOR", IOC_SET_VECTOR, (&raw mut v).cast())
            .map(drop)
    }

    /// Blocks until an interrupt on our vector or `timeout`; true if woken.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        let mut us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
        match self.ioctl_val("FVGPU_IOC_WAIT", IOC_WAIT, (&raw mut us).cast()) {
            Ok(r) => Ok(r > 0),
            Err(GuestError::Device { source, .. })
                if source.raw_os_error() == Some(libc::EINTR) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Tells the module that this file holds `channel` (claim `generation`):
    /// if the process dies holding it, the module marks it abandoned.
    pub fn bind(&self, channel: u32, generation: u32) -> Result<()> {
        let mut b = [channel, generation];
        self.ioctl_val("FVGPU_IOC_BIND", IOC_BIND, b.as_mut_ptr().cast())
            .map(drop)
    }

    /// The channel was let go cleanly.
    pub fn unbind(&self, channel: u32) -> Result<()> {
        let mut c = channel;
        self.ioctl_val("FVGPU_IOC_UNBIND", IOC_UNBIND, (&raw mut c).cast())
            .map(drop)
    }
}

/// A device error as the transport's waiting code sees it.
fn transport_err(e: GuestError) -> transport::Error {
    transport::Error::Protocol(e.to_string())
}

/// The host's doorbell, rung through BAR0.
#[derive(Debug)]
pub struct HostDoorbell {
    dev: Arc<Device>,
    vector: u32,
}

impl HostDoorbell {
    /// Rings the host's `vector`.
    pub fn new(dev: Arc<Device>, vector: u32) -> HostDoorbell {
        HostDoorbell { dev, vector }
    }
}

impl Bell for HostDoorbell {
    fn ring(&self) -> transport::Result<()> {
        self.dev.ring(HOST_PEER, self.vector).map_err(transport_err)
    }

    fn wait(&self, timeout: Duration) -> transport::Result<bool> {
        // Nobody waits on the host's bell from a guest.
        PollingBell.wait(timeout)
    }
}

/// The guest's own doorbell: an MSI-X vector, chosen at each wait to be the
/// one affine to the vCPU the waiter runs on, so that the host's ring lands
/// there (GPU-centric coscheduling kicks exactly that vCPU).
#[derive(Debug)]
pub struct VcpuBell {
    dev: Arc<Device>,
    region: Region,
    channel: u32,
    vectors: u32,
    vector: AtomicU32,
}

impl VcpuBell {
    /// A bell for `channel`, waiting on `vector` until the first wait moves it.
    pub fn new(
        dev: Arc<Device>,
        region: Region,
        channel: u32,
        vectors: u32,
        vector: u32,
    ) -> VcpuBell {
        VcpuBell {
            dev,
            region,
            channel,
            vectors,
            vector: AtomicU32::new(vector),
        }
    }
}

impl Bell for VcpuBell {
    fn ring(&self) -> transport::Result<()> {
        Ok(()) // only the host rings the guest
    }

    fn prepare(&self) -> transport::Result<()> {
        if self.vectors == 0 {
            return Ok(());
        }
        let want = crate::current_cpu() % self.vectors;
        if self.vector.load(Ordering::Relaxed) != want {
            // The region first: the host reads it after it sees us asleep.
            self.region.set_guest_vector(self.channel, want)?;
            self.dev.set_vector(want).map_err(transport_err)?;
            self.vector.store(want, Ordering::Relaxed);
        }
        Ok(())
    }

    fn wait(&self, timeout: Duration) -> transport::Result<bool> {
        if self.vectors == 0 {
            // No interrupts: poll, as without the module.
            return PollingBell.wait(timeout);
        }
        self.dev.wait(timeout).map_err(transport_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers here and in the C header must agree.
    #[test]
    fn ioctl_numbers_match_the_kernel_header() {
        let h = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../kmod-shim/fairvgpu_shim.h"),
        )
        .unwrap();
        let expect = [
            ("FVGPU_IOC_INFO", "_IOR", 1, "struct fvgpu_info", IOC_INFO),
            ("FVGPU_IOC_RING", "_IOW", 2, "__u32", IOC_RING),
            ("FVGPU_IOC_SET_VECTOR", "_IOW", 3, "__u32", IOC_SET_VECTOR),
            ("FVGPU_IOC_WAIT", "_IOW", 4, "struct fvgpu_wait", IOC_WAIT),
            ("FVGPU_IOC_BIND", "_IOW", 5, "struct fvgpu_bind", IOC_BIND),
            ("FVGPU_IOC_UNBIND", "_IOW", 6, "__u32", IOC_UNBIND),
        ];
        for (name, dir, nr, ty, value) in expect {
            let line = format!("#define {name} {dir}(FVGPU_IOC_MAGIC, {nr}, {ty})");
            assert!(h.contains(&line), "header lacks `{line}`");
            let size = (value >> 16) & 0x3fff;
            let want = match ty {
                "__u32" => 4,
                "struct fvgpu_wait" | "struct fvgpu_bind" => 8,
                "struct fvgpu_info" => 32,
                _ => unreachable!(),
            };
            assert_eq!(size, want, "{name} size");
            assert_eq!(value & 0xff, nr, "{name} number");
            assert_eq!(value >> 30, if dir == "_IOR" { 2 } else { 1 }, "{name} dir");
        }
        // struct fvgpu_info's fields, in order.
        for f in [
            "__u64 region_size;",
            "__u32 peer_id;",
            "__u32 vectors;",
            "__u64 interrupts;",
            "__u64 wakeups;",
        ] {
            assert!(h.contains(f), "fvgpu_info lacks {f}");
        }
    }

    #[test]
    fn sockets_are_not_devices() {
        assert!(!is_device(Path::new("/nonexistent")));
        assert!(!is_device(Path::new(env!("CARGO_MANIFEST_DIR"))));
        assert!(is_device(Path::new("/dev/null")));
    }
}
