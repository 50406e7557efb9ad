//! The vocabulary of the conformance suite: who connects, to where, and what the connection
//! landed on.
//!
//! Every case runs in two topologies (one with istio's iptables rules, one with redirector),
//! and each topology has its own subnet, so addresses are written by role — `svc4:80`,
//! `pod6:8080` — and outcomes are rendered with the same names before they are compared.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::dns::protocol::DnsOutcome;
use crate::dns::{DnsMode, PROXY_ANSWER_V4, PROXY_ANSWER_V6};
use crate::{ConnOutcome, Landing, Topology, APP_UID, PROXY_UID};

/// An address outside the pod's subnet and outside 10.0.0.0/8, added to the service netns
/// (TEST-NET-1; it exists only inside the test's namespaces).
pub const OUTSIDE_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
/// The IPv6 counterpart (documentation prefix 2001:db8::/32, which `ipv6-ipnets` names).
pub const OUTSIDE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 3);
/// The source the proxy binds for inbound passthrough (istio's 127.0.0.6 / ::6).
pub const PASSTHROUGH_V4: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);
pub const PASSTHROUGH_V6: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6);

/// The DNS server address of istio's DNS cases (CASES.md), on the pod's `lo`.
pub const LOCAL_DNS_V4: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 53);
/// Its IPv6 counterpart in `dns-uid-gid` (an IPv4-compatible address: not loopback to IPv6,
/// so the pod gets it on `lo` like any local address).
pub const LOCAL_DNS_V6: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0x7f00, 0x35);
/// What the real DNS server in the pod (on every [`Host::LocalDns`] and [`Host::Pod`]
/// address) answers, and the one in the service netns.
pub const POD_DNS_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub const SVC_DNS_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);

/// Ports the service netns answers on, on all its addresses: a plain one, the tunnel port,
/// the `-q` ports of `outbound-ports-include`, and the `-o` port of `outbound-exclusions`.
pub const SERVICE_PORTS: [u16; 5] = [80, 15008, 31000, 32000, 8081];
/// Ports the app answers on inside the pod (all addresses): its own port, the tunnel port,
/// and ports that some case lists in `-b` or `-d` (for the inbound rows).
pub const APP_PORTS: [u16; 6] = [8080, 15008, 15021, 4000, 6000, 31000];
pub const APP_PORT: u16 = 8080;
pub const TUNNEL_PORT: u16 = 15008;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    pub fn is_v6(self) -> bool {
        self == Family::V6
    }
}

/// A client process in the pod (netns and cgroup), with its credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Who {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Bind the inbound-passthrough source (127.0.0.6 / ::6) before connecting, as the proxy
    /// does when it hands an inbound connection on to the app.
    pub passthrough: bool,
}

impl Who {
    pub fn new(name: &str, uid: u32, gid: u32) -> Self {
        Who {
            name: name.to_owned(),
            uid,
            gid,
            passthrough: false,
        }
    }

    /// An application: uid and gid 1000.
    pub fn app() -> Self {
        Who::new("app", APP_UID, APP_UID)
    }

    /// The sidecar: uid and gid 1337.
    pub fn proxy() -> Self {
        Who::new("proxy", PROXY_UID, PROXY_UID)
    }

    /// A process that shares only the proxy's group (uid 1000, gid 1337).
    pub fn proxy_gid_only() -> Self {
        Who::new("gid1337-only", APP_UID, PROXY_UID)
    }

    /// The proxy bound to 127.0.0.6 / ::6 (its inbound passthrough connections).
    pub fn passthrough() -> Self {
        Who {
            passthrough: true,
            ..Who::new("proxy@passthru", PROXY_UID, PROXY_UID)
        }
    }

    /// Whether this client may connect to `dst` in a scenario. A socket bound to a loopback
    /// source only reaches local addresses: IPv4 refuses the route (EINVAL) and an IPv6 peer
    /// could not answer `::6` (the SYN would time out), and the proxy never does that anyway.
    pub fn reaches(&self, dst: &Dst) -> bool {
        !self.passthrough || dst.host.is_local()
    }
}

