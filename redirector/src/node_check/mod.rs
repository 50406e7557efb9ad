//! Whether this node can be served, decided once at start — by the daemon, by
//! `install-cni` (given the daemon's node options, so that both judge the same node) and by
//! `redirector check`, the operator's pre-flight. A node that cannot be served gets no
//! chained plugin and a daemon that pins nothing: its pods start as on a node without
//! redirector, and a meshed one is stopped by its mesh's own check (istio's
//! `istio-validation`, Linkerd's network validator) instead of the node going NotReady.

pub mod kubepods;
mod report;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{
    install_cni,
    sys::{cgroup::cgroup2_mount, fs_kind, kernel},
};

/// What the node is judged with: the daemon's node options.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// `--cgroup`: the node cgroup given by hand; `None`: the kubepods cgroup found under
    /// the cgroup2 mount, else that mount's root.
    pub cgroup: Option<PathBuf>,
    /// `--pin-root`: where the object and the pods' links are pinned.
    pub pin_root: PathBuf,
    /// The runtime's CNI configuration directory, where one is to be chained into.
    pub cni_conf_dir: Option<PathBuf>,
    /// The runtime's CRI socket, where one is known: its name and version are shown.
    pub cri_socket: Option<PathBuf>,
}

/// Why a node cannot be served: the metric's `reason` label and the marker's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The kernel lacks a feature redirector needs.
    Kernel,
    /// No cgroup v2 hierarchy is mounted.
    Cgroup2,
    /// The node cgroup given does not exist, or is no cgroup v2 directory.
    KubepodsCgroup,
    /// The pin root is not on a bpffs mount.
    Bpffs,
    /// The runtime's CNI configuration directory does not exist.
    CniConfDir,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::Kernel => "kernel",
            Reason::Cgroup2 => "cgroup2",
            Reason::KubepodsCgroup => "kubepods_cgroup",
            Reason::Bpffs => "bpffs",
            Reason::CniConfDir => "cni_conf_dir",
        }
    }
}

/// The first requirement a node fails, with what was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("this node cannot be served ({}): {detail}", reason.label())]
pub struct Unservable {
    pub reason: Reason,
    pub detail: String,
}

/// How one requirement went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    /// What the operator should know; it never keeps the node from being served.
    Note,
}

/// One requirement of the node: what was found and, where it failed, what to do.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub outcome: Outcome,
    pub found: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// Why the node cannot be served, for a failed requirement.
    #[serde(skip)]
    reason: Option<Reason>,
}

impl Check {
    fn pass(name: &'static str, found: impl Into<String>) -> Self {
        Check {
            name,
            outcome: Outcome::Pass,
            found: found.into(),
            fix: None,
            reason: None,
        }
    }

    fn note(name: &'static str, found: impl Into<String>) -> Self {
        Check {
            outcome: Outcome::Note,
            ..Check::pass(name, found)
        }
    }

    fn fail(name: &'static str, reason: Reason, found: impl Into<String>, fix: &str) -> Self {
        Check {
            outcome: Outcome::Fail,
            fix: Some(fix.to_owned()),
            reason: Some(reason),
            ..Check::pass(name, found)
        }
    }

    fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// Every requirement of the node, and the verdict.
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    pub checks: Vec<Check>,
    /// The node cgroup the daemon attaches at (for a pod whose own cgroup is not found)
    /// and finds pods' cgroups under.
    pub node_cgroup: Option<PathBuf>,
    /// `None` when the node can be served.
    pub unservable: Option<Unservable>,
}

impl NodeReport {
    pub fn servable(&self) -> bool {
        self.unservable.is_none()
    }

    /// The verdict, as a result.
    pub fn verdict(&self) -> Result<(), Unservable> {
        self.unservable.clone().map_or(Ok(()), Err)
    }
}

