//! 2D and 3D copies (`cuMemcpy2D*`, `cuMemcpy3D*`): boxes of pitched rows
//! between host and device memory.
//!
//! A box whose rows are contiguous on both sides is one copy. Otherwise the
//! rows go one by one, except from the device to host memory, where each
//! slice's span of source rows comes back in one copy and is scattered
//! here. A copy with a CUDA array at either end goes to `arrays`.

use std::ffi::{c_uint, c_void};

use cudarc::driver::sys::{CUdeviceptr, CUstream};

use crate::memory::{dtod, dtoh, host_view, htod, is_device};
use crate::memtype;
use crate::state::gpu;
use crate::state::thread::resolve;
use crate::{code, CuResult};

/// Bytes of host rows packed into one copy at most (see [`Box3d::pack`]).
const PACK: usize = 4 << 20;

/// `CUDA_MEMCPY2D`.
#[repr(C)]
#[derive(Debug)]
pub struct Memcpy2d {
    src_x: usize,
    src_y: usize,
    src_type: c_uint,
    src_host: *const c_void,
    src_device: CUdeviceptr,
    src_array: *mut c_void,
    src_pitch: usize,
    dst_x: usize,
    dst_y: usize,
    dst_type: c_uint,
    dst_host: *mut c_void,
    dst_device: CUdeviceptr,
    dst_array: *mut c_void,
    dst_pitch: usize,
    width: usize,
    height: usize,
}

/// `CUDA_MEMCPY3D`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Memcpy3d {
    pub src_x: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub reserved0: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub reserved1: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// One side of a box copy: the address of its first byte, whether that is
/// device memory, and its row pitch and slice height.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Side {
    pub addr: u64,
    pub device: bool,
    pub pitch: u64,
    pub height: u64,
}

/// A box copy, its pointers resolved (what a memcpy node of a graph keeps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Box3d {
    pub src: Side,
    pub dst: Side,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

/// A side's first byte from its memory type, pointers and offsets.
fn side(
    ty: c_uint,
    host: u64,
    device: u64,
    (x, y, z): (usize, usize, usize),
    pitch: usize,
    height: usize,
) -> Result<Side, CuResult> {
    let (base, dev) = match ty {
        memtype::HOST => (host, false),
        memtype::DEVICE => (device, true),
        memtype::UNIFIED => (device, is_device(device)?),
        memtype::ARRAY => return Err(crate::not_supported("copies to or from CUDA arrays")),
        _ => return Err(code::INVALID_VALUE),
    };
    if base == 0 {
        return Err(code::INVALID_VALUE);
    }
    let (pitch, height) = (pitch as u64, height as u64);
    let off = (z as u64)
        .checked_mul(height)
        .and_then(|r| r.checked_add(y as u64))
        .and_then(|r| r.checked_mul(pitch))
        .and_then(|r| r.checked_add(x as u64))
        .ok_or(code::INVALID_VALUE)?;
    Ok(Side {
        addr: base.checked_add(off).ok_or(code::INVALID_VALUE)?,
        device: dev,
        pitch,
        height,
    })
}

impl Box3d {
    /// Checks and resolves a `CUDA_MEMCPY3D`.
    pub(crate) fn from_3d(p: &Memcpy3d) -> Result<Box3d, CuResult> {
        if p.src_lod != 0 || p.dst_lod != 0 {
            return Err(code::INVALID_VALUE);
        }
        let src = side(
            p.src_type,
            p.src_host as u64,
            p.src_device,
            (p.src_x, p.src_y, p.src_z),
            p.src_pitch,
            p.src_height,
        )?;
        let dst = side(
            p.dst_type,
            p.dst_host as u64,
            p.dst_device,
            (p.dst_x, p.dst_y, p.dst_z),
            p.dst_pitch,
            p.dst_height,
        )?;
        let b = Box3d {
            src,
            dst,
            width: p.width as u64,
            height: p.height as u64,
            depth: p.depth as u64,
        };
        b.check()?;
        Ok(b)
    }
}

/// A `CUDA_MEMCPY2D` as the 3D copy one slice deep it is.
fn to_3d(p: &Memcpy2d) -> Memcpy3d {
    Memcpy3d {
        src_x: p.src_x,
        src_y: p.src_y,
        src_z: 0,
        src_lod: 0,
        src_type: p.src_type,
        src_host: p.src_host,
        src_device: p.src_device,
        src_array: p.src_array,
        reserved0: std::ptr::null_mut(),
        src_pitch: p.src_pitch,
        src_height: p.height,
        dst_x: p.dst_x,
        dst_y: p.dst_y,
        dst_z: 0,
        dst_lod: 0,
        dst_type: p.dst_type,
        dst_host: p.dst_host,
        dst_device: p.dst_device,
        dst_array: p.dst_array,
        reserved1: std::ptr::null_mut(),
        dst_pitch: p.dst_pitch,
        dst_height: p.height,
        width: p.width,
        height: p.height,
        depth: 1,
    }
}

