//! Finding and attaching the vGPU: natively through the ivshmem-server
//! socket or through the kernel module's device in a VM, the session's
//! `Hello`, and further channels joined to it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::{DeviceInfo, Request};
use transport::server::Client;
use transport::{Bell, GuestChannel, SpinPolicy};

use crate::{
    copy, current_cpu, device, Gpu, GuestError, Joiner, Joining, Opening, Origin, Result, Transport,
};

impl Joiner {
    /// A further channel to the session.
    pub fn join(&self) -> Result<Gpu> {
        let join = Opening::Join(Joining {
            seq: self.seq.clone(),
            token: self.token,
            info: self.info.clone(),
            first: self.first,
        });
        match &self.origin {
            Origin::Socket(p) => Gpu::attach_socket(p, self.policy, join),
            Origin::Device(p) => Gpu::attach_device(p, self.policy, join),
        }
    }
}

impl Gpu {
    /// Attaches natively through the ivshmem-server socket at `path`.
    pub fn connect(path: &Path) -> Result<Gpu> {
        Self::connect_with(path, SpinPolicy::default())
    }

    /// Like [`Gpu::connect`] with a chosen spin policy.
    pub fn connect_with(path: &Path, policy: SpinPolicy) -> Result<Gpu> {
        Self::attach_socket(path, policy, Opening::Hello)
    }

    fn attach_socket(path: &Path, policy: SpinPolicy, join: Opening) -> Result<Gpu> {
        let client = Client::connect(path, Duration::from_secs(10))?;
        let layout = *client.region.layout();
        let ch = claim(&client.region, &join, u32::from(client.id), 0)?;
        let vector = ch.index() % layout.params.vectors;
        let own_bell: Arc<dyn Bell> = client.own_bells[vector as usize].clone();
        let host_bell: Arc<dyn Bell> =
            client.host_bells[layout.host_vector(ch.index()) as usize].clone();
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
        Self::attach_device(path, policy, Opening::Hello)
    }

    fn attach_device(path: &Path, policy: SpinPolicy, join: Opening) -> Result<Gpu> {
        let dev = Arc::new(device::Device::open(path)?);
        let info = dev.info()?;
        let region = dev.region(&info)?;
        let layout = *region.layout();
        let vector = if info.vectors == 0 {
            0
        } else {
            current_cpu() % info.vectors
        };
        let ch = claim(&region, &join, info.peer_id, vector)?;
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
            layout.host_vector(ch.index()),
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
            first: self.first,
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
        Self::attach_env(Opening::Hello)
    }

    /// A monitor's connection to the vGPU the environment names (as
    /// [`Gpu::from_env`] finds it): a channel of its own that opens no
    /// session (no context on the host, not one of the vGPU's processes),
    /// on which only [`Gpu::vgpu_status`] is asked.
    pub fn monitor_from_env() -> Result<Gpu> {
        Self::attach_env(Opening::Monitor)
    }

    /// A monitor's connection (as [`Gpu::monitor_from_env`]) to `path`: a
    /// vGPU device if it is a character device, else a host socket.
    pub fn monitor(path: &Path, policy: SpinPolicy) -> Result<Gpu> {
        if device::is_device(path) {
            Self::attach_device(path, policy, Opening::Monitor)
        } else {
            Self::attach_socket(path, policy, Opening::Monitor)
        }
    }

    fn attach_env(how: Opening) -> Result<Gpu> {
        let mut policy = SpinPolicy::default();
        if let Some(n) = std::env::var("FAIRVGPU_SPINS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            policy.spins = n;
        }
        if let Some(sock) = std::env::var_os("FAIRVGPU_SOCKET") {
            return Self::attach_socket(sock.as_ref(), policy, how);
        }
        if let Some(dev) = std::env::var_os("FAIRVGPU_DEVICE") {
            return Self::attach_device(dev.as_ref(), policy, how);
        }
        match device::default_device() {
            Some(dev) => Self::attach_device(&dev, policy, how),
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
        how: Opening,
    ) -> Result<Gpu> {
        ch.set_guest_vector(vector)?;
        let index = ch.index();
        let seq = match &how {
            Opening::Join(j) => j.seq.clone(),
            _ => Arc::default(),
        };
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
            take_output: true,
            first: index,
        };
        match how {
            Opening::Join(j) => {
                gpu.first = j.first;
                gpu.call(&Request::Join { token: j.token })?;
                gpu.token = j.token;
                gpu.info = j.info;
                return Ok(gpu);
            }
            Opening::Monitor => {
                gpu.info = gpu.vgpu_status()?.info;
                return Ok(gpu);
            }
            Opening::Hello => {}
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
}

/// How long a new process waits for a channel of its vGPU to be let go of
/// when every one is held (every process slot by a running process, where
/// the region is split into them): as natively, where a process does not
/// fail for the others that run, it waits, and attaches once one ends.
const CLAIM_WAIT: Duration = Duration::from_secs(600);

/// Claims the channel a new connection opens `how`: a process's first
/// (a whole process slot's, where the region is split into them), a
/// further one in its session's slot, or a monitor's. A process's first
/// waits up to [`CLAIM_WAIT`] while none is free.
fn claim(
    region: &transport::Region,
    how: &Opening,
    peer: u32,
    vector: u32,
) -> Result<GuestChannel> {
    let pid = std::process::id();
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let r = match how {
            Opening::Hello => region.claim_process(peer, pid, vector),
            Opening::Join(j) => region.claim_in_slot(j.first, peer, pid, vector),
            Opening::Monitor => region.claim_monitor(peer, pid, vector),
        };
        match r {
            Err(transport::Error::NoFreeChannel)
                if matches!(how, Opening::Hello) && started.elapsed() < CLAIM_WAIT =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            r => return Ok(r?),
        }
    }
}
