//! A real Kubernetes container runtime for the tests: containerd (Debian's, with its CRI
//! plugin) in a directory of the test's own, driven through the CRI API as kubelet drives
//! it, with a CNI network of the test's own. No image is pulled: the one image (busybox,
//! the probe binary, `sleep` as its command, also the sandbox image) is built from host
//! files as an OCI archive and imported.

pub mod pods;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_cri::v1::{
    runtime_service_client::RuntimeServiceClient, ContainerConfig, ContainerMetadata,
    ContainerState, ContainerStatus, ContainerStatusRequest, CreateContainerRequest,
    ExecSyncRequest, ImageSpec, Int64Value, LinuxContainerConfig, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListPodSandboxRequest, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use tonic::transport::Channel;

use crate::daemon::StateDir;
use crate::oci;
use crate::podman::rootfs::Rootfs;
use crate::podman::{mounts_under, processes_mentioning};
use crate::process::within;
use crate::redirector::run_ok;
use crate::{probe_bin, ChildGuard, Spawn};

pub const IMAGE: &str = "localhost/rdt-probe:1";

/// `ctr images import` of `archive` into the CRI's namespace.
fn import(socket: &Path, archive: &Path) {
    run_ok(
        Command::new("ctr")
            .arg("--address")
            .arg(socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive),
    );
}

/// A pod sandbox: its id and the config it was run with.
pub type Sandbox = (String, PodSandboxConfig);

/// containerd in its own directory, with a CNI network of the test's own.
pub struct Containerd {
    dir: StateDir,
    child: ChildGuard,
    runtime: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

impl Containerd {
    /// Start containerd with `conflist` as its only network, `plugins` (name, binary) in
    /// its CNI bin dir beside the host's reference plugins, and [`IMAGE`] imported.
    pub fn start(conflist: &serde_json::Value, plugins: &[(&str, &Path)]) -> Self {
        let dir = StateDir::new("cri");
        let d = dir.path();
        let bin = d.join("cni-bin");
        let conf = d.join("cni-conf");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&conf).unwrap();
        for plugin in ["ptp", "host-local", "loopback", "bridge"] {
            let host = Path::new("/usr/lib/cni").join(plugin);
            std::os::unix::fs::symlink(&host, bin.join(plugin)).unwrap();
        }
        for (name, path) in plugins {
            std::os::unix::fs::symlink(path, bin.join(name)).unwrap();
        }
        std::fs::write(conf.join("10-test.conflist"), conflist.to_string()).unwrap();
        let socket = d.join("containerd.sock");
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{ttrpc}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  restrict_oom_score_adj = true
  # Pod network namespaces under this containerd's own directory, not /var/run/netns: a
  # sandbox whose setup or teardown failed half-way leaves no namespace behind when the
  # directory's mounts are removed.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
"#,
            root = d.join("root").display(),
            state = d.join("state").display(),
            socket = socket.display(),
            ttrpc = d.join("containerd.sock.ttrpc").display(),
            bin = bin.display(),
            conf = conf.display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let child = Spawn::new("containerd")
            .args(["--config", &d.join("config.toml").display().to_string()])
            .spawn();
        let started = within(Duration::from_secs(20), || socket.exists());
        assert!(
            started.is_some(),
            "containerd did not start: {}",
            child.stderr()
        );
        let rootfs_dir = d.join("rootfs");
        let rootfs = Rootfs::busybox(&rootfs_dir);
        rootfs.add_binary(&probe_bin(), "/usr/local/bin/probe");
        let archive = oci::archive(
            d,
            rootfs.path(),
            IMAGE,
            serde_json::json!({"Cmd": ["/bin/sleep", "100000"]}),
        );
        import(&socket, &archive);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime
            .block_on(redirector::cri::channel(&socket))
            .map(RuntimeServiceClient::new)
            .expect("connecting to containerd's CRI");
        Containerd {
            dir,
            child,
            runtime,
            client,
        }
    }

    pub fn log(&self) -> String {
        self.child.stderr()
    }

