//! The node options the daemon runs with, declared once: `install-cni` and `check` take
//! them too, so that all three judge the same node.

use std::path::PathBuf;

use crate::{cri::CONTAINERD_SOCKET, node_check::NodeOptions};

#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// The node cgroup: pods' cgroups are found below it, and a pod whose own cgroup is not
    /// found relies on the programs attached there [default: the kubepods cgroup under the
    /// cgroup2 mount — kubepods.slice (systemd driver) or kubepods (cgroupfs) — else the
    /// cgroup2 root].
    #[arg(long, value_name = "PATH", env = "REDIRECTOR_CGROUP")]
    pub cgroup: Option<PathBuf>,
}

/// Where the container runtime keeps what the node's parts read: the CNI configuration
/// and the CRI socket.
#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// The runtime's CNI configuration directory, holding the plugin's entry: repair reads
    /// its rules there, `daemon --uninstall` takes it out.
    #[arg(
        long,
        value_name = "DIR",
        env = "REDIRECTOR_CNI_CONF_DIR",
        default_value = crate::install_cni::DEFAULT_CONF_DIR
    )]
    pub cni_conf_dir: PathBuf,
    /// The runtime's CRI socket: the daemon finds pods started before the plugin (or while
    /// its entry was missing) there; `check` asks its name and version [default:
    /// containerd's, when it exists].
    #[arg(long, value_name = "PATH", env = "REDIRECTOR_CRI_SOCKET")]
    pub cri_socket: Option<PathBuf>,
}

impl RuntimeArgs {
    /// `--cri-socket`, or containerd's where it exists.
    pub fn cri_socket(&self) -> Option<PathBuf> {
        self.cri_socket.clone().or_else(|| {
            let containerd = PathBuf::from(CONTAINERD_SOCKET);
            containerd.exists().then_some(containerd)
        })
    }
}

impl NodeArgs {
    /// The options the node is judged with, for `pin_root` and the CNI directory.
    pub fn options(&self, pin_root: PathBuf, cni_conf_dir: Option<PathBuf>) -> NodeOptions {
        NodeOptions {
            cgroup: self.cgroup.clone(),
            pin_root,
            cni_conf_dir,
            cri_socket: None,
        }
    }
}
