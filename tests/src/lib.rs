//! Test kit for redirector's privileged tests, the conformance suite and the demo.
//!
//! Everything here changes real kernel state (network namespaces, cgroups, iptables rules inside
//! those namespaces, processes), and every piece of that state is owned by an RAII guard whose
//! `Drop` undoes it, also when a test panics. Nothing is ever sent from the host network
//! namespace to a non-loopback address: clients always run inside a namespace made here.
//!
//! Helpers panic with a message instead of returning `Result`, so a failing test shows the
//! backtrace of the step that failed.
//!
//! - [`NetNs`], [`Cgroup`], [`Topology`]: the places a scenario runs in.
//! - [`Spawn`], [`ChildGuard`]: processes inside them (netns, cgroup, uid/gid set before exec).
//! - [`ProbeServer`], [`connect_from`], [`ConnOutcome`]: the `probe` binary, its servers and
//!   clients, and what a connection landed on.
//! - [`iptables`]: istio's reference rule sets applied inside a netns; [`istio_cni`]:
//!   istio-cni's in-pod rules for an ambient pod.
//! - [`privileged!`]: the first line of a privileged test (root, tools, the probe binary).
//! - [`test_node`]: a node of the test's own (pin root, node cgroup, state dir, daemon) and
//!   the CNI plugin as a runtime calls it.
//! - [`twin_pods`]: the differential harness of both conformance suites.
//! - [`ztunnel`]: a stand-in for istio ambient's ztunnel on a node agent's ZDS socket.
//! - [`fake_cri`]: a CRI socket answering PodSandboxStatus with the labels a test gives.
//! - [`cri`]: containerd driven through the CRI as kubelet drives it, with a CNI network
//!   of the test's own, and its pods; [`kubelet`]: a DaemonSet's manifest run on it;
//!   [`rootfs`]: the root filesystems of its images, made from host files;
//!   [`host_net`]: the host's forwarding switches and network state its CNI plugins touch.
//! - [`remove_stale_leftovers`]: what killed test processes could not clean up.

pub mod bpftool;
pub mod cgroup;
pub mod churn;
pub mod conformance;
pub mod cri;
pub mod daemon;
pub mod dns;
pub mod fake_cri;
pub mod host_net;
pub mod iptables;
pub mod istio_cni;
pub mod kubelet;
pub mod linkerd;
pub mod netns;
pub mod oci;
pub mod paths;
pub mod probe;
pub mod process;
pub mod proxied_pod;
pub mod redirector;
pub mod rootfs;
pub mod scenario;
pub mod scrapes;
pub mod sockaddr;
pub mod socket_lb;
pub mod stale;
pub mod test_node;
pub mod topology;
pub mod twin_pods;
pub mod user_ns;
pub mod ztunnel;

use std::sync::atomic::{AtomicU32, Ordering};

/// The kit's names nearly every suite uses, and the std types that go with them:
/// `use redirector_tests::prelude::*;`.
pub mod prelude {
    pub use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    pub use std::path::{Path, PathBuf};
    pub use std::time::{Duration, Instant};

    pub use crate::bpftool::{cgroup_attachments, loaded_ids, pinned_id, wait_gone};
    pub use crate::daemon::{Daemon, StateDir};
    pub use crate::process::{assert_success, within, EVENTUALLY};
    pub use crate::redirector::{
        install, istio_iptables, object_ids, pins_under, pod_links, redirector, redirector_bin,
        run_ok, PinRoot, STANDARD_INJECTION,
    };
    pub use crate::test_node::{failed, succeeded, CniPlugin, TestNode};
    pub use crate::{
        assert_all_proxied, assert_contains, assert_direct, assert_lacks, assert_proxied,
        connect_from, privileged, probe_bin, words, Cgroup, ChildGuard, ConnOutcome, NetNs,
        ProbeServer, ProxiedPod, Spawn, Topology, APP_UID, PROXY_UID,
    };
}

pub use cgroup::Cgroup;
pub use netns::NetNs;
pub use paths::{bin_path, golden_dir, target_dir, workspace_root};
pub use probe::protocol::{ConnOutcome, Landing};
pub use probe::{connect_from, connect_in_user_ns, probe_bin, use_probe_bin, InNetNs, ProbeServer};
pub use process::{wait_tcp_listening, ChildGuard, Spawn, EVENTUALLY};
pub use proxied_pod::{assert_all_proxied, assert_direct, assert_proxied, ProxiedPod};
pub use stale::remove_stale_leftovers;
pub use topology::Topology;

/// Prefix of every netns and cgroup the kit creates, so leftovers are easy to spot
/// (`ip netns list | grep rdt-`).
pub const NAME_PREFIX: &str = "rdt";

