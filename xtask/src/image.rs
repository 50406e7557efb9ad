//! `cargo xtask image`: the node image as an OCI archive, built from the workspace alone —
//! nothing is pulled — for linux/amd64 and linux/arm64 (cross-built here). Each
//! architecture's one layer holds its release binary, linked statically (glibc's
//! `crt-static`) so that the copy install-cni puts on the node runs whatever the host's
//! libc, with its two other names as links. It is not position-independent, as istio's
//! own Go binaries are not: a static PIE relocates itself at every start, and an init
//! container starts once per pod (about 50 page faults and 0.2 ms of its 2.6 ms, 6.18). The archive is reproducible: every entry has
//! owner 0 and time 0, so the same binary gives the same digests.
//!
//! Loads with `podman load -i` and `ctr -n k8s.io images import`; the reference is
//! `localhost/redirector:<crate version>`, which both keep as written (no `docker.io/`).

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context as _, Result};
use oci_archive::header;
use serde_json::json;

use crate::arch::Arch;
use crate::workspace::{cargo, output, status, target_dir};

pub const REPOSITORY: &str = "localhost/redirector";
const BINARY: &str = "usr/local/bin/redirector";
/// The names the binary serves under besides its own (it picks its role by argv[0]).
const ALIASES: [&str; 2] = ["istio-iptables", "redirector-cni"];

/// Builds the static release binary for every architecture and writes the image archive:
/// one index naming a linux/amd64 and a linux/arm64 image. Returns the archive.
pub fn build() -> Result<PathBuf> {
    let mut images = Vec::new();
    let mut version = None;
    for arch in Arch::ALL {
        let binary = static_release_binary(arch)?;
        // The foreign binary runs under qemu-user: it is proven to start, not only to link.
        let reported = binary_version(arch, &binary)?;
        if let Some(first) = &version {
            ensure!(
                *first == reported,
                "the {} binary reports version {reported}, the {} one {first}",
                arch.name(),
                Arch::ALL[0].name()
            );
        }
        version = Some(reported);
        images.push((arch, layer(&binary)?));
    }
    let version = version.context("no architectures")?;
    let reference = format!("{REPOSITORY}:{version}");
    let dir = target_dir().join("image");
    // Each binary also where deploy/Containerfile takes it from (`<arch>/redirector`).
    for arch in Arch::ALL {
        let to = dir.join(arch.name()).join("redirector");
        std::fs::create_dir_all(to.parent().expect("a directory"))?;
        std::fs::copy(shipped_binary(arch), &to)
            .with_context(|| format!("copying to {}", to.display()))?;
    }
    let archive = dir.join(format!("redirector-{version}.oci.tar"));
    let bytes = archive_bytes(&images, &reference, &version)?;
    std::fs::write(&archive, bytes).with_context(|| format!("writing {}", archive.display()))?;
    let platforms: Vec<String> = images
        .iter()
        .map(|(arch, _)| format!("linux/{}", arch.name()))
        .collect();
    eprintln!(
        "xtask image: {reference} ({}) in {} ({} MiB)\n  podman load -i {1}\n  ctr -n k8s.io images import --all-platforms {1}",
        platforms.join(", "),
        archive.display(),
        std::fs::metadata(&archive)?.len() >> 20,
    );
    Ok(archive)
}

/// `cargo build --release` for `arch` with glibc linked in and no relocation: the binary the
/// image ships, and (for the host) the one `cargo xtask bench` measures. Checked to be a
/// static, non-PIE executable for that machine.
pub fn static_release_binary(arch: Arch) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "--package",
        "redirector",
        "--target",
        arch.triple(),
    ]);
    arch.configure_cargo(
        &mut cmd,
        "-C target-feature=+crt-static -C relocation-model=static",
    );
    status(cmd)?;
    let binary = shipped_binary(arch);
    let bytes = std::fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    check_static_executable(&bytes, arch).with_context(|| binary.display().to_string())?;
    Ok(binary)
}

/// Where [`static_release_binary`] puts the binary the image ships for `arch`.
pub fn shipped_binary(arch: Arch) -> PathBuf {
    target_dir().join(arch.triple()).join("release/redirector")
}

/// That `elf` is a 64-bit little-endian executable for `arch`, not position-independent
/// (`ET_EXEC`) and with no program interpreter (statically linked).
fn check_static_executable(elf: &[u8], arch: Arch) -> Result<()> {
    const ET_EXEC: u16 = 2;
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    ensure!(
        elf.starts_with(b"\x7fELF\x02\x01"),
        "not a 64-bit little-endian ELF file"
    );
    let machine = u16_at(18).context("truncated ELF header")?;
    let wanted = match arch {
        Arch::Amd64 => 62,  // EM_X86_64
        Arch::Arm64 => 183, // EM_AARCH64
    };
    ensure!(
        machine == wanted,
        "built for ELF machine {machine}, not {} ({wanted})",
        arch.name()
    );
    ensure!(
        u16_at(16) == Some(ET_EXEC),
        "position-independent (ELF type {:?}, not ET_EXEC)",
        u16_at(16)
    );
    let phoff = u64_at(32).context("truncated ELF header")? as usize;
    let phentsize = usize::from(u16_at(54).context("truncated ELF header")?);
    let phnum = usize::from(u16_at(56).context("truncated ELF header")?);
    for i in 0..phnum {
        let kind = u32_at(phoff + i * phentsize).context("truncated program headers")?;
        if kind == PT_INTERP {
            bail!("dynamically linked (it has a program interpreter)");
        }
    }
    Ok(())
}

