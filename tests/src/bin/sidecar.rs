//! `sidecar`: a stand-in for the mesh's proxy in benchmarks. It accepts on each `--listen`
//! address, asks the socket for its original destination (`SO_ORIGINAL_DST`, answered by
//! conntrack under iptables and by redirector's getsockopt program), dials it and copies
//! bytes both ways. A connection made to the proxy itself (no original destination) goes to
//! `--upstream`, which is how an app that dials its sidecar explicitly is served. A
//! connection whose original destination port is `--answer-port` is answered by the
//! sidecar itself with an HTTP 200, as a proxy answers a request it serves locally (no
//! upstream hop).
//!
//! ```text
//! sidecar --listen ADDR:PORT [--listen …] [--upstream ADDR:PORT] [--answer-port PORT]
//! ```
//! One event-loop thread, so that its cost per connection is the same in every mode.

use std::net::SocketAddr;
use std::process::ExitCode;

use redirector_tests::sockaddr::original_dst;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// Where connections go: to their original destination, or `upstream` without one; those
/// to port `answer` are answered here.
#[derive(Clone, Copy)]
struct Routes {
    upstream: Option<SocketAddr>,
    answer: Option<u16>,
}

async fn forward(client: TcpStream, routes: Routes) {
    let Ok(client) = client.into_std() else {
        return;
    };
    let target = original_dst(&client).ok().or(routes.upstream);
    let Ok(client) = TcpStream::from_std(client) else {
        return;
    };
    let Some(target) = target else {
        return; // Nowhere to send it: close.
    };
    if routes.answer == Some(target.port()) {
        return answer(client).await;
    }
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client, mut server) = (client, server);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

/// Reads one HTTP request's head and answers it with a 200, then closes.
async fn answer(mut client: TcpStream) {
    const REPLY: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n";
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ = client.write_all(REPLY).await;
    let _ = client.shutdown().await;
}

async fn serve(listen: Vec<SocketAddr>, routes: Routes) -> std::io::Result<()> {
    let mut listeners = Vec::new();
    for addr in listen {
        listeners.push(TcpListener::bind(addr).await?);
    }
    for l in &listeners {
        println!("listening {}", l.local_addr()?);
    }
    let mut tasks = Vec::new();
    for l in listeners {
        tasks.push(tokio::spawn(async move {
            loop {
                if let Ok((conn, _)) = l.accept().await {
                    tokio::spawn(forward(conn, routes));
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut listen = Vec::new();
    let mut routes = Routes {
        upstream: None,
        answer: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_default();
        let parsed = match flag.as_str() {
            "--listen" => value.parse().map(|a| listen.push(a)).ok(),
            "--upstream" => value.parse().map(|a| routes.upstream = Some(a)).ok(),
            "--answer-port" => value.parse().map(|p| routes.answer = Some(p)).ok(),
            _ => None,
        };
        if parsed.is_none() {
            eprintln!("sidecar: bad argument {flag} {value:?}\nusage: sidecar --listen ADDR:PORT [--listen …] [--upstream ADDR:PORT] [--answer-port PORT]");
            return ExitCode::from(64);
        }
    }
    if listen.is_empty() {
        eprintln!("sidecar: at least one --listen is required");
        return ExitCode::from(64);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sidecar: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(serve(listen, routes)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sidecar: {e}");
            ExitCode::from(1)
        }
    }
}