impl Box3d {
    /// A 1D copy as a box of one row.
    pub(crate) fn linear(dst: (u64, bool), src: (u64, bool), n: u64) -> Box3d {
        let one = |(addr, device)| Side {
            addr,
            device,
            pitch: n,
            height: 1,
        };
        Box3d {
            src: one(src),
            dst: one(dst),
            width: n,
            height: 1,
            depth: 1,
        }
    }

    /// Rows must fit their pitch, slices their height.
    fn check(&self) -> Result<(), CuResult> {
        for s in [self.src, self.dst] {
            if self.height > 1 && s.pitch < self.width || self.depth > 1 && s.height < self.height {
                return Err(code::INVALID_VALUE);
            }
        }
        Ok(())
    }

    /// Whether a side's rows (and slices) follow one another with no gap.
    fn contiguous(&self, s: Side) -> bool {
        (self.height == 1 || s.pitch == self.width) && (self.depth == 1 || s.height == self.height)
    }

    /// Address of row `y` of slice `z` on side `s`.
    fn row(s: Side, y: u64, z: u64) -> u64 {
        s.addr + (z * s.height + y) * s.pitch
    }

    /// Runs the copy in `st`'s order (`sync`: and waits for it).
    pub(crate) fn run(&self, st: CUstream, sync: bool) -> Result<(), CuResult> {
        if self.width == 0 || self.height == 0 || self.depth == 0 {
            return Ok(());
        }
        if self.contiguous(self.src) && self.contiguous(self.dst) {
            let n = self.width * self.height * self.depth;
            return copy1(
                self.dst,
                self.src,
                self.dst.addr,
                self.src.addr,
                n,
                st,
                sync,
            );
        }
        if self.src.device && !self.dst.device {
            return self.gather(st);
        }
        if !self.src.device && self.dst.device && self.contiguous(self.dst) {
            return self.pack(st, sync);
        }
        for z in 0..self.depth {
            for y in 0..self.height {
                let (d, s) = (Self::row(self.dst, y, z), Self::row(self.src, y, z));
                copy1(self.dst, self.src, d, s, self.width, st, false)?;
            }
        }
        if sync {
            let h = resolve(st)?;
            gpu(|g| g.stream_synchronize(h))?;
        }
        Ok(())
    }

    /// Host rows with gaps into device memory without: the rows packed
    /// into runs of at most [`PACK`] bytes, one copy each (a copy a row
    /// would be a request a row: cuBLAS-XT copies its 64-row tiles so).
    /// Each run's bytes are taken before its copy returns, as with any
    /// copy from pageable memory.
    fn pack(&self, st: CUstream, sync: bool) -> Result<(), CuResult> {
        let w = usize::try_from(self.width).map_err(|_| code::INVALID_VALUE)?;
        let per_run = (PACK / w).max(1) as u64;
        let rows = self.height * self.depth;
        let mut tmp = Vec::with_capacity(w.saturating_mul(per_run.min(rows) as usize));
        let mut done = 0;
        while done < rows {
            let n = (rows - done).min(per_run);
            tmp.clear();
            for r in done..done + n {
                let s = host_view(Self::row(self.src, r % self.height, r / self.height), w);
                // SAFETY: the caller's box: `width` readable bytes at each of
                // its source rows (API contract).
                tmp.extend_from_slice(unsafe { std::slice::from_raw_parts(s as *const u8, w) });
            }
            // The destination's rows follow one another: run `done` starts
            // `done` rows in.
            let d = self.dst.addr + done * self.width;
            htod(d, tmp.as_ptr() as *const c_void, tmp.len(), st, false)?;
            done += n;
        }
        if sync {
            let h = resolve(st)?;
            gpu(|g| g.stream_synchronize(h))?;
        }
        Ok(())
    }

    /// Device to host memory: each slice's rows in one copy, then spread.
    fn gather(&self, st: CUstream) -> Result<(), CuResult> {
        let span = (self.height - 1) * self.src.pitch + self.width;
        let mut tmp = vec![0u8; usize::try_from(span).map_err(|_| code::INVALID_VALUE)?];
        for z in 0..self.depth {
            dtoh(
                tmp.as_mut_ptr() as *mut c_void,
                Self::row(self.src, 0, z),
                tmp.len(),
                st,
                true,
            )?;
            for y in 0..self.height {
                let d = host_view(Self::row(self.dst, y, z), self.width as usize);
                let from = (y * self.src.pitch) as usize;
                let row = &tmp[from..from + self.width as usize];
                // SAFETY: the caller's box: `width` writable bytes at each of
                // its destination rows (API contract).
                unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), d as *mut u8, row.len()) };
            }
        }
        Ok(())
    }
}

