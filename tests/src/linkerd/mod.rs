//! The Linkerd conformance suite's kit: for each case (a proxy-init command line), the same
//! connections in two fresh pods — one with the nat rules Linkerd's proxy-init writes for it
//! loaded by `iptables-restore` / `ip6tables-restore`, one set up by
//! `redirector linkerd-proxy-init` with the same command line — and a row per connection
//! comparing where it landed (the outbound proxy on 4140, the inbound proxy on 4143, the
//! app or the peer directly, or an error) and the `SO_ORIGINAL_DST` the proxy read.
//!
//! Each row also carries what docs/linkerd.md#what-is-captured says should happen ([`contract`]);
//! the reference side must agree with it before its outcomes are worth comparing, and a
//! disagreement there is reported as the suite's fault, not redirector's.
//!
//! - [`proxy_init`]: proxy-init's flags and the rules it writes;
//! - [`contract`]: docs/linkerd.md#what-is-captured as expected landings;
//! - [`cases`]: the command lines and the connections each case makes;
//! - [`dual_stack`]: the proxy's `[::]:4143` listener that also takes IPv4;
//! - [`meshed`]: a pod Linkerd meshed, as a node (daemon or CNI plugin) captures it;
//! - [`validator`]: Linkerd's network validator, run in such a pod.
//!
//! As in istio's suite (docs/conformance.md), the proxy's peer address is left out of the
//! comparison: REDIRECT shows the client's address, a connect-time rewrite the loopback.

pub mod cases;
pub mod contract;
pub mod dual_stack;
pub mod meshed;
pub mod proxy_init;
pub mod validator;

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::process::Command;

use crate::iptables::{apply_golden, saved_rules};
use crate::linkerd::cases::{Case, InboundListener};
use crate::linkerd::contract::Contract;
use crate::redirector::{redirector_bin, PinRoot};
use crate::scenario::{AddrBook, Family};
use crate::twin_pods::{
    self, start_app, start_peer, start_proxy, wildcard, Mesh, Outcome, Row, Side, TwinPod,
    INBOUND_PROXY, OUTBOUND_PROXY,
};
use crate::{connect_from, Cgroup, ChildGuard, NetNs, Topology, APP_UID};

/// Linkerd's suite in the twin-pod harness: the nat rules proxy-init writes for the case
/// against `redirector linkerd-proxy-init` with the same command line, each row also
/// checked against the contract.
pub struct Linkerd;

pub type CaseReport = twin_pods::CaseReport<Linkerd>;

/// Runs `case` on the reference side only (iptables), with the contract beside it.
pub fn run_reference(case: &Case) -> CaseReport {
    twin_pods::run_case(&Linkerd, case, false)
}

/// Runs `case` on both sides, one fresh pod each, one after the other.
pub fn run_case(case: &Case) -> CaseReport {
    twin_pods::run_case(&Linkerd, case, true)
}

impl Mesh for Linkerd {
    type Case = Case;
    type PodState = ();
    const PREFIX: &'static str = "lk";
    const REFERENCE: &'static str = "Linkerd's iptables rules";
    const UNDER_TEST: &'static str = "redirector linkerd-proxy-init";
    const CONTRACT: &'static str = "docs/linkerd.md#what-is-captured";

    fn name(case: &Case) -> &str {
        case.name
    }

    fn describe(case: &Case) -> String {
        format!("{} run(s) {:?}", case.runs.len(), case.runs)
    }

    fn notes(case: &Case) -> Vec<&str> {
        case.notes.clone()
    }

    fn prepare(&self, case: &Case, _: Side, topo: &Topology, _: &str) -> (Vec<ChildGuard>, ()) {
        (vec![start_peer(topo, &case.listeners().service_ports)], ())
    }

    fn apply_reference(&self, case: &Case, topo: &Topology) -> String {
        apply_reference(&topo.pod, case);
        reference_rules_as_loaded(&topo.pod, case)
    }

    fn install(&self, case: &Case, topo: &Topology, pins: &PinRoot, _: &()) -> String {
        let log = install(&topo.pod, &topo.pod_cgroup, pins, case);
        assert_no_nat_rules(&topo.pod, case, &log);
        log
    }

    fn start_servers(&self, case: &Case, topo: &Topology) -> Vec<ChildGuard> {
        start_pod_servers(topo, case)
    }

    fn connect(&self, case: &Case, pod: &TwinPod<()>) -> Vec<Outcome> {
        let topo = &pod.topo;
        let book = AddrBook::of(topo);
        let state = case.capture();
        let listeners = case.listeners();
        let contract = Contract {
            state: &state,
            listeners: &listeners,
        };
        let mut rows = Vec::new();
        for row in case.outbound_rows() {
            let (uid, gid) = (row.who.uid, row.who.gid);
            let dst = book.resolve(row.dst);
            let outcome = connect_from(topo, Some(&topo.pod_cgroup), uid, gid, dst, None);
            let mut landed = Outcome::new(&row.who.name, row.dst, book.render(&outcome.landing()));
            landed.contract = Some(contract.outbound(uid, gid, row.dst));
            rows.push(landed);
        }
        for row in case.inbound_rows() {
            // A client outside the pod: the peer's netns, no cgroup of the pod.
            let source: IpAddr = match (row.bind(), row.dst.family) {
                (Some(bound), _) => bound,
                (None, Family::V4) => topo.service_ip4().into(),
                (None, Family::V6) => topo.service_ip6().into(),
            };
            let dst = book.resolve(row.dst);
            let outcome = connect_from(&topo.service, None, APP_UID, APP_UID, dst, row.bind());
            let landing = book.render(&outcome.landing());
            let mut landed = Outcome::new(row.from.label(), row.dst, landing);
            landed.contract = Some(contract.inbound(source, row.dst));
            rows.push(landed);
        }
        rows
    }

