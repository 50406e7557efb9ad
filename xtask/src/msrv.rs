//! The oldest toolchain the workspace says it builds with (`rust-version` in Cargo.toml),
//! proven: the host crates, tests and all, checked with that toolchain, which rustup
//! installs when it is missing.

use std::process::Command;

use anyhow::{Context as _, Result};

use crate::workspace::{status, target_dir, workspace_root};

/// `rust-version` of `[workspace.package]` in the workspace's Cargo.toml.
pub fn rust_version() -> Result<String> {
    let path = workspace_root().join("Cargo.toml");
    let manifest =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    rust_version_in(&manifest).with_context(|| format!("no rust-version in {}", path.display()))
}

fn rust_version_in(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if let Some(value) = line.strip_prefix("rust-version").filter(|_| in_package) {
            let value = value.trim_start().strip_prefix('=')?.trim();
            return Some(value.trim_matches('"').to_owned());
        }
    }
    None
}

/// `cargo check` of the host crates (every target) with the `rust-version` toolchain and
/// the locked dependencies, in a target directory of its own (`target/msrv`). It builds the
/// eBPF object on nightly as any build does (`redirector/build.rs`).
pub fn check() -> Result<()> {
    let version = rust_version()?;
    let mut install = Command::new("rustup");
    install.args([
        "toolchain",
        "install",
        &version,
        "--profile",
        "minimal",
        "--no-self-update",
    ]);
    status(install)?;
    let mut check = Command::new("rustup");
    check
        .current_dir(workspace_root())
        .args(["run", &version, "cargo", "check", "--locked", "--workspace"])
        .args(["--exclude", "redirector-ebpf", "--all-targets"])
        .arg("--target-dir")
        .arg(target_dir().join("msrv"))
        // The outer cargo's compiler is the default toolchain's.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO");
    crate::workspace::share_ebpf_build(&mut check);
    status(check).with_context(|| format!("the workspace does not build with Rust {version}"))
}

#[cfg(test)]
mod tests {
    use super::rust_version_in;

    #[test]
    fn rust_version_is_read_from_the_workspace_package() {
        let manifest = "[workspace]\nmembers = []\n\n[workspace.package]\nversion = \"0.1.0\"\nrust-version = \"1.91\"\n\n[dependencies]\nrust-version = \"9\"\n";
        assert_eq!(rust_version_in(manifest).as_deref(), Some("1.91"));
        assert_eq!(
            rust_version_in("[package]\nrust-version = \"1.80\"\n"),
            None
        );
    }
}
