//! A guest process on the host itself following its vGPU to another
//! daemon, standing for another host: what QEMU does for a VM when it
//! moves (the region copied into the other host's, the doorbells
//! connected there), for processes that attach through a socket
//! (`FAIRVGPU_SOCKET`). A VM's processes never do this: QEMU moves them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use transport::server::{Arrival, Client};

use crate::{Gpu, GuestError, Joiner, Origin, Result, Transport};

/// How long the other daemon's socket may take to greet us.
const GREETING: Duration = Duration::from_secs(10);

impl Gpu {
    /// Copies this vGPU's whole region into the one the daemon at `path`
    /// serves for the same VM (QEMU's part of a move). The returned
    /// connection is kept until every channel has followed: its leaving
    /// marks the channels its peer id owns there abandoned.
    pub fn copy_region_to(&self, path: &Path) -> Result<Client> {
        let there = Client::connect(path, GREETING)?;
        self.ch.region().copy_to(&there.region)?;
        Ok(there)
    }

    /// Connects this channel's peer to the daemon at `path` and checks it
    /// can follow there, changing nothing here (see [`Client::reach`]): a
    /// process reaches with every channel before any follows.
    pub fn reach(&self, path: &Path) -> Result<Arrival> {
        let Transport::Native(client) = &self.transport else {
            return Err(moves_with_its_vm());
        };
        Ok(client.reach(path, GREETING)?)
    }

    /// Makes this channel the vGPU's at the daemon at `path` it reached
    /// (`there`), whose region now holds what this one did: its memory
    /// mapped where this region's was, its doorbells, the channel's owner
    /// its new peer id there.
    ///
    /// # Safety
    /// No thread of the process reads or writes the region (the pinned
    /// pool included) or waits on its doorbells meanwhile: the caller holds
    /// every call.
    pub unsafe fn follow(&mut self, there: Arrival, path: &Path) -> Result<()> {
        let Transport::Native(client) = &mut self.transport else {
            return Err(moves_with_its_vm());
        };
        let ch = &self.ch;
        // SAFETY: per this function's contract.
        unsafe { client.follow_to(there, |id| ch.set_owner_peer(u32::from(id))) }?;
        self.origin = Origin::Socket(path.to_owned());
        Ok(())
    }
}

/// A VM's process follows its vGPU only as QEMU moves the VM.
fn moves_with_its_vm() -> GuestError {
    GuestError::Protocol("a VM's process moves with its VM, not by itself".into())
}

impl Joiner {
    /// Opens further channels at the daemon at `path` from now on (after
    /// the process followed its vGPU there).
    pub fn follow(&mut self, path: PathBuf) {
        self.origin = Origin::Socket(path);
    }
}
