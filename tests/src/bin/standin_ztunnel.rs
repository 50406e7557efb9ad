//! `standin-ztunnel`: istio ambient's ztunnel as far as the capture goes, for the tests.
//! It connects to a node agent's ZDS socket and, for every pod it is sent, listens inside
//! the pod's network namespace as ztunnel does — outbound 15001 and inbound 15006 on `[::]`,
//! every socket marked 1337 — while its process stays in its own cgroup. A connection on
//! 15001 is sent on to its original destination (`SO_ORIGINAL_DST`, else the local
//! address); one on 15006 to its original destination from the client's own address
//! (`IP_TRANSPARENT`), as ztunnel's transparent upstreams are. Each connection is printed
//! on stdout, `outbound PEER ORIGINAL` or `inbound PEER ORIGINAL`, the witness a test reads.
//! Its DNS proxy listens in the pod on 127.0.0.1 and [::1], port 15053, UDP and TCP (marked
//! 1337 too), as ztunnel's does, and answers every query itself with the DNS kit's proxy
//! addresses (`PROXY_ANSWER_V4`, `PROXY_ANSWER_V6`), printing `dns-udp PEER` or `dns-tcp
//! PEER ORIGINAL` (`SO_ORIGINAL_DST`, else the local address) for each query: a UDP query's
//! original destination shows only at the client, as the source of the reply it gets.
//! `added UID`, `kept UID` (a snapshot naming a pod already proxied) and `deleted UID`
//! follow the agent's requests; `agent gone` when the agent hangs up, after which it
//! connects again, its pods' listeners kept, as ztunnel does. With `--silent` it never
//! answers an add (a ztunnel that hangs), printing `silent on UID`.
//!
//! ```text
//! standin-ztunnel --zds PATH [--quiet] [--silent]
//! ```
//!
//! `--quiet`: connections and DNS queries are not printed (for loads of many).

use std::{
    collections::HashMap,
    io::{self, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd as _, OwnedFd},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use hickory_proto::op::Message;
use redirector::zds::wire::Request;
use redirector_tests::{
    dns::{
        net::{read_frame, write_frame, Frame},
        wire, DNS_PROXY_PORT, PROXY_ANSWER_V4, PROXY_ANSWER_V6,
    },
    sockaddr::original_dst_at,
    ztunnel::{connect_within, serve, Answer},
};
use socket2::{Domain, Socket, Type};
use tokio::{
    net::{TcpListener, TcpSocket, TcpStream, UdpSocket},
    task::JoinHandle,
};

const OUTBOUND: u16 = 15001;
const INBOUND: u16 = 15006;
const HBONE: u16 = 15008;
/// The mark on every ztunnel socket.
const MARK: u32 = 1337;
/// How long the DNS proxy waits for the next query on an idle TCP connection.
const DNS_TCP_IDLE: Duration = Duration::from_secs(10);
/// `--quiet`: connections are not printed.
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((flag, path, options)) = args.split_first().and_then(|(flag, rest)| {
        let (path, options) = rest.split_first()?;
        Some((flag, path, options))
    }) else {
        eprintln!("usage: standin-ztunnel --zds PATH [--quiet] [--silent]");
        std::process::exit(2);
    };
    let known = |o: &String| o == "--quiet" || o == "--silent";
    if flag != "--zds" || !options.iter().all(known) {
        eprintln!("usage: standin-ztunnel --zds PATH [--quiet] [--silent]");
        std::process::exit(2);
    }
    let zds = PathBuf::from(path);
    let quiet = options.iter().any(|o| o == "--quiet");
    let silent = options.iter().any(|o| o == "--silent");
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        // As ztunnel: the pods' proxies live on while the agent is away, and a snapshot
        // that names a pod already proxied keeps it as it is.
        let mut pods: HashMap<String, Vec<JoinHandle<()>>> = HashMap::new();
        loop {
            // As ztunnel, it waits for an agent that is gone, here far longer than the kit's
            // 30 s: a daemon's restart under emulation can take longer. The test that started
            // it ends it.
            let conn = connect_within(&zds, AGENT_AWAY_FOR).await;
            serve(&conn, |request, fd| match request {
                Request::Add(add) if silent => {
                    say(&format!("silent on {}", add.uid));
                    Answer::Silence
                }
                Request::Add(add) if pods.contains_key(&add.uid) => {
                    say(&format!("kept {}", add.uid));
                    Answer::Ack
                }
                Request::Add(add) => {
                    let netns = Arc::new(fd.expect("an add carries the pod's netns"));
                    match listen_in(&netns) {
                        Ok(tasks) => {
                            pods.insert(add.uid.clone(), tasks);
                            say(&format!("added {}", add.uid));
                            Answer::Ack
                        }
                        Err(err) => Answer::Refuse(format!("listening in the pod: {err}")),
                    }
                }
                Request::Del(del) => {
                    if let Some(tasks) = pods.remove(&del.uid) {
                        tasks.iter().for_each(JoinHandle::abort);
                    }
                    say(&format!("deleted {}", del.uid));
                    Answer::Ack
                }
                Request::Keep(_) | Request::SnapshotSent(_) => Answer::Ack,
            })
            .await;
            say("agent gone");
        }
    });
    Ok(())
}

