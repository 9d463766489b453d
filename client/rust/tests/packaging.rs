//! What `cargo package` puts in the .crate stays in step with the repository: its LICENSE is
//! the root LICENSE and its version the root VERSION file (the protos are copied in at package
//! time by install_test.sh). Skipped outside the repository (an unpacked .crate has neither).

use std::path::PathBuf;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn repo_root() -> Option<PathBuf> {
    let root = crate_dir().join("../..");
    root.join("VERSION").exists().then_some(root)
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
