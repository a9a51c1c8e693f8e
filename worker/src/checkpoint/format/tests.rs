use super::*;
use crate::checkpoint::{Blob, Mapped};
use crate::checkpoint::{ChannelImage, DeviceFacts, SessionImage};
use crate::executor::sim::{SimExecutor, SimParams};
use crate::executor::Executor;
use protocol::ImageKind;

fn channel(index: u32) -> ChannelImage {
    ChannelImage {
        index,
        position: transport::HostPosition::default(),
    }
}

/// Two guest processes' checkpoint, taken from the sim.
fn image() -> VgpuImage {
    let mut exec = SimExecutor::new(SimParams::default());
    let sessions = (0..2)
        .map(|i| {
            let mut ctx = exec.open().unwrap();
            let m = ctx
                .load_module(ImageKind::Ptx, crate::KERNELS_PTX.as_bytes())
                .unwrap();
            ctx.function(m, "vector_add").unwrap();
            let p = ctx.alloc(4096).unwrap();
            let mut bytes = vec![u8::try_from(i).unwrap() + 1; 4096];
            let src = vm_memory::VolatileSlice::from(bytes.as_mut_slice());
            ctx.htod(p, &src, 0).unwrap();
            // A graph too, whose nodes travel after the memory.
            let fill = protocol::graph::GraphNode {
                deps: Vec::new(),
                op: protocol::graph::GraphOp::Memset {
                    dst: p,
                    pitch: 4096,
                    value: 3,
                    elem: 1,
                    width: 4096,
                    height: 1,
                },
            };
            ctx.graph_instantiate(&[fill]).unwrap();
            SessionImage {
                pid: 100 + i,
                channels: [i, i + 2].map(channel).to_vec(),
                next_seq: 7,
                token: [1, 2],
                pending_error: None,
                context: ctx.checkpoint().unwrap(),
                pinned: vec![(u64::from(i) * 8192, 4096)],
            }
        })
        .collect();
    VgpuImage {
        device: DeviceFacts {
            name: "sim".into(),
            driver: "580.65.06".into(),
            cc: (9, 0),
        },
        mem_limit: 1 << 30,
        sessions,
    }
}

fn bytes_of(image: &VgpuImage, key: Option<&[u8]>) -> Vec<u8> {
    let mut v = Vec::new();
    let n = write(&mut v, image, key).unwrap();
    assert_eq!(n, v.len() as u64);
    v
}

#[test]
fn a_checkpoint_reads_back_as_written_with_and_without_a_key() {
    let img = image();
    for key in [None, Some(&b"operator key"[..])] {
        let v = bytes_of(&img, key);
        let back = read(&mut v.as_slice(), Check::Own(key), &Limits::default()).unwrap();
        assert_eq!(back, img);
        assert_eq!(
            back.sessions[1].context.memory[0].bytes[0], 2,
            "the bytes too"
        );
    }
}

/// `bytes` in a memfd that takes seals, mapped.
fn mapped(bytes: &[u8]) -> std::sync::Arc<Mapped> {
    use std::io::Write as _;
    let fd =
        nix::sys::memfd::memfd_create(c"stream-test", nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING)
            .unwrap();
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes).unwrap();
    std::sync::Arc::new(Mapped::of(&std::os::fd::OwnedFd::from(f)).unwrap())
}

