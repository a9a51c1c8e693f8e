//! The runtime's integrity check: `cudart` asks the driver for a
//! 16-byte answer three times at start-up, recomputes it itself and refuses
//! to run (`cudaErrorSoftwareValidityNotEstablished`) if they differ.
//!
//! For versions ending in 0 and 1 the answers are constants; otherwise the
//! answer is HMAC-MD2 (RFC 1319 MD2, RFC 2104 HMAC with 16-byte blocks)
//! under a fixed key, of a record of the driver version, the version asked,
//! the process and thread, the addresses of two export tables and of the
//! check function, the time the runtime passes, and each device's UUID and
//! PCI location (as this library reports them).

/// MD2's substitution table (RFC 1319, from the digits of pi).
const S: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2 of `msg`.
pub(crate) fn md2(msg: &[u8]) -> [u8; 16] {
    let pad = 16 - msg.len() % 16;
    let mut m = msg.to_vec();
    m.extend(std::iter::repeat_n(pad as u8, pad));
    let mut checksum = [0u8; 16];
    let mut l = 0u8;
    for block in m.chunks_exact(16) {
        for (c, &b) in checksum.iter_mut().zip(block) {
            *c ^= S[usize::from(b ^ l)];
            l = *c;
        }
    }
    m.extend_from_slice(&checksum);
    let mut x = [0u8; 48];
    for block in m.chunks_exact(16) {
        for j in 0..16 {
            x[16 + j] = block[j];
            x[32 + j] = block[j] ^ x[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for v in x.iter_mut() {
                *v ^= S[usize::from(t)];
                t = *v;
            }
            t = t.wrapping_add(round);
        }
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&x[..16]);
    out
}

/// HMAC-MD2 of `msg` under `key` (one 16-byte block).
pub(crate) fn hmac_md2(key: &[u8; 16], msg: &[u8]) -> [u8; 16] {
    let mut inner: Vec<u8> = key.iter().map(|k| k ^ 0x36).collect();
    inner.extend_from_slice(msg);
    let mut outer: Vec<u8> = key.iter().map(|k| k ^ 0x5c).collect();
    outer.extend_from_slice(&md2(&inner));
    md2(&outer)
}

const KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

/// What the check hashes besides the version and the time.
pub(crate) struct Inputs {
    pub driver_version: u32,
    pub pid: u32,
    /// The low 32 bits of `pthread_self()`.
    pub thread: u32,
    pub cudart_table: u64,
    pub integrity_table: u64,
    pub check_fn: u64,
    /// Per device: UUID, PCI domain, bus and device.
    pub devices: Vec<([u8; 16], i32, i32, i32)>,
}

/// The answer for `version` at `unix_seconds`, as two little-endian words.
pub(crate) fn answer(version: u32, unix_seconds: u64, i: &Inputs) -> [u64; 2] {
    match version % 10 {
        0 => [0x3341_181c_03cb_675c, 0x8ed3_83aa_1f4c_d1e8],
        1 => [0x1841_181c_03cb_675c, 0x8ed3_83aa_1f4c_d1e8],
        _ => {
            let mut m = Vec::with_capacity(48 + 28 * i.devices.len());
            for w in [i.driver_version, version, i.pid, i.thread] {
                m.extend_from_slice(&w.to_le_bytes());
            }
            for w in [i.cudart_table, i.integrity_table, i.check_fn, unix_seconds] {
                m.extend_from_slice(&w.to_le_bytes());
            }
            for (uuid, domain, bus, dev) in &i.devices {
                m.extend_from_slice(uuid);
                for v in [domain, bus, dev] {
                    m.extend_from_slice(&v.to_le_bytes());
                }
            }
            let h = hmac_md2(&KEY, &m);
            let word = |k: usize| u64::from_le_bytes(h[k..k + 8].try_into().unwrap_or_default());
            [word(0), word(8)]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md2_matches_rfc_1319() {
        let hex = |b: [u8; 16]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(hex(md2(b"")), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(hex(md2(b"abc")), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(
            hex(md2(b"abcdefghijklmnopqrstuvwxyz")),
            "4e8ddff3650292ab5a4108c3aa47940b"
        );
    }

    /// Values the real driver (580.159.04, H100) answered for these inputs.
    #[test]
    fn answers_match_the_driver() {
        let uuid = [
            0x78, 0x8b, 0x97, 0xc5, 0x39, 0x0c, 0xfd, 0xbc, 0xe5, 0xd2, 0xa0, 0x75, 0x57, 0xcd,
            0x64, 0x5d,
        ];
        let i = Inputs {
            driver_version: 13000,
            pid: 466,
            thread: 0x7f46_d462_3140_u64 as u32,
            cudart_table: 0x7f46_d393_9680,
            integrity_table: 0x7f46_d393_9660,
            check_fn: 0x7f46_ce29_8350,
            devices: vec![(uuid, 0, 0, 6)],
        };
        assert_eq!(
            answer(12082, 1_795_378_483, &i),
            [0x727d_50e3_de4b_0014, 0xf9cc_9e48_65b5_e762]
        );
        assert_eq!(
            answer(13002, 1_795_378_483, &i),
            [0xe0f1_f323_0c4f_2036, 0x1970_4512_1fd0_045b]
        );
        assert_eq!(answer(13000, 5, &i)[0], 0x3341_181c_03cb_675c);
    }
}
