//! Running the `dnsprobe` binary: DNS servers and the stand-in for istio's DNS proxy inside a
//! test's namespaces, one-shot DNS clients (hand-built queries; resolver libraries with a
//! resolv.conf of the test's bind-mounted over /etc/resolv.conf), and those resolv.conf files.
//!
//! Two resolver libraries, because they differ in the check that matters for DNS capture:
//! both use a *connected* UDP socket, which the capture rewrites to the proxy, so the
//! kernel's own peer filter lets the proxy's replies through; then glibc (2.36 here) takes
//! the reply whatever source `recvfrom` reports, while c-ares (node's `dns.Resolver`, also
//! used by curl and grpc) drops a reply whose source is not the server it asked — so only
//! c-ares fails when the reply's source is not restored.

pub mod net;
pub mod protocol;
pub mod wire;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::dns::protocol::{parse_listening, DnsOutcome};
use crate::paths::BinChoice;
use crate::probe::{run_client, InNetNs};
use crate::{unique_name, Cgroup, ChildGuard, NetNs, Spawn, EVENTUALLY};

pub const DNS_PORT: u16 = 53;
/// istio's DNS proxy port (redirector's `DNS_CAPTURE_PORT`), where captured DNS lands.
pub const DNS_PROXY_PORT: u16 = 15053;
/// The name every test asks for (any name gets the server's answer).
pub const QUERY_NAME: &str = "svc.rdt.test";
/// A client's reply timeout, and glibc's (`options timeout:1 attempts:1`): a query nobody
/// answers costs this much.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(1);
const READY_TIMEOUT: Duration = EVENTUALLY;

/// The stand-in proxy's answers: a client that gets these went through the proxy.
pub const PROXY_ANSWER_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);
pub const PROXY_ANSWER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x53);

static DNSPROBE: BinChoice = BinChoice::new("dnsprobe");

/// Makes the kit use this dnsprobe binary (`use_dnsprobe_bin(env!("CARGO_BIN_EXE_dnsprobe"))`
/// in an integration test of this crate). The first call wins.
pub fn use_dnsprobe_bin(path: impl Into<PathBuf>) {
    DNSPROBE.use_bin(path);
}

/// The binary given to [`use_dnsprobe_bin`], else env `DNSPROBE_BIN`, else the newest build.
pub fn dnsprobe_bin() -> PathBuf {
    DNSPROBE.path()
}

/// Builder for `dnsprobe server` / `dnsprobe proxy` inside a netns.
#[derive(Debug, Clone)]
pub struct DnsServer {
    spawn: Spawn,
    listeners: usize,
}

impl DnsServer {
    /// A DNS server answering A queries with `v4` and AAAA ones with `v6`.
    pub fn server(netns: &NetNs, name: &str, v4: Ipv4Addr, v6: Option<Ipv6Addr>) -> Self {
        Self::new("server", netns, name, v4, v6)
    }

    /// The stand-in for istio's DNS proxy: relays to `upstream` over the query's protocol and
    /// answers with [`PROXY_ANSWER_V4`] / [`PROXY_ANSWER_V6`] instead of the upstream's
    /// addresses, after the upstream answered.
    pub fn proxy(netns: &NetNs, name: &str, upstream: SocketAddr) -> Self {
        let mut proxy = Self::new("proxy", netns, name, PROXY_ANSWER_V4, Some(PROXY_ANSWER_V6));
        proxy.spawn = proxy.spawn.args(["--upstream", &upstream.to_string()]);
        proxy
    }

    fn new(role: &str, netns: &NetNs, name: &str, v4: Ipv4Addr, v6: Option<Ipv6Addr>) -> Self {
        let mut spawn = Spawn::new(dnsprobe_bin())
            .args([role, "--name", name, "--answer", &v4.to_string()])
            .netns(netns);
        if let Some(v6) = v6 {
            spawn = spawn.args(["--answer", &v6.to_string()]);
        }
        DnsServer {
            spawn,
            listeners: 0,
        }
    }

    /// UDP and TCP on `addr`.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.spawn = self.spawn.args(["--listen", &addr.to_string()]);
        self.listeners += 1;
        self
    }

    /// The proxy's two listeners, as istio's agent has them: 127.0.0.1 and ::1, port 15053.
    pub fn listen_proxy_port(self) -> Self {
        self.listen(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), DNS_PROXY_PORT))
            .listen(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), DNS_PROXY_PORT))
    }

    pub fn cgroup(mut self, cgroup: &Cgroup) -> Self {
        self.spawn = self.spawn.cgroup(cgroup);
        self
    }

    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.spawn = self.spawn.user(uid, gid);
        self
    }

    /// Starts it and waits until every listener (UDP and TCP per address) is ready.
    pub fn start(self) -> ChildGuard {
        assert!(
            self.listeners > 0,
            "`{}` has no --listen",
            self.spawn.describe()
        );
        let child = self.spawn.spawn();
        for _ in 0..self.listeners * 2 {
            child.wait_line("a `listening` line", READY_TIMEOUT, |l| {
                parse_listening(l).is_some()
            });
        }
        child
    }
}

/// How a client sends its query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DnsMode {
    /// `sendto` on an unconnected UDP socket (redirector: the sendmsg hook).
    Udp,
    /// `connect` + `send` on a UDP socket (redirector: the connect hook), as glibc does.
    UdpConnected,
    /// DNS over TCP (redirector: the connect hook).
    Tcp,
}

impl DnsMode {
    pub const ALL: [DnsMode; 3] = [DnsMode::Udp, DnsMode::UdpConnected, DnsMode::Tcp];
}

