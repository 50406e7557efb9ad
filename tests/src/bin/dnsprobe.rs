//! `dnsprobe`: a DNS server, a stand-in for istio's DNS proxy, and DNS clients for
//! redirector's tests. One line per event on stdout, in the formats of
//! `redirector_tests::dns::protocol`.
//!
//! ```text
//! dnsprobe server  --listen ADDR:PORT [--listen …] --answer IP [--answer IP6] [--name NAME]
//! dnsprobe proxy   --listen ADDR:PORT [--listen …] --upstream ADDR:PORT --answer IP [--answer IP6]
//!                  [--name NAME] [--timeout-ms N]
//! dnsprobe resolve NAME [--tcp] [--family 4|6|any]
//! dnsprobe query   SERVER:PORT NAME [--tcp] [--connect] [--aaaa] [--bind IP] [--timeout-ms N]
//! ```
//! Servers listen on UDP and TCP at every `--listen` address. `server` answers A queries with
//! its IPv4 `--answer` and AAAA ones with its IPv6 `--answer` (none without one). `proxy`
//! relays each query to `--upstream` over the same protocol and replaces the addresses in
//! the answer with its own, so a client can tell that its query went through it.
//! `resolve` uses glibc (`getaddrinfo`) with the /etc/resolv.conf it sees; `--tcp` only
//! checks that it says `options use-vc`. `query` sends one hand-built query, over UDP with
//! `sendto` on an unconnected socket (or `connect` + `send` with `--connect`) and prints the
//! reply's source as `recvfrom` returns it, or over TCP.
//! Clients exit 0 on an answer, 2 on an error, 64 on a usage error.

use std::ffi::{CStr, CString};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, CommandFactory, Parser};
use hickory_proto::op::{Message, MessageType};
use hickory_proto::rr::RecordType;
use redirector_tests::dns::net::{bind_udp, read_frame, write_frame, Frame};
use redirector_tests::dns::protocol::{
    self as protocol, client_exit, dns_error_kind, emit, error_kind, io_error_line, millis,
    server_name, usage_exit,
};
use redirector_tests::dns::wire;
use redirector_tests::sockaddr;

const DEFAULT_TIMEOUT_MS: &str = "2000";
/// How long a server waits for the next query on an idle TCP connection.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// The addresses a server or proxy puts in its answers.
#[derive(Clone, Copy, Debug)]
struct Answers {
    v4: Ipv4Addr,
    v6: Option<Ipv6Addr>,
}

#[derive(Parser, Debug)]
#[command(
    name = "dnsprobe",
    about = "DNS servers and clients for redirector's tests"
)]
enum Cmd {
    /// Answer A queries with the IPv4 --answer, AAAA ones with the IPv6 one.
    Server {
        #[command(flatten)]
        server: ServerArgs,
        #[arg(long, value_parser = server_name, default_value = "dns")]
        name: String,
    },
    /// Relay each query to --upstream and put the --answer addresses in its reply.
    Proxy {
        #[command(flatten)]
        server: ServerArgs,
        #[arg(long, value_parser = server_name, default_value = "dns-proxy")]
        name: String,
        #[arg(long)]
        upstream: SocketAddr,
        #[arg(long = "timeout-ms", value_parser = millis, default_value = DEFAULT_TIMEOUT_MS)]
        timeout: Duration,
    },
    /// Resolve NAME through glibc (`getaddrinfo`).
    Resolve {
        name: String,
        /// Only checks that /etc/resolv.conf says `options use-vc`.
        #[arg(long)]
        tcp: bool,
        /// 4, 6 or any.
        #[arg(long, value_parser = family, default_value = "any")]
        family: libc::c_int,
    },
    /// Send one hand-built query to SERVER:PORT.
    Query(QueryArgs),
}

/// A server's or proxy's listeners and answers.
#[derive(Args, Debug)]
struct ServerArgs {
    #[arg(long, required = true)]
    listen: Vec<SocketAddr>,
    /// At most one IPv4 (required) and one IPv6 address.
    #[arg(long = "answer", required = true)]
    answer: Vec<IpAddr>,
}

