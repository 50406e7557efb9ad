//! A real Kubernetes container runtime for the tests: containerd (Debian's, with its CRI
//! plugin) in a directory of the test's own, driven through the CRI API as kubelet drives
//! it, with a CNI network of the test's own. No image is pulled: images are built from host
//! files as OCI archives and imported — [`IMAGE`] (busybox, the probe binary, `sleep` as its
//! command, also the sandbox image) at the start, others a test adds
//! ([`Containerd::import_busybox_image`]).

pub mod pods;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_cri::v1::{
    runtime_service_client::RuntimeServiceClient, ContainerConfig, ContainerMetadata,
    ContainerState, ContainerStatus, ContainerStatusRequest, CreateContainerRequest,
    ExecSyncRequest, ImageSpec, Int64Value, LinuxContainerConfig, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListContainersRequest,
    ListPodSandboxRequest, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
    PodSandboxStatusRequest, PodSandboxStatusResponse, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use tonic::transport::Channel;

use crate::daemon::StateDir;
use crate::oci;
use crate::process::{within, EVENTUALLY};
use crate::redirector::run_ok;
use crate::rootfs::Rootfs;
use crate::{probe_bin, ChildGuard, Spawn};

pub const IMAGE: &str = "localhost/rdt-probe:1";

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
        // The socket file comes at bind, a moment before containerd listens on it.
        let started = within(EVENTUALLY, || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        });
        assert!(
            started.is_some(),
            "containerd did not start: {}",
            child.stderr()
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime
            .block_on(redirector::cri::channel(&socket))
            .map(RuntimeServiceClient::new)
            .expect("connecting to containerd's CRI");
        let cri = Containerd {
            dir,
            child,
            runtime,
            client,
        };
        let probe = [(probe_bin(), "/usr/local/bin/probe")];
        let sleep = serde_json::json!({"Cmd": ["/bin/sleep", "100000"]});
        cri.import_busybox_image(IMAGE, &probe, sleep);
        cri
    }

    /// The image `reference`: busybox, `binaries` (host path, absolute path inside) with the
    /// libraries they need, and `config` as its run config; built under this containerd's
    /// directory and imported.
    pub fn import_busybox_image(
        &self,
        reference: &str,
        binaries: &[(PathBuf, &str)],
        config: serde_json::Value,
    ) {
        let work = self.dir.path().join(reference.replace(['/', ':'], "_"));
        let rootfs = Rootfs::busybox(&work.join("rootfs"));
        for (host, inside) in binaries {
            rootfs.add_binary(host, inside);
        }
        self.import(&oci::archive(&work, rootfs.path(), reference, config));
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
        self.ctr(&["images", "import", &archive.display().to_string()]);
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

    fn sandbox_status(&mut self, id: &str, verbose: bool) -> PodSandboxStatusResponse {
        self.runtime
            .block_on(self.client.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose,
            }))
            .unwrap_or_else(|e| panic!("PodSandboxStatus {id}: {e}"))
            .into_inner()
    }

    /// The sandbox's IP address, from PodSandboxStatus.
    pub fn sandbox_ip(&mut self, id: &str) -> std::net::IpAddr {
        self.sandbox_ips(id)[0]
    }

    /// The sandbox's IP addresses, from PodSandboxStatus: the primary one first (IPv4 on a
    /// dual-stack network), then the others.
    pub fn sandbox_ips(&mut self, id: &str) -> Vec<std::net::IpAddr> {
        let network = self
            .sandbox_status(id, false)
            .status
            .and_then(|s| s.network);
        let (ip, more) = network
            .map(|n| (n.ip, n.additional_ips))
            .unwrap_or_default();
        std::iter::once(ip)
            .chain(more.into_iter().map(|a| a.ip))
            .map(|ip| {
                ip.parse()
                    .unwrap_or_else(|_| panic!("sandbox {id} has no IP ({ip:?})"))
            })
            .collect()
    }

    /// The path of the sandbox's network namespace, as CNI plugins got it: from the
    /// runtime spec in PodSandboxStatus's verbose info.
    pub fn sandbox_netns(&mut self, id: &str) -> PathBuf {
        let info = self.sandbox_status(id, true).info;
        let info: serde_json::Value = info
            .get("info")
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_else(|| panic!("sandbox {id}: no verbose info: {info:?}"));
        let namespaces = info["runtimeSpec"]["linux"]["namespaces"].as_array();
        namespaces
            .into_iter()
            .flatten()
            .find(|ns| ns["type"] == "network")
            .and_then(|ns| ns["path"].as_str())
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("sandbox {id}: no network namespace in {info}"))
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
        self.create_and_start(sandbox, container_config(name, IMAGE, command, uid))
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

    /// Waits for `container` to exit: its exit code; panics with its log after `timeout`.
    pub fn wait_exit(&mut self, container: &str, timeout: Duration) -> i32 {
        let mut code = None;
        within(timeout, || {
            code = self.exit_code(container);
            code.is_some()
        });
        code.unwrap_or_else(|| panic!("{container} still runs: {}", self.container_log(container)))
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
                timeout: EVENTUALLY.as_secs() as i64,
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

    /// Once every sandbox was removed through the CRI: containerd lists no sandbox or
    /// container, and no shim or runtime process (its command line names this containerd's
    /// directory) nor mount under the directory is left; then containerd is stopped, and
    /// neither it nor its directory is left.
    pub fn stop_leaving_nothing(mut self) {
        let sandboxes = self
            .runtime
            .block_on(
                self.client
                    .list_pod_sandbox(ListPodSandboxRequest { filter: None }),
            )
            .expect("ListPodSandbox")
            .into_inner()
            .items;
        let containers = self
            .runtime
            .block_on(
                self.client
                    .list_containers(ListContainersRequest { filter: None }),
            )
            .expect("ListContainers")
            .into_inner()
            .containers;
        assert!(sandboxes.is_empty(), "sandboxes left: {sandboxes:?}");
        assert!(containers.is_empty(), "containers left: {containers:?}");
        let dir = self.dir.path().to_path_buf();
        let containerd = format!("{}: ", self.child.pid());
        let others = || -> Vec<String> {
            let mut left = processes_mentioning(&dir);
            left.retain(|p| !p.starts_with(&containerd));
            left
        };
        // A shim exits shortly after its last task was deleted.
        within(EVENTUALLY, || others().is_empty());
        assert_eq!(others(), Vec::<String>::new(), "runtime processes left");
        assert_eq!(mounts_under(&dir), Vec::<PathBuf>::new(), "mounts left");
        drop(self);
        assert!(!dir.exists(), "{} left", dir.display());
        assert_eq!(processes_mentioning(&dir), Vec::<String>::new());
    }
}

/// The config of a container `name` running `command` from `image` as `uid`, its log in
/// the sandbox's log directory: what [`Containerd::start_container`] starts, for a test to
/// add to (a privileged security context, mounts).
pub fn container_config(name: &str, image: &str, command: &[&str], uid: i64) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image.into(),
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
    }
}

/// Mount points at or below `dir` (from /proc/self/mountinfo), sorted.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let mounts = redirector::sys::mounts::mounts().unwrap_or_default();
    let mut mounts: Vec<PathBuf> = mounts
        .into_iter()
        .map(|m| m.point)
        .filter(|point| point.starts_with(dir))
        .collect();
    mounts.sort();
    mounts.dedup();
    mounts
}

/// `pid: cmdline` of every other process whose command line contains `needle`.
fn processes_mentioning(needle: &Path) -> Vec<String> {
    let needle = needle.to_string_lossy().into_owned();
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(&needle) {
            found.push(format!("{pid}: {}", cmdline.trim()));
        }
    }
    found
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
        let mounts = mounts_under(self.dir.path());
        for mount in mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(mount).status();
        }
    }
}
