//! Running a conformance case: the same scenarios in two fresh pods, one with istio's
//! reference rules loaded by `iptables-restore`, one set up by `redirector istio-iptables`
//! with the case's flags, and a row per scenario comparing where the connection landed.
//!
//! Only the landing is compared (see [`twin_pods`]): which listener took the connection
//! (the outbound proxy on 15001, the inbound one on 15006, the real destination, or an
//! error) and the `SO_ORIGINAL_DST` the proxy read. DNS rows compare who answered a query
//! (the DNS proxy on 15053, the real server, or an error) and, over UDP, the source address
//! the client saw the reply come from.

pub mod cases;
pub mod rules;

use std::ffi::OsStr;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Output;

use crate::conformance::cases::{Case, DnsSetup};
use crate::dns::{require_node, DnsClient, DnsServer, ResolvConf, DNS_PORT};
use crate::iptables::{apply_golden, saved_rules};
use crate::proxied_pod::start_outbound_proxy;
use crate::redirector::{istio_iptables_command, PinRoot};
use crate::scenario::{
    AddrBook, DnsRequest, DnsScenario, Family, InboundScenario, Scenario, APP_PORTS, LOCAL_DNS_V4,
    LOCAL_DNS_V6, POD_DNS_ANSWER, SERVICE_PORTS, SVC_DNS_ANSWER,
};
use crate::twin_pods::{
    self, start_app, start_peer, start_proxy, wildcard, Mesh, Outcome, Side, TwinPod, DNS_PROXY,
    INBOUND_PROXY, OUTBOUND_PROXY,
};
use crate::{connect_from, words, Cgroup, ChildGuard, NetNs, Topology, APP_UID, PROXY_UID};

/// Who gives the pod the proxy's IPv6 passthrough source `::6` (istio-iptables adds it to
/// `lo` when IPv6 is on: capture/run.go `configureIPv6Addresses`; IPv6, unlike IPv4's
/// 127/8, has no such address on `lo` by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassthroughV6 {
    /// Both pods get it before their capture setup, as the state istio-init leaves: the rows
    /// then compare capture decisions only.
    Given,
    /// Only the iptables pod gets it from the test (standing in for istio-iptables); the
    /// redirector pod has what redirector's own setup provides.
    LeftToRedirector,
}

/// The rows of one run: outbound TCP connections, inbound ones, DNS exchanges.
#[derive(Clone, Debug, Default)]
pub struct Scenarios {
    pub outbound: Vec<Scenario>,
    pub inbound: Vec<InboundScenario>,
    pub dns: Vec<DnsScenario>,
}

impl Scenarios {
    /// Every scenario of `case`.
    pub fn of(case: &Case) -> Self {
        Scenarios {
            outbound: case.outbound_scenarios(),
            inbound: case.inbound_scenarios(),
            dns: case.dns_scenarios(),
        }
    }
}

/// istio's suite in the twin-pod harness: istio's reference rules against
/// `redirector istio-iptables` with the case's flags, over `scenarios`.
pub struct Istio {
    pub scenarios: Scenarios,
    pub passthrough_v6: PassthroughV6,
}

pub type CaseReport = twin_pods::CaseReport<Istio>;

/// Runs all of `case`'s scenarios on both sides (one fresh pod each, one after the other)
/// and pairs the outcomes.
pub fn run_case(case: &Case) -> CaseReport {
    run_scenarios(case, &Scenarios::of(case), PassthroughV6::Given)
}

/// Runs the given scenarios of `case` on both sides and pairs the outcomes.
pub fn run_scenarios(
    case: &Case,
    scenarios: &Scenarios,
    passthrough_v6: PassthroughV6,
) -> CaseReport {
    let istio = Istio {
        scenarios: scenarios.clone(),
        passthrough_v6,
    };
    twin_pods::run_case(&istio, case, true)
}

impl Mesh for Istio {
    type Case = Case;
    /// DNS cases: the pod's resolv.conf, for UDP and (`use-vc`) for TCP.
    type PodState = Option<[ResolvConf; 2]>;
    const PREFIX: &'static str = "cf";
    const REFERENCE: &'static str = "istio's iptables rules";
    const UNDER_TEST: &'static str = "redirector istio-iptables";

