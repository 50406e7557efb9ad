//! `redirector install-cni` run as an operator (or the DaemonSet) runs it, on CNI
//! directories of the test's own: chaining, bad input refused with nothing written, a
//! read-only directory, the watch putting the entry back after a network plugin's
//! rewrite, uninstall restoring the file; and `daemon --uninstall` taking the entry out
//! before the pins. Both dialects: istio's (the default) and Linkerd's (`--dialect
//! linkerd`).

use std::process::{Command, Output};

use serde_json::Value;

use redirector_tests::daemon::uninstall;
use redirector_tests::linkerd::proxy_init::{PortRange, ProxyInitOptions};
use redirector_tests::prelude::*;

/// flannel's conflist (cniVersion 0.3.1).
const FLANNEL: &str = include_str!("../../redirector/src/install_cni/testdata/flannel.conflist");

/// A node's CNI directories.
struct CniDirs {
    dir: StateDir,
}

impl CniDirs {
    fn new() -> Self {
        let dir = StateDir::new("instcni");
        std::fs::create_dir(dir.path().join("net.d")).unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        CniDirs { dir }
    }

    fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("net.d")
    }

    fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    fn conflist(&self) -> PathBuf {
        self.conf_dir().join("10-flannel.conflist")
    }

    /// `redirector install-cni` on these directories, to add flags to.
    fn install_cni(&self) -> Spawn {
        let (conf, bin) = (self.conf_dir(), self.bin_dir());
        redirector(&format!(
            "install-cni --conf-dir {} --bin-dir {}",
            conf.display(),
            bin.display()
        ))
    }

    fn install(&self, extra: &[&str]) -> Output {
        self.install_cni().args(extra).output()
    }

    fn entries(&self, file: &Path) -> Vec<Value> {
        let conf: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        conf["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["type"] == "redirector-cni")
            .cloned()
            .collect()
    }

    fn chained(&self) -> bool {
        std::fs::read(self.conflist())
            .ok()
            .and_then(|t| serde_json::from_slice::<Value>(&t).ok())
            .and_then(|c| c["plugins"].as_array()?.last().cloned())
            .is_some_and(|last| last["type"] == "redirector-cni")
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn install_chains_the_entry_once_and_bad_input_writes_nothing() {
    privileged!();
    let dirs = CniDirs::new();
    // A bad flag for the pods: named, nothing written.
    std::fs::write(dirs.conflist(), FLANNEL).unwrap();
    let out = dirs.install(&["--", "-p", "70000"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("70000"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(dirs.conflist()).unwrap(), FLANNEL);
    assert!(!dirs.bin_dir().join("redirector-cni").exists());

    // No network yet: a clear error.
    std::fs::remove_file(dirs.conflist()).unwrap();
    let out = dirs.install(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("no network configuration"), "{err}");
    assert!(
        !dirs.bin_dir().join("redirector-cni").exists(),
        "nothing is installed while there is nothing to chain into"
    );
    std::fs::write(dirs.conflist(), FLANNEL).unwrap();

    let out = dirs.install(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let entries = dirs.entries(&dirs.conflist());
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["requireSidecarStatus"], true);
    assert_eq!(
        entries[0]["excludeNamespaces"],
        serde_json::json!(["kube-system"])
    );
    assert_eq!(entries[0]["args"][1], "15001");
    assert_eq!(
        std::fs::read(dirs.bin_dir().join("redirector-cni")).unwrap(),
        std::fs::read(redirector_bin()).unwrap(),
        "the plugin is this binary"
    );
    let out = dirs.install(&[]);
    assert!(out.status.success());
    assert_eq!(dirs.entries(&dirs.conflist()).len(), 1, "never duplicated");

    // A file sorting first that is not JSON: named, untouched.
    let broken = dirs.conf_dir().join("00-broken.conflist");
    std::fs::write(&broken, "{not json").unwrap();
    let out = dirs.install(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert_contains(&stderr(&out), "00-broken.conflist");
    assert_eq!(std::fs::read_to_string(&broken).unwrap(), "{not json");
}

/// `--dialect linkerd`: the entry says so and carries the injector's proxy-init flags
/// (docs/linkerd.md#how-linkerd-runs-it: ports 4143/4140, uid 2102, its ignore lists, IPv6 off),
/// read here as proxy-init reads them; proxy-init flags given after `--` replace them, and one that
/// proxy-init refuses is named with nothing written.
#[test]
fn install_writes_a_linkerd_entry_with_the_injectors_flags() {
    privileged!();
    let dirs = CniDirs::new();
    std::fs::write(dirs.conflist(), FLANNEL).unwrap();

    let ports = "--incoming-proxy-port=4143 --outgoing-proxy-port=4140";
    let out = dirs.install(&words(&format!(
        "--dialect linkerd -- {ports} --subnets-to-ignore=not-a-cidr"
    )));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("not-a-cidr"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(dirs.conflist()).unwrap(), FLANNEL);
    assert!(!dirs.bin_dir().join("redirector-cni").exists());

    let out = dirs.install(&["--dialect", "linkerd"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let entries = dirs.entries(&dirs.conflist());
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["dialect"], "linkerd", "{}", entries[0]);
    let args: Vec<&str> = entries[0]["args"]
        .as_array()
        .unwrap_or_else(|| panic!("args is a list: {}", entries[0]))
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let flags = ProxyInitOptions::parse(&args)
        .unwrap_or_else(|e| panic!("the entry's args are proxy-init's flags: {e:?}: {args:?}"));
    assert_eq!(
        (flags.incoming_proxy_port, flags.outgoing_proxy_port),
        (4143, 4140)
    );
    assert_eq!(flags.proxy_uid, Some(2102), "{args:?}");
    assert!(!flags.ipv6, "the injector's --ipv6=false: {args:?}");
    let ignored = |ranges: &[PortRange], port| ranges.iter().any(|r| r.contains(port));
    let (inbound, outbound) = (
        &flags.inbound_ports_to_ignore,
        &flags.outbound_ports_to_ignore,
    );
    for port in [4190, 4191, 4567, 4568] {
        assert!(ignored(inbound, port), "inbound {port}: {args:?}");
    }
    for port in [4567, 4568] {
        assert!(ignored(outbound, port), "outbound {port}: {args:?}");
    }
    assert!(!ignored(&flags.outbound_ports_to_ignore, 4190), "{args:?}");

    // Flags of the operator's own replace the injector's.
    let operators = format!("{ports} --proxy-uid=2102 --outbound-ports-to-ignore=3306");
    let out = dirs.install(&words(&format!("--dialect linkerd -- {operators}")));
    assert!(out.status.success(), "{}", stderr(&out));
    let entries = dirs.entries(&dirs.conflist());
    assert_eq!(entries.len(), 1, "never duplicated: {entries:?}");
    assert_eq!(entries[0]["dialect"], "linkerd");
    assert_eq!(entries[0]["args"], serde_json::json!(words(&operators)));
}

/// `dir` bind-mounted read-only onto itself until dropped.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn new(dir: &Path) -> Self {
        for args in ["--bind", "-o remount,ro,bind"] {
            run_ok(Command::new("mount").args(words(args)).arg(dir).arg(dir));
        }
        ReadOnly(dir.to_path_buf())
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_read_only_configuration_directory_is_an_error_naming_it() {
    privileged!();
    let dirs = CniDirs::new();
    std::fs::write(dirs.conflist(), FLANNEL).unwrap();
    let _ro = ReadOnly::new(&dirs.conf_dir());
    let out = dirs.install(&[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("10-flannel.conflist") && err.contains("Read-only"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(dirs.conflist()).unwrap(), FLANNEL);
}

#[test]
fn the_watch_puts_the_entry_back_and_uninstall_restores_the_file() {
    privileged!();
    let dirs = CniDirs::new();
    let watcher = dirs.install_cni().arg("--watch").spawn();
    // The network's file appears after the watch started.
    std::thread::sleep(Duration::from_millis(200));
    std::fs::write(dirs.conflist(), FLANNEL).unwrap();
    // Each wait ends at the entry (milliseconds here); EVENTUALLY allows a starved guest.
    let wait = || within(EVENTUALLY, || dirs.chained());
    assert!(wait().is_some(), "{}", watcher.stderr());
    // flannel restarts: its file rewritten (write + rename), then in place.
    let mut took = Vec::new();
    for round in 0..6 {
        if round % 2 == 0 {
            let tmp = dirs.conf_dir().join(".flannel.tmp");
            std::fs::write(&tmp, FLANNEL).unwrap();
            std::fs::rename(&tmp, dirs.conflist()).unwrap();
        } else {
            std::fs::write(dirs.conflist(), FLANNEL).unwrap();
        }
        let back = wait().unwrap_or_else(|| panic!("the entry was not back: {}", watcher.stderr()));
        took.push(back);
    }
    eprintln!("install-cni --watch: entry back after a rewrite in {took:?}");
    drop(watcher);

    let out = dirs.install(&["--uninstall"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let restored: Value = serde_json::from_slice(&std::fs::read(dirs.conflist()).unwrap()).unwrap();
    assert_eq!(restored, serde_json::from_str::<Value>(FLANNEL).unwrap());
    assert!(!dirs.bin_dir().join("redirector-cni").exists());
}

/// `redirector daemon --uninstall` for the daemon of `socket`, `node`, with the CNI
/// configuration in `conf_dir`.
fn daemon_uninstall(socket: &Path, node: &TestNode, conf_dir: &Path) -> Output {
    let (socket, conf_dir) = (socket.display(), conf_dir.display());
    let extra = format!("--socket {socket} --cni-conf-dir {conf_dir}");
    uninstall(&node.root, &node.node, &node.state, &words(&extra))
}

#[test]
fn daemon_uninstall_takes_the_entry_out_before_the_pins() {
    privileged!();
    let dirs = CniDirs::new();
    std::fs::write(dirs.conflist(), FLANNEL).unwrap();
    let out = dirs.install(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let node = TestNode::new("instcni");
    // Killed: it leaves its socket behind, which the uninstall removes too.
    let daemon = node.daemon();
    let socket = daemon.socket().to_path_buf();
    drop(daemon.kill());
    let root = &node.root;
    assert!(root.path().exists());
    assert!(socket.exists());
    let out = daemon_uninstall(&socket, &node, &dirs.conf_dir());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(dirs.entries(&dirs.conflist()).is_empty());
    assert!(
        !root.path().join("objects").exists(),
        "the pins are gone too"
    );
    assert!(!socket.exists(), "the killed daemon's socket is gone");
}

/// An uninstall while a daemon still serves (the DaemonSet not deleted first) leaves that
/// daemon's socket: only a socket no one answers on is removed.
#[test]
fn daemon_uninstall_keeps_the_socket_of_a_daemon_that_still_serves() {
    privileged!();
    let node = TestNode::new("instcnilive");
    let conf = StateDir::new("instcniliveconf");
    let daemon = node.daemon();
    let out = daemon_uninstall(daemon.socket(), &node, conf.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("still serves"), "{}", stderr(&out));
    assert!(daemon.socket().exists());
    assert!(daemon.pod(&["list"]).status.success());
}