    /// docs/linkerd.md's one difference: an app dialling the proxy's outbound listener on
    /// loopback itself reaches it with no original destination, where conntrack answers the
    /// listener's own address (redirector answers a connection's own destination only at
    /// the inbound port: elsewhere a redirected connection whose entry was lost would send
    /// the proxy to itself).
    fn documented_difference(row: &Row, redirector: &str) -> bool {
        let on_loopback = row.dst.starts_with("127.0.0.1:") || row.dst.starts_with("[::1]:");
        on_loopback
            && row.iptables == format!("outbound orig={}", row.dst)
            && redirector == "outbound orig=none"
    }
}

/// Loads the rules of each of `case`'s runs in turn into `netns`, as proxy-init would leave
/// them: every run replaces the IPv4 nat table, and the IPv6 one when it has `--ipv6`.
pub fn apply_reference(netns: &NetNs, case: &Case) {
    for opts in case.options() {
        let v6 = opts.ipv6.then(|| opts.nat_rules(Family::V6));
        apply_golden(netns, &opts.nat_rules(Family::V4), v6.as_deref());
    }
}

/// `iptables-save -t nat`, and `ip6tables-save -t nat` where IPv6 is captured.
pub fn reference_rules_as_loaded(netns: &NetNs, case: &Case) -> String {
    let mut text = saved_rules(netns, false, "nat");
    if case.capture().v6.is_some() {
        text.push_str(&saved_rules(netns, true, "nat"));
    }
    text
}

/// The redirector pod has no nat rule of either family: its rows are redirector's own,
/// not those of iptables rules it might have left.
fn assert_no_nat_rules(netns: &NetNs, case: &Case, log: &str) {
    for v6 in [false, true] {
        let saved = saved_rules(netns, v6, "nat");
        assert!(
            !saved.lines().any(|l| l.starts_with("-A ")),
            "{}: `redirector linkerd-proxy-init` left nat rules in the pod:\n{saved}\nits log:\n{log}",
            case.name
        );
    }
}

/// `redirector linkerd-proxy-init <args> --netns <pod> --cgroup <pod's> --pin-root <root>`.
pub fn linkerd_proxy_init_command(
    args: &[String],
    netns: &NetNs,
    cgroup: &Cgroup,
    root: &PinRoot,
) -> Command {
    let mut cmd = Command::new(redirector_bin());
    cmd.arg("linkerd-proxy-init")
        .args(args)
        .arg("--netns")
        .arg(netns.path())
        .arg("--cgroup")
        .arg(cgroup.path())
        .arg("--pin-root")
        .arg(root.path())
        .env_remove("REDIRECTOR_PIN_ROOT");
    cmd
}

/// Every run of `case` through `redirector linkerd-proxy-init`; returns what they printed,
/// panics with it unless each exits 0.
fn install(netns: &NetNs, cgroup: &Cgroup, root: &PinRoot, case: &Case) -> String {
    let mut log = String::new();
    for (i, args) in case.runs.iter().enumerate() {
        let mut cmd = linkerd_proxy_init_command(args, netns, cgroup, root);
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
        let _ = write!(
            log,
            "--- run {} of {}: redirector linkerd-proxy-init {} ({})\n{}{}",
            i + 1,
            case.runs.len(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{}: run {} of `redirector linkerd-proxy-init` failed ({}):\n{log}",
            case.name,
            i + 1,
            out.status
        );
    }
    log
}

/// The proxy's two listeners (as the case's proxy owner) and the app (uid 1000), in the
/// pod's netns and cgroup. The proxy listens as Linkerd's does: outbound on 127.0.0.1 (and
/// ::1 where IPv6 is captured), inbound on every address of the captured families.
fn start_pod_servers(topo: &Topology, case: &Case) -> Vec<ChildGuard> {
    let state = case.capture();
    let owner = case.proxy_owner();
    let (v4, v6) = (&state.v4, state.v6.as_ref());
    let outbound = [Some(SocketAddr::new(
        [127, 0, 0, 1].into(),
        v4.outgoing_proxy_port,
    ))]
    .into_iter()
    .chain([v6.map(|v6| SocketAddr::new(Ipv6Addr::LOCALHOST.into(), v6.outgoing_proxy_port))]);
    let outbound = start_proxy(topo, OUTBOUND_PROXY, outbound.flatten(), owner);
    let inbound = match case.inbound_listener {
        InboundListener::PerFamily => {
            let v4 = wildcard(Family::V4, v4.incoming_proxy_port);
            let v6 = v6.map(|v6| wildcard(Family::V6, v6.incoming_proxy_port));
            start_proxy(topo, INBOUND_PROXY, [v4].into_iter().chain(v6), owner)
        }
        InboundListener::DualStack => {
            assert_eq!(
                v6.map(|o| o.incoming_proxy_port),
                Some(v4.incoming_proxy_port),
                "{}: a dual-stack listener needs IPv6 captured on the same port",
                case.name
            );
            dual_stack::start(
                &topo.pod,
                &topo.pod_cgroup,
                owner,
                INBOUND_PROXY,
                v4.incoming_proxy_port,
            )
        }
    };
    let app = start_app(topo, &case.listeners().app_ports);
    vec![outbound, inbound, app]
}
