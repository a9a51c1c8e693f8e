//! scripts/lint-codemap: fails naming every source file ARCHITECTURE.md
//! does not name, in each of the ways the page names files, and passes
//! once all are named.

use std::path::{Path, PathBuf};
use std::process::Output;

use tests::{workspace, write_under};

/// A workspace of five source files, a test and a fuzz target, and a code
/// map naming them all but `a/src/lost.rs` (unless `all`).
fn fixture(name: &str, all: bool) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("lint-codemap")
        .join(name);
    let _ = std::fs::remove_dir_all(&root);
    for f in [
        "a/src/lib.rs",
        "a/src/lost.rs",
        "a/src/deep/one.rs",
        "b/src/exec/sim/run.rs",
        "b/src/exec/cuda/run.rs",
        "a/tests/big.rs",
        "a/src/deep/tests.rs",
        "fuzz/fuzz_targets/t.rs",
    ] {
        write_under(&root, f, "");
    }
    let mut map = String::from("# Code map\n\n## `a`\n\nUnder `a/src/`:\n\n");
    map += "- `lib.rs`: the crate.\n- `deep/one.rs`: one.\n";
    if all {
        map += "- `lost.rs`: found.\n";
    }
    // A file named elsewhere by its path from the root; `one.rs` named
    // outside its folder's section does not count for it.
    map += "\n## `b`\n\nSee `a/src/deep/one.rs` and `lost.rs`.\n\n";
    map += "### `b/src/exec/`: a table\n\n| trait | `sim/` | `cuda/` |\n| --- | --- | --- |\n";
    map += "| Run | `run.rs` | `run.rs` |\n";
    write_under(&root, "ARCHITECTURE.md", &map);
    root
}

fn lint(root: &Path) -> Output {
    std::process::Command::new("python3")
        .arg(workspace().join("scripts/lint-codemap"))
        .arg("--root")
        .arg(root)
        .output()
        .expect("python3 runs scripts/lint-codemap")
}

#[test]
fn lint_codemap_names_a_source_file_the_page_does_not() {
    let out = lint(&fixture("missing", false));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let named: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("not named in"))
        .collect();
    assert_eq!(
        named,
        ["a/src/lost.rs: not named in ARCHITECTURE.md's code map"],
        "{text}"
    );
}

#[test]
fn lint_codemap_passes_when_every_source_file_is_named() {
    let out = lint(&fixture("all", true));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.ends_with("0 not named\n"), "{text}");
}
