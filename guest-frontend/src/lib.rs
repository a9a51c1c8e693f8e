//! The guest side: a CUDA client over one channel of the shared region.
//!
//! [`Gpu`] owns one claimed channel (one guest process, one host context).
//! Synchronous calls send a request and poll for the reply (spinning, then
//! blocking on the doorbell); asynchronous calls (launches, host-to-device
//! copies, memsets, event records) only enqueue a descriptor. Their errors,
//! like CUDA's, come back at the next synchronizing call.
//!
//! Natively (a process on the host, tests, benches) [`Gpu::connect`] attaches
//! through the ivshmem-server socket; inside a VM the same code runs over the
//! PCI BAR mapped by the kernel module.

#![warn(missing_docs)]

pub mod copy;
pub mod device;

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use protocol::{op, DeviceInfo, Dim3, ImageKind, Reply, Request, Status, INLINE};
use qemu_ivshmem::layout::Direction;
use qemu_ivshmem::server::Client;
use qemu_ivshmem::wait::{notify_if_sleeping, wait_for};
use qemu_ivshmem::{Bell, Descriptor, GuestChannel, SpinPolicy, FLAG_MORE, FLAG_NO_REPLY};

/// What a call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The host ran the call and it failed.
    #[error("CUDA error {0:?}")]
    Cuda(Status),
    /// The transport failed (host gone, channel reclaimed, ...).
    #[error("transport: {0}")]
    Transport(qemu_ivshmem::Error),
    /// The vGPU's host worker restarted (it crashed, or a kernel fault
    /// poisoned its GPU contexts): everything this connection held on the
    /// GPU is gone. Drop this `Gpu` and open a new one to go on.
    #[error("the vGPU was reset (its host worker restarted); open the GPU again")]
    VgpuReset,
    /// The host answered something malformed.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The vGPU device of the kernel module failed.
    #[error("{what} on {}: {source}", path.display())]
    Device {
        /// The operation.
        what: &'static str,
        /// The device file.
        path: std::path::PathBuf,
        /// The system error.
        source: std::io::Error,
    },
    /// No vGPU is configured for this process.
    #[error("no vGPU: set FAIRVGPU_SOCKET (a host socket) or FAIRVGPU_DEVICE, or load the fairvgpu module in a VM with a vGPU attached")]
    NoVgpu,
}

impl From<qemu_ivshmem::Error> for GuestError {
    fn from(e: qemu_ivshmem::Error) -> Self {
        match e {
            qemu_ivshmem::Error::HostRestarted { .. } => GuestError::VgpuReset,
            e => GuestError::Transport(e),
        }
    }
}

/// Result of a guest call.
pub type Result<T> = std::result::Result<T, GuestError>;

/// A device pointer (a number the host issued; meaningful only to the host).
pub type DevPtr = u64;

/// A loaded kernel.
#[derive(Debug, Clone)]
pub struct Function {
    /// Host handle.
    pub handle: u64,
    /// Size in bytes of each parameter, from the module's metadata.
    pub param_sizes: Vec<u32>,
    /// Offset of each parameter in the kernel's parameter buffer.
    pub param_offsets: Vec<u32>,
}

/// One guest process's connection to its vGPU.
pub struct Gpu {
    ch: GuestChannel,
    host_bell: Arc<dyn Bell>,
    own_bell: Arc<dyn Bell>,
    policy: SpinPolicy,
    /// The process's request numbering, shared by all its channels.
    seq: Arc<AtomicU64>,
    /// The session's token (for further channels to join it).
    token: [u64; 2],
    /// Where the vGPU was found (for further channels).
    origin: Origin,
    info: DeviceInfo,
    buf: Vec<u8>,
    copier: copy::Copier,
    transport: Transport,
}

/// Where a process found its vGPU: a host socket or a VM's device.
#[derive(Debug, Clone)]
enum Origin {
    Socket(std::path::PathBuf),
    Device(std::path::PathBuf),
}

/// Opens further channels to a process's session (see [`Gpu::join`]).
#[derive(Debug, Clone)]
pub struct Joiner {
    origin: Origin,
    policy: SpinPolicy,
    seq: Arc<AtomicU64>,
    token: [u64; 2],
    info: DeviceInfo,
}

