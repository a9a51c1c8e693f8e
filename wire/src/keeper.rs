//! What keeps a guest process's context on its GPU: the one kind of object
//! a migration cannot make again on another GPU, named in the worker's
//! log, the daemon's events and the control API's refusal.

/// An object that cannot move to another GPU, so neither can its vGPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keeper {
    /// Device memory from plain `cuMemAlloc` (a host with one GPU, where
    /// allocations are not virtual-memory ranges).
    PlainMemory,
    /// A CUDA array (not made again on another GPU yet).
    Array,
    /// A texture or surface object: its value is the driver's own, held by
    /// the guest (in kernel parameters and device memory), and another GPU
    /// would give another.
    TextureObject,
    /// A graph with conditional nodes, or the scope of one: its handles
    /// are the driver's values, held by the guest's kernels.
    ConditionalGraph,
    /// Compressible VMM memory, and a target GPU without generic
    /// compression (made there, it would silently not be compressible).
    CompressibleMemory,
    /// Physical memory shared with another process of the VM through a
    /// shareable handle (exported or imported): both hold the same memory,
    /// which one of them cannot take to another GPU alone.
    SharedHandle,
    /// IPC memory or an event opened by a process another worker of the
    /// VM serves (process slots), or opened here from one: the other
    /// worker holds the driver's handle on this GPU.
    IpcAcrossWorkers,
    /// Memory of the VMM API: reservations, physical memory and their
    /// mappings (not put in a checkpoint yet).
    VirtualMemory,
    /// Something the executor does not know how to make again.
    Other,
}

impl Keeper {
    /// Its number on the daemon's feed (1..=127; 0: none).
    pub fn code(self) -> u8 {
        match self {
            Keeper::PlainMemory => 1,
            Keeper::TextureObject => 2,
            Keeper::Array => 3,
            Keeper::ConditionalGraph => 4,
            Keeper::CompressibleMemory => 5,
            Keeper::SharedHandle => 6,
            Keeper::IpcAcrossWorkers => 7,
            // 8 was an executable graph's, before checkpoints carried them.
            Keeper::VirtualMemory => 9,
            Keeper::Other => 127,
        }
    }

    /// The keeper of a feed number; `None` for 0.
    pub fn from_code(c: u8) -> Option<Keeper> {
        match c {
            0 => None,
            1 => Some(Keeper::PlainMemory),
            2 => Some(Keeper::TextureObject),
            3 => Some(Keeper::Array),
            4 => Some(Keeper::ConditionalGraph),
            5 => Some(Keeper::CompressibleMemory),
            6 => Some(Keeper::SharedHandle),
            7 => Some(Keeper::IpcAcrossWorkers),
            9 => Some(Keeper::VirtualMemory),
            _ => Some(Keeper::Other),
        }
    }

    /// What the operator reads: the object that kept the vGPU.
    pub fn describe(self) -> &'static str {
        match self {
            Keeper::PlainMemory => {
                "device memory from plain cuMemAlloc (the executor runs on one GPU)"
            }
            Keeper::TextureObject => {
                "a texture or surface object (its value is the driver's, held by the guest)"
            }
            Keeper::Array => "a CUDA array",
            Keeper::ConditionalGraph => {
                "a graph with conditional nodes (its handles are the driver's, held by the guest)"
            }
            Keeper::CompressibleMemory => {
                "compressible memory (cuMemCreate with CU_MEM_ALLOCATION_COMP_GENERIC) the target \
                 GPU cannot make"
            }
            Keeper::SharedHandle => {
                "VMM memory shared with another process through a shareable handle"
            }
            Keeper::IpcAcrossWorkers => {
                "IPC memory or an event open between processes of the VM served by different \
                 workers (close the handles to move)"
            }
            Keeper::VirtualMemory => {
                "memory of the VMM API (cuMemCreate, cuMemMap; not put in a checkpoint yet)"
            }
            Keeper::Other => "an object the executor cannot make again on another GPU",
        }
    }
}

impl std::fmt::Display for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_zero_is_none() {
        for k in [
            Keeper::PlainMemory,
            Keeper::TextureObject,
            Keeper::Array,
            Keeper::ConditionalGraph,
            Keeper::CompressibleMemory,
            Keeper::VirtualMemory,
            Keeper::SharedHandle,
            Keeper::IpcAcrossWorkers,
            Keeper::Other,
        ] {
            assert_eq!(Keeper::from_code(k.code()), Some(k));
            assert!(k.code() > 0 && k.code() < 128);
        }
        assert_eq!(Keeper::from_code(0), None);
        assert_eq!(Keeper::from_code(99), Some(Keeper::Other));
    }
}
