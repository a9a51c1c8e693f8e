//! What the stand-in writes on standard error, and the state behind it.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use crate::{code, CuResult};

/// Whether `FAIRVGPU_LIBCUDA_TRACE` was set: read from the environment by
/// the first entry point that returns, never changed after.
static TRACE_CALLS: OnceLock<bool> = OnceLock::new();

/// The messages [`log_once`] wrote (`None` until the first); added to by
/// every caller of [`log_once`] and [`not_supported`], never emptied.
static LOGGED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Whether `FAIRVGPU_LIBCUDA_TRACE` asks for every call to be logged.
fn tracing_calls() -> bool {
    *TRACE_CALLS.get_or_init(|| std::env::var_os("FAIRVGPU_LIBCUDA_TRACE").is_some())
}

/// Logs a call and its result on standard error when
/// `FAIRVGPU_LIBCUDA_TRACE` is set (a debugging aid; off, it costs one load).
pub(crate) fn trace(name: &str, r: CuResult) {
    if tracing_calls() {
        eprintln!("fairvgpu libcuda: {name} -> {r}");
    }
}

/// Logs `what` on standard error, once per process.
pub(crate) fn log_once(what: &str) {
    let mut g = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    if g.get_or_insert_with(HashSet::new).insert(what.to_owned()) {
        eprintln!("fairvgpu libcuda: {what}");
    }
}

/// What a feature we do not serve answers (logged once).
pub(crate) fn not_supported(what: &str) -> CuResult {
    log_once(&format!(
        "{what} is not supported; returning CUDA_ERROR_NOT_SUPPORTED"
    ));
    code::NOT_SUPPORTED
}
