//! Scratch directories for tests and benches, inside the cargo target
//! directory of the running executable (`<target>/tmp`, the folder cargo
//! names `CARGO_TARGET_TMPDIR` for integration tests), so that a test run
//! writes nothing outside the clone.
//!
//! Unix socket paths are limited to [`SOCKET_PATH_MAX`] bytes; [`dir`]
//! refuses a folder too deep to hold the sockets tests put there, naming it,
//! instead of moving elsewhere.

use std::path::{Path, PathBuf};

/// The longest path a unix socket can be bound at (`sun_path` is 108 bytes,
/// one of them the terminating NUL).
pub const SOCKET_PATH_MAX: usize = 107;

/// Room [`dir`] keeps below its folder for a socket's file name (`/` and the
/// name: `grant-gpu0.sock`, a VM's `<name>.sock`).
pub const SOCKET_NAME_ROOM: usize = 24;

/// `<target>/tmp` when the running executable was built by cargo (a test,
/// bench or example under `<target>/<profile>/deps` or
/// `<target>/<profile>/examples`, or a binary under `<target>/<profile>`);
/// `None` for an executable that lives anywhere else (an installed one).
pub fn target_tmp() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    target_tmp_of(&exe)
}

fn target_tmp_of(exe: &Path) -> Option<PathBuf> {
    let mut profile = exe.parent()?;
    if matches!(
        profile.file_name().and_then(|n| n.to_str()),
        Some("deps" | "examples")
    ) {
        profile = profile.parent()?;
    }
    // Every cargo profile folder holds cargo's fingerprints.
    if !profile.join(".fingerprint").is_dir() {
        return None;
    }
    Some(profile.parent()?.join("tmp"))
}

/// Where scratch files go: [`target_tmp`] for a program cargo built, the
/// system's temporary folder (`TMPDIR`) for an installed one.
pub fn root() -> PathBuf {
    target_tmp().unwrap_or_else(std::env::temp_dir)
}

/// A folder to give child processes as `TMPDIR` (and as `HOME` where a
/// program writes there): `<root>/tmpdir`, made if missing, shared by all
/// of a run's tests.
///
/// # Panics
/// When it cannot be made.
pub fn child_tmpdir() -> PathBuf {
    let dir = root().join("tmpdir");
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("creating scratch folder {}: {e}", dir.display()));
    dir
}

/// A fresh, empty folder `<root>/<name>-<pid>` (whatever was there from an
/// earlier run of the same pid is removed).
///
/// # Panics
/// When it cannot be made, or when it is too deep for a unix socket named
/// up to [`SOCKET_NAME_ROOM`] bytes below it (the message names the folder).
pub fn dir(name: &str) -> PathBuf {
    let dir = root().join(format!("{name}-{}", std::process::id()));
    let len = dir.as_os_str().len();
    assert!(
        len + SOCKET_NAME_ROOM <= SOCKET_PATH_MAX,
        "scratch folder {} is {len} bytes long: unix sockets inside it would pass the \
         {SOCKET_PATH_MAX}-byte limit; use a shorter clone path or CARGO_TARGET_DIR",
        dir.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("creating scratch folder {}: {e}", dir.display()));
    dir
}

/// `dir/file` for a unix socket.
///
/// # Panics
/// When the path passes [`SOCKET_PATH_MAX`] (the message names it).
pub fn socket(dir: &Path, file: &str) -> PathBuf {
    let p = dir.join(file);
    if let Err(e) = fits_socket(&p) {
        panic!("{e}");
    }
    p
}

/// Whether a unix socket can be bound at `path`; the error names it.
pub fn fits_socket(path: &Path) -> Result<(), String> {
    let len = path.as_os_str().len();
    if len > SOCKET_PATH_MAX {
        return Err(format!(
            "unix socket path {} is {len} bytes, over the {SOCKET_PATH_MAX}-byte limit",
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_binary_finds_its_target_folder() {
        let t = target_tmp().expect("tests run from a cargo target folder");
        assert_eq!(t.file_name().unwrap(), "tmp");
        // The profile folder beside it holds this very test binary.
        let exe = std::env::current_exe().unwrap();
        assert!(exe.starts_with(t.parent().unwrap()), "{exe:?} vs {t:?}");
    }

    #[test]
    fn an_executable_outside_a_target_folder_has_none() {
        assert_eq!(target_tmp_of(Path::new("/usr/bin/fairvgpu")), None);
        assert_eq!(target_tmp_of(Path::new("fairvgpu")), None);
    }

    #[test]
    fn dir_is_fresh_and_inside_the_target_folder() {
        let d = dir("scratch-self");
        std::fs::write(d.join("f"), b"x").unwrap();
        let again = dir("scratch-self");
        assert_eq!(d, again);
        assert!(!again.join("f").exists());
        assert!(again.starts_with(target_tmp().unwrap()));
        std::fs::remove_dir_all(&again).unwrap();
    }

    #[test]
    fn a_socket_path_over_the_limit_is_refused_by_name() {
        let deep = PathBuf::from("/").join("d".repeat(120)).join("api.sock");
        let msg = fits_socket(&deep).unwrap_err();
        assert!(msg.contains(&deep.display().to_string()), "{msg}");
        assert!(msg.contains("107-byte limit"), "{msg}");
        assert_eq!(
            fits_socket(&PathBuf::from("/").join("d".repeat(106))),
            Ok(())
        );
        assert!(fits_socket(&PathBuf::from("/").join("d".repeat(107))).is_err());
        assert_eq!(
            socket(Path::new("/r"), "api.sock"),
            PathBuf::from("/r/api.sock")
        );
    }
}