#[test]
fn a_mapped_stream_reads_as_a_copied_one_its_memory_in_place() {
    let img = image();
    let key = Some(&b"operator key"[..]);
    let v = bytes_of(&img, key);
    let back = read_mapped(mapped(&v), Check::Own(key), &Limits::default()).unwrap();
    assert_eq!(back, img);
    let a = &back.sessions[1].context.memory[0].bytes;
    assert!(matches!(a, Blob::Mapped { .. }), "{a:?}");
    assert_eq!(a[0], 2);
    // Module images are read in place too.
    let m = &back.sessions[0].context.modules[0].image;
    assert!(matches!(m, Blob::Mapped { .. }), "{m:?}");
    assert_eq!(*m, img.sessions[0].context.modules[0].image);
    // An altered byte of memory, or a cut, is caught as in a copied stream.
    let mut bad = v.clone();
    let at = v.len() - 40;
    bad[at] ^= 1;
    assert!(read_mapped(mapped(&bad), Check::Own(key), &Limits::default()).is_err());
    assert!(read_mapped(
        mapped(&v[..v.len() - 1]),
        Check::Own(key),
        &Limits::default()
    )
    .is_err());
    // More memory than the limit is refused before any of it is taken.
    let tight = Limits {
        memory: 1,
        ..Limits::default()
    };
    assert!(matches!(
        read_mapped(mapped(&v), Check::Own(key), &tight),
        Err(FormatError::TooLarge { .. })
    ));
}

#[test]
fn any_altered_byte_is_caught() {
    let img = image();
    let key = Some(&b"k"[..]);
    let v = bytes_of(&img, key);
    // The header, the description, module text, memory and the tag.
    let desc = 24;
    for at in [
        9,
        13,
        desc + 3,
        v.len() / 2,
        v.len() - 4097,
        v.len() - 33,
        v.len() - 1,
    ] {
        let mut bad = v.clone();
        bad[at] ^= 0x20;
        let r = read(&mut bad.as_slice(), Check::Own(key), &Limits::default());
        assert!(r.is_err(), "byte {at} of {} altered: accepted", v.len());
    }
}

#[test]
fn a_wrong_key_a_missing_key_and_a_cut_stream_are_refused() {
    let img = image();
    let v = bytes_of(&img, Some(b"right"));
    let l = Limits::default();
    assert!(matches!(
        read(&mut v.as_slice(), Check::Own(Some(b"wrong")), &l),
        Err(FormatError::Integrity(_))
    ));
    assert!(matches!(
        read(&mut v.as_slice(), Check::Own(None), &l),
        Err(FormatError::Integrity(_))
    ));
    let plain = bytes_of(&img, None);
    assert!(matches!(
        read(&mut plain.as_slice(), Check::Own(Some(b"right")), &l),
        Err(FormatError::Integrity(_))
    ));
    for cut in [0, 5, 30, v.len() / 2, v.len() - 1] {
        assert!(matches!(
            read(&mut &v[..cut], Check::Own(Some(b"right")), &l),
            Err(FormatError::Io(_))
        ));
    }
    assert!(matches!(
        read(&mut &b"NOTACKPT............"[..], Check::Own(None), &l),
        Err(FormatError::NotACheckpoint)
    ));
}

#[test]
fn what_is_more_than_the_reader_takes_is_refused_before_it_is_read() {
    let img = image();
    let v = bytes_of(&img, None);
    let small = |f: fn(&mut Limits)| {
        let mut l = Limits::default();
        f(&mut l);
        read(&mut v.as_slice(), Check::Own(None), &l)
    };
    assert!(matches!(
        small(|l| l.memory = 8191),
        Err(FormatError::TooLarge { .. })
    ));
    assert!(matches!(
        small(|l| l.images = 100),
        Err(FormatError::TooLarge { .. })
    ));
    assert!(matches!(
        small(|l| l.sessions = 1),
        Err(FormatError::TooLarge { .. })
    ));
    assert!(matches!(
        small(|l| l.description = 10),
        Err(FormatError::TooLarge { .. })
    ));
    assert!(
        small(|l| l.memory = 8192 + 8).is_ok(),
        "two allocations and two globals fit"
    );
}