/// A destination host, by its role in the topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    /// The service netns's own address (10.200.N.2 / fd00:200:N::2).
    Service,
    /// [`OUTSIDE_V4`] / [`OUTSIDE_V6`], in the service netns.
    Outside,
    /// The pod's own address (10.200.N.1 / fd00:200:N::1).
    Pod,
    /// 127.0.0.1 / ::1.
    Loopback,
    /// Another 127/8 address (IPv4 only: IPv6 has no loopback range).
    OtherLoopback(Ipv4Addr),
    /// [`LOCAL_DNS_V4`] / [`LOCAL_DNS_V6`]: a DNS server on the pod's `lo`.
    LocalDns,
}

impl Host {
    /// Whether a connection to it stays inside the pod (leaves through `lo`).
    pub fn is_local(self) -> bool {
        matches!(
            self,
            Host::Pod | Host::Loopback | Host::OtherLoopback(_) | Host::LocalDns
        )
    }
}

/// Where a client connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dst {
    pub host: Host,
    pub family: Family,
    pub port: u16,
}

impl Dst {
    pub fn new(host: Host, family: Family, port: u16) -> Self {
        if let Host::OtherLoopback(ip) = host {
            assert!(
                family == Family::V4 && ip.is_loopback(),
                "{ip} is no IPv4 loopback"
            );
        }
        Dst { host, family, port }
    }
}

impl fmt::Display for Dst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = if self.family.is_v6() { 6 } else { 4 };
        match self.host {
            Host::Service => write!(f, "svc{n}:{}", self.port),
            Host::Outside => write!(f, "outside{n}:{}", self.port),
            Host::Pod => write!(f, "pod{n}:{}", self.port),
            Host::Loopback if self.family.is_v6() => write!(f, "[::1]:{}", self.port),
            Host::Loopback => write!(f, "127.0.0.1:{}", self.port),
            Host::OtherLoopback(ip) => write!(f, "{ip}:{}", self.port),
            Host::LocalDns if self.family.is_v6() => write!(f, "[::127.0.0.53]:{}", self.port),
            Host::LocalDns => write!(f, "{LOCAL_DNS_V4}:{}", self.port),
        }
    }
}

/// One outbound row: `who` in the pod connects to `dst`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    pub who: Who,
    pub dst: Dst,
}

/// One inbound row: a client in the service netns ("peer") connects over the veth to the
/// pod's address (`dst.host` is always [`Host::Pod`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboundScenario {
    pub dst: Dst,
}

/// What a DNS client does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DnsRequest {
    /// `dnsprobe query` to `dst` (port 53) over `mode`.
    Query { dst: Dst, mode: DnsMode },
    /// glibc's `getaddrinfo` with the case's resolv.conf (`use-vc` for TCP).
    Glibc { tcp: bool },
    /// c-ares (node) with the case's resolv.conf.
    CAres,
}

impl fmt::Display for DnsRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DnsRequest::Query { dst, mode } => write!(f, "dns/{mode} {dst}"),
            DnsRequest::Glibc { tcp: false } => f.write_str("glibc/udp resolv.conf"),
            DnsRequest::Glibc { tcp: true } => f.write_str("glibc/tcp resolv.conf"),
            DnsRequest::CAres => f.write_str("c-ares/udp resolv.conf"),
        }
    }
}

/// One DNS row: `who` in the pod makes `request`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsScenario {
    pub who: Who,
    pub request: DnsRequest,
}

/// Who gave an answer, by the address it answers with.
fn answerer(addr: IpAddr) -> String {
    match addr {
        a if a == IpAddr::from(PROXY_ANSWER_V4) || a == IpAddr::from(PROXY_ANSWER_V6) => {
            "dns-proxy".to_owned()
        }
        a if a == IpAddr::from(POD_DNS_ANSWER) => "pod-dns".to_owned(),
        a if a == IpAddr::from(SVC_DNS_ANSWER) => "svc-dns".to_owned(),
        other => other.to_string(),
    }
}

/// The answerers of `addrs`, without repeats (a resolver asks for A and AAAA).
fn answerers(addrs: &[IpAddr]) -> String {
    let mut names: Vec<String> = addrs.iter().map(|a| answerer(*a)).collect();
    names.dedup();
    names.join("+")
}

/// The addresses of one topology, to turn roles into addresses and back.
#[derive(Clone, Copy, Debug)]
pub struct AddrBook {
    pod4: Ipv4Addr,
    pod6: Ipv6Addr,
    svc4: Ipv4Addr,
    svc6: Ipv6Addr,
}

