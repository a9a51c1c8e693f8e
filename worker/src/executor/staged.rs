//! Modules loaded ahead of a restore (`Checkpoint::stage`): a spare's
//! context loads the modules of a checkpoint about to arrive from another
//! host before the guest is paused, and the restore takes each whose image
//! is byte for byte one of them instead of loading it during the pause.
//! Matched on the whole image, so a restore never gets a module other than
//! the one its image makes.

use protocol::ImageKind;

/// The modules staged in one context, each with what the executor keeps
/// of it (`T`: the loaded module).
#[derive(Debug)]
pub(crate) struct Staged<T> {
    items: Vec<(ImageKind, Vec<u8>, T)>,
    taken: usize,
}

impl<T> Default for Staged<T> {
    fn default() -> Self {
        Staged {
            items: Vec::new(),
            taken: 0,
        }
    }
}

impl<T> Staged<T> {
    /// Keeps `module`, loaded from `image` as `kind`.
    pub(crate) fn put(&mut self, kind: ImageKind, image: Vec<u8>, module: T) {
        self.items.push((kind, image, module));
    }

    /// The module staged from exactly `image` as `kind`, taken out.
    pub(crate) fn take(&mut self, kind: ImageKind, image: &[u8]) -> Option<T> {
        let i = self
            .items
            .iter()
            .position(|(k, img, _)| *k == kind && img.as_slice() == image)?;
        self.taken += 1;
        Some(self.items.swap_remove(i).2)
    }

    /// How many were taken since the context was staged.
    pub(crate) fn taken(&self) -> usize {
        self.taken
    }

    /// Every module not taken, and the count set back.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        self.taken = 0;
        self.items.drain(..).map(|(_, _, m)| m).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_bytes_as_the_same_kind_take_a_staged_module() {
        let mut s = Staged::default();
        s.put(ImageKind::Cubin, b"abc".to_vec(), 1);
        s.put(ImageKind::Cubin, b"abc".to_vec(), 2);
        s.put(ImageKind::Ptx, b"xyz".to_vec(), 3);
        assert_eq!(s.take(ImageKind::Cubin, b"abd"), None);
        assert_eq!(s.take(ImageKind::Cubin, b"ab"), None);
        assert_eq!(s.take(ImageKind::Ptx, b"abc"), None);
        assert_eq!(s.taken(), 0);
        assert!(matches!(s.take(ImageKind::Cubin, b"abc"), Some(1 | 2)));
        assert!(matches!(s.take(ImageKind::Cubin, b"abc"), Some(1 | 2)));
        assert_eq!(s.take(ImageKind::Cubin, b"abc"), None, "each taken once");
        assert_eq!(s.taken(), 2);
        assert_eq!(s.drain(), vec![3]);
        assert!(s.drain().is_empty());
        assert_eq!(s.taken(), 0);
    }
}