/// One contiguous run of `n` bytes from `s` to `d`, as the sides' kinds say.
fn copy1(
    dk: Side,
    sk: Side,
    d: u64,
    s: u64,
    n: u64,
    st: CUstream,
    sync: bool,
) -> Result<(), CuResult> {
    let n = usize::try_from(n).map_err(|_| code::INVALID_VALUE)?;
    match (dk.device, sk.device) {
        (true, true) => dtod(d, s, n, st, sync),
        (true, false) => htod(d, host_view(s, n) as *const c_void, n, st, sync),
        (false, true) => dtoh(host_view(d, n) as *mut c_void, s, n, st, sync),
        (false, false) => {
            let h = resolve(st)?;
            gpu(|g| g.stream_synchronize(h))?;
            let (d, s) = (host_view(d, n), host_view(s, n));
            // SAFETY: the caller's box: `n` readable bytes at `s`, `n`
            // writable at `d` (API contract).
            unsafe { std::ptr::copy(s as *const u8, d as *mut u8, n) };
            Ok(())
        }
    }
}

/// A box copy in `st`'s order, or a memcpy node when `st` is capturing.
fn copy_box(b: Box3d, st: CUstream, sync: bool) -> Result<(), CuResult> {
    crate::state::thread::need_ctx()?;
    if crate::graph::capture::add(st, || Ok(crate::graph::Op::Copy(b)))? {
        return Ok(());
    }
    b.run(st, sync)
}

fn read<T>(p: *const T) -> Result<&'static T, CuResult> {
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: a parameter struct of the caller's, read for the call only
    // (API contract); the 'static is confined to this module's callers,
    // which copy what they need out of it at once.
    Ok(unsafe { &*p })
}

/// A 3D copy: with an array at either end through `arrays`, else a box.
fn copy_any(p: &Memcpy3d, st: CUstream, sync: bool) -> Result<(), CuResult> {
    if p.src_type == memtype::ARRAY || p.dst_type == memtype::ARRAY {
        return crate::arrays::copy_3d(p, st, sync);
    }
    copy_box(Box3d::from_3d(p)?, st, sync)
}

export! {
    fn cuMemcpy2D_v2 [cuMemcpy2D_v2_ptds per_thread] (p: *const Memcpy2d) {
        copy_any(&to_3d(read(p)?), std::ptr::null_mut(), true)
    }

    fn cuMemcpy2DUnaligned_v2 [cuMemcpy2DUnaligned_v2_ptds per_thread] (p: *const Memcpy2d) {
        copy_any(&to_3d(read(p)?), std::ptr::null_mut(), true)
    }

    fn cuMemcpy2DAsync_v2 [cuMemcpy2DAsync_v2_ptsz per_thread] (p: *const Memcpy2d, st: CUstream) {
        copy_any(&to_3d(read(p)?), st, false)
    }

    fn cuMemcpy3D_v2 [cuMemcpy3D_v2_ptds per_thread] (p: *const Memcpy3d) {
        copy_any(read(p)?, std::ptr::null_mut(), true)
    }

    fn cuMemcpy3DAsync_v2 [cuMemcpy3DAsync_v2_ptsz per_thread] (p: *const Memcpy3d, st: CUstream) {
        copy_any(read(p)?, st, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(addr: u64, pitch: u64, height: u64) -> Side {
        Side {
            addr,
            device: false,
            pitch,
            height,
        }
    }

    #[test]
    fn rows_and_slices_are_where_pitch_and_height_put_them() {
        let s = side(1000, 64, 8);
        assert_eq!(Box3d::row(s, 0, 0), 1000);
        assert_eq!(Box3d::row(s, 3, 0), 1000 + 3 * 64);
        assert_eq!(Box3d::row(s, 2, 1), 1000 + (8 + 2) * 64);
    }

    #[test]
    fn only_gapless_boxes_are_one_copy_and_short_pitches_are_refused() {
        let b = Box3d {
            src: side(0, 16, 4),
            dst: side(0, 32, 4),
            width: 16,
            height: 4,
            depth: 2,
        };
        assert!(b.contiguous(b.src));
        assert!(!b.contiguous(b.dst));
        assert!(b.check().is_ok());
        let short = Box3d {
            dst: side(0, 8, 4),
            ..b
        };
        assert_eq!(short.check(), Err(code::INVALID_VALUE));
        let low = Box3d {
            dst: side(0, 32, 2),
            ..b
        };
        assert_eq!(low.check(), Err(code::INVALID_VALUE));
        let one_row = Box3d::linear((5, true), (9, false), 100);
        assert!(one_row.contiguous(one_row.src) && one_row.contiguous(one_row.dst));
    }
}