impl AddrBook {
    pub fn of(topo: &Topology) -> Self {
        AddrBook {
            pod4: topo.pod_ip4(),
            pod6: topo.pod_ip6(),
            svc4: topo.service_ip4(),
            svc6: topo.service_ip6(),
        }
    }

    pub fn resolve(&self, dst: Dst) -> SocketAddr {
        let v6 = dst.family.is_v6();
        let ip: IpAddr = match dst.host {
            Host::Service if v6 => self.svc6.into(),
            Host::Service => self.svc4.into(),
            Host::Outside if v6 => OUTSIDE_V6.into(),
            Host::Outside => OUTSIDE_V4.into(),
            Host::Pod if v6 => self.pod6.into(),
            Host::Pod => self.pod4.into(),
            Host::Loopback if v6 => Ipv6Addr::LOCALHOST.into(),
            Host::Loopback => Ipv4Addr::LOCALHOST.into(),
            Host::OtherLoopback(ip) => ip.into(),
            Host::LocalDns if v6 => LOCAL_DNS_V6.into(),
            Host::LocalDns => LOCAL_DNS_V4.into(),
        };
        SocketAddr::new(ip, dst.port)
    }

    /// The source address `who` binds before connecting to `dst`, if any.
    pub fn bind(&self, who: &Who, dst: Dst) -> Option<IpAddr> {
        match (who.passthrough, dst.family) {
            (false, _) => None,
            (true, Family::V4) => Some(PASSTHROUGH_V4.into()),
            (true, Family::V6) => Some(PASSTHROUGH_V6.into()),
        }
    }

    /// `addr` with this topology's own addresses written by role (`pod4:8080`); any other
    /// address is the same in both topologies and is written as it is.
    pub fn name(&self, addr: SocketAddr) -> String {
        let role = match addr.ip() {
            IpAddr::V4(ip) if ip == self.pod4 => "pod4",
            IpAddr::V4(ip) if ip == self.svc4 => "svc4",
            IpAddr::V4(ip) if ip == OUTSIDE_V4 => "outside4",
            IpAddr::V6(ip) if ip == self.pod6 => "pod6",
            IpAddr::V6(ip) if ip == self.svc6 => "svc6",
            IpAddr::V6(ip) if ip == OUTSIDE_V6 => "outside6",
            // As istio and CASES.md write it (Rust would write ::7f00:35).
            IpAddr::V6(ip) if ip == LOCAL_DNS_V6 => {
                return format!("[::127.0.0.53]:{}", addr.port())
            }
            _ => return addr.to_string(),
        };
        format!("{role}:{}", addr.port())
    }

    /// A DNS client's outcome as a topology-independent string: who answered
    /// (`dns-proxy`, `pod-dns`, `svc-dns`) and, over UDP, the source the reply came from
    /// (`dns-proxy from=127.0.0.53:53`); a resolver library's answer (`resolved:dns-proxy`);
    /// the landing of a TCP connection taken by a non-DNS listener (`inbound orig=pod4:53`);
    /// or `error:<kind>`.
    pub fn render_dns(&self, outcome: &DnsOutcome) -> String {
        match outcome {
            DnsOutcome::Reply {
                rcode: 0,
                addrs,
                from,
            } => {
                let mut text = answerers(addrs);
                if let Some(from) = from {
                    text.push_str(&format!(" from={}", self.name(*from)));
                }
                text
            }
            DnsOutcome::Reply { rcode, .. } => format!("rcode={rcode}"),
            DnsOutcome::Resolved { addrs, .. } => format!("resolved:{}", answerers(addrs)),
            DnsOutcome::NotDns(line) => self.render(&ConnOutcome::from_server_line(line).landing()),
            DnsOutcome::Error { kind, .. } => format!("error:{kind}"),
        }
    }

