//! The connection to the vGPU: opened by the first `nvmlInit`, closed by
//! the last `nvmlShutdown`. A monitor's channel (no session on the host);
//! the device's description is read once, the figures that change at each
//! question. A forked child, or a connection the host dropped (its worker
//! restarted), opens a new one.

use std::sync::{Arc, Mutex, MutexGuard};

use guest::{Gpu, GuestError, VgpuReport};
use protocol::DeviceInfo;

use crate::{code, Ret};

#[derive(Default)]
struct State {
    /// `nvmlInit`s not yet matched by an `nvmlShutdown`.
    refs: u32,
    /// The connection, and the process that opened it.
    conn: Option<(Gpu, u32)>,
    /// The device, as the host described it when first asked.
    info: Option<Arc<DeviceInfo>>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a failure to reach the vGPU answers.
fn nvml_error(e: &GuestError) -> Ret {
    crate::log_once(&format!("the vGPU: {e}"));
    match e {
        GuestError::NoVgpu | GuestError::Device { .. } | GuestError::Transport(_) => {
            code::DRIVER_NOT_LOADED
        }
        GuestError::VgpuReset => code::GPU_IS_LOST,
        _ => code::UNKNOWN,
    }
}

/// The live connection of this process, opened if there is none.
fn conn(st: &mut State) -> Result<&mut Gpu, Ret> {
    let pid = std::process::id();
    if st.conn.as_ref().is_some_and(|(_, p)| *p != pid) {
        // Inherited across fork: the channel is the parent's (dropping it
        // leaves it to the parent).
        st.conn = None;
    }
    if st.conn.is_none() {
        let gpu = Gpu::monitor_from_env().map_err(|e| nvml_error(&e))?;
        st.info
            .get_or_insert_with(|| Arc::new(gpu.device_info().clone()));
        st.conn = Some((gpu, pid));
    }
    Ok(&mut st.conn.as_mut().expect("set above").0)
}

/// `nvmlInit`: attaches on the first call; each call counts.
pub(crate) fn init() -> Result<(), Ret> {
    let mut g = lock();
    let st = g.get_or_insert_with(State::default);
    if st.refs == 0 {
        conn(st)?;
    }
    st.refs += 1;
    Ok(())
}

/// `nvmlShutdown`: the last one lets go of the vGPU.
pub(crate) fn shutdown() -> Result<(), Ret> {
    let mut g = lock();
    let st = g.as_mut().ok_or(code::UNINITIALIZED)?;
    if st.refs == 0 {
        return Err(code::UNINITIALIZED);
    }
    st.refs -= 1;
    if st.refs == 0 {
        st.conn = None;
    }
    Ok(())
}

/// The device's description (after `nvmlInit`).
pub(crate) fn info() -> Result<Arc<DeviceInfo>, Ret> {
    let g = lock();
    match g.as_ref() {
        Some(st) if st.refs > 0 => st.info.clone().ok_or(code::UNINITIALIZED),
        _ => Err(code::UNINITIALIZED),
    }
}

/// The device's description whether or not NVML is initialized: the one
/// read already, or read now on a connection of its own that is closed
/// again (the versions NVML answers before `nvmlInit`).
pub(crate) fn info_any() -> Result<Arc<DeviceInfo>, Ret> {
    let mut g = lock();
    let st = g.get_or_insert_with(State::default);
    if let Some(info) = &st.info {
        return Ok(info.clone());
    }
    let gpu = Gpu::monitor_from_env().map_err(|e| nvml_error(&e))?;
    let info = Arc::new(gpu.device_info().clone());
    st.info = Some(info.clone());
    Ok(info)
}

/// The vGPU's figures now (after `nvmlInit`); a connection the host
/// dropped is opened again once.
pub(crate) fn report() -> Result<VgpuReport, Ret> {
    let mut g = lock();
    let st = match g.as_mut() {
        Some(st) if st.refs > 0 => st,
        _ => return Err(code::UNINITIALIZED),
    };
    match conn(st)?.vgpu_status() {
        Ok(r) => Ok(r),
        Err(e) => {
            st.conn = None;
            conn(st)?.vgpu_status().map_err(|_| nvml_error(&e))
        }
    }
}