/// Judge the node by every requirement, in the order they depend on each other.
pub fn assess(options: &NodeOptions) -> NodeReport {
    let mut checks = kernel_checks();
    let mount = cgroup2_mount();
    checks.push(match &mount {
        Ok(mount) => Check::pass("cgroup v2", format!("mounted at {}", mount.display())),
        Err(err) => Check::fail(
            "cgroup v2",
            Reason::Cgroup2,
            err.to_string(),
            "redirector's programs attach to cgroup v2: boot the node with the unified hierarchy (systemd.unified_cgroup_hierarchy=1, the default of current distributions)",
        ),
    });
    let (kubepods, node_cgroup) = kubepods_check(options.cgroup.as_deref(), mount.ok().as_deref());
    checks.push(kubepods);
    checks.push(bpffs_check(&options.pin_root));
    checks.push(memlock_note());
    if let Some(dir) = &options.cni_conf_dir {
        checks.push(cni_conf_check(dir));
    }
    if let Some(socket) = &options.cri_socket {
        checks.push(runtime_note(socket));
    }
    if let Some(cgroup) = &node_cgroup {
        checks.push(neighbours_note(cgroup, &options.pin_root));
    }
    checks.extend(mesh_notes());
    let unservable = checks.iter().find_map(|c| {
        Some(Unservable {
            reason: c.reason?,
            detail: format!("{}: {}", c.name, c.found),
        })
    });
    NodeReport {
        checks,
        node_cgroup,
        unservable,
    }
}

/// The kernel's release and verdict, then each probed feature.
fn kernel_checks() -> Vec<Check> {
    let release = kernel::running_release();
    let probed = kernel::probe_running();
    let missing = kernel::missing_required(&probed);
    let allowed = std::env::var_os(kernel::ALLOW_ENV).is_some();
    let mut checks = vec![if missing.is_empty() {
        Check::pass(
            "kernel",
            format!("Linux {release}: every required feature present"),
        )
    } else if allowed {
        Check::note(
            "kernel",
            format!(
                "Linux {release} lacks, as probed, {}; going on as {} is set",
                missing.join(", "),
                kernel::ALLOW_ENV
            ),
        )
    } else {
        Check::fail(
            "kernel",
            Reason::Kernel,
            format!("Linux {release} lacks {}", missing.join(", ")),
            "redirector runs on Linux 5.10 or later with BPF cgroup and sk_lookup programs (docs/kernels.md); upgrade the node's kernel",
        )
    }];
    for feature in probed {
        let found = match (feature.present, feature.fallback) {
            (Some(true), _) => "present".to_owned(),
            (Some(false), Some(fallback)) => format!("missing: {fallback}"),
            (Some(false), None) => "missing".to_owned(),
            (None, _) => format!(
                "the probe could not tell ({})",
                feature.error.as_deref().unwrap_or("no answer")
            ),
        };
        let outcome = if feature.required && feature.present == Some(false) && !allowed {
            Outcome::Fail
        } else {
            Outcome::Note
        };
        checks.push(Check {
            outcome,
            ..Check::note(
                "kernel feature",
                format!("{} (Linux {}): {found}", feature.feature, feature.since),
            )
        });
    }
    checks
}

/// The node cgroup: the one given, which must exist, or the kubepods cgroup found, else
/// the cgroup2 mount's root.
fn kubepods_check(given: Option<&Path>, mount: Option<&Path>) -> (Check, Option<PathBuf>) {
    const NAME: &str = "kubepods cgroup";
    if let Some(path) = given {
        if !fs_kind::is_cgroup2_dir(path) {
            let found = if path.exists() {
                format!("--cgroup {}: not a cgroup v2 directory", path.display())
            } else {
                format!("--cgroup {}: no such directory", path.display())
            };
            let fix = "leave --cgroup (REDIRECTOR_CGROUP) unset: the kubepods cgroup is found under the cgroup2 mount (kubepods.slice with kubelet's systemd cgroup driver, kubepods with cgroupfs)";
            return (Check::fail(NAME, Reason::KubepodsCgroup, found, fix), None);
        }
        let driver = kubepods::driver_of(path).map_or(String::new(), |d| format!(" ({d} driver)"));
        return (
            Check::pass(NAME, format!("{}{driver}, given", path.display())),
            Some(path.to_path_buf()),
        );
    }
    let Some(mount) = mount else {
        return (Check::note(NAME, "no cgroup2 mount to look under"), None);
    };
    match kubepods::find(mount) {
        Some((path, driver)) => (
            Check::pass(NAME, format!("{} ({driver} driver)", path.display())),
            Some(path),
        ),
        None => (
            Check::note(
                NAME,
                format!("none under {}: the cgroup2 root is the node cgroup", mount.display()),
            )
            .with_fix("on a Kubernetes node kubelet makes kubepods.slice (systemd driver) or kubepods (cgroupfs): pass --cgroup if it is elsewhere"),
            Some(mount.to_path_buf()),
        ),
    }
}

