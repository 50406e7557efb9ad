//! `redirector daemon`: flags and env, then the daemon.

use std::path::PathBuf;

use crate::{
    api::DEFAULT_SOCKET,
    daemon::{
        self,
        repair::{RepairConfig, RepairMode},
        DaemonConfig,
    },
    node_check::{assess, Reason, Unservable},
    pods::records::{Records, DEFAULT_STATE_DIR},
};

/// Repair, unless it is off or no runtime socket is given or found.
fn repair_config(args: &DaemonArgs) -> Option<RepairConfig> {
    if args.repair == RepairMode::Off {
        return None;
    }
    let Some(cri_socket) = args.runtime.cri_socket() else {
        tracing::info!(
            "repair off: no --cri-socket, and no {}",
            crate::cri::CONTAINERD_SOCKET
        );
        return None;
    };
    Some(RepairConfig {
        mode: args.repair,
        cri_socket,
        interval: std::time::Duration::from_secs(args.repair_interval),
        cni_conf_dir: args.runtime.cni_conf_dir.clone(),
    })
}

#[derive(clap::Args, Debug)]
pub struct DaemonArgs {
    #[command(flatten)]
    pin_root: super::pin_root::PinRootArg,
    /// The API's unix socket (mode 0600).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    #[command(flatten)]
    node: super::node_args::NodeArgs,
    /// Where the daemon keeps its pod records (names, flags); a tmpfs, like bpffs.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Serve /metrics, /healthz and /readyz here (e.g. 127.0.0.1:15014; port 0 picks one).
    /// What the metrics show is the node's: keep them on loopback or the node's address.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Serve /healthz and /readyz alone here (e.g. 0.0.0.0:15015): kubelet probes a
    /// host-network pod at the node's address while the metrics stay on loopback.
    #[arg(long, value_name = "HOST:PORT")]
    health_addr: Option<std::net::SocketAddr>,
    /// Export decisions by pod (namespace/name, netns cookie, reason), not only the node's
    /// totals by reason.
    #[arg(long)]
    metrics_per_pod: bool,
    /// Every this many seconds, remove pods whose network namespace is gone (a missed CNI
    /// DEL, a pod deleted without `pod del`); 0: only at start.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    gc_interval: u64,
    /// Remove everything instead: first the CNI plugin's entry from the network
    /// configuration (an entry whose programs are gone would fail every meshed pod's
    /// start), then every pod's capture, the node links, the records.
    #[arg(long)]
    uninstall: bool,
    #[command(flatten)]
    runtime: super::node_args::RuntimeArgs,
    /// What to do with a running pod the plugin's rules capture but nothing captured:
    /// capture it, only report it (log and metric), or not look.
    #[arg(long, value_enum, value_name = "MODE", default_value = "capture")]
    repair: RepairMode,
    /// The pods the node's maps are sized for, at the object's load: the per-pod maps
    /// (pods' configuration and counters, listeners, ports, addresses, CIDRs) get
    /// capacities in proportion to the shipped 4096 pods'. A node already loaded with
    /// another size is moved to this one at start, pods and all (refused if it holds more
    /// pods than this).
    #[arg(
        long,
        value_name = "PODS",
        env = "REDIRECTOR_MAX_PODS",
        default_value_t = crate::store::PodCapacity::SHIPPED,
        value_parser = crate::store::sizing::parse_max_pods
    )]
    max_pods: crate::store::PodCapacity,
    /// Serve istio ambient's ztunnel as its node agent: listen here (a unix seqpacket
    /// socket; ztunnel's INPOD_UDS) and send it the node's ambient pods over ZDS.
    #[arg(long, value_name = "PATH", env = "REDIRECTOR_ZTUNNEL_SOCKET")]
    ztunnel_socket: Option<PathBuf>,
    /// Seconds between looks at the node's pods for repair (one is made at start).
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    repair_interval: u64,
}

pub fn run(args: &DaemonArgs) -> anyhow::Result<()> {
    let mut config = DaemonConfig {
        pin_root: args.pin_root.path.clone(),
        socket: args.socket.clone(),
        cgroup: PathBuf::new(),
        state_dir: args.state_dir.clone(),
        metrics_addr: args.metrics_addr,
        health_addr: args.health_addr,
        metrics_per_pod: args.metrics_per_pod,
        gc_interval: (args.gc_interval > 0)
            .then(|| std::time::Duration::from_secs(args.gc_interval)),
        repair: repair_config(args),
        max_pods: args.max_pods,
        ztunnel_socket: args.ztunnel_socket.clone(),
    };
    if args.uninstall {
        for change in crate::install_cni::unchain_all(&args.runtime.cni_conf_dir)? {
            tracing::info!("{change}");
        }
        return daemon::uninstall(&config);
    }
    // Decided once, at start: a node that cannot be served keeps this container up,
    // not ready, with nothing pinned (install-cni, judging the same node, chains nothing).
    // The CNI directory is install-cni's to judge: the daemon serves pods through its API
    // on a node with no CNI configuration at all.
    let options = args.node.options(config.pin_root.clone(), None);
    let report = assess(&options);
    let records = Records::new(&config.state_dir);
    match (report.verdict(), report.node_cgroup) {
        (Ok(()), Some(cgroup)) => {
            records.forget_unservable()?;
            config.cgroup = cgroup;
        }
        (verdict, _) => {
            let why = verdict.err().unwrap_or_else(|| Unservable {
                reason: Reason::Cgroup2,
                detail: "no node cgroup".to_owned(),
            });
            tracing::error!("{why}; nothing is pinned, and pods start as on a node without redirector (`redirector check` shows every requirement)");
            records.save_unservable(&why.to_string())?;
            return daemon::idle(&config, why);
        }
    }
    if crate::sys::fs_kind::nearest_is_tmpfs(&config.state_dir) == Some(false) {
        tracing::warn!(
            "--state-dir {} is not on a tmpfs: every new pod's record is an inode written to disk (1.7–2.4× the time of an add measured on ext4), and records outlive a reboot that the pins do not",
            config.state_dir.display()
        );
    }
    daemon::run(config)
}
