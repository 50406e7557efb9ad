//! Builds the eBPF object (redirector-ebpf) and embeds it in the binary.
//!
//! Without bpf-linker the object is left empty so that plain `cargo build`/`cargo test`
//! still work for the user-space code; such a binary refuses to attach and says to run
//! `cargo xtask build` (which installs the eBPF toolchain first).
//!
//! The inner cargo build's output is shown only when it fails, or with
//! `REDIRECTOR_EBPF_BUILD_LOG=1` (as `warning:` lines, the only way a build script has to
//! show text on success): a clean build of the binary prints nothing of its own.

use std::{
    env, fs,
    io::{BufReader, Read as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{anyhow, bail, Context as _};
use cargo_metadata::{Artifact, Message};

const VERBOSE_ENV: &str = "REDIRECTOR_EBPF_BUILD_LOG";
/// A target directory for the eBPF build shared by every build of the binary that names it
/// (`cargo xtask` does, for its debug, release, cross and rust-version builds): the object
/// is then compiled once per architecture, not once per outer target directory and profile.
const SHARED_TARGET_ENV: &str = "REDIRECTOR_EBPF_TARGET_DIR";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:rerun-if-env-changed=REDIRECTOR_SKIP_EBPF");
    println!("cargo:rerun-if-env-changed={VERBOSE_ENV}");
    println!("cargo:rerun-if-env-changed={SHARED_TARGET_ENV}");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let object = out_dir.join("redirector");
    let linker_works = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if env::var_os("REDIRECTOR_SKIP_EBPF").is_some() || !linker_works {
        println!(
            "cargo:warning=bpf-linker not found: building without the eBPF object; run `cargo xtask build` for a working binary"
        );
        fs::write(&object, []).context("writing empty eBPF object")?;
        return write_id(&object);
    }
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "redirector-ebpf")
        .ok_or_else(|| anyhow!("redirector-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("redirector-ebpf manifest has no parent"))?;
    // The build-dependency on the crate re-runs us when its library changes; its binary
    // (the object) needs this too.
    println!("cargo:rerun-if-changed={root_dir}");
    let built = build_ebpf(ebpf.name.as_str(), &out_dir)?;
    fs::copy(&built, &object)
        .with_context(|| format!("copying {} to {}", built.display(), object.display()))?;
    write_id(&object)
}

/// `cargo build` of the eBPF package for the BPF target, on nightly with `build-std`; the
/// object it linked. Its output is kept, and shown only if it fails (or when asked).
fn build_ebpf(package: &str, out_dir: &Path) -> anyhow::Result<PathBuf> {
    let target = match env::var("CARGO_CFG_TARGET_ENDIAN").as_deref() {
        Ok("big") => "bpfeb-unknown-none",
        Ok("little") => "bpfel-unknown-none",
        other => bail!("unsupported target endianness {other:?}"),
    };
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "build", "--package", package])
        .args([
            "--bins",
            "--release",
            "--message-format=json",
            "--target",
            target,
        ])
        .args(["-Z", "build-std=core"])
        // Its own target dir: cargo would otherwise wait on the lock the outer build holds.
        // Per architecture when shared: `bpf_target_arch` below differs between them.
        .arg("--target-dir")
        .arg(match env::var_os(SHARED_TARGET_ENV) {
            Some(shared) => PathBuf::from(shared).join(&arch),
            None => out_dir.join("ebpf-target"),
        })
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            [
                format!("--cfg=bpf_target_arch=\"{arch}\""),
                "-Cdebuginfo=2".into(),
                "-Clink-arg=--btf".into(),
            ]
            .join("\x1f"),
        )
        // The outer build's compiler is the host toolchain's, not nightly's.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {cmd:?} (is rustup installed?)"))?;
    let mut stderr = child.stderr.take().context("the build's stderr")?;
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut log: Vec<String> = Vec::new();
    let mut executables = Vec::new();
    let stdout = BufReader::new(child.stdout.take().context("the build's stdout")?);
    for message in Message::parse_stream(stdout) {
        match message.context("reading the eBPF build's messages")? {
            Message::CompilerArtifact(Artifact {
                executable: Some(executable),
                ..
            }) => executables.push(executable.into_std_path_buf()),
            Message::CompilerMessage(m) => log.extend(
                m.message
                    .rendered
                    .unwrap_or_default()
                    .lines()
                    .map(String::from),
            ),
            Message::TextLine(line) => log.push(line),
            _ => {}
        }
    }
    let status = child.wait().context("waiting for the eBPF build")?;
    let stderr = stderr
        .join()
        .map_err(|_| anyhow!("reading the eBPF build's stderr"))?;
    log.extend(stderr.lines().map(String::from));
    if !status.success() {
        bail!(
            "building the eBPF object failed ({status}): {cmd:?}\n{}",
            log.join("\n")
        );
    }
    if env::var_os(VERBOSE_ENV).is_some_and(|v| v == "1") {
        for line in &log {
            println!("cargo:warning={line}");
        }
    }
    match executables.as_slice() {
        [object] => Ok(object.clone()),
        other => bail!(
            "the eBPF build linked {} objects, not one: {other:?}",
            other.len()
        ),
    }
}

/// `<object>.id`: the object's id, so that the binary names its embedded object without
/// hashing it at every start.
fn write_id(object: &Path) -> anyhow::Result<()> {
    let bytes = fs::read(object).with_context(|| format!("reading {}", object.display()))?;
    let id = redirector_common::identity::object_hash(&bytes);
    fs::write(object.with_extension("id"), format!("{id:016x}")).context("writing the object id")
}