    /// RunPodSandbox as kubelet does for a pod of namespace `default`: a pod network
    /// namespace, `annotations`, and `cgroup_parent` (relative to the cgroup2 root). Its id
    /// and config.
    pub fn run_sandbox(
        &mut self,
        name: &str,
        annotations: &[(&str, &str)],
        cgroup_parent: &str,
    ) -> (String, PodSandboxConfig) {
        self.run_sandbox_in("default", name, annotations, cgroup_parent)
    }

    /// [`Containerd::run_sandbox`] for a pod of Kubernetes namespace `namespace`.
    pub fn run_sandbox_in(
        &mut self,
        namespace: &str,
        name: &str,
        annotations: &[(&str, &str)],
        cgroup_parent: &str,
    ) -> (String, PodSandboxConfig) {
        self.try_run_sandbox(namespace, name, annotations, cgroup_parent)
            .unwrap_or_else(|e| {
                panic!(
                    "RunPodSandbox {namespace}/{name}: {e}\ncontainerd:\n{}",
                    self.log()
                )
            })
    }

    /// [`Containerd::run_sandbox_in`], with the runtime's refusal (a CNI ADD that failed,
    /// for one) as the error instead of a panic.
    pub fn try_run_sandbox(
        &mut self,
        namespace: &str,
        name: &str,
        annotations: &[(&str, &str)],
        cgroup_parent: &str,
    ) -> Result<Sandbox, tonic::Status> {
        let config = self.sandbox_config(namespace, name, annotations, cgroup_parent);
        self.run_pod_sandbox(config)
    }

    /// The config kubelet sends for a pod `namespace/name`: a pod network namespace,
    /// `annotations`, `cgroup_parent` (relative to the cgroup2 root), logs under this
    /// containerd's directory.
    pub fn sandbox_config(
        &self,
        namespace: &str,
        name: &str,
        annotations: &[(&str, &str)],
        cgroup_parent: &str,
    ) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{namespace}-{name}"),
                namespace: namespace.into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: self
                .dir
                .path()
                .join("logs")
                .join(namespace)
                .join(name)
                .display()
                .to_string(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.into(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption::default()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// RunPodSandbox with `config`.
    pub fn run_pod_sandbox(&mut self, config: PodSandboxConfig) -> Result<Sandbox, tonic::Status> {
        let request = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let id = self
            .runtime
            .block_on(self.client.run_pod_sandbox(request))?
            .into_inner()
            .pod_sandbox_id;
        Ok((id, config))
    }

    /// `ctr images import` of `archive`.
    pub fn import(&self, archive: &Path) {
        import(&self.dir.path().join("containerd.sock"), archive);
    }

    /// `ctr -n k8s.io <args>` against this containerd: its stdout (it must succeed).
    pub fn ctr(&self, args: &[&str]) -> String {
        let out = run_ok(
            Command::new("ctr")
                .arg("--address")
                .arg(self.dir.path().join("containerd.sock"))
                .args(["-n", "k8s.io"])
                .args(args),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The CNI configuration directory the runtime reads.
    pub fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("cni-conf")
    }

    /// The CNI plugin directory the runtime runs plugins from.
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("cni-bin")
    }

    /// The sandbox's IP address, from PodSandboxStatus.
    pub fn sandbox_ip(&mut self, id: &str) -> std::net::IpAddr {
        let status = self
            .runtime
            .block_on(self.client.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            }))
            .unwrap_or_else(|e| panic!("PodSandboxStatus: {e}"))
            .into_inner();
        let ip = status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default();
        ip.parse()
            .unwrap_or_else(|_| panic!("sandbox {id} has no IP ({ip:?})"))
    }

