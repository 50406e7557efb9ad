//! Build, test and demo steps.

use std::io::{BufRead as _, BufReader};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::results::{parse_results, Counts};
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

/// The redirector binary `build` writes.
pub fn redirector_bin() -> std::path::PathBuf {
    target_dir().join("debug").join("redirector")
}

/// Only the redirector binary (for `cargo xtask docs`).
pub fn build_redirector() -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["build", "--package", "redirector", "--bin", "redirector"]);
    status(cmd)
}

/// The checks before the tests, each counted as a test: the docs check, `cargo fmt
/// --check`, clippy with warnings denied (the host crates, then the eBPF crate for its
/// target on nightly, as `redirector/build.rs` builds it), and `cargo check` with the
/// toolchain `rust-version` names.
fn checks() -> Counts {
    let mut counts = Counts::default();
    let mut record = |name: &str, result: Result<()>| match result {
        Ok(()) => counts.passed += 1,
        Err(err) => {
            eprintln!("xtask: {name}: {err:#}");
            counts.failed += 1;
            counts.failed_tests.push(format!("check: {name}"));
        }
    };
    record("docs", crate::docs_check::run(&redirector_bin()));
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--check"]);
    record("cargo fmt --check", status(fmt));
    let mut clippy = cargo();
    clippy.args(CLIPPY_HOST);
    record("clippy", status(clippy));
    let mut ebpf = Command::new("rustup");
    ebpf.current_dir(crate::workspace::workspace_root())
        .args(["run", "nightly", "cargo"])
        .args(CLIPPY_EBPF)
        // Its own target dir: the host build's artifacts are for another target.
        .arg("--target-dir")
        .arg(target_dir().join("clippy-ebpf"))
        .args(["--", "-D", "warnings"])
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{}\"", std::env::consts::ARCH),
        )
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    record("clippy (eBPF)", status(ebpf));
    record("the rust-version build", crate::msrv::check());
    println!("{}", counts.summary("checks"));
    counts
}

/// `cargo xtask check`: [`checks`] alone; an error if any failed.
pub fn check() -> Result<()> {
    let counts = checks();
    if counts.failed > 0 {
        bail!("{} checks failed", counts.failed);
    }
    Ok(())
}

/// clippy over every crate built for the host (the eBPF crate is built for the BPF
/// target only).
pub const CLIPPY_HOST: [&str; 8] = [
    "clippy",
    "--workspace",
    "--exclude",
    "redirector-ebpf",
    "--all-targets",
    "--",
    "-D",
    "warnings",
];

/// clippy over the eBPF crate, for its target, as `rustup run nightly cargo …` (the
/// lint arguments follow).
pub const CLIPPY_EBPF: [&str; 8] = [
    "clippy",
    "--package",
    "redirector-ebpf",
    "--target",
    "bpfel-unknown-none",
    "-Zbuild-std=core",
    "--bins",
    "--release",
];

/// The checks (docs, fmt, clippy), then the unit tests, then the privileged integration
/// tests: every check and test binary runs even when one fails, and the run ends with
/// `tests: N passed, N failed, N skipped` after the failed checks' and tests' names; it
/// fails if any did.
pub fn test(filter: &[String]) -> Result<()> {
    let mut counts = checks();
    // Unit tests: no root, any order.
    let mut unit = cargo();
    unit.args([
        "test",
        "--no-fail-fast",
        "--package",
        "redirector-common",
        "--package",
        "redirector",
        "--package",
        "xtask",
        "--package",
        "redirector-bench",
    ]);
    counts.add(run_tests(unit)?);
    if crate::bootstrap::is_root() || std::env::var_os("CI").is_some() {
        // The node test runs deploy/daemonset.yaml with the image an operator would build.
        let image = crate::image::build()?;
        // Privileged tests share kernel state (bpffs pins, cgroup2): one at a time.
        let mut integ = cargo();
        integ
            .args([
                "test",
                "--no-fail-fast",
                "--package",
                "redirector-tests",
                "--",
                "--test-threads=1",
            ])
            .args(filter)
            // Bootstrap installed podman and containerd: no test may skip for a missing tool.
            .env("REDIRECTOR_TESTS_REQUIRE_TOOLS", "1")
            .env("REDIRECTOR_IMAGE", image)
            .env(
                "REDIRECTOR_SHIPPED_BIN",
                crate::image::shipped_binary(crate::arch::Arch::Amd64),
            );
        bin_env(&mut integ);
        counts.add(run_tests(integ)?);
        counts.add(forced_fallback_pass(filter)?.tagged("fallbacks forced"));
    } else {
        eprintln!("xtask: not root: skipping the privileged integration tests");
    }
    println!("{}", counts.summary("tests"));
    let failed = counts.failed + counts.unfinished.len() as u64;
    if failed > 0 {
        bail!("{failed} tests failed");
    }
    Ok(())
}

/// Forces redirector's kernel fallbacks (feature keys or `all`) in every redirector the
/// tests run, as on a kernel that lacks the features (docs/kernels.md).
pub const FORCE_FALLBACKS_ENV: &str = "REDIRECTOR_FORCE_FALLBACKS";

/// The fallbacks this run forces, from its environment.
pub fn forced_fallbacks() -> Option<String> {
    std::env::var(FORCE_FALLBACKS_ENV)
        .ok()
        .filter(|v| !v.is_empty())
}

