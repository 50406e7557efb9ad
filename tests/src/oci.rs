//! OCI image archives for the tests' containerd, made from directories with `tar` (no
//! image is pulled here): the probe image, and a release image rebuilt with something
//! added (the upgrade's next kernel side).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::redirector::run_ok;

/// The archive `cargo xtask image` wrote (REDIRECTOR_IMAGE), or `None` (noted, for
/// `test`) to skip: `cargo xtask test` builds the image and sets the variable.
pub fn release_image(test: &str) -> Option<PathBuf> {
    let image = std::env::var_os("REDIRECTOR_IMAGE").map(PathBuf::from);
    if image.is_none() {
        crate::skip(&format!(
            "{test}: REDIRECTOR_IMAGE not set (`cargo xtask test` builds the image and sets it)"
        ));
    }
    image
}

/// `cmd`'s stdout; panics with its stderr unless it exits 0.
fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run_ok(cmd).stdout).into_owned()
}

fn sha256(path: &Path) -> (String, u64) {
    let sum = stdout(Command::new("sha256sum").arg(path));
    let digest = sum.split_whitespace().next().expect("a digest").to_owned();
    (
        format!("sha256:{digest}"),
        std::fs::metadata(path).unwrap().len(),
    )
}

fn blob_path(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

/// Write `json` as a blob of the OCI layout at `dir`: its digest and size.
fn blob(dir: &Path, json: &serde_json::Value) -> (String, u64) {
    let tmp = dir.join("blob.tmp");
    std::fs::write(&tmp, serde_json::to_vec(json).unwrap()).unwrap();
    let (digest, size) = sha256(&tmp);
    std::fs::rename(&tmp, blob_path(dir, &digest)).unwrap();
    (digest, size)
}

/// An OCI image archive (in `work`) of `rootfs` as one layer, named `reference`, with
/// `config` as the image's run config (`Entrypoint`, `Cmd`, `Env`).
pub fn archive(work: &Path, rootfs: &Path, reference: &str, config: serde_json::Value) -> PathBuf {
    let layout = work.join("layout");
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    let layer = layout.join("layer.tar");
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(rootfs)
            .arg("-cf")
            .arg(&layer)
            .arg("."),
    );
    let (layer_digest, layer_size) = sha256(&layer);
    std::fs::rename(&layer, blob_path(&layout, &layer_digest)).unwrap();
    let (config_digest, config_size) = blob(
        &layout,
        &serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }),
    );
    let (manifest_digest, manifest_size) = blob(
        &layout,
        &serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}],
        }),
    );
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "annotations": {"io.containerd.image.name": reference, "org.opencontainers.image.ref.name": reference},
            }],
        }))
        .unwrap(),
    )
    .unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let archive = work.join("image.tar");
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(&archive)
            .arg("oci-layout")
            .arg("index.json")
            .arg("blobs"),
    );
    std::fs::remove_dir_all(&layout).unwrap();
    archive
}

/// An image archive's reference, run config and root filesystem (its layers unpacked
/// into `rootfs`, in order); of its amd64 image when it holds several platforms.
pub fn unpack(archive: &Path, work: &Path, rootfs: &Path) -> (String, serde_json::Value) {
    unpack_platform(archive, "amd64", work, rootfs)
}

/// As [`unpack`], for the image of architecture `arch` (`amd64`, `arm64`) when the archive
/// names an image index.
pub fn unpack_platform(
    archive: &Path,
    arch: &str,
    work: &Path,
    rootfs: &Path,
) -> (String, serde_json::Value) {
    let layout = extract(archive, work);
    std::fs::create_dir_all(rootfs).unwrap();
    let (reference, _, manifest) = platform_manifest(&layout, arch);
    let config = read_json(&blob_path(
        &layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ));
    for layer in manifest["layers"].as_array().unwrap() {
        run_ok(
            Command::new("tar")
                .arg("-C")
                .arg(rootfs)
                .arg("-xf")
                .arg(blob_path(&layout, layer["digest"].as_str().unwrap())),
        );
    }
    std::fs::remove_dir_all(&layout).unwrap();
    (reference, config["config"].clone())
}

/// The digests of the blobs that make up the archive's `arch` image: its manifest, config
/// and layers.
pub fn platform_blobs(archive: &Path, arch: &str, work: &Path) -> Vec<String> {
    let layout = extract(archive, work);
    let (_, digest, manifest) = platform_manifest(&layout, arch);
    let mut blobs = vec![
        digest,
        manifest["config"]["digest"].as_str().unwrap().to_owned(),
    ];
    for layer in manifest["layers"].as_array().unwrap() {
        blobs.push(layer["digest"].as_str().unwrap().to_owned());
    }
    std::fs::remove_dir_all(&layout).unwrap();
    blobs
}

/// The archive unpacked into `work/unpacked`.
fn extract(archive: &Path, work: &Path) -> PathBuf {
    let layout = work.join("unpacked");
    std::fs::create_dir_all(&layout).unwrap();
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-xf")
            .arg(archive),
    );
    layout
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The image reference of the unpacked `layout`, and the digest and body of its `arch`
/// manifest: the one index.json names, or the one for `arch` in the image index it names.
fn platform_manifest(layout: &Path, arch: &str) -> (String, String, serde_json::Value) {
    let index = read_json(&layout.join("index.json"));
    let entry = &index["manifests"][0];
    let reference = entry["annotations"]["io.containerd.image.name"]
        .as_str()
        .expect("the archive names its image")
        .to_owned();
    let mut digest = entry["digest"].as_str().unwrap().to_owned();
    let mut manifest = read_json(&blob_path(layout, &digest));
    if manifest["mediaType"] == "application/vnd.oci.image.index.v1+json" {
        let chosen = manifest["manifests"]
            .as_array()
            .expect("an index lists manifests")
            .iter()
            .find(|m| m["platform"]["architecture"] == arch && m["platform"]["os"] == "linux")
            .unwrap_or_else(|| panic!("no linux/{arch} image in {}", layout.display()))
            .clone();
        digest = chosen["digest"].as_str().unwrap().to_owned();
        manifest = read_json(&blob_path(layout, &digest));
    }
    (reference, digest, manifest)
}

/// The reference an image archive names its image by.
pub fn reference(archive: &Path) -> String {
    let index = stdout(
        Command::new("tar")
            .arg("-xOf")
            .arg(archive)
            .arg("index.json"),
    );
    let index: serde_json::Value = serde_json::from_str(&index).expect("index.json is JSON");
    index["manifests"][0]["annotations"]["io.containerd.image.name"]
        .as_str()
        .expect("the archive names its image")
        .to_owned()
}