    /// The directory of this containerd, for files tests add (IPAM state).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// CreateContainer + StartContainer: `command` from [`IMAGE`] as `uid` in the sandbox.
    pub fn start_container(
        &mut self,
        sandbox: &Sandbox,
        name: &str,
        command: &[&str],
        uid: i64,
    ) -> String {
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: IMAGE.into(),
                ..Default::default()
            }),
            command: command.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}.log"),
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    run_as_user: Some(Int64Value { value: uid }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.create_and_start(sandbox, config)
    }

    /// CreateContainer + StartContainer with `config` in `sandbox`: the container's id.
    pub fn create_and_start(&mut self, sandbox: &Sandbox, config: ContainerConfig) -> String {
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let request = CreateContainerRequest {
            pod_sandbox_id: sandbox.0.clone(),
            config: Some(config),
            sandbox_config: Some(sandbox.1.clone()),
        };
        let id = self
            .runtime
            .block_on(self.client.create_container(request))
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\ncontainerd:\n{}", self.log()))
            .into_inner()
            .container_id;
        self.runtime
            .block_on(self.client.start_container(StartContainerRequest {
                container_id: id.clone(),
            }))
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e}\ncontainerd:\n{}", self.log()));
        id
    }

    /// StopContainer: SIGTERM, then SIGKILL after `grace` seconds.
    pub fn stop_container(&mut self, container: &str, grace: i64) {
        self.runtime
            .block_on(self.client.stop_container(StopContainerRequest {
                container_id: container.into(),
                timeout: grace,
            }))
            .unwrap_or_else(|e| panic!("StopContainer {container}: {e}"));
    }

    /// ContainerStatus of `container`.
    fn container_status(&mut self, container: &str) -> ContainerStatus {
        self.runtime
            .block_on(self.client.container_status(ContainerStatusRequest {
                container_id: container.into(),
                verbose: false,
            }))
            .unwrap_or_else(|e| panic!("ContainerStatus {container}: {e}"))
            .into_inner()
            .status
            .expect("a container status")
    }

    /// The container's exit code once it has exited, `None` while it runs.
    pub fn exit_code(&mut self, container: &str) -> Option<i32> {
        let status = self.container_status(container);
        (status.state == ContainerState::ContainerExited as i32).then_some(status.exit_code)
    }

    /// What the container wrote (stdout and stderr, in the CRI log format's order).
    pub fn container_log(&mut self, container: &str) -> String {
        let status = self.container_status(container);
        let log = std::fs::read_to_string(&status.log_path).unwrap_or_default();
        // Each line: `<time> <stream> <F|P> <text>`.
        log.lines()
            .map(|line| line.splitn(4, ' ').nth(3).unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// ExecSync: the command's exit code and stdout.
    pub fn exec(&mut self, container: &str, command: &[&str]) -> (i32, String) {
        let response = self
            .runtime
            .block_on(self.client.exec_sync(ExecSyncRequest {
                container_id: container.into(),
                cmd: command.iter().map(|s| s.to_string()).collect(),
                timeout: 10,
            }))
            .unwrap_or_else(|e| panic!("ExecSync {command:?}: {e}"))
            .into_inner();
        (
            response.exit_code,
            String::from_utf8_lossy(&response.stdout).into_owned(),
        )
    }

    /// StopPodSandbox + RemovePodSandbox (CNI DEL, twice, as containerd does).
    pub fn remove_sandbox(&mut self, id: &str) {
        self.runtime
            .block_on(self.client.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .unwrap_or_else(|e| panic!("StopPodSandbox: {e}"));
        self.runtime
            .block_on(self.client.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}"));
    }
}

impl Drop for Containerd {
    /// Every sandbox stopped and removed through the CRI (CNI DEL runs), then containerd,
    /// the shims it started and the mounts under its directory; never panics.
    fn drop(&mut self) {
        let sandboxes = self
            .runtime
            .block_on(
                self.client
                    .list_pod_sandbox(ListPodSandboxRequest { filter: None }),
            )
            .map(|r| r.into_inner().items)
            .unwrap_or_default();
        for sandbox in sandboxes {
            let id = sandbox.id;
            let _ = self
                .runtime
                .block_on(self.client.stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                }));
            let _ = self.runtime.block_on(
                self.client
                    .remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id }),
            );
        }
        let _ = self.child.try_wait();
        // The shims were started by this containerd (their command lines name its dir).
        for line in processes_mentioning(self.dir.path()) {
            if let Some(pid) = line.split(':').next().and_then(|p| p.parse::<i32>().ok()) {
                // SAFETY: kill(2) on a process this test's containerd started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let mut mounts = mounts_under(self.dir.path());
        mounts.sort();
        for mount in mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(mount).status();
        }
    }
}
