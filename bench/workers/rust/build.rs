// Names the toolchain and the tonic version in the report's "runtime" field, as the other
// languages' benches name theirs: the compiler's `--version`, and tonic's version from this
// project's Cargo.lock.
use std::process::Command;

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_else(|| "?".into());
    println!("cargo:rustc-env=BENCH_RUSTC_VERSION={version}");

    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let mut tonic = "?".to_string();
    let mut in_tonic = false;
    for line in lock.lines() {
        if line == "[[package]]" {
            in_tonic = false;
        } else if line == "name = \"tonic\"" {
            in_tonic = true;
        } else if in_tonic && let Some(v) = line.strip_prefix("version = \"") {
            tonic = v.trim_end_matches('"').to_string();
        }
    }
    println!("cargo:rustc-env=BENCH_TONIC_VERSION={tonic}");
    println!("cargo:rerun-if-changed=Cargo.lock");
}
