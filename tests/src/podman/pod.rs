//! A podman pod made the way a kubelet makes one: the sandbox (infra container) with its
//! network namespace first, its network wired up, then init containers and the others.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use crate::cgroup::cgroup2_root;
use crate::podman::rootfs::Rootfs;
use crate::podman::Podman;
use crate::process::within;

/// A pod of a [`Podman`], removed with all its containers on drop (SIGKILL, no grace).
#[derive(Debug)]
pub struct Pod<'a> {
    podman: &'a Podman,
    name: String,
    id: String,
    infra_pid: u32,
    removed: bool,
}

impl<'a> Pod<'a> {
    /// `podman pod create --network none` under the installation's cgroup parent, then
    /// `podman init` of the infra container: runc creates it (its process and netns exist)
    /// without starting it, so the pod is not running yet — podman refuses an init container
    /// in a running pod — while its netns can already be wired up, as CNI would.
    pub fn create(podman: &'a Podman, name: &str) -> Self {
        let id = podman.run(&[
            "pod",
            "create",
            "--name",
            name,
            "--network",
            "none",
            "--cgroup-parent",
            &podman.cgroup_parent().podman_arg(),
        ]);
        let mut pod = Pod {
            podman,
            name: name.to_owned(),
            id,
            infra_pid: 0,
            removed: false,
        };
        let infra = pod.inspect("{{.InfraContainerID}}");
        podman.run(&["init", &infra]);
        let pid = podman.run(&["inspect", "--format", "{{.State.Pid}}", &infra]);
        pod.infra_pid = pid
            .parse()
            .unwrap_or_else(|_| panic!("infra container pid {pid:?}"));
        assert!(
            pod.infra_pid > 0,
            "infra container has no process after podman init"
        );
        pod
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The infra container's process; it holds the pod's namespaces.
    pub fn infra_pid(&self) -> u32 {
        self.infra_pid
    }

    /// `/proc/<infra pid>/ns/net`: the pod's network namespace while the pod exists.
    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.infra_pid))
    }

    /// `podman pod inspect --format <format>`.
    pub fn inspect(&self, format: &str) -> String {
        self.podman
            .run(&["pod", "inspect", "--format", format, &self.name])
    }

    /// The pod's cgroup v2 directory: every container of the pod is in a child of it.
    pub fn cgroup(&self) -> PathBuf {
        let rel = self.inspect("{{.CgroupPath}}");
        cgroup2_root().join(rel.trim_start_matches('/'))
    }

    /// `<pod>-<role>`: container names are global in an installation.
    pub fn container_name(&self, role: &str) -> String {
        format!("{}-{role}", self.name)
    }

    /// `podman create --pod <pod> --name <pod>-<role> <options> --rootfs <rootfs> <command>`;
    /// returns the container's name.
    pub fn add_container(
        &self,
        role: &str,
        options: &[&str],
        rootfs: &Rootfs,
        command: &[&str],
    ) -> String {
        let name = self.container_name(role);
        let mut args: Vec<String> = ["create", "--pod", &self.name, "--name", &name]
            .map(str::to_owned)
            .to_vec();
        args.extend(options.iter().map(|o| (*o).to_owned()));
        args.push("--rootfs".into());
        args.push(rootfs.path().to_string_lossy().into_owned());
        args.extend(command.iter().map(|c| (*c).to_owned()));
        self.podman.run(&args);
        name
    }

    /// `podman pod start`: runs the init containers to completion (it fails if one exits
    /// non-zero, and then starts nothing else), then starts the other containers.
    pub fn start(&self) -> Output {
        self.podman.try_run(&["pod", "start", &self.name])
    }

    /// `podman exec --user uid:gid <pod>-<role> <command>`, whatever its exit status.
    pub fn exec(&self, role: &str, uid: u32, gid: u32, command: &[&str]) -> Output {
        let user = format!("{uid}:{gid}");
        let ctr = self.container_name(role);
        let mut args = vec!["exec", "--user", &user, &ctr];
        args.extend_from_slice(command);
        self.podman.try_run(&args)
    }

    /// The host pid of a running container's first process.
    pub fn container_pid(&self, role: &str) -> u32 {
        let pid = self.podman.run(&[
            "inspect",
            "--format",
            "{{.State.Pid}}",
            &self.container_name(role),
        ]);
        pid.parse()
            .unwrap_or_else(|_| panic!("pid of {role}: {pid:?}"))
    }

    /// Polls `podman logs` until at least `count` lines satisfy `pred`; returns them.
    pub fn wait_log_lines(
        &self,
        role: &str,
        count: usize,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let (mut lines, mut out) = (Vec::new(), None);
        let found = within(timeout, || {
            let logs = self.podman.try_run(&["logs", &self.container_name(role)]);
            let text = String::from_utf8_lossy(&logs.stdout);
            lines = text
                .lines()
                .filter(|l| pred(l))
                .map(str::to_owned)
                .collect();
            out = Some(logs);
            lines.len() >= count
        });
        let out = out.expect("podman logs ran");
        assert!(
            found.is_some(),
            "{role}: {count} matching log lines expected within {timeout:?}; stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        lines
    }

    /// `podman pod rm -f -t 0`, checked (drop does the same without checking).
    pub fn remove(mut self) {
        self.podman.run(&["pod", "rm", "-f", "-t", "0", &self.name]);
        self.removed = true;
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        // -t 0: a container's pid 1 ignores SIGTERM, podman would wait 10 s per container.
        // Never panic here: this may run while a test is already unwinding.
        match self
            .podman
            .command(&["pod", "rm", "-f", "-t", "0", &self.name])
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "warning: podman pod rm {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => eprintln!("warning: cannot run podman: {e}"),
        }
    }
}
