//! The feed: what the daemon and a VM's worker say over their socket pair
//! (see the daemon's `link` and the worker's `fed`).
//!
//! Feed messages reuse the ivshmem-server framing (one `i64`, optionally one
//! fd): kind in bits 40..48, peer in bits 16..32, vector in bits 0..16.

#![allow(missing_docs)]

pub const REGION: i64 = 1;
pub const HOST_BELL: i64 = 2;
pub const PEER_BELL: i64 = 3;
pub const PEER_GONE: i64 = 4;
pub const SYNCED: i64 = 5;
/// The vGPU's device-memory limit changed: the low 40 bits are MiB.
pub const LIMIT: i64 = 6;
pub const LIMIT_MASK: i64 = (1 << 40) - 1;
/// Daemon -> worker: move to GPU (low 16 bits), with the socket of that
/// GPU's grant service when the scheduler runs.
pub const MIGRATE: i64 = 7;
/// Worker -> daemon, after a migration: its pause in microseconds, then the
/// KiB it copied (low 40 bits each), then MIGRATED with the GPU it is on
/// (low 16 bits), bit 16 set if it moved, and why not if it did not
/// (`MigrationReport::encode`).
pub const MIGRATION_PAUSE_US: i64 = 8;
pub const MIGRATION_KIB: i64 = 9;
pub const MIGRATED: i64 = 10;
/// Worker -> daemon: a sticky CUDA error poisoned its GPU contexts; it
/// exits. Said first, so that the daemon need not wait for that exit to
/// restart the other clients of the GPU's MPS server (the daemon's `supervisor/faults.rs`).
pub const POISONED: i64 = 11;
// 13 was a standby worker's, in a release that had one worker per VM;
// not reused.

// IPC between the workers of a VM with process slots (the worker's
// `exports.rs`, the daemon's `ipc_relay.rs`). An entry of the VM's export
// table is named by its index (bits 24..40) and generation (bits 0..24).
/// Daemon -> a process slot's worker, in its snapshot: the VM's export
/// table (a memfd only the VM's workers share).
pub const IPC_TABLE: i64 = 20;
/// Worker -> daemon: it exported the entry, with the fd an opener needs
/// (if any); the entry is revoked when the worker's feed ends.
pub const IPC_EXPORTED: i64 = 21;
/// Worker -> daemon: it opens the entry and needs its fd.
pub const IPC_WANT: i64 = 22;
/// Daemon -> worker: the entry's fd it asked for (none: none kept).
pub const IPC_FD: i64 = 23;

// A vGPU's checkpoint (the worker's `serve/checkpoint.rs`, the daemon's
// `supervisor/checkpoint.rs`).
/// Daemon -> worker, with a memfd: hold (start no request), take the
/// checkpoint of the guest processes it serves once every channel is between
/// requests, and write its stream (`worker::checkpoint::write`, unkeyed)
/// into the memfd. The worker stays held until [`RESUME`] or its end.
pub const CHECKPOINT: i64 = 24;
/// A [`CHECKPOINT`]'s value bit: one sent ahead, whose memfd a handover's
/// checkpoint is written over next; the worker keeps it mapped meanwhile.
pub const CHECKPOINT_KEEP_MAPPED: u64 = 1;
/// Worker -> daemon: the checkpoint is in the memfd; its length in bytes
/// (low 40 bits).
pub const CHECKPOINTED: i64 = 25;
/// Worker -> daemon: no checkpoint taken, or none served on from; why is in
/// the memfd, UTF-8, its length in bytes (low 40 bits, at most
/// [`CHECKPOINT_WHY_MAX`]).
pub const CHECKPOINT_FAILED: i64 = 26;
/// Daemon -> worker: go on serving (the checkpoint was not used).
pub const RESUME: i64 = 27;
/// Worker -> daemon: it serves on from the checkpoint it was started with;
/// how many of its modules a spare had loaded ahead (low 40 bits).
pub const RESTORED: i64 = 28;
/// The longest reason a [`CHECKPOINT_FAILED`] gives, bytes.
pub const CHECKPOINT_WHY_MAX: u16 = 4096;

/// Whether `kind` is one of the IPC messages.
pub fn is_ipc(kind: i64) -> bool {
    (IPC_TABLE..=IPC_FD).contains(&kind)
}