impl ServerArgs {
    fn answers(&self) -> Result<Answers, String> {
        let list = &self.answer;
        let v4 = list.iter().find_map(|a| match a {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        });
        let v6 = list.iter().find_map(|a| match a {
            IpAddr::V6(v6) => Some(*v6),
            IpAddr::V4(_) => None,
        });
        if list.len() != usize::from(v4.is_some()) + usize::from(v6.is_some()) {
            return Err("--answer: at most one IPv4 and one IPv6 address".into());
        }
        Ok(Answers {
            v4: v4.ok_or("--answer with an IPv4 address is required")?,
            v6,
        })
    }
}

/// `dnsprobe query`'s arguments.
#[derive(Args, Debug)]
struct QueryArgs {
    server: SocketAddr,
    name: String,
    #[arg(long)]
    tcp: bool,
    /// `connect` + `send` instead of `sendto` (UDP: TCP always connects).
    #[arg(long, conflicts_with = "tcp")]
    connect: bool,
    #[arg(long)]
    aaaa: bool,
    #[arg(long)]
    bind: Option<IpAddr>,
    #[arg(long = "timeout-ms", value_parser = millis, default_value = DEFAULT_TIMEOUT_MS)]
    timeout: Duration,
}

fn family(value: &str) -> Result<libc::c_int, String> {
    match value {
        "4" => Ok(libc::AF_INET),
        "6" => Ok(libc::AF_INET6),
        "any" => Ok(libc::AF_UNSPEC),
        _ => Err("expected 4, 6 or any".into()),
    }
}

/// The kind word of an error line, for `result=` fields.
fn kind_of(line: &str) -> String {
    line.split_whitespace().nth(1).unwrap_or("io").to_owned()
}

// ---------------------------------------------------------------------------------------
// Servers

/// How a server role answers one query; `None` drops a query that is not DNS.
trait Responder: Send + Sync + 'static {
    fn respond(
        &self,
        proto: &str,
        peer: SocketAddr,
        local: SocketAddr,
        query: &[u8],
    ) -> Option<Vec<u8>>;
}

struct Authority {
    name: String,
    answers: Answers,
}

impl Responder for Authority {
    fn respond(
        &self,
        proto: &str,
        peer: SocketAddr,
        local: SocketAddr,
        query: &[u8],
    ) -> Option<Vec<u8>> {
        let query = Message::from_vec(query).ok()?;
        let reply = wire::answer(&query, self.answers.v4, self.answers.v6)?;
        emit(&protocol::answered_line(
            &self.name,
            proto,
            local,
            peer,
            wire::question(&query)?,
        ));
        reply.to_vec().ok()
    }
}

struct Relay {
    name: String,
    upstream: SocketAddr,
    answers: Answers,
    timeout: Duration,
}

impl Relay {
    /// The upstream's reply to `query` (`raw` as the client sent it) over `proto`, or an
    /// error line.
    fn ask(&self, proto: &str, raw: &[u8], query: &Message) -> Result<Message, String> {
        let reply = if proto == "tcp" {
            match exchange_tcp(self.upstream, None, self.timeout, raw)? {
                Frame::Message(reply) => reply,
                Frame::Short(_) => {
                    return Err(protocol::error_line(error_kind::EMPTY, "upstream closed"))
                }
            }
        } else {
            exchange_udp(self.upstream, None, true, self.timeout, raw)?.0
        };
        check_reply(&reply, query)
    }
}

impl Responder for Relay {
    fn respond(
        &self,
        proto: &str,
        peer: SocketAddr,
        _local: SocketAddr,
        query: &[u8],
    ) -> Option<Vec<u8>> {
        let parsed = Message::from_vec(query).ok()?;
        let question = wire::question(&parsed)?;
        let (reply, result) = match self.ask(proto, query, &parsed) {
            Ok(mut reply) => {
                wire::rewrite_addrs(&mut reply, self.answers.v4, self.answers.v6);
                (reply, "ok".to_owned())
            }
            Err(line) => (wire::servfail(&parsed), kind_of(&line)),
        };
        emit(&protocol::forwarded_line(
            &self.name,
            proto,
            peer,
            question,
            self.upstream,
            &result,
        ));
        reply.to_vec().ok()
    }
}

fn unspecified(v6: bool) -> IpAddr {
    if v6 {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    }
}