/// The suites run again with every fallback forced: the core ones, whose programs and
/// paths the fallbacks change. (`kernel` forces fallbacks itself, test by test.)
pub const FALLBACK_SUITES: [&str; 8] = [
    "outbound",
    "inbound",
    "dns",
    "daemon",
    "cni",
    "engine",
    "conformance",
    "linkerd_conformance",
];

/// [`FALLBACK_SUITES`] with `REDIRECTOR_FORCE_FALLBACKS=all`: every fallback path runs on
/// this kernel too, not only on an old one.
fn forced_fallback_pass(filter: &[String]) -> Result<Counts> {
    println!("xtask: the core suites again with {FORCE_FALLBACKS_ENV}=all");
    let mut forced = cargo();
    forced.args(["test", "--no-fail-fast", "--package", "redirector-tests"]);
    for suite in FALLBACK_SUITES {
        forced.args(["--test", suite]);
    }
    forced
        .args(["--", "--test-threads=1"])
        .args(filter)
        .env("REDIRECTOR_TESTS_REQUIRE_TOOLS", "1")
        .env(FORCE_FALLBACKS_ENV, "all");
    bin_env(&mut forced);
    run_tests(forced)
}

/// Runs `cmd` (a `cargo test`) with its output shown as it comes and read for libtest's
/// results. A run that fails with no test failed (a build error) is an error.
fn run_tests(mut cmd: Command) -> Result<Counts> {
    let (reader, writer) = std::io::pipe().context("creating a pipe")?;
    cmd.stdout(writer.try_clone().context("cloning a pipe")?)
        .stderr(writer);
    let mut child = cmd.spawn().with_context(|| format!("running {cmd:?}"))?;
    // The child holds the writing ends now; the pipe ends when it (and its children) exit.
    drop(cmd);
    let mut log = String::new();
    for line in BufReader::new(reader).lines() {
        let line = line.context("reading the test output")?;
        println!("{line}");
        log.push_str(&line);
        log.push('\n');
    }
    let status = child.wait().context("waiting for cargo test")?;
    let counts = parse_results(&log);
    if !status.success() && counts.failed == 0 && counts.unfinished.is_empty() {
        bail!("cargo test failed before any test failed: {status}");
    }
    Ok(counts)
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
/// prints the report and writes `target/bench/bench.{json,md,svg}`. A whole run (no
/// `--quick`, `--only` or `--modes`) also publishes the report as docs/bench.md (below its
/// hand-written head) and the plot as docs/bench.svg, so the published figures are always
/// those of a real run.
pub fn bench(args: &[String]) -> Result<()> {
    crate::workspace::ensure_tool("wrk", "wrk")?;
    crate::workspace::ensure_tool("nginx", "nginx")?;
    // redirector on its own, as it ships (statically linked, as the image holds it): built
    // with the tests' crates, cargo would unify their dependencies' features into it
    // (hyper's client, for one); linked dynamically, it spends about a fifth of an init
    // container's run in the dynamic loader (perf, 2026-11-25).
    let redirector = crate::image::static_release_binary(crate::arch::Arch::Amd64)?;
    for package in ["redirector-tests", "redirector-bench"] {
        let mut build = cargo();
        build.args(["build", "--release", "--package", package, "--bins"]);
        status(build)?;
    }
    let bin = target_dir().join("release");
    let mut cmd = Command::new(bin.join("bench"));
    cmd.args(args)
        .arg("--out")
        .arg(target_dir().join("bench"))
        .env("REDIRECTOR_BIN", redirector)
        .env("PROBE_BIN", bin.join("probe"))
        .env("SIDECAR_BIN", bin.join("sidecar"))
        .env("DNSPROBE_BIN", bin.join("dnsprobe"))
        .env("STANDIN_ZTUNNEL_BIN", bin.join("standin-ztunnel"));
    status(cmd)?;
    let partial = ["--quick", "--only", "--modes"];
    if args.iter().any(|a| partial.contains(&a.as_str())) {
        return Ok(());
    }
    publish_bench(
        &target_dir().join("bench"),
        &crate::workspace::workspace_root().join("docs"),
    )
}

/// The line in docs/bench.md after which the bench writes its report.
const BENCH_MARKER: &str = "<!-- The report below is written by `cargo xtask bench`. -->";

/// docs/bench.md: its head (everything up to [`BENCH_MARKER`]) kept, then the report of
/// the run in `out`; docs/bench.svg: the run's plot.
fn publish_bench(out: &std::path::Path, docs: &std::path::Path) -> Result<()> {
    use anyhow::Context as _;
    let doc = docs.join("bench.md");
    let current =
        std::fs::read_to_string(&doc).with_context(|| format!("reading {}", doc.display()))?;
    let head = current
        .split_once(BENCH_MARKER)
        .map(|(head, _)| head)
        .with_context(|| format!("{} has no line {BENCH_MARKER}", doc.display()))?;
    let report = std::fs::read_to_string(out.join("bench.md")).context("reading the report")?;
    std::fs::write(&doc, format!("{head}{BENCH_MARKER}\n\n{report}"))
        .with_context(|| format!("writing {}", doc.display()))?;
    let plot = out.join("bench.svg");
    if plot.exists() {
        std::fs::copy(&plot, docs.join("bench.svg")).context("copying the plot")?;
    }
    eprintln!("bench: published {}", doc.display());
    Ok(())
}
