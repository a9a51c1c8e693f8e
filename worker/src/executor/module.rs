//! The `Modules` family of [`super::Context`]: modules and their kernels: loading, linking, kernel
//! lookups, attributes, occupancy, globals and tensor maps.

use protocol::{Dim3, ImageKind, Param, Status};

use super::{Handle, Launch};

/// Modules and their kernels: loading, linking, kernel lookups, attributes, occupancy, globals and
/// tensor maps.
pub trait Modules {
    /// Loads a module; returns its handle and its kernels with parameter sizes.
    fn load_module(&mut self, kind: ImageKind, image: &[u8]) -> Result<Handle, Status>;
    /// Unloads a module.
    fn unload_module(&mut self, module: Handle) -> Result<(), Status>;
    /// Looks a kernel up; returns its handle and its parameters' layout.
    fn function(&mut self, module: Handle, name: &str) -> Result<(Handle, Vec<Param>), Status>;
    /// The names of a module's kernels (those the guest's image has), in
    /// an order that stays the same while the module is loaded.
    fn function_names(&mut self, module: Handle) -> Result<Vec<String>, Status>;
    /// A kernel attribute (`CUfunction_attribute`, already range-checked).
    fn func_attribute(&mut self, func: Handle, attr: u32) -> Result<i32, Status>;
    /// Sets a kernel attribute (already range-checked).
    fn func_set_attribute(&mut self, func: Handle, attr: u32, value: i32) -> Result<(), Status>;
    /// Resident blocks per multiprocessor (cuOccupancyMaxActiveBlocksPerMultiprocessor).
    fn occupancy(&mut self, func: Handle, block_size: u32, shared_mem: u32) -> Result<i32, Status>;
    /// The most dynamic shared memory per block with `num_blocks` blocks of
    /// `block_size` threads resident per multiprocessor.
    fn available_smem(
        &mut self,
        func: Handle,
        num_blocks: u32,
        block_size: u32,
    ) -> Result<u64, Status>;
    /// A tensor-map descriptor for `p` (checked by its decoding; its
    /// memory checked to be the caller's).
    fn tensor_map(
        &mut self,
        p: &protocol::tensor_map::TensorMapParams,
    ) -> Result<[u8; protocol::tensor_map::TENSOR_MAP_BYTES], Status>;
    /// Thread block clusters of a launch shape: the most resident at once
    /// (cuOccupancyMaxActiveClusters; `cluster` zero means the kernel's
    /// own), or with `potential` the largest usable cluster size
    /// (cuOccupancyMaxPotentialClusterSize).
    fn occupancy_clusters(
        &mut self,
        shape: Launch,
        cluster: Dim3,
        potential: bool,
    ) -> Result<i32, Status>;
    /// Address and size of a module's global variable.
    fn module_global(&mut self, module: Handle, name: &str) -> Result<(u64, u64), Status>;
    /// Links (type, image) inputs into one loadable image.
    fn link(&mut self, inputs: &[(u32, &[u8])]) -> Result<Vec<u8>, Status>;
}
