//! Exports a stub for every NVML symbol no module serves.
//!
//! `data/symbols.txt` lists what the real `libnvidia-ml.so.1` exports; the
//! modules under `src/` define the entry points we serve (lines
//! `fn nvmlName` or `fn nvmlName [alias, alias]`). Every other listed
//! symbol becomes, in `OUT_DIR/unserved.rs`, an exported function that
//! answers `NVML_ERROR_NOT_SUPPORTED` (and logs its name once). Also the
//! 256 entries of the private export table (`src/internal.rs`).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    // Loaded as libnvidia-ml.so.1 by programs linked against NVML.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=data");
    println!("cargo:rerun-if-changed=src");
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));

    let listed: BTreeSet<String> = std::fs::read_to_string(root.join("data/symbols.txt"))
        .expect("data/symbols.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let mut served = BTreeSet::new();
    scan(&root.join("src"), &mut served);
    for name in &served {
        assert!(
            listed.contains(name),
            "{name} is defined in src/ but is not an NVML symbol (data/symbols.txt)"
        );
    }
    let mut stubs = String::new();
    for sym in listed.difference(&served) {
        writeln!(
            stubs,
            "#[no_mangle] pub extern \"C\" fn {sym}() -> crate::Ret {{ crate::unserved(\"{sym}\") }}"
        )
        .unwrap();
    }
    std::fs::write(out.join("unserved.rs"), stubs).unwrap();

    // The entries of `nvmlInternalGetExportTable`'s table, each its own
    // function (`internal.rs`: `refused::<N>` names slot N when called).
    let slots: Vec<String> = (0..256)
        .map(|n| format!("refused::<{n}> as *const c_void"))
        .collect();
    std::fs::write(out.join("slots.rs"), format!("[{}]", slots.join(", "))).unwrap();
}

/// The names on `fn nvml...` lines, with their bracketed aliases.
fn scan(dir: &Path, served: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            scan(&path, served);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let line = line.trim_start().trim_start_matches("pub extern \"C\" ");
            let Some(rest) = line.strip_prefix("fn nvml") else {
                continue;
            };
            if !rest.starts_with(|c: char| c.is_ascii_uppercase()) {
                continue;
            }
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            served.insert(format!("nvml{}", &rest[..end]));
            if let Some(open) = rest[end..].trim_start().strip_prefix('[') {
                let close = open.find(']').expect("aliases end with ]");
                for a in open[..close]
                    .split(',')
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                {
                    served.insert(a.to_owned());
                }
            }
        }
    }
}
