//! What binds a spare worker to a VM's process slot (the daemon's
//! `SpareBinding`, read by the spare): any bytes are an error or a binding
//! whose every field is in range (a restore or a stage, not both), never a
//! panic; a binding read encodes
//! back to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wire::feed::{SpareBinding, BINDING_ENTRY_MAX, BINDING_NAME_MAX};

fuzz_target!(|data: &[u8]| {
    if let Ok(n) = SpareBinding::total_len(data) {
        assert!(n >= SpareBinding::head_len());
    }
    let Ok(b) = SpareBinding::decode(data) else {
        return;
    };
    assert!(!b.vm.is_empty() && b.vm.len() <= BINDING_NAME_MAX);
    assert!(!b.vm.contains('/') && !b.vm.contains('\0'));
    assert!(b.slot < 16);
    assert!(!(b.restore && b.stage), "a restore or a stage, not both");
    assert!(b.declared.as_ref().is_none_or(|e| e.len() <= BINDING_ENTRY_MAX));
    assert_eq!(b.encode(), data, "{b:?}");
});
