//! Writing a request into its descriptor's inline payload.

use super::Request;
use crate::{Dim3, ImageKind, Writer, INLINE};

fn write_image(w: &mut Writer<'_>, kind: ImageKind, len: u64) {
    w.u32(kind.code());
    w.u64(len);
}

fn write_dim(w: &mut Writer<'_>, d: Dim3) {
    w.u32(d.x);
    w.u32(d.y);
    w.u32(d.z);
}
impl Request {
    /// Encodes into an inline payload.
    pub fn encode(&self, out: &mut [u8; INLINE]) {
        use Request::*;
        let mut w = Writer::new(out);
        match *self {
            Hello { version } => w.u32(version),
            Join { token } => {
                w.u64(token[0]);
                w.u64(token[1]);
            }
            CtxSynchronize | MemGetInfo | WaitHostFn | TensorMapEncode | TexCreate | TakeOutput => {
            }
            HostFn { stream, id } => {
                w.u64(stream);
                w.u64(id);
            }
            HostFnDone { id } => w.u64(id),
            MemAlloc { size } => w.u64(size),
            MemFree { ptr } => w.u64(ptr),
            MemFreeAsync { ptr, stream } => {
                w.u64(ptr);
                w.u64(stream);
            }
            PinnedAlloc { size } => w.u64(size),
            PinnedFree { offset } => w.u64(offset),
            MemcpyHtoDPinned {
                dst: a,
                offset,
                len,
                stream,
            }
            | MemcpyDtoHPinned {
                src: a,
                offset,
                len,
                stream,
            } => {
                w.u64(a);
                w.u64(offset);
                w.u64(len);
                w.u64(stream);
            }
            MemcpyHtoD { dst, len, stream } => {
                w.u64(dst);
                w.u64(len);
                w.u64(stream);
            }
            MemcpyDtoH { src, len, stream } => {
                w.u64(src);
                w.u64(len);
                w.u64(stream);
            }
            MemcpyDtoD {
                dst,
                src,
                len,
                stream,
            } => {
                w.u64(dst);
                w.u64(src);
                w.u64(len);
                w.u64(stream);
            }
            Memset {
                dst,
                value,
                width,
                count,
                stream,
            } => {
                w.u64(dst);
                w.u32(value);
                w.u32(width);
                w.u64(count);
                w.u64(stream);
            }
            ModuleLoadCached { kind, len, hash } => {
                write_image(&mut w, kind, len);
                for c in hash.chunks_exact(8) {
                    w.u64(u64::from_le_bytes(c.try_into().unwrap_or_default()));
                }
            }
            ModuleLoad { kind, len } => write_image(&mut w, kind, len),
            GraphInstantiate { len } => w.u32(len),
            GraphLaunch { exec, stream } => {
                w.u64(exec);
                w.u64(stream);
            }
            GraphDestroy { exec } => w.u64(exec),
            CondScopeCreate => {}
            CondHandleCreate {
                scope,
                default_value,
                flags,
            } => {
                w.u64(scope);
                w.u32(default_value);
                w.u32(flags);
            }
            CondScopeDestroy { scope } => w.u64(scope),
            GraphInstantiateIn { scope, len } => {
                w.u64(scope);
                w.u32(len);
            }
            ModuleFunctions { module, first } => {
                w.u64(module);
                w.u32(first);
            }
            ModuleUnload { module } | ModuleGetFunction { module } => w.u64(module),
            FuncGetAttribute { func, attr } => {
                w.u64(func);
                w.u32(attr);
            }
            Occupancy {
                func,
                block_size,
                shared_mem,
            } => {
                w.u64(func);
                w.u32(block_size);
                w.u32(shared_mem);
            }
            ModuleGetGlobal { module } => w.u64(module),
            OccupancySmem {
                func,
                num_blocks,
                block_size,
            } => {
                w.u64(func);
                w.u32(num_blocks);
                w.u32(block_size);
            }
            Link { len } => w.u64(len),
            OccupancyClusters {
                func,
                grid,
                block,
                shared_mem,
                cluster,
                potential,
            } => {
                w.u64(func);
                for d in [grid, block, cluster] {
                    write_dim(&mut w, d);
                }
                w.u32(shared_mem);
                w.u32(u32::from(potential));
            }
            Launch {
                func,
                grid,
                block,
                shared_mem,
                stream,
                cluster,
                flags,
            } => {
                w.u64(func);
                write_dim(&mut w, grid);
                write_dim(&mut w, block);
                w.u32(shared_mem);
                w.u64(stream);
                write_dim(&mut w, cluster);
                w.u32(flags);
            }
            StreamCreate { flags, priority } => {
                w.u32(flags);
                w.u32(priority as u32);
            }
            EventCreate { flags } => w.u32(flags),
            StreamWaitEvent {
                stream,
                event,
                flags,
            } => {
                w.u64(stream);
                w.u64(event);
                w.u32(flags);
            }
            FuncSetAttribute { func, attr, value } => {
                w.u64(func);
                w.u32(attr);
                w.u32(value as u32);
            }
            CtxGetLimit { limit } => w.u32(limit),
            CtxSetLimit { limit, value } => {
                w.u32(limit);
                w.u64(value);
            }
            StreamSetAttribute { stream, attr } => {
                w.u64(stream);
                w.u32(attr.id());
                w.bytes(&attr.to_raw());
            }
            StreamGetAttribute { stream, attr } => {
                w.u64(stream);
                w.u32(attr);
            }
            StreamDestroy { stream } | StreamSynchronize { stream } | StreamQuery { stream } => {
                w.u64(stream)
            }
            EventDestroy { event } | EventSynchronize { event } | EventQuery { event } => {
                w.u64(event)
            }
            EventRecord { event, stream } => {
                w.u64(event);
                w.u64(stream);
            }
            EventElapsedTime { start, end } => {
                w.u64(start);
                w.u64(end);
            }
            VmmReserve { size, align, addr } => {
                w.u64(size);
                w.u64(align);
                w.u64(addr);
            }
            PoolExportPointer { pool: a, ptr: b } | PoolImportPointer { pool: a, token: b } => {
                w.u64(a);
                w.u64(b);
            }
            VmmAddressFree { ptr: a, size: b } | VmmUnmap { ptr: a, size: b } => {
                w.u64(a);
                w.u64(b);
            }
            VmmCreate { size, compression } => {
                w.u64(size);
                w.u32(u32::from(compression));
            }
            VmmRelease { handle: a }
            | VmmRetain { ptr: a }
            | IpcExport { ptr: a }
            | IpcOpen { token: a }
            | IpcClose { ptr: a }
            | IpcExportEvent { event: a }
            | IpcOpenEvent { token: a }
            | VmmExport { handle: a }
            | VmmImport { token: a }
            | PoolExport { pool: a }
            | PoolImport { token: a }
            | ArrayDestroy { array: a }
            | TexDestroy { obj: a }
            | SurfCreate { array: a }
            | SurfDestroy { obj: a } => w.u64(a),
            VgpuStatus { first } => w.u32(first),
            ArrayCreate { desc } => desc.write(&mut w),
            ArrayCopy { copy, stream } => {
                copy.write(&mut w);
                w.u64(stream);
            }
            VmmMap {
                ptr,
                size,
                offset,
                handle,
            } => {
                w.u64(ptr);
                w.u64(size);
                w.u64(offset);
                w.u64(handle);
            }
            VmmSetAccess { ptr, size, flags } => {
                w.u64(ptr);
                w.u64(size);
                w.u32(flags);
            }
        }
    }
}
