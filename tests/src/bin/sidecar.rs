//! `sidecar`: a stand-in for the mesh's proxy in benchmarks. It accepts on each `--listen`
//! address, asks the socket for its original destination (`SO_ORIGINAL_DST`, answered by
//! conntrack under iptables and by redirector's getsockopt program), dials it and copies
//! bytes both ways. A connection made to the proxy itself (no original destination) goes to
//! `--upstream`, which is how an app that dials its sidecar explicitly is served.
//!
//! ```text
//! sidecar --listen ADDR:PORT [--listen …] [--upstream ADDR:PORT]
//! ```
//! One event-loop thread, so that its cost per connection is the same in every mode.

use std::net::SocketAddr;
use std::process::ExitCode;

use redirector_tests::sockaddr::original_dst;
use tokio::net::{TcpListener, TcpStream};

async fn forward(client: TcpStream, upstream: Option<SocketAddr>) {
    let Ok(client) = client.into_std() else {
        return;
    };
    let target = original_dst(&client).ok().or(upstream);
    let Ok(client) = TcpStream::from_std(client) else {
        return;
    };
    let Some(target) = target else {
        return; // Nowhere to send it: close.
    };
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client, mut server) = (client, server);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

async fn serve(listen: Vec<SocketAddr>, upstream: Option<SocketAddr>) -> std::io::Result<()> {
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
                    tokio::spawn(forward(conn, upstream));
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
    let mut upstream = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().map(|v| v.parse::<SocketAddr>());
        match (flag.as_str(), value) {
            ("--listen", Some(Ok(a))) => listen.push(a),
            ("--upstream", Some(Ok(a))) => upstream = Some(a),
            (flag, value) => {
                eprintln!("sidecar: bad argument {flag} {value:?}\nusage: sidecar --listen ADDR:PORT [--listen …] [--upstream ADDR:PORT]");
                return ExitCode::from(64);
            }
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
    match rt.block_on(serve(listen, upstream)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sidecar: {e}");
            ExitCode::from(1)
        }
    }
}
