//! docs/linkerd.md#what-is-captured as code: where a connection of a pod captured by proxy-init
//! should land, written as the suite renders a landing (`outbound orig=svc4:80`, `app@pod4:8080`,
//! `refused`). The reference side of every case is checked against it row by row before anything is
//! compared with redirector, so a reference that drifted from Linkerd's contract (a fault of the
//! suite, not of redirector) is named as such.
//!
//! Outbound, first match wins: owner uid/gid (each only if > 0) → direct; a destination
//! reached through `lo` (127/8, ::1, the pod's own addresses) → direct, for every uid; an
//! ignored outbound port → direct; else the outgoing proxy port, which reads the
//! destination as `SO_ORIGINAL_DST`. Inbound: an ignored inbound port → direct; a source
//! in `--subnets-to-ignore` → direct; then every port (or only the `-r` ports) → the
//! incoming proxy port. A family proxy-init did not write rules for is never captured.
//!
//! A direct connection to a proxy listener still has an original destination under
//! iptables: conntrack tracks every connection of a namespace with nat rules, so the proxy
//! reads the address it was reached at (docs/linkerd.md#what-is-captured).

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::linkerd::proxy_init::{CaptureState, InboundMode};
use crate::scenario::{Dst, Host};
use crate::twin_pods::{APP, INBOUND_PROXY, OUTBOUND_PROXY, SERVICE};

/// The listeners of a case's pod and peer, by port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listeners {
    /// The app in the pod, on every address of both families.
    pub app_ports: BTreeSet<u16>,
    /// The peer ("svc"), on every address of both families (its own and the outside ones).
    pub service_ports: BTreeSet<u16>,
}

/// The expected landings for one capture state and set of listeners.
#[derive(Clone, Copy, Debug)]
pub struct Contract<'a> {
    pub state: &'a CaptureState,
    pub listeners: &'a Listeners,
}

impl Contract<'_> {
    /// A client in the pod, owned by `uid`/`gid`, connects to `dst`.
    pub fn outbound(&self, uid: u32, gid: u32, dst: Dst) -> String {
        let Some(opts) = self.state.of(dst.family) else {
            return self.direct(dst);
        };
        let ignored = opts
            .outbound_ports_to_ignore
            .iter()
            .any(|r| r.contains(dst.port));
        if opts.exempts(uid, gid) || dst.host.is_local() || ignored {
            self.direct(dst)
        } else {
            format!("{OUTBOUND_PROXY} orig={dst}")
        }
    }

    /// A client outside the pod, with source address `source`, connects to `dst` (one of
    /// the pod's addresses).
    pub fn inbound(&self, source: IpAddr, dst: Dst) -> String {
        let Some(opts) = self.state.of(dst.family) else {
            return self.direct(dst);
        };
        let port_ignored = opts
            .inbound_ports_to_ignore
            .iter()
            .any(|r| r.contains(dst.port));
        let source_ignored = opts.subnets_to_ignore.iter().any(|s| s.contains(source));
        let redirected = match &opts.inbound {
            InboundMode::RedirectAll => true,
            InboundMode::RedirectListed(ports) => ports.contains(&dst.port),
        };
        if port_ignored || source_ignored || !redirected {
            self.direct(dst)
        } else {
            format!("{INBOUND_PROXY} orig={dst}")
        }
    }

    /// What answers at `dst` itself.
    pub fn direct(&self, dst: Dst) -> String {
        if !dst.host.is_local() {
            return if self.listeners.service_ports.contains(&dst.port) {
                format!("{SERVICE}@{dst}")
            } else {
                "refused".to_owned()
            };
        }
        // The proxy listens only for the families proxy-init captures.
        if let Some(opts) = self.state.of(dst.family) {
            if dst.port == opts.incoming_proxy_port {
                return format!("{INBOUND_PROXY} orig={dst}");
            }
            if dst.port == opts.outgoing_proxy_port && dst.host == Host::Loopback {
                return format!("{OUTBOUND_PROXY} orig={dst}");
            }
        }
        if self.listeners.app_ports.contains(&dst.port) {
            format!("{APP}@{dst}")
        } else {
            "refused".to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linkerd::proxy_init::ProxyInitOptions;
    use crate::scenario::{Family, OUTSIDE_V4};

    fn state(args: &[&str]) -> CaptureState {
        CaptureState::after(&[ProxyInitOptions::parse(args).unwrap()])
    }

    #[test]
    fn the_contract_of_section_2() {
        let state = state(&crate::words(
            "-p 4143 -o 4140 -u 2102 --ipv6=false --inbound-ports-to-ignore 4190 \
             --outbound-ports-to-ignore 4567 --subnets-to-ignore 192.0.2.0/24",
        ));
        let listeners = Listeners {
            app_ports: [8080, 4190].into(),
            service_ports: [80, 4567].into(),
        };
        let c = Contract {
            state: &state,
            listeners: &listeners,
        };
        let svc80 = Dst::new(Host::Service, Family::V4, 80);
        assert_eq!(c.outbound(1000, 1000, svc80), "outbound orig=svc4:80");
        assert_eq!(c.outbound(2102, 2102, svc80), "svc@svc4:80");
        assert_eq!(c.outbound(0, 0, svc80), "outbound orig=svc4:80");
        let svc6 = Dst::new(Host::Service, Family::V6, 80);
        assert_eq!(c.outbound(1000, 1000, svc6), "svc@svc6:80", "IPv6 off");
        let lo = Dst::new(Host::Loopback, Family::V4, 8080);
        assert_eq!(c.outbound(1000, 1000, lo), "app@127.0.0.1:8080");
        let ignored = Dst::new(Host::Service, Family::V4, 4567);
        assert_eq!(c.outbound(1000, 1000, ignored), "svc@svc4:4567");
        let to_proxy = Dst::new(Host::Pod, Family::V4, 4143);
        assert_eq!(c.outbound(1000, 1000, to_proxy), "inbound orig=pod4:4143");
        let peer: IpAddr = "10.200.1.2".parse().unwrap();
        let app = Dst::new(Host::Pod, Family::V4, 8080);
        assert_eq!(c.inbound(peer, app), "inbound orig=pod4:8080");
        assert_eq!(c.inbound(OUTSIDE_V4.into(), app), "app@pod4:8080");
        let admin = Dst::new(Host::Pod, Family::V4, 4190);
        assert_eq!(c.inbound(peer, admin), "app@pod4:4190");
    }
}
