//! `redirector install-cni`: flags and env, then the installer.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;

use crate::{
    cni::DEFAULT_EXCLUDED_NAMESPACES,
    install_cni::{readiness::Readiness, watch, AmbientEntry, Entry, Installer},
    mesh::{ambient::select::check_network_args, pod_spec, Dialect, PodFlags},
    node_check::{assess, Unservable},
    store::pins::DEFAULT_ROOT,
};

/// How often the watch reads the directory with no event, in case one was missed.
const RECHECK: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug)]
pub struct InstallCniArgs {
    /// The node's CNI configuration directory (the container runtime's conf_dir).
    #[arg(
        long,
        value_name = "DIR",
        env = "REDIRECTOR_CNI_CONF_DIR",
        default_value = crate::install_cni::DEFAULT_CONF_DIR
    )]
    conf_dir: PathBuf,
    /// The node's CNI bin directory: the plugin is copied in as `redirector-cni`.
    #[arg(
        long,
        value_name = "DIR",
        env = "REDIRECTOR_CNI_BIN_DIR",
        default_value = crate::install_cni::DEFAULT_BIN_DIR
    )]
    bin_dir: PathBuf,
    /// Keep running: wait for the cluster network's configuration, and put the entry back
    /// whenever a rewrite drops it or another file starts to sort first.
    #[arg(long, env = "REDIRECTOR_CNI_WATCH", conflicts_with = "uninstall")]
    watch: bool,
    /// Take the entry out of every configuration file (a file made from a single plugin's
    /// `.conf` goes back to it) and remove the plugin binary.
    #[arg(long)]
    uninstall: bool,
    /// The binary installed as the plugin (default: this one).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// Which mesh the network's pods are meshed by: `istio` (its flags, annotations and
    /// injector's mark), `linkerd` (proxy-init's flags, Linkerd's annotations, pods
    /// carrying `linkerd.io/proxy-version`) or `ambient` (Istio ambient: pods labelled or
    /// annotated `istio.io/dataplane-mode=ambient` — labels are read from the CRI, where the
    /// runtime answers during a pod's set-up, which containerd does not — or of
    /// --ambient-namespaces, enrolled with ztunnel through the daemon, which needs
    /// --ztunnel-socket).
    #[arg(
        long,
        value_enum,
        env = "REDIRECTOR_CNI_DIALECT",
        default_value = "istio"
    )]
    dialect: Dialect,
    /// Capture only pods carrying istio's `sidecar.istio.io/status` (the injector's mark;
    /// istio only).
    #[arg(
        long,
        value_name = "BOOL",
        env = "REDIRECTOR_CNI_REQUIRE_SIDECAR_STATUS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    require_sidecar_status: bool,
    /// Namespaces whose pods are never captured, comma-separated ("" for none) [default:
    /// kube-system; with --dialect ambient kube-system,istio-system, where ztunnel runs].
    #[arg(long, value_name = "NS,...", env = "REDIRECTOR_CNI_EXCLUDE_NAMESPACES")]
    exclude_namespaces: Option<String>,
    /// With --dialect ambient: namespaces every pod of which is enrolled, comma-separated
    /// (istio's namespace label `istio.io/dataplane-mode=ambient`, which a node plugin
    /// cannot read without the API server).
    #[arg(
        long,
        value_name = "NS,...",
        env = "REDIRECTOR_CNI_AMBIENT_NAMESPACES",
        default_value = ""
    )]
    ambient_namespaces: String,
    /// With --dialect ambient: the runtime's CRI socket, where the plugin reads a pod's
    /// labels [default: containerd's].
    #[arg(long, value_name = "PATH", env = "REDIRECTOR_CRI_SOCKET")]
    cri_socket: Option<PathBuf>,
    /// With --dialect ambient: the daemon's API socket the plugin enrolls pods through,
    /// when not the default.
    #[arg(long, value_name = "PATH", env = "REDIRECTOR_SOCKET")]
    daemon_socket: Option<PathBuf>,
    /// The pin root the plugin (and the daemon) uses, when not the default.
    #[arg(long, value_name = "DIR", env = "REDIRECTOR_PIN_ROOT")]
    pin_root: Option<PathBuf>,
    /// The daemon's node options, by which this node is judged as the daemon judges it:
    /// where it cannot be served, nothing is chained.
    #[command(flatten)]
    node: super::node_args::NodeArgs,
    /// Serve /readyz (ready once the node is judged servable and the entry goes in) and
    /// /healthz here, e.g. 0.0.0.0:15016.
    #[arg(long, value_name = "HOST:PORT")]
    health_addr: Option<std::net::SocketAddr>,
    /// The daemon's state directory the plugin uses, when not the default.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The flags for the network's pods, in the dialect (default: istio's standard
    /// injection, or Linkerd's injector defaults); pods override them with their mesh's
    /// annotations.
    #[arg(last = true, value_name = "FLAGS", allow_hyphen_values = true)]
    flags: Vec<String>,
}