/// A peer that tags what it sends correctly is still checked.
#[test]
fn a_well_tagged_forgery_is_refused() {
    let mut img = image();
    img.sessions[1].channels = vec![channel(2)];
    let v = bytes_of(&img, Some(b"k"));
    assert!(matches!(
        read(
            &mut v.as_slice(),
            Check::Own(Some(b"k")),
            &Limits::default()
        ),
        Err(FormatError::ChannelTwice(2))
    ));
    let mut img = image();
    let c = &mut img.sessions[0].context;
    c.modules[0].globals[0].addr = c.memory[0].addr + 1;
    let v = bytes_of(&img, Some(b"k"));
    assert!(matches!(
        read(
            &mut v.as_slice(),
            Check::Own(Some(b"k")),
            &Limits::default()
        ),
        Err(FormatError::Invalid { pid: 100, .. })
    ));
}

#[test]
fn a_stream_of_the_version_before_graphs_reads_and_may_hold_none() {
    let img = image();
    assert!(img.sessions.iter().all(|s| s.context.graphs.len() == 1));
    let mut v1 = bytes_of(&img, None);
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    assert!(matches!(
        read(&mut v1.as_slice(), Check::Own(None), &Limits::default()),
        Err(FormatError::Version(1))
    ));
    // Without graphs, version 1 reads as it always did.
    let mut plain = img.clone();
    for s in &mut plain.sessions {
        s.context.graphs.clear();
    }
    let mut v1 = bytes_of(&plain, None);
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    // The header is under the tag: the version-1 stream is tagged as one.
    let n = v1.len();
    let front_len =
        24 + usize::try_from(u64::from_le_bytes(v1[16..24].try_into().unwrap())).unwrap();
    let (front, rest) = v1.split_at(front_len);
    let body = &rest[..rest.len() - 32];
    let blobs = [body];
    let tag = stream_tag(None, front, &blobs);
    v1[n - 32..].copy_from_slice(&tag);
    assert_eq!(
        read(&mut v1.as_slice(), Check::Own(None), &Limits::default()).unwrap(),
        plain
    );
    // A version past this build's is refused.
    let mut v4 = bytes_of(&plain, None);
    v4[8..12].copy_from_slice(&4u32.to_le_bytes());
    assert!(matches!(
        read(&mut v4.as_slice(), Check::Own(None), &Limits::default()),
        Err(FormatError::Version(4))
    ));
}

/// A stream without a tag of its own (as a worker writes it for its
/// daemon) reads where its carrier was checked, and nowhere else; its
/// limits and contexts are checked all the same.
#[test]
fn a_carried_stream_reads_only_as_carried_and_is_still_checked() {
    let img = image();
    let mut v = bytes_of(&img, None);
    v[12..16].copy_from_slice(&CARRIED.to_le_bytes());
    let n = v.len();
    v[n - 32..].fill(0);
    let l = Limits::default();
    assert_eq!(read(&mut v.as_slice(), Check::Carried, &l).unwrap(), img);
    assert_eq!(read_mapped(mapped(&v), Check::Carried, &l).unwrap(), img);
    for check in [Check::Own(None), Check::Own(Some(b"k"))] {
        let e = read(&mut v.as_slice(), check, &l).unwrap_err();
        assert!(e.to_string().contains("no tag of its own"), "{e}");
    }
    let tight = Limits {
        memory: 8191,
        ..Limits::default()
    };
    assert!(matches!(
        read(&mut v.as_slice(), Check::Carried, &tight),
        Err(FormatError::TooLarge { .. })
    ));
    let mut bad = image();
    bad.sessions[1].channels = vec![channel(2)];
    let mut b = bytes_of(&bad, None);
    b[12..16].copy_from_slice(&CARRIED.to_le_bytes());
    assert!(matches!(
        read(&mut b.as_slice(), Check::Carried, &l),
        Err(FormatError::ChannelTwice(2))
    ));
    // A version that had no such flag is refused with it.
    v[8..12].copy_from_slice(&2u32.to_le_bytes());
    assert!(matches!(
        read(&mut v.as_slice(), Check::Carried, &l),
        Err(FormatError::Integrity(_))
    ));
}
