//! IPC between the workers of a VM whose processes each have a worker of
//! their own (process slots): the VM's export table (a memfd fed to every
//! worker in its snapshot, `worker::exports`) and the relay of the fds an
//! opener needs from the exporter's worker (a memfd of the sim's memory, a
//! POSIX-fd shareable handle of the driver's). Workers are confined (they
//! connect nowhere) and talk only to the daemon over their feeds, so an
//! exporter says `IPC_EXPORTED` with the fd up its lane, the daemon keeps
//! it, and hands a copy down an opener's lane when it says `IPC_WANT`.
//!
//! What a worker says is checked against the table: an entry it did not
//! export (or that is not live) keeps nothing and is handed to nobody.
//! When a worker's feed ends, its exports are revoked, their fds dropped,
//! and its opens closed ([`IpcRelay::lane_ended`]).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use wire::feed::{decode, decode_entry, IPC_DROPPED, IPC_EXPORTED, IPC_WANT};
use worker::exports::VmExports;

use crate::Error;

/// One VM's export table and the fds kept for its entries.
#[derive(Debug)]
pub struct IpcRelay {
    fd: OwnedFd,
    table: VmExports,
    /// (index, generation) -> the exporting lane and the fd, if any.
    kept: Mutex<HashMap<(u16, u32), (u32, Option<OwnedFd>)>>,
}

impl IpcRelay {
    /// A new, empty table for VM `name`.
    pub fn new(name: &str) -> Result<IpcRelay, Error> {
        let fd = VmExports::create(&format!("fairvgpu-{name}-exports"))?;
        let table = VmExports::shared(fd.try_clone().map_err(|source| Error::Io {
            what: "dup of the export table",
            source,
        })?)?;
        Ok(IpcRelay {
            fd,
            table,
            kept: Mutex::default(),
        })
    }

    /// The table's fd, for a worker's snapshot.
    pub fn table_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// What lane `lane`'s worker said (an IPC message `v`, with `fd`):
    /// the entry to hand its fd to that worker, for an `IPC_WANT`.
    pub fn heard(&self, lane: u32, v: i64, fd: Option<OwnedFd>) -> Option<(u16, u32)> {
        let (index, gen) = decode_entry(v);
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        match decode(v).0 {
            IPC_EXPORTED => {
                // Only a live entry of the lane's own, once.
                let own = self
                    .table
                    .entry(index, gen)
                    .is_some_and(|e| e.owner == lane && self.table.live(index, gen));
                if own && !kept.contains_key(&(index, gen)) {
                    // The entry's earlier generations are gone: at most
                    // one fd per entry of the table is kept.
                    kept.retain(|&(i, _), _| i != index);
                    kept.insert((index, gen), (lane, fd));
                } else {
                    tracing::debug!(lane, index, "IPC export of an entry not the worker's");
                }
                None
            }
            IPC_DROPPED => {
                if kept.get(&(index, gen)).is_some_and(|k| k.0 == lane) {
                    kept.remove(&(index, gen));
                }
                None
            }
            IPC_WANT => Some((index, gen)),
            _ => None,
        }
    }

    /// A copy of the fd kept for entry (`index`, `gen`), if it is still
    /// exported and has one.
    pub fn answer(&self, index: u16, gen: u32) -> Option<OwnedFd> {
        self.table.entry(index, gen)?;
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.get(&(index, gen))?.1.as_ref()?.try_clone().ok()
    }

    /// Answers an `IPC_WANT` of entry (`index`, `gen`) on feed `s` (the
    /// feed thread's own write): the fd kept for it, or none.
    pub fn hand_down(
        &self,
        s: &std::os::unix::net::UnixStream,
        index: u16,
        gen: u32,
    ) -> Result<(), transport::Error> {
        let fd = self.answer(index, gen);
        let v = wire::feed::encode_entry(wire::feed::IPC_FD, index, gen);
        transport::server::send_msg(s, v, fd.as_ref().map(AsRawFd::as_raw_fd))
    }

    /// Lane `lane`'s worker is gone: its exports are revoked and their fds
    /// dropped, its opens closed.
    pub fn lane_ended(&self, lane: u32) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<(u16, u32)> = kept
            .iter()
            .filter(|(_, (l, _))| *l == lane)
            .map(|(&k, _)| k)
            .collect();
        for k in &gone {
            kept.remove(k);
        }
        self.table.lane_ended(lane, &gone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::feed::encode_entry;
    use worker::exports::{Kind, Publish};

    fn publish(t: &VmExports, token: u64, owner: u32) -> (u16, u32) {
        t.publish(&Publish {
            token,
            kind: Kind::Mem,
            owner,
            size: 4096,
            handle: [0; 64],
            has_fd: true,
        })
        .unwrap()
    }

    fn memfd() -> OwnedFd {
        transport::shm::create_memfd("fvg-relay-test", 4096).unwrap()
    }

    #[test]
    fn fds_are_kept_for_their_exporters_entries_only_and_dropped_with_the_lane() {
        let r = IpcRelay::new("relay-test").unwrap();
        let (i, g) = publish(&r.table, 5, 1);
        // Lane 2 claims lane 1's entry: nothing kept.
        assert!(r
            .heard(2, encode_entry(IPC_EXPORTED, i, g), Some(memfd()))
            .is_none());
        assert!(r.answer(i, g).is_none());
        r.heard(1, encode_entry(IPC_EXPORTED, i, g), Some(memfd()));
        assert_eq!(r.heard(3, encode_entry(IPC_WANT, i, g), None), Some((i, g)));
        assert!(r.answer(i, g).is_some());
        assert!(
            r.answer(i, g.wrapping_add(1)).is_none(),
            "another generation"
        );
        // The entry reused (freed, then published again): the old fd goes.
        r.table.revoke(i, g);
        let (i2, g2) = publish(&r.table, 6, 1);
        assert_eq!(i2, i);
        r.heard(1, encode_entry(IPC_EXPORTED, i2, g2), Some(memfd()));
        assert_eq!(r.kept.lock().unwrap().len(), 1, "one fd per entry");
        assert!(r.answer(i2, g2).is_some());
        let (i, g) = (i2, g2);
        // Lane 1 ends: the entry is revoked, its fd gone.
        r.lane_ended(1);
        assert!(r.answer(i, g).is_none());
        assert!(r.table.find(6).is_none());
    }
}
