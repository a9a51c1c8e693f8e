use super::*;
use std::io::Seek;

fn lane(slot: u32, bytes: &[u8]) -> Lane {
    let stream = memfd("t").unwrap();
    File::from(stream.try_clone().unwrap())
        .write_all(bytes)
        .unwrap();
    Lane {
        slot,
        stream,
        len: bytes.len() as u64,
    }
}

fn contents(l: &Lane) -> Vec<u8> {
    let mut f = File::from(l.stream.try_clone().unwrap());
    f.rewind().unwrap();
    let mut v = Vec::new();
    f.read_to_end(&mut v).unwrap();
    v
}

const LIMITS: FileLimits = FileLimits {
    slots: 8,
    lane_bytes: 1 << 20,
    region: 0,
};

fn saved(vm: &str, lanes: Vec<Lane>) -> Saved {
    Saved {
        vm: vm.to_owned(),
        region: None,
        lanes,
    }
}

fn written(test: &str, key: Option<&[u8]>) -> (PathBuf, PathBuf) {
    let dir = scratch::dir(&format!("save-{test}-{}", key.is_some()));
    let path = dir.join("vm1.fvgpu");
    let lanes = vec![lane(0, b"first stream"), lane(3, &[7u8; 70_000])];
    let n = write(&path, &saved("vm1", lanes), key, false).unwrap();
    assert_eq!(n, std::fs::metadata(&path).unwrap().len());
    (dir, path)
}

#[test]
fn lanes_come_back_as_written() {
    for key in [None, Some(&b"0123456789abcdef"[..])] {
        let (_d, path) = written("back", key);
        let lanes = read(&path, "vm1", key, LIMITS).unwrap().lanes;
        assert_eq!(lanes.len(), 2);
        assert_eq!(
            (lanes[0].slot, contents(&lanes[0])),
            (0, b"first stream".to_vec())
        );
        assert_eq!((lanes[1].slot, contents(&lanes[1])), (3, vec![7u8; 70_000]));
    }
}

#[test]
fn an_existing_file_is_never_written_over() {
    let (_d, path) = written("over", None);
    let before = std::fs::read(&path).unwrap();
    let e = write(&path, &saved("vm1", vec![lane(0, b"other")]), None, false).unwrap_err();
    assert!(matches!(e, FileError::Io { .. }), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn a_file_replaced_is_whole_and_new() {
    let (_d, path) = written("replace", None);
    let n = write(&path, &saved("vm1", vec![lane(2, b"later")]), None, true).unwrap();
    assert_eq!(n, std::fs::metadata(&path).unwrap().len());
    let lanes = read(&path, "vm1", None, LIMITS).unwrap().lanes;
    assert_eq!(
        (lanes.len(), lanes[0].slot, contents(&lanes[0])),
        (1, 2, b"later".to_vec())
    );
    let dir = path.parent().unwrap();
    let names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("vm1.fvgpu")],
        "no part left"
    );
}

#[test]
fn any_changed_byte_a_cut_or_a_tail_is_refused() {
    let key = Some(&b"0123456789abcdef"[..]);
    let (_d, path) = written("bytes", key);
    let good = std::fs::read(&path).unwrap();
    let bad = path.with_extension("bad");
    // Every byte of the head and lane heads, and bytes through the streams.
    let at: Vec<usize> = (0..60)
        .chain((60..good.len()).step_by(997))
        .chain([good.len() - 1])
        .collect();
    for i in at {
        let mut b = good.clone();
        b[i] ^= 0x40;
        std::fs::write(&bad, &b).unwrap();
        assert!(read(&bad, "vm1", key, LIMITS).is_err(), "byte {i} changed");
    }
    for cut in [0, 10, 40, good.len() / 2, good.len() - 1] {
        std::fs::write(&bad, &good[..cut]).unwrap();
        assert!(read(&bad, "vm1", key, LIMITS).is_err(), "cut at {cut}");
    }
    let mut tail = good.clone();
    tail.push(0);
    std::fs::write(&bad, &tail).unwrap();
    assert!(matches!(
        read(&bad, "vm1", key, LIMITS),
        Err(FileError::Tag(_))
    ));
}