/// A server's listeners: UDP and TCP on every address, all bound before the first
/// `listening` line so those lines mean "ready".
fn serve(name: &str, listen: &[SocketAddr], responder: impl Responder) -> ExitCode {
    // Lives as long as the process: every listener thread answers through it.
    let responder: &'static dyn Responder = Box::leak(Box::new(responder));
    let mut sockets = Vec::new();
    for &addr in listen {
        match (bind_udp(addr), sockaddr::listen_tcp(addr)) {
            (Ok(udp), Ok(tcp)) => sockets.push((udp, tcp)),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("dnsprobe: listen {addr}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let mut threads = Vec::new();
    for (udp, tcp) in sockets {
        let addr = udp.local_addr().expect("bound socket has an address");
        emit(&protocol::listening_line(name, "udp", addr));
        emit(&protocol::listening_line(
            name,
            "tcp",
            tcp.local_addr().expect("bound listener"),
        ));
        threads.push(std::thread::spawn(move || udp_loop(udp, responder)));
        threads.push(std::thread::spawn(move || tcp_loop(tcp, responder)));
    }
    for thread in threads {
        let _ = thread.join();
    }
    ExitCode::SUCCESS
}

fn udp_loop(sock: UdpSocket, responder: &'static dyn Responder) {
    let local = sock.local_addr().expect("bound socket has an address");
    let mut buf = [0u8; 4096];
    loop {
        let (n, peer) = match sock.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) => {
                eprintln!("dnsprobe: recv on {local}: {e}");
                continue;
            }
        };
        let query = buf[..n].to_vec();
        let out = sock.try_clone().expect("clone socket");
        // A thread per query: a relay waits on its upstream, and glibc sends A and AAAA at once.
        std::thread::spawn(move || {
            if let Some(reply) = responder.respond("udp", peer, local, &query) {
                if let Err(e) = out.send_to(&reply, peer) {
                    eprintln!("dnsprobe: reply to {peer}: {e}");
                }
            }
        });
    }
}

fn tcp_loop(listener: TcpListener, responder: &'static dyn Responder) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                std::thread::spawn(move || tcp_conn(stream, responder));
            }
            Err(e) => eprintln!("dnsprobe: accept: {e}"),
        }
    }
}

/// Answers length-prefixed queries until the client closes.
fn tcp_conn(mut stream: TcpStream, responder: &'static dyn Responder) {
    let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
        return;
    };
    let _ = stream.set_read_timeout(Some(TCP_IDLE));
    while let Ok(Frame::Message(query)) = read_frame(&mut stream) {
        let Some(reply) = responder.respond("tcp", peer, local, &query) else {
            return;
        };
        if write_frame(&mut stream, &reply).is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Clients

/// The error line for a message that is not the DNS reply expected.
fn malformed(detail: impl std::fmt::Display) -> String {
    protocol::error_line(dns_error_kind::MALFORMED, &detail.to_string())
}

/// `reply` decoded if it answers `query` (its ID and question), else an error line.
fn check_reply(reply: &[u8], query: &Message) -> Result<Message, String> {
    let reply = Message::from_vec(reply).map_err(malformed)?;
    let (got, sent) = (&reply.metadata, &query.metadata);
    if got.message_type != MessageType::Response
        || got.id != sent.id
        || reply.queries != query.queries
    {
        return Err(malformed(format_args!(
            "{:?} id {} for {:?} to query id {} for {:?}",
            got.message_type, got.id, reply.queries, sent.id, query.queries
        )));
    }
    Ok(reply)
}

fn query_id() -> u16 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id()) as u16
}

/// `msg` to `server` over UDP from `bind` (the socket connected first with `connect`): the
/// reply and its source as `recvfrom` gives it, or an error line.
fn exchange_udp(
    server: SocketAddr,
    bind: Option<IpAddr>,
    connect: bool,
    timeout: Duration,
    msg: &[u8],
) -> Result<(Vec<u8>, SocketAddr), String> {
    let local = SocketAddr::new(bind.unwrap_or(unspecified(server.is_ipv6())), 0);
    let sock = UdpSocket::bind(local).map_err(|e| io_error_line(&e))?;
    sock.set_read_timeout(Some(timeout))
        .map_err(|e| io_error_line(&e))?;
    if connect {
        sock.connect(server).map_err(|e| io_error_line(&e))?;
        sock.send(msg).map_err(|e| io_error_line(&e))?;
    } else {
        sock.send_to(msg, server).map_err(|e| io_error_line(&e))?;
    }
    let mut buf = [0u8; 4096];
    let (n, from) = sock.recv_from(&mut buf).map_err(|e| io_error_line(&e))?;
    Ok((buf[..n].to_vec(), from))
}

