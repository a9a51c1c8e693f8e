//! A spare's context loading a checkpoint's modules ahead of its restore
//! (see `executor/staged.rs`): each module loaded through the guest's own
//! call and its functions looked up (the driver loads a kernel lazily, at
//! its first lookup), then set aside, out of the context's objects.

use std::ffi::CString;
use std::ptr::null_mut;

use cudarc::driver::sys;
use protocol::Status;

use super::context::{CudaContext, Obj};
use crate::executor::checkpoint::ContextImage;
use crate::executor::Modules;

impl CudaContext {
    /// [`crate::executor::Checkpoint::stage`]: what was staged before goes
    /// first; the context's objects and next handle are as they were.
    pub(super) fn stage_image(&mut self, image: &ContextImage) -> Result<usize, Status> {
        self.bind()?;
        self.unstage_modules();
        let next = self.next_handle;
        let mut loaded = Vec::with_capacity(image.modules.len());
        let mut r = Ok(());
        for m in &image.modules {
            let kind = m.kind();
            let h = match self.load_module(kind, &m.image) {
                Ok(h) => h,
                Err(s) => {
                    r = Err(s);
                    break;
                }
            };
            let Some(Obj::Module { raw, image: img }) = self.objs.remove(&h) else {
                r = Err(Status::Unknown);
                break;
            };
            for f in image.functions.iter().filter(|f| f.module == m.handle) {
                let Ok(name) = CString::new(f.name.as_str()) else {
                    continue;
                };
                let mut func: sys::CUfunction = null_mut();
                // SAFETY: a module just loaded in this (current) context;
                // the name is NUL-terminated. Only its loading is wanted: a
                // name it lacks fails here and again at the restore.
                let _ = unsafe { sys::cuModuleGetFunction(&mut func, raw, name.as_ptr()) };
            }
            loaded.push((kind, m.image.to_vec(), (raw, img)));
        }
        self.next_handle = next;
        let n = loaded.len();
        for (kind, given, module) in loaded {
            self.staged.put(kind, given, module);
        }
        if let Err(s) = r {
            self.unstage_modules();
            return Err(s);
        }
        Ok(n)
    }

    /// Unloads the modules staged and not taken (the context is current).
    pub(super) fn unstage_modules(&mut self) {
        for (raw, _) in self.staged.drain() {
            // SAFETY: a module of this context that no object refers to,
            // unloaded once.
            let _ = unsafe { sys::cuModuleUnload(raw) };
        }
    }
}