pub fn run(args: &InstallCniArgs) -> anyhow::Result<()> {
    let flags = if args.flags.is_empty() {
        args.dialect.injector_defaults()
    } else {
        args.flags.clone()
    };
    match args.dialect {
        // An ambient pod's flags begin with who it is, which only its ADD says.
        Dialect::Ambient => check_network_args(&flags),
        dialect => pod_spec(&PodFlags {
            dialect,
            args: flags.clone(),
        })
        .map(drop),
    }
    .map_err(|e| anyhow::anyhow!("the pods' flags: {e}"))?;
    let exclude_namespaces = match (&args.exclude_namespaces, args.dialect) {
        (Some(list), _) => list_of(list),
        (None, Dialect::Ambient) => list_of(AMBIENT_EXCLUDED_NAMESPACES),
        (None, _) => list_of(DEFAULT_EXCLUDED_NAMESPACES),
    };
    let plugin = match &args.plugin {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("finding this binary")?,
    };
    let installer = Installer {
        conf_dir: args.conf_dir.clone(),
        bin_dir: args.bin_dir.clone(),
        plugin,
        entry: Entry {
            dialect: args.dialect,
            args: flags,
            require_sidecar_status: args.require_sidecar_status,
            exclude_namespaces,
            pin_root: args.pin_root.clone(),
            state_dir: args.state_dir.clone(),
            ambient: (args.dialect == Dialect::Ambient).then(|| AmbientEntry {
                namespaces: list_of(&args.ambient_namespaces),
                cri_socket: args.cri_socket.clone(),
                daemon_socket: args.daemon_socket.clone(),
            }),
        }
        .to_json(),
    };
    if args.uninstall {
        for change in installer.unchain_all()? {
            tracing::info!("{change}");
        }
        if installer.remove_plugin()? {
            tracing::info!("removed {}", installer.plugin_path().display());
        }
        return Ok(());
    }
    let readiness = Readiness::serve(args.health_addr)
        .with_context(|| format!("serving readiness on {:?}", args.health_addr))?;
    let pin_root = args.pin_root.clone().unwrap_or_else(|| DEFAULT_ROOT.into());
    let report = assess(&args.node.options(pin_root, Some(args.conf_dir.clone())));
    if let Err(why) = report.verdict() {
        return unservable(&installer, why, args.watch, &readiness);
    }
    if args.watch {
        readiness.set(Ok(()));
        return Ok(watch(&installer, RECHECK, None)?);
    }
    installer.check()?;
    if installer.install_plugin()? {
        tracing::info!("installed {}", installer.plugin_path().display());
    }
    match installer.chain()? {
        Some(change) => tracing::info!("{change}"),
        None => tracing::info!("the entry is in place"),
    }
    Ok(())
}

/// The namespaces an ambient network leaves alone unless told otherwise: istio's system
/// namespace too, where ztunnel, istiod and the gateways run.
const AMBIENT_EXCLUDED_NAMESPACES: &str = "kube-system,istio-system";

/// A comma-separated list's items.
fn list_of(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|ns| !ns.is_empty())
        .map(String::from)
        .collect()
}

/// A node that cannot be served: no entry (one an earlier run left goes too, since no
/// pinned programs will ever back it). With `--watch`, the container stays up, not
/// ready, rather than be restarted again and again; a one-off install fails.
fn unservable(
    installer: &Installer,
    why: Unservable,
    watch: bool,
    readiness: &Readiness,
) -> anyhow::Result<()> {
    tracing::error!("{why}; the plugin is not chained, and pods start as on a node without redirector (`redirector check` shows every requirement)");
    for change in installer.unchain_all()? {
        tracing::info!("{change}");
    }
    if !watch {
        return Err(why).context("nothing chained");
    }
    readiness.set(Err(why.to_string()));
    loop {
        std::thread::park();
    }
}
