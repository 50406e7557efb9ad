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

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use redirector_tests::probe::protocol::{
    self as protocol, client_exit, describe_io_error, emit, error_kind, flag_value, io_error_line,
    server_name,
};
use redirector_tests::sockaddr;

const USAGE: &str = "usage:
  probe serve   --listen ADDR:PORT [--listen ...] --name NAME
  probe proxy   --listen ADDR:PORT [--listen ...] --name NAME [--forward] [--timeout-ms N]
  probe connect ADDR:PORT [--bind ADDR] [--timeout-ms N]
  probe peername ADDR:PORT [--timeout-ms N]
  probe hammer ADDR:PORT --for-ms N
  probe hold ADDR:PORT --for-ms N";

const DEFAULT_TIMEOUT: Duration = Duration::from_millis(3000);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    Serve,
    Proxy { forward: bool },
}

#[derive(Debug)]
enum Cmd {
    Server {
        role: Role,
        name: String,
        listen: Vec<SocketAddr>,
        timeout: Duration,
    },
    Connect {
        dst: SocketAddr,
        bind: Option<IpAddr>,
        timeout: Duration,
    },
    Peername {
        dst: SocketAddr,
        timeout: Duration,
    },
    Hold {
        dst: SocketAddr,
        duration: Duration,
    },
    Hammer {
        dst: SocketAddr,
        duration: Duration,
    },
}

fn parse_args(args: &[String]) -> Result<Cmd, String> {
    let (sub, rest) = args.split_first().ok_or("missing subcommand")?;
    let mut listen = Vec::new();
    let mut name = None;
    let mut forward = false;
    let mut bind = None;
    let mut timeout = DEFAULT_TIMEOUT;
    let mut duration = None;
    let mut positional = Vec::new();
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        let flag = arg.as_str();
        match flag {
            "--listen" => listen.push(flag_value(flag, &mut it)?),
            "--name" => name = Some(flag_value(flag, &mut it)?),
            "--bind" => bind = Some(flag_value(flag, &mut it)?),
            "--timeout-ms" => timeout = Duration::from_millis(flag_value(flag, &mut it)?),
            "--for-ms" => duration = Some(Duration::from_millis(flag_value(flag, &mut it)?)),
            "--forward" => forward = true,
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}")),
            _ => positional.push(arg.clone()),
        }
    }
    // The client subcommands' one ADDR:PORT, and hold's and hammer's --for-ms.
    let dst = || -> Result<SocketAddr, String> {
        let [dst] = positional.as_slice() else {
            return Err(format!("{sub} takes exactly one ADDR:PORT"));
        };
        dst.parse().map_err(|e| format!("{dst}: {e}"))
    };
    let for_ms = || duration.ok_or(format!("{sub} needs --for-ms"));
    match sub.as_str() {
        "serve" | "proxy" => {
            let name = server_name(name.ok_or("--name is required")?)?;
            if listen.is_empty() {
                return Err("at least one --listen is required".into());
            }
            if !positional.is_empty() {
                return Err(format!("unexpected arguments {positional:?}"));
            }
            let role = if sub == "serve" {
                if forward {
                    return Err("--forward is only for proxy".into());
                }
                Role::Serve
            } else {
                Role::Proxy { forward }
            };
            Ok(Cmd::Server {
                role,
                name,
                listen,
                timeout,
            })
        }
        "connect" => Ok(Cmd::Connect {
            dst: dst()?,
            bind,
            timeout,
        }),
        "peername" => Ok(Cmd::Peername {
            dst: dst()?,
            timeout,
        }),
        "hold" => Ok(Cmd::Hold {
            dst: dst()?,
            duration: for_ms()?,
        }),
        "hammer" => Ok(Cmd::Hammer {
            dst: dst()?,
            duration: for_ms()?,
        }),
        other => Err(format!("unknown subcommand {other}")),
    }
}

/// Connects, reads the whole reply, and returns the `reply …` or `error …` line.
fn connect(dst: SocketAddr, bind: Option<IpAddr>, timeout: Duration) -> Result<String, String> {
    let stream = sockaddr::connect_tcp(dst, bind, timeout).map_err(|e| io_error_line(&e))?;
    stream
        .set_read_timeout(Some(timeout))
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
        .set_read_timeout(Some(DEFAULT_TIMEOUT))
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
    let _ = stream.set_read_timeout(Some(timeout));
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse_args(&args) {
        Ok(Cmd::Server {
            role,
            name,
            listen,
            timeout,
        }) => serve(role, name, listen, timeout),
        Ok(Cmd::Connect { dst, bind, timeout }) => client_exit(connect(dst, bind, timeout)),
        Ok(Cmd::Peername { dst, timeout }) => client_exit(peername(dst, timeout)),
        Ok(Cmd::Hammer { dst, duration }) => client_exit(Ok(hammer(dst, duration))),
        Ok(Cmd::Hold { dst, duration }) => client_exit(hold(dst, duration)),
        Err(msg) => {
            eprintln!("probe: {msg}\n{USAGE}");
            ExitCode::from(64)
        }
    }
}
