//! The Linkerd proxy's dual-stack inbound listener: one `[::]:<port>` socket without
//! `IPV6_V6ONLY`, which accepts IPv4 clients as v4-mapped peers. For those the proxy asks
//! `SO_ORIGINAL_DST` with `SOL_IP` on the AF_INET6 socket, for IPv6 clients with
//! `SOL_IPV6` (docs/linkerd.md#what-is-captured).
//!
//! `probe` binds every IPv6 listener `IPV6_V6ONLY`, so this listener runs in the test
//! binary itself, re-executed with only its [`HELPER_TEST`] selected and [`LISTEN_ENV`]
//! set, in the pod's netns and cgroup as the proxy's user (the accepted sockets belong to
//! the listener's cgroup, whose programs answer their getsockopt). It speaks `probe
//! proxy`'s line protocol: a `listening` line when ready, a `proxied` line per connection,
//! sent to the client too, with v4-mapped addresses written as IPv4.

use std::io::Write;
use std::net::{Ipv6Addr, Shutdown, SocketAddr, TcpStream};

use crate::probe::protocol::{emit, listening_line, parse_listening, proxied_line};
use crate::sockaddr::listen_dual_stack;
use crate::{Cgroup, ChildGuard, NetNs, Spawn, EVENTUALLY};

/// The test (in every test binary that starts this listener) whose body is
/// [`serve_if_asked`]: `#[test] #[ignore = "…"] fn dual_stack_inbound_listener_process()`.
pub const HELPER_TEST: &str = "dual_stack_inbound_listener_process";
/// `<name> <port>`: set only in the helper process.
pub const LISTEN_ENV: &str = "REDIRECTOR_TESTS_DUAL_STACK_LISTEN";

/// Starts the listener `[::]:port` named `name` in `netns` and `cgroup` as `uid`/`gid`, and
/// waits until it listens.
pub fn start(
    netns: &NetNs,
    cgroup: &Cgroup,
    (uid, gid): (u32, u32),
    name: &str,
    port: u16,
) -> ChildGuard {
    let child = Spawn::helper(HELPER_TEST)
        .env(LISTEN_ENV, format!("{name} {port}"))
        .netns(netns)
        .cgroup(cgroup)
        .user(uid, gid)
        .spawn();
    child.wait_line(
        "the dual-stack listener's `listening` line",
        EVENTUALLY,
        |l| parse_listening(l).is_some(),
    );
    child
}

/// The helper test's body: with [`LISTEN_ENV`] set, serves until killed; else returns at
/// once (a plain `--ignored` run).
pub fn serve_if_asked() {
    let Ok(spec) = std::env::var(LISTEN_ENV) else {
        return;
    };
    let (name, port) = spec
        .split_once(' ')
        .and_then(|(name, port)| Some((name.to_owned(), port.parse::<u16>().ok()?)))
        .unwrap_or_else(|| panic!("{LISTEN_ENV}={spec:?}: expected `<name> <port>`"));
    let addr = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port);
    let listener =
        listen_dual_stack(addr).unwrap_or_else(|e| panic!("dual-stack listener on {addr}: {e}"));
    // libtest has written `test <name> ... ` without a newline: end that line first, so
    // every protocol line is a line of its own.
    emit("");
    emit(&listening_line(&name, addr));
    for stream in listener.incoming().flatten() {
        let name = name.clone();
        std::thread::spawn(move || answer(stream, &name));
    }
}

fn answer(mut stream: TcpStream, name: &str) {
    let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
        return; // Already reset by the client.
    };
    let orig = original_dst_as_linkerd(&stream, peer);
    let line = proxied_line(name, canonical(local), canonical(peer), orig, None);
    emit(&line);
    let _ = stream.write_all(format!("{line}\n").as_bytes());
    let _ = stream.shutdown(Shutdown::Write);
}

/// `SO_ORIGINAL_DST` as the Linkerd proxy asks it: `SOL_IP` for an IPv4 client (v4-mapped
/// on this socket), `SOL_IPV6` otherwise. The error is the errno.
fn original_dst_as_linkerd(stream: &TcpStream, peer: SocketAddr) -> Result<SocketAddr, i32> {
    let level = if canonical(peer).is_ipv4() {
        libc::SOL_IP
    } else {
        libc::SOL_IPV6
    };
    crate::sockaddr::original_dst_at(stream, level).map(canonical)
}

/// A v4-mapped address as the IPv4 address it stands for.
fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => addr,
        },
        SocketAddr::V4(_) => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_read_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:10.200.3.1]:4143".parse().unwrap();
        assert_eq!(canonical(mapped), "10.200.3.1:4143".parse().unwrap());
        let v6: SocketAddr = "[fd00:200:3::1]:4143".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }

    /// Unprivileged, loopback only: an IPv4 client reaches an AF_INET6 listener without
    /// IPV6_V6ONLY (bound to 127.0.0.1 v4-mapped here) and is seen as IPv4.
    #[test]
    fn takes_ipv4_clients() {
        let listener = listen_dual_stack("[::ffff:127.0.0.1]:0".parse().unwrap()).unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        assert_eq!(canonical(peer), client.local_addr().unwrap());
        // Not redirected: conntrack's own tuple (if conntrack runs here) or an errno.
        if let Ok(orig) = original_dst_as_linkerd(&accepted, peer) {
            assert_eq!(orig, SocketAddr::new([127, 0, 0, 1].into(), port));
        }
    }
}
