//! Moving a context to another device of the model: its memory stays
//! where it is in host RAM, under the same addresses; the copy costs time
//! on the target's queue.

use protocol::Status;

use super::context::SimContext;
use crate::executor::{Migration, Moved};

impl Migration for SimContext {
    fn migration_keeper(&self) -> Option<crate::executor::Keeper> {
        self.arrays_keeper()
    }

    fn migration_keeper_to(&self, target: u32) -> Option<crate::executor::Keeper> {
        self.arrays_keeper()
            .or_else(|| self.compression_keeper(target))
    }

    fn migrate(
        &mut self,
        device: u32,
        _prepared: Option<crate::executor::Prepared>,
    ) -> Result<Moved, Status> {
        self.alive()?;
        if device as usize >= self.queues.len() {
            return Err(Status::InvalidValue);
        }
        // Drain: what was submitted finishes on the source.
        Self::wait_until(self.last_done);
        if device == self.device {
            return Ok(Moved::default());
        }
        if self.arrays_keeper().is_some() || self.compression_keeper(device).is_some() {
            // As on a GPU: its arrays and objects stay where they are, and
            // compressible memory goes only where it stays compressible.
            return Err(Status::NotSupported);
        }
        // The model keeps device memory in host RAM under the same
        // addresses on every device: the copy costs time on the target's
        // queue (peer copy at the host-device bandwidth), nothing else.
        let bytes: u64 = self
            .mem
            .values()
            .chain(self.vmm_phys.values())
            .map(|b| b.lock().unwrap_or_else(|e| e.into_inner()).len() as u64)
            .sum();
        let allocations = (self.mem.len() + self.vmm_phys.len()) as u64;
        self.device = device;
        let done = self.submit(self.copy_ns(bytes), 0);
        Self::wait_until(done);
        Ok(Moved { bytes, allocations })
    }
}