    fn name(case: &Case) -> &str {
        &case.name
    }

    fn describe(case: &Case) -> String {
        let env = if case.env.is_empty() {
            String::new()
        } else {
            format!(" env {:?}", case.env)
        };
        format!("flags {:?}{env}; reference {}", case.flags, case.reference)
    }

    fn notes(case: &Case) -> Vec<&str> {
        case.notes.iter().map(String::as_str).collect()
    }

    fn prepare(
        &self,
        case: &Case,
        side: Side,
        topo: &Topology,
        hint: &str,
    ) -> (Vec<ChildGuard>, Self::PodState) {
        let service = start_peer(topo, &SERVICE_PORTS);
        if side == Side::Iptables || self.passthrough_v6 == PassthroughV6::Given {
            topo.pod
                .run(&["ip", "-6", "addr", "add", "::6/128", "dev", "lo"]);
        }
        let resolv_conf = case.dns.as_ref().map(|dns| {
            // The pod's node-local DNS address: part of the pod before its capture setup.
            let local = format!("{LOCAL_DNS_V6}/128");
            topo.pod
                .run(&["ip", "-6", "addr", "add", &local, "dev", "lo"]);
            [false, true].map(|use_vc| ResolvConf::new(hint, &dns.servers, use_vc))
        });
        (vec![service], resolv_conf)
    }

    fn apply_reference(&self, case: &Case, topo: &Topology) -> String {
        apply_golden(&topo.pod, &case.rules.v4, Some(&case.rules.v6));
        let tables: &[&str] = if case.dns.is_some() {
            &["nat", "raw"]
        } else {
            &["nat"]
        };
        tables
            .iter()
            .flat_map(|table| [false, true].map(|v6| saved_rules(&topo.pod, v6, table)))
            .collect()
    }

