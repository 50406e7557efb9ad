//! A pod's capture spec: what to capture and where it goes. istio-iptables' flags are
//! one way to write it (`istio`); the engine knows only this.

use std::fmt;

use ipnet::{IpNet, Ipv4Net};

/// The effective capture settings of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    /// `-p`: where captured outbound connections go.
    pub outbound_port: u16,
    /// `-z`: where captured inbound connections go.
    pub inbound_port: u16,
    /// `-e`: the HBONE tunnel port, never captured.
    pub tunnel_port: u16,
    /// `-u`: owners whose traffic is never captured (the proxy).
    pub proxy_uids: Vec<u32>,
    /// `-g`: as `proxy_uids`, by group.
    pub proxy_gids: Vec<u32>,
    /// `-m`
    pub inbound_mode: InterceptionMode,
    /// `-b`
    pub inbound_ports: PortSelection,
    /// `-d`: only meaningful with `-b '*'`.
    pub inbound_exclude_ports: Vec<u16>,
    /// `-c`: interfaces whose traffic is never captured.
    pub exclude_interfaces: Vec<String>,
    /// `-i`
    pub outbound_cidrs: CidrSelection,
    /// `-x`
    pub exclude_cidrs: Vec<IpNet>,
    /// `-q`: outbound ports always captured.
    pub outbound_include_ports: Vec<u16>,
    /// `-o`: outbound ports never captured.
    pub outbound_exclude_ports: Vec<u16>,
    /// `-k`: inbound traffic from these interfaces is treated as outbound.
    pub kube_virt_interfaces: Vec<String>,
    /// `-t`
    pub tproxy_mark: u32,
    /// `-r`
    pub tproxy_route_table: u32,
    /// `ISTIO_OUTBOUND_OWNER_GROUPS` / `ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE`
    pub owner_groups: OwnerGroups,
    /// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`: destinations never captured.
    pub loopback_v4_cidr: Ipv4Net,
    /// `--redirect-dns` / `ISTIO_META_DNS_CAPTURE`
    pub redirect_dns: bool,
    /// `--capture-all-dns`: every port-53 destination, not only the resolv.conf servers.
    pub capture_all_dns: bool,
    /// `--drop-invalid` / `INVALID_DROP`
    pub drop_invalid: bool,
    /// `--dual-stack` / `ISTIO_DUAL_STACK`
    pub dual_stack: bool,
    /// `--fail-open`: let a connection through uncaptured if its state cannot be recorded.
    pub fail_open: bool,
}

/// How inbound connections reach the proxy (`-m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterceptionMode {
    Redirect,
    Tproxy,
}

impl fmt::Display for InterceptionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InterceptionMode::Redirect => "REDIRECT",
            InterceptionMode::Tproxy => "TPROXY",
        })
    }
}

/// Inbound ports to capture (`-b`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSelection {
    /// `-b ''`: no inbound capture at all.
    None,
    /// `-b '*'`: every port except `-d` and the tunnel port.
    All,
    List(Vec<u16>),
}

/// Outbound destinations to capture (`-i`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CidrSelection {
    /// `-i ''`: nothing is captured by destination (`-q` ports still are).
    None,
    /// `-i '*'`: every destination not excluded.
    All,
    List(Vec<IpNet>),
}

/// Whose outbound traffic is captured, by the socket owner's group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerGroups {
    /// Every group (`ISTIO_OUTBOUND_OWNER_GROUPS='*'`, no exclusions).
    All,
    /// Only these gids.
    Include(Vec<u32>),
    /// Every gid but these.
    Exclude(Vec<u32>),
}