/// How long an agent may be away before the stand-in gives up on it.
const AGENT_AWAY_FOR: Duration = Duration::from_secs(600);

fn say(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `work` on a thread of its own inside the namespace `netns`: the sockets it makes
/// belong to that namespace, the process to its own cgroup.
fn in_netns<T: Send + 'static>(
    netns: &Arc<OwnedFd>,
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let netns = Arc::clone(netns);
    std::thread::spawn(move || {
        // SAFETY: setns(2) on this thread alone, with an open namespace fd.
        if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        work()
    })
    .join()
    .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// The pod's listeners, each served by a task.
fn listen_in(netns: &Arc<OwnedFd>) -> io::Result<Vec<JoinHandle<()>>> {
    let mut tasks = dns_proxy_in(netns)?;
    for port in [OUTBOUND, INBOUND] {
        let listener = in_netns(netns, move || {
            let socket = Socket::new(Domain::IPV6, Type::STREAM, None)?;
            socket.set_only_v6(false)?;
            socket.set_reuse_address(true)?;
            socket.set_reuse_port(true)?;
            socket.set_mark(MARK)?;
            socket.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)).into())?;
            socket.listen(128)?;
            socket.set_nonblocking(true)?;
            Ok(std::net::TcpListener::from(socket))
        })?;
        let listener = TcpListener::from_std(listener)?;
        let netns = Arc::clone(netns);
        tasks.push(tokio::spawn(async move {
            while let Ok((client, peer)) = listener.accept().await {
                tokio::spawn(proxy(client, peer, port, Arc::clone(&netns)));
            }
        }));
    }
    Ok(tasks)
}

/// The address as IPv4 where it is an IPv4-mapped one (a dual-stack socket's view).
fn unmapped(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), addr.port()),
            None => addr,
        },
        IpAddr::V4(_) => addr,
    }
}

/// A connection's original destination as ztunnel asks for it: at SOL_IP, then SOL_IPV6 (a
/// dual-stack socket's IPv4 connection answers only the first), else the local address.
fn original_dst(client: &std::net::TcpStream) -> Option<SocketAddr> {
    original_dst_at(client, libc::SOL_IP)
        .or_else(|_| original_dst_at(client, libc::SOL_IPV6))
        .ok()
        .or_else(|| client.local_addr().ok())
        .map(unmapped)
}

