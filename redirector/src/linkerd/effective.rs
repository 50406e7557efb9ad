//! The effective configuration as the command logs it: one `flag=value` line per proxy-init
//! flag, in proxy-init's vocabulary, then redirector's own settings.

use std::{
    fmt::{self, Display},
    path::Path,
};

use super::LinkerdConfig;
use crate::engine::spec::PortSelection;

impl LinkerdConfig {
    pub fn effective_lines(&self) -> Vec<String> {
        let c = &self.capture;
        let r = &self.run;
        let p = &self.proxy_init;
        let path = |p: Option<&Path>| p.map(|p| p.display().to_string()).unwrap_or_default();
        let ports_to_redirect = match &c.inbound_ports {
            PortSelection::List(ports) => joined(ports),
            // Every port (an empty `-r`); `None` is never made by this dialect.
            PortSelection::All | PortSelection::None => String::new(),
        };
        vec![
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
            format!("fail-open={}", c.fail_open),
            format!("cgroup={}", path(r.cgroup.as_deref())),
            format!("pin-root={}", r.pin_root.display()),
        ]
    }
}

/// [`LinkerdConfig::effective_lines`], one per line.
impl Display for LinkerdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in self.effective_lines() {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

fn joined<T: Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
