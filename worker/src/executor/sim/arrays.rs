//! CUDA arrays on the model: each array's bytes in host RAM, laid out row
//! after row and slice after slice (`ArrayDesc::offset`), so that what is
//! copied in comes out the same; texture and surface objects are handles
//! (the model's kernels do not sample them).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use protocol::array::{ArrayCopy, ArrayDesc, CopySide};
use protocol::Status;

use super::context::SimContext;
use crate::executor::{ArrayOp, Arrays, Handle};

/// A context's arrays and objects.
#[derive(Default)]
pub(super) struct SimArrays {
    arrays: HashMap<Handle, (ArrayDesc, Vec<u8>)>,
    textures: HashSet<u64>,
    surfaces: HashSet<u64>,
}

/// Values numbered apart from every other context's, never 0.
fn next(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Ordering::Relaxed)
}

static ARRAYS: AtomicU64 = AtomicU64::new(0x4152_0000_0001);
static OBJECTS: AtomicU64 = AtomicU64::new(1);

impl SimContext {
    /// Forgets every array and object (a recycled context).
    pub(super) fn clear_arrays(&mut self) {
        self.arrays = SimArrays::default();
    }

    /// What keeps the context on its GPU, as on a real one: a texture or
    /// surface object, else an array.
    pub(super) fn arrays_keeper(&self) -> Option<crate::executor::Keeper> {
        let a = &self.arrays;
        if !(a.textures.is_empty() && a.surfaces.is_empty()) {
            Some(crate::executor::Keeper::TextureObject)
        } else if !a.arrays.is_empty() {
            Some(crate::executor::Keeper::Array)
        } else {
            None
        }
    }

    /// Where each row of the box starts on side `s`: an offset in the
    /// array's bytes, or a device address.
    fn rows(c: &ArrayCopy, s: &CopySide, desc: Option<&ArrayDesc>) -> Vec<u64> {
        let mut out = Vec::with_capacity((c.height as usize) * (c.depth as usize));
        for z in 0..u64::from(c.depth) {
            for y in 0..u64::from(c.height) {
                out.push(match (*s, desc) {
                    (
                        CopySide::Array {
                            x, y: y0, z: z0, ..
                        },
                        Some(d),
                    ) => d.offset(u64::from(x), u64::from(y0) + y, u64::from(z0) + z),
                    (CopySide::Device { ptr, pitch, height }, _) => ptr + (z * height + y) * pitch,
                    _ => 0,
                });
            }
        }
        out
    }

    /// The box's bytes from its source, row after row.
    fn gather(&self, c: &ArrayCopy) -> Result<Vec<u8>, Status> {
        let w = c.width as usize;
        let mut data = Vec::new();
        match c.src {
            CopySide::Array { array, .. } => {
                let (d, bytes) = self
                    .arrays
                    .arrays
                    .get(&array)
                    .ok_or(Status::InvalidHandle)?;
                if !c.inside(&c.src, d) {
                    return Err(Status::InvalidValue);
                }
                for at in Self::rows(c, &c.src, Some(d)) {
                    data.extend_from_slice(
                        &bytes[crate::usize_from(at)..crate::usize_from(at) + w],
                    );
                }
            }
            CopySide::Device { .. } => {
                for at in Self::rows(c, &c.src, None) {
                    for (p, n) in self.pieces(at, w as u64) {
                        let (buf, off) = self.locate(p, n)?;
                        data.extend_from_slice(&buf[off..off + crate::usize_from(n)]);
                    }
                }
            }
        }
        Ok(data)
    }

    /// Writes the box's bytes (row after row) to its destination.
    fn scatter(&mut self, c: &ArrayCopy, data: &[u8]) -> Result<(), Status> {
        let w = c.width as usize;
        match c.dst {
            CopySide::Array { array, .. } => {
                let (d, bytes) = self
                    .arrays
                    .arrays
                    .get_mut(&array)
                    .ok_or(Status::InvalidHandle)?;
                if !c.inside(&c.dst, d) {
                    return Err(Status::InvalidValue);
                }
                let d = *d;
                for (i, at) in Self::rows(c, &c.dst, Some(&d)).into_iter().enumerate() {
                    bytes[crate::usize_from(at)..crate::usize_from(at) + w]
                        .copy_from_slice(&data[i * w..(i + 1) * w]);
                }
            }
            CopySide::Device { .. } => {
                for (i, at) in Self::rows(c, &c.dst, None).into_iter().enumerate() {
                    for (p, n) in self.pieces(at, w as u64) {
                        let (mut buf, off) = self.locate(p, n)?;
                        let from = i * w + crate::usize_from(p - at);
                        buf[off..off + crate::usize_from(n)]
                            .copy_from_slice(&data[from..from + crate::usize_from(n)]);
                    }
                }
            }
        }
        Ok(())
    }
}

