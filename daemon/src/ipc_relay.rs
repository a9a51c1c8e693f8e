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

use wire::feed::{decode, decode_entry, IPC_EXPORTED, IPC_WANT};
use worker::exports::VmExports;

use crate::Error;

/// (index, generation) -> the exporting lane and the fd, if any.
type Kept = HashMap<(u16, u32), (u32, Option<OwnedFd>)>;

/// An answer to send: (lane, index, generation).
pub type Answer = (u32, u16, u32);

/// Wants held until their export's fd comes, at most (each worker asks
/// for one at a time per channel).
const WAITING: usize = 1024;

/// What the relay keeps: the fds, and the wants that came before them
/// (the exporter's and the opener's feeds are read by threads of their
/// own, so an opener may ask before the exporter's fd is heard).
#[derive(Debug, Default)]
struct State {
    kept: Kept,
    waiting: Vec<Answer>,
}

/// One VM's export table and the fds kept for its entries.
#[derive(Debug)]
pub struct IpcRelay {
    fd: OwnedFd,
    table: VmExports,
    kept: Mutex<State>,
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
    /// the wants to answer now (that one, or those that waited for it).
    pub fn heard(&self, lane: u32, v: i64, fd: Option<OwnedFd>) -> Vec<Answer> {
        let (index, gen) = decode_entry(v);
        let mut st = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let State { kept, waiting } = &mut *st;
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
                let mut now = Vec::new();
                waiting.retain(|&w| {
                    let this = (w.1, w.2) == (index, gen);
                    if this {
                        now.push(w);
                    }
                    !this
                });
                now
            }
            IPC_WANT => {
                // An fd to come: the entry is there, says it has one, and
                // its exporter's word is not heard yet.
                let to_come = !kept.contains_key(&(index, gen))
                    && self.table.entry(index, gen).is_some_and(|e| e.has_fd);
                if to_come && waiting.len() < WAITING {
                    waiting.push((lane, index, gen));
                    return Vec::new();
                }
                vec![(lane, index, gen)]
            }
            _ => Vec::new(),
        }
    }

    /// A copy of the fd kept for entry (`index`, `gen`), if it is still
    /// exported and has one.
    pub fn answer(&self, index: u16, gen: u32) -> Option<OwnedFd> {
        self.table.entry(index, gen)?;
        let st = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        st.kept.get(&(index, gen))?.1.as_ref()?.try_clone().ok()
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
    /// dropped, its opens closed, its wants forgotten; the wants that
    /// waited for its fds are answered (with none).
    pub fn lane_ended(&self, lane: u32) -> Vec<Answer> {
        let mut st = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let State { kept, waiting } = &mut *st;
        let gone: Vec<(u16, u32)> = kept
            .iter()
            .filter(|(_, (l, _))| *l == lane)
            .map(|(&k, _)| k)
            .collect();
        for k in &gone {
            kept.remove(k);
        }
        self.table.lane_ended(lane, &gone);
        waiting.retain(|w| w.0 != lane);
        // Its entries will not send their fds any more (revoked above).
        let mut now = Vec::new();
        waiting.retain(|&w| {
            let live = self.table.entry(w.1, w.2).is_some();
            if !live {
                now.push(w);
            }
            live
        });
        now
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
        let exported = |i, g| encode_entry(IPC_EXPORTED, i, g);
        let want = |i, g| encode_entry(IPC_WANT, i, g);
        // Lane 2 claims lane 1's entry: nothing kept.
        assert!(r.heard(2, exported(i, g), Some(memfd())).is_empty());
        assert!(r.answer(i, g).is_none());
        // Lane 3 asks before lane 1's fd is heard: answered once it is.
        assert!(r.heard(3, want(i, g), None).is_empty());
        assert_eq!(r.heard(1, exported(i, g), Some(memfd())), vec![(3, i, g)]);
        assert_eq!(r.heard(3, want(i, g), None), vec![(3, i, g)]);
        assert!(r.answer(i, g).is_some());
        assert!(
            r.answer(i, g.wrapping_add(1)).is_none(),
            "another generation"
        );
        // A want of an entry that is not there is answered at once (none).
        assert_eq!(r.heard(3, want(400, 9), None), vec![(3, 400, 9)]);

        // The entry reused (freed, then published again): the old fd goes.
        r.table.revoke(i, g);
        let (i2, g2) = publish(&r.table, 6, 1);
        assert_eq!(i2, i);
        r.heard(1, exported(i2, g2), Some(memfd()));
        assert_eq!(r.kept.lock().unwrap().kept.len(), 1, "one fd per entry");
        assert!(r.answer(i2, g2).is_some());

        // Lane 1 ends: its entries are revoked, their fds gone, and a want
        // that waited for another of its entries is answered.
        let (j, h) = publish(&r.table, 7, 1);
        assert!(r.heard(2, want(j, h), None).is_empty());
        assert_eq!(r.lane_ended(1), vec![(2, j, h)]);
        assert!(r.answer(i2, g2).is_none());
        assert!(r.table.find(6).is_none());
    }
}
