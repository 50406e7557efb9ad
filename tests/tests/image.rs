//! The node image as `cargo xtask image` writes it: one index with a linux/amd64 and a
//! linux/arm64 image. podman loads the host's platform from it, containerd imports every
//! platform, and the arm64 image's binary is a static aarch64 executable that starts (under
//! qemu-user, as binfmt would run it).

use std::process::Command;

use redirector_tests::cri::pods::primary_network;
use redirector_tests::cri::Containerd;
use redirector_tests::prelude::*;
use redirector_tests::{oci, require_tools};

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run_ok(cmd).stdout).into_owned()
}

/// The ELF header's machine (62 x86-64, 183 aarch64) and whether the file has a program
/// interpreter (is dynamically linked).
fn elf_machine_and_interp(path: &Path) -> (u16, bool) {
    let elf = std::fs::read(path).unwrap();
    assert!(elf.starts_with(b"\x7fELF\x02\x01"), "{}", path.display());
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]);
    let phoff = u64::from_le_bytes(elf[32..40].try_into().unwrap()) as usize;
    let (size, count) = (usize::from(u16_at(54)), usize::from(u16_at(56)));
    let interp = (0..count).any(|i| elf[phoff + i * size..][..4] == [3, 0, 0, 0]);
    (u16_at(18), interp)
}

#[test]
fn the_arm64_image_holds_a_static_aarch64_binary_that_starts_under_qemu_user() {
    let Some(image) = oci::release_image("image") else {
        return;
    };
    if !require_tools("image", &["qemu-aarch64-static"]) {
        return;
    }
    let work = StateDir::new("image");
    let mut versions = Vec::new();
    for (arch, machine) in [("amd64", 62), ("arm64", 183)] {
        let rootfs = work.path().join(arch);
        let (reference, config) = oci::unpack_platform(&image, arch, &rootfs);
        assert!(
            reference.starts_with("localhost/redirector:"),
            "{reference}"
        );
        assert_eq!(config["Entrypoint"][0], "/usr/local/bin/redirector");
        let binary = rootfs.join("usr/local/bin/redirector");
        assert_eq!(
            elf_machine_and_interp(&binary),
            (machine, false),
            "{arch}: ELF machine and interpreter"
        );
        for alias in ["istio-iptables", "redirector-cni"] {
            let link = std::fs::read_link(rootfs.join("usr/local/bin").join(alias)).unwrap();
            assert_eq!(link, Path::new("redirector"), "{arch}: {alias}");
        }
        let mut run = if arch == "arm64" {
            let mut c = Command::new("qemu-aarch64-static");
            c.arg(&binary);
            c
        } else {
            Command::new(&binary)
        };
        let version = stdout(run.arg("--version"));
        assert_eq!(
            Some(reference.rsplit(':').next().unwrap()),
            version.split_whitespace().nth(1),
            "{arch}: the image's tag is the version its binary reports"
        );
        versions.push(version);
    }
    assert_eq!(versions[0], versions[1]);
}

#[test]
fn podman_loads_the_hosts_platform_from_the_index() {
    privileged!();
    let Some(image) = oci::release_image("image") else {
        return;
    };
    if !require_tools("image", &["podman"]) {
        return;
    }
    // A store of the test's own: the machine's images are left as they are.
    let store = StateDir::new("podman-store");
    let podman = || {
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(store.path().join("root"))
            .arg("--runroot")
            .arg(store.path().join("run"))
            .args(["--storage-driver", "vfs"]);
        c
    };
    let reference = oci::reference(&image);
    let loaded = stdout(podman().arg("load").arg("-i").arg(&image));
    assert!(loaded.contains(&reference), "{loaded}");
    let inspect = format!("image inspect --format {{{{.Os}}}}/{{{{.Architecture}}}} {reference}");
    let platform = stdout(podman().args(words(&inspect)));
    assert_eq!(platform.trim(), "linux/amd64");
    run_ok(podman().args(["rmi", "--force", &reference]));
}

#[test]
fn containerd_imports_every_platform_of_the_index() {
    privileged!();
    let Some(image) = oci::release_image("image") else {
        return;
    };
    if !require_tools("image", &["containerd", "ctr"]) {
        return;
    }
    let ipam = StateDir::new("image-ipam");
    let cri = Containerd::start(&primary_network("1.0.0", 79, &ipam), &[]);
    let import = format!("images import --all-platforms {}", image.display());
    let imported = cri.ctr(&words(&import));
    let reference = oci::reference(&image);
    assert!(imported.contains(&reference), "{imported}");
    // Every platform's manifest, config and layer is in the content store.
    let content = cri.ctr(&["content", "ls", "--quiet"]);
    for arch in ["amd64", "arm64"] {
        for digest in oci::platform_blobs(&image, arch) {
            assert!(
                content.lines().any(|l| l.trim() == digest),
                "linux/{arch}: {digest} not imported:\n{content}"
            );
        }
    }
    let platforms = cri.ctr(&["images", "check", &format!("name=={reference}")]);
    assert!(platforms.contains("complete"), "{platforms}");
}
