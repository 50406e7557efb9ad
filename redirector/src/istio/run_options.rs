//! How to run: what to do with the capture settings, and where.

use std::{path::PathBuf, time::Duration};

/// The settings that do not change what is captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// `-n`: print, change nothing.
    pub dry_run: bool,
    /// `--cleanup-only`: remove everything redirector installed.
    pub cleanup_only: bool,
    /// `--reconcile`: repair drifted state instead of failing.
    pub reconcile: bool,
    /// `--force-apply`: apply even if the state looks in place.
    pub force_apply: bool,
    /// `--skip-rule-apply`: only validate (separate validation init container).
    pub skip_rule_apply: bool,
    /// `--run-validation`
    pub run_validation: bool,
    /// `--iptables-probe-port`: where validation probes connect.
    pub probe_port: u16,
    /// `--probe-timeout`: when validation gives up.
    pub probe_timeout: Duration,
    /// `--network-namespace`: the pod netns to work in; `None` = the current one.
    pub network_namespace: Option<PathBuf>,
    /// `--allow-host-netns`: accept the host's namespace as the pod's.
    pub allow_host_netns: bool,
    /// `--cni-mode`
    pub cni_mode: bool,
    /// `--cgroup`: the pod's cgroup v2 directory; `None` = the parent of our own cgroup.
    pub cgroup: Option<PathBuf>,
    /// `--resolv-conf`: where the pod's DNS servers are read for `--redirect-dns`.
    pub resolv_conf: PathBuf,
    /// `--pin-root` / `REDIRECTOR_PIN_ROOT`: bpffs directory for our pins.
    pub pin_root: PathBuf,
    /// `--log_as_json`
    pub log_as_json: bool,
    /// `--log_output_level`, istio's `scope:level` list.
    pub log_output_level: String,
    /// iptables-only flags that were given and are ignored, e.g. `["--native-nftables"]`, so
    /// the caller can log a note.
    pub ignored_flags: Vec<&'static str>,
}
