//! Makes the driver's whole export table from one declarative list.
//!
//! `data/entry_points.tsv` names every symbol the real driver exports, with
//! the base name and version `cuGetProcAddress` knows it by. The family
//! modules under `src/` define the entry points we serve, each with the
//! `export!` macro (`fn cuName [aliases] (args) { .. }`). From the two this
//! writes, into `OUT_DIR`:
//! - `unserved.rs`: an exported stub for every listed symbol no module
//!   defines (it answers `CUDA_ERROR_NOT_SUPPORTED` and logs its name once);
//! - `entry_points.rs`: the lookup table of `cuGetProcAddress`, sorted by
//!   base name, each row pointing at the function that serves the symbol;
//! - `errors.rs`: the `CUresult` names of `data/errors.tsv`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    // Loaded as libcuda.so.1 by programs linked against the real driver.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=data");
    println!("cargo:rerun-if-changed=src");

    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));

    let rows = read_tsv(&root.join("data/entry_points.tsv"));
    let mut served = BTreeMap::new();
    scan(&root.join("src"), &root.join("src"), &mut served);

    let listed: BTreeSet<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    for name in served.keys() {
        assert!(
            listed.contains(name.as_str()),
            "{name} is defined in src/ but is not a driver symbol (data/entry_points.tsv)"
        );
    }

    let mut stubs = String::new();
    for r in &rows {
        let sym = &r[0];
        if !served.contains_key(sym) {
            writeln!(
                stubs,
                "#[no_mangle] pub extern \"C\" fn {sym}() -> crate::CuResult {{ crate::unserved(\"{sym}\") }}"
            )
            .unwrap();
        }
    }
    std::fs::write(out.join("unserved.rs"), stubs).unwrap();

    let mut sorted: Vec<&Vec<String>> = rows.iter().collect();
    sorted.sort_by(|a, b| (&a[1], parse(&a[2])).cmp(&(&b[1], parse(&b[2]))));
    let mut table = String::new();
    writeln!(
        table,
        "pub(crate) static ENTRY_POINTS: [EntryPoint; {}] = [",
        sorted.len()
    )
    .unwrap();
    for r in sorted {
        let (sym, base, version, flavour) = (&r[0], &r[1], parse(&r[2]), &r[3]);
        let path = served
            .get(sym)
            .map(|m| format!("{m}::{sym}"))
            .unwrap_or_else(|| format!("crate::unserved_stubs::{sym}"));
        let flavour = match flavour.as_str() {
            "-" => "Flavour::Legacy",
            "ptds" | "ptsz" => "Flavour::PerThread",
            f => panic!("{sym}: unknown flavour {f}"),
        };
        writeln!(
            table,
            "    EntryPoint {{ symbol: \"{sym}\", base: \"{base}\", version: {version}, flavour: {flavour}, addr: Addr({path} as *const ()) }},"
        )
        .unwrap();
    }
    table.push_str("];\n");
    std::fs::write(out.join("entry_points.rs"), table).unwrap();

    let mut errors = String::from("pub(crate) static ERROR_NAMES: &[(u32, &str)] = &[\n");
    for r in read_tsv(&root.join("data/errors.tsv")) {
        writeln!(errors, "    ({}, \"{}\"),", parse(&r[0]), r[1]).unwrap();
    }
    errors.push_str("];\n");
    std::fs::write(out.join("errors.rs"), errors).unwrap();
}

fn parse(s: &str) -> u32 {
    s.parse().expect("a number")
}

fn read_tsv(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

/// Finds the entry points each module defines: lines `fn cuName` or
/// `fn cuName [alias, alias per_thread]` of `export!` blocks. Records the
/// module path of each.
fn scan(dir: &Path, src: &Path, served: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            scan(&path, src, served);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let module = module_path(&path, src);
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            let Some(rest) = line.trim_start().strip_prefix("fn cu") else {
                continue;
            };
            if !rest.starts_with(|c: char| c.is_ascii_uppercase()) {
                continue;
            }
            let name_end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let mut names = vec![format!("cu{}", &rest[..name_end])];
            let after = rest[name_end..].trim_start();
            if let Some(list) = after.strip_prefix('[') {
                let list = &list[..list.find(']').expect("alias list closes on its line")];
                for alias in list.split(',') {
                    let alias = alias.split_whitespace().next().expect("an alias name");
                    names.push(alias.to_owned());
                }
            }
            for n in names {
                if let Some(other) = served.insert(n.clone(), module.clone()) {
                    panic!("{n} is defined twice ({other} and {module})");
                }
            }
        }
    }
}

fn module_path(file: &Path, src: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    std::iter::once("crate".to_owned())
        .chain(parts)
        .collect::<Vec<_>>()
        .join("::")
}
