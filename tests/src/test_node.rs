//! A node of a test's own for the node-mode suites (daemon, CNI plugin, containerd): its pin
//! root, node cgroup and daemon state directory, a daemon on demand, and `redirector-cni`
//! called as a container runtime calls it. Everything is removed on drop.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::daemon::{Daemon, StateDir};
use crate::redirector::{redirector_bin, PinRoot};
use crate::Cgroup;

/// A node's pin root, node cgroup and state directory. Destructure it where a test names
/// them often: `let TestNode { root, node, state } = TestNode::new("hint");`.
pub struct TestNode {
    pub root: PinRoot,
    /// The node cgroup, under which the node's pods are.
    pub node: Cgroup,
    pub state: StateDir,
}

impl TestNode {
    /// Nothing pinned yet, no daemon.
    pub fn new(hint: &str) -> Self {
        TestNode {
            root: PinRoot::new(hint),
            node: Cgroup::new("node"),
            state: StateDir::new("state"),
        }
    }

    /// A node whose programs a daemon pinned and then stopped: the CNI plugin needs none.
    pub fn pinned(hint: &str) -> Self {
        let node = Self::new(hint);
        node.daemon().kill();
        node
    }

    /// A `redirector daemon` of this node.
    pub fn daemon(&self) -> Daemon {
        self.daemon_with("")
    }

    /// [`TestNode::daemon`] with more flags, written as one string ([`crate::words`]).
    pub fn daemon_with(&self, extra: &str) -> Daemon {
        Daemon::start_with(&self.root, &self.node, &self.state, &crate::words(extra))
    }
}

/// `redirector-cni`: the binary under the name a runtime calls it by.
pub struct CniPlugin {
    path: PathBuf,
    _dir: StateDir,
}

impl Default for CniPlugin {
    fn default() -> Self {
        Self::new()
    }
}

impl CniPlugin {
    pub fn new() -> Self {
        let dir = StateDir::new("cnibin");
        let path = dir.path().join("redirector-cni");
        std::os::unix::fs::symlink(redirector_bin(), &path)
            .unwrap_or_else(|e| panic!("linking {}: {e}", path.display()));
        CniPlugin { path, _dir: dir }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `command` with the runtime's env for a pod of namespace `default` and `conf` on
    /// stdin: success and stdout JSON.
    pub fn call(&self, command: &str, container: &str, netns: &str, conf: &Value) -> (bool, Value) {
        self.call_in("default", command, container, netns, conf)
    }

    /// [`CniPlugin::call`] for a pod of Kubernetes namespace `namespace` (`K8S_POD_NAMESPACE`).
    pub fn call_in(
        &self,
        namespace: &str,
        command: &str,
        container: &str,
        netns: &str,
        conf: &Value,
    ) -> (bool, Value) {
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME=web");
        self.call_with_args(&args, command, container, netns, conf)
    }

    /// [`CniPlugin::call`] with `CNI_ARGS` set to `args`.
    pub fn call_with_args(
        &self,
        args: &str,
        command: &str,
        container: &str,
        netns: &str,
        conf: &Value,
    ) -> (bool, Value) {
        let env = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
            ("CNI_ARGS", args),
        ];
        let out = self.run(&env, &conf.to_string());
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json = if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout)
                .unwrap_or_else(|e| panic!("{command}: stdout is not JSON ({e}): {stdout}"))
        };
        (out.status.success(), json)
    }

    /// `command` with `stdin` as is (not necessarily JSON) and a namespace that does not exist.
    pub fn raw(&self, command: &str, stdin: &str) -> (bool, Value) {
        let env = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "c0"),
            ("CNI_NETNS", "/nonexistent"),
            ("CNI_IFNAME", "eth0"),
        ];
        let out = self.run(&env, stdin);
        let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.success(), json)
    }

    /// The plugin with only `env`, fed `stdin`. A plugin that rejects its environment exits
    /// before reading stdin, so a broken pipe on the write is an answer, not a test failure.
    pub fn run(&self, env: &[(&str, &str)], stdin: &str) -> Output {
        let mut child = Command::new(&self.path)
            .env_clear()
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running redirector-cni");
        match child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("writing stdin: {e}"),
            _ => {}
        }
        child.wait_with_output().unwrap()
    }
}

/// The JSON of a plugin call ([`CniPlugin::call`] and the like) that must succeed.
#[track_caller]
pub fn succeeded((ok, out): (bool, Value)) -> Value {
    assert!(ok, "the plugin failed: {out}");
    out
}

/// The error JSON of a plugin call that must fail.
#[track_caller]
pub fn failed((ok, out): (bool, Value)) -> Value {
    assert!(!ok, "the plugin succeeded: {out}");
    out
}
