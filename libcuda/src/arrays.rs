//! CUDA arrays (cuArrayCreate, cuArray3DCreate, their descriptors),
//! copies with an array at either end (cuMemcpyHtoA and the rest, and
//! `cuMemcpy2D/3D` with `CU_MEMORYTYPE_ARRAY`), and texture and surface
//! objects (cuTexObjectCreate, cuSurfObjectCreate).
//!
//! The host holds the arrays and objects (`protocol::Request::Array*`,
//! `TexCreate`, `SurfCreate`, checked against the process's own tables
//! there); an array handle is the host's, an object value the host
//! driver's own, which kernels take as parameters. What the program
//! passed is kept here to answer the descriptor queries. Copies between
//! host memory and an array go through a device buffer made for the copy
//! (host bytes in, then the array copy on the same stream; or the array
//! copy, then the bytes out), given back when the stream passes it.
//! The 1D copies (`cuMemcpyHtoA` ...) read an array's bytes row after
//! row, slice after slice. Array copies are not captured into graphs;
//! mipmapped arrays are not served.

use std::ffi::{c_uint, c_void};
use std::sync::MutexGuard;

use cudarc::driver::sys::{CUdeviceptr, CUstream};
use protocol::array::{resource, ArrayCopy, ArrayDesc, CopySide, TexParams};
use protocol::Request;

use crate::copy_nd::Memcpy3d;
use crate::memory::is_device;
use crate::memtype;
use crate::state::process::{
    lock, ArrayTable as Table, Texture, ARRAYS, RES_DESC, TEX_DESC, VIEW_DESC,
};
use crate::state::thread::resolve;
use crate::state::{driver, gpu, out};
use crate::{code, CuResult};

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_uint,
    channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

fn table() -> MutexGuard<'static, Table> {
    lock(&ARRAYS)
}

/// One of the process's arrays.
fn array(h: u64) -> Result<ArrayDesc, CuResult> {
    table().arrays.get(&h).copied().ok_or(code::INVALID_HANDLE)
}

/// A texture object this process made (what it was made from).
fn texture(obj: u64) -> Result<Texture, CuResult> {
    table()
        .textures
        .get(&obj)
        .copied()
        .ok_or(code::INVALID_VALUE)
}

fn create(desc: ArrayDesc) -> Result<u64, CuResult> {
    crate::state::thread::need_ctx()?;
    if desc.check().is_err() {
        return Err(code::INVALID_VALUE);
    }
    let h = gpu(|g| g.request(&Request::ArrayCreate { desc }))?.vals[0];
    table().arrays.insert(h, desc);
    Ok(h)
}

/// A size the protocol's `u32` fields take.
fn small(v: usize) -> Result<u32, CuResult> {
    u32::try_from(v).map_err(|_| code::INVALID_VALUE)
}

/// Reads a C struct the caller passes (API contract: readable).
fn read<T: Copy>(p: *const T) -> Result<T, CuResult> {
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: a parameter struct of the caller's (API contract); every
    // field an integer or a pointer we never follow.
    Ok(unsafe { p.read_unaligned() })
}

/// Runs one array copy on the host in `stream`'s order.
fn send(copy: ArrayCopy, stream: u64) -> Result<(), CuResult> {
    crate::managed::work(stream, |g| g.request(&Request::ArrayCopy { copy, stream })).map(drop)
}

