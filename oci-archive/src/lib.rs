//! OCI image archives: an image layout (`oci-layout`, `index.json`, `blobs/sha256/…`) in
//! one tar file, as `podman load -i` and `ctr images import` read it. index.json names one
//! image index, by a reference, holding a manifest per platform, as a registry's
//! multi-platform image does: runtimes pick the node's own. Written reproducibly — every
//! entry of the archive and of a layer made here has owner 0 and time 0 — so the same
//! content gives the same digests.

use std::{io, path::Path};

use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

/// One platform's image: its architecture as OCI names it (`amd64`, `arm64`), its run
/// config (`Entrypoint`, `Cmd`, `Env`, `Labels`) and its one layer, an uncompressed tar.
pub struct Image {
    pub architecture: &'static str,
    pub config: Value,
    pub layer: Vec<u8>,
}

/// The OCI name of a Rust target architecture (`std::env::consts::ARCH`).
pub fn architecture_of(rust_arch: &str) -> Option<&'static str> {
    match rust_arch {
        "x86_64" => Some("amd64"),
        "aarch64" => Some("arm64"),
        _ => None,
    }
}

/// The OCI name of the architecture this program was built for: the platform of an image
/// it makes for its own machine.
pub fn host_architecture() -> &'static str {
    architecture_of(std::env::consts::ARCH)
        .unwrap_or_else(|| panic!("no OCI name for {}", std::env::consts::ARCH))
}

/// `sha256:<hex>` of `bytes`, as OCI names a blob.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// A tar header of `kind` with `mode`, owner 0, time 0 and size 0 (set a file's size).
pub fn header(kind: tar::EntryType, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(0);
    header
}

/// A layer of the directory tree at `root`, its symbolic links kept as links.
pub fn layer_of_dir(root: &Path) -> io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    tar.mode(tar::HeaderMode::Deterministic);
    tar.append_dir_all(".", root)?;
    tar.into_inner()
}

/// The archive of `images`, named `reference` (containerd reads its own annotation, podman
/// the OCI one; both get the full reference, so that neither prefixes a registry).
pub fn archive(images: &[Image], reference: &str) -> io::Result<Vec<u8>> {
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    let mut manifests = Vec::new();
    for image in images {
        let config = serde_json::to_vec(&json!({
            "architecture": image.architecture,
            "os": "linux",
            "config": image.config,
            "rootfs": {"type": "layers", "diff_ids": [digest(&image.layer)]},
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
                "digest": digest(&image.layer),
                "size": image.layer.len(),
            }],
        }))?;
        manifests.push(json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "platform": {"architecture": image.architecture, "os": "linux"},
        }));
        blobs.extend([image.layer.clone(), config, manifest]);
    }
    let image_index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }))?;
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": digest(&image_index),
            "size": image_index.len(),
            "annotations": {
                "io.containerd.image.name": reference,
                "org.opencontainers.image.ref.name": reference,
            },
        }],
    }))?;
    blobs.push(image_index);
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |name: &str, bytes: &[u8]| {
        let mut header = header(tar::EntryType::Regular, 0o644);
        header.set_size(bytes.len() as u64);
        tar.append_data(&mut header, name, bytes)
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &index)?;
    let mut written = std::collections::BTreeSet::new();
    for blob in &blobs {
        let digest = digest(blob);
        // Two platforms may share a blob (the same bytes): it is stored once.
        if written.insert(digest.clone()) {
            add(&blob_name(&digest), blob)?;
        }
    }
    tar.into_inner()
}

/// Every file of a tar archive (an image archive, a layer) with its name, in order.
pub fn files(archive: impl io::Read) -> io::Result<Vec<(String, Vec<u8>)>> {
    let mut tar = tar::Archive::new(archive);
    let mut files = Vec::new();
    for entry in tar.entries()? {
        let mut entry = entry?;
        let name = entry.path()?.display().to_string();
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut entry, &mut bytes)?;
        files.push((name, bytes));
    }
    Ok(files)
}

/// Where the layout keeps the blob `digest`.
pub fn blob_name(digest: &str) -> String {
    format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_an_oci_layout_of_one_index_with_a_manifest_per_platform() {
        let images = [
            Image {
                architecture: "amd64",
                config: json!({"Cmd": ["/a"]}),
                layer: b"amd64 layer".to_vec(),
            },
            Image {
                architecture: "arm64",
                config: json!({"Cmd": ["/b"]}),
                layer: b"arm64 layer".to_vec(),
            },
        ];
        let archive = archive(&images, "localhost/redirector:9.9.9").unwrap();
        let entries = files(archive.as_slice()).unwrap();
        let blob = |digest: &str| {
            let name = blob_name(digest);
            let (_, bytes) = entries.iter().find(|(n, _)| *n == name).expect(&name);
            assert_eq!(super::digest(bytes), digest);
            bytes.clone()
        };
        let json = |bytes: Vec<u8>| serde_json::from_slice::<Value>(&bytes).unwrap();
        let index = json(
            entries
                .iter()
                .find(|(n, _)| n == "index.json")
                .unwrap()
                .1
                .clone(),
        );
        assert_eq!(index["manifests"].as_array().unwrap().len(), 1);
        let entry = &index["manifests"][0];
        assert_eq!(
            entry["annotations"]["io.containerd.image.name"],
            "localhost/redirector:9.9.9"
        );
        assert_eq!(
            entry["mediaType"],
            "application/vnd.oci.image.index.v1+json"
        );
        let image_index = json(blob(entry["digest"].as_str().unwrap()));
        let manifests = image_index["manifests"].as_array().unwrap();
        assert_eq!(manifests.len(), 2);
        for (m, image) in manifests.iter().zip(&images) {
            assert_eq!(m["platform"]["architecture"], image.architecture);
            assert_eq!(m["platform"]["os"], "linux");
            let manifest = json(blob(m["digest"].as_str().unwrap()));
            let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
            assert_eq!(blob(layer_digest), image.layer);
            let config = json(blob(manifest["config"]["digest"].as_str().unwrap()));
            assert_eq!(config["architecture"], image.architecture);
            assert_eq!(config["config"], image.config);
            assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
        }
    }

    #[test]
    fn architectures_are_named_as_oci_names_them() {
        assert_eq!(architecture_of("x86_64"), Some("amd64"));
        assert_eq!(architecture_of("aarch64"), Some("arm64"));
        assert_eq!(architecture_of("riscv64"), None);
        let host = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => panic!("untested architecture {other}"),
        };
        assert_eq!(host_architecture(), host);
    }

    #[test]
    fn a_directory_layer_keeps_its_links_and_is_the_same_twice() {
        let dir = std::env::temp_dir().join(format!("oci-archive-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join("bin/busybox"), b"\x7fELF").unwrap();
        std::os::unix::fs::symlink("busybox", dir.join("bin/sh")).unwrap();
        let one = layer_of_dir(&dir).unwrap();
        let two = layer_of_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(digest(&one), digest(&two));
        let mut tar = tar::Archive::new(one.as_slice());
        let link = tar
            .entries()
            .unwrap()
            .map(Result::unwrap)
            .find(|e| e.path().unwrap().ends_with("bin/sh"))
            .expect("bin/sh");
        assert_eq!(link.header().entry_type(), tar::EntryType::Symlink);
        assert_eq!(
            link.link_name().unwrap().unwrap().as_ref(),
            Path::new("busybox")
        );
    }
}