/// An IPC message naming entry `index` of generation `gen` (its low 24
/// bits).
pub fn encode_entry(kind: i64, index: u16, gen: u32) -> i64 {
    (kind << 40) | (i64::from(index) << 24) | i64::from(gen & 0xff_ffff)
}

/// The entry an IPC message names: (index, generation's low 24 bits).
pub fn decode_entry(v: i64) -> (u16, u32) {
    let gen = u32::from(u16_at(v, 0)) | (u32::from(u16_at(v, 16) & 0xff) << 16);
    (u16_at(v, 24), gen)
}

/// Spare worker -> daemon, on its own socket (not a feed): its executor
/// is open and its context made; it waits for its [`SpareBinding`].
pub const SPARE_READY: i64 = 12;
/// Spare worker -> daemon, on its own socket: it staged the modules of the
/// checkpoint it was given ([`SpareBinding::stage`]); how many (low 40
/// bits, 0 where none could be).
pub const SPARE_STAGED: i64 = 29;

/// The first bytes of a [`SpareBinding`].
const BINDING_MAGIC: [u8; 4] = *b"FVGB";
/// A binding's fixed part: magic, slot, vGPU id, name length, entry
/// length, flags.
const BINDING_HEAD: usize = 4 + 4 + 4 + 2 + 4 + 1;
/// A binding's flag: a checkpoint stream comes with it (a third fd).
const BINDING_RESTORE: u8 = 1;
/// A binding's flag: not a binding but a stage, the VM's checkpoint stream
/// its one fd (see [`SpareBinding::stage`]).
const BINDING_STAGE: u8 = 2;
/// Longest VM name a binding carries (bytes).
pub const BINDING_NAME_MAX: usize = 255;
/// Longest declared `[[vm]]` entry a binding carries (bytes of TOML).
pub const BINDING_ENTRY_MAX: usize = 64 << 10;
/// Longest binding, head included.
pub const BINDING_MAX: usize = BINDING_HEAD + BINDING_NAME_MAX + BINDING_ENTRY_MAX;
/// Process slots a binding may name (a region's at most,
/// `transport::layout::MAX_PARTITIONS`).
const BINDING_SLOTS: u32 = 16;

/// What binds a spare worker (started ahead for a GPU, bound to no VM) to
/// one VM's process slot: the VM, its vGPU id, the slot, and the VM's
/// `[[vm]]` entry where it was declared through the API rather than read
/// from host.toml. The feed and the VM's ledger go beside it as fds (see
/// the worker's `spare.rs`), and a checkpoint stream to serve on from
/// where `restore` says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpareBinding {
    /// The VM.
    pub vm: String,
    /// Its vGPU id at the grant services.
    pub id: u32,
    /// The process slot the spare serves.
    pub slot: u32,
    /// The declared vGPU's entry (TOML), if it is not in host.toml.
    pub declared: Option<String>,
    /// The slot's worker serves on from a checkpoint stream, which comes
    /// with the binding as its third fd (a restore).
    pub restore: bool,
    /// Not a binding yet: the spare loads ahead the modules of the VM's
    /// checkpoint stream, which comes as its one fd, and waits on for its
    /// binding (a vGPU another host is about to hand over).
    pub stage: bool,
}

/// A binding that does not read as one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    /// Shorter than its head or than the lengths it gives, or longer.
    #[error("spare binding: {0} bytes do not hold what its head says")]
    Length(usize),
    /// It does not start with the binding's magic.
    #[error("spare binding: not a binding")]
    Magic,
    /// The name is empty, too long, not UTF-8, or holds a `/` or a NUL.
    #[error("spare binding: not a VM name")]
    Name,
    /// The entry is too long or not UTF-8.
    #[error("spare binding: the declared entry is not UTF-8 text of at most 64 KiB")]
    Entry,
    /// The slot is past a region's process slots.
    #[error("spare binding: no process slot {0}")]
    Slot(u32),
    /// Flags other than the restore's or the stage's, or both.
    #[error("spare binding: unknown flags {0:#x}")]
    Flags(u8),
}

