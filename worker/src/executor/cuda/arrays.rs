//! CUDA arrays, copies to and from them, and the texture and surface
//! objects over them (or over the guest's linear memory), on the driver.
//! The worker checked every handle, extent and device range against the
//! session first (`session/arrays.rs`); the objects' values are the
//! driver's own, which kernels take as parameters.

use std::collections::HashSet;
use std::ptr::null_mut;

use cudarc::driver::sys;
use protocol::array::{resource, ArrayCopy, ArrayDesc, CopySide, TexParams};
use protocol::Status;

use super::check;
use super::context::CudaContext;
use crate::executor::{ArrayOp, Arrays, Handle, HandleMap};

/// A context's arrays (by our handle) and objects (by the driver's value).
#[derive(Default)]
pub(super) struct CudaArrays {
    arrays: HandleMap<(sys::CUarray, ArrayDesc)>,
    textures: HashSet<u64>,
    surfaces: HashSet<u64>,
    next: Handle,
}

impl CudaArrays {
    /// What keeps the context on its GPU: a texture or surface object
    /// (its value is the driver's), else an array.
    pub(super) fn keeper(&self) -> Option<crate::executor::Keeper> {
        if !self.textures.is_empty() || !self.surfaces.is_empty() {
            Some(crate::executor::Keeper::TextureObject)
        } else if !self.arrays.is_empty() {
            Some(crate::executor::Keeper::Array)
        } else {
            None
        }
    }

    /// Destroys every object, then every array (the context is current).
    pub(super) fn clear(&mut self) -> Result<(), Status> {
        for t in std::mem::take(&mut self.textures) {
            // SAFETY: a texture object of this context, destroyed once.
            check(unsafe { sys::cuTexObjectDestroy(t) })?;
        }
        for v in std::mem::take(&mut self.surfaces) {
            // SAFETY: a surface object of this context, destroyed once.
            check(unsafe { sys::cuSurfObjectDestroy(v) })?;
        }
        for (_, (a, _)) in std::mem::take(&mut self.arrays) {
            // SAFETY: an array of this context, destroyed once.
            check(unsafe { sys::cuArrayDestroy(a) })?;
        }
        Ok(())
    }

    fn array(&self, h: Handle) -> Result<sys::CUarray, Status> {
        self.arrays
            .get(&h)
            .map(|a| a.0)
            .ok_or(Status::InvalidHandle)
    }
}

/// `CUDA_RESOURCE_DESC` with its enum and union as plain words.
#[repr(C)]
struct RawResourceDesc {
    res_type: u32,
    pad: u32,
    words: [u64; 16],
    flags: u32,
    pad2: u32,
}

/// `CUDA_TEXTURE_DESC` with its enums as plain words.
#[repr(C)]
struct RawTextureDesc {
    address_mode: [u32; 3],
    filter: u32,
    flags: u32,
    max_anisotropy: u32,
    mipmap_filter: u32,
    floats: [u32; 7],
    reserved: [u32; 12],
}

/// `CUDA_RESOURCE_VIEW_DESC` with its enum as a plain word.
#[repr(C)]
struct RawViewDesc {
    format: u32,
    pad: u32,
    extent: [u64; 3],
    levels: [u32; 4],
    reserved: [u32; 16],
}

const _: () = {
    assert!(size_of::<RawResourceDesc>() == size_of::<sys::CUDA_RESOURCE_DESC>());
    assert!(size_of::<RawTextureDesc>() == size_of::<sys::CUDA_TEXTURE_DESC>());
    assert!(size_of::<RawViewDesc>() == size_of::<sys::CUDA_RESOURCE_VIEW_DESC>());
};

fn format(f: u32) -> Result<sys::CUarray_format, Status> {
    use sys::CUarray_format as F;
    Ok(match f {
        0x01 => F::CU_AD_FORMAT_UNSIGNED_INT8,
        0x02 => F::CU_AD_FORMAT_UNSIGNED_INT16,
        0x03 => F::CU_AD_FORMAT_UNSIGNED_INT32,
        0x08 => F::CU_AD_FORMAT_SIGNED_INT8,
        0x09 => F::CU_AD_FORMAT_SIGNED_INT16,
        0x0a => F::CU_AD_FORMAT_SIGNED_INT32,
        0x10 => F::CU_AD_FORMAT_HALF,
        0x20 => F::CU_AD_FORMAT_FLOAT,
        _ => return Err(Status::InvalidValue),
    })
}

fn resource(a: &CudaArrays, p: &TexParams) -> Result<RawResourceDesc, Status> {
    let mut words = [0u64; 16];
    match p.kind {
        resource::ARRAY => words[0] = a.array(p.base)? as u64,
        resource::LINEAR | resource::PITCH2D => {
            words[0] = p.base;
            words[1] = u64::from(p.format) | u64::from(p.channels) << 32;
            words[2] = p.width;
            words[3] = p.height;
            words[4] = p.pitch;
        }
        _ => return Err(Status::InvalidValue),
    }
    Ok(RawResourceDesc {
        res_type: p.kind,
        pad: 0,
        words,
        flags: 0,
        pad2: 0,
    })
}

fn side(a: &CudaArrays, s: &CopySide) -> Result<Side, Status> {
    Ok(match *s {
        CopySide::Array { array, x, y, z } => Side {
            kind: sys::CUmemorytype::CU_MEMORYTYPE_ARRAY,
            at: (x as usize, y as usize, z as usize),
            device: 0,
            array: a.array(array)?,
            pitch: 0,
            height: 0,
        },
        CopySide::Device { ptr, pitch, height } => Side {
            kind: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            at: (0, 0, 0),
            device: ptr,
            array: null_mut(),
            pitch: crate::usize_from(pitch),
            height: crate::usize_from(height),
        },
    })
}

