//! The module family: loading (whole, from the image cache, or linked)
//! and unloading modules, their functions, globals and names, function
//! attributes, occupancy, and tensor maps over the caller's memory.

use protocol::tensor_map::{TensorMapParams, PARAMS_BYTES};
use protocol::{Reply, Request, Status};
use transport::Descriptor;

use super::super::channel::{refuse, reply, ChannelState};
use super::super::shared::{Gpu, Port, Shared};
use super::super::transfer::{continue_transfer, start_module, Inbound, Transfer};
use super::{one, unit};
use crate::session::Session;
use crate::Error;

/// Longest kernel name accepted.
const MAX_NAME: u32 = 4096;

/// Runs a module request of session `s` and replies.
pub(super) fn handle(
    sh: &mut Shared,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    match req {
        Request::ModuleLoad { kind, len } => {
            start_module(c, d.tag, kind, len, d)?;
            continue_transfer(sh, c, s, d)
        }
        Request::Link { len } => {
            c.transfer = Some(Transfer {
                inbound: Inbound::Link {
                    buf: Vec::new(),
                    tag: d.tag,
                },
                remaining: len,
                offset: 0,
            });
            continue_transfer(sh, c, s, d)
        }
        Request::ModuleLoadCached { kind, len, hash } => {
            let r = load_cached(&mut sh.gpu, s, kind, len, &hash);
            reply(&sh.port, c, d.tag, d.opcode, r.map(Reply::one), &[])
        }
        req => run(&sh.port, c, s, d, req),
    }
}

/// A module from the image cache (see `image_cache.rs`), by its hash.
fn load_cached(
    gpu: &mut Gpu,
    s: &mut Session,
    kind: protocol::ImageKind,
    len: u64,
    hash: &[u8; 32],
) -> Result<u64, Status> {
    match gpu.images.get(hash, kind, len) {
        Some(image) => s
            .ctx
            .load_module(kind, image.bytes())
            .inspect(|&m| s.add_module(m)),
        None => Err(Status::NotFound),
    }
}

/// The module requests that need nothing but the session and the port.
fn run(
    port: &Port,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    req: Request,
) -> Result<(), Error> {
    let (tag, opc) = (d.tag, d.opcode);
    match req {
        Request::ModuleUnload { module } => {
            let r = s
                .check_module(module)
                .and_then(|()| s.ctx.unload_module(module));
            if r.is_ok() {
                s.remove_module(module);
            }
            reply(port, c, tag, opc, unit(r), &[])
        }
        Request::ModuleGetFunction { module } => {
            let name = read_name(c, d)?;
            let r = match (s.check_module(module), std::str::from_utf8(&name)) {
                (Err(e), _) => Err(e),
                (_, Err(_)) => Err(Status::InvalidValue),
                (Ok(()), Ok(n)) => s.ctx.function(module, n.trim_end_matches('\0')),
            };
            match r {
                Ok((h, params)) => {
                    let bytes = protocol::Param::encode_all(&params);
                    s.add_function(h, params.iter().map(|p| p.size).collect());
                    reply(port, c, tag, opc, Ok(Reply::one(h)), &bytes)
                }
                Err(e) => reply(port, c, tag, opc, Err(e), &[]),
            }
        }
        Request::ModuleFunctions { module, first } => functions(port, c, s, d, module, first),
        Request::ModuleGetGlobal { module } => {
            let name = read_name(c, d)?;
            let r = match (s.check_module(module), std::str::from_utf8(&name)) {
                (Err(e), _) => Err(e),
                (_, Err(_)) => Err(Status::InvalidValue),
                (Ok(()), Ok(n)) => s.ctx.module_global(module, n.trim_end_matches('\0')),
            };
            let r = r.map(|(p, size)| {
                s.add_global(p, size);
                Reply {
                    vals: [p, size, 0, 0],
                }
            });
            reply(port, c, tag, opc, r, &[])
        }
        Request::TensorMapEncode => {
            let mut b = vec![0u8; crate::usize_from(u64::from(d.data_len)).min(PARAMS_BYTES)];
            c.host.req.data(d)?.copy_to(&mut b[..]);
            let r = TensorMapParams::decode(&b)
                .map_err(|_| Status::InvalidValue)
                .and_then(|p| {
                    // The tensor must be the caller's own memory.
                    s.check_range(p.address, p.span())?;
                    s.ctx.tensor_map(&p)
                });
            match r {
                Ok(map) => reply(port, c, tag, opc, Ok(Reply::default()), &map),
                Err(e) => reply(port, c, tag, opc, Err(e), &[]),
            }
        }
        Request::FuncGetAttribute { func, attr } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.func_attribute(func, attr))
                .map(reply_i32);
            reply(port, c, tag, opc, r, &[])
        }
        Request::FuncSetAttribute { func, attr, value } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.func_set_attribute(func, attr, value));
            reply(port, c, tag, opc, unit(r), &[])
        }
        Request::Occupancy {
            func,
            block_size,
            shared_mem,
        } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.occupancy(func, block_size, shared_mem))
                .map(reply_i32);
            reply(port, c, tag, opc, r, &[])
        }
        Request::OccupancySmem {
            func,
            num_blocks,
            block_size,
        } => {
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.available_smem(func, num_blocks, block_size));
            reply(port, c, tag, opc, one(r), &[])
        }
        Request::OccupancyClusters {
            func,
            grid,
            block,
            shared_mem,
            cluster,
            potential,
        } => {
            let shape = crate::executor::Launch {
                func,
                grid,
                block,
                shared_mem,
            };
            let r = s
                .function(func)
                .map(drop)
                .and_then(|()| s.ctx.occupancy_clusters(shape, cluster, potential))
                .map(reply_i32);
            reply(port, c, tag, opc, r, &[])
        }
        _ => super::misrouted(port, c, d, "module"),
    }
}

/// A name sent as the request's data (a kernel's, a global's).
fn read_name(c: &mut ChannelState, d: &Descriptor) -> Result<Vec<u8>, Error> {
    let mut name = vec![0u8; d.data_len.min(MAX_NAME) as usize];
    c.host.req.data(d)?.copy_to(&mut name[..]);
    Ok(name)
}

/// A module's kernel names from `first` on, as many as one message holds.
fn functions(
    port: &Port,
    c: &mut ChannelState,
    s: &mut Session,
    d: &Descriptor,
    module: u64,
    first: u32,
) -> Result<(), Error> {
    let (tag, opc) = (d.tag, d.opcode);
    let r = s
        .check_module(module)
        .and_then(|()| s.ctx.function_names(module));
    match r {
        Ok(names) => {
            let mut data = Vec::new();
            for n in names.iter().skip(first as usize) {
                if data.len() + n.len() + 1 > port.chunk {
                    break;
                }
                data.extend_from_slice(n.as_bytes());
                data.push(0);
            }
            if data.is_empty() && (first as usize) < names.len() {
                refuse(port, c, "kernel name longer than one arena chunk");
                return reply(port, c, tag, opc, Err(Status::NotSupported), &[]);
            }
            let count = Reply::one(names.len() as u64);
            reply(port, c, tag, opc, Ok(count), &data)
        }
        Err(e) => reply(port, c, tag, opc, Err(e), &[]),
    }
}

/// The reply to a request answered with an `int`: its 32 bits, which the
/// guest reads back as an `int` (a negative value stays negative).
fn reply_i32(v: i32) -> Reply {
    Reply::one(u64::from(u32::from_ne_bytes(v.to_ne_bytes())))
}