    fn install(
        &self,
        case: &Case,
        topo: &Topology,
        pins: &PinRoot,
        state: &Self::PodState,
    ) -> String {
        let resolv = state.as_ref().map(|[udp, _]| udp.path());
        let out = install_with_env(&topo.pod, &topo.pod_cgroup, pins, case, resolv);
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// The sidecar's two listeners and the app, in the pod's netns and cgroup, and a DNS
    /// case's DNS servers.
    fn start_servers(&self, case: &Case, topo: &Topology) -> Vec<ChildGuard> {
        // All addresses, as envoy's virtualInbound listener: iptables' PREROUTING REDIRECT
        // sends inbound connections to the pod's address; OUTPUT REDIRECT to 127.0.0.1 / ::1.
        let inbound = Family::BOTH.map(|family| wildcard(family, 15006));
        let mut servers = vec![
            start_outbound_proxy(topo, OUTBOUND_PROXY),
            start_proxy(topo, INBOUND_PROXY, inbound, (PROXY_UID, PROXY_UID)),
            start_app(topo, &APP_PORTS),
        ];
        if let Some(dns) = &case.dns {
            servers.extend(start_dns_servers(topo, dns));
        }
        servers
    }

    fn connect(&self, _: &Case, pod: &TwinPod<Self::PodState>) -> Vec<Outcome> {
        let topo = &pod.topo;
        let book = AddrBook::of(topo);
        let mut outcomes = Vec::new();
        for scenario in &self.scenarios.outbound {
            let dst = book.resolve(scenario.dst);
            let bind = book.bind(&scenario.who, scenario.dst);
            let (uid, gid) = (scenario.who.uid, scenario.who.gid);
            let outcome = connect_from(topo, Some(&topo.pod_cgroup), uid, gid, dst, bind);
            let landing = book.render(&outcome.landing());
            outcomes.push(Outcome::new(&scenario.who.name, scenario.dst, landing));
        }
        for scenario in &self.scenarios.inbound {
            // A client outside the pod: the service netns, no cgroup of the pod.
            let dst = book.resolve(scenario.dst);
            let outcome = connect_from(&topo.service, None, APP_UID, APP_UID, dst, None);
            let landing = book.render(&outcome.landing());
            outcomes.push(Outcome::new("peer(inbound)", scenario.dst, landing));
        }
        let node = if self.scenarios.dns.is_empty() {
            None
        } else {
            require_node()
        };
        for scenario in &self.scenarios.dns {
            let label = |landing| Outcome::new(&scenario.who.name, scenario.request, landing);
            let (uid, gid) = (scenario.who.uid, scenario.who.gid);
            let client = DnsClient::new(topo, Some(&topo.pod_cgroup), uid, gid);
            let resolv_conf = || pod.state.as_ref().expect("a DNS case has a resolv.conf");
            let outcome = match scenario.request {
                DnsRequest::Query { dst, mode } => client.query(book.resolve(dst), mode),
                DnsRequest::Glibc { tcp } => client.resolve(&resolv_conf()[usize::from(tcp)]),
                DnsRequest::CAres => match &node {
                    Some(node) => client.resolve_c_ares(node, &resolv_conf()[0]),
                    None => {
                        outcomes.push(label("skipped(no node)".to_owned()));
                        continue;
                    }
                },
            };
            outcomes.push(label(book.render_dns(&outcome)));
        }
        outcomes
    }
}

/// The DNS servers of a DNS case: the pod's own (on 127.0.0.53, ::127.0.0.53 and the pod's
/// addresses; in the pod cgroup as root, for port 53: it only receives and replies, which
/// no capture rule matches), the service's, and the stand-in DNS proxy on 15053 forwarding
/// to the pod's server, as the case's proxy owner in the pod cgroup.
fn start_dns_servers(topo: &Topology, dns: &DnsSetup) -> [ChildGuard; 3] {
    let on = |ip: IpAddr| SocketAddr::new(ip, DNS_PORT);
    let pod_dns = DnsServer::server(&topo.pod, "pod-dns", POD_DNS_ANSWER, None)
        .listen(on(LOCAL_DNS_V4.into()))
        .listen(on(LOCAL_DNS_V6.into()))
        .listen(on(topo.pod_ip4().into()))
        .listen(on(topo.pod_ip6().into()))
        .cgroup(&topo.pod_cgroup)
        .start();
    let svc_dns = DnsServer::server(&topo.service, "svc-dns", SVC_DNS_ANSWER, None)
        .listen(on(topo.service_ip4().into()))
        .listen(on(topo.service_ip6().into()))
        .start();
    let (uid, gid) = dns.proxy_owner;
    let proxy = DnsServer::proxy(&topo.pod, DNS_PROXY, on(LOCAL_DNS_V4.into()))
        .listen_proxy_port()
        .cgroup(&topo.pod_cgroup)
        .user(uid, gid)
        .start();
    [pod_dns, svc_dns, proxy]
}

/// Env vars that configure istio-iptables (and so redirector): cleared from the child's
/// environment so that only the case's own reach it.
fn is_istio_setting(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    let others = "ENVOY_USER INBOUND_CAPTURE_PORT INBOUND_TUNNEL_PORT PROXY_UID PROXY_GID \
        KUBE_VIRT_INTERFACES INVALID_DROP DROP_INVALID REDIRECT_DNS CAPTURE_ALL_DNS DRY_RUN \
        DUAL_STACK REDIRECTOR_PIN_ROOT";
    name.starts_with("ISTIO_") || words(others).contains(&name.as_ref())
}

/// `redirector istio-iptables` for the pod with the case's flags and env vars (the kit's
/// `redirector::install` sets no env), and the pod's resolv.conf if it has one of the
/// test's; panics with the log unless it exits 0.
pub fn install_with_env(
    netns: &NetNs,
    cgroup: &Cgroup,
    root: &PinRoot,
    case: &Case,
    resolv_conf: Option<&Path>,
) -> Output {
    let mut cmd = istio_iptables_command(netns, cgroup, root);
    cmd.args(&case.flags);
    if let Some(path) = resolv_conf {
        cmd.arg("--resolv-conf").arg(path);
    }
    for (name, _) in std::env::vars_os() {
        if is_istio_setting(&name) {
            cmd.env_remove(name);
        }
    }
    cmd.envs(case.env.iter().map(|(k, v)| (k, v)));
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{}: redirector istio-iptables {:?} (env {:?}) failed ({}):\n{}",
        case.name,
        case.flags,
        case.env,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
