//! A domain's vGPU saved and restored with the domain: `virsh save` and
//! `managedsave`, then `virsh restore --paused` or `virsh start --paused`.
//!
//! - *Saving.* libvirt pauses the domain (reason `save`), and QEMU writes
//!   it out, the region with it. QEMU may copy the region before the
//!   workers finish writing it. On that pause, the watch has the daemon
//!   take the vGPU's checkpoint with the region into `<domain>.fvgpu` of its
//!   checkpoint folder. The domain's latest save replaces an earlier one.
//!   The hook's give-back at the domain's end waits until it is written.
//! - *Restoring.* libvirt starts the domain from its saved state. Started
//!   paused, the watch has the daemon serve on from that file: the region
//!   is written over QEMU's copy before the guest runs. `virsh resume`
//!   then runs it. Started running, the guest ran before the vGPU could be
//!   restored: the watch says so, and the vGPU starts new.
//!
//! Both calls run on a thread of their own, so that other domains' events
//! do not wait for them.

use anyhow::Result;
use daemon::control::check_file_name;
use daemon::libvirt_xml::domain_vgpu;
use virt::domain::Domain;
use virt_sys as sys;

use crate::api::Api;

/// The checkpoint file of domain `name`'s saves, if its name makes one.
pub fn file_for(name: &str) -> Option<String> {
    let f = format!("{name}.fvgpu");
    check_file_name(&f).is_ok().then_some(f)
}

/// Whether `dom` has a fairvgpu vGPU.
fn ours(dom: &Domain) -> Result<bool> {
    Ok(domain_vgpu(&dom.get_xml_desc(0)?)?.is_some())
}

/// Domain `name` (`dom`) was paused: if for its save, its vGPU's
/// checkpoint is taken.
pub fn suspended(api: &Api, dom: &Domain, name: &str) -> Result<()> {
    let (state, reason) = dom.get_state()?;
    if state != sys::VIR_DOMAIN_PAUSED || reason != sys::VIR_DOMAIN_PAUSED_SAVE as i32 {
        return Ok(());
    }
    if !ours(dom)? {
        return Ok(());
    }
    let Some(file) = file_for(name) else {
        tracing::warn!(
            domain = name,
            "saved: its name makes no checkpoint file name, its vGPU is not saved"
        );
        return Ok(());
    };
    let (api, name) = (api.clone(), name.to_owned());
    std::thread::spawn(move || match api.checkpoint(&name, &file) {
        Ok(bytes) => tracing::info!(domain = name, file, bytes, "saved: vGPU checkpoint written"),
        Err(e) => tracing::warn!(domain = name, "saved: no vGPU checkpoint: {e:#}"),
    });
    Ok(())
}

/// Domain `name` (`dom`, with a vGPU) started from a saved state: paused,
/// its vGPU serves on from its checkpoint.
pub fn restored(api: &Api, dom: &Domain, name: &str) -> Result<()> {
    let Some(file) = file_for(name) else {
        return Ok(());
    };
    let (state, _) = dom.get_state()?;
    if state != sys::VIR_DOMAIN_PAUSED {
        tracing::warn!(
            domain = name,
            "restored running: its guest ran before its vGPU could be restored, which starts new (restore with --paused)"
        );
        return Ok(());
    }
    let (api, name) = (api.clone(), name.to_owned());
    std::thread::spawn(move || match api.restore(&name, &file) {
        Ok(n) => tracing::info!(
            domain = name,
            file,
            processes = n,
            "restored: vGPU serves on; resume the domain"
        ),
        Err(e) => tracing::warn!(domain = name, "restored: its vGPU starts new: {e:#}"),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domain_names_its_file_where_the_name_makes_one() {
        assert_eq!(file_for("vm-1_a").as_deref(), Some("vm-1_a.fvgpu"));
        assert_eq!(file_for("../x"), None);
        assert_eq!(file_for("a b"), None);
        assert_eq!(file_for(".hidden"), None);
    }
}
