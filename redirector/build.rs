//! Builds the eBPF object (redirector-ebpf) and embeds it in the binary.
//!
//! Without bpf-linker the object is left empty so that plain `cargo build`/`cargo test`
//! still work for the user-space code; such a binary refuses to attach and says to run
//! `cargo xtask build` (which installs the eBPF toolchain first).

use std::{env, fs, path::PathBuf, process::Command};

use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:rerun-if-env-changed=REDIRECTOR_SKIP_EBPF");
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
    aya_build::build_ebpf(
        [Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )?;
    write_id(&object)
}

/// `<object>.id`: the object's id, so that the binary names its embedded object without
/// hashing it at every start.
fn write_id(object: &std::path::Path) -> anyhow::Result<()> {
    let bytes = fs::read(object).with_context(|| format!("reading {}", object.display()))?;
    let id = redirector_common::identity::object_hash(&bytes);
    fs::write(object.with_extension("id"), format!("{id:016x}")).context("writing the object id")
}
