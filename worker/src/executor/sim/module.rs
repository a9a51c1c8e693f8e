//! Modules and their functions on the model: loading and linking PTX
//! (the model runs PTX only), function attributes, occupancy as a Hopper
//! multiprocessor would give it, globals and tensor maps.

use std::collections::HashMap;

use protocol::{Dim3, ImageKind, Param, Status};

use super::context::{SimContext, SimModule};
use super::kernels::{k_unmodeled, kernel_by_name};
use crate::executor::{Handle, Launch, Memory, Modules};
use crate::ptx;

/// The PTX text of a module image (the model runs PTX only, also the PTX a
/// fat binary carries, which nvcc-built programs register), its kernels'
/// parameters and their names in the text's order.
pub(super) fn parse_module(
    kind: ImageKind,
    image: &[u8],
) -> Result<(String, ptx::Entries, Vec<String>), Status> {
    let ptx;
    let image = match kind {
        ImageKind::Ptx => image,
        ImageKind::Cubin if protocol::fatbin::is_fatbin(image) => {
            ptx = protocol::fatbin::best_ptx(image)
                .map_err(|_| Status::InvalidImage)?
                .ok_or(Status::NoBinaryForGpu)?;
            &ptx
        }
        ImageKind::Cubin => return Err(Status::NoBinaryForGpu),
    };
    let text = std::str::from_utf8(image).map_err(|_| Status::InvalidPtx)?;
    let text = text.trim_end_matches('\0');
    let entries = ptx::entries(text).ok_or(Status::InvalidPtx)?;
    let names = ptx::entry_names(text, &entries);
    Ok((text.to_owned(), entries, names))
}

impl SimContext {
    /// Function `h`: kernel `name` of `module`, whose parameters are
    /// `sizes`; its parameters' layout.
    pub(super) fn insert_function(
        &mut self,
        h: Handle,
        module: Handle,
        name: &str,
        sizes: Vec<u32>,
    ) -> Vec<Param> {
        // A kernel the model does not implement can be looked up (programs
        // look up every kernel they might use); launching it fails.
        let k = kernel_by_name(name).unwrap_or(k_unmodeled);
        let params = crate::ptx::layout(&sizes);
        self.functions.insert(h, (k, sizes));
        self.function_of.insert(h, (module, name.to_owned()));
        params
    }
}

impl Modules for SimContext {
    fn load_module(&mut self, kind: ImageKind, image: &[u8]) -> Result<Handle, Status> {
        let _ = self.staged.take(kind, image);
        let (text, entries, names) = parse_module(kind, image)?;
        let mut globals = HashMap::new();
        for (name, size) in ptx::globals(&text) {
            let p = self.alloc(size)?;
            globals.insert(name, (p, size));
        }
        let h = self.handle();
        self.modules.insert(
            h,
            SimModule {
                text,
                entries,
                names,
                globals,
            },
        );
        Ok(h)
    }

    fn unload_module(&mut self, module: Handle) -> Result<(), Status> {
        self.modules
            .remove(&module)
            .map(drop)
            .ok_or(Status::InvalidHandle)
    }

    fn function(&mut self, module: Handle, name: &str) -> Result<(Handle, Vec<Param>), Status> {
        let sizes = self
            .modules
            .get(&module)
            .ok_or(Status::InvalidHandle)?
            .entries
            .get(name)
            .ok_or(Status::NotFound)?
            .clone();
        let h = self.handle();
        let params = self.insert_function(h, module, name, sizes);
        Ok((h, params))
    }

    fn function_names(&mut self, module: Handle) -> Result<Vec<String>, Status> {
        let m = self.modules.get(&module).ok_or(Status::InvalidHandle)?;
        Ok(m.names.clone())
    }

    fn func_attribute(&mut self, func: Handle, attr: u32) -> Result<i32, Status> {
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        if let Some(&v) = self.func_attrs.get(&(func, attr)) {
            return Ok(v);
        }
        // What the model's kernels look like to an occupancy calculator.
        Ok(match attr {
            0 => 1024,  // MAX_THREADS_PER_BLOCK
            4 => 16,    // NUM_REGS
            5 => 70,    // PTX_VERSION
            6 => 90,    // BINARY_VERSION
            8 => 49152, // MAX_DYNAMIC_SHARED_SIZE_BYTES
            9 => -1,    // PREFERRED_SHARED_MEMORY_CARVEOUT
            _ => 0,     // shared, const and local sizes, cache mode
        })
    }

    fn func_set_attribute(&mut self, func: Handle, attr: u32, value: i32) -> Result<(), Status> {
        // The model's kernels take any shared memory and cluster shape; the
        // settable attributes read back as set, as the driver's do (the
        // dynamic shared memory limit, the carveout, the cluster shape,
        // its non-portable permission and scheduling policy).
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        match attr {
            8 | 9 | 11..=15 if value >= -1 => {
                self.func_attrs.insert((func, attr), value);
                Ok(())
            }
            _ => Err(Status::InvalidValue),
        }
    }