impl SpareBinding {
    /// The binding's bytes: magic, slot, id (u32 each, little-endian), the
    /// name's length (u16) and the entry's (u32, 0: none), the flags (a
    /// byte: 1 for a restore), then the name and the entry.
    pub fn encode(&self) -> Vec<u8> {
        let entry = self.declared.as_deref().unwrap_or("");
        let name_len = u16::try_from(self.vm.len()).unwrap_or(u16::MAX);
        let entry_len = u32::try_from(entry.len()).unwrap_or(u32::MAX);
        let mut b = Vec::with_capacity(BINDING_HEAD + self.vm.len() + entry.len());
        b.extend_from_slice(&BINDING_MAGIC);
        b.extend_from_slice(&self.slot.to_le_bytes());
        b.extend_from_slice(&self.id.to_le_bytes());
        b.extend_from_slice(&name_len.to_le_bytes());
        b.extend_from_slice(&entry_len.to_le_bytes());
        b.push(match (self.stage, self.restore) {
            (true, _) => BINDING_STAGE,
            (false, true) => BINDING_RESTORE,
            (false, false) => 0,
        });
        b.extend_from_slice(self.vm.as_bytes());
        b.extend_from_slice(entry.as_bytes());
        b
    }

    /// How many bytes the binding that `head` (its first
    /// [`SpareBinding::head_len`] bytes) begins holds in all; an error if
    /// the head is not a binding's or gives lengths past the limits.
    pub fn total_len(head: &[u8]) -> Result<usize, BindingError> {
        let h = head
            .get(..BINDING_HEAD)
            .ok_or(BindingError::Length(head.len()))?;
        if h[..4] != BINDING_MAGIC {
            return Err(BindingError::Magic);
        }
        let name = usize::from(u16::from_le_bytes([h[12], h[13]]));
        let entry =
            usize::try_from(u32::from_le_bytes([h[14], h[15], h[16], h[17]])).unwrap_or(usize::MAX);
        if name == 0 || name > BINDING_NAME_MAX {
            return Err(BindingError::Name);
        }
        if entry > BINDING_ENTRY_MAX {
            return Err(BindingError::Entry);
        }
        Ok(BINDING_HEAD + name + entry)
    }

    /// Bytes of a binding's head (what [`SpareBinding::total_len`] reads).
    pub fn head_len() -> usize {
        BINDING_HEAD
    }

    /// Reads a binding, checking every field: the whole of `b` and nothing
    /// more, a name of 1 to 255 bytes of UTF-8 without `/` or NUL, an entry
    /// of UTF-8 text, a slot below a region's most.
    pub fn decode(b: &[u8]) -> Result<SpareBinding, BindingError> {
        let total = Self::total_len(b)?;
        if b.len() != total {
            return Err(BindingError::Length(b.len()));
        }
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let (slot, id) = (word(4), word(8));
        if slot >= BINDING_SLOTS {
            return Err(BindingError::Slot(slot));
        }
        let flags = b[18];
        if ![0, BINDING_RESTORE, BINDING_STAGE].contains(&flags) {
            return Err(BindingError::Flags(flags));
        }
        let name_len = usize::from(u16::from_le_bytes([b[12], b[13]]));
        let vm = std::str::from_utf8(&b[BINDING_HEAD..BINDING_HEAD + name_len])
            .map_err(|_| BindingError::Name)?;
        if vm.contains(['/', '\0']) {
            return Err(BindingError::Name);
        }
        let entry =
            std::str::from_utf8(&b[BINDING_HEAD + name_len..]).map_err(|_| BindingError::Entry)?;
        Ok(SpareBinding {
            vm: vm.to_owned(),
            id,
            slot,
            declared: (!entry.is_empty()).then(|| entry.to_owned()),
            restore: flags == BINDING_RESTORE,
            stage: flags == BINDING_STAGE,
        })
    }
}

/// What a worker reported of a migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrationReport {
    /// The GPU the vGPU is on now.
    pub gpu: u32,
    /// Whether it moved (false: it stayed where it was).
    pub moved: bool,
    /// From the last work on the source to being ready on the target, µs.
    pub pause_us: u64,
    /// Device memory copied, KiB.
    pub kib: u64,
    /// Why it did not move: the object that kept it on its GPU, if one did.
    pub kept_by: Option<crate::Keeper>,
    /// Why it did not move: the error a context's move (or the target)
    /// answered, if no object kept it.
    pub failed: Option<protocol::Status>,
}

