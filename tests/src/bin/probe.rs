//! `probe`: tiny TCP servers and client for redirector's tests. One line per event on stdout,
//! in the formats of `redirector_tests::probe::protocol`.
//!
//! ```text
//! probe serve   --listen ADDR:PORT [--listen …] --name NAME
//! probe proxy   --listen ADDR:PORT [--listen …] --name NAME [--forward] [--timeout-ms N]
//! probe connect ADDR:PORT [--bind ADDR] [--timeout-ms N]
//! probe peername ADDR:PORT [--timeout-ms N]
//! probe hammer ADDR:PORT --for-ms N
//! probe hold ADDR:PORT --for-ms N
//! ```
//! `hold` connects, prints the reply, keeps the connection open for N ms, then asks the
//! server again on it (a proxy reads SO_ORIGINAL_DST once more) and prints that reply and
//! `peer IP PORT` (getpeername()): a connection that lives across a change of the node.
//! `hammer` connects again and again for N ms (or until SIGTERM) and prints one count line at the end:
//! `hammer total=T proxied=P served=S refused=R errors=E` (served = reached the service
//! directly, i.e. escaped capture).
//! `peername` connects and prints `peer IP PORT`: what getpeername() says while the
//! connection is open.
//! `connect` exits 2 when the connection fails (`error <kind> …`), 64 on a usage error.
//! `--timeout-ms` bounds a connect (a dropped SYN is an `error timeout` after it); a reply,
//! and a proxy's wait for a held connection's next request, get `REPLY_TIMEOUT`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser};
use redirector_tests::probe::protocol::{
    self as protocol, client_exit, describe_io_error, emit, error_kind, io_error_line, millis,
    server_name, usage_exit,
};
use redirector_tests::probe::REPLY_TIMEOUT;
use redirector_tests::sockaddr;

const DEFAULT_TIMEOUT: Duration = Duration::from_millis(3000);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    Serve,
    Proxy { forward: bool },
}

#[derive(Parser, Debug)]
#[command(
    name = "probe",
    about = "Tiny TCP servers and client for redirector's tests"
)]
enum Cmd {
    /// Answer each connection with a `served` line.
    Serve(Server),
    /// Answer each connection with a `proxied` line and its SO_ORIGINAL_DST.
    Proxy {
        #[command(flatten)]
        server: Server,
        /// Also connect to the original destination and append its reply.
        #[arg(long)]
        forward: bool,
    },
    /// Connect, print the reply.
    Connect {
        dst: SocketAddr,
        #[arg(long)]
        bind: Option<IpAddr>,
        #[arg(long = "timeout-ms", value_parser = millis, default_value = "3000")]
        timeout: Duration,
    },
    /// Connect and print what getpeername() says.
    Peername {
        dst: SocketAddr,
        #[arg(long = "timeout-ms", value_parser = millis, default_value = "3000")]
        timeout: Duration,
    },
    /// Connect again and again, then print one count line.
    Hammer {
        dst: SocketAddr,
        #[arg(long = "for-ms", value_parser = millis)]
        duration: Duration,
    },
    /// Connect, hold the connection, ask again on it.
    Hold {
        dst: SocketAddr,
        #[arg(long = "for-ms", value_parser = millis)]
        duration: Duration,
    },
}

#[derive(Args, Debug)]
struct Server {
    #[arg(long, required = true)]
    listen: Vec<SocketAddr>,
    #[arg(long, value_parser = server_name)]
    name: String,
    #[arg(long = "timeout-ms", value_parser = millis, default_value = "3000")]
    timeout: Duration,
}

/// Connects within `timeout`, reads the whole reply, and returns the `reply …` or `error …`
/// line.
fn connect(dst: SocketAddr, bind: Option<IpAddr>, timeout: Duration) -> Result<String, String> {
    let stream = sockaddr::connect_tcp(dst, bind, timeout).map_err(|e| io_error_line(&e))?;
    stream
        .set_read_timeout(Some(REPLY_TIMEOUT))
        .map_err(|e| io_error_line(&e))?;
    read_reply(&mut BufReader::new(stream))
}

/// The server's one-line reply as a `reply …` line (a proxy keeps the connection open
/// after it, for [`hold`]).
fn read_reply(stream: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut reply = String::new();
    stream
        .read_line(&mut reply)
        .map_err(|e| io_error_line(&e))?;
    let reply = reply.trim();
    if reply.is_empty() {
        return Err(protocol::error_line(
            error_kind::EMPTY,
            "connection closed without a reply",
        ));
    }
    Ok(protocol::reply_line(reply))
}

/// Connects, prints the reply, waits `duration`, asks again on the same connection and
/// returns that reply and what getpeername() says then.
fn hold(dst: SocketAddr, duration: Duration) -> Result<String, String> {
    let stream =
        sockaddr::connect_tcp(dst, None, DEFAULT_TIMEOUT).map_err(|e| io_error_line(&e))?;
    stream
        .set_read_timeout(Some(REPLY_TIMEOUT))
        .map_err(|e| io_error_line(&e))?;
    let mut writer = stream.try_clone().map_err(|e| io_error_line(&e))?;
    let mut reader = BufReader::new(stream);
    emit(&read_reply(&mut reader)?);
    std::thread::sleep(duration);
    let peer = reader
        .get_ref()
        .peer_addr()
        .map_err(|e| io_error_line(&e))?;
    writer.write_all(AGAIN).map_err(|e| io_error_line(&e))?;
    let again = read_reply(&mut reader)?;
    Ok(format!("{again}\npeer {} {}", peer.ip(), peer.port()))
}