#[test]
fn another_key_no_key_another_vm_and_the_limits_are_refused() {
    let key = Some(&b"0123456789abcdef"[..]);
    let (_d, path) = written("keys", key);
    let other = Some(&b"fedcba9876543210"[..]);
    assert!(matches!(
        read(&path, "vm1", other, LIMITS),
        Err(FileError::Tag(_))
    ));
    assert!(matches!(
        read(&path, "vm1", None, LIMITS),
        Err(FileError::Key { .. })
    ));
    assert!(matches!(
        read(&path, "vm2", key, LIMITS),
        Err(FileError::OtherVm { .. })
    ));
    let (_d2, plain) = written("keys", None);
    assert!(matches!(
        read(&plain, "vm1", key, LIMITS),
        Err(FileError::Key { .. })
    ));
    let few = FileLimits { slots: 3, ..LIMITS };
    assert!(matches!(
        read(&path, "vm1", key, few),
        Err(FileError::Lanes { .. })
    ));
    let small = FileLimits {
        lane_bytes: 1000,
        ..LIMITS
    };
    assert!(matches!(
        read(&path, "vm1", key, small),
        Err(FileError::Lanes { .. })
    ));
}

#[test]
fn a_slot_twice_is_refused() {
    let dir = scratch::dir("save-file-twice");
    let path = dir.join("twice");
    write(
        &path,
        &saved("vm1", vec![lane(1, b"a"), lane(1, b"b")]),
        None,
        false,
    )
    .unwrap();
    assert!(matches!(
        read(&path, "vm1", None, LIMITS),
        Err(FileError::Lanes { .. })
    ));
}

#[test]
fn a_region_and_a_nonce_go_with_a_handover() {
    let region = lane(0, &[5u8; 4096]);
    let s = Saved {
        vm: "vm1".into(),
        region: Some((region.stream, 4096)),
        lanes: vec![lane(2, b"stream")],
    };
    let key = Some(&b"0123456789abcdef"[..]);
    let (bytes, n) = write_to(Vec::new(), &s, key, b"nonce-1").unwrap();
    assert_eq!(n, bytes.len() as u64);
    let here = FileLimits {
        region: 4096,
        ..LIMITS
    };
    let p = Path::new("peer");
    let back = read_from(&bytes[..], p, key, b"nonce-1", &|_| Some(here)).unwrap();
    assert_eq!(back.vm, "vm1");
    let (fd, len) = back.region.unwrap();
    assert_eq!(len, 4096);
    assert_eq!(
        contents(&Lane {
            slot: 0,
            stream: fd,
            len
        }),
        vec![5u8; 4096]
    );
    assert_eq!(contents(&back.lanes[0]), b"stream");
    // Replayed under another nonce, or into a region of another size.
    assert!(matches!(
        read_from(&bytes[..], p, key, b"nonce-2", &|_| Some(here)),
        Err(FileError::Tag(_))
    ));
    let other = FileLimits {
        region: 8192,
        ..LIMITS
    };
    assert!(matches!(
        read_from(&bytes[..], p, key, b"nonce-1", &|_| Some(other)),
        Err(FileError::Lanes { .. })
    ));
}

