//! What a manager sends to declare a vGPU (`PUT /api/v1/vgpus/{vm}`'s body)
//! and what libvirt hands the hook (a domain's XML with fairvgpu's
//! metadata): parsing either is an error or a declaration whose every field
//! is in range, never a panic.
#![no_main]
use wire::declaration::VgpuDeclaration;
use wire::libvirt_xml::{domain_vgpu, element_declaration};
use libfuzzer_sys::fuzz_target;

fn sane(d: &VgpuDeclaration) {
    // Serialized again, it parses to itself (what the bridge sends is what
    // the daemon reads).
    let json = serde_json::to_vec(d).expect("a declaration serializes");
    let back = VgpuDeclaration::from_json(&json);
    assert!(
        back.is_err() || back.as_ref().ok() == Some(d),
        "{d:?} came back as {back:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = VgpuDeclaration::from_json(data) {
        sane(&d);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(Some(v)) = domain_vgpu(text) {
        let d = &v.declaration;
        assert!(d.weight.is_finite() && d.weight > 0.0, "{d:?}");
        assert!(d.memory_limit_mib > 0, "{d:?}");
        assert!(!v.name.is_empty());
        sane(d);
    }
    if let Ok(d) = element_declaration(text) {
        assert!(d.weight.is_finite() && d.weight > 0.0, "{d:?}");
        sane(&d);
    }
});
