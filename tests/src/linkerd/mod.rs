//! The Linkerd conformance suite's kit: for each case (a proxy-init command line), the same
//! connections in two fresh pods — one with the nat rules Linkerd's proxy-init writes for it
//! loaded by `iptables-restore` / `ip6tables-restore`, one set up by
//! `redirector linkerd-proxy-init` with the same command line — and a row per connection
//! comparing where it landed (the outbound proxy on 4140, the inbound proxy on 4143, the
//! app or the peer directly, or an error) and the `SO_ORIGINAL_DST` the proxy read.
//!
//! Each row also carries what LINKERD.md §2 says should happen ([`contract`]); the reference
//! side must agree with it before its outcomes are worth comparing, and a disagreement
//! there is reported as the suite's fault, not redirector's.
//!
//! - [`proxy_init`]: proxy-init's flags and the rules it writes;
//! - [`contract`]: LINKERD.md §2 as expected landings;
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
use std::time::{Duration, Instant};

use crate::conformance::{APP, INBOUND_PROXY, OUTBOUND_PROXY, SERVICE};
use crate::iptables::{apply_golden, saved_rules};
use crate::linkerd::cases::{Case, InboundListener};
use crate::linkerd::contract::{Contract, Listeners};
use crate::redirector::{redirector_bin, PinRoot};
use crate::scenario::{AddrBook, Family};
use crate::{connect_from, Cgroup, ChildGuard, NetNs, ProbeServer, Topology, APP_UID};

/// Which implementation a pod is set up with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// proxy-init's rules for the case, loaded with iptables-restore / ip6tables-restore.
    Iptables,
    /// `redirector linkerd-proxy-init <the case's flags>`.
    Redirector,
}

/// One connection's outcome: expected, and on each side that ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub who: String,
    pub dst: String,
    /// What LINKERD.md §2 says.
    pub contract: String,
    pub iptables: String,
    /// `None` when only the reference side ran.
    pub redirector: Option<String>,
}

impl Row {
    pub fn reference_agrees(&self) -> bool {
        self.iptables == self.contract
    }

    pub fn redirector_agrees(&self) -> bool {
        self.redirector
            .as_ref()
            .is_none_or(|r| *r == self.iptables || self.documented_difference(r))
    }

    /// docs/linkerd.md's one difference: an app dialling the proxy's outbound listener on
    /// loopback itself reaches it with no original destination, where conntrack answers the
    /// listener's own address (redirector answers a connection's own destination only at
    /// the inbound port: elsewhere a redirected connection whose entry was lost would send
    /// the proxy to itself).
    fn documented_difference(&self, redirector: &str) -> bool {
        let on_loopback = self.dst.starts_with("127.0.0.1:") || self.dst.starts_with("[::1]:");
        on_loopback
            && self.iptables == format!("outbound orig={}", self.dst)
            && redirector == "outbound orig=none"
    }
}

/// The rows of one case and what is needed to understand a mismatch.
#[derive(Debug)]
pub struct CaseReport {
    pub case: Case,
    pub rows: Vec<Row>,
    /// `iptables-save -t nat` (and `ip6tables-save`) of the reference pod.
    pub iptables_rules: String,
    /// What `redirector linkerd-proxy-init` printed, per run.
    pub redirector_log: String,
    pub elapsed: Duration,
}

impl CaseReport {
    /// The row of `who` (a client's name, `peer`, `peer@outside`) connecting to `dst` (as
    /// rendered: `svc4:80`, `pod6:8080`); panics when the case has no such row.
    pub fn row(&self, who: &str, dst: &str) -> &Row {
        self.rows
            .iter()
            .find(|r| r.who == who && r.dst == dst)
            .unwrap_or_else(|| panic!("{}: no row {who} -> {dst}", self.case.name))
    }