async fn proxy(client: TcpStream, peer: SocketAddr, port: u16, netns: Arc<OwnedFd>) {
    let peer = unmapped(peer);
    let Ok(client) = client.into_std() else {
        return;
    };
    let original = original_dst(&client);
    let Ok(client) = TcpStream::from_std(client) else {
        return;
    };
    let Some(original) = original else {
        return;
    };
    // ztunnel refuses a call to itself.
    let to_itself = [OUTBOUND, INBOUND, HBONE].contains(&original.port())
        || (port == OUTBOUND && original.ip().is_loopback());
    if to_itself {
        return;
    }
    let inbound = port == INBOUND;
    if !QUIET.load(std::sync::atomic::Ordering::Relaxed) {
        say(&format!(
            "{} {peer} {original}",
            if inbound { "inbound" } else { "outbound" }
        ));
    }
    let transparent_from = inbound.then_some(peer.ip());
    let Ok(upstream) = in_netns(&netns, move || upstream_socket(original, transparent_from)) else {
        return;
    };
    let Ok(upstream) = TcpSocket::from_std_stream(upstream).connect(original).await else {
        return;
    };
    let (mut client, mut upstream) = (client, upstream);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

/// A socket marked as ztunnel's, bound to `from` (not an address of the pod) where given.
fn upstream_socket(to: SocketAddr, from: Option<IpAddr>) -> io::Result<std::net::TcpStream> {
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
    socket.set_mark(MARK)?;
    if let Some(from) = from {
        if to.is_ipv4() {
            socket.set_ip_transparent_v4(true)?;
        } else {
            socket.set_ip_transparent_v6(true)?;
        }
        socket.bind(&SocketAddr::new(from, 0).into())?;
    }
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// ztunnel's DNS proxy in the pod: UDP and TCP on 127.0.0.1:15053 and [::1]:15053, each
/// served by a task.
fn dns_proxy_in(netns: &Arc<OwnedFd>) -> io::Result<Vec<JoinHandle<()>>> {
    let mut tasks = Vec::new();
    for ip in [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ] {
        let addr = SocketAddr::new(ip, DNS_PROXY_PORT);
        let udp = in_netns(netns, move || dns_socket(addr, Type::DGRAM))?;
        let udp = UdpSocket::from_std(udp.into())?;
        tasks.push(tokio::spawn(answer_udp(udp)));
        let tcp = in_netns(netns, move || {
            let socket = dns_socket(addr, Type::STREAM)?;
            socket.listen(128)?;
            Ok(socket)
        })?;
        let tcp = TcpListener::from_std(tcp.into())?;
        tasks.push(tokio::spawn(async move {
            while let Ok((client, peer)) = tcp.accept().await {
                if let Ok(client) = client.into_std() {
                    tokio::task::spawn_blocking(move || answer_tcp(client, peer));
                }
            }
        }));
    }
    Ok(tasks)
}

/// A socket of ztunnel's DNS proxy bound to `addr` (IPv6 apart from IPv4, as ztunnel binds
/// the two loopbacks), non-blocking.
fn dns_socket(addr: SocketAddr, kind: Type) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), kind, None)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_mark(MARK)?;
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// The proxy's own answer to `query`, or `None` for what is not a DNS query.
fn dns_answer(query: &[u8]) -> Option<Vec<u8>> {
    let query = Message::from_vec(query).ok()?;
    wire::answer(&query, PROXY_ANSWER_V4, Some(PROXY_ANSWER_V6))?
        .to_vec()
        .ok()
}

async fn answer_udp(socket: UdpSocket) {
    let mut buf = [0u8; 4096];
    while let Ok((len, peer)) = socket.recv_from(&mut buf).await {
        let Some(reply) = dns_answer(&buf[..len]) else {
            continue;
        };
        if !QUIET.load(std::sync::atomic::Ordering::Relaxed) {
            say(&format!("dns-udp {}", unmapped(peer)));
        }
        let _ = socket.send_to(&reply, peer).await;
    }
}

/// Answers one TCP connection's length-prefixed queries until the client closes (blocking:
/// the DNS kit's framing is on std streams).
fn answer_tcp(mut client: std::net::TcpStream, peer: SocketAddr) {
    let prepared = client
        .set_nonblocking(false)
        .and_then(|()| client.set_read_timeout(Some(DNS_TCP_IDLE)));
    if prepared.is_err() {
        return;
    }
    let original = original_dst(&client);
    while let Ok(Frame::Message(query)) = read_frame(&mut client) {
        let Some(reply) = dns_answer(&query) else {
            return;
        };
        if !QUIET.load(std::sync::atomic::Ordering::Relaxed) {
            let original = original.map_or_else(|| "unknown".to_owned(), |o| o.to_string());
            say(&format!("dns-tcp {} {original}", unmapped(peer)));
        }
        if write_frame(&mut client, &reply).is_err() {
            return;
        }
    }
}
