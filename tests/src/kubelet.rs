//! kubelet's part for one DaemonSet or Job: its manifest parsed (serde_yaml_ng) and turned into the
//! CRI calls kubelet would make on the tests' containerd — the pod sandbox (host network,
//! host pid), each container with its image, command, args, env, privileged security
//! context and hostPath mounts (with their types and propagation), and the readiness
//! probe. Every field of a pod spec or container the manifest uses must be known here: an
//! unknown one fails the parse, so nothing in the manifest goes untested unnoticed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_cri::v1::{
    ContainerConfig, KeyValue, LinuxContainerSecurityContext, Mount, MountPropagation,
    NamespaceMode, NamespaceOption,
};
use serde::Deserialize;

use crate::cri::{Containerd, Sandbox};

#[derive(Deserialize)]
struct Manifest {
    kind: String,
    metadata: Metadata,
    spec: WorkloadSpec,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
    namespace: String,
}

/// A DaemonSet's or a Job's spec: the pod template is all a node sees of either.
#[derive(Deserialize)]
struct WorkloadSpec {
    template: Template,
}

#[derive(Deserialize)]
struct Template {
    spec: PodSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PodSpec {
    #[serde(default, rename = "hostPID")]
    host_pid: bool,
    #[serde(default)]
    host_network: bool,
    // Scheduling and DNS: nothing on the node to translate.
    #[allow(dead_code)]
    dns_policy: Option<String>,
    #[allow(dead_code)]
    priority_class_name: Option<String>,
    #[allow(dead_code)]
    tolerations: Option<serde_yaml_ng::Value>,
    termination_grace_period_seconds: Option<u64>,
    // A Job's: the test runs it once and reads the exit codes.
    #[allow(dead_code)]
    restart_policy: Option<String>,
    #[serde(default)]
    init_containers: Vec<Container>,
    containers: Vec<Container>,
    #[serde(default)]
    volumes: Vec<Volume>,
}

/// One container of the pod template.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Container {
    pub name: String,
    pub image: String,
    // The image is imported, never pulled.
    #[allow(dead_code)]
    image_pull_policy: Option<String>,
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<EnvVar>,
    security_context: Option<SecurityContext>,
    // Ports of a host-network pod are the node's: nothing to set up.
    #[serde(default)]
    #[allow(dead_code)]
    ports: Vec<serde_yaml_ng::Value>,
    readiness_probe: Option<Probe>,
    liveness_probe: Option<Probe>,
    #[serde(default)]
    volume_mounts: Vec<VolumeMount>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecurityContext {
    #[serde(default)]
    privileged: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Probe {
    http_get: HttpGet,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpGet {
    path: String,
    port: u16,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VolumeMount {
    name: String,
    mount_path: String,
    #[serde(default)]
    read_only: bool,
    mount_propagation: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Volume {
    name: String,
    host_path: HostPath,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostPath {
    path: String,
    #[serde(rename = "type", default)]
    kind: String,
}

/// The node the pod runs on, as the test lays it out.
pub struct Node {
    /// Host paths the test keeps elsewhere (the runtime's CNI directories and socket
    /// directory are the test containerd's): manifest path → the test's path.
    pub host_paths: BTreeMap<PathBuf, PathBuf>,
    /// The pods' cgroup parent, relative to the cgroup2 root.
    pub cgroup_parent: String,
    /// Env vars the operator sets on every container of the pod (the daemon's node
    /// options, a test-only switch), replacing the manifest's of the same name.
    pub node_env: Vec<(String, String)>,
}

/// A DaemonSet's or a Job's manifest: its pod template.
pub struct DaemonSet {
    name: String,
    namespace: String,
    pod: PodSpec,
}

/// A running pod of the DaemonSet: its sandbox and its containers by name.
pub struct Pod {
    pub sandbox: Sandbox,
    pub containers: BTreeMap<String, String>,
}

impl DaemonSet {
    pub fn load(path: &Path) -> Self {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let manifest: Manifest = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| {
            panic!("{} is not a DaemonSet this kit knows: {e}", path.display())
        });
        assert!(
            ["DaemonSet", "Job"].contains(&manifest.kind.as_str()),
            "{}: a {} is not run here",
            path.display(),
            manifest.kind
        );
        DaemonSet {
            name: manifest.metadata.name,
            namespace: manifest.metadata.namespace,
            pod: manifest.spec.template.spec,
        }
    }

    /// The container named `name`.
    pub fn container(&self, name: &str) -> &Container {
        self.pod
            .init_containers
            .iter()
            .chain(&self.pod.containers)
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no container {name} in the DaemonSet"))
    }

    /// The one image every container runs.
    pub fn image(&self) -> &str {
        let image = &self.pod.containers[0].image;
        for c in self.pod.init_containers.iter().chain(&self.pod.containers) {
            assert_eq!(&c.image, image, "{} runs another image", c.name);
        }
        image
    }

    /// The pod as kubelet starts it on `node`, with `image` in place of the manifest's:
    /// the sandbox, each init container run to its end (exit 0), then the containers.
    pub fn run(&self, cri: &mut Containerd, node: &Node, pod_name: &str, image: &str) -> Pod {
        let sandbox = self.sandbox(cri, node, pod_name);
        for init in &self.pod.init_containers {
            let id = cri.create_and_start(&sandbox, self.config(init, node, image, None));
            let code = cri.wait_exit(&id, Duration::from_secs(30));
            assert_eq!(
                code,
                0,
                "init container {}: {}",
                init.name,
                cri.container_log(&id)
            );
        }
        let containers = self
            .pod
            .containers
            .iter()
            .map(|c| {
                let id = cri.create_and_start(&sandbox, self.config(c, node, image, None));
                (c.name.clone(), id)
            })
            .collect();
        Pod {
            sandbox,
            containers,
        }
    }

    /// The pod run as a Job's: its containers waited for; the first failing one's exit
    /// code (0 when all succeed) and every container's log. The sandbox is removed.
    pub fn complete(
        &self,
        cri: &mut Containerd,
        node: &Node,
        pod_name: &str,
        image: &str,
    ) -> (i32, String) {
        let pod = self.run(cri, node, pod_name, image);
        let mut worst = 0;
        for id in pod.containers.values() {
            let code = cri.wait_exit(id, Duration::from_secs(30));
            if worst == 0 {
                worst = code;
            }
        }
        let logs = self.logs(cri, &pod);
        cri.remove_sandbox(&pod.sandbox.0);
        (worst, logs)
    }

    /// A one-off run of `container`'s image, env and mounts with `args` in place of its
    /// own (a Job made from it, as the uninstall is), in a sandbox of its own: the exit
    /// code and what it wrote. `env` is added to the container's.
    pub fn run_once(
        &self,
        cri: &mut Containerd,
        node: &Node,
        container: &str,
        image: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (i32, String) {
        let sandbox = self.sandbox(cri, node, &format!("{container}-job"));
        let mut spec = self.container(container).clone();
        spec.args = args.iter().map(|a| a.to_string()).collect();
        spec.readiness_probe = None;
        spec.liveness_probe = None;
        for (name, value) in env {
            spec.env.retain(|e| e.name != *name);
            spec.env.push(EnvVar {
                name: name.to_string(),
                value: value.to_string(),
            });
        }
        let id = cri.create_and_start(&sandbox, self.config(&spec, node, image, Some(container)));
        let code = cri.wait_exit(&id, Duration::from_secs(30));
        let log = cri.container_log(&id);
        cri.remove_sandbox(&sandbox.0);
        (code, log)
    }

    /// Waits until every container's readiness probe answers 200 (and its liveness probe
    /// does too); panics with the containers' logs after `timeout`.
    pub fn wait_ready(&self, cri: &mut Containerd, pod: &Pod, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for c in &self.pod.containers {
            for probe in [&c.readiness_probe, &c.liveness_probe]
                .into_iter()
                .flatten()
            {
                let addr = format!("127.0.0.1:{}", probe.http_get.port);
                loop {
                    match crate::daemon::http_get(&addr, &probe.http_get.path) {
                        Ok((200, _)) => break,
                        answer if Instant::now() > deadline => panic!(
                            "{}: GET {addr}{} answered {answer:?}\n{}",
                            c.name,
                            probe.http_get.path,
                            self.logs(cri, pod)
                        ),
                        _ => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            }
        }
    }

    /// The pod deleted as kubelet deletes it: each container stopped with the pod's grace
    /// period (SIGTERM, then SIGKILL), then the sandbox stopped and removed.
    pub fn delete(&self, cri: &mut Containerd, pod: Pod) {
        let grace = self.pod.termination_grace_period_seconds.unwrap_or(30);
        for id in pod.containers.values() {
            cri.stop_container(id, grace as i64);
        }
        cri.remove_sandbox(&pod.sandbox.0);
    }

    /// Every container's log, for a failure message.
    pub fn logs(&self, cri: &mut Containerd, pod: &Pod) -> String {
        pod.containers
            .iter()
            .map(|(name, id)| format!("--- {name}:\n{}\n", cri.container_log(id)))
            .collect()
    }

    fn namespaces(&self) -> NamespaceOption {
        let mode = |host: bool| {
            if host {
                NamespaceMode::Node as i32
            } else {
                NamespaceMode::Pod as i32
            }
        };
        NamespaceOption {
            network: mode(self.pod.host_network),
            pid: mode(self.pod.host_pid),
            ..Default::default()
        }
    }

    fn sandbox(&self, cri: &mut Containerd, node: &Node, pod_name: &str) -> Sandbox {
        let mut config = cri.sandbox_config(
            &self.namespace,
            &format!("{}-{pod_name}", self.name),
            &[],
            &format!("{}/{}-{pod_name}", node.cgroup_parent, self.name),
        );
        if self.pod.host_network {
            // The node's UTS namespace: kubelet sets no hostname of the pod's.
            config.hostname.clear();
        }
        let linux = config.linux.as_mut().unwrap();
        let security = linux.security_context.as_mut().unwrap();
        security.namespace_options = Some(self.namespaces());
        // As kubelet: a sandbox may hold privileged containers only if it is privileged.
        security.privileged = self
            .pod
            .init_containers
            .iter()
            .chain(&self.pod.containers)
            .any(|c| c.security_context.as_ref().is_some_and(|s| s.privileged));
        cri.run_pod_sandbox(config)
            .unwrap_or_else(|e| panic!("RunPodSandbox {pod_name}: {e}\n{}", cri.log()))
    }

    /// The CRI config of `container`; `name` overrides its name (a one-off run).
    fn config(
        &self,
        container: &Container,
        node: &Node,
        image: &str,
        name: Option<&str>,
    ) -> ContainerConfig {
        let envs = container
            .env
            .iter()
            .filter(|e| !node.node_env.iter().any(|(name, _)| *name == e.name))
            .map(|e| (e.name.clone(), e.value.clone()))
            .chain(node.node_env.iter().cloned())
            .map(|(key, value)| KeyValue { key, value })
            .collect();
        let name = name.unwrap_or(&container.name);
        let command: Vec<&str> = container.command.iter().map(String::as_str).collect();
        let mut config = crate::cri::container_config(name, image, &command, 0);
        config.args = container.args.clone();
        config.envs = envs;
        config.mounts = container
            .volume_mounts
            .iter()
            .map(|m| self.mount(m, node))
            .collect();
        // The image's user (no runAsUser in the manifest), privileged as the manifest says.
        let privileged = container
            .security_context
            .as_ref()
            .is_some_and(|s| s.privileged);
        config
            .linux
            .as_mut()
            .expect("a Linux config")
            .security_context = Some(LinuxContainerSecurityContext {
            privileged,
            namespace_options: Some(self.namespaces()),
            ..Default::default()
        });
        config
    }

    /// A volume mount as kubelet makes it: the hostPath volume's path (made first when
    /// its type is DirectoryOrCreate), read-only and propagation as written.
    fn mount(&self, mount: &VolumeMount, node: &Node) -> Mount {
        let volume = self
            .pod
            .volumes
            .iter()
            .find(|v| v.name == mount.name)
            .unwrap_or_else(|| panic!("mount {} names no volume", mount.name));
        let path = PathBuf::from(&volume.host_path.path);
        let host = node.host_paths.get(&path).cloned().unwrap_or(path);
        match volume.host_path.kind.as_str() {
            "" => {}
            "DirectoryOrCreate" => std::fs::create_dir_all(&host)
                .unwrap_or_else(|e| panic!("creating {}: {e}", host.display())),
            "Directory" => assert!(
                host.is_dir(),
                "hostPath {} is not a directory",
                host.display()
            ),
            other => panic!("hostPath type {other} is not known here"),
        }
        let propagation = match mount.mount_propagation.as_deref() {
            None | Some("None") => MountPropagation::PropagationPrivate,
            Some("HostToContainer") => MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => MountPropagation::PropagationBidirectional,
            Some(other) => panic!("mountPropagation {other} is not known here"),
        };
        Mount {
            container_path: mount.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly: mount.read_only,
            propagation: propagation as i32,
            ..Default::default()
        }
    }
}
