//! Running a conformance case: the same scenarios in two fresh pods, one with istio's
//! reference rules loaded by `iptables-restore`, one set up by `redirector istio-iptables`
//! with the case's flags, and a row per scenario comparing where the connection landed.
//!
//! Only the landing is compared: which listener took the connection (the outbound proxy on
//! 15001, the inbound one on 15006, the real destination, or an error) and the
//! `SO_ORIGINAL_DST` the proxy read. The proxy's peer address is left out on purpose: with
//! iptables' REDIRECT the proxy sees the app's pod IP, with redirector's connect-time
//! rewrite it sees 127.0.0.1 / ::1 (docs/conformance.md). DNS rows compare who answered a
//! query (the DNS proxy on 15053, the real server, or an error) and, over UDP, the source
//! address the client saw the reply come from.

pub mod cases;
pub mod rules;

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::conformance::cases::{Case, DnsSetup};
use crate::dns::{require_node, DnsClient, DnsServer, ResolvConf, DNS_PORT};
use crate::iptables::{apply_golden, saved_rules};
use crate::redirector::{istio_iptables_command, PinRoot};
use crate::scenario::{
    AddrBook, DnsRequest, DnsScenario, InboundScenario, Scenario, APP_PORTS, LOCAL_DNS_V4,
    LOCAL_DNS_V6, OUTSIDE_V4, OUTSIDE_V6, POD_DNS_ANSWER, SERVICE_PORTS, SVC_DNS_ANSWER,
};
use crate::{connect_from, Cgroup, ChildGuard, NetNs, ProbeServer, Topology, APP_UID, PROXY_UID};

/// Names of the listeners, so the landing port is visible in every row.
pub const OUTBOUND_PROXY: &str = "outbound";
pub const INBOUND_PROXY: &str = "inbound";
pub const APP: &str = "app";
pub const SERVICE: &str = "svc";
pub const DNS_PROXY: &str = "dns-proxy";

/// Which implementation a pod is set up with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// istio's rules for the case, applied with iptables-restore / ip6tables-restore.
    Iptables,
    /// `redirector istio-iptables <the case's flags>`.
    Redirector,
}

/// One scenario's outcome on both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub who: String,
    pub dst: String,
    pub iptables: String,
    pub redirector: String,
}

impl Row {
    pub fn matches(&self) -> bool {
        self.iptables == self.redirector
    }
}

/// The rows of one case and what is needed to understand a mismatch.
#[derive(Debug)]
pub struct CaseReport {
    pub case: Case,
    pub rows: Vec<Row>,
    pub redirector_log: String,
    pub iptables_state: String,
    pub elapsed: Duration,
}

impl CaseReport {
    pub fn mismatches(&self) -> Vec<&Row> {
        self.rows.iter().filter(|r| !r.matches()).collect()
    }

    /// The case header and one line per row.
    pub fn table(&self) -> String {
        let case = &self.case;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "== {}: flags {:?}{}; reference {}; {} rows in {:.1} s",
            case.name,
            case.flags,
            if case.env.is_empty() {
                String::new()
            } else {
                format!(" env {:?}", case.env)
            },
            case.reference,
            self.rows.len(),
            self.elapsed.as_secs_f64()
        );
        for note in &case.notes {
            let _ = writeln!(out, "   note: {note}");
        }
        let _ = writeln!(
            out,
            "   {:<42} {:<22} {:<32} {:<30} {:<30}",
            "case", "who", "dst", "iptables", "redirector"
        );
        for row in &self.rows {
            let _ = writeln!(
                out,
                "   {:<42} {:<22} {:<32} {:<30} {:<30}{}",
                case.name,
                row.who,
                row.dst,
                row.iptables,
                row.redirector,
                if row.matches() { "" } else { "  MISMATCH" }
            );
        }
        out
    }

    /// Everything a reader of a failure needs: the mismatching rows, the reference rules
    /// as loaded and redirector's log.
    pub fn failure(&self) -> Option<String> {
        let mismatches = self.mismatches();
        if mismatches.is_empty() {
            return None;
        }
        let mut out = format!(
            "{}: {} of {} scenarios differ between istio's iptables rules and redirector \
             (flags {:?}, env {:?}):\n",
            self.case.name,
            mismatches.len(),
            self.rows.len(),
            self.case.flags,
            self.case.env
        );
        for row in mismatches {
            let _ = writeln!(
                out,
                "  {} -> {}: iptables {} | redirector {}",
                row.who, row.dst, row.iptables, row.redirector
            );
        }
        let _ = write!(
            out,
            "reference nat rules as loaded:\n{}redirector log:\n{}",
            self.iptables_state, self.redirector_log
        );
        Some(out)
    }
}

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

    /// (who, what) of every row, in run order.
    fn labels(&self) -> Vec<(String, String)> {
        let outbound = self
            .outbound
            .iter()
            .map(|s| (s.who.name.clone(), s.dst.to_string()));
        let inbound = self
            .inbound
            .iter()
            .map(|s| ("peer(inbound)".to_owned(), s.dst.to_string()));
        let dns = self
            .dns
            .iter()
            .map(|s| (s.who.name.clone(), s.request.to_string()));
        outbound.chain(inbound).chain(dns).collect()
    }
}

