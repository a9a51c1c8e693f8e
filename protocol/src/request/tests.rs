//! Round trips, refusals and totality of the decoder.

use super::samples::samples;
use super::table::generated_samples;
use crate::*;
use proptest::prelude::*;

/// The generated request of every row (see `sample.rs`).
pub(super) fn generated() -> Vec<Request> {
    generated_samples()
        .into_iter()
        .map(|(name, _, r)| r.unwrap_or_else(|| panic!("{name}: no sample passes its checks")))
        .collect()
}

#[test]
fn every_request_round_trips() {
    for r in samples().into_iter().chain(generated()) {
        let mut b = [0u8; INLINE];
        r.encode(&mut b);
        assert_eq!(Request::decode(r.opcode(), &b), Ok(r.clone()), "{r:?}");
    }
}

#[test]
fn every_row_has_a_generated_sample() {
    let all = generated_samples();
    for (name, _, r) in &all {
        assert!(r.is_some(), "{name}: no sample passes its checks");
    }
    // One per row, each with its own opcode.
    let mut codes: Vec<u32> = generated().iter().map(Request::opcode).collect();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), all.len());
}

#[test]
fn generated_samples_are_off_the_defaults() {
    // A request with fields is not the one its row decodes from zeros
    // (every field at its default); one without encodes to zeros.
    for (name, fields, r) in generated_samples() {
        let r = r.unwrap_or_else(|| panic!("{name}: no sample"));
        let mut b = [0u8; INLINE];
        r.encode(&mut b);
        if fields.is_empty() {
            assert_eq!(b, [0u8; INLINE], "{name}");
            continue;
        }
        assert_ne!(Request::decode(r.opcode(), &[0u8; INLINE]), Ok(r), "{name}");
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
