//! The twin-pod differential harness of both conformance suites (istio's and Linkerd's): the
//! same connections in two fresh pods, one with the mesh's own rules for the case loaded by
//! `iptables-restore` / `ip6tables-restore` (the reference), one set up by the redirector
//! command under test, and a row per connection pairing where it landed. A [`Mesh`] brings
//! what differs between the suites: the reference rules, the command, the servers, the rows.
//!
//! Only the landing is compared: which listener took the connection and the
//! `SO_ORIGINAL_DST` the proxy read. The proxy's peer address is left out on purpose: with
//! iptables' REDIRECT the proxy sees the app's pod IP, with redirector's connect-time rewrite
//! 127.0.0.1 / ::1 (docs/conformance.md).

use std::fmt::Write as _;
use std::net::{Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::redirector::PinRoot;
use crate::scenario::{Family, OUTSIDE_V4, OUTSIDE_V6};
use crate::{ChildGuard, ProbeServer, Topology, APP_UID};

/// Names of the listeners, so the landing port is visible in every row.
pub const OUTBOUND_PROXY: &str = "outbound";
pub const INBOUND_PROXY: &str = "inbound";
pub const APP: &str = "app";
pub const SERVICE: &str = "svc";
pub const DNS_PROXY: &str = "dns-proxy";

/// One test function per case of a suite's table, each running `$check(case name)`, and
/// `TESTED`: the cases they run, which a test holds to be exactly the table.
#[macro_export]
macro_rules! case_tests {
    ($check:ident: $($test:ident => $case:literal,)*) => {
        const TESTED: &[&str] = &[$($case),*];
        $(
            #[test]
            fn $test() {
                $check($case);
            }
        )*
    };
}

/// Which implementation a pod is set up with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The mesh's own rules for the case, loaded with iptables-restore / ip6tables-restore.
    Iptables,
    /// The redirector command under test, with the case's command line.
    Redirector,
}

/// What a suite plugs into the harness. A pod's life: [`Mesh::prepare`] (the peer and what
/// the pod has before its capture set-up), the set-up of its side, [`Mesh::start_servers`]
/// (the proxy and the app start after it, as after an init container), [`Mesh::connect`].
pub trait Mesh {
    type Case: Clone + std::fmt::Debug;
    /// What a pod of this mesh holds besides the harness's own (istio: its resolv.conf).
    type PodState;
    /// Prefix of the pods' names: `<prefix>ipt`, `<prefix>rdr`.
    const PREFIX: &'static str;
    /// The reference, as failure messages name it.
    const REFERENCE: &'static str;
    /// The command under test, as failure messages name it.
    const UNDER_TEST: &'static str;
    /// Where the contract a row's `contract` column follows is written.
    const CONTRACT: &'static str = "";

    fn name(case: &Self::Case) -> &str;
    /// The case's command line as the table's header and a failure show it.
    fn describe(case: &Self::Case) -> String;
    fn notes(case: &Self::Case) -> Vec<&str>;
    /// The servers that run before the set-up (the peer) and the pod's own state.
    fn prepare(
        &self,
        case: &Self::Case,
        side: Side,
        topo: &Topology,
        hint: &str,
    ) -> (Vec<ChildGuard>, Self::PodState);
    /// Loads the reference rules into the pod; returns them as loaded, for a failure's reader.
    fn apply_reference(&self, case: &Self::Case, topo: &Topology) -> String;
    /// Runs the command under test for the pod; returns its log, panics unless it succeeds.
    fn install(
        &self,
        case: &Self::Case,
        topo: &Topology,
        pins: &PinRoot,
        state: &Self::PodState,
    ) -> String;
    /// The pod's proxy listeners and app.
    fn start_servers(&self, case: &Self::Case, topo: &Topology) -> Vec<ChildGuard>;
    /// Every row's connection, made in the pod.
    fn connect(&self, case: &Self::Case, pod: &TwinPod<Self::PodState>) -> Vec<Outcome>;
    /// Whether redirector's outcome differs from the reference's only as documented.
    fn documented_difference(_row: &Row, _redirector: &str) -> bool {
        false
    }
}

/// A pod set up for one side of a case. Fields drop in declaration order: the processes
/// first, then the pins (which detaches redirector's programs), the mesh's state, then the
/// namespaces and the cgroup.
pub struct TwinPod<S> {
    _servers: Vec<ChildGuard>,
    _pins: Option<PinRoot>,
    pub state: S,
    pub topo: Topology,
}

/// One connection a side made: who made it to where, where it landed (rendered with
/// [`crate::scenario::AddrBook::render`]), and what the mesh's contract expects, where it
/// has one.
pub struct Outcome {
    pub who: String,
    pub dst: String,
    pub landing: String,
    pub contract: Option<String>,
}