struct Side {
    kind: sys::CUmemorytype,
    at: (usize, usize, usize),
    device: u64,
    array: sys::CUarray,
    pitch: usize,
    height: usize,
}

fn copy_params(a: &CudaArrays, c: &ArrayCopy) -> Result<sys::CUDA_MEMCPY3D, Status> {
    let (s, d) = (side(a, &c.src)?, side(a, &c.dst)?);
    Ok(sys::CUDA_MEMCPY3D {
        srcXInBytes: s.at.0,
        srcY: s.at.1,
        srcZ: s.at.2,
        srcLOD: 0,
        srcMemoryType: s.kind,
        srcHost: std::ptr::null(),
        srcDevice: s.device,
        srcArray: s.array,
        reserved0: null_mut(),
        srcPitch: s.pitch,
        srcHeight: s.height,
        dstXInBytes: d.at.0,
        dstY: d.at.1,
        dstZ: d.at.2,
        dstLOD: 0,
        dstMemoryType: d.kind,
        dstHost: null_mut(),
        dstDevice: d.device,
        dstArray: d.array,
        reserved1: null_mut(),
        dstPitch: d.pitch,
        dstHeight: d.height,
        WidthInBytes: c.width as usize,
        Height: c.height as usize,
        Depth: c.depth as usize,
    })
}

impl Arrays for CudaContext {
    fn array_op(&mut self, op: ArrayOp) -> Result<u64, Status> {
        self.bind()?;
        match op {
            ArrayOp::Create(d) => {
                let desc = sys::CUDA_ARRAY3D_DESCRIPTOR {
                    Width: d.width as usize,
                    Height: d.height as usize,
                    Depth: d.depth as usize,
                    Format: format(d.format)?,
                    NumChannels: d.channels,
                    Flags: d.flags,
                };
                let mut raw: sys::CUarray = null_mut();
                // SAFETY: out-parameter on our stack; a descriptor checked
                // against the device's limits.
                check(unsafe { sys::cuArray3DCreate_v2(&mut raw, &desc) })?;
                let a = &mut self.arrays;
                a.next += 1;
                a.arrays.insert(a.next, (raw, d));
                Ok(a.next)
            }
            ArrayOp::Destroy(h) => {
                let (raw, _) = self.arrays.arrays.remove(&h).ok_or(Status::InvalidHandle)?;
                // SAFETY: an array of this context, destroyed once.
                check(unsafe { sys::cuArrayDestroy(raw) }).map(|()| 0)
            }
            ArrayOp::Copy(c, stream) => {
                let st = self.stream(stream)?;
                let p = copy_params(&self.arrays, &c)?;
                // SAFETY: the arrays are this context's, the device ranges
                // the caller's own (checked by the worker); `p` lives
                // through the call, which reads it before returning.
                check(unsafe { sys::cuMemcpy3DAsync_v2(&p, st) }).map(|()| 0)
            }
            ArrayOp::TexCreate(p) => {
                let res = resource(&self.arrays, &p)?;
                let tex = RawTextureDesc {
                    address_mode: p.address_mode,
                    filter: p.filter,
                    flags: p.flags,
                    max_anisotropy: p.max_anisotropy,
                    mipmap_filter: p.mipmap_filter,
                    floats: p.floats,
                    reserved: [0; 12],
                };
                let view = RawViewDesc {
                    format: p.view_format,
                    pad: 0,
                    extent: p.view_extent,
                    levels: p.view_levels,
                    reserved: [0; 16],
                };
                let view_ptr = if p.has_view {
                    &view as *const RawViewDesc as *const sys::CUDA_RESOURCE_VIEW_DESC
                } else {
                    std::ptr::null()
                };
                let mut obj: sys::CUtexObject = 0;
                // SAFETY: out-parameter on our stack; the descriptors are
                // repr(C) copies of the driver's layouts (sizes asserted
                // above) whose enum fields hold values the decoding
                // checked; an array of this context or memory of the
                // caller's own.
                check(unsafe {
                    sys::cuTexObjectCreate(
                        &mut obj,
                        &res as *const RawResourceDesc as *const sys::CUDA_RESOURCE_DESC,
                        &tex as *const RawTextureDesc as *const sys::CUDA_TEXTURE_DESC,
                        view_ptr,
                    )
                })?;
                self.arrays.textures.insert(obj);
                Ok(obj)
            }
            ArrayOp::TexDestroy(v) => {
                if !self.arrays.textures.remove(&v) {
                    return Err(Status::InvalidHandle);
                }
                // SAFETY: a texture object of this context, destroyed once.
                check(unsafe { sys::cuTexObjectDestroy(v) }).map(|()| 0)
            }
            ArrayOp::SurfCreate(h) => {
                let mut words = [0u64; 16];
                words[0] = self.arrays.array(h)? as u64;
                let res = RawResourceDesc {
                    res_type: resource::ARRAY,
                    pad: 0,
                    words,
                    flags: 0,
                    pad2: 0,
                };
                let mut obj: sys::CUsurfObject = 0;
                // SAFETY: out-parameter on our stack; a resource
                // description of an array of this context.
                check(unsafe {
                    sys::cuSurfObjectCreate(
                        &mut obj,
                        &res as *const RawResourceDesc as *const sys::CUDA_RESOURCE_DESC,
                    )
                })?;
                self.arrays.surfaces.insert(obj);
                Ok(obj)
            }
            ArrayOp::SurfDestroy(v) => {
                if !self.arrays.surfaces.remove(&v) {
                    return Err(Status::InvalidHandle);
                }
                // SAFETY: a surface object of this context, destroyed once.
                check(unsafe { sys::cuSurfObjectDestroy(v) }).map(|()| 0)
            }
        }
    }
}
