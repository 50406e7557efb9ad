//! The effective configuration as the command logs it: one `flag=value` line per proxy-init
//! flag, in proxy-init's vocabulary, then redirector's own settings.

use super::LinkerdConfig;
use crate::{
    engine::spec::PortSelection,
    mesh::common::effective::{joined, optional_path as path, own_settings},
};

impl LinkerdConfig {
    pub fn effective_lines(&self) -> Vec<String> {
        let c = &self.capture;
        let r = &self.run;
        let p = &self.own;
        let ports_to_redirect = match &c.inbound_ports {
            PortSelection::List(ports) => joined(ports),
            // Every port (an empty `-r`); `None` is never made by this dialect.
            PortSelection::All | PortSelection::None => String::new(),
        };
        [
            format!("incoming-proxy-port={}", c.inbound_port),
            format!("outgoing-proxy-port={}", c.outbound_port),
            format!("proxy-uid={}", joined(&c.proxy_uids)),
            format!("proxy-gid={}", joined(&c.proxy_gids)),
            format!("ports-to-redirect={ports_to_redirect}"),
            format!(
                "inbound-ports-to-ignore={}",
                joined(&c.inbound_exclude_port_ranges)
            ),
            format!(
                "outbound-ports-to-ignore={}",
                joined(&c.outbound_exclude_port_ranges)
            ),
            format!("subnets-to-ignore={}", joined(&c.inbound_exclude_sources)),
            format!("ipv6={}", !c.ipv6_off),
            format!("simulate={}", r.dry_run),
            format!("netns={}", path(r.network_namespace.as_deref())),
            format!(
                "timeout-close-wait-secs={}",
                p.close_wait_timeout.map_or(0, |t| t.as_secs())
            ),
            format!("log-level={}", p.log_level),
            format!("log-format={}", p.log_format),
            format!("cleanup-only={}", r.cleanup_only),
        ]
        .into_iter()
        .chain(own_settings(c, r).map(|(name, value)| format!("{name}={value}")))
        .collect()
    }
}
