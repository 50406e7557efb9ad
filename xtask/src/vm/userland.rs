//! A foreign architecture's guest userland: the tools the suites call (and busybox, glibc
//! for the test binaries), taken from Debian's packages for that architecture — the host's
//! own binaries cannot run there. Unpacked once into `target/vm/userland/<arch>/root`.

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use super::{kernels::Source, vm_dir};
use crate::arch::Arch;
use crate::workspace::status;

/// The packages that hold the guest's tools (the host's `TOOLS`), and the C runtime the
/// cross-built test binaries link against. Their libraries come with them: every `lib*`
/// package in their dependency closure.
const PACKAGES: &[&str] = &[
    "busybox-static",
    "iproute2",
    "bpftool",
    "util-linux",
    "mount",
    "iptables",
    "nftables",
    "libc6",
    "libgcc-s1",
];

/// Names that Debian's maintainer scripts (update-alternatives) would create, which an
/// unpacked package lacks: iptables is iptables-nft, as on the host.
const ALTERNATIVES: &[(&str, &str)] = &[
    ("usr/sbin/iptables", "iptables-nft"),
    ("usr/sbin/iptables-restore", "iptables-nft-restore"),
    ("usr/sbin/iptables-save", "iptables-nft-save"),
    ("usr/sbin/ip6tables", "ip6tables-nft"),
    ("usr/sbin/ip6tables-restore", "ip6tables-nft-restore"),
    ("usr/sbin/ip6tables-save", "ip6tables-nft-save"),
];

/// The root tree of `arch`'s guest userland, unpacked on first use.
pub(crate) fn foreign_userland(arch: Arch) -> Result<PathBuf> {
    let dir = vm_dir().join("userland").join(arch.name());
    let root = dir.join("root");
    let done = dir.join(".unpacked");
    if done.exists() {
        return Ok(root);
    }
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    let debs = dir.join("debs");
    fs::create_dir_all(&debs)?;
    let source = Source::system(arch);
    let mut args = vec![
        "depends",
        "--recurse",
        "--no-recommends",
        "--no-suggests",
        "--no-conflicts",
        "--no-breaks",
        "--no-replaces",
        "--no-enhances",
    ];
    args.extend(PACKAGES);
    let closure = source.query("apt-cache", &args, |out| out.trim().is_empty())?;
    let packages: Vec<String> = closure
        .lines()
        .filter(|l| !l.starts_with([' ', '<']))
        .map(str::trim)
        .filter(|p| PACKAGES.contains(p) || is_library(p))
        .map(String::from)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    eprintln!(
        "xtask vm: fetching {} {} packages for the guest's userland",
        packages.len(),
        arch.name()
    );
    source.download(&packages, &debs)?;
    for deb in fs::read_dir(&debs)?.flatten() {
        let mut x = Command::new("dpkg");
        x.arg("-x").arg(deb.path()).arg(&root);
        status(x)?;
    }
    for (link, target) in ALTERNATIVES {
        let link = root.join(link);
        if fs::symlink_metadata(&link).is_err() {
            symlink(target, &link).with_context(|| format!("linking {}", link.display()))?;
        }
    }
    fs::remove_dir_all(&debs)?;
    let missing = missing_libraries(arch, &root)?;
    if !missing.is_empty() {
        bail!(
            "the {} guest userland lacks shared libraries its tools need: {}",
            arch.name(),
            missing.join(", ")
        );
    }
    fs::write(&done, "")?;
    Ok(root)
}

/// Whether a package of the dependency closure holds shared libraries (Debian's names for
/// them), and not an alternative to another one's: libelogind0 would replace libsystemd0's
/// files.
fn is_library(package: &str) -> bool {
    (package.starts_with("lib") || package.starts_with("zlib"))
        && !package.starts_with("libelogind")
}

/// The `NEEDED` entries of the executables in `root`'s bin directories that no file in its
/// library directories provides, as `tool: soname`.
fn missing_libraries(arch: Arch, root: &Path) -> Result<Vec<String>> {
    let mut present = BTreeSet::new();
    for dir in ["lib", "usr/lib"] {
        let multiarch = root
            .join(dir)
            .join(format!("{}-linux-gnu", arch.gnu_machine()));
        for e in fs::read_dir(&multiarch).into_iter().flatten().flatten() {
            present.insert(e.file_name().to_string_lossy().into_owned());
        }
    }
    let mut missing = Vec::new();
    for dir in ["bin", "sbin", "usr/bin", "usr/sbin"] {
        for e in fs::read_dir(root.join(dir)).into_iter().flatten().flatten() {
            let path = e.path();
            if !path.is_file() || path.is_symlink() {
                continue;
            }
            let out = Command::new(arch.binutil("readelf"))
                .arg("-d")
                .arg(&path)
                .output()
                .with_context(|| format!("running {}", arch.binutil("readelf")))?;
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let Some(name) = line
                    .split_once("Shared library: [")
                    .and_then(|(_, rest)| rest.split_once(']'))
                    .map(|(name, _)| name)
                else {
                    continue;
                };
                if !present.contains(name) {
                    missing.push(format!("{}: {name}", e.file_name().to_string_lossy()));
                }
            }
        }
    }
    Ok(missing)
}