impl MigrationReport {
    /// The MIGRATED message: the GPU (low 16 bits), bit 16 if it moved, the
    /// keeper's code in bits 17..24, the failure's status code in bits
    /// 24..40 (0: none).
    pub fn encode(&self) -> i64 {
        let moved = if self.moved { 1 << 16 } else { 0 };
        let kept = i64::from(self.kept_by.map_or(0, |k| k.code() & 0x7f)) << 17;
        let failed = i64::from(self.failed.map_or(0, |s| s.code().min(0xffff))) << 24;
        // A GPU past 16 bits (none is) saturates rather than naming another.
        let gpu = u16::try_from(self.gpu).unwrap_or(u16::MAX);
        (MIGRATED << 40) | failed | kept | moved | i64::from(gpu)
    }

    /// The report a MIGRATED message `v` ends, after its pause and KiB.
    pub fn decode(v: i64, pause_us: u64, kib: u64) -> MigrationReport {
        let failed = u32::from(u16_at(v, 24));
        let [kept, _] = (u16_at(v, 17) & 0x7f).to_le_bytes();
        MigrationReport {
            gpu: u32::from(u16_at(v, 0)),
            moved: v & (1 << 16) != 0,
            pause_us,
            kib,
            kept_by: crate::Keeper::from_code(kept),
            failed: (failed != 0).then(|| protocol::Status::from_code(failed)),
        }
    }

    /// Why it did not move, in words (empty if it moved).
    pub fn reason(&self) -> String {
        match (self.kept_by, self.failed) {
            (Some(k), _) => format!("{k} stays on its GPU"),
            (None, Some(s)) => format!("{s:?}"),
            (None, None) => String::new(),
        }
    }
}

/// A message of `kind` whose low 40 bits carry `value` (`LIMIT`,
/// `MIGRATION_PAUSE_US`, `MIGRATION_KIB`), saturated at [`LIMIT_MASK`]: a
/// larger value goes as the largest, never wrapped into a small one or
/// into the kind's bits.
pub fn encode_value(kind: i64, value: u64) -> i64 {
    let value = i64::try_from(value).map_or(LIMIT_MASK, |v| v.min(LIMIT_MASK));
    (kind << 40) | value
}

/// The value in a message's low 40 bits (see [`encode_value`]).
pub fn decode_value(v: i64) -> u64 {
    // Masked to 40 bits, so non-negative: the bits are the value.
    (v & LIMIT_MASK).cast_unsigned()
}

/// Bits `at..at + 16` of a message word.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // keeping 16 bits is the point
fn u16_at(v: i64, at: u32) -> u16 {
    (v >> at) as u16
}

/// One feed message's word: kind, peer, vector.
pub fn encode(kind: i64, peer: u16, vector: u16) -> i64 {
    (kind << 40) | (i64::from(peer) << 16) | i64::from(vector)
}

