//! The linkerd2-proxy-init command line, with redirector's own flags.
//!
//! Values are kept as the raw text given: [`LinkerdConfig::from_args`](super::LinkerdConfig)
//! validates them, so that an error names the flag and the value. As Go's pflag does, boolean
//! flags take an optional `=VALUE` (`--ipv6=false`), other flags take the next word as their
//! value even if it starts with `-` (`-p -1`), a single-valued flag given twice keeps the last
//! value, and a list flag given twice appends.

use std::path::PathBuf;

use clap::{ArgAction, Args, Command};

use crate::mesh::common::{path_parser, pflag::pflag_syntax, RedirectorFlags};

/// Every flag of proxy-init (short and long names as it spells them) plus redirector's own
/// ([`RedirectorFlags`]).
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
#[command(about = ABOUT, long_about = None)]
pub struct ProxyInitArgs {
    /// Port to redirect incoming traffic to (0-65535; required) [default: -1]
    #[arg(short = 'p', long = "incoming-proxy-port", value_name = "PORT")]
    pub incoming_proxy_port: Option<String>,

    /// Port to redirect outgoing traffic to (0-65535; required) [default: -1]
    #[arg(short = 'o', long = "outgoing-proxy-port", value_name = "PORT")]
    pub outgoing_proxy_port: Option<String>,

    /// User ID the proxy runs as: its traffic is never redirected (only if > 0) [default: -1]
    #[arg(short = 'u', long = "proxy-uid", value_name = "UID")]
    pub proxy_uid: Option<String>,

    /// Group ID the proxy runs as: its traffic is never redirected (only if > 0) [default: -1]
    #[arg(short = 'g', long = "proxy-gid", value_name = "GID")]
    pub proxy_gid: Option<String>,

    /// Inbound ports to redirect to the proxy (comma list); none given: every port
    #[arg(
        short = 'r',
        long = "ports-to-redirect",
        value_name = "PORTS",
        action = ArgAction::Append
    )]
    pub ports_to_redirect: Vec<String>,

    /// Inbound ports and inclusive port ranges (`lo-hi`) never redirected (comma list)
    #[arg(
        long = "inbound-ports-to-ignore",
        value_name = "PORTS",
        action = ArgAction::Append
    )]
    pub inbound_ports_to_ignore: Vec<String>,

    /// Outbound ports and inclusive port ranges (`lo-hi`) never redirected (comma list)
    #[arg(
        long = "outbound-ports-to-ignore",
        value_name = "PORTS",
        action = ArgAction::Append
    )]
    pub outbound_ports_to_ignore: Vec<String>,

    /// Inbound connections from these source CIDRs are never redirected (comma list)
    #[arg(
        long = "subnets-to-ignore",
        value_name = "CIDRS",
        action = ArgAction::Append
    )]
    pub subnets_to_ignore: Vec<String>,

    /// Print what would be done, change nothing
    #[arg(long = "simulate", visible_alias = "dry-run", value_name = "BOOL")]
    pub simulate: Option<String>,

    /// Network namespace to work in [default: the current one]
    #[arg(long = "netns", value_name = "PATH", value_parser = path_parser())]
    pub netns: Option<PathBuf>,

    /// Capture IPv6 the same way as IPv4; false leaves IPv6 uncaptured both ways [default: true]
    #[arg(long = "ipv6", value_name = "BOOL")]
    pub ipv6: Option<String>,

    /// Sets the pod's conntrack close-wait timeout (net.netfilter.nf_conntrack_tcp_timeout_close_wait) [default: 0, unchanged]
    #[arg(long = "timeout-close-wait-secs", value_name = "SECS")]
    pub timeout_close_wait_secs: Option<String>,

    /// Log level: panic, fatal, error, warn, info, debug or trace [default: info]
    #[arg(long = "log-level", value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// Log format: plain or json [default: plain]
    #[arg(long = "log-format", value_name = "FORMAT")]
    pub log_format: Option<String>,

    /// iptables only; accepted and ignored
    #[arg(short = 'w', long = "use-wait-flag", value_name = "BOOL")]
    pub use_wait_flag: Option<String>,

    /// iptables only (legacy, nft or plain); accepted and ignored
    #[arg(long = "iptables-mode", value_name = "MODE")]
    pub iptables_mode: Option<String>,

    /// iptables only (iptables-legacy, iptables-nft or iptables); accepted and ignored
    #[arg(long = "firewall-bin-path", value_name = "BINARY")]
    pub firewall_bin_path: Option<String>,

    /// iptables only (iptables-legacy-save, iptables-nft-save or iptables-save); accepted and ignored
    #[arg(long = "firewall-save-bin-path", value_name = "BINARY")]
    pub firewall_save_bin_path: Option<String>,

    #[command(flatten)]
    pub own: RedirectorFlags,

    /// Words that are no flag's value: proxy-init (cobra) accepts and ignores them, so
    /// `--ipv6 false` means `--ipv6` and a stray `false`. Logged, never an error.
    #[arg(value_name = "IGNORED", hide = true)]
    pub stray_args: Vec<String>,
}

const ABOUT: &str =
    "Capture a pod's traffic for its Linkerd proxy (linkerd2-proxy-init compatible)";

/// The `linkerd-proxy-init` command: every flag of [`ProxyInitArgs`] and nothing else. A
/// single-valued flag given twice keeps its last value, as pflag does.
pub fn proxy_init_command() -> Command {
    pflag_syntax(ProxyInitArgs::augment_args(Command::new(
        "linkerd-proxy-init",
    )))
    .args_override_self(true)
}