impl Arrays for SimContext {
    fn array_op(&mut self, op: ArrayOp) -> Result<u64, Status> {
        self.alive()?;
        let a = &mut self.arrays;
        match op {
            ArrayOp::Create(desc) => {
                let len = usize::try_from(desc.bytes()).map_err(|_| Status::OutOfMemory)?;
                let mut bytes = Vec::new();
                bytes
                    .try_reserve_exact(len)
                    .map_err(|_| Status::OutOfMemory)?;
                bytes.resize(len, 0);
                let h = next(&ARRAYS);
                a.arrays.insert(h, (desc, bytes));
                Ok(h)
            }
            ArrayOp::Destroy(h) => a.arrays.remove(&h).map(|_| 0).ok_or(Status::InvalidHandle),
            ArrayOp::TexCreate(p) => {
                if p.kind == protocol::array::resource::ARRAY && !a.arrays.contains_key(&p.base) {
                    return Err(Status::InvalidHandle);
                }
                let v = next(&OBJECTS);
                a.textures.insert(v);
                Ok(v)
            }
            ArrayOp::TexDestroy(v) => a
                .textures
                .remove(&v)
                .then_some(0)
                .ok_or(Status::InvalidHandle),
            ArrayOp::SurfCreate(h) => {
                // Without SURFACE_LDST too, as the driver makes it.
                a.arrays.get(&h).ok_or(Status::InvalidHandle)?;
                let v = next(&OBJECTS);
                a.surfaces.insert(v);
                Ok(v)
            }
            ArrayOp::SurfDestroy(v) => a
                .surfaces
                .remove(&v)
                .then_some(0)
                .ok_or(Status::InvalidHandle),
            ArrayOp::Copy(c, stream) => {
                let data = self.gather(&c)?;
                self.scatter(&c, &data)?;
                let ns = self.mem_ns(2 * data.len() as u64);
                self.submit(ns, stream);
                Ok(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use protocol::array::{ArrayCopy, ArrayDesc, CopySide, SURFACE_LDST};
    use vm_memory::VolatileSlice;

    use crate::executor::sim::{SimExecutor, SimParams};
    use crate::executor::{ArrayOp, Executor};

    #[test]
    fn bytes_round_trip_and_a_context_holding_arrays_stays() {
        let mut exec = SimExecutor::new(SimParams {
            gpus: 2,
            ..SimParams::default()
        });
        let mut ctx = exec.open().unwrap();
        let desc = ArrayDesc {
            width: 8,
            height: 4,
            depth: 2,
            format: 0x02,
            channels: 2,
            flags: SURFACE_LDST,
        };
        let a = ctx.array_op(ArrayOp::Create(desc)).unwrap();
        let (src, dst) = (ctx.alloc(4096).unwrap(), ctx.alloc(4096).unwrap());
        let mut bytes: Vec<u8> = (0..4096u32).map(|i| (i * 13 % 251) as u8).collect();
        ctx.htod(src, &VolatileSlice::from(&mut bytes[..]), 0)
            .unwrap();
        // Rows of 32 bytes from a pitch of 100 into the whole array, then
        // back out at a pitch of 40.
        let box_of = |src, dst| ArrayCopy {
            src,
            dst,
            width: 32,
            height: 4,
            depth: 2,
        };
        let whole = CopySide::Array {
            array: a,
            x: 0,
            y: 0,
            z: 0,
        };
        let dev = |ptr, pitch| CopySide::Device {
            ptr,
            pitch,
            height: 5,
        };
        ctx.array_op(ArrayOp::Copy(box_of(dev(src, 100), whole), 0))
            .unwrap();
        ctx.array_op(ArrayOp::Copy(box_of(whole, dev(dst, 40)), 0))
            .unwrap();
        let mut back = vec![0u8; 4096];
        ctx.dtoh(&VolatileSlice::from(&mut back[..]), dst, 0)
            .unwrap();
        for z in 0..2 {
            for y in 0..4 {
                let (s, d) = ((z * 5 + y) * 100, (z * 5 + y) * 40);
                assert_eq!(back[d..d + 32], bytes[s..s + 32], "row {y} of slice {z}");
            }
        }
        let s = ctx.array_op(ArrayOp::SurfCreate(a)).unwrap();
        assert_eq!(
            ctx.migration_keeper(),
            Some(crate::executor::Keeper::TextureObject)
        );
        assert!(ctx.migrate(1, None).is_err(), "its arrays stay");
        ctx.array_op(ArrayOp::SurfDestroy(s)).unwrap();
        assert_eq!(ctx.migration_keeper(), Some(crate::executor::Keeper::Array));
        ctx.array_op(ArrayOp::Destroy(a)).unwrap();
        assert_eq!(ctx.migration_keeper(), None);
        assert!(ctx.migrate(1, None).is_ok());
    }
}
