//! Build, test and demo steps.

use std::process::Command;

use anyhow::Result;

use crate::workspace::{cargo, status, target_dir};

/// Environment that points the test kit at the binaries just built.
fn bin_env(cmd: &mut Command) {
    let bin = target_dir().join("debug");
    cmd.env("REDIRECTOR_BIN", bin.join("redirector"))
        .env("PROBE_BIN", bin.join("probe"));
}

pub fn build() -> Result<()> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--package",
        "redirector",
        "--package",
        "redirector-tests",
        "--bins",
    ]);
    status(cmd)
}

pub fn test(filter: &[String]) -> Result<()> {
    // Unit tests: no root, any order.
    let mut unit = cargo();
    unit.args([
        "test",
        "--package",
        "redirector-common",
        "--package",
        "redirector",
        "--package",
        "xtask",
    ]);
    status(unit)?;
    if !crate::bootstrap::is_root() && std::env::var_os("CI").is_none() {
        eprintln!("xtask: not root: skipping the privileged integration tests");
        return Ok(());
    }
    // The node test runs deploy/daemonset.yaml with the image an operator would build.
    let image = crate::image::build()?;
    // Privileged tests share kernel state (bpffs pins, cgroup2): one at a time.
    let mut integ = cargo();
    integ
        .args([
            "test",
            "--package",
            "redirector-tests",
            "--",
            "--test-threads=1",
        ])
        .args(filter)
        // Bootstrap installed podman and containerd: no test may skip for a missing tool.
        .env("REDIRECTOR_TESTS_REQUIRE_TOOLS", "1")
        .env("REDIRECTOR_IMAGE", image);
    bin_env(&mut integ);
    status(integ)
}

pub fn demo(daemon: bool) -> Result<()> {
    let mut cmd = Command::new(target_dir().join("debug").join("demo"));
    if daemon {
        cmd.arg("--daemon");
    }
    bin_env(&mut cmd);
    status(cmd)
}

/// `cargo xtask bench`: wrk and nginx, release binaries, then the bench binary, which
/// prints the report and writes `target/bench/bench.{json,md,svg}`.
pub fn bench(args: &[String]) -> Result<()> {
    crate::workspace::ensure_tool("wrk", "wrk")?;
    crate::workspace::ensure_tool("nginx", "nginx")?;
    // redirector on its own, as it ships: built with the tests' crates, cargo would unify
    // their dependencies' features into it (hyper's client, for one).
    for package in ["redirector", "redirector-tests"] {
        let mut build = cargo();
        build.args(["build", "--release", "--package", package, "--bins"]);
        status(build)?;
    }
    let bin = target_dir().join("release");
    let mut cmd = Command::new(bin.join("bench"));
    cmd.args(args)
        .arg("--out")
        .arg(target_dir().join("bench"))
        .env("REDIRECTOR_BIN", bin.join("redirector"))
        .env("PROBE_BIN", bin.join("probe"))
        .env("SIDECAR_BIN", bin.join("sidecar"));
    status(cmd)
}
