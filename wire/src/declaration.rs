//! What a manager of VMs (libvirt's hook and `fairvgpu-libvirt`, or an
//! operator's own tool) sends the daemon to declare a vGPU at run time: the
//! body of `PUT /api/v1/vgpus/{vm}`. The daemon checks each field against
//! its GPUs (`daemon/src/control/declare.rs`); here its shape.

use serde::{Deserialize, Serialize};

/// The body of `PUT /api/v1/vgpus/{vm}`: what a VM's vGPU is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VgpuDeclaration {
    /// The tenant the VM belongs to.
    pub tenant: String,
    /// Scheduling weight (> 0); default 1.
    #[serde(default = "one")]
    pub weight: f64,
    /// Device memory the vGPU may allocate, MiB (> 0, at most the GPU's).
    pub memory_limit_mib: u64,
    /// The GPU it runs on; left out, the daemon places it.
    #[serde(default)]
    pub gpu: Option<u32>,
    /// Who manages it (e.g. "libvirt"): reconciliation frees only its own.
    #[serde(default)]
    pub owner: Option<String>,
}

fn one() -> f64 {
    1.0
}

impl VgpuDeclaration {
    /// Parses a declaration from JSON; a field of the wrong type or an
    /// unknown one is named in the error (serde's own type errors give only
    /// a column).
    pub fn from_json(body: &[u8]) -> Result<VgpuDeclaration, String> {
        let v: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
        let Some(obj) = v.as_object() else {
            return Err(
                "expected an object like {\"tenant\": \"acme\", \"memory_limit_mib\": 4096}".into(),
            );
        };
        const TYPES: [(&str, &str); 5] = [
            ("tenant", "a string"),
            ("weight", "a number"),
            ("memory_limit_mib", "a whole number of MiB"),
            ("gpu", "a GPU index"),
            ("owner", "a string"),
        ];
        for (k, _) in obj {
            if !TYPES.iter().any(|(f, _)| f == k) {
                return Err(format!(
                    "unknown field {k:?} (known: tenant, weight, memory_limit_mib, gpu, owner)"
                ));
            }
        }
        for (field, ty) in TYPES {
            if let Some(x) = obj.get(field) {
                let ok = match field {
                    "tenant" | "owner" => x.is_string() || (field == "owner" && x.is_null()),
                    "weight" => x.is_number(),
                    "gpu" => x.is_null() || x.as_u64().is_some_and(|g| u32::try_from(g).is_ok()),
                    _ => x.as_u64().is_some(),
                };
                if !ok {
                    return Err(format!("{field} must be {ty}, not {x}"));
                }
            } else if matches!(field, "tenant" | "memory_limit_mib") {
                return Err(format!("{field} is missing"));
            }
        }
        serde_json::from_value(v).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declaration_refuses_unknown_fields_and_defaults_its_weight() {
        let d =
            VgpuDeclaration::from_json(br#"{"tenant": "acme", "memory_limit_mib": 512}"#).unwrap();
        assert_eq!(d.weight, 1.0);
        assert_eq!(d.gpu, None);
        let e = VgpuDeclaration::from_json(
            br#"{"tenant": "acme", "memory_limit_mib": 512, "wieght": 2}"#,
        )
        .unwrap_err();
        assert!(e.contains("wieght"), "{e}");
        let e = VgpuDeclaration::from_json(
            br#"{"tenant": "acme", "memory_limit_mib": 512, "gpu": -1}"#,
        )
        .unwrap_err();
        assert!(e.starts_with("gpu "), "{e}");
    }
}
