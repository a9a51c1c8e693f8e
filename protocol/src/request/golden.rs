//! Golden tests of the wire format: the bytes every sample request encodes
//! to, and a fingerprint, per opcode, of what `decode` answers to a few
//! thousand payloads (valid ones, each byte and word of them mutated, and
//! pseudo-random ones): the requests it accepts, re-encoded, and the
//! errors (field and text) it gives. The tables below were taken from the
//! encoder and decoder as they stood before the request table replaced
//! them; a change to either must show up here. (A request added since
//! needs no entry: its row defines it; one may be added to keep it so.)

use super::samples::samples;
use super::tests::generated;
use crate::*;
use sha2::Digest;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A payload's hex with its trailing zero bytes left off.
fn trimmed(b: &[u8; INLINE]) -> String {
    let end = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    hex(&b[..end])
}

fn encoded(r: &Request) -> [u8; INLINE] {
    let mut b = [0u8; INLINE];
    r.encode(&mut b);
    b
}

/// What `decode` answers, in a form that changes with any accepted field,
/// any refusal's field or text, and the accepted request's flags.
fn answer(opcode: u32, b: &[u8; INLINE]) -> String {
    match Request::decode(opcode, b) {
        Ok(r) => format!(
            "ok {} {} {} {} {:?}",
            trimmed(&encoded(&r)),
            r.opcode(),
            r.expects_reply(),
            r.unnumbered(),
            r.data_len()
        ),
        Err(e) => format!("err {e:?}"),
    }
}

