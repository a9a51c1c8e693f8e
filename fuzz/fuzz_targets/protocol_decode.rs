//! Any opcode and inline payload: decoding never panics, and what decodes
//! re-encodes to the same request.
#![no_main]
use libfuzzer_sys::fuzz_target;
use protocol::{Request, INLINE};

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let opcode = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) % 128;
    let mut inline = [0u8; INLINE];
    let n = (data.len() - 4).min(INLINE);
    inline[..n].copy_from_slice(&data[4..4 + n]);
    if let Ok(req) = Request::decode(opcode, &inline) {
        // What the host's VMM table relies on: sizes and addresses are
        // nonzero multiples of the granularity, sizes bounded.
        let g = protocol::VMM_GRANULARITY;
        let granular = |v: u64| v != 0 && v.is_multiple_of(g);
        let size_ok = |v: u64| granular(v) && v <= protocol::MAX_LEN;
        match req {
            Request::VmmReserve { size, align, addr } => {
                assert!(size_ok(size) && (align == 0 || align.is_power_of_two()));
                assert!(addr == 0 || granular(addr));
                assert!(addr.checked_add(size).is_some_and(|e| e <= 1 << 47));
            }
            Request::VmmCreate { size, compression } => {
                assert!(size_ok(size) && compression <= protocol::VMM_COMPRESSION_GENERIC)
            }
            // What the shareable-handle tables rely on: 0 names nothing.
            Request::VmmImport { token }
            | Request::PoolExport { pool: token }
            | Request::PoolImport { token }
            | Request::PoolExportPointer { pool: token, .. } => assert!(token != 0),
            Request::PoolImportPointer { pool, token } => assert!(pool != 0 && token != 0),
            // What the conditional scopes rely on: the driver's two flags.
            Request::CondHandleCreate { flags, .. } => assert!(flags <= 1),
            Request::VmmAddressFree { ptr, size } | Request::VmmUnmap { ptr, size } => {
                assert!(granular(ptr) && size_ok(size))
            }
            Request::VmmMap {
                ptr, size, offset, ..
            } => assert!(granular(ptr) && size_ok(size) && offset.is_multiple_of(g)),
            Request::VmmSetAccess { ptr, size, flags } => {
                assert!(granular(ptr) && size_ok(size) && matches!(flags, 1 | 3))
            }
            // What the host's stream attributes rely on: a known attribute,
            // a window whose end is computable, its ratio in [0, 1].
            Request::StreamSetAttribute { attr, .. } => {
                use protocol::stream_attr::StreamAttr;
                assert!(protocol::stream_attr::id::ALL.contains(&attr.id()));
                if let StreamAttr::AccessPolicyWindow(w) = attr {
                    assert!((0.0..=1.0).contains(&f32::from_bits(w.hit_ratio_bits)));
                    assert!(w.hit_prop <= 2 && w.miss_prop <= 2);
                    assert!(w.base.checked_add(w.bytes).is_some() && w.bytes <= protocol::MAX_LEN);
                }
            }
            Request::StreamGetAttribute { attr, .. } => {
                assert!(protocol::stream_attr::id::ALL.contains(&attr))
            }
            // What the host's array checks rely on: a description within
            // the device's limits, a copy's box nonempty and every device
            // end's span computable and bounded.
            // What the worker's process list relies on.
            Request::VgpuStatus { first } => assert!(first <= protocol::MAX_STATUS_PROCESSES),
            Request::ArrayCreate { desc } => {
                assert!(desc.check().is_ok() && desc.bytes() <= protocol::MAX_LEN)
            }
            Request::ArrayCopy { copy, .. } => {
                let (w, h, d) = (copy.width, copy.height, copy.depth);
                assert!(w > 0 && h > 0 && d > 0);
                for side in [copy.src, copy.dst] {
                    if let protocol::array::CopySide::Device { .. } = side {
                        let (ptr, len) = side.span(w, h, d).expect("a device span");
                        assert!(len <= protocol::MAX_LEN && ptr.checked_add(len).is_some());
                    }
                }
            }
            _ => {}
        }
        let mut again = [0u8; INLINE];
        req.encode(&mut again);
        assert_eq!(Request::decode(req.opcode(), &again), Ok(req));
    }
});