    fn occupancy(&mut self, func: Handle, block_size: u32, shared_mem: u32) -> Result<i32, Status> {
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        // A Hopper-like multiprocessor: 2048 threads, 32 blocks, 228 KiB shared memory.
        let by_threads = 2048 / block_size.max(1);
        let by_smem = (228u32 << 10).checked_div(shared_mem).unwrap_or(u32::MAX);
        #[allow(clippy::cast_possible_wrap)] // at most 32
        let blocks = by_threads.min(by_smem).min(32) as i32;
        Ok(blocks)
    }

    fn available_smem(
        &mut self,
        func: Handle,
        num_blocks: u32,
        block_size: u32,
    ) -> Result<u64, Status> {
        if !self.functions.contains_key(&func) {
            return Err(Status::InvalidHandle);
        }
        // A Hopper multiprocessor: 2048 threads, 228 KiB of shared memory,
        // 1 KiB of it reserved per block, allocated in 128-byte units, at
        // most 227 KiB for one block.
        if num_blocks.saturating_mul(block_size) > 2048 {
            return Ok(0);
        }
        let per_block = (233_472 / u64::from(num_blocks)).saturating_sub(1024);
        Ok((per_block / 128 * 128).min(232_448))
    }

    /// The model cannot run kernels that read tensor maps; its descriptor
    /// holds the address and the shape, not Hopper's encoding.
    fn tensor_map(
        &mut self,
        p: &protocol::tensor_map::TensorMapParams,
    ) -> Result<[u8; protocol::tensor_map::TENSOR_MAP_BYTES], Status> {
        let mut map = [0u8; protocol::tensor_map::TENSOR_MAP_BYTES];
        map.copy_from_slice(&p.encode()[..protocol::tensor_map::TENSOR_MAP_BYTES]);
        map[40..48].copy_from_slice(&p.address.to_le_bytes());
        Ok(map)
    }

    fn occupancy_clusters(
        &mut self,
        shape: Launch,
        cluster: Dim3,
        potential: bool,
    ) -> Result<i32, Status> {
        // Hopper: portable clusters of up to 8 blocks; a cluster's blocks
        // share one GPC, 132 multiprocessors in GPCs of 16 or 18.
        // A block of more threads than a u32 holds (the guest's three
        // dimensions multiplied) is no block a GPU runs.
        let threads = u32::try_from(shape.block.count()).map_err(|_| Status::InvalidValue)?;
        if potential {
            let per_sm = self.occupancy(shape.func, threads, shape.shared_mem)?;
            return Ok(if per_sm == 0 { 0 } else { 8 });
        }
        if cluster.count() > 8 {
            return Err(Status::InvalidClusterSize);
        }
        let size = i32::try_from(cluster.count().max(1)).map_err(|_| Status::InvalidClusterSize)?;
        let per_sm = self.occupancy(shape.func, threads, shape.shared_mem)?;
        let per_gpc = per_sm * 16;
        Ok((per_gpc / size) * 8)
    }

    fn module_global(&mut self, module: Handle, name: &str) -> Result<(u64, u64), Status> {
        let m = self.modules.get(&module).ok_or(Status::InvalidHandle)?;
        m.globals.get(name).copied().ok_or(Status::NotFound)
    }

    fn link(&mut self, inputs: &[(u32, &[u8])]) -> Result<Vec<u8>, Status> {
        // The model runs PTX: linking PTX inputs is putting their entries in one text.
        let mut out = String::new();
        for (kind, bytes) in inputs {
            if *kind != protocol::link_input::PTX {
                return Err(Status::NotSupported);
            }
            let text = std::str::from_utf8(bytes).map_err(|_| Status::InvalidPtx)?;
            ptx::entries(text.trim_end_matches('\0')).ok_or(Status::InvalidPtx)?;
            out.push_str(text.trim_end_matches('\0'));
            out.push('\n');
        }
        let mut v = out.into_bytes();
        v.push(0);
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use crate::executor::sim::{SimExecutor, SimParams};
    use crate::executor::{Executor, Launch};
    use protocol::{Dim3, ImageKind, Status};

    #[test]
    fn a_block_past_u32_threads_is_refused_not_truncated() {
        let mut ctx = SimExecutor::new(SimParams::default()).open().unwrap();
        let m = ctx
            .load_module(ImageKind::Ptx, crate::KERNELS_PTX.as_bytes())
            .unwrap();
        let (func, _) = ctx.function(m, "vector_add").unwrap();
        let one = Dim3 { x: 1, y: 1, z: 1 };
        let shape = |block| Launch {
            func,
            grid: one,
            block,
            shared_mem: 0,
        };
        let fine = Dim3 { x: 256, y: 1, z: 1 };
        assert_eq!(ctx.occupancy_clusters(shape(fine), one, true), Ok(8));
        assert_eq!(ctx.occupancy_clusters(shape(fine), one, false), Ok(1024));
        // 65536 x 65536 threads is 2^32: as a u32 it would read 0, a block
        // the model gives the most room to.
        let huge = Dim3 {
            x: 65536,
            y: 65536,
            z: 1,
        };
        for potential in [true, false] {
            assert_eq!(
                ctx.occupancy_clusters(shape(huge), one, potential),
                Err(Status::InvalidValue)
            );
        }
    }
}
