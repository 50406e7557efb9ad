//! The cases of the Linkerd conformance suite: proxy-init command lines as Linkerd's injector
//! writes them (docs/linkerd.md#how-linkerd-runs-it), with the ports each case probes, and the
//! connections every case makes.
//!
//! Every case's command line is given to both sides unchanged: parsed here into the rules
//! proxy-init writes (loaded with real `iptables-restore`), and passed to
//! `redirector linkerd-proxy-init`.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::linkerd::contract::Listeners;
use crate::linkerd::proxy_init::{CaptureState, ProxyInitOptions};
use crate::scenario::{Dst, Family, Host, Who, OUTSIDE_V4, OUTSIDE_V6};
use crate::{words, APP_UID};

/// The uid Linkerd's proxy runs as.
pub const LINKERD_PROXY_UID: u32 = 2102;
/// The uid and gid of `nobody`, as Linkerd's init containers and validator run.
pub const NOBODY: u32 = 65534;
/// The app's own port, on every address of the pod.
pub const APP_PORT: u16 = 8080;
/// The peer's plain port (outbound rows to any remote address).
pub const SERVICE_PORT: u16 = 80;

/// The injector's iptables plumbing flags: no effect on the rules, but a drop-in must take
/// them.
const PLUMBING: &str =
    "--firewall-bin-path iptables-nft --firewall-save-bin-path iptables-nft-save";

/// How the proxy's inbound listener is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InboundListener {
    /// `0.0.0.0:<incoming>`, and `[::]:<incoming>` (IPv6 only) when IPv6 is captured.
    PerFamily,
    /// One `[::]:<incoming>` socket without IPV6_V6ONLY, as the Linkerd proxy binds it in a
    /// dual-stack pod: IPv4 clients arrive v4-mapped and the proxy asks their original
    /// destination with `SOL_IP` on the AF_INET6 socket.
    DualStack,
}

/// One configuration of proxy-init and the ports its rows probe.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: &'static str,
    /// proxy-init's command line for each run, in order (two runs: a re-run).
    pub runs: Vec<Vec<String>>,
    pub inbound_listener: InboundListener,
    /// Ports the app connects to on the peer (besides [`SERVICE_PORT`]): the edges of the
    /// outbound ignore list and ports just outside it.
    pub outbound_ports: Vec<u16>,
    /// Ports the peer connects to on the pod (besides [`APP_PORT`] and the incoming proxy
    /// port): the edges of the inbound ignore list, listed and unlisted ports. At least
    /// 1024, as the app listens on them as an ordinary user.
    pub inbound_ports: Vec<u16>,
    pub notes: Vec<&'static str>,
}

/// One outbound row: `who` in the pod connects to `dst`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboundRow {
    pub who: Who,
    pub dst: Dst,
}

/// Where an inbound client's connection comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The peer namespace's own address (10.200.N.2 / fd00:200:N::2).
    Service,
    /// The peer bound to [`OUTSIDE_V4`] / [`OUTSIDE_V6`] first (the subnets the cases
    /// ignore).
    Outside,
}

impl Peer {
    pub fn label(self) -> &'static str {
        match self {
            Peer::Service => "peer",
            Peer::Outside => "peer@outside",
        }
    }
}

/// One inbound row: a client in the peer namespace connects to `dst` on the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboundRow {
    pub from: Peer,
    pub dst: Dst,
}

impl InboundRow {
    /// The address the peer binds before connecting, if any.
    pub fn bind(&self) -> Option<IpAddr> {
        match (self.from, self.dst.family) {
            (Peer::Service, _) => None,
            (Peer::Outside, Family::V4) => Some(OUTSIDE_V4.into()),
            (Peer::Outside, Family::V6) => Some(OUTSIDE_V6.into()),
        }
    }
}

