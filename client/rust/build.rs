//! Generates the jobbroker.v1 messages and tonic clients at build time. In the repository it
//! compiles the repository's proto/ (../../proto); a packaged .crate carries its own proto/,
//! which install_test.sh copies in just for `cargo package` (git ignores it), so the .crate
//! builds on its own and the repository holds one copy of the API. Uses $PROTOC when set, else
//! /usr/bin/protoc when present, else `protoc` from PATH.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let packaged = manifest_dir.join("proto");
    let proto_root = if packaged.is_dir() {
        packaged
    } else {
        manifest_dir.join("../../proto")
    };
    let proto_dir = proto_root.join("jobbroker/v1");

    println!("cargo:rerun-if-env-changed=PROTOC");
    if std::env::var_os("PROTOC").is_none() && Path::new("/usr/bin/protoc").exists() {
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", "/usr/bin/protoc") };
    }

    let mut protos = Vec::new();
    for entry in std::fs::read_dir(&proto_dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "proto") {
            protos.push(path);
        }
    }
    protos.sort();
    if protos.is_empty() {
        return Err(format!("no .proto files in {}", proto_dir.display()).into());
    }
    println!("cargo:rerun-if-changed={}", proto_dir.display());
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_protos(&protos, &[proto_root])?;
    Ok(())
}