impl fmt::Display for DnsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DnsMode::Udp => "udp",
            DnsMode::UdpConnected => "udp-connected",
            DnsMode::Tcp => "tcp",
        })
    }
}

/// Who runs a client, and where: the netns of `target`, optionally a cgroup, as `uid`/`gid`.
#[derive(Clone, Copy, Debug)]
pub struct DnsClient<'a> {
    pub netns: &'a NetNs,
    pub cgroup: Option<&'a Cgroup>,
    pub uid: u32,
    pub gid: u32,
}

impl<'a> DnsClient<'a> {
    pub fn new(target: &'a impl InNetNs, cgroup: Option<&'a Cgroup>, uid: u32, gid: u32) -> Self {
        DnsClient {
            netns: target.netns(),
            cgroup,
            uid,
            gid,
        }
    }

    fn spawn(&self, args: &[&str]) -> Spawn {
        self.spawn_of(&dnsprobe_bin(), args)
    }

    /// `program` with `args` run as this client.
    fn spawn_of(&self, program: &Path, args: &[&str]) -> Spawn {
        let mut spawn = Spawn::new(program)
            .args(args)
            .netns(self.netns)
            .user(self.uid, self.gid);
        if let Some(cgroup) = self.cgroup {
            spawn = spawn.cgroup(cgroup);
        }
        spawn
    }

    /// One hand-built A query for [`QUERY_NAME`] to `server`.
    pub fn query(&self, server: SocketAddr, mode: DnsMode) -> DnsOutcome {
        let timeout = QUERY_TIMEOUT.as_millis().to_string();
        let server = server.to_string();
        let mut args = vec!["query", &server, QUERY_NAME, "--timeout-ms", &timeout];
        match mode {
            DnsMode::Udp => {}
            DnsMode::UdpConnected => args.push("--connect"),
            DnsMode::Tcp => args.push("--tcp"),
        }
        run(&self.spawn(&args))
    }

    /// glibc's `getaddrinfo(QUERY_NAME)` (any family) with `resolv_conf` bind-mounted over
    /// /etc/resolv.conf; over TCP when the file says `use-vc`.
    pub fn resolve(&self, resolv_conf: &ResolvConf) -> DnsOutcome {
        let mut args = vec!["resolve", QUERY_NAME];
        if resolv_conf.use_vc {
            args.push("--tcp");
        }
        let spawn = self
            .spawn(&args)
            .bind_file(&resolv_conf.path, "/etc/resolv.conf");
        run(&spawn)
    }
}

/// c-ares through node: `dns.Resolver` reads /etc/resolv.conf (nameservers; its timeout
/// options are given here, as c-ares would otherwise wait ~12 s before giving up) and
/// resolves A records. Prints a line in the `dnsprobe` protocol, exits 0 or 2 like it.
const NODE_RESOLVE: &str = r#"
const dns = require('dns');
const [name, timeout] = process.argv.slice(1);
const resolver = new dns.Resolver({ timeout: Number(timeout), tries: 1 });
resolver.resolve4(name, (err, addrs) => {
  const servers = resolver.getServers().join(',');
  if (err) {
    console.log(`error cares:${err.code} ${err.message}`);
    process.exitCode = 2;
  } else {
    console.log(`resolved addrs=${addrs.join(',')} servers=${servers}`);
  }
});
"#;

/// The `node` executable on PATH, if there is one.
pub fn node_bin() -> Option<PathBuf> {
    crate::find_on_path("node")
}

/// Call in a test that needs node (c-ares): `let Some(node) = require_node() else { return };`.
/// Without node the test is skipped with a note, except under CI (env `CI`), where it fails.
pub fn require_node() -> Option<PathBuf> {
    let node = node_bin();
    if node.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "this test needs node (Debian package nodejs), and CI is set: refusing to skip"
        );
        eprintln!("note: skipping the c-ares checks (no node on PATH)");
    }
    node
}

impl DnsClient<'_> {
    /// c-ares's `resolve4(QUERY_NAME)` with `resolv_conf` bind-mounted over /etc/resolv.conf.
    pub fn resolve_c_ares(&self, node: &Path, resolv_conf: &ResolvConf) -> DnsOutcome {
        let timeout = QUERY_TIMEOUT.as_millis().to_string();
        let spawn = (self.spawn_of(node, &["-e", NODE_RESOLVE, QUERY_NAME, &timeout]))
            .bind_file(&resolv_conf.path, "/etc/resolv.conf");
        run(&spawn)
    }
}

/// Runs a client to completion and parses its line; panics on a broken client.
fn run(spawn: &Spawn) -> DnsOutcome {
    DnsOutcome::parse(&run_client(spawn))
}

/// A resolv.conf for a test's clients (and redirector's `--resolv-conf`), in the temp dir,
/// removed on drop. glibc gives up on a server after one second and one attempt.
#[derive(Debug)]
pub struct ResolvConf {
    path: PathBuf,
    pub servers: Vec<IpAddr>,
    pub use_vc: bool,
}

impl ResolvConf {
    pub fn new(hint: &str, servers: &[IpAddr], use_vc: bool) -> Self {
        let path = std::env::temp_dir().join(format!("{}.resolv.conf", unique_name(hint)));
        let mut text = String::from("# written by redirector's tests\n");
        for server in servers {
            text.push_str(&format!("nameserver {server}\n"));
        }
        text.push_str(if use_vc {
            "options timeout:1 attempts:1 use-vc\n"
        } else {
            "options timeout:1 attempts:1\n"
        });
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        ResolvConf {
            path,
            servers: servers.to_vec(),
            use_vc,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ResolvConf {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
