//! What `cargo package` puts in the .crate stays in step with the repository: the crate's
//! proto/ copy (build.rs compiles it, so the .crate builds on its own) equals ../../proto, its
//! LICENSE the root LICENSE, and its version the root VERSION file. Skipped outside the
//! repository (an unpacked .crate has none of them).

use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn repo_root() -> Option<PathBuf> {
    let root = crate_dir().join("../..");
    root.join("VERSION").exists().then_some(root)
}

fn files_of(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".proto"))
        .collect();
    names.sort();
    names
}

#[test]
fn the_crates_proto_copy_equals_the_repositorys() {
    let Some(root) = repo_root() else { return };
    let (ours, theirs) = (
        crate_dir().join("proto/jobbroker/v1"),
        root.join("proto/jobbroker/v1"),
    );
    let fix =
        "refresh it: cp ../../proto/jobbroker/v1/*.proto proto/jobbroker/v1/ (in client/rust)";
    assert_eq!(
        files_of(&ours),
        files_of(&theirs),
        "client/rust/proto differs: {fix}"
    );
    for name in files_of(&theirs) {
        assert!(
            std::fs::read(ours.join(&name)).unwrap() == std::fs::read(theirs.join(&name)).unwrap(),
            "client/rust/proto/jobbroker/v1/{name} differs from proto/jobbroker/v1/{name}: {fix}"
        );
    }
}

#[test]
fn the_license_is_the_repositorys() {
    let Some(root) = repo_root() else { return };
    assert!(
        std::fs::read(crate_dir().join("LICENSE")).unwrap()
            == std::fs::read(root.join("LICENSE")).unwrap(),
        "client/rust/LICENSE differs from the root LICENSE: cp ../../LICENSE LICENSE"
    );
}

#[test]
fn the_version_is_the_repositorys() {
    let Some(root) = repo_root() else { return };
    let version = std::fs::read_to_string(root.join("VERSION")).unwrap();
    assert_eq!(
        env!("CARGO_PKG_VERSION"),
        version.trim(),
        "Cargo.toml's version differs from the root VERSION file"
    );
    assert_eq!(
        jobbroker::CLIENT_NAME,
        format!("jobbroker-rust/{}", version.trim()),
        "the jobbroker-client metadata"
    );
}
