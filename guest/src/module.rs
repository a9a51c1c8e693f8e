//! Module calls: loading and linking images, functions, their attributes,
//! occupancy, globals and tensor maps.

use protocol::{Dim3, ImageKind, Request, Status};

use crate::{Function, Gpu, GuestError, Result};

impl Gpu {
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

    /// The names of a module's kernels (what cuModuleEnumerateFunctions
    /// lists), asked for a message's worth at a time.
    pub fn module_functions(&mut self, module: u64) -> Result<Vec<String>> {
        let mut names = Vec::new();
        loop {
            let first = u32::try_from(names.len())
                .map_err(|_| GuestError::Protocol("too many kernels".into()))?;
            let (r, data) = self.call_data(&Request::ModuleFunctions { module, first }, &[])?;
            let count = r.vals[0] as usize;
            let before = names.len();
            for n in data.split(|&b| b == 0).filter(|n| !n.is_empty()) {
                names.push(String::from_utf8_lossy(n).into_owned());
            }
            if names.len() >= count {
                names.truncate(count);
                return Ok(names);
            }
            if names.len() == before {
                return Err(GuestError::Protocol(format!(
                    "{count} kernels, names stopped at {before}"
                )));
            }
        }
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

    /// A texture object made by the host's driver from
    /// `protocol::array::TexParams::encode`'s bytes: its value.
    pub fn tex_create(&mut self, params: &[u8]) -> Result<u64> {
        let (r, _) = self.call_data(&Request::TexCreate, params)?;
        Ok(r.vals[0])
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

    /// cuFuncSetAttribute.
    pub fn func_set_attribute(&mut self, func: u64, attr: u32, value: i32) -> Result<()> {
        self.call(&Request::FuncSetAttribute { func, attr, value })
            .map(drop)
    }
}