const U32S: [u32; 28] = [
    0,
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    9,
    11,
    15,
    16,
    17,
    64,
    65,
    100,
    101,
    1024,
    1025,
    2048,
    2049,
    65_535,
    65_536,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    (-64i32).cast_unsigned(),
    (-65i32).cast_unsigned(),
];
const U64S: [u64; 16] = [
    0,
    1,
    2 << 20,
    3 << 20,
    4 << 20,
    1 << 30,
    MAX_IMAGE,
    MAX_IMAGE + 1,
    MAX_LEN,
    MAX_LEN + 1,
    (1 << 47) - (2 << 20),
    1 << 47,
    u64::MAX,
    u64::MAX - (2 << 20) + 1,
    0x7f00_0020_0000,
    0x1_0000_0000,
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The payloads an opcode's fingerprint is taken over.
fn payloads(opcode: u32) -> Vec<[u8; INLINE]> {
    let mut bases = vec![[0u8; INLINE]];
    bases.extend(
        samples()
            .iter()
            .filter(|r| r.opcode() == opcode)
            .map(encoded),
    );
    let mut out = Vec::new();
    for base in &bases {
        out.push(*base);
        for i in 0..INLINE {
            for v in [0, 1, 2, 3, 4, 0x7f, 0x80, 0xff, base[i] ^ 1, base[i] ^ 0x80] {
                let mut b = *base;
                b[i] = v;
                out.push(b);
            }
        }
        for at in (0..INLINE).step_by(4) {
            for v in U32S {
                let mut b = *base;
                b[at..at + 4].copy_from_slice(&v.to_le_bytes());
                out.push(b);
            }
            for v in U64S.iter().filter(|_| at + 8 <= INLINE) {
                let mut b = *base;
                b[at..at + 8].copy_from_slice(&v.to_le_bytes());
                out.push(b);
            }
        }
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ u64::from(opcode));
    for n in 0..600 {
        let mut b = bases[n % bases.len()];
        for at in (0..INLINE).step_by(4) {
            let x = rng.next();
            let word = match x % 4 {
                // Bits 8..32 of x; a word of U32S picked by x's upper bits.
                0 => u32::try_from((x >> 8) & 0xff_ffff).unwrap(),
                1 => U32S[usize::try_from((x >> 8) % U32S.len() as u64).unwrap()],
                _ => continue,
            };
            b[at..at + 4].copy_from_slice(&word.to_le_bytes());
        }
        out.push(b);
    }
    out
}

fn fingerprint(opcode: u32) -> String {
    let mut h = sha2::Sha256::new();
    for b in payloads(opcode) {
        h.update(answer(opcode, &b).as_bytes());
        h.update(b"\n");
    }
    hex(&h.finalize()[..8])
}

/// Each sample's opcode and payload (trailing zeros left off).
const ENCODINGS: &[(u32, &str)] = &[
    (1, "01"),
    (5, "070000000000000009"),
    (2, ""),
    (10, "0010"),
    (11, "00000070"),
    (12, ""),
    (17, "050000000000000006"),
    (18, "0010"),
    (19, "0020"),
    (6, "01000000000000000200000000000000030000000000000004"),
    (7, "01000000000000000200000000000000030000000000000004"),
    (13, "0100000000000000020000000000000003"),
    (14, "0100000000000000020000000000000003"),
    (15, "01000000000000000200000000000000030000000000000004"),
    (16, "0100000000000000cdab00000200000009"),
    (20, "0100000064"),
    (21, "05"),
    (22, "05"),
    (92, "050000000000000007"),
    (93, "2c01"),
    (94, "040000000000000002"),
    (95, "04"),
    (97, ""),
    (98, "03000000000000000100000001"),
    (99, "03"),
    (101, "03000000000000002c01"),
    (23, "050000000000000004"),
    (24, "05000000000000000001"),
    (25, "05"),
    (90, ""),
    (91, "010000000000100000000000a5df3fde7b200c3fa2791144c7e05c5c2bced4c6ad863d3a4cf76c972c1712f9"),
    (28, "05000000000000000400000080"),
    (26, "64"),
    (29, "09000000000000004000000001000000010000008000000001000000010000000400000001000000010000000004"),
    (30, "090000000000000064000000020000000100000000010000010000000100000000000000070000000000000002000000020000000100000001"),
    (40, "01000000fdffffff"),
    (44, "020000000000000003"),
    (45, "020000000000000009"),
    (46, ""),
    (47, "09"),
    (48, ""),
    (27, "050000000000000008000000a08601"),
    (3, "01"),
    (4, "0200000000000004"),
    (56, "02000000000000000100000000000000007f000000004000000000000000403f0200000001"),
    (56, "000000000000000008000000feffffff"),
    (57, "020000000000000008"),
    (41, "02"),
    (42, "02"),
    (43, "02"),
    (50, ""),
    (51, "03"),
    (52, "030000000000000002"),
    (53, "03"),
    (54, "03"),
    (55, "030000000000000004"),
    (80, "000040000000000000000040"),
    (80, "0000400000000000000000000000000000000000007e"),
    (81, "00000000007f0000000020"),
    (82, "000060"),
    (82, "000020000000000001"),
    (83, "09"),
    (84, "00002000007f00000000200000000000000020000000000009"),
    (85, "00002000007f0000000020"),
    (86, "00002000007f0000000020000000000003"),
    (87, "10002000007f"),
    (60, "10002000007f"),
    (61, "f0debc9a78563412"),
    (62, "00002000007f"),
    (63, "11"),
    (64, "efbeedfe"),
    (88, "09"),
    (89, "efbeedfe"),
    (65, "00005555"),
    (66, "efbe"),
    (67, "efbe00000000000010002000007f"),
    (68, "efbe000000000000edfe"),
    (70, "400000002000000004000000200000000200000002"),
    (71, "03"),
    (72, "0200000000000070000000000002000000000000200000000000000003000000000000000800000001000000020000000000000000010000040000000200000005"),
    (72, "03000000030000000000000000000000000000000000000000000000040000000000000010000000000000000000000000000000100000000100000001"),
    (73, ""),
    (74, "0100000001"),
    (75, "03"),
    (76, "02"),
    (96, "03"),
];

/// Each known opcode's fingerprint.
const FINGERPRINTS: &[(u32, &str)] = &[
    (1, "3a67799816e5a930"),
    (2, "ba4589fc07071d1e"),
    (3, "3601f66f826acca8"),
    (4, "d45293a91b4e04f5"),
    (5, "a4c89335bb253cb3"),
    (6, "4a5e14b23affcc37"),
    (7, "6f9e161309327307"),
    (10, "9b4145f3881a87a4"),
    (11, "8dd51361957899a8"),
    (12, "1b3108bf51f75ea0"),
    (13, "218052f3b09c724d"),
    (14, "98c58ad64782a992"),
    (15, "4d8d7ec73d9e0c0b"),
    (16, "e7eec3f7c7ea1ae7"),
    (17, "8cc6fa249cabc2e0"),
    (18, "233e860be0c28ba3"),
    (19, "06c88d79b98c6e1c"),
    (20, "a210259284a982dd"),
    (21, "9144c59ce9103e8d"),
    (22, "e9aa7380d3d0ce59"),
    (23, "99a1c11d9df558b4"),
    (24, "3c9468e5510d0cf7"),
    (25, "daba66300a7a7540"),
    (26, "415cacab7656b986"),
    (27, "3c7b62970b9f4ccd"),
    (28, "f25999018fdd9d6d"),
    (29, "2a2a1bfafe143aa6"),
    (30, "21edf1a845684d66"),
    (40, "bb9c2714b5eab59d"),
    (41, "483ac1c37ce8c482"),
    (42, "d9a05146d9ae21f0"),
    (43, "05ee2c79054e3eaf"),
    (44, "48d5c8ef1e6050ff"),
    (45, "a1676e349577bd80"),
    (46, "4cd4bfbbe1858cd2"),
    (47, "c736b067798c355b"),
    (48, "683796634897ad3e"),
    (50, "66d23bbd2619a79f"),
    (51, "190791a65f6449a0"),
    (52, "b3bc55d821bb36c7"),
    (53, "9726809172e826be"),
    (54, "1bb539c8b44f6ea8"),
    (55, "a0510d618611196d"),
    (56, "692ad5faa53838e5"),
    (57, "d22886d92016ee10"),
    (60, "56f11f7e9020ae30"),
    (61, "6f398d0e1b2c1100"),
    (62, "9f9b86157285bb43"),
    (63, "4b15c598558e5a21"),
    (64, "453a7dc602d1aeaf"),
    (65, "4703ac435675d966"),
    (66, "016e136697d69d5a"),
    (67, "7fadcbdce4325287"),
    (68, "6e4d614cd6542470"),
    (70, "c6a76e41b310927e"),
    (71, "0871b669f0e539c1"),
    (72, "463521a8a82a6fdb"),
    (73, "51e1e38b294a2564"),
    (74, "0ad6b62eeb8e95fc"),
    (75, "6059525f8e55f1e6"),
    (76, "2844e0ee726f90b9"),
    (80, "7ec2273af06d187f"),
    (81, "8fa6d59f6dabdf7e"),
    (82, "e373b21335d78a34"),
    (83, "1ef263c03619507a"),
    (84, "882e7da5507a7c9c"),
    (85, "ef3c6ee223f759e6"),
    (86, "1ca18d2371457e68"),
    (87, "bcc373f80ffe6690"),
    (88, "4d89c8e8cb107cf5"),
    (89, "b6e2546ade08c69b"),
    (90, "aab930e458cdb142"),
    (91, "d89f50db6bcc1c09"),
    (92, "218245423fdb998b"),
    (93, "4e16223a0bb00877"),
    (94, "0e8454604c7d4130"),
    (95, "2c821e4886e2c283"),
    (96, "2f0e63c093c0eb5e"),
    (97, "f2719e438a2a4bf4"),
    (98, "a6620015fa0c3a4a"),
    (99, "a4e602e88213273f"),
    (101, "3c4e5b83dd7d07ad"),
];

#[test]
fn every_sample_encodes_as_before() {
    // A request added since has samples of an opcode not listed here.
    let listed = |o: &u32| ENCODINGS.iter().any(|&(l, _)| l == *o);
    let got: Vec<(u32, String)> = samples()
        .iter()
        .map(|r| (r.opcode(), trimmed(&encoded(r))))
        .filter(|(o, _)| listed(o))
        .collect();
    let want: Vec<(u32, String)> = ENCODINGS.iter().map(|&(o, s)| (o, s.into())).collect();
    assert_eq!(got, want);
}

#[test]
fn decode_answers_as_before() {
    let listed = |o: u32| FINGERPRINTS.iter().any(|&(l, _)| l == o);
    for &(opcode, want) in FINGERPRINTS {
        assert_eq!(fingerprint(opcode), want, "opcode {opcode}");
    }
    // Every other opcode is still unknown, unless a request added since
    // took it (and so has a sample).
    for opcode in (0..128).filter(|&o| !listed(o)) {
        let added = generated().iter().any(|r| r.opcode() == opcode);
        assert!(
            added
                || payloads(opcode)
                    .iter()
                    .all(|b| Request::decode(opcode, b) == Err(ProtoError::UnknownOpcode(opcode))),
            "opcode {opcode}"
        );
    }
}

#[test]
fn every_opcode_has_a_sample() {
    for opcode in 0..128 {
        let known = !matches!(
            Request::decode(opcode, &[0xff; INLINE]),
            Err(ProtoError::UnknownOpcode(_))
        );
        // The table generates one of every request (`sample.rs`); a new
        // row needs no hand-written sample.
        let sampled = generated().iter().any(|r| r.opcode() == opcode);
        assert_eq!(known, sampled, "opcode {opcode}");
    }
}

#[test]
fn device_flags_are_as_before() {
    // The worker's lists before they moved into the table.
    let needs = [
        op::LAUNCH,
        op::MEMCPY_HTOD,
        op::MEMCPY_DTOH,
        op::MEMCPY_DTOD,
        op::MEMSET,
        op::DATA,
        op::EVENT_RECORD,
        op::STREAM_WAIT_EVENT,
        op::MEM_FREE_ASYNC,
        op::HOST_FN,
        op::MEMCPY_HTOD_PINNED,
        op::MEMCPY_DTOH_PINNED,
        op::GRAPH_LAUNCH,
        op::ARRAY_COPY,
    ];
    let drains = [
        op::CTX_SYNCHRONIZE,
        op::STREAM_SYNCHRONIZE,
        op::EVENT_SYNCHRONIZE,
        op::MEMCPY_DTOH,
    ];
    // A request added since sets its own flags in its row.
    let added = |o: u32| {
        !FINGERPRINTS.iter().any(|&(l, _)| l == o) && generated().iter().any(|r| r.opcode() == o)
    };
    for opcode in (0..256).filter(|&o| !added(o)) {
        assert_eq!(
            op::needs_device(opcode),
            needs.contains(&opcode),
            "{opcode}"
        );
        assert_eq!(
            op::drains_device(opcode),
            drains.contains(&opcode),
            "{opcode}"
        );
    }
}

#[test]
fn families_are_as_before() {
    // The worker's routing before the families moved into the table.
    let families: &[(Family, &[u32])] = &[
        (
            Family::Session,
            &[op::HELLO, op::JOIN, op::TAKE_OUTPUT, op::VGPU_STATUS],
        ),
        (
            Family::Stream,
            &[
                op::CTX_SYNCHRONIZE,
                op::STREAM_CREATE,
                op::STREAM_WAIT_EVENT,
                op::CTX_GET_LIMIT,
                op::CTX_SET_LIMIT,
                op::STREAM_SET_ATTRIBUTE,
                op::STREAM_GET_ATTRIBUTE,
                op::STREAM_DESTROY,
                op::STREAM_SYNCHRONIZE,
                op::STREAM_QUERY,
                op::EVENT_CREATE,
                op::EVENT_DESTROY,
                op::EVENT_RECORD,
                op::EVENT_SYNCHRONIZE,
                op::EVENT_QUERY,
                op::EVENT_ELAPSED_TIME,
            ],
        ),
        (
            Family::Memory,
            &[
                op::MEM_ALLOC,
                op::MEM_FREE,
                op::MEM_FREE_ASYNC,
                op::MEM_GET_INFO,
                op::PINNED_ALLOC,
                op::PINNED_FREE,
                op::MEMCPY_HTOD_PINNED,
                op::MEMCPY_DTOH_PINNED,
                op::MEMCPY_HTOD,
                op::MEMCPY_DTOH,
                op::MEMCPY_DTOD,
                op::MEMSET,
            ],
        ),
        (
            Family::Module,
            &[
                op::MODULE_LOAD,
                op::MODULE_UNLOAD,
                op::MODULE_GET_FUNCTION,
                op::FUNC_GET_ATTRIBUTE,
                op::OCCUPANCY,
                op::OCCUPANCY_SMEM,
                op::OCCUPANCY_CLUSTERS,
                op::TENSOR_MAP_ENCODE,
                op::MODULE_LOAD_CACHED,
                op::MODULE_FUNCTIONS,
                op::MODULE_GET_GLOBAL,
                op::LINK,
                op::FUNC_SET_ATTRIBUTE,
            ],
        ),
        (
            Family::Graph,
            &[
                op::GRAPH_INSTANTIATE,
                op::GRAPH_LAUNCH,
                op::GRAPH_DESTROY,
                op::COND_SCOPE_CREATE,
                op::COND_HANDLE_CREATE,
                op::COND_SCOPE_DESTROY,
                op::GRAPH_INSTANTIATE_IN,
            ],
        ),
        (
            Family::Launch,
            &[op::LAUNCH, op::HOST_FN, op::WAIT_HOST_FN, op::HOST_FN_DONE],
        ),
        (
            Family::Vmm,
            &[
                op::VMM_RESERVE,
                op::VMM_ADDRESS_FREE,
                op::VMM_CREATE,
                op::VMM_RELEASE,
                op::VMM_MAP,
                op::VMM_UNMAP,
                op::VMM_SET_ACCESS,
                op::VMM_RETAIN,
            ],
        ),
        (
            Family::Ipc,
            &[
                op::IPC_EXPORT,
                op::IPC_OPEN,
                op::IPC_CLOSE,
                op::IPC_EXPORT_EVENT,
                op::IPC_OPEN_EVENT,
            ],
        ),
        (
            Family::Share,
            &[
                op::VMM_EXPORT,
                op::VMM_IMPORT,
                op::POOL_EXPORT,
                op::POOL_IMPORT,
                op::POOL_EXPORT_POINTER,
                op::POOL_IMPORT_POINTER,
            ],
        ),
        (
            Family::Arrays,
            &[
                op::ARRAY_CREATE,
                op::ARRAY_DESTROY,
                op::ARRAY_COPY,
                op::TEX_CREATE,
                op::TEX_DESTROY,
                op::SURF_CREATE,
                op::SURF_DESTROY,
            ],
        ),
    ];
    // A request added since names its own family in its row.
    for r in generated() {
        if let Some(&(want, _)) = families
            .iter()
            .find(|(_, codes)| codes.contains(&r.opcode()))
        {
            assert_eq!(r.family(), want, "{r:?}");
        }
    }
    let listed: usize = families.iter().map(|(_, codes)| codes.len()).sum();
    assert_eq!(listed, 82, "every request that stood then");
}
