//! Reading a request from guest bytes: every opcode, enum value, length,
//! address and launch dimension checked; total on every input.

use super::Request;
use crate::*;

/// A VMM size (at most [`MAX_LEN`]) or address: nonzero, a multiple of
/// [`VMM_GRANULARITY`].
fn check_vmm(field: &'static str, v: u64) -> Result<u64, ProtoError> {
    let max = if field == "size" { MAX_LEN } else { u64::MAX };
    if v == 0 || !v.is_multiple_of(VMM_GRANULARITY) || v > max {
        return Err(bad(
            field,
            format!("{v:#x} is not a nonzero multiple of 2 MiB"),
        ));
    }
    Ok(v)
}

/// A token or pool handle: never 0 (0 names nothing the host hands out).
fn nonzero(field: &'static str, v: u64) -> Result<u64, ProtoError> {
    if v == 0 {
        return Err(bad(field, "0 names nothing"));
    }
    Ok(v)
}

/// A cluster shape: none (all zero), or every dimension set, at most
/// [`MAX_CLUSTER_BLOCKS`] blocks, dividing the grid.
fn check_cluster(grid: Dim3, cluster: Dim3) -> Result<(), ProtoError> {
    if cluster == Dim3::default() {
        return Ok(());
    }
    let dims = [
        (grid.x, cluster.x),
        (grid.y, cluster.y),
        (grid.z, cluster.z),
    ];
    if cluster.count() > MAX_CLUSTER_BLOCKS || dims.iter().any(|&(g, c)| c == 0 || g % c != 0) {
        return Err(bad("cluster", format!("{cluster:?} for grid {grid:?}")));
    }
    Ok(())
}

/// A module image's kind and length, as `ModuleLoad` and
/// `ModuleLoadCached` carry them.
fn read_image(r: &mut Reader<'_>) -> Result<(ImageKind, u64), ProtoError> {
    let k = r.u32()?;
    let kind =
        ImageKind::from_code(k).ok_or_else(|| bad("kind", format!("unknown image kind {k}")))?;
    let len = check_len("len", r.u64()?, MAX_IMAGE)?;
    if len == 0 {
        return Err(bad("len", "empty image"));
    }
    Ok((kind, len))
}

pub(crate) fn read_dim(r: &mut Reader<'_>) -> Result<Dim3, ProtoError> {
    Ok(Dim3 {
        x: r.u32()?,
        y: r.u32()?,
        z: r.u32()?,
    })
}

/// A launch's grid, block and dynamic shared memory, as the wire gives them.
fn read_shape(r: &mut Reader<'_>) -> Result<(Dim3, Dim3, u32), ProtoError> {
    let grid = read_dim(r)?;
    let block = read_dim(r)?;
    let shared_mem = r.u32()?;
    check_shape(grid, block, shared_mem)?;
    Ok((grid, block, shared_mem))
}

/// The limits every launch shape is held to (those of CUDA's devices).
fn check_shape(grid: Dim3, block: Dim3, shared_mem: u32) -> Result<(), ProtoError> {
    if grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > i32::MAX as u32 {
        return Err(bad("grid", format!("{grid:?} out of range")));
    }
    if grid.y > 65_535 || grid.z > 65_535 {
        return Err(bad(
            "grid",
            format!("{grid:?}: y and z are limited to 65535"),
        ));
    }
    if block.x == 0 || block.y == 0 || block.z == 0 || block.count() > 1024 || block.z > 64 {
        return Err(bad("block", format!("{block:?} out of range")));
    }
    if shared_mem > 256 << 10 {
        return Err(bad("shared_mem", format!("{shared_mem} bytes")));
    }
    Ok(())
}

fn check_len(field: &'static str, v: u64, max: u64) -> Result<u64, ProtoError> {
    if v > max {
        return Err(bad(field, format!("{v} exceeds {max}")));
    }
    Ok(v)
}