/// `msg` to `server` over TCP from `bind`: the framed reply, or an error line.
fn exchange_tcp(
    server: SocketAddr,
    bind: Option<IpAddr>,
    timeout: Duration,
    msg: &[u8],
) -> Result<Frame, String> {
    let mut stream = sockaddr::connect_tcp(server, bind, timeout).map_err(|e| io_error_line(&e))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| io_error_line(&e))?;
    write_frame(&mut stream, msg).map_err(|e| io_error_line(&e))?;
    read_frame(&mut stream).map_err(|e| io_error_line(&e))
}

/// One hand-built query; `Ok(reply line)` or `Err(error or notdns line)`.
fn query(args: &QueryArgs) -> Result<String, String> {
    let QueryArgs {
        server,
        name,
        tcp,
        connect,
        aaaa,
        bind,
        timeout,
    } = args;
    let qtype = if *aaaa {
        RecordType::AAAA
    } else {
        RecordType::A
    };
    let query = wire::query(query_id(), name, qtype).map_err(malformed)?;
    let msg = query.to_vec().map_err(malformed)?;
    let (reply, from) = if *tcp {
        match exchange_tcp(*server, *bind, *timeout, &msg)? {
            Frame::Message(reply) => (reply, None),
            Frame::Short(bytes) if bytes.is_empty() => {
                return Err(protocol::error_line(
                    error_kind::EMPTY,
                    "connection closed without a reply",
                ))
            }
            Frame::Short(bytes) => {
                return Err(protocol::notdns_line(&String::from_utf8_lossy(&bytes)))
            }
        }
    } else {
        let (reply, from) = exchange_udp(*server, *bind, *connect, *timeout, &msg)?;
        (reply, Some(from))
    };
    let reply = check_reply(&reply, &query)?;
    let rcode = reply.metadata.response_code.into();
    Ok(protocol::reply_line(rcode, &wire::addrs(&reply), from))
}

/// The nameservers and whether `options use-vc` is set, from /etc/resolv.conf.
fn read_resolv_conf() -> (Vec<IpAddr>, bool) {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let mut servers = Vec::new();
    let mut use_vc = false;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                servers.extend(words.next().and_then(|w| w.parse::<IpAddr>().ok()))
            }
            Some("options") => use_vc |= words.any(|w| w == "use-vc"),
            _ => {}
        }
    }
    (servers, use_vc)
}

fn gai_error(code: libc::c_int) -> String {
    let name = match code {
        libc::EAI_AGAIN => "again",
        libc::EAI_NONAME => "noname",
        libc::EAI_FAIL => "fail",
        libc::EAI_NODATA => "nodata",
        libc::EAI_SYSTEM => "system",
        _ => "other",
    };
    // SAFETY: gai_strerror returns a static NUL-terminated string for any code.
    let text = unsafe { CStr::from_ptr(libc::gai_strerror(code)) }.to_string_lossy();
    protocol::error_line(
        &format!("{}{name}", dns_error_kind::GAI_PREFIX),
        &format!("code={code} {text}"),
    )
}

/// glibc's resolver: `Ok(resolved line)` or `Err(error line)`.
fn resolve(name: &str, family: libc::c_int) -> Result<String, String> {
    let (servers, _) = read_resolv_conf();
    let cname =
        CString::new(name).map_err(|e| protocol::error_line(error_kind::IO, &e.to_string()))?;
    // SAFETY: all-zero is a valid addrinfo hints value.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = family;
    // One entry per address instead of one per socket type.
    hints.ai_socktype = libc::SOCK_STREAM;
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: valid C string, hints and out pointer; the list is freed below.
    let rc = unsafe { libc::getaddrinfo(cname.as_ptr(), std::ptr::null(), &hints, &mut res) };
    if rc != 0 {
        return Err(gai_error(rc));
    }
    let mut addrs = Vec::new();
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getaddrinfo returned.
        let ai = unsafe { &*cur };
        if !ai.ai_addr.is_null() {
            let len = (ai.ai_addrlen as usize).min(size_of::<libc::sockaddr_storage>());
            // SAFETY: ai_addr points to ai_addrlen valid bytes; the storage has room for len.
            let copied = unsafe {
                socket2::SockAddr::try_init(|storage, storage_len| {
                    std::ptr::copy_nonoverlapping(ai.ai_addr.cast::<u8>(), storage.cast(), len);
                    *storage_len = len as libc::socklen_t;
                    Ok(())
                })
            };
            if let Some(addr) = copied.ok().and_then(|(_, a)| a.as_socket()) {
                if !addrs.contains(&addr.ip()) {
                    addrs.push(addr.ip());
                }
            }
        }
        cur = ai.ai_next;
    }
    // SAFETY: `res` came from a successful getaddrinfo and is freed once.
    unsafe { libc::freeaddrinfo(res) };
    Ok(protocol::resolved_line(&addrs, &servers))
}