impl Joiner {
    /// A further channel to the session.
    pub fn join(&self) -> Result<Gpu> {
        let join = Some(Joining {
            seq: self.seq.clone(),
            token: self.token,
            info: self.info.clone(),
        });
        match &self.origin {
            Origin::Socket(p) => Gpu::attach_socket(p, self.policy, join),
            Origin::Device(p) => Gpu::attach_device(p, self.policy, join),
        }
    }
}

/// What a further channel of a process takes from its first.
struct Joining {
    seq: Arc<AtomicU64>,
    token: [u64; 2],
    info: DeviceInfo,
}

/// What keeps the channel reachable: the host socket (native) or the kernel
/// module's device (in a VM).
#[derive(Debug)]
enum Transport {
    /// Held for its socket: dropping it tells the host we left.
    #[allow(dead_code)]
    Native(Client),
    Device(Arc<device::Device>),
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("channel", &self.ch.index())
            .field("device", &self.info.name)
            .finish()
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // A forked child that inherited this connection (and drops it, say
        // in an atexit handler) must leave its parent's channel alone.
        if !self.ch.claimed_here() {
            return;
        }
        // Let go first, then tell the module: a death between the two finds
        // the channel already closing, which the module leaves alone.
        self.ch.release();
        if let Transport::Device(d) = &self.transport {
            let _ = d.unbind(self.ch.index());
        }
    }
}

/// How long a synchronous call may wait for the host before giving up.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);

pub(crate) fn current_cpu() -> u32 {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).unwrap_or(0)
}

impl Gpu {
    /// Attaches natively through the ivshmem-server socket at `path`.
    pub fn connect(path: &Path) -> Result<Gpu> {
        Self::connect_with(path, SpinPolicy::default())
    }

    /// Like [`Gpu::connect`] with a chosen spin policy.
    pub fn connect_with(path: &Path, policy: SpinPolicy) -> Result<Gpu> {
        Self::attach_socket(path, policy, None)
    }

    fn attach_socket(path: &Path, policy: SpinPolicy, join: Option<Joining>) -> Result<Gpu> {
        let client = Client::connect(path, Duration::from_secs(10))?;
        let vectors = client.region.layout().params.vectors;
        let ch = client
            .region
            .claim(u32::from(client.id), std::process::id(), 0)?;
        let vector = ch.index() % vectors;
        let own_bell: Arc<dyn Bell> = client.own_bells[vector as usize].clone();
        let host_bell: Arc<dyn Bell> = client.host_bells[vector as usize].clone();
        Self::start(
            ch,
            vector,
            host_bell,
            own_bell,
            policy,
            Transport::Native(client),
            Origin::Socket(path.to_owned()),
            join,
        )
    }

    /// Attaches inside a VM through the kernel module's device (`/dev/fairvgpuN`).
    pub fn open_device(path: &Path, policy: SpinPolicy) -> Result<Gpu> {
        Self::attach_device(path, policy, None)
    }

    fn attach_device(path: &Path, policy: SpinPolicy, join: Option<Joining>) -> Result<Gpu> {
        let dev = Arc::new(device::Device::open(path)?);
        let info = dev.info()?;
        let region = dev.region(&info)?;
        let host_vectors = region.layout().params.vectors;
        let vector = if info.vectors == 0 {
            0
        } else {
            current_cpu() % info.vectors
        };
        let ch = region.claim(info.peer_id, std::process::id(), vector)?;
        // From here on, if this process dies, the module gives the channel back.
        dev.bind(ch.index(), ch.generation())?;
        if info.vectors > 0 {
            dev.set_vector(vector)?;
        }
        let own_bell: Arc<dyn Bell> = Arc::new(device::VcpuBell::new(
            dev.clone(),
            region.clone(),
            ch.index(),
            info.vectors,
            vector,
        ));
        let host_bell: Arc<dyn Bell> = Arc::new(device::HostDoorbell::new(
            dev.clone(),
            ch.index() % host_vectors,
        ));
        Self::start(
            ch,
            vector,
            host_bell,
            own_bell,
            policy,
            Transport::Device(dev),
            Origin::Device(path.to_owned()),
            join,
        )
    }

