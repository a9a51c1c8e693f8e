//! Module globals whose addresses a guest learnt (`cuModuleGetGlobal`,
//! and the CUDA runtime asks for every variable it registers), across
//! migrations.
//!
//! The driver places a module's globals itself: loaded again on another
//! GPU, a global lands at another address, which the module's kernels use.
//! The guest keeps the address it learnt, so after a move the context
//! answers that address to the guest and takes it, in every copy, memset
//! and kernel parameter, for the global's new home. A pointer to a global
//! the guest stored in device memory is not seen (the operator guide says
//! so).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ffi::CString;

use crate::executor::Handle;

/// A global the guest holds the address of.
#[derive(Clone)]
pub(super) struct Taken {
    pub(super) module: Handle,
    pub(super) name: CString,
    /// The address the guest learnt.
    pub(super) guest: u64,
    pub(super) size: u64,
    /// Where the global is now (the guest's address until a move).
    pub(super) now: u64,
}

/// The globals a context's guest holds, and where each moved to.
#[derive(Default)]
pub(super) struct Globals {
    pub(super) taken: Vec<Taken>,
    /// Guest address -> (size, address now), for the globals whose home
    /// changed.
    moved: BTreeMap<u64, (u64, u64)>,
    /// The span of `moved`'s guest ranges (a quick miss for most values).
    span: (u64, u64),
}

impl Globals {
    pub(super) fn clear(&mut self) {
        *self = Globals::default();
    }

    /// The guest's address of `name` in `module`, if it asked before.
    pub(super) fn known(&self, module: Handle, name: &CString) -> Option<(u64, u64)> {
        self.taken
            .iter()
            .find(|t| t.module == module && &t.name == name)
            .map(|t| (t.guest, t.size))
    }

    /// Notes that the guest learnt a global's address (`at`, where the
    /// driver put it in this context).
    pub(super) fn take(&mut self, module: Handle, name: CString, at: u64, size: u64) {
        self.taken.push(Taken {
            module,
            name,
            guest: at,
            size,
            now: at,
        });
    }

    /// Notes a global restored from a checkpoint: the guest holds `guest`,
    /// the driver put it at `now` in this context.
    pub(super) fn restored(
        &mut self,
        module: Handle,
        name: CString,
        guest: u64,
        now: u64,
        size: u64,
    ) {
        self.taken.push(Taken {
            module,
            name,
            guest,
            size,
            now,
        });
        self.rebuild();
    }

    /// Forgets the globals of an unloaded module.
    pub(super) fn forget_module(&mut self, module: Handle) {
        self.taken.retain(|t| t.module != module);
        self.rebuild();
    }

    /// Sets where each global is now (after a move), by its index in
    /// `taken`.
    pub(super) fn set_homes(&mut self, homes: &[u64]) {
        for (t, &h) in self.taken.iter_mut().zip(homes) {
            t.now = h;
        }
        self.rebuild();
    }

    fn rebuild(&mut self) {
        self.moved = self
            .taken
            .iter()
            .filter(|t| t.now != t.guest && t.size > 0)
            .map(|t| (t.guest, (t.size, t.now)))
            .collect();
        self.span = match (self.moved.first_key_value(), self.moved.last_key_value()) {
            (Some((&lo, _)), Some((&hi, &(n, _)))) => (lo, hi.saturating_add(n)),
            _ => (0, 0),
        };
    }

    /// Whether any guest address is taken for another now.
    pub(super) fn any_moved(&self) -> bool {
        !self.moved.is_empty()
    }

    /// Whether `[p, p + len)` overlaps a moved global's guest range (such
    /// an address must not be handed out again in this context).
    pub(super) fn overlaps(&self, p: u64, len: u64) -> bool {
        let end = p.saturating_add(len.max(1));
        self.moved
            .range(..end)
            .next_back()
            .is_some_and(|(&g, &(n, _))| g.saturating_add(n) > p)
    }

    /// The device address for the guest's `p`.
    #[inline]
    pub(super) fn addr(&self, p: u64) -> u64 {
        if p < self.span.0 || p >= self.span.1 {
            return p;
        }
        match self.moved.range(..=p).next_back() {
            Some((&g, &(n, now))) if p - g < n => now + (p - g),
            _ => p,
        }
    }