/// A box from or to host memory: through a device buffer of the box's
/// bytes, packed.
#[allow(clippy::too_many_arguments)]
fn staged(
    host: u64,
    host_pitch: u64,
    host_height: u64,
    to_array: bool,
    arr: CopySide,
    (width, height, depth): (u32, u32, u32),
    stream: u64,
    sync: bool,
) -> Result<(), CuResult> {
    let (w, h, dd) = (width as usize, height as usize, depth as usize);
    let n = w.checked_mul(h).and_then(|v| v.checked_mul(dd));
    let n = n.ok_or(code::INVALID_VALUE)?;
    let row = |y: usize, z: usize| host + (z as u64 * host_height + y as u64) * host_pitch;
    let tmp = gpu(|g| g.mem_alloc(n as u64))?;
    let dev = CopySide::Device {
        ptr: tmp,
        pitch: u64::from(width),
        height: u64::from(height),
    };
    let (src, dst) = if to_array { (dev, arr) } else { (arr, dev) };
    let copy = ArrayCopy {
        src,
        dst,
        width,
        height,
        depth,
    };
    let r = (|| {
        if to_array {
            let mut packed = Vec::with_capacity(n);
            for z in 0..dd {
                for y in 0..h {
                    // SAFETY: the caller's box: `width` readable bytes at
                    // each of its host rows (API contract).
                    let s = unsafe { std::slice::from_raw_parts(row(y, z) as *const u8, w) };
                    packed.extend_from_slice(s);
                }
            }
            gpu(|g| g.memcpy_htod_async(tmp, &packed, stream))?;
            send(copy, stream)?;
            if sync {
                gpu(|g| g.stream_synchronize(stream))?;
            }
        } else {
            send(copy, stream)?;
            let mut packed = vec![0u8; n];
            gpu(|g| g.memcpy_dtoh(&mut packed, tmp, stream))?;
            for z in 0..dd {
                for y in 0..h {
                    let from = (z * h + y) * w;
                    // SAFETY: the caller's box: `width` writable bytes at
                    // each of its host rows (API contract).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            packed[from..].as_ptr(),
                            row(y, z) as *mut u8,
                            w,
                        )
                    };
                }
            }
        }
        Ok(())
    })();
    // Freed once the work submitted so far is done.
    let _ = gpu(|g| g.mem_free(tmp));
    r
}

/// Array copies are not captured into graphs: refused on a capturing
/// stream.
fn not_captured(st: CUstream) -> Result<(), CuResult> {
    crate::graph::capture::add(st, || {
        Err(crate::not_supported("array copies in a captured graph"))
    })
    .map(drop)
}

/// A `CUDA_MEMCPY3D` with an array at one end or both.
pub(crate) fn copy_3d(p: &Memcpy3d, st: CUstream, sync: bool) -> Result<(), CuResult> {
    crate::state::thread::need_ctx()?;
    if p.src_lod != 0 || p.dst_lod != 0 {
        return Err(code::INVALID_VALUE);
    }
    not_captured(st)?;
    let stream = resolve(st)?;
    let extent = (small(p.width)?, small(p.height)?, small(p.depth)?);
    if extent.0 == 0 || extent.1 == 0 || extent.2 == 0 {
        return Ok(());
    }
    let arr = |h: *mut c_void, x: usize, y: usize, z: usize| -> Result<CopySide, CuResult> {
        array(h as u64)?;
        Ok(CopySide::Array {
            array: h as u64,
            x: small(x)?,
            y: small(y)?,
            z: small(z)?,
        })
    };
    // The other end: (device?, first byte, pitch, height).
    let lin = |ty: u32,
               host: u64,
               device: u64,
               (x, y, z): (usize, usize, usize),
               pitch: usize,
               height: usize|
     -> Result<(bool, u64, u64, u64), CuResult> {
        let (base, dev) = match ty {
            memtype::HOST => (host, false),
            memtype::DEVICE => (device, true),
            memtype::UNIFIED => (device, is_device(device)?),
            _ => return Err(code::INVALID_VALUE),
        };
        let off = (z as u64)
            .checked_mul(height as u64)
            .and_then(|r| r.checked_add(y as u64))
            .and_then(|r| r.checked_mul(pitch as u64))
            .and_then(|r| r.checked_add(x as u64))
            .and_then(|o| base.checked_add(o));
        match off {
            Some(a) if base != 0 => Ok((dev, a, pitch as u64, height as u64)),
            _ => Err(code::INVALID_VALUE),
        }
    };
    let (sa, da) = (p.src_type == memtype::ARRAY, p.dst_type == memtype::ARRAY);
    let (width, height, depth) = extent;
    let box_of = |src, dst| ArrayCopy {
        src,
        dst,
        width,
        height,
        depth,
    };
    if sa && da {
        let src = arr(p.src_array, p.src_x, p.src_y, p.src_z)?;
        let dst = arr(p.dst_array, p.dst_x, p.dst_y, p.dst_z)?;
        send(box_of(src, dst), stream)?;
    } else if sa {
        let src = arr(p.src_array, p.src_x, p.src_y, p.src_z)?;
        let at = (p.dst_x, p.dst_y, p.dst_z);
        let (dev, a, pitch, h) = lin(
            p.dst_type,
            p.dst_host as u64,
            p.dst_device,
            at,
            p.dst_pitch,
            p.dst_height,
        )?;
        if dev {
            send(
                box_of(
                    src,
                    CopySide::Device {
                        ptr: a,
                        pitch,
                        height: h,
                    },
                ),
                stream,
            )?;
        } else {
            return staged(a, pitch, h, false, src, extent, stream, sync);
        }
    } else {
        let dst = arr(p.dst_array, p.dst_x, p.dst_y, p.dst_z)?;
        let at = (p.src_x, p.src_y, p.src_z);
        let (dev, a, pitch, h) = lin(
            p.src_type,
            p.src_host as u64,
            p.src_device,
            at,
            p.src_pitch,
            p.src_height,
        )?;
        if dev {
            send(
                box_of(
                    CopySide::Device {
                        ptr: a,
                        pitch,
                        height: h,
                    },
                    dst,
                ),
                stream,
            )?;
        } else {
            return staged(a, pitch, h, true, dst, extent, stream, sync);
        }
    }
    if sync {
        gpu(|g| g.stream_synchronize(stream))?;
    }
    Ok(())
}

