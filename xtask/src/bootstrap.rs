//! Bring a fresh machine to the point where the eBPF side builds and the privileged tests
//! run. Every step checks first, so a second run costs well under a second.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

/// Debian packages the tests and demo use, with what proves each is installed: a binary on
/// PATH, or an absolute path for files installed elsewhere.
const PACKAGES: [(&str, &str); 18] = [
    ("bpftool", "bpftool"),
    ("iptables", "iptables-restore"),
    ("iproute2", "ip"),
    ("util-linux", "nsenter"),
    // podman for the image test (tests/tests/image.rs), which loads the node image with it,
    // and the conmon and catatonit podman's own containers need. The containerd tests (tests/tests/cri.rs, tests/tests/node.rs,
    // tests/tests/real_pod.rs, docs/real-pod.md): runc, the CNI plugins (outside PATH), and a
    // static busybox for the root filesystems of their images.
    ("podman", "podman"),
    ("runc", "runc"),
    ("conmon", "conmon"),
    ("catatonit", "catatonit"),
    ("containernetworking-plugins", "/usr/lib/cni/host-local"),
    ("busybox-static", "busybox"),
    // The containerd tests: containerd with its CRI plugin (and ctr to import the locally
    // built images); protoc builds the CRI API client (k8s-cri).
    ("containerd", "containerd"),
    ("protobuf-compiler", "protoc"),
    // `cargo xtask image` links the release binary statically against glibc (libc.a); the
    // node test (tests/tests/node.rs) runs that image.
    ("libc6-dev", "/usr/lib/x86_64-linux-gnu/libc.a"),
    // The image's arm64 binary (and `cargo xtask vm --arch arm64`'s tests): Debian's cross
    // gcc as the linker with its static glibc, and qemu-user to run what it built.
    ("gcc-aarch64-linux-gnu", "aarch64-linux-gnu-gcc"),
    ("libc6-dev-arm64-cross", "/usr/aarch64-linux-gnu/lib/libc.a"),
    ("qemu-user-static", "qemu-aarch64-static"),
    // c-ares (node's dns.Resolver) checks that a DNS reply comes from the server it asked:
    // the strict client of the DNS tests.
    ("nodejs", "node"),
    // The Prometheus project's own parsers, OpenMetrics and the older text format, for the
    // metrics test's scrape (tests/tests/metrics.rs), run by Debian's python3.
    (
        "python3-prometheus-client",
        "/usr/lib/python3/dist-packages/prometheus_client/openmetrics/parser.py",
    ),
];

/// bpf-linker version that builds against the nightly toolchain's LLVM here.
const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn all() -> Result<()> {
    packages()?;
    rust_src()?;
    rust_targets()?;
    bpf_linker()?;
    bpffs()?;
    Ok(())
}

fn installed(proof: &str) -> bool {
    if proof.starts_with('/') {
        Path::new(proof).is_file()
    } else {
        on_path(proof)
    }
}

fn on_path(bin: &str) -> bool {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .any(|dir| dir.join(bin).is_file())
}

fn status(cmd: &mut Command) -> Result<()> {
    let st = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed: {st}");
    }
    Ok(())
}

fn packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, proof)| !installed(proof))
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing Debian packages {missing:?}");
    status(Command::new("apt-get").args(["update", "-qq"]))?;
    status(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(crate::workspace::APT_WAITS_FOR_LOCK)
            .args(&missing),
    )
}

fn nightly_sysroot() -> Result<PathBuf> {
    let out = Command::new("rustc")
        .args(["+nightly", "--print", "sysroot"])
        .output()
        .context("running rustc +nightly (is the nightly toolchain installed?)")?;
    if !out.status.success() {
        bail!(
            "rustc +nightly failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn rust_src() -> Result<()> {
    let sysroot = nightly_sysroot()?;
    if sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok(());
    }
    eprintln!("xtask: adding rust-src to the nightly toolchain");
    status(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

/// The standard library of every architecture the image ships (the host's is there).
fn rust_targets() -> Result<()> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup target list")?;
    let installed = String::from_utf8_lossy(&out.stdout);
    for arch in crate::arch::Arch::ALL {
        if !installed.lines().any(|l| l.trim() == arch.triple()) {
            eprintln!("xtask: adding the {} target", arch.triple());
            status(Command::new("rustup").args(["target", "add", arch.triple()]))?;
        }
    }
    Ok(())
}

fn bpf_linker_works() -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION)
        })
}

/// bpf-linker cannot be downloaded prebuilt here; it is built against the nightly
/// toolchain's own libLLVM, exposed under an LLVM prefix that stays in place (the binary
/// keeps an rpath to it).
fn bpf_linker() -> Result<()> {
    if bpf_linker_works() {
        return Ok(());
    }
    let sysroot = nightly_sysroot()?;
    let lib = fs::read_dir(sysroot.join("lib"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libLLVM.so."))
        })
        .context("the nightly toolchain has no libLLVM.so.* in its lib dir")?;
    let major = lib
        .file_name()
        .and_then(|n| {
            n.to_string_lossy()
                .strip_prefix("libLLVM.so.")
                .map(str::to_owned)
        })
        .and_then(|v| v.split('.').next().map(str::to_owned))
        .context("cannot read the LLVM version")?;
    let home = env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    let prefix = home.join(".cache/redirector").join(format!("llvm-{major}"));
    let prefix_lib = prefix.join("lib");
    fs::create_dir_all(&prefix_lib)?;
    for name in [
        Path::new("libLLVM.so"),
        Path::new(lib.file_name().unwrap_or_default()),
    ] {
        let link = prefix_lib.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&lib, &link)
            .with_context(|| format!("linking {} to {}", link.display(), lib.display()))?;
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {} (about a minute)",
        lib.display()
    );
    status(
        Command::new("cargo")
            .env("LLVM_PREFIX", &prefix)
            .args([
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--locked",
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ]),
    )?;
    if !bpf_linker_works() {
        bail!("bpf-linker was installed but does not run; is ~/.cargo/bin on PATH?");
    }
    Ok(())
}

fn bpffs() -> Result<()> {
    let mounts = fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("bpf"))
    {
        return Ok(());
    }
    if !is_root() {
        eprintln!("xtask: bpffs is not mounted and we are not root; privileged steps will fail");
        return Ok(());
    }
    eprintln!("xtask: mounting bpffs at /sys/fs/bpf");
    status(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))
}

pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned))
        .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
}
