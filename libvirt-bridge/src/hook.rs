//! libvirt's qemu hook (`/etc/libvirt/hooks/qemu.d/fairvgpu`): the domain's
//! XML on stdin, its name, the operation and its phase as arguments. It
//! calls only the daemon, never libvirt back (libvirt waits for the hook
//! with the domain locked).
//!
//! - `prepare begin`, `migrate begin` (an incoming migration), `restore
//!   begin`: the vGPU is declared before QEMU opens its socket; a refused
//!   field fails the hook, and libvirt shows the message as the start's error.
//! - `reconnect begin` (libvirtd restarted): declared again where the
//!   daemon lost it; a failure is logged only (it would stop the domain).
//! - `release end`: the vGPU is given back.

use anyhow::{Context as _, Result};
use daemon::libvirt_xml::{domain_vgpu, NAMESPACE};

use crate::api::Api;

/// What the hook does for an operation and phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Declare the vGPU; a refusal fails the hook.
    Declare,
    /// Declare it where missing; a refusal is only logged.
    Redeclare,
    /// Give it back.
    Release,
    /// Nothing to do.
    Nothing,
}

/// The action for libvirt's `op` and `phase`.
pub fn action(op: &str, phase: &str) -> Action {
    match (op, phase) {
        ("prepare" | "migrate" | "restore", "begin") => Action::Declare,
        ("reconnect", "begin") => Action::Redeclare,
        ("release", "end") => Action::Release,
        _ => Action::Nothing,
    }
}

/// Runs the hook for domain `domain`, `xml` being its XML.
pub fn run(api: &Api, domain: &str, op: &str, phase: &str, xml: &str) -> Result<()> {
    let act = action(op, phase);
    match act {
        Action::Nothing => Ok(()),
        Action::Release => {
            // Whatever its metadata says now (even malformed), the vGPU of
            // a domain that had ours goes.
            if xml.contains(NAMESPACE) {
                api.undeclare(domain)
                    .with_context(|| format!("fairvgpu: giving back domain {domain}'s vGPU"))?;
            }
            Ok(())
        }
        Action::Declare | Action::Redeclare => {
            let r = domain_vgpu(xml).map_err(anyhow::Error::from).and_then(|v| {
                let Some(v) = v else { return Ok(()) };
                api.declare(&v).map(drop)
            });
            match r {
                Err(e) if act == Action::Declare => {
                    Err(e.context(format!("fairvgpu: domain {domain}'s vGPU")))
                }
                Err(e) => {
                    tracing::warn!(domain, "declaring its vGPU again: {e:#}");
                    Ok(())
                }
                Ok(()) => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_has_its_action() {
        assert_eq!(action("prepare", "begin"), Action::Declare);
        assert_eq!(action("migrate", "begin"), Action::Declare);
        assert_eq!(action("reconnect", "begin"), Action::Redeclare);
        assert_eq!(action("release", "end"), Action::Release);
        assert_eq!(action("start", "begin"), Action::Nothing);
        assert_eq!(action("stopped", "end"), Action::Nothing);
    }

    #[test]
    fn a_domain_without_our_metadata_needs_no_daemon() {
        // No daemon at this socket: a call would fail.
        let api = Api(daemon::control::ApiTarget::Unix(
            "/nonexistent/api.sock".into(),
        ));
        let xml = "<domain><name>d</name></domain>";
        for (op, phase) in [
            ("prepare", "begin"),
            ("release", "end"),
            ("reconnect", "begin"),
        ] {
            run(&api, "d", op, phase, xml).unwrap();
        }
        let ours = format!(
            "<domain><name>d</name><metadata><v:vgpu xmlns:v='{NAMESPACE}' tenant='a' memory_limit_mib='8'/></metadata></domain>"
        );
        assert!(run(&api, "d", "prepare", "begin", &ours).is_err());
        // A bad field fails before any call, naming the field.
        let bad = ours.replace("memory_limit_mib='8'", "memory_limit_mib='8' weight='0'");
        let e = format!(
            "{:#}",
            run(&api, "d", "prepare", "begin", &bad).unwrap_err()
        );
        assert!(e.contains("weight"), "{e}");
        // A reconnect that cannot reach the daemon does not fail the hook.
        run(&api, "d", "reconnect", "begin", &ours).unwrap();
    }
}
