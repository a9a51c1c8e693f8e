//! Hand-written values of the requests that stood before the table
//! generated one of every row (tests only): the golden encodings and the
//! decode fingerprints (`golden.rs`) are pinned to these bytes, and the
//! round trip runs over them too. A new request needs none here: the
//! table generates its sample (`sample.rs`).

use crate::*;

/// One or more of each request that stood then, with fields off their
/// defaults.
pub(crate) fn samples() -> Vec<Request> {
    let d = |x, y, z| Dim3 { x, y, z };
    vec![
        Request::Hello { version: 1 },
        Request::Join { token: [7, 9] },
        Request::CtxSynchronize,
        Request::MemAlloc { size: 4096 },
        Request::MemFree { ptr: 0x7000_0000 },
        Request::MemGetInfo,
        Request::MemFreeAsync { ptr: 5, stream: 6 },
        Request::PinnedAlloc { size: 4096 },
        Request::PinnedFree { offset: 8192 },
        Request::MemcpyHtoDPinned {
            dst: 1,
            offset: 2,
            len: 3,
            stream: 4,
        },
        Request::MemcpyDtoHPinned {
            src: 1,
            offset: 2,
            len: 3,
            stream: 4,
        },
        Request::MemcpyHtoD {
            dst: 1,
            len: 2,
            stream: 3,
        },
        Request::MemcpyDtoH {
            src: 1,
            len: 2,
            stream: 3,
        },
        Request::MemcpyDtoD {
            dst: 1,
            src: 2,
            len: 3,
            stream: 4,
        },
        Request::Memset {
            dst: 1,
            value: 0xabcd,
            width: 2,
            count: 9,
            stream: 0,
        },
        Request::ModuleLoad {
            kind: ImageKind::Cubin,
            len: 100,
        },
        Request::ModuleUnload { module: 5 },
        Request::ModuleGetFunction { module: 5 },
        Request::ModuleFunctions {
            module: 5,
            first: 7,
        },
        Request::GraphInstantiate { len: 300 },
        Request::GraphLaunch { exec: 4, stream: 2 },
        Request::GraphDestroy { exec: 4 },
        Request::CondScopeCreate,
        Request::CondHandleCreate {
            scope: 3,
            default_value: 1,
            flags: 1,
        },
        Request::CondScopeDestroy { scope: 3 },
        Request::GraphInstantiateIn { scope: 3, len: 300 },
        Request::FuncGetAttribute { func: 5, attr: 4 },
        Request::Occupancy {
            func: 5,
            block_size: 256,
            shared_mem: 0,
        },
        Request::ModuleGetGlobal { module: 5 },
        Request::TensorMapEncode,
        Request::ModuleLoadCached {
            kind: ImageKind::Cubin,
            len: 1 << 20,
            hash: image_hash(b"an image"),
        },
        Request::OccupancySmem {
            func: 5,
            num_blocks: 4,
            block_size: 128,
        },
        Request::Link { len: 100 },
        Request::OccupancyClusters {
            func: 9,
            grid: d(64, 1, 1),
            block: d(128, 1, 1),
            shared_mem: 1024,
            cluster: d(4, 1, 1),
            potential: false,
        },
        Request::Launch {
            func: 9,
            grid: d(100, 2, 1),
            block: d(256, 1, 1),
            shared_mem: 0,
            stream: 7,
            cluster: d(2, 2, 1),
            flags: launch_flags::COOPERATIVE,
        },
        Request::StreamCreate {
            flags: 1,
            priority: -3,
        },
        Request::StreamWaitEvent {
            stream: 2,
            event: 3,
            flags: 0,
        },
        Request::HostFn { stream: 2, id: 9 },
        Request::WaitHostFn,
        Request::HostFnDone { id: 9 },
        Request::TakeOutput,
        Request::FuncSetAttribute {
            func: 5,
            attr: 8,
            value: 100_000,
        },
        Request::CtxGetLimit { limit: 1 },
        Request::CtxSetLimit {
            limit: 2,
            value: 1 << 26,
        },
        Request::StreamSetAttribute {
            stream: 2,
            attr: stream_attr::StreamAttr::AccessPolicyWindow(stream_attr::AccessPolicyWindow {
                base: 0x7f00_0000_0000,
                bytes: 4 << 20,
                hit_ratio_bits: 0.75f32.to_bits(),
                hit_prop: 2,
                miss_prop: 1,
            }),
        },
        Request::StreamSetAttribute {
            stream: 0,
            attr: stream_attr::StreamAttr::Priority(-2),
        },
        Request::StreamGetAttribute { stream: 2, attr: 8 },
        Request::StreamDestroy { stream: 2 },
        Request::StreamSynchronize { stream: 2 },
        Request::StreamQuery { stream: 2 },
        Request::EventCreate { flags: 0 },
        Request::EventDestroy { event: 3 },
        Request::EventRecord {
            event: 3,
            stream: 2,
        },
        Request::EventSynchronize { event: 3 },
        Request::EventQuery { event: 3 },
        Request::EventElapsedTime { start: 3, end: 4 },
        Request::VmmReserve {
            size: 4 << 20,
            align: 1 << 30,
            addr: 0,
        },
        Request::VmmReserve {
            size: 4 << 20,
            align: 0,
            addr: 0x7e00_0000_0000,
        },
        Request::VmmAddressFree {
            ptr: 0x7f00_0000_0000,
            size: 2 << 20,
        },
        Request::VmmCreate {
            size: 6 << 20,
            compression: 0,
        },
        Request::VmmCreate {
            size: 2 << 20,
            compression: crate::VMM_COMPRESSION_GENERIC,
        },
        Request::VmmRelease { handle: 9 },
        Request::VmmMap {
            ptr: 0x7f00_0020_0000,
            size: 2 << 20,
            offset: 2 << 20,
            handle: 9,
        },
        Request::VmmUnmap {
            ptr: 0x7f00_0020_0000,
            size: 2 << 20,
        },
        Request::VmmSetAccess {
            ptr: 0x7f00_0020_0000,
            size: 2 << 20,
            flags: 3,
        },
        Request::VmmRetain {
            ptr: 0x7f00_0020_0010,
        },
        Request::IpcExport {
            ptr: 0x7f00_0020_0010,
        },
        Request::IpcOpen {
            token: 0x1234_5678_9abc_def0,
        },
        Request::IpcClose {
            ptr: 0x7f00_0020_0000,
        },
        Request::IpcExportEvent { event: 17 },
        Request::IpcOpenEvent { token: 0xfeed_beef },
        Request::VmmExport { handle: 9 },
        Request::VmmImport { token: 0xfeed_beef },
        Request::PoolExport { pool: 0x5555_0000 },
        Request::PoolImport { token: 0xbeef },
        Request::PoolExportPointer {
            pool: 0xbeef,
            ptr: 0x7f00_0020_0010,
        },
        Request::PoolImportPointer {
            pool: 0xbeef,
            token: 0xfeed,
        },
        Request::ArrayCreate {
            desc: array::ArrayDesc {
                width: 64,
                height: 32,
                depth: 4,
                format: 0x20,
                channels: 2,
                flags: array::SURFACE_LDST,
            },
        },
        Request::ArrayDestroy { array: 3 },
        Request::ArrayCopy {
            copy: array::ArrayCopy {
                src: array::CopySide::Device {
                    ptr: 0x7000_0000,
                    pitch: 512,
                    height: 32,
                },
                dst: array::CopySide::Array {
                    array: 3,
                    x: 8,
                    y: 1,
                    z: 2,
                },
                width: 256,
                height: 4,
                depth: 2,
            },
            stream: 5,
        },
        Request::ArrayCopy {
            copy: array::ArrayCopy {
                src: array::CopySide::Array {
                    array: 3,
                    x: 0,
                    y: 0,
                    z: 0,
                },
                dst: array::CopySide::Array {
                    array: 4,
                    x: 16,
                    y: 0,
                    z: 0,
                },
                width: 16,
                height: 1,
                depth: 1,
            },
            stream: 0,
        },
        Request::TexCreate,
        Request::TexDestroy { obj: 0x1_0000_0001 },
        Request::SurfCreate { array: 3 },
        Request::SurfDestroy { obj: 2 },
        Request::VgpuStatus { first: 3 },
    ]
}
