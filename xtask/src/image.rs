//! `cargo xtask image`: the node image as an OCI archive, built from the workspace alone —
//! nothing is pulled. One layer holds the release binary, linked statically (glibc's
//! `crt-static`) so that the copy install-cni puts on the node runs whatever the host's
//! libc, with its two other names as links. It is not position-independent, as istio's
//! own Go binaries are not: a static PIE relocates itself at every start, and an init
//! container starts once per pod (about 50 page faults and 0.2 ms of its 2.6 ms, 6.18). The archive is reproducible: every entry has
//! owner 0 and time 0, so the same binary gives the same digests.
//!
//! Loads with `podman load -i` and `ctr -n k8s.io images import`; the reference is
//! `localhost/redirector:<crate version>`, which both keep as written (no `docker.io/`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::workspace::{cargo, output, status, target_dir};

const HOST_TARGET: &str = "x86_64-unknown-linux-gnu";
pub const REPOSITORY: &str = "localhost/redirector";
const BINARY: &str = "usr/local/bin/redirector";
/// The names the binary serves under besides its own (it picks its role by argv[0]).
const ALIASES: [&str; 2] = ["istio-iptables", "redirector-cni"];

/// Builds the static release binary and writes its image archive; returns the archive.
pub fn build() -> Result<PathBuf> {
    let binary = static_release_binary()?;
    let version = binary_version(&binary)?;
    let reference = format!("{REPOSITORY}:{version}");
    let dir = target_dir().join("image");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let archive = dir.join(format!("redirector-{version}.oci.tar"));
    let bytes = archive_bytes(&layer(&binary)?, &reference, &version)?;
    std::fs::write(&archive, bytes).with_context(|| format!("writing {}", archive.display()))?;
    eprintln!(
        "xtask image: {reference} in {} ({} MiB)\n  podman load -i {0}\n  ctr -n k8s.io images import {0}",
        archive.display(),
        std::fs::metadata(&archive)?.len() >> 20,
    );
    Ok(archive)
}

/// `cargo build --release` for the host target with glibc linked in: the binary the image
/// ships, and the one `cargo xtask bench` measures. The flags go through the target's own
/// variable, not RUSTFLAGS, so the eBPF build inside build.rs (another target) does not get
/// them.
pub fn static_release_binary() -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "--package",
        "redirector",
        "--target",
        HOST_TARGET,
    ])
    .env(
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
        "-C target-feature=+crt-static -C relocation-model=static",
    );
    status(cmd)?;
    let binary = shipped_binary();
    let ldd = std::process::Command::new("ldd").arg(&binary).output();
    if let Ok(out) = ldd {
        let text = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && text.contains("=>") {
            bail!("{} is not static:\n{text}", binary.display());
        }
    }
    Ok(binary)
}

/// Where [`static_release_binary`] puts the binary the image ships.
pub fn shipped_binary() -> PathBuf {
    target_dir().join(HOST_TARGET).join("release/redirector")
}

/// The version the binary reports (`redirector 0.1.0` → `0.1.0`).
fn binary_version(binary: &Path) -> Result<String> {
    let mut cmd = std::process::Command::new(binary);
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

fn header(kind: tar::EntryType, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(0);
    header
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// The OCI image layout (oci-layout, index.json, blobs) as one tar archive.
fn archive_bytes(layer: &[u8], reference: &str, version: &str) -> Result<Vec<u8>> {
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": [format!("/{BINARY}")],
            "Env": ["PATH=/usr/local/bin"],
            "Labels": {"org.opencontainers.image.version": version},
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(layer)]},
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": digest(layer),
            "size": layer.len(),
        }],
    }))?;
    // containerd names the image by its own annotation, podman by the OCI one; both get
    // the full reference so that neither prefixes a registry.
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": reference,
                "org.opencontainers.image.ref.name": reference,
            },
        }],
    }))?;
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |name: &str, bytes: &[u8]| -> Result<()> {
        let mut header = header(tar::EntryType::Regular, 0o644);
        header.set_size(bytes.len() as u64);
        tar.append_data(&mut header, name, bytes)?;
        Ok(())
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &index)?;
    for blob in [layer, &config, &manifest] {
        let name = format!("blobs/sha256/{}", &digest(blob)["sha256:".len()..]);
        add(&name, blob)?;
    }
    Ok(tar.into_inner()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut tar = tar::Archive::new(archive);
        tar.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let name = e.path().unwrap().display().to_string();
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut bytes).unwrap();
                (name, bytes)
            })
            .collect()
    }

    #[test]
    fn the_archive_is_an_oci_layout_whose_digests_match_its_blobs() {
        let archive = archive_bytes(b"layer bytes", "localhost/redirector:9.9.9", "9.9.9").unwrap();
        let entries = entries(&archive);
        let blob = |digest: &str| {
            let name = format!("blobs/sha256/{}", &digest["sha256:".len()..]);
            let (_, bytes) = entries.iter().find(|(n, _)| *n == name).expect(&name);
            assert_eq!(super::digest(bytes), digest);
            bytes.clone()
        };
        let index: serde_json::Value =
            serde_json::from_slice(&entries.iter().find(|(n, _)| n == "index.json").unwrap().1)
                .unwrap();
        let entry = &index["manifests"][0];
        assert_eq!(
            entry["annotations"]["io.containerd.image.name"],
            "localhost/redirector:9.9.9"
        );
        let manifest: serde_json::Value =
            serde_json::from_slice(&blob(entry["digest"].as_str().unwrap())).unwrap();
        let layer = blob(manifest["layers"][0]["digest"].as_str().unwrap());
        assert_eq!(layer, b"layer bytes");
        let config: serde_json::Value =
            serde_json::from_slice(&blob(manifest["config"]["digest"].as_str().unwrap())).unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            manifest["layers"][0]["digest"]
        );
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
        let one = archive_bytes(&layer_one, "r:1", "1").unwrap();
        let two = archive_bytes(&layer_two, "r:1", "1").unwrap();
        assert_eq!(digest(&one), digest(&two));
        let names: Vec<_> = entries(&layer_one).into_iter().map(|(n, _)| n).collect();
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
