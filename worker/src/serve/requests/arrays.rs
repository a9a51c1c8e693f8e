//! The CUDA array requests (cuArray3DCreate, copies with an array at
//! either end, cuTexObjectCreate, cuSurfObjectCreate and their destroys):
//! each checked against the session's own tables (`session::arrays`) and
//! memory, run on the executor, answered. An array counts against the
//! vGPU's memory limit as `MemAlloc` does, until destroyed or the session
//! ends (the executor context frees it, and the session's count goes).

use protocol::array::{resource, CopySide, TexParams, TEX_PARAMS_BYTES};
use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::super::channel::{answer, ChannelState};
use super::super::shared::{Memory, Port, Slice};
use crate::executor::ArrayOp;
use crate::session::Session;
use crate::Error;

/// Runs an array request of session `s` and replies.
pub(super) fn handle(
    port: &Port,
    mem: &mut Memory,
    slice: &mut Slice,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    let tex = if matches!(req, Request::TexCreate) {
        let mut b = vec![0u8; crate::usize_from(u64::from(d.data_len)).min(TEX_PARAMS_BYTES + 1)];
        c.host.req.data(d)?.copy_to(&mut b[..]);
        Some(TexParams::decode(&b).map_err(|_| Status::InvalidValue))
    } else {
        None
    };
    let (r, why) = run(port, mem, slice, s, req, tex);
    answer(port, c, d.tag, d.opcode, r, why)
}

/// How much of `[ptr, ptr + len)`, from `ptr` on, is the caller's own
/// memory (one allocation, global or mapping): 0 if `ptr` is not.
fn own_len(s: &Session, ptr: u64, len: u64) -> u64 {
    if s.check_range(ptr, 1).is_err() {
        return 0;
    }
    // The longest prefix that is its own (a check of a range holds for
    // every shorter one from the same start).
    let (mut ok, mut bad) = (1, len.saturating_add(1));
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        if s.check_range(ptr, mid).is_ok() {
            ok = mid;
        } else {
            bad = mid;
        }
    }
    ok
}

fn run(
    port: &Port,
    mem: &mut Memory,
    slice: &mut Slice,
    s: &mut Session,
    req: Request,
    tex: Option<Result<TexParams, Status>>,
) -> (Result<Reply, Status>, &'static str) {
    let one = |r: Result<u64, Status>| r.map(Reply::one);
    match req {
        Request::ArrayCreate { desc } => {
            let charge = s.ctx.footprint(desc.bytes());
            let r = if s.arrays.full() || !mem.reserve(charge, &port.link) {
                Err(Status::OutOfMemory)
            } else {
                let r = s.ctx.array_op(ArrayOp::Create(desc)).map(|h| {
                    s.arrays.add(h, desc, charge);
                    s.mem_used += charge;
                    Reply {
                        vals: [h, charge, 0, 0],
                    }
                });
                r.inspect_err(|_| mem.sub(charge))
            };
            (
                r,
                "array over the vGPU's memory limit, or refused by the device",
            )
        }
        Request::ArrayDestroy { array } => {
            let r = s.arrays.remove(array).and_then(|charge| {
                let r = s.ctx.array_op(ArrayOp::Destroy(array));
                // The array is the guest's no more either way.
                s.uncount(charge);
                mem.sub(charge);
                r.map(|_| Reply::default())
            });
            (r, "destroy of an array it does not hold")
        }
        Request::ArrayCopy { copy, stream } => {
            let r = s
                .check_stream(stream)
                .and_then(|()| s.arrays.check_copy(&copy));
            let r = [copy.src, copy.dst].iter().fold(r, |r, side| {
                r.and_then(|()| match side.span(copy.width, copy.height, copy.depth) {
                    Some((ptr, len)) => s.check_range(ptr, len),
                    None if matches!(side, CopySide::Array { .. }) => Ok(()),
                    None => Err(Status::InvalidValue),
                })
            });
            let r = r.and_then(|()| {
                slice.in_period(s, stream, None, |x| x.array_op(ArrayOp::Copy(copy, stream)))
            });
            (
                r.map(|_| Reply::default()),
                "array copy outside its arrays or its own memory",
            )
        }
        Request::TexCreate => {
            let r = tex.unwrap_or(Err(Status::InvalidValue)).and_then(|mut p| {
                if s.arrays.full() {
                    return Err(Status::OutOfMemory);
                }
                match (p.kind, p.span()) {
                    (resource::ARRAY, _) => s.arrays.get(p.base).map(drop)?,
                    // Linear memory reaching past the caller's allocation:
                    // the driver makes it (it does not look; cuda-samples'
                    // convolutionFFT2D makes one over a padded width), so
                    // it is made here over the caller's own part only. A
                    // 1D fetch past a linear texture's end reads 0, as a
                    // fetch past the driver's would read what is not the
                    // caller's.
                    (resource::LINEAR, Some((ptr, len))) => {
                        let own = own_len(s, ptr, len);
                        let elem = protocol::array::format_size(p.format)
                            .map_or(1, |f| u64::from(f * p.channels));
                        p.width = own - own % elem;
                        if p.width == 0 {
                            return Err(Status::InvalidValue);
                        }
                    }
                    // Pitched memory: the caller's own, all of it.
                    (_, Some((ptr, len))) => s.check_range(ptr, len)?,
                    _ => return Err(Status::InvalidValue),
                }
                let v = s.ctx.array_op(ArrayOp::TexCreate(p))?;
                s.arrays.add_texture(v);
                Ok(v)
            });
            (
                one(r),
                "texture over an array or memory not its own, or refused by the device",
            )
        }
        Request::TexDestroy { obj } => {
            let r = s
                .arrays
                .remove_texture(obj)
                .and_then(|()| s.ctx.array_op(ArrayOp::TexDestroy(obj)));
            (one(r.map(|_| 0)), "destroy of a texture object not its own")
        }
        Request::SurfCreate { array } => {
            // Over an array without SURFACE_LDST too: the driver makes it
            // (H100, `scripts/gpu/arrays.sh`).
            let r = s.arrays.get(array).copied().and_then(|_| {
                if s.arrays.full() {
                    return Err(Status::OutOfMemory);
                }
                let v = s.ctx.array_op(ArrayOp::SurfCreate(array))?;
                s.arrays.add_surface(v);
                Ok(v)
            });
            (one(r), "surface over an array not its own")
        }
        Request::SurfDestroy { obj } => {
            let r = s
                .arrays
                .remove_surface(obj)
                .and_then(|()| s.ctx.array_op(ArrayOp::SurfDestroy(obj)));
            (one(r.map(|_| 0)), "destroy of a surface object not its own")
        }
        _ => (Err(Status::InvalidValue), "not an array request"),
    }
}
