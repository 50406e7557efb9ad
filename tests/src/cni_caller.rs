//! The chained CNI plugin called as a container runtime calls it for a Kubernetes pod:
//! `redirector-cni` (the redirector binary under the plugin's name), the `CNI_*` env with
//! the pod's namespace, name and UID in `CNI_ARGS`, and the network configuration with the
//! previous plugin's result on stdin. The plugin's `socket`, `pinRoot` and `stateDir` are a
//! daemon's, so the pods it captures are that daemon's node's.

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::daemon::StateDir;
use crate::redirector::{redirector_bin, PinRoot, STANDARD_INJECTION};

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

/// The plugin, linked into a directory of its own (removed on drop), configured for the
/// daemon whose socket, pins and state directory are given.
pub struct CniCaller {
    _dir: StateDir,
    plugin: PathBuf,
    socket: PathBuf,
    pin_root: PathBuf,
    state_dir: PathBuf,
}

impl CniCaller {
    pub fn new(root: &PinRoot, state: &StateDir, socket: &Path) -> Self {
        let dir = StateDir::new("cnibin");
        let plugin = dir.path().join("redirector-cni");
        let binary = std::fs::canonicalize(redirector_bin()).expect("the redirector binary");
        std::os::unix::fs::symlink(binary, &plugin).expect("linking the plugin");
        CniCaller {
            _dir: dir,
            plugin,
            socket: socket.to_owned(),
            pin_root: root.path().to_owned(),
            state_dir: state.path().to_owned(),
        }
    }

    /// The network configuration for `pod`: istio's standard injection, the pod annotated
    /// as injected, the previous plugin's result naming its namespace and address.
    pub fn conf(&self, pod: &CniPod) -> serde_json::Value {
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

    /// The plugin's command for `op` (`ADD`, `DEL`, `CHECK`) on `pod` with the runtime's
    /// env, and what goes on its stdin.
    pub fn command(&self, op: &str, pod: &CniPod) -> (Command, String) {
        let mut cmd = Command::new(&self.plugin);
        cmd.env_clear()
            .env("CNI_COMMAND", op)
            .env("CNI_CONTAINERID", &pod.container_id)
            .env("CNI_NETNS", &pod.netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/opt/cni/bin")
            .env(
                "CNI_ARGS",
                format!(
                    "K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_UID={}",
                    pod.namespace, pod.name, pod.uid
                ),
            );
        (cmd, self.conf(pod).to_string())
    }

    /// Runs `op` on `pod`: its wall time, or what it wrote when it failed.
    pub fn call(&self, op: &str, pod: &CniPod) -> Result<Duration, String> {
        let (mut cmd, stdin) = self.command(op, pod);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting the plugin: {e}"))?;
        let written = (child.stdin.take())
            .expect("a piped stdin")
            .write_all(stdin.as_bytes());
        let out = child
            .wait_with_output()
            .map_err(|e| format!("waiting for the plugin: {e}"))?;
        let took = started.elapsed();
        written.map_err(|e| format!("writing the configuration: {e}"))?;
        if out.status.success() {
            Ok(took)
        } else {
            Err(format!(
                "{op} {}/{}: {}: {}{}",
                pod.namespace,
                pod.name,
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
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
