//! The few socket operations std does not offer, by socket2: bind-before-connect with a
//! timeout, IPv6 listeners that do not also take IPv4, and reading `SO_ORIGINAL_DST`.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use socket2::{Domain, SockRef, Socket, Type};

/// A socket of `kind` (`Type::STREAM`, `Type::DGRAM`) in the family of `addr`.
pub(crate) fn socket(addr: &SocketAddr, kind: Type) -> io::Result<Socket> {
    Socket::new(Domain::for_address(*addr), kind, None)
}

/// Binds `socket` to `addr` with `SO_REUSEADDR`, and `IPV6_V6ONLY` when `addr` is IPv6, so
/// that IPv4 and IPv6 listeners on one port (or the wildcards) stand side by side.
pub(crate) fn bind_family_apart(socket: &Socket, addr: SocketAddr) -> io::Result<()> {
    bind_reusable(socket, addr, true)
}

/// Binds `socket` to `addr` with `SO_REUSEADDR`; an IPv6 socket gets `IPV6_V6ONLY` =
/// `v6only`.
fn bind_reusable(socket: &Socket, addr: SocketAddr, v6only: bool) -> io::Result<()> {
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(v6only)?;
    }
    socket.bind(&addr.into())
}

/// A TCP listener on `addr` with `SO_REUSEADDR`; an IPv6 listener is `IPV6_V6ONLY`, so
/// `0.0.0.0:P` and `[::]:P` can be served side by side and an accepted socket's family always
/// matches the connection's.
pub fn listen_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    listen_on(addr, true)
}

/// An AF_INET6 TCP listener on `addr` that also takes IPv4 (`IPV6_V6ONLY` off), as the
/// Linkerd proxy's `[::]:4143`.
pub fn listen_dual_stack(addr: SocketAddr) -> io::Result<TcpListener> {
    listen_on(addr, false)
}

fn listen_on(addr: SocketAddr, v6only: bool) -> io::Result<TcpListener> {
    let socket = socket(&addr, Type::STREAM)?;
    bind_reusable(&socket, addr, v6only)?;
    socket.listen(128)?;
    Ok(socket.into())
}

/// Connects to `dst` within `timeout`, first binding to `bind` (port 0) when given.
/// Errors keep their OS error code so callers can tell refused from EPERM from a timeout
/// (ETIMEDOUT).
pub fn connect_tcp(
    dst: SocketAddr,
    bind: Option<IpAddr>,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let socket = socket(&dst, Type::STREAM)?;
    if let Some(ip) = bind {
        socket.bind(&SocketAddr::new(ip, 0).into())?;
    }
    match socket.connect_timeout(&dst.into(), timeout) {
        // socket2's own timeout carries no errno.
        Err(err) if err.kind() == io::ErrorKind::TimedOut && err.raw_os_error().is_none() => {
            Err(io::Error::from_raw_os_error(libc::ETIMEDOUT))
        }
        connected => connected.map(|()| socket.into()),
    }
}

/// `SO_ORIGINAL_DST` of an accepted connection: `SOL_IP` for IPv4 sockets, `SOL_IPV6` for
/// IPv6 ones. The error is the errno (ENOENT when nothing redirected the connection).
pub fn original_dst(stream: &TcpStream) -> Result<SocketAddr, i32> {
    let local = stream.local_addr().map_err(errno)?;
    let level = if local.is_ipv4() {
        libc::SOL_IP
    } else {
        libc::SOL_IPV6
    };
    original_dst_at(stream, level)
}

/// `SO_ORIGINAL_DST` of an accepted connection asked at `level` (`SOL_IP` or `SOL_IPV6`).
pub fn original_dst_at(stream: &TcpStream, level: i32) -> Result<SocketAddr, i32> {
    let socket = SockRef::from(stream);
    let addr = match level {
        libc::SOL_IP => socket.original_dst_v4(),
        libc::SOL_IPV6 => socket.original_dst_v6(),
        _ => return Err(libc::EINVAL),
    }
    .map_err(errno)?;
    addr.as_socket().ok_or(libc::EAFNOSUPPORT)
}

fn errno(err: io::Error) -> i32 {
    err.raw_os_error().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_connect_and_no_original_dst() {
        let listener = listen_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let client = connect_tcp(
            addr,
            Some("127.0.0.1".parse().unwrap()),
            Duration::from_secs(2),
        )
        .unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert_eq!(accepted.peer_addr().unwrap(), client.local_addr().unwrap());
        // Not redirected: either no conntrack entry (an error) or the real destination.
        if let Ok(orig) = original_dst(&accepted) {
            assert_eq!(orig, addr);
        }
    }

    #[test]
    fn refused_is_econnrefused() {
        let port = listen_tcp("127.0.0.1:0".parse().unwrap())
            .unwrap()
            .local_addr()
            .unwrap();
        // The listener is gone once dropped above.
        let err = connect_tcp(port, None, Duration::from_secs(2)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ECONNREFUSED));
    }

    #[test]
    fn v4_and_v6_listeners_share_a_port_and_dual_stack_takes_v4() {
        let v4 = listen_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = v4.local_addr().unwrap().port();
        let v6 = listen_tcp(SocketAddr::new("::1".parse().unwrap(), port)).unwrap();
        assert_eq!(v6.local_addr().unwrap().port(), port);
        let dual = listen_dual_stack("[::]:0".parse().unwrap()).unwrap();
        let dual_port = dual.local_addr().unwrap().port();
        let to = SocketAddr::new("127.0.0.1".parse().unwrap(), dual_port);
        connect_tcp(to, None, Duration::from_secs(2)).unwrap();
        let (_, peer) = dual.accept().unwrap();
        assert!(peer.is_ipv6(), "a v4-mapped peer: {peer}");
    }
}
