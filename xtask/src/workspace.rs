//! The workspace and the commands xtask runs: where things are, cargo, and running a
//! command with a clear error.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// cargo, in the workspace, with the eBPF object's build shared between target directories.
pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    share_ebpf_build(&mut cmd);
    cmd
}

/// Points `redirector/build.rs` at one eBPF target directory for every build xtask runs
/// (host and cross, debug and release, the rust-version check), so that the object, built
/// with nightly's `build-std`, is compiled once per architecture.
pub(crate) fn share_ebpf_build(cmd: &mut Command) {
    cmd.env("REDIRECTOR_EBPF_TARGET_DIR", target_dir().join("ebpf"));
}

pub(crate) fn status(mut cmd: Command) -> Result<()> {
    let st = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed: {st}");
    }
    Ok(())
}

pub(crate) fn output(mut cmd: Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && path.starts_with('/')).then(|| PathBuf::from(path))
}

/// Installs a Debian package when `tool` is not there: a command on PATH, or the absolute
/// path of a file the package installs.
/// apt-get waits for dpkg's lock instead of failing at once: xtask commands may run side by
/// side (CI runs its VM jobs two at a time).
pub(crate) const APT_WAITS_FOR_LOCK: [&str; 2] = ["-o", "DPkg::Lock::Timeout=600"];

pub(crate) fn ensure_tool(tool: &str, package: &str) -> Result<()> {
    let there = if tool.starts_with('/') {
        Path::new(tool).exists()
    } else {
        which(tool).is_some()
    };
    if there {
        return Ok(());
    }
    eprintln!("xtask: installing {package} (for {tool})");
    let mut cmd = Command::new("apt-get");
    cmd.args(["install", "-y", "-qq", "--no-install-recommends", package])
        .args(APT_WAITS_FOR_LOCK)
        .env("DEBIAN_FRONTEND", "noninteractive");
    if status(cmd).is_err() {
        status({
            // Two VM jobs may install their QEMU at once: each waits for the other's lock.
            let mut c = Command::new("apt-get");
            c.args(["update", "-qq"]).args(APT_WAITS_FOR_LOCK);
            c
        })?;
        let mut cmd = Command::new("apt-get");
        cmd.args(["install", "-y", "-qq", "--no-install-recommends", package])
            .args(APT_WAITS_FOR_LOCK)
            .env("DEBIAN_FRONTEND", "noninteractive");
        status(cmd)?;
    }
    Ok(())
}