    /// A further channel to this process's session, for another thread:
    /// calls on it go on at the same time as this one's (a thread waiting
    /// in a synchronize here holds up no call there), and the host runs the
    /// process's requests in the order they were made across its channels.
    /// It has its own connection (socket or device file), so that each
    /// thread waits on its own doorbell.
    pub fn join(&self) -> Result<Gpu> {
        self.joiner().join()
    }

    /// What [`Gpu::join`] needs, apart from this connection (to join from
    /// another thread while this one is in a call).
    pub fn joiner(&self) -> Joiner {
        Joiner {
            origin: self.origin.clone(),
            policy: self.policy,
            seq: self.seq.clone(),
            token: self.token,
            info: self.info.clone(),
        }
    }

    /// Attaches to `path`: a vGPU device if it is a character device, else a
    /// host socket.
    pub fn open(path: &Path, policy: SpinPolicy) -> Result<Gpu> {
        if device::is_device(path) {
            Self::open_device(path, policy)
        } else {
            Self::connect_with(path, policy)
        }
    }

    /// Attaches to what the environment names: `FAIRVGPU_SOCKET` (a host
    /// socket, for processes on the host), else `FAIRVGPU_DEVICE`, else
    /// `/dev/fairvgpu0`. `FAIRVGPU_SPINS` overrides the spin budget.
    pub fn from_env() -> Result<Gpu> {
        let mut policy = SpinPolicy::default();
        if let Some(n) = std::env::var("FAIRVGPU_SPINS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            policy.spins = n;
        }
        if let Some(sock) = std::env::var_os("FAIRVGPU_SOCKET") {
            return Self::connect_with(sock.as_ref(), policy);
        }
        if let Some(dev) = std::env::var_os("FAIRVGPU_DEVICE") {
            return Self::open_device(dev.as_ref(), policy);
        }
        match device::default_device() {
            Some(dev) => Self::open_device(&dev, policy),
            None => Err(GuestError::NoVgpu),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        ch: GuestChannel,
        vector: u32,
        host_bell: Arc<dyn Bell>,
        own_bell: Arc<dyn Bell>,
        policy: SpinPolicy,
        transport: Transport,
        origin: Origin,
        join: Option<Joining>,
    ) -> Result<Gpu> {
        ch.set_guest_vector(vector)?;
        let seq = join
            .as_ref()
            .map_or_else(|| Arc::new(AtomicU64::new(1)), |j| j.seq.clone());
        let mut gpu = Gpu {
            ch,
            host_bell,
            own_bell,
            policy,
            seq,
            token: [0; 2],
            origin,
            info: DeviceInfo::default(),
            buf: Vec::new(),
            copier: copy::Copier::default(),
            transport,
        };
        if let Some(j) = join {
            gpu.call(&Request::Join { token: j.token })?;
            gpu.token = j.token;
            gpu.info = j.info;
            return Ok(gpu);
        }
        let (r, data) = gpu.call_data(
            &Request::Hello {
                version: protocol::PROTOCOL_VERSION,
            },
            &[],
        )?;
        gpu.token = [r.vals[0], r.vals[1]];
        gpu.info =
            DeviceInfo::from_bytes(&data).map_err(|e| GuestError::Protocol(e.to_string()))?;
        Ok(gpu)
    }

    /// The kernel module's counters for this process's vGPU device (None
    /// when attached natively).
    pub fn device_counters(&self) -> Option<device::DeviceInfo> {
        match &self.transport {
            Transport::Device(d) => d.info().ok(),
            Transport::Native(_) => None,
        }
    }

    /// How many threads copy large transfers through the arenas (1 or 2;
    /// the default is 2 where this process may run on four CPUs or more, or
    /// what `FAIRVGPU_COPY_THREADS` says: [`copy::default_threads`]).
    pub fn set_copy_threads(&mut self, threads: usize) {
        self.copier.set_threads(threads);
    }

    /// Large chunks split between two threads so far, and how many of their
    /// second halves the helper thread copied (the caller copied the rest,
    /// the helper not having started on them in time).
    pub fn copy_split_counts(&self) -> (u64, u64) {
        self.copier.split_counts()
    }

    /// How many threads copy large transfers.
    pub fn copy_threads(&self) -> usize {
        self.copier.threads()
    }

    /// The device as the host describes it (answered without a round trip).
    pub fn device_info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The channel number in the region.
    pub fn channel(&self) -> u32 {
        self.ch.index()
    }

    fn descriptor(&mut self, req: &Request) -> Descriptor {
        // Some requests are outside the process's numbering.
        let tag = if req.unnumbered() {
            0
        } else {
            self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        };
        let mut d = Descriptor::new(tag, req.opcode());
        let mut inline = [0u8; INLINE];
        req.encode(&mut inline);
        d.inline = inline;
        d.vcpu = current_cpu();
        if !req.expects_reply() {
            d.flags |= FLAG_NO_REPLY;
        }
        d
    }

    /// Largest chunk of data one descriptor carries.
    fn chunk(&self) -> usize {
        (self.ch.req.max_data() / 4).max(4096)
    }

    fn push(&mut self, d: &Descriptor, data: &[u8]) -> Result<()> {
        let mut spins = 0u32;
        let copier = &mut self.copier;
        while !self.ch.req.try_send_with(d, data.len(), |_, s| {
            copier.copy_in(data, &s);
            Ok(())
        })? {
            // Ring or arena full: the host is behind. Make sure it is awake.
            notify_if_sleeping(self.ch.region().host_sleeping()?, &*self.host_bell)?;
            spins += 1;
            if spins > 1000 {
                self.ch.check_alive()?;
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
        notify_if_sleeping(self.ch.region().host_sleeping()?, &*self.host_bell)?;
        Ok(())
    }

    /// Sends a request with its data (chunked through the arena as needed).
    fn send(&mut self, req: &Request, data: &[u8]) -> Result<u64> {
        let chunk = self.chunk();
        let mut d = self.descriptor(req);
        let tag = d.tag;
        let first = data.len().min(chunk);
        if data.len() > first {
            d.flags |= FLAG_MORE;
        }
        self.push(&d, &data[..first])?;
        let mut off = first;
        while off < data.len() {
            let n = (data.len() - off).min(chunk);
            let mut c = Descriptor::new(tag, op::DATA);
            c.flags = if off + n < data.len() { FLAG_MORE } else { 0 };
            c.vcpu = d.vcpu;
            self.push(&c, &data[off..off + n])?;
            off += n;
        }
        Ok(tag)
    }

    /// Waits until the next response is visible (not yet consumed).
    fn wait_reply(&mut self, tag: u64) -> Result<Descriptor> {
        let deadline = Some(std::time::Instant::now() + CALL_TIMEOUT);
        let region = self.ch.region().clone();
        let sleeping = region.ring_sleeping(self.ch.index(), Direction::ToGuest)?;
        let (resp, ch) = (&self.ch.resp, &self.ch);
        let mut polls = 0u32;
        let spins = self.policy.spins;
        let d = wait_for(&self.policy, sleeping, &*self.own_bell, deadline, || {
            if let Some(d) = resp.peek()? {
                return Ok(Some(d));
            }
            // Now and then while spinning, and on every look once blocking,
            // make sure the host that owes the reply is still the one we
            // asked: a restarted worker marks our channel LOST and rings.
            polls = polls.saturating_add(1);
            if polls >= spins || polls.is_multiple_of(64) {
                ch.check_alive()?;
            }
            Ok(None)
        })?;
        if d.tag != tag {
            return Err(GuestError::Protocol(format!(
                "reply tag {} for request {tag}",
                d.tag
            )));
        }
        Ok(d)
    }

    /// Waits for the next response; copies its data into `self.buf`.
    fn recv(&mut self, tag: u64) -> Result<Descriptor> {
        let d = self.wait_reply(tag)?;
        self.buf.clear();
        self.buf.resize(d.data_len as usize, 0);
        self.ch.resp.data(&d)?.copy_to(&mut self.buf[..]);
        self.ch.resp.consume(&d)?;
        Ok(d)
    }

    fn status(d: &Descriptor) -> Result<()> {
        match Status::from_code(d.status) {
            Status::Success => Ok(()),
            s => Err(GuestError::Cuda(s)),
        }
    }

    /// A synchronous call; returns the reply values and data.
    fn call_data(&mut self, req: &Request, data: &[u8]) -> Result<(Reply, Vec<u8>)> {
        let tag = self.send(req, data)?;
        let d = self.recv(tag)?;
        Self::status(&d)?;
        Ok((Reply::decode(&d.inline), std::mem::take(&mut self.buf)))
    }

    fn call(&mut self, req: &Request) -> Result<Reply> {
        let tag = self.send(req, &[])?;
        let d = self.recv(tag)?;
        Self::status(&d)?;
        Ok(Reply::decode(&d.inline))
    }

    /// A query call: `NotReady` means "not yet", not an error.
    fn query(&mut self, req: &Request) -> Result<bool> {
        match self.call(req) {
            Ok(_) => Ok(true),
            Err(GuestError::Cuda(Status::NotReady)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// cuMemAlloc.
    pub fn mem_alloc(&mut self, size: u64) -> Result<DevPtr> {
        Ok(self.call(&Request::MemAlloc { size })?.vals[0])
    }

    /// A synchronous request of any kind (calls with no method of their
    /// own here, such as the VMM API's); its reply values.
    pub fn request(&mut self, req: &Request) -> Result<Reply> {
        self.call(req)
    }

    /// cuMemFree.
    pub fn mem_free(&mut self, ptr: DevPtr) -> Result<()> {
        self.call(&Request::MemFree { ptr }).map(drop)
    }

    /// cuMemFreeAsync: frees once the work submitted to `stream` so far is
    /// done (asynchronous; an error comes at the next synchronizing call).
    pub fn mem_free_async(&mut self, ptr: DevPtr, stream: u64) -> Result<()> {
        self.send(&Request::MemFreeAsync { ptr, stream }, &[])
            .map(drop)
    }

    /// Queues guest host function `id` in `stream` (see
    /// `protocol::Request::HostFn`).
    pub fn host_fn(&mut self, stream: u64, id: u64) -> Result<()> {
        self.send(&Request::HostFn { stream, id }, &[]).map(drop)
    }

    /// Waits (about a second at most) for a host function whose stream is
    /// there: its id (0: none yet) and the error code of the work before it.
    pub fn wait_host_fn(&mut self) -> Result<(u64, u32)> {
        let r = self.call(&Request::WaitHostFn)?;
        Ok((r.vals[0], r.vals[1] as u32))
    }

    /// Host function `id` has run.
    pub fn host_fn_done(&mut self, id: u64) -> Result<()> {
        self.send(&Request::HostFnDone { id }, &[]).map(drop)
    }

    /// Pinned memory from the region's pool: its offset in the pool.
    pub fn pinned_alloc(&mut self, size: u64) -> Result<u64> {
        Ok(self.call(&Request::PinnedAlloc { size })?.vals[0])
    }

    /// Gives pinned memory back.
    pub fn pinned_free(&mut self, offset: u64) -> Result<()> {
        self.call(&Request::PinnedFree { offset }).map(drop)
    }

    /// Copies `len` bytes of pinned memory at pool offset `offset` to the
    /// device, when `stream` gets there (DMA; returns at once).
    pub fn memcpy_htod_pinned(
        &mut self,
        dst: DevPtr,
        offset: u64,
        len: u64,
        stream: u64,
    ) -> Result<()> {
        self.send(
            &Request::MemcpyHtoDPinned {
                dst,
                offset,
                len,
                stream,
            },
            &[],
        )
        .map(drop)
    }

    /// Copies device bytes to pinned memory at pool offset `offset` when
    /// `stream` gets there (DMA; returns at once).
    pub fn memcpy_dtoh_pinned(
        &mut self,
        src: DevPtr,
        offset: u64,
        len: u64,
        stream: u64,
    ) -> Result<()> {
        self.send(
            &Request::MemcpyDtoHPinned {
                src,
                offset,
                len,
                stream,
            },
            &[],
        )
        .map(drop)
    }

    /// The shared region this connection uses.
    pub fn region(&self) -> &qemu_ivshmem::Region {
        self.ch.region()
    }

    /// cuMemGetInfo: (free, total) of this vGPU.
    pub fn mem_get_info(&mut self) -> Result<(u64, u64)> {
        let r = self.call(&Request::MemGetInfo)?;
        Ok((r.vals[0], r.vals[1]))
    }

    /// cuMemcpyHtoDAsync: enqueues the copy; returns once the bytes are in the ring.
    pub fn memcpy_htod_async(&mut self, dst: DevPtr, src: &[u8], stream: u64) -> Result<()> {
        self.send(
            &Request::MemcpyHtoD {
                dst,
                len: src.len() as u64,
                stream,
            },
            src,
        )
        .map(drop)
    }

    /// cuMemcpyHtoD: copy and wait for completion.
    pub fn memcpy_htod(&mut self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.memcpy_htod_async(dst, src, 0)?;
        self.stream_synchronize(0)
    }

    /// cuMemcpyDtoH: synchronous; streams the bytes back through the arena.
    pub fn memcpy_dtoh(&mut self, dst: &mut [u8], src: DevPtr, stream: u64) -> Result<()> {
        let len = dst.len();
        let tag = self.send(
            &Request::MemcpyDtoH {
                src,
                len: len as u64,
                stream,
            },
            &[],
        )?;
        let mut off = 0;
        loop {
            let d = self.wait_reply(tag)?;
            let n = d.data_len as usize;
            if d.status == 0 && off + n > len {
                self.ch.resp.consume(&d)?;
                return Err(GuestError::Protocol(format!(
                    "host sent {} bytes for a {len}-byte copy",
                    off + n
                )));
            }
            if d.status == 0 {
                // One copy, straight from the arena into the caller's buffer.
                self.copier
                    .copy_out(&self.ch.resp.data(&d)?, &mut dst[off..off + n]);
            }
            self.ch.resp.consume(&d)?;
            Self::status(&d)?;
            off += n;
            if d.flags & FLAG_MORE == 0 {
                break;
            }
        }
        if off != len {
            return Err(GuestError::Protocol(format!(
                "host sent {off} of {len} bytes"
            )));
        }
        Ok(())
    }

    /// cuMemcpyDtoDAsync.
    pub fn memcpy_dtod_async(
        &mut self,
        dst: DevPtr,
        src: DevPtr,
        len: u64,
        stream: u64,
    ) -> Result<()> {
        self.send(
            &Request::MemcpyDtoD {
                dst,
                src,
                len,
                stream,
            },
            &[],
        )
        .map(drop)
    }

    /// cuMemsetD8/D16/D32Async.
    pub fn memset_async(
        &mut self,
        dst: DevPtr,
        value: u32,
        width: u32,
        count: u64,
        stream: u64,
    ) -> Result<()> {
        self.send(
            &Request::Memset {
                dst,
                value,
                width,
                count,
                stream,
            },
            &[],
        )
        .map(drop)
    }

    /// cuModuleLoadData with a PTX text or a cubin image. An image of
    /// [`protocol::CACHED_IMAGE`] bytes or more is first asked for by its
    /// hash: the host may hold it from another of the vGPU's processes.
    pub fn module_load(&mut self, kind: ImageKind, image: &[u8]) -> Result<u64> {
        if image.len() as u64 >= protocol::CACHED_IMAGE {
            let len = image.len() as u64;
            let hash = protocol::image_hash(image);
            match self.call(&Request::ModuleLoadCached { kind, len, hash }) {
                Ok(r) => return Ok(r.vals[0]),
                Err(GuestError::Cuda(Status::NotFound)) => {}
                Err(e) => return Err(e),
            }
        }
        let (r, _) = self.call_data(
            &Request::ModuleLoad {
                kind,
                len: image.len() as u64,
            },
            image,
        )?;
        Ok(r.vals[0])
    }

    /// cuModuleUnload.
    pub fn module_unload(&mut self, module: u64) -> Result<()> {
        self.call(&Request::ModuleUnload { module }).map(drop)
    }

    /// cuModuleGetFunction; also returns the parameter sizes.
    pub fn get_function(&mut self, module: u64, name: &str) -> Result<Function> {
        let (r, data) = self.call_data(&Request::ModuleGetFunction { module }, name.as_bytes())?;
        let params = protocol::Param::decode_all(&data);
        Ok(Function {
            handle: r.vals[0],
            param_sizes: params.iter().map(|p| p.size).collect(),
            param_offsets: params.iter().map(|p| p.offset).collect(),
        })
    }

    /// cuFuncGetAttribute.
    pub fn func_attribute(&mut self, func: u64, attr: u32) -> Result<i32> {
        Ok(self.call(&Request::FuncGetAttribute { func, attr })?.vals[0] as u32 as i32)
    }

    /// cuOccupancyMaxActiveBlocksPerMultiprocessor.
    pub fn occupancy(&mut self, func: u64, block_size: u32, shared_mem: u32) -> Result<i32> {
        let r = self.call(&Request::Occupancy {
            func,
            block_size,
            shared_mem,
        })?;
        Ok(r.vals[0] as u32 as i32)
    }

    /// cuOccupancyMaxActiveClusters (`potential` false) or
    /// cuOccupancyMaxPotentialClusterSize (`potential` true).
    pub fn occupancy_clusters(
        &mut self,
        func: u64,
        shape: (Dim3, Dim3, u32),
        cluster: Dim3,
        potential: bool,
    ) -> Result<i32> {
        let (grid, block, shared_mem) = shape;
        let r = self.call(&Request::OccupancyClusters {
            func,
            grid,
            block,
            shared_mem,
            cluster,
            potential,
        })?;
        Ok(r.vals[0] as u32 as i32)
    }

    /// cuOccupancyAvailableDynamicSMemPerBlock.
    pub fn available_smem(&mut self, func: u64, num_blocks: u32, block_size: u32) -> Result<u64> {
        Ok(self
            .call(&Request::OccupancySmem {
                func,
                num_blocks,
                block_size,
            })?
            .vals[0])
    }

    /// A tensor-map descriptor encoded by the host's driver from
    /// `protocol::tensor_map::TensorMapParams::encode`'s bytes.
    pub fn tensor_map(&mut self, params: &[u8]) -> Result<Vec<u8>> {
        let (_, data) = self.call_data(&Request::TensorMapEncode, params)?;
        Ok(data)
    }

    /// cuModuleGetGlobal: (address, size).
    pub fn module_global(&mut self, module: u64, name: &str) -> Result<(u64, u64)> {
        let (r, _) = self.call_data(&Request::ModuleGetGlobal { module }, name.as_bytes())?;
        Ok((r.vals[0], r.vals[1]))
    }

    /// cuLink*: links `(input type, image)` pairs on the host; returns the linked image.
    pub fn link(&mut self, inputs: &[(u32, &[u8])]) -> Result<Vec<u8>> {
        let mut records = Vec::new();
        for (kind, bytes) in inputs {
            let len =
                u32::try_from(bytes.len()).map_err(|_| GuestError::Cuda(Status::InvalidValue))?;
            records.extend_from_slice(&kind.to_le_bytes());
            records.extend_from_slice(&len.to_le_bytes());
            records.extend_from_slice(bytes);
        }
        let (_, image) = self.call_data(
            &Request::Link {
                len: records.len() as u64,
            },
            &records,
        )?;
        Ok(image)
    }

    /// cuLaunchKernel: marshals `params` (one byte slice per parameter) by the
    /// kernel's real parameter sizes and enqueues the launch.
    pub fn launch(
        &mut self,
        f: &Function,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: u64,
        params: &[&[u8]],
    ) -> Result<()> {
        if params.len() != f.param_sizes.len() {
            return Err(GuestError::Cuda(Status::InvalidValue));
        }
        let mut packed = Vec::with_capacity(64);
        for (p, &size) in params.iter().zip(&f.param_sizes) {
            if p.len() != size as usize {
                return Err(GuestError::Cuda(Status::InvalidValue));
            }
            packed.extend_from_slice(p);
        }
        self.send(
            &Request::Launch {
                func: f.handle,
                grid,
                block,
                shared_mem,
                stream,
                cluster: Dim3::default(),
                flags: 0,
            },
            &packed,
        )
        .map(drop)
    }

    /// Launch with raw packed parameters, unchecked here (the host checks).
    pub fn launch_raw(
        &mut self,
        func: u64,
        grid: Dim3,
        block: Dim3,
        stream: u64,
        packed: &[u8],
    ) -> Result<()> {
        self.launch_packed(func, grid, block, 0, stream, packed)
    }

    /// Launch with raw packed parameters and `shared_mem` bytes of dynamic
    /// shared memory, unchecked here (the host checks).
    pub fn launch_packed(
        &mut self,
        func: u64,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: u64,
        packed: &[u8],
    ) -> Result<()> {
        self.send(
            &Request::Launch {
                func,
                grid,
                block,
                shared_mem,
                stream,
                cluster: Dim3::default(),
                flags: 0,
            },
            packed,
        )
        .map(drop)
    }

    /// A launch with thread block clusters (`cluster` all zero: none)
    /// and `protocol::launch_flags`, with raw packed parameters.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_ex(
        &mut self,
        func: u64,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: u64,
        cluster: Dim3,
        flags: u32,
        packed: &[u8],
    ) -> Result<()> {
        self.send(
            &Request::Launch {
                func,
                grid,
                block,
                shared_mem,
                stream,
                cluster,
                flags,
            },
            packed,
        )
        .map(drop)
    }

    /// cuStreamWaitEvent (asynchronous).
    pub fn stream_wait_event(&mut self, stream: u64, event: u64, flags: u32) -> Result<()> {
        self.send(
            &Request::StreamWaitEvent {
                stream,
                event,
                flags,
            },
            &[],
        )
        .map(drop)
    }

    /// cuFuncSetAttribute.
    pub fn func_set_attribute(&mut self, func: u64, attr: u32, value: i32) -> Result<()> {
        self.call(&Request::FuncSetAttribute { func, attr, value })
            .map(drop)
    }

    /// cuCtxGetLimit.
    pub fn limit(&mut self, limit: u32) -> Result<u64> {
        Ok(self.call(&Request::CtxGetLimit { limit })?.vals[0])
    }

    /// cuCtxSetLimit.
    pub fn set_limit(&mut self, limit: u32, value: u64) -> Result<()> {
        self.call(&Request::CtxSetLimit { limit, value }).map(drop)
    }

    /// cuCtxSynchronize.
    pub fn synchronize(&mut self) -> Result<()> {
        self.call(&Request::CtxSynchronize).map(drop)
    }

    /// cuStreamCreateWithPriority.
    pub fn stream_create(&mut self, flags: u32, priority: i32) -> Result<u64> {
        Ok(self.call(&Request::StreamCreate { flags, priority })?.vals[0])
    }

    /// cuStreamDestroy.
    pub fn stream_destroy(&mut self, stream: u64) -> Result<()> {
        self.call(&Request::StreamDestroy { stream }).map(drop)
    }

    /// cuStreamSynchronize.
    pub fn stream_synchronize(&mut self, stream: u64) -> Result<()> {
        self.call(&Request::StreamSynchronize { stream }).map(drop)
    }

    /// cuStreamQuery: Ok(true) when idle.
    pub fn stream_query(&mut self, stream: u64) -> Result<bool> {
        self.query(&Request::StreamQuery { stream })
    }

    /// cuEventCreate.
    pub fn event_create(&mut self, flags: u32) -> Result<u64> {
        Ok(self.call(&Request::EventCreate { flags })?.vals[0])
    }

    /// cuEventDestroy.
    pub fn event_destroy(&mut self, event: u64) -> Result<()> {
        self.call(&Request::EventDestroy { event }).map(drop)
    }

    /// cuEventRecord (asynchronous).
    pub fn event_record(&mut self, event: u64, stream: u64) -> Result<()> {
        self.send(&Request::EventRecord { event, stream }, &[])
            .map(drop)
    }

    /// cuEventSynchronize.
    pub fn event_synchronize(&mut self, event: u64) -> Result<()> {
        self.call(&Request::EventSynchronize { event }).map(drop)
    }

    /// cuEventQuery: Ok(true) when complete.
    pub fn event_query(&mut self, event: u64) -> Result<bool> {
        self.query(&Request::EventQuery { event })
    }

    /// cuEventElapsedTime, in milliseconds.
    pub fn event_elapsed_ms(&mut self, start: u64, end: u64) -> Result<f32> {
        let r = self.call(&Request::EventElapsedTime { start, end })?;
        Ok(f32::from_bits(r.vals[0] as u32))
    }
}