/// Runs all of `case`'s scenarios on both sides (one fresh topology each, one after the
/// other) and pairs the outcomes.
pub fn run_case(case: &Case) -> CaseReport {
    run_scenarios(case, &Scenarios::of(case), PassthroughV6::Given)
}

/// Runs the given scenarios of `case` on both sides and pairs the outcomes.
pub fn run_scenarios(
    case: &Case,
    scenarios: &Scenarios,
    passthrough_v6: PassthroughV6,
) -> CaseReport {
    let start = Instant::now();
    let reference = SideRun::run(case, Side::Iptables, scenarios, passthrough_v6);
    let ours = SideRun::run(case, Side::Redirector, scenarios, passthrough_v6);
    let rows = scenarios
        .labels()
        .into_iter()
        .zip(reference.outcomes.iter().zip(&ours.outcomes))
        .map(|((who, dst), (iptables, redirector))| Row {
            who,
            dst,
            iptables: iptables.clone(),
            redirector: redirector.clone(),
        })
        .collect();
    CaseReport {
        case: case.clone(),
        rows,
        redirector_log: ours.log,
        iptables_state: reference.log,
        elapsed: start.elapsed(),
    }
}

/// One side's outcomes, rendered with [`AddrBook::render`], in scenario order.
struct SideRun {
    outcomes: Vec<String>,
    /// The iptables state (reference) or redirector's log.
    log: String,
}

impl SideRun {
    fn run(case: &Case, side: Side, scenarios: &Scenarios, passthrough_v6: PassthroughV6) -> Self {
        let pod = PodUnderTest::new(case, side, passthrough_v6);
        let book = AddrBook::of(&pod.topo);
        let mut outcomes = Vec::new();
        for scenario in &scenarios.outbound {
            let dst = book.resolve(scenario.dst);
            let bind = book.bind(&scenario.who, scenario.dst);
            let (uid, gid) = (scenario.who.uid, scenario.who.gid);
            let topo = &pod.topo;
            let outcome = connect_from(topo, Some(&topo.pod_cgroup), uid, gid, dst, bind);
            outcomes.push(book.render(&outcome.landing()));
        }
        for scenario in &scenarios.inbound {
            // A client outside the pod: the service netns, no cgroup of the pod.
            let dst = book.resolve(scenario.dst);
            let outcome = connect_from(&pod.topo.service, None, APP_UID, APP_UID, dst, None);
            outcomes.push(book.render(&outcome.landing()));
        }
        let node = if scenarios.dns.is_empty() {
            None
        } else {
            require_node()
        };
        for scenario in &scenarios.dns {
            let (uid, gid) = (scenario.who.uid, scenario.who.gid);
            let client = DnsClient::new(&pod.topo, Some(&pod.topo.pod_cgroup), uid, gid);
            let resolv_conf = || {
                pod.resolv_conf
                    .as_ref()
                    .expect("a DNS case has a resolv.conf")
            };
            let outcome = match scenario.request {
                DnsRequest::Query { dst, mode } => client.query(book.resolve(dst), mode),
                DnsRequest::Glibc { tcp } => client.resolve(&resolv_conf()[usize::from(tcp)]),
                DnsRequest::CAres => match &node {
                    Some(node) => client.resolve_c_ares(node, &resolv_conf()[0]),
                    None => {
                        outcomes.push("skipped(no node)".to_owned());
                        continue;
                    }
                },
            };
            outcomes.push(book.render_dns(&outcome));
        }
        let tables: &[&str] = if case.dns.is_some() {
            &["nat", "raw"]
        } else {
            &["nat"]
        };
        let log = match side {
            Side::Iptables => tables
                .iter()
                .flat_map(|table| [false, true].map(|v6| saved_rules(&pod.topo.pod, v6, table)))
                .collect(),
            Side::Redirector => pod.install_log.clone(),
        };
        SideRun { outcomes, log }
    }
}

/// A pod set up for one side of a case. Fields drop in declaration order: the processes
/// first, then the pins (which detaches redirector's programs), then the namespaces and
/// the cgroup.
struct PodUnderTest {
    _servers: Vec<ChildGuard>,
    _pins: Option<PinRoot>,
    /// DNS cases: the pod's resolv.conf, for UDP and (`use-vc`) for TCP.
    resolv_conf: Option<[ResolvConf; 2]>,
    topo: Topology,
    install_log: String,
}

