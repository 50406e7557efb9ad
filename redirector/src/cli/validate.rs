//! `--run-validation`: istio-iptables' check that capture works in this pod.
//!
//! Listeners on 127.0.0.1 at the outbound and inbound capture ports; once a second a
//! client bound to 127.0.0.1 dials 127.0.0.6:<probe port>. Capture works when a listener
//! accepts that connection and reads the probe port back from SO_ORIGINAL_DST. (Run as
//! the proxy's uid, the connection is the proxy calling its own pod: it lands on -z.)

use std::{
    io,
    net::{Ipv4Addr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use redirector_common::{
    decision::INBOUND_PASSTHROUGH_V4,
    kernel_abi::{SOL_IP, SO_ORIGINAL_DST},
};

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

/// The port of a connection's SO_ORIGINAL_DST (the same offset in sockaddr_in and _in6).
fn original_dst_port(stream: &TcpStream) -> Option<u16> {
    let mut buf = [0u8; 128];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: the buffer and its length describe `buf`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            SOL_IP,
            SO_ORIGINAL_DST,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    (rc == 0 && len >= 4).then(|| u16::from_be_bytes([buf[2], buf[3]]))
}

fn serve(listener: TcpListener, probe_port: u16, passed: Arc<AtomicBool>) {
    for stream in listener.incoming().flatten() {
        if original_dst_port(&stream) == Some(probe_port) {
            passed.store(true, Ordering::SeqCst);
        }
    }
}

fn dial(probe_port: u16) -> io::Result<()> {
    // SAFETY: plain socket calls on a descriptor handed to TcpStream right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new socket owned by nobody else; the stream closes it.
    let stream = unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let bind = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `bind` is a valid sockaddr_in of the length given.
    if unsafe {
        libc::bind(
            fd,
            (&raw const bind).cast(),
            size_of::<libc::sockaddr_in>() as u32,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    let dst = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: probe_port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(PASSTHROUGH.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `dst` is a valid sockaddr_in of the length given.
    if unsafe {
        libc::connect(
            fd,
            (&raw const dst).cast(),
            size_of::<libc::sockaddr_in>() as u32,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    drop(stream);
    Ok(())
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