impl Outcome {
    pub fn new(who: &str, dst: impl std::fmt::Display, landing: String) -> Self {
        let (who, dst, contract) = (who.to_owned(), dst.to_string(), None);
        Outcome {
            who,
            dst,
            landing,
            contract,
        }
    }
}

/// One connection's outcome: expected, and on each side that ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub who: String,
    pub dst: String,
    /// What the mesh's documented contract says, where it has one.
    pub contract: Option<String>,
    pub iptables: String,
    /// `None` when only the reference side ran.
    pub redirector: Option<String>,
}

impl Row {
    pub fn reference_agrees(&self) -> bool {
        self.contract.as_ref().is_none_or(|c| *c == self.iptables)
    }
}

/// The rows of one case and what is needed to understand a mismatch.
pub struct CaseReport<M: Mesh> {
    pub case: M::Case,
    pub rows: Vec<Row>,
    /// The reference pod's rules as loaded.
    pub iptables_rules: String,
    /// What the command under test printed.
    pub redirector_log: String,
    pub elapsed: Duration,
}

/// Runs `case` on the reference side, then (with `both`) on redirector's, one fresh pod
/// each, and pairs the outcomes.
pub fn run_case<M: Mesh>(mesh: &M, case: &M::Case, both: bool) -> CaseReport<M> {
    let start = Instant::now();
    let (reference, iptables_rules) = run_side(mesh, case, Side::Iptables);
    let ours = both.then(|| run_side(mesh, case, Side::Redirector));
    let rows = reference
        .into_iter()
        .enumerate()
        .map(|(i, outcome)| Row {
            who: outcome.who,
            dst: outcome.dst,
            contract: outcome.contract,
            iptables: outcome.landing,
            redirector: ours.as_ref().map(|(o, _)| o[i].landing.clone()),
        })
        .collect();
    CaseReport {
        case: case.clone(),
        rows,
        iptables_rules,
        redirector_log: ours.map(|(_, log)| log).unwrap_or_default(),
        elapsed: start.elapsed(),
    }
}

/// One side's outcomes in row order, and its log: the rules as loaded or redirector's.
fn run_side<M: Mesh>(mesh: &M, case: &M::Case, side: Side) -> (Vec<Outcome>, String) {
    let hint = match side {
        Side::Iptables => format!("{}ipt", M::PREFIX),
        Side::Redirector => format!("{}rdr", M::PREFIX),
    };
    let topo = Topology::new(&hint);
    topo.add_service_addr(OUTSIDE_V4.into());
    topo.add_service_addr(OUTSIDE_V6.into());
    let (mut servers, state) = mesh.prepare(case, side, &topo, &hint);
    // Set up first, as an init container (or the CNI plugin) runs before the proxy and app.
    let (pins, log) = match side {
        Side::Iptables => (None, mesh.apply_reference(case, &topo)),
        Side::Redirector => {
            let pins = PinRoot::new(&hint);
            let log = mesh.install(case, &topo, &pins, &state);
            (Some(pins), log)
        }
    };
    servers.extend(mesh.start_servers(case, &topo));
    let pod = TwinPod {
        _servers: servers,
        _pins: pins,
        state,
        topo,
    };
    (mesh.connect(case, &pod), log)
}

impl<M: Mesh> CaseReport<M> {
    /// The row of `who` (a client's name, `peer`, `peer@outside`) connecting to `dst` (as
    /// rendered: `svc4:80`, `pod6:8080`); panics when the case has no such row.
    pub fn row(&self, who: &str, dst: &str) -> &Row {
        self.rows
            .iter()
            .find(|r| r.who == who && r.dst == dst)
            .unwrap_or_else(|| panic!("{}: no row {who} -> {dst}", M::name(&self.case)))
    }

    /// redirector's outcome is the reference's, or differs only as the mesh documents.
    pub fn redirector_agrees(row: &Row) -> bool {
        row.redirector
            .as_ref()
            .is_none_or(|r| *r == row.iptables || M::documented_difference(row, r))
    }

    pub fn mismatches(&self) -> Vec<&Row> {
        let rows = self.rows.iter();
        rows.filter(|r| !Self::redirector_agrees(r)).collect()
    }