impl Request {
    /// Decodes and validates a request. Total on every input: an error, never a panic.
    pub fn decode(opcode: u32, inline: &[u8; INLINE]) -> Result<Request, ProtoError> {
        use Request::*;
        let mut r = Reader::new(inline);
        let req = match opcode {
            op::HELLO => Hello { version: r.u32()? },
            op::JOIN => Join {
                token: [r.u64()?, r.u64()?],
            },
            op::CTX_SYNCHRONIZE => CtxSynchronize,
            op::HOST_FN => HostFn {
                stream: r.u64()?,
                id: r.u64()?,
            },
            op::WAIT_HOST_FN => WaitHostFn,
            op::HOST_FN_DONE => HostFnDone { id: r.u64()? },
            op::TAKE_OUTPUT => TakeOutput,
            op::MEM_ALLOC => {
                let size = check_len("size", r.u64()?, MAX_LEN)?;
                if size == 0 {
                    return Err(bad("size", "zero-byte allocation"));
                }
                MemAlloc { size }
            }
            op::MEM_FREE => MemFree { ptr: r.u64()? },
            op::PINNED_ALLOC => {
                let size = check_len("size", r.u64()?, MAX_LEN)?;
                if size == 0 {
                    return Err(bad("size", "zero-byte allocation"));
                }
                PinnedAlloc { size }
            }
            op::PINNED_FREE => PinnedFree { offset: r.u64()? },
            op::MEMCPY_HTOD_PINNED => MemcpyHtoDPinned {
                dst: r.u64()?,
                offset: r.u64()?,
                len: check_len("len", r.u64()?, MAX_LEN)?,
                stream: r.u64()?,
            },
            op::MEMCPY_DTOH_PINNED => MemcpyDtoHPinned {
                src: r.u64()?,
                offset: r.u64()?,
                len: check_len("len", r.u64()?, MAX_LEN)?,
                stream: r.u64()?,
            },
            op::MEM_FREE_ASYNC => MemFreeAsync {
                ptr: r.u64()?,
                stream: r.u64()?,
            },
            op::MEM_GET_INFO => MemGetInfo,
            op::MEMCPY_HTOD => MemcpyHtoD {
                dst: r.u64()?,
                len: check_len("len", r.u64()?, MAX_LEN)?,
                stream: r.u64()?,
            },
            op::MEMCPY_DTOH => MemcpyDtoH {
                src: r.u64()?,
                len: check_len("len", r.u64()?, MAX_LEN)?,
                stream: r.u64()?,
            },
            op::MEMCPY_DTOD => MemcpyDtoD {
                dst: r.u64()?,
                src: r.u64()?,
                len: check_len("len", r.u64()?, MAX_LEN)?,
                stream: r.u64()?,
            },
            op::MEMSET => {
                let dst = r.u64()?;
                let value = r.u32()?;
                let width = r.u32()?;
                if !matches!(width, 1 | 2 | 4) {
                    return Err(bad("width", format!("{width} is not 1, 2 or 4")));
                }
                let count = check_len("count", r.u64()?, MAX_LEN / u64::from(width))?;
                Memset {
                    dst,
                    value,
                    width,
                    count,
                    stream: r.u64()?,
                }
            }
            op::MODULE_LOAD => {
                let (kind, len) = read_image(&mut r)?;
                ModuleLoad { kind, len }
            }
            op::MODULE_UNLOAD => ModuleUnload { module: r.u64()? },
            op::MODULE_GET_FUNCTION => ModuleGetFunction { module: r.u64()? },
            op::GRAPH_INSTANTIATE => GraphInstantiate { len: r.u32()? },
            op::GRAPH_LAUNCH => GraphLaunch {
                exec: r.u64()?,
                stream: r.u64()?,
            },
            op::GRAPH_DESTROY => GraphDestroy { exec: r.u64()? },
            op::COND_SCOPE_CREATE => CondScopeCreate,
            op::COND_HANDLE_CREATE => {
                let (scope, default_value, flags) = (r.u64()?, r.u32()?, r.u32()?);
                if flags > 1 {
                    return Err(bad("flags", format!("conditional handle flags {flags}")));
                }
                CondHandleCreate {
                    scope,
                    default_value,
                    flags,
                }
            }
            op::COND_SCOPE_DESTROY => CondScopeDestroy { scope: r.u64()? },
            op::GRAPH_INSTANTIATE_IN => GraphInstantiateIn {
                scope: r.u64()?,
                len: r.u32()?,
            },
            op::MODULE_FUNCTIONS => ModuleFunctions {
                module: r.u64()?,
                first: r.u32()?,
            },
            op::FUNC_GET_ATTRIBUTE => {
                let func = r.u64()?;
                let attr = r.u32()?;
                if attr > MAX_FUNC_ATTRIBUTE {
                    return Err(bad("attr", format!("function attribute {attr} unknown")));
                }
                FuncGetAttribute { func, attr }
            }
            op::OCCUPANCY => {
                let func = r.u64()?;
                let block_size = r.u32()?;
                if block_size == 0 || block_size > 1024 {
                    return Err(bad("block_size", format!("{block_size} threads")));
                }
                let shared_mem = r.u32()?;
                if shared_mem > 256 << 10 {
                    return Err(bad("shared_mem", format!("{shared_mem} bytes")));
                }
                Occupancy {
                    func,
                    block_size,
                    shared_mem,
                }
            }
            op::MODULE_GET_GLOBAL => ModuleGetGlobal { module: r.u64()? },
            op::TENSOR_MAP_ENCODE => TensorMapEncode,
            op::MODULE_LOAD_CACHED => {
                let (kind, len) = read_image(&mut r)?;
                let mut hash = [0u8; 32];
                for c in hash.chunks_exact_mut(8) {
                    c.copy_from_slice(&r.u64()?.to_le_bytes());
                }
                ModuleLoadCached { kind, len, hash }
            }
            op::OCCUPANCY_SMEM => {
                let func = r.u64()?;
                let num_blocks = r.u32()?;
                let block_size = r.u32()?;
                if num_blocks == 0 || num_blocks > 2048 {
                    return Err(bad("num_blocks", format!("{num_blocks} blocks")));
                }
                if block_size == 0 || block_size > 1024 {
                    return Err(bad("block_size", format!("{block_size} threads")));
                }
                OccupancySmem {
                    func,
                    num_blocks,
                    block_size,
                }
            }
            op::OCCUPANCY_CLUSTERS => {
                let func = r.u64()?;
                let grid = read_dim(&mut r)?;
                let block = read_dim(&mut r)?;
                let cluster = read_dim(&mut r)?;
                let shared_mem = r.u32()?;
                check_shape(grid, block, shared_mem)?;
                // A question, not a launch: any cluster the grid can hold
                // may be asked about (the driver answers for sizes it
                // cannot run).
                if cluster.count() > 1024 {
                    return Err(bad("cluster", format!("{cluster:?}")));
                }
                let potential = match r.u32()? {
                    0 => false,
                    1 => true,
                    v => return Err(bad("potential", format!("{v}"))),
                };
                OccupancyClusters {
                    func,
                    grid,
                    block,
                    shared_mem,
                    cluster,
                    potential,
                }
            }
            op::LINK => {
                let len = check_len("len", r.u64()?, MAX_IMAGE)?;
                if len == 0 {
                    return Err(bad("len", "nothing to link"));
                }
                Link { len }
            }
            op::LAUNCH => {
                let func = r.u64()?;
                let (grid, block, shared_mem) = read_shape(&mut r)?;
                let stream = r.u64()?;
                let cluster = read_dim(&mut r)?;
                check_cluster(grid, cluster)?;
                let flags = r.u32()?;
                if flags & !launch_flags::COOPERATIVE != 0 {
                    return Err(bad("flags", format!("unknown launch flags {flags:#x}")));
                }
                Launch {
                    func,
                    grid,
                    block,
                    shared_mem,
                    stream,
                    cluster,
                    flags,
                }
            }
            op::STREAM_CREATE => {
                let flags = r.u32()?;
                if flags > 1 {
                    return Err(bad("flags", format!("unknown stream flags {flags:#x}")));
                }
                let priority = r.u32()? as i32;
                if !(-64..=64).contains(&priority) {
                    return Err(bad("priority", format!("{priority}")));
                }
                StreamCreate { flags, priority }
            }
            op::STREAM_WAIT_EVENT => {
                let stream = r.u64()?;
                let event = r.u64()?;
                let flags = r.u32()?;
                if flags > 1 {
                    return Err(bad("flags", format!("unknown wait flags {flags:#x}")));
                }
                StreamWaitEvent {
                    stream,
                    event,
                    flags,
                }
            }
            op::FUNC_SET_ATTRIBUTE => {
                let func = r.u64()?;
                let attr = r.u32()?;
                let value = r.u32()? as i32;
                let ok = match attr {
                    8 => (0..=256 << 10).contains(&value),
                    9 => (-1..=100).contains(&value),
                    11..=13 => (0..=MAX_CLUSTER_BLOCKS as i32).contains(&value),
                    14 => (0..=1).contains(&value),
                    15 => (0..=2).contains(&value),
                    _ => {
                        return Err(bad(
                            "attr",
                            format!("function attribute {attr} is read-only"),
                        ))
                    }
                };
                if !ok {
                    return Err(bad(
                        "value",
                        format!("{value} for function attribute {attr}"),
                    ));
                }
                FuncSetAttribute { func, attr, value }
            }
            op::CTX_GET_LIMIT => CtxGetLimit {
                limit: check_len("limit", u64::from(r.u32()?), u64::from(MAX_LIMIT))? as u32,
            },
            op::CTX_SET_LIMIT => CtxSetLimit {
                limit: check_len("limit", u64::from(r.u32()?), u64::from(MAX_LIMIT))? as u32,
                value: check_len("value", r.u64()?, MAX_LEN)?,
            },
            op::STREAM_SET_ATTRIBUTE => {
                use crate::stream_attr::{StreamAttr, RAW_LEN};
                let stream = r.u64()?;
                let id = r.u32()?;
                let mut raw = [0u8; RAW_LEN];
                raw.copy_from_slice(r.bytes(RAW_LEN)?);
                StreamSetAttribute {
                    stream,
                    attr: StreamAttr::from_raw(id, &raw)?,
                }
            }
            op::STREAM_GET_ATTRIBUTE => {
                let stream = r.u64()?;
                let attr = r.u32()?;
                if !crate::stream_attr::id::ALL.contains(&attr) {
                    return Err(bad("attr", format!("unknown stream attribute {attr}")));
                }
                StreamGetAttribute { stream, attr }
            }
            op::STREAM_DESTROY => StreamDestroy { stream: r.u64()? },
            op::STREAM_SYNCHRONIZE => StreamSynchronize { stream: r.u64()? },
            op::STREAM_QUERY => StreamQuery { stream: r.u64()? },
            op::EVENT_CREATE => EventCreate { flags: r.u32()? },
            op::EVENT_DESTROY => EventDestroy { event: r.u64()? },
            op::EVENT_RECORD => EventRecord {
                event: r.u64()?,
                stream: r.u64()?,
            },
            op::EVENT_SYNCHRONIZE => EventSynchronize { event: r.u64()? },
            op::EVENT_QUERY => EventQuery { event: r.u64()? },
            op::EVENT_ELAPSED_TIME => EventElapsedTime {
                start: r.u64()?,
                end: r.u64()?,
            },
            op::VMM_RESERVE => {
                let size = check_vmm("size", r.u64()?)?;
                let align = r.u64()?;
                if align != 0 && (!align.is_power_of_two() || align > MAX_LEN) {
                    return Err(bad("align", format!("{align:#x}")));
                }
                let addr = match r.u64()? {
                    0 => 0,
                    a => check_vmm("addr", a)?,
                };
                // A hint within the user address space (47 bits), all of it.
                if addr.checked_add(size).is_none_or(|end| end > 1 << 47) {
                    return Err(bad("addr", format!("{addr:#x} + {size:#x} past 2^47")));
                }
                VmmReserve { size, align, addr }
            }
            op::VMM_ADDRESS_FREE => VmmAddressFree {
                ptr: check_vmm("ptr", r.u64()?)?,
                size: check_vmm("size", r.u64()?)?,
            },
            op::VMM_CREATE => {
                let size = check_vmm("size", r.u64()?)?;
                // CU_MEM_ALLOCATION_COMP_NONE or _GENERIC, nothing else.
                let compression = match r.u32()? {
                    c @ 0..=1 => c as u8,
                    c => {
                        return Err(bad(
                            "compression",
                            format!("{c} is no CUmemAllocationCompType"),
                        ))
                    }
                };
                VmmCreate { size, compression }
            }
            op::VMM_RELEASE => VmmRelease { handle: r.u64()? },
            op::VMM_MAP => {
                let (ptr, size) = (check_vmm("ptr", r.u64()?)?, check_vmm("size", r.u64()?)?);
                let offset = r.u64()?;
                if !offset.is_multiple_of(VMM_GRANULARITY) || offset > MAX_LEN {
                    return Err(bad("offset", format!("{offset:#x}")));
                }
                VmmMap {
                    ptr,
                    size,
                    offset,
                    handle: r.u64()?,
                }
            }
            op::VMM_UNMAP => VmmUnmap {
                ptr: check_vmm("ptr", r.u64()?)?,
                size: check_vmm("size", r.u64()?)?,
            },
            op::VMM_SET_ACCESS => {
                let (ptr, size) = (check_vmm("ptr", r.u64()?)?, check_vmm("size", r.u64()?)?);
                let flags = r.u32()?;
                if !matches!(flags, 1 | 3) {
                    return Err(bad("flags", format!("access flags {flags:#x}")));
                }
                VmmSetAccess { ptr, size, flags }
            }
            op::VMM_RETAIN => VmmRetain { ptr: r.u64()? },
            op::IPC_EXPORT => IpcExport { ptr: r.u64()? },
            op::IPC_OPEN => IpcOpen { token: r.u64()? },
            op::IPC_CLOSE => IpcClose { ptr: r.u64()? },
            op::IPC_EXPORT_EVENT => IpcExportEvent { event: r.u64()? },
            op::IPC_OPEN_EVENT => IpcOpenEvent { token: r.u64()? },
            op::VMM_EXPORT => VmmExport { handle: r.u64()? },
            op::VMM_IMPORT => VmmImport {
                token: nonzero("token", r.u64()?)?,
            },
            op::POOL_EXPORT => PoolExport {
                pool: nonzero("pool", r.u64()?)?,
            },
            op::POOL_IMPORT => PoolImport {
                token: nonzero("token", r.u64()?)?,
            },
            op::POOL_EXPORT_POINTER => PoolExportPointer {
                pool: nonzero("pool", r.u64()?)?,
                ptr: r.u64()?,
            },
            op::POOL_IMPORT_POINTER => PoolImportPointer {
                pool: nonzero("pool", r.u64()?)?,
                token: nonzero("token", r.u64()?)?,
            },
            op::ARRAY_CREATE => ArrayCreate {
                desc: array::ArrayDesc::read(&mut r)?,
            },
            op::ARRAY_DESTROY => ArrayDestroy { array: r.u64()? },
            op::ARRAY_COPY => ArrayCopy {
                copy: array::ArrayCopy::read(&mut r)?,
                stream: r.u64()?,
            },
            op::TEX_CREATE => TexCreate,
            op::TEX_DESTROY => TexDestroy { obj: r.u64()? },
            op::SURF_CREATE => SurfCreate { array: r.u64()? },
            op::SURF_DESTROY => SurfDestroy { obj: r.u64()? },
            op::VGPU_STATUS => VgpuStatus {
                first: check_len("first", u64::from(r.u32()?), MAX_STATUS_PROCESSES.into())? as u32,
            },
            other => return Err(ProtoError::UnknownOpcode(other)),
        };
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::super::samples::samples;
    use crate::*;
    use proptest::prelude::*;

    #[test]
    fn every_request_round_trips() {
        for r in samples() {
            let mut b = [0u8; INLINE];
            r.encode(&mut b);
            assert_eq!(Request::decode(r.opcode(), &b).unwrap(), r);
        }
    }

    #[test]
    fn invalid_fields_are_refused() {
        let enc = |r: Request| {
            let mut b = [0u8; INLINE];
            r.encode(&mut b);
            (r.opcode(), b)
        };
        let d = |x, y, z| Dim3 { x, y, z };
        let launch = |grid, block, shared_mem| Request::Launch {
            func: 1,
            grid,
            block,
            shared_mem,
            stream: 0,
            cluster: Dim3::default(),
            flags: 0,
        };
        for (opc, b) in [
            enc(Request::MemAlloc { size: 0 }),
            enc(Request::MemAlloc { size: MAX_LEN + 1 }),
            enc(Request::Memset {
                dst: 0,
                value: 0,
                width: 3,
                count: 1,
                stream: 0,
            }),
            enc(Request::ModuleLoad {
                kind: ImageKind::Ptx,
                len: 0,
            }),
            enc(Request::ModuleLoad {
                kind: ImageKind::Ptx,
                len: MAX_IMAGE + 1,
            }),
            enc(launch(d(0, 1, 1), d(1, 1, 1), 0)),
            enc(launch(d(1, 70_000, 1), d(1, 1, 1), 0)),
            enc(launch(d(1, 1, 1), d(1025, 1, 1), 0)),
            enc(launch(d(1, 1, 1), d(32, 32, 2), 0)),
            enc(launch(d(1, 1, 1), d(1, 1, 1), 1 << 20)),
            enc(Request::Launch {
                func: 1,
                grid: d(3, 1, 1),
                block: d(1, 1, 1),
                shared_mem: 0,
                stream: 0,
                cluster: d(2, 1, 1),
                flags: 0,
            }),
            enc(Request::Launch {
                func: 1,
                grid: d(32, 1, 1),
                block: d(1, 1, 1),
                shared_mem: 0,
                stream: 0,
                cluster: d(32, 1, 1),
                flags: 0,
            }),
            enc(Request::StreamCreate {
                flags: 2,
                priority: 0,
            }),
            enc(Request::FuncSetAttribute {
                func: 1,
                attr: 0,
                value: 1,
            }),
            enc(Request::FuncSetAttribute {
                func: 1,
                attr: 9,
                value: 101,
            }),
            enc(Request::CtxSetLimit { limit: 7, value: 0 }),
            enc(Request::VmmCreate {
                size: 0,
                compression: 0,
            }),
            enc(Request::VmmCreate {
                size: 4096,
                compression: 0,
            }),
            enc(Request::VmmImport { token: 0 }),
            enc(Request::PoolExport { pool: 0 }),
            enc(Request::PoolImport { token: 0 }),
            enc(Request::PoolExportPointer { pool: 0, ptr: 1 }),
            enc(Request::PoolImportPointer { pool: 1, token: 0 }),
            enc(Request::PoolImportPointer { pool: 0, token: 1 }),
            enc(Request::VmmCreate {
                size: (3 << 20) / 2,
                compression: 0,
            }),
            enc(Request::VmmCreate {
                size: !((2 << 20) - 1),
                compression: 0,
            }),
            enc(Request::VmmCreate {
                size: 2 << 20,
                compression: 2,
            }),
            enc(Request::VmmReserve {
                size: 2 << 20,
                align: 3 << 20,
                addr: 0,
            }),
            enc(Request::VmmReserve {
                size: 0,
                align: 0,
                addr: 0,
            }),
            enc(Request::VmmReserve {
                size: 2 << 20,
                align: 0,
                addr: 0x1000,
            }),
            enc(Request::VmmReserve {
                size: 2 << 20,
                align: 0,
                addr: 0xffff_ffff_ffe0_0000,
            }),
            enc(Request::VmmAddressFree {
                ptr: 0x1000,
                size: 2 << 20,
            }),
            enc(Request::VmmMap {
                ptr: 2 << 20,
                size: 2 << 20,
                offset: 4096,
                handle: 1,
            }),
            enc(Request::VmmMap {
                ptr: 0,
                size: 2 << 20,
                offset: 0,
                handle: 1,
            }),
            enc(Request::VmmUnmap {
                ptr: 2 << 20,
                size: 1,
            }),
            enc(Request::VmmSetAccess {
                ptr: 2 << 20,
                size: 2 << 20,
                flags: 2,
            }),
            enc(Request::VmmSetAccess {
                ptr: 2 << 20,
                size: 2 << 20,
                flags: 0,
            }),
            enc(Request::ArrayCreate {
                desc: array::ArrayDesc {
                    width: 64,
                    height: 0,
                    depth: 4,
                    format: 0x20,
                    channels: 1,
                    flags: 0,
                },
            }),
            enc(Request::ArrayCreate {
                desc: array::ArrayDesc {
                    width: 64,
                    height: 64,
                    depth: 0,
                    format: 0x21,
                    channels: 1,
                    flags: 0,
                },
            }),
            enc(Request::ArrayCopy {
                copy: array::ArrayCopy {
                    src: array::CopySide::Device {
                        ptr: 0x1000,
                        pitch: 8,
                        height: 4,
                    },
                    dst: array::CopySide::Array {
                        array: 1,
                        x: 0,
                        y: 0,
                        z: 0,
                    },
                    width: 16,
                    height: 4,
                    depth: 1,
                },
                stream: 0,
            }),
            enc(Request::ArrayCopy {
                copy: array::ArrayCopy {
                    src: array::CopySide::Device {
                        ptr: u64::MAX - 8,
                        pitch: 16,
                        height: 4,
                    },
                    dst: array::CopySide::Array {
                        array: 1,
                        x: 0,
                        y: 0,
                        z: 0,
                    },
                    width: 16,
                    height: 1,
                    depth: 1,
                },
                stream: 0,
            }),
            enc(Request::ArrayCopy {
                copy: array::ArrayCopy {
                    src: array::CopySide::Array {
                        array: 1,
                        x: 0,
                        y: 0,
                        z: 0,
                    },
                    dst: array::CopySide::Array {
                        array: 2,
                        x: 0,
                        y: 0,
                        z: 0,
                    },
                    width: 0,
                    height: 1,
                    depth: 1,
                },
                stream: 0,
            }),
        ] {
            assert!(
                matches!(Request::decode(opc, &b), Err(ProtoError::BadField { .. })),
                "{opc}"
            );
        }
        // Found by the fuzzer: a block whose thread count overflows u64.
        let huge = launch(d(1, 1, 1), d(u32::MAX, u32::MAX, 64), 0);
        let (opc, b) = enc(huge);
        assert!(matches!(
            Request::decode(opc, &b),
            Err(ProtoError::BadField { .. })
        ));
        let mut b = [0u8; INLINE];
        b[0] = 7;
        assert!(Request::decode(op::MODULE_LOAD, &b).is_err());
        // A process list past any region's channels.
        let mut b = [0u8; INLINE];
        b[..4].copy_from_slice(&(MAX_STATUS_PROCESSES + 1).to_le_bytes());
        assert!(matches!(
            Request::decode(op::VGPU_STATUS, &b),
            Err(ProtoError::BadField { field: "first", .. })
        ));
        // A stream attribute the host does not take, or a bad value.
        for (opc, attr) in [
            (op::STREAM_SET_ATTRIBUTE, 2u32),
            (op::STREAM_GET_ATTRIBUTE, 11),
        ] {
            let mut b = [0u8; INLINE];
            b[8..12].copy_from_slice(&attr.to_le_bytes());
            assert!(matches!(
                Request::decode(opc, &b),
                Err(ProtoError::BadField { field: "attr", .. })
            ));
        }
        let mut b = [0u8; INLINE];
        b[8..12].copy_from_slice(&stream_attr::id::ACCESS_POLICY_WINDOW.to_le_bytes());
        b[12 + 16..12 + 20].copy_from_slice(&2.0f32.to_le_bytes());
        assert!(matches!(
            Request::decode(op::STREAM_SET_ATTRIBUTE, &b),
            Err(ProtoError::BadField {
                field: "hit_ratio",
                ..
            })
        ));
        // An array copy with no array at either end.
        let b = [0u8; INLINE];
        assert!(Request::decode(op::ARRAY_COPY, &b).is_err());
        assert_eq!(
            Request::decode(9999, &b),
            Err(ProtoError::UnknownOpcode(9999))
        );
    }

    proptest! {
        #[test]
        fn decode_is_total(opcode in 0u32..120, bytes in proptest::collection::vec(any::<u8>(), INLINE)) {
            let mut b = [0u8; INLINE];
            b.copy_from_slice(&bytes);
            if let Ok(r) = Request::decode(opcode, &b) {
                let mut again = [0u8; INLINE];
                r.encode(&mut again);
                prop_assert_eq!(Request::decode(r.opcode(), &again).unwrap(), r);
            }
        }
    }
}