    /// The case header and one line per row.
    pub fn table(&self) -> String {
        let case = &self.case;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "== {}: {} run(s) {:?}; {} rows in {:.1} s",
            case.name,
            case.runs.len(),
            case.runs,
            self.rows.len(),
            self.elapsed.as_secs_f64()
        );
        for note in &case.notes {
            let _ = writeln!(out, "   note: {note}");
        }
        let _ = writeln!(
            out,
            "   {:<20} {:<13} {:<18} {:<30} {:<30} {:<30}",
            "case", "who", "dst", "contract", "iptables", "redirector"
        );
        for row in &self.rows {
            let mut flags = String::new();
            if !row.reference_agrees() {
                flags.push_str("  REFERENCE≠CONTRACT");
            }
            if !row.redirector_agrees() {
                flags.push_str("  MISMATCH");
            }
            let _ = writeln!(
                out,
                "   {:<20} {:<13} {:<18} {:<30} {:<30} {:<30}{flags}",
                case.name,
                row.who,
                row.dst,
                row.contract,
                row.iptables,
                row.redirector.as_deref().unwrap_or("-"),
            );
        }
        out
    }

    /// The rows where Linkerd's own rules under real iptables do not do what LINKERD.md §2
    /// says: a fault of the suite (rules or contract), reported with the rules as loaded.
    pub fn reference_failure(&self) -> Option<String> {
        let wrong: Vec<&Row> = self.rows.iter().filter(|r| !r.reference_agrees()).collect();
        if wrong.is_empty() {
            return None;
        }
        let mut out = format!(
            "{}: Linkerd's iptables rules disagree with LINKERD.md §2 in {} of {} rows \
             (the suite's fault, not redirector's; runs {:?}):\n",
            self.case.name,
            wrong.len(),
            self.rows.len(),
            self.case.runs
        );
        for row in wrong {
            let _ = writeln!(
                out,
                "  {} -> {}: contract {} | iptables {}",
                row.who, row.dst, row.contract, row.iptables
            );
        }
        let _ = write!(
            out,
            "reference nat rules as loaded:\n{}",
            self.iptables_rules
        );
        Some(out)
    }

    /// Everything that failed: the reference against the contract, then redirector against
    /// the reference, with the rules as loaded and redirector's log.
    pub fn failure(&self) -> Option<String> {
        let mismatches: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| !r.redirector_agrees())
            .collect();
        let reference = self.reference_failure();
        if mismatches.is_empty() {
            return reference;
        }
        let mut out = reference.map(|r| r + "\n").unwrap_or_default();
        let _ = writeln!(
            out,
            "{}: {} of {} connections differ between Linkerd's iptables rules and \
             `redirector linkerd-proxy-init` (runs {:?}):",
            self.case.name,
            mismatches.len(),
            self.rows.len(),
            self.case.runs
        );
        for row in mismatches {
            let _ = writeln!(
                out,
                "  {} -> {}: iptables {} | redirector {}",
                row.who,
                row.dst,
                row.iptables,
                row.redirector.as_deref().unwrap_or("-")
            );
        }
        let _ = write!(
            out,
            "reference nat rules as loaded:\n{}redirector log:\n{}",
            self.iptables_rules, self.redirector_log
        );
        Some(out)
    }
}

/// Runs `case` on the reference side only (iptables), with the contract beside it.
pub fn run_reference(case: &Case) -> CaseReport {
    let start = Instant::now();
    let reference = SideRun::run(case, Side::Iptables);
    report(case, reference, None, start)
}

/// Runs `case` on both sides, one fresh pod each, one after the other.
pub fn run_case(case: &Case) -> CaseReport {
    let start = Instant::now();
    let reference = SideRun::run(case, Side::Iptables);
    let ours = SideRun::run(case, Side::Redirector);
    report(case, reference, Some(ours), start)
}

fn report(case: &Case, reference: SideRun, ours: Option<SideRun>, start: Instant) -> CaseReport {
    let labels = row_labels(case);
    let rows = labels
        .into_iter()
        .enumerate()
        .map(|(i, (who, dst))| Row {
            who,
            dst,
            contract: reference.contract[i].clone(),
            iptables: reference.outcomes[i].clone(),
            redirector: ours.as_ref().map(|o| o.outcomes[i].clone()),
        })
        .collect();
    CaseReport {
        case: case.clone(),
        rows,
        iptables_rules: reference.log,
        redirector_log: ours.map(|o| o.log).unwrap_or_default(),
        elapsed: start.elapsed(),
    }
}

/// (who, dst) of every row, in run order.
fn row_labels(case: &Case) -> Vec<(String, String)> {
    let outbound = case
        .outbound_rows()
        .into_iter()
        .map(|r| (r.who.name, r.dst.to_string()));
    let inbound = case
        .inbound_rows()
        .into_iter()
        .map(|r| (r.from.label().to_owned(), r.dst.to_string()));
    outbound.chain(inbound).collect()
}

/// One side's outcomes and the contract's expectations, rendered with
/// [`AddrBook::render`], in row order.
struct SideRun {
    outcomes: Vec<String>,
    contract: Vec<String>,
    /// The rules as loaded (reference) or redirector's log.
    log: String,
}

