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
        let mut again = [0u8; INLINE];
        req.encode(&mut again);
        assert_eq!(Request::decode(req.opcode(), &again), Ok(req));
    }
});
