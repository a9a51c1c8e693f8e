//! scripts/lint-size: fails on a file over 800 lines and a function over 150
//! lines outside tests, passes when everything is within the limits, and is
//! not fooled by braces in strings, characters and comments.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Output;

use tests::{workspace, write_under};

/// A function `name` of exactly `lines` lines whose body hides closing
/// braces in every kind of literal and comment the scanner must skip.
fn function(name: &str, lines: usize) -> String {
    assert!(lines >= 8);
    let mut s = format!("pub fn {name}<'a>(x: &'a str) -> usize {{\n");
    s += "    let s = \"}\\\" }\";\n";
    s += "    let c = '}'; let q = '\\''; let b = b'}';\n";
    s += "    let r = r#\"} \"}\" }\"#; // } }\n";
    s += "    /* } /* nested } */ } */\n";
    s += "    let t: [u8; 2] = [b'{', b'}'];\n";
    for i in 0..lines - 8 {
        writeln!(s, "    let _v{i} = {i};").unwrap();
    }
    s += "    x.len() + s.len() + r.len() + t.len() + c.len_utf8() + q.len_utf8() + b as usize\n";
    s += "}\n";
    assert_eq!(s.lines().count(), lines);
    s
}

/// A crate where everything is within the limits, or (`over`) with one
/// file of 801 lines and two functions of 151.
fn fixture(name: &str, over: bool) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("lint-size")
        .join(name);
    let _ = std::fs::remove_dir_all(&root);
    let extra = usize::from(over);
    let mut lib = String::from("pub mod long;\npub mod big;\n#[cfg(test)]\nmod checks;\n");
    lib += "trait T {\n    fn declared(&self);\n}\n";
    lib += "#[cfg(test)]\nmod tests {\n    #[allow(dead_code)]\n";
    lib += &function("long_test_helper", 300);
    lib += "}\n";
    lib += "#[test]\n";
    lib += &function("long_test", 200);
    write_under(&root, "src/lib.rs", &lib);
    let mut long = function("fits", 150);
    long += &function("too_long", 150 + extra);
    long += "pub fn after() {}\n";
    long += &function("tricky_too_long", 150 + extra);
    write_under(&root, "src/long.rs", &long);
    let mut big = String::new();
    for i in 0..800 + extra {
        writeln!(big, "pub const C{i}: u32 = {i};").unwrap();
    }
    write_under(&root, "src/big.rs", &big);
    write_under(&root, "src/checks.rs", &function("exempt_by_mod_decl", 400));
    write_under(
        &root,
        "src/checks/deeper.rs",
        &function("exempt_child", 400),
    );
    write_under(&root, "tests/long.rs", &function("exempt_by_dir", 400));
    root
}

fn lint(root: &Path, report: bool) -> Output {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(workspace().join("scripts/lint-size"))
        .arg("--dir")
        .arg(root);
    if report {
        cmd.arg("--report");
    }
    cmd.output().expect("python3 runs scripts/lint-size")
}

/// The lines after "N over the limits:".
fn offenders(out: &Output) -> Vec<String> {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .skip_while(|l| !l.ends_with("over the limits:"))
        .skip(1)
        .map(|l| l.trim().to_owned())
        .collect()
}

#[test]
fn lint_size_names_every_file_and_function_over_the_limits() {
    let root = fixture("over", true);
    let out = lint(&root, false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert_eq!(
        offenders(&out),
        [
            "file src/big.rs: 801 lines (limit 800)",
            "function too_long at src/long.rs:151: 151 lines (limit 150)",
            "function tricky_too_long at src/long.rs:303: 151 lines (limit 150)",
        ],
        "{text}"
    );
    // The tables: the largest file first, tests left out of the functions.
    assert!(text.contains("     801  src/big.rs\n"), "{text}");
    assert!(text.contains("     150  src/long.rs:1 fits\n"), "{text}");
    assert!(!text.contains("exempt"), "{text}");
    assert!(!text.contains("long_test"), "{text}");

    // --report prints the same and passes.
    let report = lint(&root, true);
    assert!(report.status.success());
    assert_eq!(offenders(&report), offenders(&out));
}

#[test]
fn lint_size_passes_within_the_limits() {
    let root = fixture("within", false);
    let out = lint(&root, false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.ends_with("sizes ok\n"), "{text}");
    assert!(text.contains("     800  src/big.rs\n"), "{text}");
    assert!(
        text.contains("     150  src/long.rs:151 too_long\n"),
        "{text}"
    );
}
