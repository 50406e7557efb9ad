//! A mesh command's configuration, and how to run a pod's set-up whatever mesh's command
//! line it came from.

use std::path::PathBuf;

use crate::engine::spec::CaptureConfig;

/// A mesh command's effective, validated configuration: what it captures, how it runs, and
/// `own`, the settings only that mesh's command has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshConfig<Own> {
    pub capture: CaptureConfig,
    pub run: RunOptions,
    pub own: Own,
}

/// The settings that do not change what is captured: each mesh's command fills them from
/// its own flags (`--dry-run`/`--simulate`, `--network-namespace`/`--netns`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// Print, change nothing.
    pub dry_run: bool,
    /// Remove everything redirector installed.
    pub cleanup_only: bool,
    /// A different earlier state is replaced as asked, not merely noted.
    pub reconcile: bool,
    /// Apply even if the state looks in place.
    pub force_apply: bool,
    /// Install nothing (istio's separate validation init container).
    pub skip_rule_apply: bool,
    /// The pod netns to work in; `None` = the current one.
    pub network_namespace: Option<PathBuf>,
    /// Accept the host's namespace as the pod's.
    pub allow_host_netns: bool,
    /// The pod's cgroup v2 directory; `None` = the parent of our own cgroup.
    pub cgroup: Option<PathBuf>,
    /// Where the pod's DNS servers are read for DNS capture.
    pub resolv_conf: PathBuf,
    /// `--pin-root` / `REDIRECTOR_PIN_ROOT`: bpffs directory for our pins.
    pub pin_root: PathBuf,
    /// iptables-only flags that were given and are ignored, e.g. `["--native-nftables"]`, so
    /// the caller can log a note.
    pub ignored_flags: Vec<&'static str>,
}