/// The uid and gid istio runs its proxy as; traffic of this owner is never captured.
pub const PROXY_UID: u32 = 1337;
/// An ordinary application uid/gid for clients that must be captured.
pub const APP_UID: u32 = 1000;

/// A process-wide counter so that names made by parallel tests in one binary never collide.
pub(crate) fn next_id() -> u32 {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// `rdt-<pid>-<counter>-<hint>`: unique across concurrently running test binaries (pid) and
/// across tests in one binary (counter). The hint is reduced to `[a-z0-9]` and shortened.
pub(crate) fn unique_name(hint: &str) -> String {
    let hint: String = hint
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .take(12)
        .collect();
    format!("{NAME_PREFIX}-{}-{}-{hint}", std::process::id(), next_id())
}

/// `text` (a log, an answer, an error) contains `needle`; the whole text is the message when
/// it does not.
#[track_caller]
pub fn assert_contains(text: &str, needle: impl AsRef<str>) {
    let needle = needle.as_ref();
    assert!(text.contains(needle), "no {needle:?} in:\n{text}");
}

/// `text` does not contain `needle`; the whole text is the message when it does.
#[track_caller]
pub fn assert_lacks(text: &str, needle: impl AsRef<str>) {
    let needle = needle.as_ref();
    assert!(!text.contains(needle), "{needle:?} in:\n{text}");
}

/// A command line written as one string: its words, `""` standing for an empty argument.
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace()
        .map(|w| if w == "\"\"" { "" } else { w })
        .collect()
}

/// The first line of a privileged test: returns from it (a skip, see [`require_root`] and
/// [`require_tools`]) unless it runs as root (with the tools it names), and points the kit at the `probe` binary cargo built for this
/// test run ([`use_probe_bin`]), so every test of a binary uses exactly that one.
#[macro_export]
macro_rules! privileged {
    () => {
        $crate::privileged!("", &[]);
    };
    // A test that also runs outside tools: skipped as `require_tools` says without them.
    ($test:expr, $tools:expr) => {
        if !$crate::require_root() || !$crate::require_tools($test, $tools) {
            return;
        }
        $crate::use_probe_bin(env!("CARGO_BIN_EXE_probe"));
    };
}

/// Whether this privileged test may run: see [`privileged!`], which calls it.
///
/// Without root the test is skipped with a note, except under CI (env `CI` set), where a
/// privileged test that silently skips would hide a regression, so it panics instead.
pub fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("this privileged test needs root, and CI is set: refusing to skip");
    }
    eprintln!("note: skipping privileged test (not root)");
    false
}

/// Call first in a test that runs an outside tool (podman, containerd):
/// `if !require_tools("containerd pod", &["containerd", "runc"]) { return; }`.
///
/// A missing tool skips the test with a `note: skipping …` naming it (the VM guests carry
/// only the tools most suites need, and `cargo xtask vm` lists these notes), except where
/// every test must run: under CI, or with `REDIRECTOR_TESTS_REQUIRE_TOOLS` set (as
/// `cargo xtask test` does), where a missing tool fails the test.
pub fn require_tools(test: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !on_path(t)).collect();
    if missing.is_empty() {
        return true;
    }
    skip(&format!("{test}: {} not installed", missing.join(", ")))
}

/// A test that cannot run here for `why`: `false` with a `note: skipping …`, or a panic
/// where every test must run (CI, `REDIRECTOR_TESTS_REQUIRE_TOOLS`).
pub fn skip(why: &str) -> bool {
    if std::env::var_os("CI").is_some()
        || std::env::var_os("REDIRECTOR_TESTS_REQUIRE_TOOLS").is_some()
    {
        panic!("{why}, and every test must run here (CI or REDIRECTOR_TESTS_REQUIRE_TOOLS)");
    }
    // Straight to fd 2: libtest captures `eprintln!` of passing tests, and this note must
    // reach the log (`cargo xtask vm` lists them under its table).
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("note: skipping {why}\n").as_bytes(),
    );
    false
}

fn on_path(tool: &str) -> bool {
    find_on_path(tool).is_some()
}

/// `tool` in a directory of `PATH`, if it is in one.
pub(crate) fn find_on_path(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_are_distinct_and_tidy() {
        let a = unique_name("Pod Net!");
        let b = unique_name("Pod Net!");
        assert_ne!(a, b);
        assert!(
            a.starts_with(&format!("rdt-{}-", std::process::id())),
            "{a}"
        );
        assert!(a.ends_with("-podnet"), "{a}");
    }
}
