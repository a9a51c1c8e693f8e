//! The profiler's controls. A vGPU's guest cannot attach NVIDIA's
//! profilers to the host's GPU (that is the host's to do), so starting and
//! stopping collection are accepted and do nothing, as the driver does
//! when no profiler is attached.

use std::ffi::{c_char, c_int};

use crate::state::thread::need_ctx;

export! {
    fn cuProfilerInitialize(_config: *const c_char, _out: *const c_char, _mode: c_int) {
        need_ctx()?;
        Ok(())
    }

    fn cuProfilerStart() {
        need_ctx()
    }

    fn cuProfilerStop() {
        need_ctx()
    }
}
