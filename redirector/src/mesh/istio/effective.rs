//! The effective configuration as istio-iptables logs it: one `KEY=value` line per setting,
//! same keys, same order, so logs of both tools can be compared line by line.

use std::{fmt::Display, net::IpAddr};

use super::{CidrSelection, IstioConfig, OwnerGroups, PortSelection};
use crate::mesh::common::effective::{joined, optional_path as path, own_settings};

impl IstioConfig {
    /// The lines before anything is known about the pod: `ENABLE_INBOUND_IPV6=false`,
    /// `DNS_SERVERS=[],[]`.
    pub fn effective_lines(&self) -> Vec<String> {
        self.effective_lines_with(false, &[])
    }

    /// istio's `Config.Print` lines, then redirector's own settings. `ipv6` and `dns_servers`
    /// (resolv.conf's, read only with `--redirect-dns` and without `--capture-all-dns`) are
    /// what istio-iptables learns from the pod rather than from its flags.
    pub fn effective_lines_with(&self, ipv6: bool, dns_servers: &[IpAddr]) -> Vec<String> {
        let c = &self.capture;
        let r = &self.run;
        let i = &self.own;
        let (groups_include, groups_exclude) = match &c.owner_groups {
            OwnerGroups::All => ("*".to_owned(), String::new()),
            OwnerGroups::Include(gids) => (joined(gids), String::new()),
            OwnerGroups::Exclude(gids) => ("*".to_owned(), joined(gids)),
        };
        let inbound_ports = match &c.inbound_ports {
            PortSelection::None => String::new(),
            PortSelection::All => "*".to_owned(),
            PortSelection::List(ports) => joined(ports),
        };
        let outbound_cidrs = match &c.outbound_cidrs {
            CidrSelection::None => String::new(),
            CidrSelection::All => "*".to_owned(),
            CidrSelection::List(nets) => joined(nets),
        };
        let (dns_v4, dns_v6): (Vec<IpAddr>, Vec<IpAddr>) =
            dns_servers.iter().partition(|ip| ip.is_ipv4());
        [
            format!("PROXY_PORT={}", c.outbound_port),
            format!("PROXY_INBOUND_CAPTURE_PORT={}", c.inbound_port),
            format!("PROXY_TUNNEL_PORT={}", c.tunnel_port),
            format!("PROXY_UID={}", joined(&c.proxy_uids)),
            format!("PROXY_GID={}", joined(&c.proxy_gids)),
            format!("INBOUND_INTERCEPTION_MODE={}", c.inbound_mode),
            format!("INBOUND_TPROXY_MARK={}", c.tproxy_mark),
            format!("INBOUND_TPROXY_ROUTE_TABLE={}", c.tproxy_route_table),
            format!("INBOUND_PORTS_INCLUDE={inbound_ports}"),
            format!("INBOUND_PORTS_EXCLUDE={}", joined(&c.inbound_exclude_ports)),
            format!("OUTBOUND_OWNER_GROUPS_INCLUDE={groups_include}"),
            format!("OUTBOUND_OWNER_GROUPS_EXCLUDE={groups_exclude}"),
            format!("OUTBOUND_IP_RANGES_INCLUDE={outbound_cidrs}"),
            format!("OUTBOUND_IP_RANGES_EXCLUDE={}", joined(&c.exclude_cidrs)),
            format!(
                "OUTBOUND_PORTS_INCLUDE={}",
                joined(&c.outbound_include_ports)
            ),
            format!(
                "OUTBOUND_PORTS_EXCLUDE={}",
                joined(&c.outbound_exclude_ports)
            ),
            format!("KUBE_VIRT_INTERFACES={}", joined(&c.kube_virt_interfaces)),
            format!("ENABLE_INBOUND_IPV6={ipv6}"),
            format!("DUAL_STACK={}", c.dual_stack),
            format!("DNS_CAPTURE={}", c.redirect_dns),
            format!("DROP_INVALID={}", c.drop_invalid),
            format!("CAPTURE_ALL_DNS={}", c.capture_all_dns),
            format!("DNS_SERVERS={},{}", go_slice(&dns_v4), go_slice(&dns_v6)),
            format!("NETWORK_NAMESPACE={}", path(r.network_namespace.as_deref())),
            format!("CNI_MODE={}", i.cni_mode),
            format!("EXCLUDE_INTERFACES={}", joined(&c.exclude_interfaces)),
            format!("RECONCILE={}", r.reconcile),
            format!("CLEANUP_ONLY={}", r.cleanup_only),
            format!("FORCE_APPLY={}", r.force_apply),
            // Not printed by istio, but part of what is enforced.
            format!("HOST_IPV4_LOOPBACK_CIDR={}", c.loopback_v4_cidr),
        ]
        .into_iter()
        .chain(own_settings(c, r).map(|(name, value)| {
            let env_name = name.to_ascii_uppercase().replace('-', "_");
            format!("REDIRECTOR_{env_name}={value}")
        }))
        .collect()
    }
}

/// Go's `%s` of a slice: `[a b]`.
fn go_slice<T: Display>(items: &[T]) -> String {
    format!(
        "[{}]",
        items
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    )
}