impl PodUnderTest {
    fn new(case: &Case, side: Side, passthrough_v6: PassthroughV6) -> Self {
        let hint = match side {
            Side::Iptables => "cfipt",
            Side::Redirector => "cfrdr",
        };
        let topo = Topology::new(hint);
        topo.add_service_addr(OUTSIDE_V4.into());
        topo.add_service_addr(OUTSIDE_V6.into());
        let mut servers = vec![start_service(&topo)];
        if side == Side::Iptables || passthrough_v6 == PassthroughV6::Given {
            topo.pod
                .run(&["ip", "-6", "addr", "add", "::6/128", "dev", "lo"]);
        }
        let resolv_conf = case.dns.as_ref().map(|dns| {
            // The pod's node-local DNS address: part of the pod before its capture setup.
            topo.pod.run(&[
                "ip",
                "-6",
                "addr",
                "add",
                &format!("{LOCAL_DNS_V6}/128"),
                "dev",
                "lo",
            ]);
            [false, true].map(|use_vc| ResolvConf::new(hint, &dns.servers, use_vc))
        });
        let (pins, install_log) = match side {
            Side::Iptables => {
                apply_golden(&topo.pod, &case.rules.v4, Some(&case.rules.v6));
                (None, String::new())
            }
            Side::Redirector => {
                // Set up first, as an init container runs before the sidecar and the app.
                let pins = PinRoot::new(hint);
                let resolv = resolv_conf.as_ref().map(|[udp, _]| udp.path());
                let out = install_with_env(&topo.pod, &topo.pod_cgroup, &pins, case, resolv);
                (
                    Some(pins),
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                )
            }
        };
        servers.extend(start_pod_servers(&topo));
        if let Some(dns) = &case.dns {
            servers.extend(start_dns_servers(&topo, dns));
        }
        PodUnderTest {
            _servers: servers,
            _pins: pins,
            resolv_conf,
            topo,
            install_log,
        }
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

fn wildcard(v6: bool, port: u16) -> SocketAddr {
    if v6 {
        SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port)
    } else {
        SocketAddr::new([0, 0, 0, 0].into(), port)
    }
}

/// The peer: answers on [`SERVICE_PORTS`] on all its addresses (the extra ones included).
fn start_service(topo: &Topology) -> ChildGuard {
    let mut service = ProbeServer::serve(&topo.service, SERVICE);
    for port in SERVICE_PORTS {
        service = service
            .listen(wildcard(false, port))
            .listen(wildcard(true, port));
    }
    service.start()
}

/// The sidecar's two listeners and the app, in the pod's netns and cgroup.
fn start_pod_servers(topo: &Topology) -> [ChildGuard; 3] {
    let outbound = ProbeServer::proxy(&topo.pod, OUTBOUND_PROXY)
        .listen("127.0.0.1:15001".parse().unwrap())
        .listen("[::1]:15001".parse().unwrap())
        .cgroup(&topo.pod_cgroup)
        .user(PROXY_UID, PROXY_UID)
        .start();
    // All addresses, as envoy's virtualInbound listener: iptables' PREROUTING REDIRECT sends
    // inbound connections to the pod's address; OUTPUT REDIRECT to 127.0.0.1 / ::1.
    let inbound = ProbeServer::proxy(&topo.pod, INBOUND_PROXY)
        .listen(wildcard(false, 15006))
        .listen(wildcard(true, 15006))
        .cgroup(&topo.pod_cgroup)
        .user(PROXY_UID, PROXY_UID)
        .start();
    let mut app = ProbeServer::serve(&topo.pod, APP);
    for port in APP_PORTS {
        app = app
            .listen(wildcard(false, port))
            .listen(wildcard(true, port));
    }
    let app = app.cgroup(&topo.pod_cgroup).user(APP_UID, APP_UID).start();
    [outbound, inbound, app]
}

/// Env vars that configure istio-iptables (and so redirector): cleared from the child's
/// environment so that only the case's own reach it.
fn is_istio_setting(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with("ISTIO_")
        || [
            "ENVOY_USER",
            "INBOUND_CAPTURE_PORT",
            "INBOUND_TUNNEL_PORT",
            "PROXY_UID",
            "PROXY_GID",
            "KUBE_VIRT_INTERFACES",
            "INVALID_DROP",
            "DROP_INVALID",
            "REDIRECT_DNS",
            "CAPTURE_ALL_DNS",
            "DRY_RUN",
            "DUAL_STACK",
            "REDIRECTOR_PIN_ROOT",
        ]
        .contains(&name.as_ref())
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
