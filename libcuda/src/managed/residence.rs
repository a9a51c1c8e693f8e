//! Where each chunk of a managed allocation lives: the pure bookkeeping
//! behind migration, with no memory or device touched (unit-tested here).
//!
//! An allocation is cut into chunks of [`CHUNK`] bytes (the last one
//! shorter), each in one of three states ([`Where`]); a migration moves
//! whole chunks, as the driver moves whole pages.

/// Bytes migrated at once (a fault moves the chunk it hit): 2 MiB, the
/// driver's large-page granularity, so that a CPU pass over an array takes
/// one round trip per 2 MiB, not per 4 KiB page.
pub(crate) const CHUNK: u64 = 2 << 20;

/// Where a chunk's bytes are current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Where {
    /// On the device only: the process's pages are inaccessible, a CPU
    /// access faults and brings them back.
    Device,
    /// On both sides, equal: the process may read (its pages are
    /// read-only), a write faults and makes the chunk [`Where::HostDirty`].
    HostClean,
    /// On the host only (the process wrote it): read-write, copied to the
    /// device before the device next runs anything.
    HostDirty,
}

/// A byte span `[off, off + len)` inside an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub off: u64,
    pub len: u64,
}

/// The states of one allocation's chunks.
#[derive(Debug, Clone)]
pub(crate) struct Residence {
    len: u64,
    chunk: u64,
    state: Vec<Where>,
    /// Chunks not [`Where::Device`].
    on_host: usize,
}

impl Residence {
    /// An allocation of `len` bytes (> 0) in chunks of `chunk` bytes (> 0),
    /// all in state `w`.
    pub fn new(len: u64, chunk: u64, w: Where) -> Residence {
        assert!(len > 0 && chunk > 0, "empty allocation or chunk");
        let n = len.div_ceil(chunk) as usize;
        Residence {
            len,
            chunk,
            state: vec![w; n],
            on_host: if w == Where::Device { 0 } else { n },
        }
    }

    /// The allocation's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Chunks whose bytes are (also) on the host.
    pub fn on_host(&self) -> usize {
        self.on_host
    }

    /// The state of the chunk holding `off` (< len).
    pub fn at(&self, off: u64) -> Where {
        self.state[(off / self.chunk) as usize]
    }

    /// The chunk holding `off` (< len).
    pub fn chunk_at(&self, off: u64) -> Span {
        let start = off / self.chunk * self.chunk;
        Span {
            off: start,
            len: self.chunk.min(self.len - start),
        }
    }

    /// Indices of the chunks overlapping `s` (clipped to the allocation).
    fn chunks_of(&self, s: Span) -> std::ops::Range<usize> {
        let end = s.off.saturating_add(s.len).min(self.len);
        if s.len == 0 || s.off >= end {
            return 0..0;
        }
        (s.off / self.chunk) as usize..end.div_ceil(self.chunk) as usize
    }

    /// Puts every chunk overlapping `s` in state `w`.
    pub fn set(&mut self, s: Span, w: Where) {
        for i in self.chunks_of(s) {
            let was = std::mem::replace(&mut self.state[i], w);
            match (was == Where::Device, w == Where::Device) {
                (true, false) => self.on_host += 1,
                (false, true) => self.on_host -= 1,
                _ => {}
            }
        }
    }

    /// The maximal runs of chunks overlapping `s` whose state `keep`
    /// accepts, each run of one state: (its bytes, whole chunks, and the
    /// state).
    pub fn runs(&self, s: Span, keep: impl Fn(Where) -> bool) -> Vec<(Span, Where)> {
        let mut out: Vec<(Span, Where)> = Vec::new();
        for i in self.chunks_of(s) {
            let w = self.state[i];
            if !keep(w) {
                continue;
            }
            let off = i as u64 * self.chunk;
            let len = self.chunk.min(self.len - off);
            match out.last_mut() {
                Some((r, rw)) if *rw == w && r.off + r.len == off => r.len += len,
                _ => out.push((Span { off, len }, w)),
            }
        }
        out
    }

    /// The whole allocation as a span.
    #[cfg(test)]
    pub fn all(&self) -> Span {
        Span {
            off: 0,
            len: self.len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Where::*;
    use super::*;

    fn span(off: u64, len: u64) -> Span {
        Span { off, len }
    }

    #[test]
    fn a_new_allocation_is_all_in_one_state_and_the_last_chunk_is_short() {
        let r = Residence::new(10, 4, HostClean);
        assert_eq!(r.on_host(), 3);
        assert_eq!(r.chunk_at(9), span(8, 2));
        assert_eq!(r.chunk_at(5), span(4, 4));
        assert_eq!(r.runs(r.all(), |_| true), vec![(span(0, 10), HostClean)]);
        let d = Residence::new(10, 4, Device);
        assert_eq!(d.on_host(), 0);
        assert_eq!(d.runs(d.all(), |w| w != Device), vec![]);
    }

    #[test]
    fn setting_a_span_moves_every_chunk_it_touches_and_counts_host_chunks() {
        let mut r = Residence::new(16, 4, Device);
        // Bytes 3..5 touch chunks 0 and 1.
        r.set(span(3, 2), HostDirty);
        assert_eq!(r.on_host(), 2);
        assert_eq!(r.at(0), HostDirty);
        assert_eq!(r.at(7), HostDirty);
        assert_eq!(r.at(8), Device);
        // Setting again to a host state does not count twice.
        r.set(span(0, 4), HostClean);
        assert_eq!(r.on_host(), 2);
        r.set(span(0, 16), Device);
        assert_eq!(r.on_host(), 0);
    }

    #[test]
    fn runs_are_maximal_per_state_and_clipped_to_the_span_and_allocation() {
        let mut r = Residence::new(20, 4, Device);
        r.set(span(0, 8), HostDirty); // chunks 0, 1
        r.set(span(8, 4), HostClean); // chunk 2
        r.set(span(16, 4), HostDirty); // chunk 4
        let host = r.runs(r.all(), |w| w != Device);
        assert_eq!(
            host,
            vec![
                (span(0, 8), HostDirty),
                (span(8, 4), HostClean),
                (span(16, 4), HostDirty)
            ]
        );
        // Only the dirty ones, within bytes 5..17 (chunks 1..=4).
        let dirty = r.runs(span(5, 12), |w| w == HostDirty);
        assert_eq!(
            dirty,
            vec![(span(4, 4), HostDirty), (span(16, 4), HostDirty)]
        );
        // A span past the end or empty touches nothing.
        assert!(r.runs(span(20, 4), |_| true).is_empty());
        assert!(r.runs(span(4, 0), |_| true).is_empty());
        // One reaching past the end is clipped.
        assert_eq!(
            r.runs(span(18, 100), |_| true),
            vec![(span(16, 4), HostDirty)]
        );
    }

    #[test]
    fn a_fault_cycle_read_then_write_then_flush() {
        // The states a chunk goes through: device, a read fault brings it
        // back clean, a write makes it dirty, a launch sends it back.
        let mut r = Residence::new(3 * CHUNK, CHUNK, Device);
        let c = r.chunk_at(CHUNK + 5);
        assert_eq!(c, span(CHUNK, CHUNK));
        r.set(c, HostClean);
        assert_eq!(r.at(CHUNK), HostClean);
        r.set(c, HostDirty);
        let to_copy = r.runs(r.all(), |w| w == HostDirty);
        assert_eq!(to_copy, vec![(c, HostDirty)]);
        for (s, _) in r.runs(r.all(), |w| w != Device) {
            r.set(s, Device);
        }
        assert_eq!(r.on_host(), 0);
    }
}