    /// Kernel parameters (`sizes`, packed back to back) with each 8-byte
    /// word at an 8-byte offset of a parameter that is a moved global's
    /// guest address taken for its new one.
    pub(super) fn params<'a>(&self, sizes: &[u32], params: &'a [u8]) -> Cow<'a, [u8]> {
        if self.moved.is_empty() {
            return Cow::Borrowed(params);
        }
        let mut out: Option<Vec<u8>> = None;
        let mut at = 0usize;
        for &sz in sizes {
            let end = (at + sz as usize).min(params.len());
            let mut w = at;
            while w + 8 <= end {
                let v = u64::from_le_bytes(params[w..w + 8].try_into().unwrap_or_default());
                let t = self.addr(v);
                if t != v {
                    out.get_or_insert_with(|| params.to_vec())[w..w + 8]
                        .copy_from_slice(&t.to_le_bytes());
                }
                w += 8;
            }
            at = end;
        }
        out.map_or(Cow::Borrowed(params), Cow::Owned)
    }
}

impl super::context::CudaContext {
    /// `params` of a launch of `func`, with moved globals' addresses taken
    /// for their new ones.
    pub(super) fn moved_params<'a>(&self, func: Handle, params: &'a [u8]) -> Cow<'a, [u8]> {
        if !self.globals.any_moved() {
            return Cow::Borrowed(params);
        }
        match self.func(func) {
            Ok((_, sizes)) => self.globals.params(sizes, params),
            Err(_) => Cow::Borrowed(params),
        }
    }

    /// A run's parameter buffer, each launch's translated as in
    /// [`Self::moved_params`].
    pub(super) fn moved_run<'a>(
        &self,
        launches: &[crate::executor::Queued],
        params: &'a [u8],
    ) -> Cow<'a, [u8]> {
        if !self.globals.any_moved() {
            return Cow::Borrowed(params);
        }
        let mut out = params.to_vec();
        for q in launches {
            let Some(p) = params.get(q.params.clone()) else {
                continue;
            };
            if let Cow::Owned(t) = self.moved_params(q.launch.func, p) {
                out[q.params.clone()].copy_from_slice(&t);
            }
        }
        Cow::Owned(out)
    }

    /// A graph's nodes with moved globals' addresses taken for their new
    /// ones (kernel parameters, memset and copy addresses).
    pub(super) fn moved_nodes<'a>(
        &self,
        nodes: &'a [protocol::graph::GraphNode],
    ) -> Cow<'a, [protocol::graph::GraphNode]> {
        use protocol::graph::GraphOp;
        if !self.globals.any_moved() {
            return Cow::Borrowed(nodes);
        }
        let g = &self.globals;
        Cow::Owned(
            nodes
                .iter()
                .map(|n| {
                    let mut n = n.clone();
                    match &mut n.op {
                        GraphOp::Kernel { func, params, .. } => {
                            if let Cow::Owned(t) = self.moved_params(*func, params) {
                                *params = t;
                            }
                        }
                        GraphOp::Memset { dst, .. } => *dst = g.addr(*dst),
                        GraphOp::Copy { dst, src, .. } => {
                            *dst = g.addr(*dst);
                            *src = g.addr(*src);
                        }
                        _ => {}
                    }
                    n
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    #[test]
    fn a_moved_global_is_reached_at_its_old_address_and_nothing_else_is() {
        let mut g = Globals::default();
        g.take(1, cs("counter"), 0x7000_0000, 16);
        g.take(1, cs("table"), 0x7000_0100, 64);
        assert_eq!(g.known(1, &cs("table")), Some((0x7000_0100, 64)));
        assert_eq!(g.known(2, &cs("table")), None);
        assert!(!g.any_moved());
        assert_eq!(g.addr(0x7000_0004), 0x7000_0004);
        g.set_homes(&[0x9000_0000, 0x7000_0100]);
        assert!(g.any_moved());
        assert_eq!(g.addr(0x7000_0004), 0x9000_0004);
        assert_eq!(g.addr(0x7000_0010), 0x7000_0010, "past its end");
        assert_eq!(g.addr(0x7000_0104), 0x7000_0104, "stayed put");
        assert!(g.overlaps(0x6fff_fff0, 0x20));
        assert!(!g.overlaps(0x7000_0010, 0x20));
        // Parameters: a pointer to the global at an 8-byte offset of a
        // parameter is taken for the new one; other values stay.
        let mut p = Vec::new();
        p.extend_from_slice(&7u32.to_le_bytes());
        p.extend_from_slice(&0x7000_0008u64.to_le_bytes());
        p.extend_from_slice(&0x7000_0008u64.to_le_bytes());
        p.extend_from_slice(&5u64.to_le_bytes());
        let out = g.params(&[4, 8, 16], &p);
        assert_eq!(&out[..4], &7u32.to_le_bytes());
        assert_eq!(&out[4..12], &0x9000_0008u64.to_le_bytes());
        assert_eq!(&out[12..20], &0x9000_0008u64.to_le_bytes());
        assert_eq!(&out[20..28], &5u64.to_le_bytes());
        g.forget_module(1);
        assert!(!g.any_moved());
        assert_eq!(g.addr(0x7000_0004), 0x7000_0004);
    }
}
