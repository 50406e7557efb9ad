//! The istio-iptables command line, with redirector's own flags.
//!
//! Values are kept as the raw text given: `IstioConfig::from_args` validates them together with
//! their env-var fallbacks, so a bad value reads the same whichever way it came in. The
//! syntax is Go's pflag's ([`pflag_syntax`]).

use std::path::PathBuf;

use clap::{Args, Command};

use crate::mesh::common::{path_parser, pflag::pflag_syntax, RedirectorFlags};

/// Every flag of istio-iptables (short and long names as istio spells them) plus
/// redirector's `--resolv-conf` and its own flags ([`RedirectorFlags`]).
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
#[command(about = ABOUT, long_about = None)]
pub struct IstioIptablesArgs {
    /// Port to which all outbound TCP traffic is redirected [default: 15001]
    #[arg(short = 'p', long = "envoy-port", value_name = "PORT")]
    pub envoy_port: Option<String>,

    /// Port to which all inbound TCP traffic is redirected [default: 15006]
    #[arg(short = 'z', long = "inbound-capture-port", value_name = "PORT")]
    pub inbound_capture_port: Option<String>,

    /// HBONE tunnel port, never captured [default: 15008]
    #[arg(short = 'e', long = "inbound-tunnel-port", value_name = "PORT")]
    pub inbound_tunnel_port: Option<String>,

    /// Comma list of uids whose traffic is never captured [default: uid of $ENVOY_USER, else 1337]
    #[arg(short = 'u', long = "proxy-uid", value_name = "UIDS")]
    pub proxy_uid: Option<String>,

    /// Comma list of gids whose traffic is never captured [default: same as -u]
    #[arg(short = 'g', long = "proxy-gid", value_name = "GIDS")]
    pub proxy_gid: Option<String>,

    /// How inbound connections reach the proxy: REDIRECT or TPROXY [default: REDIRECT]
    #[arg(
        short = 'm',
        long = "istio-inbound-interception-mode",
        value_name = "MODE"
    )]
    pub inbound_interception_mode: Option<String>,

    /// Inbound ports to capture: "*" for all, a comma list, or empty for none
    #[arg(short = 'b', long = "istio-inbound-ports", value_name = "PORTS")]
    pub inbound_ports: Option<String>,

    /// Inbound ports never captured (with -b '*')
    #[arg(short = 'd', long = "istio-local-exclude-ports", value_name = "PORTS")]
    pub local_exclude_ports: Option<String>,

    /// Interfaces whose traffic is never captured
    #[arg(short = 'c', long = "istio-exclude-interfaces", value_name = "IFACES")]
    pub exclude_interfaces: Option<String>,

    /// Outbound destinations to capture: "*" for all, a CIDR list, or empty for none
    #[arg(short = 'i', long = "istio-service-cidr", value_name = "CIDRS")]
    pub service_cidr: Option<String>,

    /// Outbound destinations never captured
    #[arg(short = 'x', long = "istio-service-exclude-cidr", value_name = "CIDRS")]
    pub service_exclude_cidr: Option<String>,

    /// Outbound ports always captured
    #[arg(short = 'q', long = "istio-outbound-ports", value_name = "PORTS")]
    pub outbound_ports: Option<String>,

    /// Outbound ports never captured
    #[arg(
        short = 'o',
        long = "istio-local-outbound-ports-exclude",
        value_name = "PORTS"
    )]
    pub local_outbound_ports_exclude: Option<String>,

    /// Interfaces whose inbound traffic is treated as outbound
    #[arg(short = 'k', long = "kube-virt-interfaces", value_name = "IFACES")]
    pub kube_virt_interfaces: Option<String>,

    /// TPROXY mark [default: 1337]
    #[arg(short = 't', long = "istio-inbound-tproxy-mark", value_name = "MARK")]
    pub inbound_tproxy_mark: Option<String>,

    /// TPROXY route table [default: 133]
    #[arg(
        short = 'r',
        long = "istio-inbound-tproxy-route-table",
        value_name = "TABLE"
    )]
    pub inbound_tproxy_route_table: Option<String>,

    /// Print what would be done, change nothing
    #[arg(short = 'n', long = "dry-run", value_name = "BOOL")]
    pub dry_run: Option<String>,

    /// Port the validation probe connects to [default: 15002]
    #[arg(long = "iptables-probe-port", value_name = "PORT")]
    pub iptables_probe_port: Option<String>,

    /// How long validation waits, as a Go duration [default: 5s]
    #[arg(long = "probe-timeout", value_name = "DURATION")]
    pub probe_timeout: Option<String>,

    /// Do not install anything (validation-only runs)
    #[arg(long = "skip-rule-apply", value_name = "BOOL")]
    pub skip_rule_apply: Option<String>,

    /// Check that capture works; exit 126 if it does not
    #[arg(long = "run-validation", value_name = "BOOL")]
    pub run_validation: Option<String>,

    /// Capture DNS (port 53) to the agent on 15053
    #[arg(long = "redirect-dns", value_name = "BOOL")]
    pub redirect_dns: Option<String>,

    /// With --redirect-dns, capture port 53 to every server, not only resolv.conf's
    #[arg(long = "capture-all-dns", value_name = "BOOL")]
    pub capture_all_dns: Option<String>,

    /// Drop packets conntrack considers invalid
    #[arg(long = "drop-invalid", value_name = "BOOL")]
    pub drop_invalid: Option<String>,

    /// Capture IPv4 and IPv6
    #[arg(long = "dual-stack", value_name = "BOOL")]
    pub dual_stack: Option<String>,

    /// Network namespace to work in
    #[arg(long = "network-namespace", value_name = "PATH", value_parser = path_parser())]
    pub network_namespace: Option<PathBuf>,

    /// Run as part of the CNI plugin
    #[arg(long = "cni-mode", value_name = "BOOL")]
    pub cni_mode: Option<String>,

    /// Repair existing state instead of failing when it differs
    #[arg(long = "reconcile", value_name = "BOOL")]
    pub reconcile: Option<String>,

    /// Apply even when the state already looks in place
    #[arg(long = "force-apply", value_name = "BOOL")]
    pub force_apply: Option<String>,

    /// iptables only; accepted and ignored
    #[arg(long = "native-nftables", value_name = "BOOL")]
    pub native_nftables: Option<String>,

    /// iptables only; accepted and ignored
    #[arg(long = "force-iptables-binary", value_name = "BINARY")]
    pub force_iptables_binary: Option<String>,

    /// Log levels per scope, e.g. "default:info"
    #[arg(long = "log_output_level", value_name = "LEVELS")]
    pub log_output_level: Option<String>,

    /// Log as JSON
    #[arg(long = "log_as_json", value_name = "BOOL")]
    pub log_as_json: Option<String>,

    /// resolv.conf whose nameservers --redirect-dns captures [default: /etc/resolv.conf]
    #[arg(long = "resolv-conf", value_name = "PATH", value_parser = path_parser())]
    pub resolv_conf: Option<PathBuf>,

    #[command(flatten)]
    pub own: RedirectorFlags,
}

const ABOUT: &str = "Capture a pod's traffic for its sidecar proxy (istio-iptables compatible)";

/// The `istio-iptables` command: every flag of [`IstioIptablesArgs`] and nothing else.
pub fn istio_iptables_command() -> Command {
    pflag_syntax(IstioIptablesArgs::augment_args(Command::new(
        "istio-iptables",
    )))
}
