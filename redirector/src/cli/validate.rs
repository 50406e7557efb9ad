//! `--run-validation`: istio-iptables' check that capture works in this pod.
//!
//! Listeners on 127.0.0.1 at the outbound and inbound capture ports; once a second a
//! client bound to 127.0.0.1 dials 127.0.0.6:<probe port>. Capture works when a listener
//! accepts that connection and reads the probe port back from SO_ORIGINAL_DST. (Run as
//! the proxy's uid, the connection is the proxy calling its own pod: it lands on -z.)

use std::{
    io,
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use redirector_common::decision::INBOUND_PASSTHROUGH_V4;
use socket2::{Domain, SockRef, Socket, Type};

/// istio-iptables' exit code when validation fails.
pub const EXIT_VALIDATION_FAILED: u8 = 126;

const PASSTHROUGH: Ipv4Addr = INBOUND_PASSTHROUGH_V4;

#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    #[error("validation listener on 127.0.0.1:{port}: {source}")]
    Listen { port: u16, source: io::Error },
    #[error(
        "validation failed: no connection to {PASSTHROUGH}:{probe_port} reached a capture listener with its original destination within {timeout:?}; check that this runs as the proxy uid (-u) inside the pod's cgroup, that redirector istio-iptables set this pod up (`redirector status`), and that nothing else listens on the capture ports"
    )]
    NotCaptured { probe_port: u16, timeout: Duration },
}

/// The port of a connection's SO_ORIGINAL_DST (asked at SOL_IP: the listeners are IPv4).
fn original_dst_port(stream: &TcpStream) -> Option<u16> {
    let addr = SockRef::from(stream).original_dst_v4().ok()?;
    addr.as_socket().map(|a| a.port())
}

fn serve(listener: TcpListener, probe_port: u16, passed: Arc<AtomicBool>) {
    for stream in listener.incoming().flatten() {
        if original_dst_port(&stream) == Some(probe_port) {
            passed.store(true, Ordering::SeqCst);
        }
    }
}

/// One connection from 127.0.0.1 to the passthrough address at `probe_port`.
fn dial(probe_port: u16) -> io::Result<()> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
    socket.connect(&SocketAddr::from((PASSTHROUGH, probe_port)).into())
}

/// Run the validation; Ok when capture was observed within `timeout`.
pub fn run(
    outbound_port: u16,
    inbound_port: u16,
    probe_port: u16,
    timeout: Duration,
) -> Result<(), ValidationError> {
    let passed = Arc::new(AtomicBool::new(false));
    for port in [outbound_port, inbound_port] {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .map_err(|source| ValidationError::Listen { port, source })?;
        let passed = Arc::clone(&passed);
        // Detached: the process exits right after validation.
        std::thread::spawn(move || serve(listener, probe_port, passed));
    }
    let deadline = Instant::now() + timeout;
    loop {
        if let Err(err) = dial(probe_port) {
            tracing::info!("validation connection to {PASSTHROUGH}:{probe_port}: {err}");
        }
        let round = Instant::now() + Duration::from_secs(1);
        while Instant::now() < round.min(deadline) {
            if passed.load(Ordering::SeqCst) {
                tracing::info!("validation passed: {PASSTHROUGH}:{probe_port} was captured with its original destination");
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if Instant::now() >= deadline {
            return Err(ValidationError::NotCaptured {
                probe_port,
                timeout,
            });
        }
    }
}
