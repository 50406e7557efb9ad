//! `redirector-cni` invoked exactly as a container runtime does: CNI_* env vars and the
//! network configuration on stdin, against namespaces the test made, beside a daemon.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use redirector_tests::daemon::{Daemon, StateDir};
use redirector_tests::redirector::{pod_links, redirector_bin, PinRoot, STANDARD_INJECTION};
use redirector_tests::{
    assert_direct, assert_proxied, require_root, use_probe_bin, Cgroup, ProxiedPod, APP_UID,
};

/// The binary under the name a runtime calls it by.
struct Plugin {
    path: PathBuf,
    _dir: StateDir,
}

impl Plugin {
    fn new() -> Self {
        let dir = StateDir::new("cnibin");
        let path = dir.path().join("redirector-cni");
        std::os::unix::fs::symlink(redirector_bin(), &path).unwrap();
        Plugin { path, _dir: dir }
    }

    /// Run `command` with the runtime's env and `conf` on stdin: success and stdout JSON.
    fn call(&self, command: &str, container: &str, netns: &str, conf: &Value) -> (bool, Value) {
        let env = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web",
            ),
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
    fn raw(&self, command: &str, stdin: &str) -> (bool, Value) {
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
    fn run(&self, env: &[(&str, &str)], stdin: &str) -> std::process::Output {
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

fn conf(root: &Path, state: &Path, annotations: Value) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "pods",
        "type": "redirector-cni",
        "socket": state.join("redirector.sock"),
        "pinRoot": root,
        "stateDir": state,
        "args": STANDARD_INJECTION,
        "runtimeConfig": { "io.kubernetes.cri.pod-annotations": annotations },
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
            "ips": [{"address": "10.1.2.3/24", "interface": 0}]
        }
    })
}

#[test]
fn plugin_speaks_cni_version_and_errors() {
    let plugin = Plugin::new();
    let (ok, version) = plugin.raw("VERSION", "{}");
    assert!(ok);
    assert_eq!(version["cniVersion"], "1.1.0");
    assert!(version["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("1.0.0")));
    let (ok, err) = plugin.raw("ADD", "{not json");
    assert!(!ok);
    assert_eq!(err["code"], 6, "{err}");
    let (ok, err) = plugin.raw(
        "EXPLODE",
        r#"{"cniVersion":"1.0.0","type":"redirector-cni"}"#,
    );
    assert!(!ok);
    assert_eq!(err["code"], 4, "{err}");
    let (ok, err) = plugin.raw("ADD", r#"{"cniVersion":"9.9.9","type":"redirector-cni"}"#);
    assert!(!ok);
    assert_eq!(err["code"], 1, "{err}");
}

#[test]
fn add_captures_before_the_pod_runs_and_del_is_idempotent() {
    if !require_root() {
        return;
    }
    use_probe_bin(env!("CARGO_BIN_EXE_probe"));
    let plugin = Plugin::new();
    let root = PinRoot::new("cni");
    let node = Cgroup::new("node");
    let state = StateDir::new("state");

    // Nothing pinned yet (no daemon has run): ADD says "try again later", STATUS 50.
    let pod = ProxiedPod::under(&node, "cnipod");
    let netns = pod.topo.pod.path().display().to_string();
    let conf = conf(root.path(), state.path(), json!({}));
    let (ok, err) = plugin.call("ADD", "c1", &netns, &conf);
    assert!(!ok);
    assert_eq!(err["code"], 11, "{err}");
    let (ok, err) = plugin.call("STATUS", "", "", &conf);
    assert!(!ok);
    assert_eq!(err["code"], 50, "{err}");

    // A daemon runs once (pins the node's programs), then is killed: ADD needs no daemon.
    Daemon::start(&root, &node, &state).kill();
    let (ok, _) = plugin.call("STATUS", "", "", &conf);
    assert!(ok);
    let (ok, result) = plugin.call("ADD", "c1", &netns, &conf);
    assert!(ok, "{result}");
    assert_eq!(
        result, conf["prevResult"],
        "prevResult passed through unchanged"
    );
    let dst = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, dst), dst);
    let (ok, err) = plugin.call("CHECK", "c1", &netns, &conf);
    assert!(ok, "{err}");

    // A daemon started now lists the pod the plugin set up.
    let daemon = Daemon::start(&root, &node, &state);
    assert_eq!(daemon.pods()[0]["name"], "default/web");

    // DEL: the pod is released; again with no netns (containerd's second DEL): fine.
    let (ok, err) = plugin.call("DEL", "c1", &netns, &conf);
    assert!(ok, "{err}");
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    assert_eq!(pod_links(&root, pod.topo.pod.cookie()), None);
    let (ok, err) = plugin.call("DEL", "c1", "", &conf);
    assert!(ok, "{err}");
    let (ok, err) = plugin.call("DEL", "unknown", "", &conf);
    assert!(ok, "{err}");
    assert!(daemon.pods().is_empty());

    // Annotations: opted out, nothing installed; a port excluded, that port passes.
    let opted_out = self::conf(
        root.path(),
        state.path(),
        json!({"sidecar.istio.io/inject": "false"}),
    );
    let (ok, result) = plugin.call("ADD", "c2", &netns, &opted_out);
    assert!(ok, "{result}");
    assert_eq!(pod_links(&root, pod.topo.pod.cookie()), None);
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    let excluded = self::conf(
        root.path(),
        state.path(),
        json!({"traffic.sidecar.istio.io/excludeOutboundPorts": dst.port().to_string()}),
    );
    let (ok, result) = plugin.call("ADD", "c3", &netns, &excluded);
    assert!(ok, "{result}");
    assert_direct(&pod.connect(APP_UID, APP_UID, dst), dst);
    let v6 = pod.service(true);
    assert_direct(&pod.connect(APP_UID, APP_UID, v6), v6);
    let (ok, _) = plugin.call("DEL", "c3", &netns, &excluded);
    assert!(ok);

    // A missing namespace is an error naming it; a bad flag in the network's args too.
    let (ok, err) = plugin.call("ADD", "c4", "/run/netns/rdt-missing", &conf);
    assert!(!ok);
    assert!(
        err["msg"].as_str().unwrap().contains("rdt-missing"),
        "{err}"
    );
    let mut bad = conf.clone();
    bad["args"] = json!(["-p", "70000"]);
    let (ok, err) = plugin.call("ADD", "c5", &netns, &bad);
    assert!(!ok);
    assert_eq!(err["code"], 7, "{err}");
    assert!(err["msg"].as_str().unwrap().contains("70000"), "{err}");
}