fn bpffs_check(pin_root: &Path) -> Check {
    const NAME: &str = "bpffs";
    match fs_kind::nearest_is_bpffs(pin_root) {
        Some(true) => Check::pass(NAME, format!("{} is on bpffs", pin_root.display())),
        found => Check::fail(
            NAME,
            Reason::Bpffs,
            match found {
                Some(_) => format!("{} is not on a bpffs mount", pin_root.display()),
                None => format!("{}: no existing ancestor", pin_root.display()),
            },
            "mount bpffs (`mount -t bpf bpf /sys/fs/bpf`; in the DaemonSet, the host's /sys/fs/bpf as a hostPath volume)",
        ),
    }
}

fn memlock_note() -> Check {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit we own.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0;
    let shown = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            "unlimited".to_owned()
        } else {
            format!("{} KiB", v / 1024)
        }
    };
    let found = if read {
        format!(
            "RLIMIT_MEMLOCK {} (hard {}): counts only without BPF memory charged to memcg (before 5.11), where the loader raises it",
            shown(limit.rlim_cur),
            shown(limit.rlim_max)
        )
    } else {
        format!(
            "RLIMIT_MEMLOCK unreadable: {}",
            std::io::Error::last_os_error()
        )
    };
    Check::note("memlock", found)
}

fn cni_conf_check(dir: &Path) -> Check {
    const NAME: &str = "CNI configuration";
    if !dir.is_dir() {
        return Check::fail(
            NAME,
            Reason::CniConfDir,
            format!("{}: no such directory", dir.display()),
            "mount the runtime's CNI conf_dir (/etc/cni/net.d) and name it with REDIRECTOR_CNI_CONF_DIR",
        );
    }
    let found = match install_cni::runtime_file(dir) {
        Ok(Some(file)) => {
            let chained = install_cni::chained_entry(dir).is_ok_and(|e| e.is_some());
            format!(
                "{}: the runtime loads {file} ({})",
                dir.display(),
                if chained {
                    "redirector-cni chained"
                } else {
                    "redirector-cni not chained"
                }
            )
        }
        Ok(None) => format!(
            "{}: no configuration file yet (install-cni chains into the cluster network's once it is written)",
            dir.display()
        ),
        Err(err) => format!("{}: {err}", dir.display()),
    };
    Check::pass(NAME, found)
}

fn runtime_note(socket: &Path) -> Check {
    const NAME: &str = "container runtime";
    match crate::cri::runtime_version(socket) {
        Ok((name, version)) => {
            let status = report::calls_cni_status(&name, &version);
            Check::note(NAME, format!("{name} {version} at {}: {status}", socket.display()))
        }
        Err(err) => Check::note(NAME, format!("{err:#}"))
            .with_fix("the daemon's repair of pods started before the plugin asks the runtime's CRI socket: mount it and pass --cri-socket"),
    }
}

/// Other programs at the hooks redirector uses, on the node cgroup's path.
fn neighbours_note(cgroup: &Path, pin_root: &Path) -> Check {
    const NAME: &str = "neighbours";
    let ours = crate::engine::node::node_object(&crate::store::PinRoot::new(pin_root))
        .ok()
        .flatten()
        .map(|object| crate::engine::neighbours::object_program_ids(&object))
        .unwrap_or_default();
    let foreign = crate::engine::neighbours::foreign_on_path(cgroup, &ours);
    if foreign.is_empty() {
        return Check::note(
            NAME,
            format!(
                "no other program at redirector's hooks on {}",
                cgroup.display()
            ),
        );
    }
    let listed: Vec<String> = foreign.iter().map(ToString::to_string).collect();
    let note = Check::note(NAME, listed.join("; "));
    if foreign.iter().any(|f| !f.multi) {
        note.with_fix("an exclusive program (attached without BPF_F_ALLOW_MULTI) at the node cgroup or above blocks redirector's attachments below it: attach it with BPF_F_ALLOW_MULTI")
    } else {
        note
    }
}

/// The meshes' settings the manifests assume.
fn mesh_notes() -> [Check; 2] {
    [
        Check::note(
            "istio",
            "assumed: istio's CNI mode on (the istiod chart's pilot.cni.enabled=true; values.istio_cni.enabled=true with istioctl's operator), so that the injector adds no istio-init and adds istio-validation, which stops a pod that is not captured",
        ),
        Check::note(
            "linkerd",
            "assumed (--dialect linkerd): Linkerd installed with cniEnabled=true and no linkerd-cni DaemonSet, so that the injector adds no linkerd-init and adds the network validator",
        ),
    ]
}

pub use report::render_text;