/// The version the binary reports (`redirector 0.1.0` → `0.1.0`).
fn binary_version(arch: Arch, binary: &Path) -> Result<String> {
    let mut cmd = arch.run(binary)?;
    cmd.arg("--version");
    let out = output(cmd)?;
    out.split_whitespace()
        .nth(1)
        .map(str::to_owned)
        .with_context(|| format!("no version in {out:?}"))
}

/// The image's one layer: the directories a container needs, the binary and its aliases.
fn layer(binary: &Path) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (dir, mode) in [
        ("dev/", 0o755),
        ("etc/", 0o755),
        ("proc/", 0o555),
        ("run/", 0o755),
        ("sys/", 0o555),
        ("tmp/", 0o1777),
        ("usr/", 0o755),
        ("usr/local/", 0o755),
        ("usr/local/bin/", 0o755),
        ("var/", 0o755),
    ] {
        let mut header = header(tar::EntryType::Directory, mode);
        tar.append_data(&mut header, dir, std::io::empty())?;
    }
    for (name, content) in [
        (
            "etc/passwd",
            "root:x:0:0:root:/:/usr/local/bin/redirector\n",
        ),
        ("etc/group", "root:x:0:\n"),
    ] {
        let mut header = header(tar::EntryType::Regular, 0o644);
        header.set_size(content.len() as u64);
        tar.append_data(&mut header, name, content.as_bytes())?;
    }
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let mut file = header(tar::EntryType::Regular, 0o755);
    file.set_size(bytes.len() as u64);
    tar.append_data(&mut file, BINARY, bytes.as_slice())?;
    // Runtimes name namespaces under /var/run/netns: the same directory as /run/netns.
    let mut header_var_run = header(tar::EntryType::Symlink, 0o777);
    tar.append_link(&mut header_var_run, "var/run", "../run")?;
    for alias in ALIASES {
        let mut header = header(tar::EntryType::Symlink, 0o777);
        tar.append_link(&mut header, format!("usr/local/bin/{alias}"), "redirector")?;
    }
    Ok(tar.into_inner()?)
}

/// The archive of one image per architecture, named `reference` (oci_archive lays it out).
fn archive_bytes(images: &[(Arch, Vec<u8>)], reference: &str, version: &str) -> Result<Vec<u8>> {
    let images: Vec<oci_archive::Image> = images
        .iter()
        .map(|(arch, layer)| oci_archive::Image {
            architecture: arch.name(),
            config: json!({
                "Entrypoint": [format!("/{BINARY}")],
                "Env": ["PATH=/usr/local/bin"],
                "Labels": {"org.opencontainers.image.version": version},
            }),
            layer: layer.clone(),
        })
        .collect();
    Ok(oci_archive::archive(&images, reference)?)
}

#[cfg(test)]
mod tests {
    use oci_archive::digest;

    use super::*;

    #[test]
    fn an_executable_is_checked_for_its_machine_and_static_linking() {
        // A minimal ELF header: 64-bit, little-endian, ET_EXEC, no program headers.
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[16] = 2;
        elf[18] = 183;
        check_static_executable(&elf, Arch::Arm64).unwrap();
        let err = check_static_executable(&elf, Arch::Amd64).unwrap_err();
        assert!(err.to_string().contains("not amd64"), "{err}");
        elf[16] = 3;
        let err = check_static_executable(&elf, Arch::Arm64).unwrap_err();
        assert!(err.to_string().contains("position-independent"), "{err}");
        // One program header, PT_INTERP.
        elf[16] = 2;
        elf[32] = 64;
        elf[54] = 56;
        elf[56] = 1;
        elf.extend_from_slice(&[3, 0, 0, 0]);
        elf.resize(64 + 56, 0);
        let err = check_static_executable(&elf, Arch::Arm64).unwrap_err();
        assert!(err.to_string().contains("dynamically linked"), "{err}");
    }

    #[test]
    fn the_same_binary_gives_the_same_archive() {
        let dir = std::env::temp_dir().join(format!("xtask-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let binary = dir.join("redirector");
        std::fs::write(&binary, b"\x7fELF not really").unwrap();
        let layer_one = layer(&binary).unwrap();
        let layer_two = layer(&binary).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let one = archive_bytes(&[(Arch::Arm64, layer_one.clone())], "r:1", "1").unwrap();
        let two = archive_bytes(&[(Arch::Arm64, layer_two)], "r:1", "1").unwrap();
        assert_eq!(digest(&one), digest(&two));
        let names: Vec<_> = oci_archive::files(layer_one.as_slice())
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        for name in [
            BINARY,
            "usr/local/bin/istio-iptables",
            "usr/local/bin/redirector-cni",
        ] {
            assert!(
                names.iter().any(|n| n == name),
                "{name} missing from {names:?}"
            );
        }
    }
}