impl SideRun {
    fn run(case: &Case, side: Side) -> Self {
        let pod = LinkerdPod::new(case, side);
        let topo = &pod.topo;
        let book = AddrBook::of(topo);
        let state = case.capture();
        let listeners = case.listeners();
        let contract = Contract {
            state: &state,
            listeners: &listeners,
        };
        let (mut outcomes, mut expected) = (Vec::new(), Vec::new());
        for row in case.outbound_rows() {
            let (uid, gid) = (row.who.uid, row.who.gid);
            let dst = book.resolve(row.dst);
            let outcome = connect_from(topo, Some(&topo.pod_cgroup), uid, gid, dst, None);
            outcomes.push(book.render(&outcome.landing()));
            expected.push(contract.outbound(uid, gid, row.dst));
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
            outcomes.push(book.render(&outcome.landing()));
            expected.push(contract.inbound(source, row.dst));
        }
        SideRun {
            outcomes,
            contract: expected,
            log: pod.log.clone(),
        }
    }
}

/// A pod set up for one side of a case. Fields drop in declaration order: the processes
/// first, then the pins (which detaches redirector's programs), then the namespaces and
/// the cgroup.
struct LinkerdPod {
    _servers: Vec<ChildGuard>,
    _pins: Option<PinRoot>,
    topo: Topology,
    log: String,
}

impl LinkerdPod {
    fn new(case: &Case, side: Side) -> Self {
        let hint = match side {
            Side::Iptables => "lkipt",
            Side::Redirector => "lkrdr",
        };
        let topo = Topology::new(hint);
        topo.add_service_addr(crate::scenario::OUTSIDE_V4.into());
        topo.add_service_addr(crate::scenario::OUTSIDE_V6.into());
        let mut servers = vec![start_peer(&topo, &case.listeners())];
        // Set up first, as the init container (or the CNI plugin) runs before the proxy
        // and the app.
        let (pins, log) = match side {
            Side::Iptables => {
                apply_reference(&topo.pod, case);
                (None, reference_rules_as_loaded(&topo.pod, case))
            }
            Side::Redirector => {
                let pins = PinRoot::new(hint);
                let log = install(&topo.pod, &topo.pod_cgroup, &pins, case);
                assert_no_nat_rules(&topo.pod, case, &log);
                (Some(pins), log)
            }
        };
        servers.extend(start_pod_servers(&topo, case));
        LinkerdPod {
            _servers: servers,
            _pins: pins,
            topo,
            log,
        }
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

fn wildcard(family: Family, port: u16) -> SocketAddr {
    match family {
        Family::V4 => SocketAddr::new([0, 0, 0, 0].into(), port),
        Family::V6 => SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port),
    }
}

/// The peer: answers on the case's service ports on all its addresses (the outside ones
/// included), both families.
fn start_peer(topo: &Topology, listeners: &Listeners) -> ChildGuard {
    let mut peer = ProbeServer::serve(&topo.service, SERVICE);
    for port in &listeners.service_ports {
        for family in Family::BOTH {
            peer = peer.listen(wildcard(family, *port));
        }
    }
    peer.start()
}

/// The proxy's two listeners (as the case's proxy owner) and the app (uid 1000), in the
/// pod's netns and cgroup. The proxy listens as Linkerd's does: outbound on 127.0.0.1 (and
/// ::1 where IPv6 is captured), inbound on every address of the captured families.
fn start_pod_servers(topo: &Topology, case: &Case) -> Vec<ChildGuard> {
    let state = case.capture();
    let owner = case.proxy_owner();
    let (v4, v6) = (&state.v4, state.v6.as_ref());
    let mut outbound = ProbeServer::proxy(&topo.pod, OUTBOUND_PROXY).listen(SocketAddr::new(
        [127, 0, 0, 1].into(),
        v4.outgoing_proxy_port,
    ));
    if let Some(v6) = v6 {
        outbound = outbound.listen(SocketAddr::new(
            Ipv6Addr::LOCALHOST.into(),
            v6.outgoing_proxy_port,
        ));
    }
    let outbound = outbound
        .cgroup(&topo.pod_cgroup)
        .user(owner.0, owner.1)
        .start();
    let inbound = match case.inbound_listener {
        InboundListener::PerFamily => {
            let mut inbound = ProbeServer::proxy(&topo.pod, INBOUND_PROXY)
                .listen(wildcard(Family::V4, v4.incoming_proxy_port));
            if let Some(v6) = v6 {
                inbound = inbound.listen(wildcard(Family::V6, v6.incoming_proxy_port));
            }
            inbound
                .cgroup(&topo.pod_cgroup)
                .user(owner.0, owner.1)
                .start()
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
    let mut app = ProbeServer::serve(&topo.pod, APP);
    for port in &case.listeners().app_ports {
        for family in Family::BOTH {
            app = app.listen(wildcard(family, *port));
        }
    }
    let app = app.cgroup(&topo.pod_cgroup).user(APP_UID, APP_UID).start();
    vec![outbound, inbound, app]
}