    /// A landing as a topology-independent string: `outbound orig=svc4:80`,
    /// `app@pod4:8080`, `refused`, `error:timeout`. Two sides agree when these are equal.
    pub fn render(&self, landing: &Landing) -> String {
        match landing {
            Landing::Proxy {
                name,
                orig,
                upstream,
            } => {
                let orig = orig.map_or_else(|| "none".to_owned(), |o| self.name(o));
                let mut text = format!("{name} orig={orig}");
                if let Some(upstream) = upstream {
                    text.push_str(" -> ");
                    text.push_str(&self.render(upstream));
                }
                text
            }
            Landing::Service { name, local } => format!("{name}@{}", self.name(*local)),
            Landing::Refused => "refused".to_owned(),
            Landing::Error { kind } => format!("error:{kind}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book() -> AddrBook {
        AddrBook {
            pod4: Ipv4Addr::new(10, 200, 7, 1),
            pod6: "fd00:200:7::1".parse().unwrap(),
            svc4: Ipv4Addr::new(10, 200, 7, 2),
            svc6: "fd00:200:7::2".parse().unwrap(),
        }
    }

    #[test]
    fn roles_round_trip_through_addresses() {
        let book = book();
        for family in Family::BOTH {
            for host in [Host::Service, Host::Outside, Host::Pod, Host::Loopback] {
                let dst = Dst::new(host, family, 80);
                assert_eq!(book.name(book.resolve(dst)), dst.to_string(), "{dst:?}");
            }
        }
        let other = Dst::new(
            Host::OtherLoopback(Ipv4Addr::new(127, 0, 0, 2)),
            Family::V4,
            1,
        );
        assert_eq!(book.resolve(other).to_string(), "127.0.0.2:1");
    }

    #[test]
    fn landings_render_without_topology_specific_addresses() {
        let book = book();
        let proxied = Landing::Proxy {
            name: "outbound".into(),
            orig: Some("[fd00:200:7::2]:80".parse().unwrap()),
            upstream: None,
        };
        assert_eq!(book.render(&proxied), "outbound orig=svc6:80");
        let served = Landing::Service {
            name: "app".into(),
            local: "10.200.7.1:8080".parse().unwrap(),
        };
        assert_eq!(book.render(&served), "app@pod4:8080");
        assert_eq!(book.render(&Landing::Refused), "refused");
    }

    #[test]
    fn dns_outcomes_render_by_answerer_and_source() {
        let book = book();
        let v6 = Dst::new(Host::LocalDns, Family::V6, 53);
        assert_eq!(v6.to_string(), "[::127.0.0.53]:53");
        assert_eq!(book.name(book.resolve(v6)), v6.to_string());
        assert_eq!(LOCAL_DNS_V6, "::127.0.0.53".parse::<Ipv6Addr>().unwrap());
        let via_proxy = DnsOutcome::Reply {
            rcode: 0,
            addrs: vec![PROXY_ANSWER_V4.into()],
            from: Some(book.resolve(Dst::new(Host::Service, Family::V4, 53))),
        };
        assert_eq!(book.render_dns(&via_proxy), "dns-proxy from=svc4:53");
        let resolved = DnsOutcome::Resolved {
            addrs: vec![PROXY_ANSWER_V4.into(), PROXY_ANSWER_V6.into()],
            servers: vec![],
        };
        assert_eq!(book.render_dns(&resolved), "resolved:dns-proxy");
        let tcp_direct = DnsOutcome::Reply {
            rcode: 0,
            addrs: vec![POD_DNS_ANSWER.into()],
            from: None,
        };
        assert_eq!(book.render_dns(&tcp_direct), "pod-dns");
        let inbound = DnsOutcome::NotDns(
            "proxied name=inbound local=127.0.0.1:15006 peer=127.0.0.1:4000 orig=10.200.7.1:53"
                .into(),
        );
        assert_eq!(book.render_dns(&inbound), "inbound orig=pod4:53");
        let failed = DnsOutcome::Error {
            kind: "timeout".into(),
            detail: String::new(),
        };
        assert_eq!(book.render_dns(&failed), "error:timeout");
    }

    #[test]
    fn passthrough_clients_only_reach_local_destinations() {
        let who = Who::passthrough();
        assert!(who.reaches(&Dst::new(Host::Pod, Family::V6, 8080)));
        assert!(!who.reaches(&Dst::new(Host::Service, Family::V4, 80)));
        assert!(Who::app().reaches(&Dst::new(Host::Service, Family::V4, 80)));
        let book = book();
        let dst = Dst::new(Host::Pod, Family::V6, 8080);
        assert_eq!(book.bind(&who, dst), Some(PASSTHROUGH_V6.into()));
        assert_eq!(book.bind(&Who::app(), dst), None);
    }
}
