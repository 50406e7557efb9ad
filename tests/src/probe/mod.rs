//! Running the `probe` binary: servers that report readiness, and one-shot clients.

pub mod protocol;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::paths::BinChoice;
use crate::probe::protocol::{parse_listening, ConnOutcome};
use crate::{Cgroup, ChildGuard, NetNs, Spawn, Topology, EVENTUALLY};

/// How long a server may take to report all its listeners.
const READY_TIMEOUT: Duration = EVENTUALLY;

/// The client's connect timeout: a dropped SYN shows up as `error timeout` after it. The
/// handshake itself is the kernel's, with no server process to be scheduled for it.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a client, once connected, waits for the listener's reply line, and a proxy for
/// a held connection's next request (`probe hold`). Both need a process scheduled, which a
/// starved emulated guest can delay for seconds; no test expects either to time out.
pub const REPLY_TIMEOUT: Duration = EVENTUALLY;

/// Anything a client can run in: a [`NetNs`], or a [`Topology`] (its pod namespace).
pub trait InNetNs {
    fn netns(&self) -> &NetNs;
}

impl InNetNs for NetNs {
    fn netns(&self) -> &NetNs {
        self
    }
}

impl InNetNs for Topology {
    fn netns(&self) -> &NetNs {
        &self.pod
    }
}

static PROBE: BinChoice = BinChoice::new("probe");

/// Makes the kit use this probe binary, e.g. `use_probe_bin(env!("CARGO_BIN_EXE_probe"))` in
/// an integration test of this crate: exactly the binary cargo built for the test run. The
/// first call wins (later calls with another path panic), so parallel tests agree.
pub fn use_probe_bin(path: impl Into<PathBuf>) {
    PROBE.use_bin(path);
}

/// Path of the probe binary: the one given to [`use_probe_bin`], else env `PROBE_BIN`, else
/// the newest build in the target dir.
pub fn probe_bin() -> PathBuf {
    PROBE.path()
}

/// Builder for `probe serve` / `probe proxy` inside a netns.
///
/// ```no_run
/// # use redirector_tests::*;
/// # let topo = Topology::new("doc");
/// let proxy = ProbeServer::proxy(&topo.pod, "outbound")
///     .listen("127.0.0.1:15001".parse().unwrap())
///     .cgroup(&topo.pod_cgroup)
///     .user(PROXY_UID, PROXY_UID)
///     .start();
/// ```
#[derive(Debug, Clone)]
pub struct ProbeServer {
    spawn: Spawn,
    name: String,
    listeners: usize,
}

impl ProbeServer {
    /// `probe serve`: answers every connection itself (`served …`).
    pub fn serve(netns: &NetNs, name: &str) -> Self {
        Self::new("serve", netns, name)
    }

    /// `probe proxy`: reports `SO_ORIGINAL_DST` of every connection (`proxied …`).
    pub fn proxy(netns: &NetNs, name: &str) -> Self {
        Self::new("proxy", netns, name)
    }

    fn new(role: &str, netns: &NetNs, name: &str) -> Self {
        let spawn = Spawn::new(probe_bin())
            .args([role, "--name", name])
            .netns(netns);
        ProbeServer {
            spawn,
            name: name.to_owned(),
            listeners: 0,
        }
    }

    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.spawn = self.spawn.arg("--listen").arg(addr.to_string());
        self.listeners += 1;
        self
    }

    /// Proxy only: connect on to the original destination and report what answered there.
    pub fn forward(mut self) -> Self {
        self.spawn = self.spawn.arg("--forward");
        self
    }

    /// Create the listeners from inside `cgroup` (the proxy's accepted sockets belong to the
    /// listener's cgroup, which decides which cgroup programs answer its getsockopt).
    pub fn cgroup(mut self, cgroup: &Cgroup) -> Self {
        self.spawn = self.spawn.cgroup(cgroup);
        self
    }

    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.spawn = self.spawn.user(uid, gid);
        self
    }

    /// Run in the user namespace at `path`, [`user`](Self::user)'s ids inside it.
    pub fn userns(mut self, path: impl Into<PathBuf>) -> Self {
        self.spawn = self.spawn.userns(path);
        self
    }

    /// Starts it and waits until every listener is ready; returns the guard and the bound
    /// addresses (with real ports where 0 was asked for) in `--listen` order.
    pub fn start_with_addrs(self) -> (ChildGuard, Vec<SocketAddr>) {
        assert!(
            self.listeners > 0,
            "probe server {} has no listen address",
            self.name
        );
        let child = self.spawn.spawn();
        let addrs = (0..self.listeners)
            .map(|_| {
                let line = child.wait_line("a `listening` line", READY_TIMEOUT, |l| {
                    parse_listening(l).is_some()
                });
                parse_listening(&line).expect("checked by the predicate").1
            })
            .collect();
        (child, addrs)
    }

    /// Starts it and waits until every listener is ready.
    pub fn start(self) -> ChildGuard {
        self.start_with_addrs().0
    }
}

/// Runs `probe connect dst` inside `target`'s netns (and `cgroup`, as `uid`/`gid`, bound to
/// `bind` when given) and returns what the connection landed on.
pub fn connect_from(
    target: &impl InNetNs,
    cgroup: Option<&Cgroup>,
    uid: u32,
    gid: u32,
    dst: SocketAddr,
    bind: Option<IpAddr>,
) -> ConnOutcome {
    let mut spawn = connect_spawn(target, uid, gid, dst);
    if let Some(cgroup) = cgroup {
        spawn = spawn.cgroup(cgroup);
    }
    if let Some(bind) = bind {
        spawn = spawn.arg("--bind").arg(bind.to_string());
    }
    ConnOutcome::parse(&run_client(&spawn))
}

/// [`connect_from`] in `cgroup`, inside the user namespace at `userns` as its `uid`/`gid`.
pub fn connect_in_user_ns(
    target: &impl InNetNs,
    cgroup: &Cgroup,
    userns: &std::path::Path,
    uid: u32,
    gid: u32,
    dst: SocketAddr,
) -> ConnOutcome {
    let spawn = connect_spawn(target, uid, gid, dst)
        .cgroup(cgroup)
        .userns(userns);
    ConnOutcome::parse(&run_client(&spawn))
}

fn connect_spawn(target: &impl InNetNs, uid: u32, gid: u32, dst: SocketAddr) -> Spawn {
    Spawn::new(probe_bin())
        .args(["connect", &dst.to_string(), "--timeout-ms"])
        .arg(CONNECT_TIMEOUT.as_millis().to_string())
        .netns(target.netns())
        .user(uid, gid)
}

/// Runs a client (`probe connect`, a `dnsprobe` client) to completion and returns its stdout;
/// panics on a broken client. Exit 0 = an answer, 2 = an error it reported (see
/// [`client_exit`](crate::probe::protocol::client_exit)); anything else is a broken client.
pub(crate) fn run_client(spawn: &Spawn) -> String {
    let output = spawn.output();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !matches!(output.status.code(), Some(0 | 2)) {
        panic!(
            "`{}` failed ({}): {}{}",
            spawn.describe(),
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    stdout.into_owned()
}