impl Case {
    /// A case of `runs`, each a command line written as one string ([`words`]).
    fn new(name: &'static str, runs: &[&str]) -> Self {
        Case {
            name,
            runs: runs
                .iter()
                .map(|line| words(line).into_iter().map(str::to_owned).collect())
                .collect(),
            inbound_listener: InboundListener::PerFamily,
            outbound_ports: Vec::new(),
            inbound_ports: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn probing(mut self, outbound: &[u16], inbound: &[u16]) -> Self {
        self.outbound_ports = outbound.to_vec();
        self.inbound_ports = inbound.to_vec();
        self
    }

    fn note(mut self, note: &'static str) -> Self {
        self.notes.push(note);
        self
    }

    /// Each run's options; panics naming the case when proxy-init would refuse one.
    pub fn options(&self) -> Vec<ProxyInitOptions> {
        self.runs
            .iter()
            .enumerate()
            .map(|(i, args)| {
                ProxyInitOptions::parse(args).unwrap_or_else(|e| {
                    panic!(
                        "{}: run {} {args:?}: proxy-init refuses it: {e}",
                        self.name,
                        i + 1
                    )
                })
            })
            .collect()
    }

    /// What is captured once every run is done.
    pub fn capture(&self) -> CaptureState {
        CaptureState::after(&self.options())
    }

    /// The uid and gid the proxy runs as: `-u` / `-g` when given (0 too), else Linkerd's
    /// 2102 (and the uid as gid).
    pub fn proxy_owner(&self) -> (u32, u32) {
        let state = self.capture();
        let id = |v: Option<i64>| v.and_then(|v| u32::try_from(v).ok());
        let uid = id(state.v4.proxy_uid).unwrap_or(LINKERD_PROXY_UID);
        (uid, id(state.v4.proxy_gid).unwrap_or(uid))
    }

    pub fn listeners(&self) -> Listeners {
        let state = self.capture();
        let proxy_ports: BTreeSet<u16> = [Some(&state.v4), state.v6.as_ref()]
            .into_iter()
            .flatten()
            .flat_map(|o| [o.incoming_proxy_port, o.outgoing_proxy_port])
            .collect();
        let app_ports = std::iter::once(APP_PORT)
            .chain(self.inbound_ports.iter().copied())
            .filter(|p| !proxy_ports.contains(p))
            .collect();
        let service_ports = std::iter::once(SERVICE_PORT)
            .chain(self.outbound_ports.iter().copied())
            .collect();
        Listeners {
            app_ports,
            service_ports,
        }
    }

    /// Who connects from the pod: an app (uid 1000), uid 2102 (Linkerd's proxy uid, exempt
    /// only when it is the case's `-u`), root, nobody, and with `-g` an app uid in that
    /// group.
    pub fn clients(&self) -> Vec<Who> {
        let mut clients = vec![
            Who::new("app", APP_UID, APP_UID),
            Who::new("uid2102", LINKERD_PROXY_UID, LINKERD_PROXY_UID),
            Who::new("root", 0, 0),
            Who::new("nobody", NOBODY, NOBODY),
        ];
        if let Some(gid) = self
            .capture()
            .v4
            .proxy_gid
            .and_then(|g| u32::try_from(g).ok())
            .filter(|g| *g > 0)
        {
            clients.push(Who::new(&format!("gid{gid}"), APP_UID, gid));
        }
        clients
    }

    /// Every client to a remote address, 127.0.0.1 and the pod's own address; then the app
    /// to the other destinations: another remote, IPv6, the proxy's own ports, and the
    /// probed ports (over IPv6 too where IPv6 is captured).
    pub fn outbound_rows(&self) -> Vec<OutboundRow> {
        let v4 = |host, port| Dst::new(host, Family::V4, port);
        let v6 = |host, port| Dst::new(host, Family::V6, port);
        let state = self.capture();
        let mut rows = Vec::new();
        for who in self.clients() {
            for dst in [
                v4(Host::Service, SERVICE_PORT),
                v4(Host::Loopback, APP_PORT),
                v4(Host::Pod, APP_PORT),
            ] {
                rows.push(OutboundRow {
                    who: who.clone(),
                    dst,
                });
            }
        }
        let app = Who::new("app", APP_UID, APP_UID);
        let mut app_dsts = vec![
            v4(Host::Outside, SERVICE_PORT),
            v6(Host::Service, SERVICE_PORT),
            v6(Host::Loopback, APP_PORT),
            v6(Host::Pod, APP_PORT),
            v4(Host::Pod, state.v4.incoming_proxy_port),
            v4(Host::Loopback, state.v4.outgoing_proxy_port),
        ];
        app_dsts.extend(self.outbound_ports.iter().map(|p| v4(Host::Service, *p)));
        if state.v6.is_some() {
            app_dsts.extend(self.outbound_ports.iter().map(|p| v6(Host::Service, *p)));
        }
        rows.extend(app_dsts.into_iter().map(|dst| OutboundRow {
            who: app.clone(),
            dst,
        }));
        rows
    }

    /// The peer to the app's port and the proxy's incoming port, to every probed port (over
    /// IPv6 too where IPv6 is captured), and from the outside addresses to the app's port.
    pub fn inbound_rows(&self) -> Vec<InboundRow> {
        let state = self.capture();
        let mut ports = vec![APP_PORT, state.v4.incoming_proxy_port];
        ports.extend(&self.inbound_ports);
        let mut rows: Vec<InboundRow> = ports
            .iter()
            .map(|p| InboundRow {
                from: Peer::Service,
                dst: Dst::new(Host::Pod, Family::V4, *p),
            })
            .collect();
        let v6_ports: &[u16] = if state.v6.is_some() {
            &ports
        } else {
            &ports[..1]
        };
        rows.extend(v6_ports.iter().map(|p| InboundRow {
            from: Peer::Service,
            dst: Dst::new(Host::Pod, Family::V6, *p),
        }));
        for family in Family::BOTH {
            rows.push(InboundRow {
                from: Peer::Outside,
                dst: Dst::new(Host::Pod, family, APP_PORT),
            });
        }
        rows
    }
}

/// The injector's command line: plumbing, `--ipv6=false` unless IPv6 is on, the proxy
/// ports and uid, then `rest` (the ignore lists and anything else).
fn injector(ipv6: bool, rest: &str) -> String {
    let ipv6 = if ipv6 { "" } else { "--ipv6=false" };
    format!("{PLUMBING} {ipv6} --incoming-proxy-port 4143 --outgoing-proxy-port 4140 --proxy-uid 2102 {rest}")
}

/// The injector's ignore lists: the proxy's control and admin ports and the default
/// opaque ports inbound, the opaque ports outbound.
const DEFAULT_IGNORES: &str =
    "--inbound-ports-to-ignore 4190,4191,4567,4568 --outbound-ports-to-ignore 4567,4568";

/// Ranges of 16 multiport references: 4568 lands in a second RETURN rule.
const RANGES: &str = "--inbound-ports-to-ignore 4190,4191,6000-6999 --outbound-ports-to-ignore \
    1000-2000,3000-3001,3100-3101,3200-3201,3300-3301,3400-3401,3500-3501,4567,4568";

/// Every case, in a fixed order.
pub fn cases() -> Vec<Case> {
    let defaults = injector(false, DEFAULT_IGNORES);
    let ranges = injector(false, RANGES);
    let default_ports = |c: Case| c.probing(&[443, 4567, 4568], &[4190, 4191, 4567, 4568, 5000]);
    let subnets = "--inbound-ports-to-ignore 4190,4191 --subnets-to-ignore";
    vec![
        default_ports(Case::new("defaults", &[&defaults]))
            .note("the injector's command line, IPv6 off: IPv6 is never captured"),
        default_ports(Case::new("ipv6", &[&injector(true, DEFAULT_IGNORES)]))
            .note("the injector's command line with IPv6 on (`--ipv6` left at its default, true)"),
        Case::new("port-ranges", &[&ranges])
            .probing(
                &[999, 1000, 2000, 2001, 4567, 4568],
                &[4190, 5999, 6000, 6999, 7000],
            )
            .note("16 multiport references outbound: 4568 is in a second RETURN rule"),
        Case::new(
            "wide-ranges",
            &[&injector(
                true,
                "--inbound-ports-to-ignore 0-65535 --outbound-ports-to-ignore 1-1023",
            )],
        )
        .probing(&[443, 1023, 1024], &[1024, 65535])
        .note("no inbound capture at all; outbound only from port 1024 up (svc4:80 goes direct)"),
        default_ports(Case::new(
            "subnets",
            &[&injector(
                false,
                &format!("{subnets} 192.0.2.0/24,10.250.0.0/16"),
            )],
        ))
        .note("source subnets are inbound only: the app's connection to 192.0.2.3 is captured"),
        default_ports(Case::new(
            "subnets-ipv6",
            &[&injector(
                true,
                &format!("{subnets} 192.0.2.0/24,2001:db8::/32"),
            )],
        ))
        .note(
            "proxy-init itself fails this command line (each pass gets the other family's CIDR, \
             docs/linkerd.md, \"Where behaviour differs\"); the reference is each family's \
             rules with that family's CIDRs",
        ),
        Case::new(
            "listed-ports",
            &[&injector(
                false,
                "-r 8080,4190,6000 --inbound-ports-to-ignore 4190,4191",
            )],
        )
        .probing(&[443], &[4190, 4191, 6000, 7000])
        .note("-r: only 8080 and 6000 reach the proxy (4190 is listed but ignored first)"),
        Case::new(
            "proxy-gid",
            &[
                "-p 4143 -o 4140 -g 2103 --ipv6=false --inbound-ports-to-ignore 4190,4191 \
               --outbound-ports-to-ignore 4567",
            ],
        )
        .probing(&[4567, 4568], &[4190, 5000])
        .note("short flags; -g without -u: gid 2103 is exempt, uid 2102 is captured"),
        default_ports(Case::new(
            "uid-0",
            &[&format!(
                "{PLUMBING} --ipv6=false --incoming-proxy-port 4143 --outgoing-proxy-port 4140 \
                 --proxy-uid 0 {DEFAULT_IGNORES}"
            )],
        ))
        .note("--proxy-uid 0 exempts nobody: root's connections are captured too"),
        {
            let mut case = Case::new("dual-stack-listener", &[&injector(true, DEFAULT_IGNORES)])
                .probing(&[4567], &[4190, 5000])
                .note("the proxy's inbound listener is one [::]:4143 socket taking IPv4 too");
            case.inbound_listener = InboundListener::DualStack;
            case
        },
        default_ports(Case::new("rerun", &[&defaults, &defaults]))
            .note("the same command line twice: the second run changes nothing"),
        Case::new("rerun-replaces", &[&ranges, &defaults])
            .probing(&[1000, 2000, 3000, 4567, 4568], &[4190, 4567, 6000])
            .note("port-ranges, then the defaults: only the second run's ignore lists remain"),
    ]
}

/// The case called `name`; panics when there is none.
pub fn case(name: &str) -> Case {
    cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no Linkerd case {name:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linkerd::proxy_init::InboundMode;

    #[test]
    fn every_case_parses_and_probes_what_it_configures() {
        let cases = cases();
        let names: BTreeSet<&str> = cases.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), cases.len(), "case names are unique");
        for case in &cases {
            let state = case.capture();
            assert!(
                case.inbound_ports.iter().all(|p| *p >= 1024),
                "{}: the app listens as uid 1000",
                case.name
            );
            if case.inbound_listener == InboundListener::DualStack {
                assert!(state.v6.is_some(), "{}: dual-stack needs IPv6", case.name);
            }
            let rows = case.outbound_rows().len() + case.inbound_rows().len();
            assert!(
                (20..=60).contains(&rows),
                "{}: {rows} rows (keep the suite modest)",
                case.name
            );
            // A case with an ignore list probes at least one ignored port each way.
            let probes = |ports: &[u16], ranges: &[crate::linkerd::proxy_init::PortRange]| {
                ranges.is_empty() || ports.iter().any(|p| ranges.iter().any(|r| r.contains(*p)))
            };
            assert!(
                probes(&case.outbound_ports, &state.v4.outbound_ports_to_ignore),
                "{}: no ignored outbound port probed",
                case.name
            );
            assert!(
                probes(&case.inbound_ports, &state.v4.inbound_ports_to_ignore),
                "{}: no ignored inbound port probed",
                case.name
            );
        }
        let listed = case("listed-ports").capture().v4.inbound;
        assert_eq!(listed, InboundMode::RedirectListed(vec![8080, 4190, 6000]));
    }

    #[test]
    fn clients_follow_the_owner_flags() {
        assert_eq!(case("defaults").proxy_owner(), (2102, 2102));
        assert_eq!(case("uid-0").proxy_owner(), (0, 0));
        assert_eq!(case("proxy-gid").proxy_owner(), (2102, 2103));
        assert!(case("proxy-gid").clients().iter().any(|w| w.gid == 2103));
        assert_eq!(case("defaults").clients().len(), 4);
    }
}
