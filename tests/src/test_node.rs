//! A node of a test's own for the node-mode suites (daemon, CNI plugin, containerd): its pin
//! root, node cgroup and daemon state directory, a daemon on demand, and `redirector-cni`
//! called as a container runtime calls it: by a suite with a configuration of its own
//! ([`CniPlugin`]), or for numbered Kubernetes pods of a daemon's node ([`CniCaller`], the
//! bench's and the soak's). Everything is removed on drop.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::daemon::{Daemon, StateDir};
use crate::redirector::{redirector_bin, PinRoot, STANDARD_INJECTION};
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

    /// `redirector daemon` of this node with `extra` flags and `env`, a start it refuses
    /// ([`crate::daemon::refused`]).
    pub fn daemon_refused(&self, extra: &[&str], env: &[(&str, &str)]) -> (i32, String) {
        let socket = self.state.path().join("redirector.sock");
        let mut args = vec!["daemon".to_owned(), "--repair=off".into()];
        args.push(format!("--socket={}", socket.display()));
        args.extend(crate::daemon::node_flags(
            &self.root,
            &self.node,
            &self.state,
        ));
        args.extend(extra.iter().map(|a| a.to_string()));
        let env: Vec<_> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        crate::daemon::refused(&args, &env)
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

    /// The plugin with only `env` (stdio untouched).
    pub fn command(&self, env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(&self.path);
        cmd.env_clear().envs(env.iter().copied());
        cmd
    }

    /// The plugin with only `env`, fed `stdin`. A plugin that rejects its environment exits
    /// before reading stdin, so a broken pipe on the write is an answer, not a test failure.
    pub fn run(&self, env: &[(&str, &str)], stdin: &str) -> Output {
        self.try_run(env, stdin).expect("running redirector-cni")
    }

    /// [`CniPlugin::run`], a failure to start it or to feed it as the error.
    pub fn try_run(&self, env: &[(&str, &str)], stdin: &str) -> std::io::Result<Output> {
        let mut child = (self.command(env))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        match child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e),
            _ => {}
        }
        child.wait_with_output()
    }
}

/// A pod as the runtime names it to the plugin.
#[derive(Clone, Debug)]
pub struct CniPod {
    pub namespace: String,
    pub name: String,
    /// `K8S_POD_UID`: the plugin finds the pod's cgroup (`pod<uid>`) below the node's by it.
    pub uid: String,
    /// `CNI_CONTAINERID`: the sandbox's id.
    pub container_id: String,
    pub netns: PathBuf,
    /// The address the previous plugin gave the pod (its `prevResult`).
    pub ip: Ipv4Addr,
}

impl CniPod {
    /// Pod number `n` of a run (in namespace `namespace`), its UID and sandbox id made
    /// from `n` and this process's id, its address from `n`.
    pub fn numbered(namespace: &str, n: usize, netns: PathBuf) -> Self {
        CniPod {
            namespace: namespace.to_owned(),
            name: format!("p{n}"),
            // Not of the form `Cgroup::pod_under` gives (`…-8000-…`): both may share a node.
            uid: format!("{:08x}-0000-4000-9000-{n:012x}", std::process::id()),
            container_id: format!("{namespace}{n}"),
            netns,
            ip: Ipv4Addr::new(10, 1, (n / 250 % 250) as u8, (n % 250 + 1) as u8),
        }
    }

    /// The name kubelet (cgroupfs driver) gives the pod's cgroup.
    pub fn cgroup_name(&self) -> String {
        format!("pod{}", self.uid)
    }
}

/// The plugin configured for the daemon whose socket, pins and state directory are given,
/// called for [`CniPod`]s: the runtime's env with the pod's namespace, name and UID in
/// `CNI_ARGS`, istio's standard injection, the pod annotated as injected.
pub struct CniCaller {
    plugin: CniPlugin,
    socket: PathBuf,
    pin_root: PathBuf,
    state_dir: PathBuf,
}

impl CniCaller {
    pub fn new(root: &PinRoot, state: &StateDir, socket: &Path) -> Self {
        CniCaller {
            plugin: CniPlugin::new(),
            socket: socket.to_owned(),
            pin_root: root.path().to_owned(),
            state_dir: state.path().to_owned(),
        }
    }

    /// The network configuration for `pod`, the previous plugin's result naming its
    /// namespace and address.
    pub fn conf(&self, pod: &CniPod) -> Value {
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "pods",
            "type": "redirector-cni",
            "socket": self.socket,
            "pinRoot": self.pin_root,
            "stateDir": self.state_dir,
            "args": STANDARD_INJECTION,
            "runtimeConfig": {
                "io.kubernetes.cri.pod-annotations": {"sidecar.istio.io/status": "{}"}
            },
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "eth0", "sandbox": pod.netns}],
                "ips": [{"address": format!("{}/16", pod.ip), "interface": 0}]
            }
        })
    }

    /// The runtime's env for `op` (`ADD`, `DEL`, `CHECK`) on `pod`, and what goes on stdin.
    fn call_of(&self, op: &str, pod: &CniPod) -> ([(&'static str, String); 6], String) {
        let args = format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_UID={}",
            pod.namespace, pod.name, pod.uid
        );
        let env = [
            ("CNI_COMMAND", op.to_owned()),
            ("CNI_CONTAINERID", pod.container_id.clone()),
            ("CNI_NETNS", pod.netns.display().to_string()),
            ("CNI_IFNAME", "eth0".to_owned()),
            ("CNI_PATH", "/opt/cni/bin".to_owned()),
            ("CNI_ARGS", args),
        ];
        (env, self.conf(pod).to_string())
    }

    /// The plugin's command for `op` on `pod`, and what goes on its stdin.
    pub fn command(&self, op: &str, pod: &CniPod) -> (Command, String) {
        let (env, stdin) = self.call_of(op, pod);
        (
            self.plugin
                .command(&env.each_ref().map(|(k, v)| (*k, v.as_str()))),
            stdin,
        )
    }

    /// Runs `op` on `pod`: its wall time, or what it wrote when it failed.
    pub fn call(&self, op: &str, pod: &CniPod) -> Result<Duration, String> {
        let (env, stdin) = self.call_of(op, pod);
        let started = Instant::now();
        let out = (self.plugin)
            .try_run(&env.each_ref().map(|(k, v)| (*k, v.as_str())), &stdin)
            .map_err(|e| format!("running the plugin: {e}"))?;
        let took = started.elapsed();
        if out.status.success() {
            return Ok(took);
        }
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let (namespace, name) = (&pod.namespace, &pod.name);
        Err(format!(
            "{op} {namespace}/{name}: {}: {}{}",
            out.status,
            stdout.trim(),
            stderr.trim()
        ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_pods_have_distinct_uids_and_addresses() {
        let a = CniPod::numbered("soak", 1, "/run/netns/a".into());
        let b = CniPod::numbered("soak", 251, "/run/netns/b".into());
        assert_ne!(a.uid, b.uid);
        assert_ne!(a.ip, b.ip);
        assert_eq!(a.cgroup_name(), format!("pod{}", a.uid));
        assert_eq!(a.uid.len(), 36, "{}", a.uid);
    }
}
