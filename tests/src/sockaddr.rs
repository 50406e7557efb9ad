//! The few socket operations std does not offer: bind-before-connect with a timeout, IPv6
//! listeners that do not also take IPv4, and reading `SO_ORIGINAL_DST`.

use std::io;
use std::mem::MaybeUninit;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener, TcpStream,
};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `SOL_IP` / `SOL_IPV6` + 80: netfilter's (and redirector's getsockopt program's) original
/// destination of a redirected connection.
const SO_ORIGINAL_DST: libc::c_int = 80;

/// `addr` as a kernel `sockaddr_storage` and its length.
pub fn to_raw(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { MaybeUninit::zeroed().assume_init() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The address in a `sockaddr_storage` filled by the kernel, if it is IPv4 or IPv6.
pub fn from_raw(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A socket of `kind` (`SOCK_STREAM`, `SOCK_DGRAM`) in the family of `addr`.
pub(crate) fn socket(addr: &SocketAddr, kind: libc::c_int) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd = cvt(unsafe { libc::socket(family, kind | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_int_opt(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as _,
        )
    })
    .map(drop)
}

/// Binds `fd` to `addr` with `SO_REUSEADDR`, and `IPV6_V6ONLY` when `addr` is IPv6, so
/// that IPv4 and IPv6 listeners on one port (or the wildcards) stand side by side.
pub(crate) fn bind_family_apart(fd: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
    bind_reusable(fd, addr, true)
}

/// Binds `fd` to `addr` with `SO_REUSEADDR`; an IPv6 socket gets `IPV6_V6ONLY` = `v6only`.
fn bind_reusable(fd: &OwnedFd, addr: SocketAddr, v6only: bool) -> io::Result<()> {
    set_int_opt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    if addr.is_ipv6() {
        let v6only = v6only.into();
        set_int_opt(
            fd.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            v6only,
        )?;
    }
    let (raw, len) = to_raw(addr);
    // SAFETY: raw/len come from to_raw.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&raw const raw).cast(), len) }).map(drop)
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
    let fd = socket(&addr, libc::SOCK_STREAM)?;
    bind_reusable(&fd, addr, v6only)?;
    // SAFETY: plain listen(2) on a socket we own.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(TcpListener::from(fd))
}

/// Connects to `dst` within `timeout`, first binding to `bind` (port 0) when given.
/// Errors keep their OS error code so callers can tell refused from EPERM from a timeout.
pub fn connect_tcp(
    dst: SocketAddr,
    bind: Option<IpAddr>,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let fd = socket(&dst, libc::SOCK_STREAM)?;
    let raw_fd = fd.as_raw_fd();
    if let Some(ip) = bind {
        let (raw, len) = to_raw(SocketAddr::new(ip, 0));
        // SAFETY: raw/len come from to_raw.
        cvt(unsafe { libc::bind(raw_fd, (&raw const raw).cast(), len) })?;
    }
    let stream = TcpStream::from(fd);
    stream.set_nonblocking(true)?;
    let (raw, len) = to_raw(dst);
    // SAFETY: raw/len come from to_raw.
    let rc = unsafe { libc::connect(raw_fd, (&raw const raw).cast(), len) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(err);
        }
        let mut pfd = libc::pollfd {
            fd: raw_fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd.
        if cvt(unsafe { libc::poll(&mut pfd, 1, millis) })? == 0 {
            return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
        }
        if let Some(err) = stream.take_error()? {
            return Err(err);
        }
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// `SO_ORIGINAL_DST` of an accepted connection: `SOL_IP` for IPv4 sockets, `SOL_IPV6` for
/// IPv6 ones. The error is the errno (ENOENT when nothing redirected the connection).
pub fn original_dst(stream: &TcpStream) -> Result<SocketAddr, i32> {
    let local = stream
        .local_addr()
        .map_err(|e| e.raw_os_error().unwrap_or(0))?;
    let level = if local.is_ipv4() {
        libc::SOL_IP
    } else {
        libc::SOL_IPV6
    };
    original_dst_at(stream, level)
}

/// `SO_ORIGINAL_DST` of an accepted connection asked at `level` (`SOL_IP` or `SOL_IPV6`).
pub fn original_dst_at(stream: &TcpStream, level: i32) -> Result<SocketAddr, i32> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { MaybeUninit::zeroed().assume_init() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: the buffer and its length describe `storage`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            level,
            SO_ORIGINAL_DST,
            (&raw mut storage).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    from_raw(&storage).ok_or(libc::EAFNOSUPPORT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_round_trip() {
        for addr in ["10.200.3.2:80", "[fd00:200:3::2]:15001", "127.0.0.1:0"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let (raw, _) = to_raw(addr);
            assert_eq!(from_raw(&raw), Some(addr));
        }
    }

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
}