/// A feed message's kind, peer and vector.
pub fn decode(v: i64) -> (i64, u16, u16) {
    ((v >> 40) & 0xff, u16_at(v, 16), u16_at(v, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_their_fields() {
        for (kind, peer, vector) in [
            (REGION, 0, 0),
            (PEER_BELL, 7, 3),
            (POISONED, u16::MAX, u16::MAX),
        ] {
            assert_eq!(decode(encode(kind, peer, vector)), (kind, peer, vector));
        }
    }

    #[test]
    fn ipc_entries_round_trip() {
        for (k, i, g) in [
            (IPC_EXPORTED, 0, 0),
            (IPC_FD, u16::MAX, 0xff_ffff),
            (IPC_WANT, 7, 9),
        ] {
            let v = encode_entry(k, i, g);
            assert_eq!(decode(v).0, k);
            assert!(is_ipc(decode(v).0));
            assert_eq!(decode_entry(v), (i, g));
        }
        assert_eq!(
            decode_entry(encode_entry(IPC_FD, 1, 1 << 24 | 5)),
            (1, 5),
            "24 bits kept"
        );
        assert!(!is_ipc(POISONED));
    }

    #[test]
    fn values_saturate_rather_than_wrap_into_the_kind() {
        assert_eq!(decode_value(encode_value(LIMIT, 81920)), 81920);
        let max = LIMIT_MASK.cast_unsigned();
        for big in [max, max + 1, 1 << 40 | 5, u64::MAX] {
            let v = encode_value(LIMIT, big);
            assert_eq!(decode(v).0, LIMIT, "{big}: kind kept");
            assert_eq!(decode_value(v), max, "{big}: saturated");
        }
    }

    #[test]
    fn a_spare_binding_round_trips_and_every_field_is_checked() {
        let b = SpareBinding {
            vm: "vm-1".into(),
            id: 7,
            slot: 3,
            declared: Some("name = \"vm-1\"\n".into()),
            restore: false,
            stage: false,
        };
        let bytes = b.encode();
        assert_eq!(SpareBinding::total_len(&bytes), Ok(bytes.len()));
        assert_eq!(SpareBinding::decode(&bytes), Ok(b.clone()));
        let plain = SpareBinding {
            declared: None,
            ..b.clone()
        };
        assert_eq!(SpareBinding::decode(&plain.encode()), Ok(plain));
        let restore = SpareBinding {
            restore: true,
            ..b.clone()
        };
        assert_eq!(SpareBinding::decode(&restore.encode()), Ok(restore));
        let stage = SpareBinding {
            stage: true,
            ..b.clone()
        };
        assert_eq!(SpareBinding::decode(&stage.encode()), Ok(stage));
        // Flags it does not know, or a restore and a stage at once.
        for f in [3u8, 4, 0x80] {
            let mut m = bytes.clone();
            m[18] = f;
            assert_eq!(SpareBinding::decode(&m), Err(BindingError::Flags(f)));
        }
        // Cut short, or with bytes after it.
        for n in [0, 5, SpareBinding::head_len(), bytes.len() - 1] {
            assert!(SpareBinding::decode(&bytes[..n]).is_err(), "{n} bytes");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            SpareBinding::decode(&long),
            Err(BindingError::Length(long.len()))
        );
        // Not a binding.
        let mut m = bytes.clone();
        m[0] = b'X';
        assert_eq!(SpareBinding::decode(&m), Err(BindingError::Magic));
        // A slot past a region's.
        let far = SpareBinding {
            slot: 16,
            ..b.clone()
        };
        assert_eq!(
            SpareBinding::decode(&far.encode()),
            Err(BindingError::Slot(16))
        );
        // Names: empty, a path, a NUL, not UTF-8, too long.
        for bad in ["", "../x", "a\0b"] {
            let v = SpareBinding {
                vm: bad.into(),
                ..b.clone()
            };
            assert_eq!(
                SpareBinding::decode(&v.encode()),
                Err(BindingError::Name),
                "{bad:?}"
            );
        }
        let mut not_utf8 = bytes.clone();
        not_utf8[SpareBinding::head_len()] = 0xff;
        assert_eq!(SpareBinding::decode(&not_utf8), Err(BindingError::Name));
        let mut huge = bytes.clone();
        huge[12..14].copy_from_slice(&300u16.to_le_bytes());
        assert_eq!(SpareBinding::total_len(&huge), Err(BindingError::Name));
        // An entry past its limit, or not UTF-8.
        let mut big = bytes.clone();
        let past = u32::try_from(BINDING_ENTRY_MAX + 1).unwrap();
        big[14..18].copy_from_slice(&past.to_le_bytes());
        assert_eq!(SpareBinding::total_len(&big), Err(BindingError::Entry));
        let mut bad_entry = bytes;
        let last = bad_entry.len() - 1;
        bad_entry[last] = 0xfe;
        assert_eq!(SpareBinding::decode(&bad_entry), Err(BindingError::Entry));
    }

    #[test]
    fn migration_reports_round_trip() {
        let r = MigrationReport {
            gpu: 3,
            moved: false,
            pause_us: 1200,
            kib: 4096,
            kept_by: Some(crate::Keeper::Array),
            failed: Some(protocol::Status::from_code(700)),
        };
        assert_eq!(MigrationReport::decode(r.encode(), 1200, 4096), r);
        let moved = MigrationReport {
            moved: true,
            kept_by: None,
            failed: None,
            ..r
        };
        assert_eq!(MigrationReport::decode(moved.encode(), 1200, 4096), moved);
        // A GPU past 16 bits is sent as the last one, not as GPU 1.
        let far = MigrationReport { gpu: 65537, ..r };
        assert_eq!(MigrationReport::decode(far.encode(), 0, 0).gpu, 65535);
    }
}