    /// The case header and one line per row.
    pub fn table(&self) -> String {
        let name = M::name(&self.case);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "== {name}: {}; {} rows in {:.1} s",
            M::describe(&self.case),
            self.rows.len(),
            self.elapsed.as_secs_f64()
        );
        for note in M::notes(&self.case) {
            let _ = writeln!(out, "   note: {note}");
        }
        let contract = |c: Option<&str>| {
            if M::CONTRACT.is_empty() {
                String::new()
            } else {
                format!(" {:<30}", c.unwrap_or("-"))
            }
        };
        let _ = writeln!(
            out,
            "   {:<42} {:<22} {:<32}{} {:<30} {:<30}",
            "case",
            "who",
            "dst",
            contract(Some("contract")),
            "iptables",
            "redirector"
        );
        for row in &self.rows {
            let mut flags = String::new();
            if !row.reference_agrees() {
                flags.push_str("  REFERENCE≠CONTRACT");
            }
            if !Self::redirector_agrees(row) {
                flags.push_str("  MISMATCH");
            }
            let _ = writeln!(
                out,
                "   {name:<42} {:<22} {:<32}{} {:<30} {:<30}{flags}",
                row.who,
                row.dst,
                contract(row.contract.as_deref()),
                row.iptables,
                row.redirector.as_deref().unwrap_or("-"),
            );
        }
        out
    }

    /// The rows where the mesh's own rules under real iptables do not do what its contract
    /// says: a fault of the suite (rules or contract), reported with the rules as loaded.
    pub fn reference_failure(&self) -> Option<String> {
        let wrong: Vec<&Row> = self.rows.iter().filter(|r| !r.reference_agrees()).collect();
        if wrong.is_empty() {
            return None;
        }
        let mut out = format!(
            "{}: {} disagree with {} in {} of {} rows (the suite's fault, not redirector's; \
             {}):\n",
            M::name(&self.case),
            M::REFERENCE,
            M::CONTRACT,
            wrong.len(),
            self.rows.len(),
            M::describe(&self.case)
        );
        for row in wrong {
            let contract = row.contract.as_deref().unwrap_or("-");
            let _ = writeln!(
                out,
                "  {} -> {}: contract {contract} | iptables {}",
                row.who, row.dst, row.iptables
            );
        }
        let _ = write!(out, "reference rules as loaded:\n{}", self.iptables_rules);
        Some(out)
    }

    /// Prints the table, then fails with [`CaseReport::failure`] if anything failed.
    #[track_caller]
    pub fn assert_conforms(&self) {
        println!("{}", self.table());
        if let Some(failure) = self.failure() {
            panic!("{failure}");
        }
    }

    /// Everything that failed: the reference against the contract, then redirector against
    /// the reference, with the rules as loaded and redirector's log.
    pub fn failure(&self) -> Option<String> {
        let mismatches = self.mismatches();
        let reference = self.reference_failure();
        if mismatches.is_empty() {
            return reference;
        }
        let mut out = reference.map(|r| r + "\n").unwrap_or_default();
        let _ = writeln!(
            out,
            "{}: {} of {} rows differ between {} and `{}` ({}):",
            M::name(&self.case),
            mismatches.len(),
            self.rows.len(),
            M::REFERENCE,
            M::UNDER_TEST,
            M::describe(&self.case)
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
            "reference rules as loaded:\n{}redirector log:\n{}",
            self.iptables_rules, self.redirector_log
        );
        Some(out)
    }
}

/// `0.0.0.0:<port>` or `[::]:<port>`.
pub fn wildcard(family: Family, port: u16) -> SocketAddr {
    match family {
        Family::V4 => SocketAddr::new([0, 0, 0, 0].into(), port),
        Family::V6 => SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port),
    }
}

/// The peer: answers on `ports` on all its addresses (the outside ones included), both
/// families.
pub fn start_peer<'a>(topo: &Topology, ports: impl IntoIterator<Item = &'a u16>) -> ChildGuard {
    let mut peer = ProbeServer::serve(&topo.service, SERVICE);
    for port in ports {
        for family in Family::BOTH {
            peer = peer.listen(wildcard(family, *port));
        }
    }
    peer.start()
}

/// The app (uid 1000) on `ports`, both families, in the pod's netns and cgroup.
pub fn start_app<'a>(topo: &Topology, ports: impl IntoIterator<Item = &'a u16>) -> ChildGuard {
    let mut app = ProbeServer::serve(&topo.pod, APP);
    for port in ports {
        for family in Family::BOTH {
            app = app.listen(wildcard(family, *port));
        }
    }
    app.cgroup(&topo.pod_cgroup).user(APP_UID, APP_UID).start()
}

/// A proxy listener named `name` on `addrs`, as `owner` in the pod's netns and cgroup.
pub fn start_proxy(
    topo: &Topology,
    name: &str,
    addrs: impl IntoIterator<Item = SocketAddr>,
    owner: (u32, u32),
) -> ChildGuard {
    let mut proxy = ProbeServer::proxy(&topo.pod, name);
    for addr in addrs {
        proxy = proxy.listen(addr);
    }
    proxy
        .cgroup(&topo.pod_cgroup)
        .user(owner.0, owner.1)
        .start()
}