/// What a `hold` client sends to have a proxy answer once more.
const AGAIN: &[u8] = b"again\n";

/// Connects and returns `peer IP PORT` as getpeername() reports it on the open socket.
fn peername(dst: SocketAddr, timeout: Duration) -> Result<String, String> {
    let stream = sockaddr::connect_tcp(dst, None, timeout).map_err(|e| io_error_line(&e))?;
    let peer = stream.peer_addr().map_err(|e| io_error_line(&e))?;
    Ok(format!("peer {} {}", peer.ip(), peer.port()))
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn stop(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Connects to `dst` again and again for `duration` or until SIGTERM; counts where each
/// connection landed.
fn hammer(dst: SocketAddr, duration: Duration) -> String {
    use redirector_tests::ConnOutcome;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGTERM,
            stop as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    let (mut total, mut proxied, mut served, mut refused, mut errors) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let until = std::time::Instant::now() + duration;
    while std::time::Instant::now() < until && !STOP.load(std::sync::atomic::Ordering::Relaxed) {
        total += 1;
        let line = match connect(dst, None, DEFAULT_TIMEOUT) {
            Ok(line) | Err(line) => line,
        };
        match ConnOutcome::parse(&line) {
            ConnOutcome::Proxied { .. } => proxied += 1,
            ConnOutcome::Served { .. } => served += 1,
            ConnOutcome::Refused => refused += 1,
            ConnOutcome::Error(_) => errors += 1,
        }
    }
    format!(
        "hammer total={total} proxied={proxied} served={served} refused={refused} errors={errors}"
    )
}

fn handle(stream: TcpStream, role: Role, name: &str, timeout: Duration) {
    let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
        return; // Already reset by the client.
    };
    let answer = |stream: &TcpStream| match role {
        Role::Serve => protocol::served_line(name, local, peer),
        Role::Proxy { forward } => {
            let orig = sockaddr::original_dst(stream);
            let upstream = match (forward, orig) {
                (false, _) => None,
                (true, Ok(orig)) => Some(match connect(orig, None, timeout) {
                    Ok(reply) => reply.trim_start_matches("reply ").to_owned(),
                    Err(error) => error,
                }),
                (true, Err(errno)) => Some(protocol::error_line(
                    error_kind::IO,
                    &format!("no original destination to forward to (errno={errno})"),
                )),
            };
            protocol::proxied_line(name, local, peer, orig, upstream.as_deref())
        }
    };
    let line = answer(&stream);
    emit(&line);
    let mut stream = stream;
    let _ = stream.write_all(format!("{line}\n").as_bytes());
    if role == Role::Serve {
        let _ = stream.shutdown(Shutdown::Write);
        return;
    }
    // A proxy answers again on the same connection for as long as the client asks
    // (`hold`). Anything else ends it: a client that has its reply closes, and one that
    // sends its own request (a DNS query) and reads to the end gets the end.
    let _ = stream.set_read_timeout(Some(REPLY_TIMEOUT));
    let mut request = [0u8; AGAIN.len()];
    while matches!(stream.read(&mut request), Ok(n) if request[..n] == *AGAIN) {
        let line = answer(&stream);
        let _ = stream.write_all(format!("{line}\n").as_bytes());
    }
    let _ = stream.shutdown(Shutdown::Write);
}

fn accept_loop(listener: TcpListener, role: Role, name: String, timeout: Duration) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let name = name.clone();
                std::thread::spawn(move || handle(stream, role, &name, timeout));
            }
            Err(e) => eprintln!("probe: accept: {e}"),
        }
    }
}

fn serve(role: Role, name: String, listen: Vec<SocketAddr>, timeout: Duration) -> ExitCode {
    // Bind everything first, so `listening` lines mean all listeners are ready.
    let mut listeners = Vec::new();
    for addr in listen {
        match sockaddr::listen_tcp(addr) {
            Ok(listener) => listeners.push(listener),
            Err(e) => {
                eprintln!("probe: listen {addr}: {}", describe_io_error(&e));
                return ExitCode::from(1);
            }
        }
    }
    let mut threads = Vec::new();
    for listener in listeners {
        let addr = listener
            .local_addr()
            .expect("bound listener has an address");
        emit(&protocol::listening_line(&name, addr));
        let name = name.clone();
        threads.push(std::thread::spawn(move || {
            accept_loop(listener, role, name, timeout)
        }));
    }
    for thread in threads {
        let _ = thread.join();
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let cmd = match Cmd::try_parse() {
        Ok(cmd) => cmd,
        Err(e) => return usage_exit(&e),
    };
    match cmd {
        Cmd::Serve(s) => serve(Role::Serve, s.name, s.listen, s.timeout),
        Cmd::Proxy { server: s, forward } => {
            serve(Role::Proxy { forward }, s.name, s.listen, s.timeout)
        }
        Cmd::Connect { dst, bind, timeout } => client_exit(connect(dst, bind, timeout)),
        Cmd::Peername { dst, timeout } => client_exit(peername(dst, timeout)),
        Cmd::Hammer { dst, duration } => client_exit(Ok(hammer(dst, duration))),
        Cmd::Hold { dst, duration } => client_exit(hold(dst, duration)),
    }
}