/// `n` bytes from byte `offset` of an array, in its row-after-row order:
/// (x, y, z, length) of each run within one row.
fn runs(d: &ArrayDesc, offset: usize, n: usize) -> Result<Vec<(u32, u32, u32, u32)>, CuResult> {
    let (offset, n) = (offset as u64, n as u64);
    let row = d.row_bytes();
    if offset.checked_add(n).is_none_or(|e| e > d.bytes()) {
        return Err(code::INVALID_VALUE);
    }
    let mut out = Vec::new();
    let mut at = offset;
    while at < offset + n {
        let (r, x) = (at / row, at % row);
        let len = (row - x).min(offset + n - at);
        out.push((
            x as u32,
            (r % d.rows()) as u32,
            (r / d.rows()) as u32,
            len as u32,
        ));
        at += len;
    }
    Ok(out)
}

/// A 1D copy between an array's bytes and linear memory: host (staged)
/// or device.
#[allow(clippy::too_many_arguments)]
fn copy_1d(
    h: u64,
    offset: usize,
    other: u64,
    device: bool,
    to_array: bool,
    n: usize,
    st: CUstream,
    sync: bool,
) -> Result<(), CuResult> {
    crate::state::thread::need_ctx()?;
    not_captured(st)?;
    let d = array(h)?;
    let stream = resolve(st)?;
    if n == 0 {
        return Ok(());
    }
    if other == 0 {
        return Err(code::INVALID_VALUE);
    }
    let mut done = 0u64;
    for (x, y, z, len) in runs(&d, offset, n)? {
        let arr = CopySide::Array { array: h, x, y, z };
        let lin = other + done;
        if device {
            let dev = CopySide::Device {
                ptr: lin,
                pitch: u64::from(len),
                height: 1,
            };
            let (src, dst) = if to_array { (dev, arr) } else { (arr, dev) };
            send(
                ArrayCopy {
                    src,
                    dst,
                    width: len,
                    height: 1,
                    depth: 1,
                },
                stream,
            )?;
        } else {
            staged(
                lin,
                u64::from(len),
                1,
                to_array,
                arr,
                (len, 1, 1),
                stream,
                false,
            )?;
        }
        done += u64::from(len);
    }
    if sync {
        gpu(|g| g.stream_synchronize(stream))?;
    }
    Ok(())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

/// A texture's parameters from the caller's descriptions.
fn tex_params(
    res: &[u8; RES_DESC],
    tex: &[u8; TEX_DESC],
    view: Option<&[u8; VIEW_DESC]>,
) -> Result<TexParams, CuResult> {
    let kind = u32_at(res, 0);
    let mut p = TexParams {
        kind,
        res_flags: u32_at(res, 136),
        base: u64_at(res, 8),
        ..TexParams::default()
    };
    match kind {
        resource::ARRAY => {
            array(p.base)?;
        }
        resource::LINEAR | resource::PITCH2D => {
            p.format = u32_at(res, 16);
            p.channels = u32_at(res, 20);
            p.width = u64_at(res, 24);
            p.height = u64_at(res, 32);
            p.pitch = u64_at(res, 40);
            if kind == resource::LINEAR {
                p.height = 0;
                p.pitch = 0;
            }
        }
        _ => return Err(crate::not_supported("textures over mipmapped arrays")),
    }
    for (i, m) in p.address_mode.iter_mut().enumerate() {
        *m = u32_at(tex, 4 * i);
    }
    p.filter = u32_at(tex, 12);
    p.flags = u32_at(tex, 16);
    p.max_anisotropy = u32_at(tex, 20);
    p.mipmap_filter = u32_at(tex, 24);
    for (i, f) in p.floats.iter_mut().enumerate() {
        *f = u32_at(tex, 28 + 4 * i);
    }
    if let Some(v) = view {
        p.has_view = true;
        p.view_format = u32_at(v, 0);
        for (i, e) in p.view_extent.iter_mut().enumerate() {
            *e = u64_at(v, 8 + 8 * i);
        }
        for (i, l) in p.view_levels.iter_mut().enumerate() {
            *l = u32_at(v, 32 + 4 * i);
        }
    }
    Ok(p)
}

/// Writes a kept description to the caller's out-parameter.
fn out_bytes<const N: usize>(p: *mut c_void, b: &[u8; N]) -> Result<(), CuResult> {
    out(p as *mut [u8; N], *b)
}

export! {
    fn cuArrayCreate_v2(handle: *mut u64, p: *const ArrayDescriptor) {
        driver()?;
        let d = read(p)?;
        if handle.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let h = create(ArrayDesc {
            width: small(d.width)?,
            height: small(d.height)?,
            depth: 0,
            format: d.format,
            channels: d.channels,
            flags: 0,
        })?;
        out(handle, h)
    }

    fn cuArray3DCreate_v2(handle: *mut u64, p: *const Array3dDescriptor) {
        driver()?;
        let d = read(p)?;
        if handle.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let h = create(ArrayDesc {
            width: small(d.width)?,
            height: small(d.height)?,
            depth: small(d.depth)?,
            format: d.format,
            channels: d.channels,
            flags: d.flags,
        })?;
        out(handle, h)
    }

    fn cuArrayDestroy(h: u64) {
        driver()?;
        array(h)?;
        gpu(|g| g.request(&Request::ArrayDestroy { array: h }))?;
        table().arrays.remove(&h);
        Ok(())
    }

    fn cuArrayGetDescriptor_v2(p: *mut ArrayDescriptor, h: u64) {
        driver()?;
        let d = array(h)?;
        out(p, ArrayDescriptor {
            width: d.width as usize,
            height: d.height as usize,
            format: d.format,
            channels: d.channels,
        })
    }

    fn cuArray3DGetDescriptor_v2(p: *mut Array3dDescriptor, h: u64) {
        driver()?;
        let d = array(h)?;
        out(p, Array3dDescriptor {
            width: d.width as usize,
            height: d.height as usize,
            depth: d.depth as usize,
            format: d.format,
            channels: d.channels,
            flags: d.flags,
        })
    }

    fn cuMemcpyHtoA_v2 [cuMemcpyHtoA_v2_ptds per_thread] (dst: u64, offset: usize, src: *const c_void, n: usize) {
        copy_1d(dst, offset, src as u64, false, true, n, std::ptr::null_mut(), true)
    }

    fn cuMemcpyHtoAAsync_v2 [cuMemcpyHtoAAsync_v2_ptsz per_thread] (dst: u64, offset: usize, src: *const c_void, n: usize, st: CUstream) {
        copy_1d(dst, offset, src as u64, false, true, n, st, false)
    }

    fn cuMemcpyAtoH_v2 [cuMemcpyAtoH_v2_ptds per_thread] (dst: *mut c_void, src: u64, offset: usize, n: usize) {
        copy_1d(src, offset, dst as u64, false, false, n, std::ptr::null_mut(), true)
    }

    fn cuMemcpyAtoHAsync_v2 [cuMemcpyAtoHAsync_v2_ptsz per_thread] (dst: *mut c_void, src: u64, offset: usize, n: usize, st: CUstream) {
        copy_1d(src, offset, dst as u64, false, false, n, st, false)
    }

    fn cuMemcpyDtoA_v2 [cuMemcpyDtoA_v2_ptds per_thread] (dst: u64, offset: usize, src: CUdeviceptr, n: usize) {
        copy_1d(dst, offset, src, true, true, n, std::ptr::null_mut(), true)
    }

    fn cuMemcpyAtoD_v2 [cuMemcpyAtoD_v2_ptds per_thread] (dst: CUdeviceptr, src: u64, offset: usize, n: usize) {
        copy_1d(src, offset, dst, true, false, n, std::ptr::null_mut(), true)
    }

    fn cuMemcpyAtoA_v2 [cuMemcpyAtoA_v2_ptds per_thread] (dst: u64, dst_offset: usize, src: u64, src_offset: usize, n: usize) {
        crate::state::thread::need_ctx()?;
        let (d, s) = (array(dst)?, array(src)?);
        let stream = resolve(std::ptr::null_mut())?;
        // Runs within one row of both arrays.
        let (dr, sr) = (runs(&d, dst_offset, n)?, runs(&s, src_offset, n)?);
        let (mut i, mut j, mut di, mut si) = (0usize, 0usize, 0u32, 0u32);
        while i < dr.len() && j < sr.len() {
            let (dx, dy, dz, dl) = dr[i];
            let (sx, sy, sz, sl) = sr[j];
            let len = (dl - di).min(sl - si);
            send(ArrayCopy {
                src: CopySide::Array { array: src, x: sx + si, y: sy, z: sz },
                dst: CopySide::Array { array: dst, x: dx + di, y: dy, z: dz },
                width: len,
                height: 1,
                depth: 1,
            }, stream)?;
            di += len;
            si += len;
            if di == dl {
                i += 1;
                di = 0;
            }
            if si == sl {
                j += 1;
                si = 0;
            }
        }
        gpu(|g| g.stream_synchronize(stream)).map(drop)
    }

    fn cuTexObjectCreate(obj: *mut u64, res: *const [u8; RES_DESC], tex: *const [u8; TEX_DESC], view: *const [u8; VIEW_DESC]) {
        crate::state::thread::need_ctx()?;
        let (res, tex) = (read(res)?, read(tex)?);
        let view = if view.is_null() { None } else { Some(read(view)?) };
        if obj.is_null() {
            return Err(code::INVALID_VALUE);
        }
        let p = tex_params(&res, &tex, view.as_ref())?;
        let v = gpu(|g| g.tex_create(&p.encode()))?;
        table().textures.insert(v, Texture { res, tex, view });
        out(obj, v)
    }

    fn cuTexObjectDestroy(obj: u64) {
        driver()?;
        gpu(|g| g.request(&Request::TexDestroy { obj }))?;
        table().textures.remove(&obj);
        Ok(())
    }

    fn cuTexObjectGetResourceDesc(p: *mut c_void, obj: u64) {
        driver()?;
        let t = texture(obj)?;
        out_bytes(p, &t.res)
    }

    fn cuTexObjectGetTextureDesc(p: *mut c_void, obj: u64) {
        driver()?;
        let t = texture(obj)?;
        out_bytes(p, &t.tex)
    }

    /// The view given at creation (all zero when none was).
    fn cuTexObjectGetResourceViewDesc(p: *mut c_void, obj: u64) {
        driver()?;
        let t = texture(obj)?;
        out_bytes(p, &t.view.unwrap_or([0; VIEW_DESC]))
    }

    fn cuSurfObjectCreate(obj: *mut u64, res: *const [u8; RES_DESC]) {
        crate::state::thread::need_ctx()?;
        let res = read(res)?;
        if obj.is_null() || u32_at(&res, 0) != resource::ARRAY || u32_at(&res, 136) != 0 {
            return Err(code::INVALID_VALUE);
        }
        let h = u64_at(&res, 8);
        array(h)?;
        let v = gpu(|g| g.request(&Request::SurfCreate { array: h }))?.vals[0];
        table().surfaces.insert(v, res);
        out(obj, v)
    }

    fn cuSurfObjectDestroy(obj: u64) {
        driver()?;
        gpu(|g| g.request(&Request::SurfDestroy { obj }))?;
        table().surfaces.remove(&obj);
        Ok(())
    }

    fn cuSurfObjectGetResourceDesc(p: *mut c_void, obj: u64) {
        driver()?;
        let r = table().surfaces.get(&obj).copied().ok_or(code::INVALID_VALUE)?;
        out_bytes(p, &r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_offsets_run_row_by_row() {
        let d = ArrayDesc {
            width: 4,
            height: 3,
            depth: 2,
            format: 0x01,
            channels: 1,
            flags: 0,
        };
        assert_eq!(
            runs(&d, 2, 8).unwrap(),
            vec![(2, 0, 0, 2), (0, 1, 0, 4), (0, 2, 0, 2)]
        );
        assert_eq!(runs(&d, 12, 4).unwrap(), vec![(0, 0, 1, 4)]);
        assert!(runs(&d, 20, 5).is_err());
    }
}
