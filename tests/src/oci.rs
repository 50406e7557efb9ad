//! OCI image archives for the tests' containerd, made from directories (no image is
//! pulled here) by the writer `cargo xtask image` uses, for the machine the tests run on:
//! the probe image, and a release image rebuilt with something added (the upgrade's next
//! kernel side). And what the tests read back from an archive.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_archive::{blob_name, host_architecture, Image};

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

/// An OCI image archive (`work/image.tar`) of `rootfs` as one layer, for this machine's
/// architecture, named `reference`, with `config` as the image's run config
/// (`Entrypoint`, `Cmd`, `Env`).
pub fn archive(work: &Path, rootfs: &Path, reference: &str, config: serde_json::Value) -> PathBuf {
    let layer = oci_archive::layer_of_dir(rootfs)
        .unwrap_or_else(|e| panic!("archiving {}: {e}", rootfs.display()));
    let image = Image {
        architecture: host_architecture(),
        config,
        layer,
    };
    let bytes = oci_archive::archive(&[image], reference).expect("writing an image archive");
    let archive = work.join("image.tar");
    std::fs::write(&archive, bytes).unwrap_or_else(|e| panic!("{}: {e}", archive.display()));
    archive
}

/// An image archive's reference, run config and root filesystem (its layers unpacked
/// into `rootfs`, in order); of the image for this machine's architecture when it holds
/// several platforms.
pub fn unpack(archive: &Path, rootfs: &Path) -> (String, serde_json::Value) {
    unpack_platform(archive, host_architecture(), rootfs)
}

/// As [`unpack`], for the image of architecture `arch` (`amd64`, `arm64`) when the archive
/// names an image index.
pub fn unpack_platform(archive: &Path, arch: &str, rootfs: &Path) -> (String, serde_json::Value) {
    let layout = Layout::read(archive);
    std::fs::create_dir_all(rootfs).unwrap();
    let (reference, _, manifest) = layout.platform_manifest(arch);
    let config = layout.json(manifest["config"]["digest"].as_str().unwrap());
    for layer in manifest["layers"].as_array().unwrap() {
        let mut tar = tar::Archive::new(layout.blob(layer["digest"].as_str().unwrap()));
        tar.set_preserve_permissions(true);
        tar.set_preserve_ownerships(true);
        tar.unpack(rootfs)
            .unwrap_or_else(|e| panic!("unpacking a layer into {}: {e}", rootfs.display()));
    }
    (reference, config["config"].clone())
}

/// The digests of the blobs that make up the archive's `arch` image: its manifest, config
/// and layers.
pub fn platform_blobs(archive: &Path, arch: &str) -> Vec<String> {
    let (_, digest, manifest) = Layout::read(archive).platform_manifest(arch);
    let mut blobs = vec![
        digest,
        manifest["config"]["digest"].as_str().unwrap().to_owned(),
    ];
    for layer in manifest["layers"].as_array().unwrap() {
        blobs.push(layer["digest"].as_str().unwrap().to_owned());
    }
    blobs
}

/// The reference an image archive names its image by.
pub fn reference(archive: &Path) -> String {
    Layout::read(archive).reference()
}

/// The files of an image archive (an OCI image layout), by name.
struct Layout {
    archive: PathBuf,
    files: HashMap<String, Vec<u8>>,
}

impl Layout {
    fn read(archive: &Path) -> Layout {
        let files = std::fs::File::open(archive)
            .and_then(oci_archive::files)
            .unwrap_or_else(|e| panic!("reading {}: {e}", archive.display()))
            .into_iter()
            .map(|(name, bytes)| (name.trim_start_matches("./").to_owned(), bytes))
            .collect();
        Layout {
            archive: archive.to_path_buf(),
            files,
        }
    }

    fn file(&self, name: &str) -> &[u8] {
        self.files
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {}", self.archive.display()))
    }

    fn blob(&self, digest: &str) -> &[u8] {
        self.file(&blob_name(digest))
    }

    /// The blob `digest`, parsed as JSON.
    fn json(&self, digest: &str) -> serde_json::Value {
        parse(self.blob(digest), digest)
    }

    fn index(&self) -> serde_json::Value {
        parse(self.file("index.json"), "index.json")
    }

    fn reference(&self) -> String {
        self.index()["manifests"][0]["annotations"]["io.containerd.image.name"]
            .as_str()
            .expect("the archive names its image")
            .to_owned()
    }

    /// The image reference, and the digest and body of the `arch` manifest: the one
    /// index.json names, or the one for `arch` in the image index it names.
    fn platform_manifest(&self, arch: &str) -> (String, String, serde_json::Value) {
        let mut digest = self.index()["manifests"][0]["digest"]
            .as_str()
            .expect("index.json names a manifest")
            .to_owned();
        let mut manifest = self.json(&digest);
        if manifest["mediaType"] == "application/vnd.oci.image.index.v1+json" {
            let chosen = manifest["manifests"]
                .as_array()
                .expect("an index lists manifests")
                .iter()
                .find(|m| m["platform"]["architecture"] == arch && m["platform"]["os"] == "linux")
                .unwrap_or_else(|| panic!("no linux/{arch} image in {}", self.archive.display()))
                .clone();
            digest = chosen["digest"].as_str().unwrap().to_owned();
            manifest = self.json(&digest);
        }
        (self.reference(), digest, manifest)
    }
}

fn parse(bytes: &[u8], name: &str) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_image_is_for_the_machine_the_tests_run_on() {
        let expected = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => panic!("untested architecture {other}"),
        };
        let work = std::env::temp_dir().join(crate::unique_name("oci"));
        let rootfs = work.join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::write(rootfs.join("bin/app"), b"app").unwrap();
        std::os::unix::fs::symlink("app", rootfs.join("bin/sh")).unwrap();
        let image = archive(
            &work,
            &rootfs,
            "localhost/app:1",
            serde_json::json!({"Cmd": ["/bin/app"]}),
        );
        let layout = Layout::read(&image);
        let (reference, _, manifest) = layout.platform_manifest(expected);
        let config = layout.json(manifest["config"]["digest"].as_str().unwrap());
        assert_eq!(reference, "localhost/app:1");
        assert_eq!(config["architecture"], expected);
        assert_eq!(config["config"]["Cmd"][0], "/bin/app");
        // Read back whole: the same files, the link a link.
        let unpacked = work.join("unpacked");
        let (reference, run) = unpack(&image, &unpacked);
        assert_eq!(reference, "localhost/app:1");
        assert_eq!(run["Cmd"][0], "/bin/app");
        assert_eq!(std::fs::read(unpacked.join("bin/app")).unwrap(), b"app");
        assert_eq!(
            std::fs::read_link(unpacked.join("bin/sh")).unwrap(),
            Path::new("app")
        );
        std::fs::remove_dir_all(&work).unwrap();
    }
}
