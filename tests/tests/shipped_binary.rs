//! The binary as the image ships it (statically linked glibc), run on this host, whose
//! nsswitch.conf may name NSS modules beside `files` (systemd's on Debian): an account name
//! the files lack must not reach them. A static glibc loading the host's `libnss_systemd`
//! crashed (SIGSEGV in `_nss_systemd_is_blocked`), and the CNI plugin runs on the host.

use std::process::Command;

use redirector_tests::prelude::*;
use redirector_tests::skip;

/// The binary `cargo xtask image` built (REDIRECTOR_SHIPPED_BIN), `None` to skip.
fn shipped_bin() -> Option<PathBuf> {
    let bin = std::env::var_os("REDIRECTOR_SHIPPED_BIN").map(PathBuf::from);
    if bin.is_none() {
        skip("shipped binary: REDIRECTOR_SHIPPED_BIN not set (`cargo xtask test` builds it and sets it)");
    }
    bin
}

#[test]
fn an_unknown_proxy_user_falls_back_to_1337_without_asking_the_hosts_nss_modules() {
    privileged!();
    let Some(bin) = shipped_bin() else {
        return;
    };
    let (pod, cgroup, root) = (
        NetNs::new("shipped"),
        Cgroup::new("shipped"),
        PinRoot::new("shipped"),
    );
    // No -u: the proxy is ENVOY_USER's uid, and istio's 1337 when there is no such user.
    let out = Command::new(&bin)
        .args(["istio-iptables", "--dry-run", "--network-namespace"])
        .arg(pod.path())
        .arg("--cgroup")
        .arg(cgroup.path())
        .arg("--pin-root")
        .arg(root.path())
        .env("ENVOY_USER", "no-such-user-redirector-test")
        .output()
        .expect("running the shipped binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} exited {:?}:\n{stderr}",
        bin.display(),
        out.status
    );
    assert!(stderr.contains("PROXY_UID=1337"), "{stderr}");
    assert!(!root.path().exists(), "a dry run pins nothing");
}