#[test]
fn a_streams_zero_blocks_travel_as_one_byte_and_a_version_3_file_still_reads() {
    // Mostly zeros, as a training's device memory is.
    let mut stream = vec![0u8; 10 * region::BLOCK + 5];
    stream[3 * region::BLOCK + 1] = 4;
    stream[10 * region::BLOCK + 4] = 9;
    let (bytes, _) =
        write_to(Vec::new(), &saved("vm1", vec![lane(1, &stream)]), None, b"").unwrap();
    assert!(
        bytes.len() < 2 * region::BLOCK + 200,
        "{} bytes for two blocks of data",
        bytes.len()
    );
    let p = Path::new("file");
    let back = read_from(&bytes[..], p, None, b"", &|_| Some(LIMITS)).unwrap();
    assert_eq!(contents(&back.lanes[0]), stream);

    // The same lane as version 3 wrote it: whole.
    let mut old = Vec::new();
    old.extend_from_slice(&MAGIC);
    old.extend_from_slice(&WHOLE_STREAMS.to_le_bytes());
    old.extend_from_slice(&0u32.to_le_bytes());
    old.extend_from_slice(&3u16.to_le_bytes());
    old.extend_from_slice(b"vm1");
    old.extend_from_slice(&1u32.to_le_bytes());
    old.extend_from_slice(&1u32.to_le_bytes());
    old.extend_from_slice(&(stream.len() as u64).to_le_bytes());
    old.extend_from_slice(&stream);
    let tag = tag_of(None, b"", &old);
    old.extend_from_slice(&tag);
    let back = read_from(&old[..], p, None, b"", &|_| Some(LIMITS)).unwrap();
    assert_eq!(contents(&back.lanes[0]), stream);
    // Another version is refused.
    old[8] = 9;
    assert!(matches!(
        read_from(&old[..], p, None, b"", &|_| Some(LIMITS)),
        Err(FileError::NotOne(_))
    ));
}

/// Gives at most `piece` bytes a read, as a socket does.
struct Trickle<'a> {
    bytes: &'a [u8],
    piece: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let k = self.piece.min(b.len()).min(self.bytes.len());
        b[..k].copy_from_slice(&self.bytes[..k]);
        self.bytes = &self.bytes[k..];
        Ok(k)
    }
}

#[test]
fn a_stream_over_several_chunks_reads_back_in_any_pieces_and_nothing_past_its_tag() {
    // Two lanes over three 4 MiB chunks, every block holding data, so
    // blocks and lanes straddle the chunks' ends.
    let a: Vec<u8> = (0..5_000_123u32)
        .map(|i| (i % 251 + 1).to_le_bytes()[0])
        .collect();
    let b: Vec<u8> = (0..4_200_007u32)
        .map(|i| (i % 13 + 1).to_le_bytes()[0])
        .collect();
    let key = Some(&b"0123456789abcdef"[..]);
    let s = saved("vm1", vec![lane(0, &a), lane(5, &b)]);
    let (bytes, _) = write_to(Vec::new(), &s, key, b"n").unwrap();
    assert!(bytes.len() > 2 * tag::CHUNK);
    let limits = FileLimits {
        lane_bytes: 8 << 20,
        ..LIMITS
    };
    let p = Path::new("peer");
    for piece in [1 << 20, 65_537, 4093] {
        let r = Trickle {
            bytes: &bytes,
            piece,
        };
        let back = read_from(r, p, key, b"n", &|_| Some(limits)).unwrap();
        assert_eq!(contents(&back.lanes[0]), a, "in pieces of {piece}");
        assert_eq!(contents(&back.lanes[1]), b, "in pieces of {piece}");
    }
    // A byte after the tag, read ahead with it, is refused; so is the tag
    // cut short.
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        read_from(&longer[..], p, key, b"n", &|_| Some(limits)),
        Err(FileError::Tag(_))
    ));
    assert!(matches!(
        read_from(&bytes[..bytes.len() - 1], p, key, b"n", &|_| Some(limits)),
        Err(FileError::Tag(_))
    ));
}

#[test]
fn a_file_with_bytes_after_its_tag_is_refused() {
    let (_d, path) = written("after", None);
    let mut f = File::options().append(true).open(&path).unwrap();
    f.write_all(&[0u8; 3]).unwrap();
    assert!(matches!(
        read(&path, "vm1", None, LIMITS),
        Err(FileError::Tag(_))
    ));
}