/// The command line, its answers checked.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Cmd, clap::Error> {
    let cmd = Cmd::try_parse_from(std::iter::once("dnsprobe".to_owned()).chain(args))?;
    if let Cmd::Server { server, .. } | Cmd::Proxy { server, .. } = &cmd {
        server
            .answers()
            .map_err(|e| Cmd::command().error(clap::error::ErrorKind::ValueValidation, e))?;
    }
    Ok(cmd)
}

fn main() -> ExitCode {
    let cmd = match parse_args(std::env::args().skip(1)) {
        Ok(cmd) => cmd,
        Err(e) => return usage_exit(&e),
    };
    match cmd {
        Cmd::Server { server, name } => {
            let authority = Authority {
                name: name.clone(),
                answers: server.answers().expect("checked"),
            };
            serve(&name, &server.listen, authority)
        }
        Cmd::Proxy {
            server,
            name,
            upstream,
            timeout,
        } => {
            let relay = Relay {
                name: name.clone(),
                upstream,
                answers: server.answers().expect("checked"),
                timeout,
            };
            serve(&name, &server.listen, relay)
        }
        Cmd::Resolve { name, tcp, family } => {
            if tcp && !read_resolv_conf().1 {
                // Otherwise a "TCP" test would quietly test UDP.
                eprintln!("dnsprobe: resolve --tcp: /etc/resolv.conf has no `options use-vc`");
                return ExitCode::from(64);
            }
            client_exit(resolve(&name, family))
        }
        Cmd::Query(args) => client_exit(query(&args)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn parses_each_subcommand_and_rejects_bad_answers() {
        let cmd = parse_args(args("proxy --listen 127.0.0.1:15053 --listen [::1]:15053 --upstream 127.0.0.53:53 --answer 192.0.2.53 --answer 2001:db8::53")).unwrap();
        assert!(
            matches!(cmd, Cmd::Proxy { ref server, .. } if server.listen.len() == 2 && server.answers().unwrap().v6.is_some())
        );
        assert!(matches!(
            parse_args(args("query 10.0.0.1:53 a.test --connect")),
            Ok(Cmd::Query(QueryArgs {
                connect: true,
                tcp: false,
                ..
            }))
        ));
        assert!(matches!(
            parse_args(args("resolve a.test --tcp --family 6")),
            Ok(Cmd::Resolve {
                tcp: true,
                family: libc::AF_INET6,
                ..
            })
        ));
        assert!(parse_args(args("server --listen 127.0.0.1:53 --answer 2001:db8::1")).is_err());
        assert!(parse_args(args(
            "server --listen 127.0.0.1:53 --answer 192.0.2.1 --answer 192.0.2.2"
        ))
        .is_err());
        assert!(parse_args(args("proxy --listen 127.0.0.1:53 --answer 192.0.2.1")).is_err());
        assert!(parse_args(args("query 10.0.0.1:53 a.test --tcp --connect")).is_err());
    }

    #[test]
    fn replies_must_answer_our_query() {
        let q = wire::query(42, "a.test", RecordType::A).unwrap();
        let reply = wire::answer(&q, Ipv4Addr::new(192, 0, 2, 1), None).unwrap();
        let reply = reply.to_vec().unwrap();
        assert!(check_reply(&reply, &q).is_ok());
        let other = wire::query(43, "a.test", RecordType::A).unwrap();
        assert!(check_reply(&reply, &other)
            .unwrap_err()
            .starts_with("error malformed"));
        let q_bytes = q.to_vec().unwrap();
        assert!(check_reply(&q_bytes, &q).is_err(), "a query is no reply");
    }
}
