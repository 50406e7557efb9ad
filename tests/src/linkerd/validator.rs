//! Linkerd's network validator (docs/linkerd.md#how-linkerd-runs-it), as the injector runs it in a
//! CNI-mode pod before the proxy starts: one process, uid 65534, in the pod, that listens on the
//! outbound proxy port, connects to an address nothing in the pod owns, and passes only if that
//! connection brings back the random token its own listener writes to every client. Exit 0 when it
//! does, 95 otherwise (also after its timeout), like `linkerd-network-validator`. A run that is
//! to fail has the injector's 10 s ([`assert_fails`]), one that is to pass far longer
//! ([`assert_passes`]): it ends at the token, and a starved emulated guest can be slow to it.
//!
//! As [`super::dual_stack`]'s listener, it runs in the test binary itself, re-executed with
//! only its [`HELPER_TEST`] selected and [`VALIDATE_ENV`] set, in the pod's netns and
//! cgroup as `nobody`: the connecting socket is an ordinary uid's, as in a real pod.
//!
//! Its connect address is one no test namespace owns, so [`run`] first proves that the
//! pod's namespace leads nowhere but the test's own peer namespace, which has no route to
//! it: a connection that is not redirected fails inside the test's namespaces.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::linkerd::cases::NOBODY;
use crate::linkerd::meshed::OUTGOING_PROXY_PORT;
use crate::probe::protocol::emit;
use crate::{Spawn, Topology, EVENTUALLY};

/// The test (in every test binary that runs the validator) whose body is
/// [`validate_if_asked`]: `#[test] #[ignore = "…"] fn network_validator_process()`.
pub const HELPER_TEST: &str = "network_validator_process";
/// `<listen addr> <connect addr> <timeout ms>`: set only in the helper process.
pub const VALIDATE_ENV: &str = "REDIRECTOR_TESTS_NETWORK_VALIDATOR";
/// The validator's exit code on failure or timeout (errno 95, "operation not supported").
pub const UNSUCCESSFUL_EXIT_CODE: i32 = 95;
/// The injector's `--timeout 10s`: what a run that is to fail waits out.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The validator's `--listen-addr` and `--connect-addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addrs {
    pub listen: SocketAddr,
    pub connect: SocketAddr,
}

impl Addrs {
    /// The injector's IPv4 pair: `0.0.0.0:4140` and `1.1.1.1:20001`.
    pub fn ipv4() -> Self {
        Addrs {
            listen: SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), OUTGOING_PROXY_PORT),
            connect: SocketAddr::new(Ipv4Addr::new(1, 1, 1, 1).into(), 20001),
        }
    }

    /// The injector's pair with IPv6 on: `[::]:4140` and `[fd00::1]:20001`.
    pub fn ipv6() -> Self {
        Addrs {
            listen: SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), OUTGOING_PROXY_PORT),
            connect: SocketAddr::new(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into(), 20001),
        }
    }
}

/// How a validator run ended.
#[derive(Debug)]
pub struct Validation {
    pub addrs: Addrs,
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// What it printed.
    pub output: String,
}

impl Validation {
    /// Exit 0: its connection came back to its own listener with its token.
    #[track_caller]
    pub fn assert_passed(&self) {
        assert_eq!(
            self.code,
            Some(0),
            "the network validator (listen {}, connect {}) failed: the connection did not \
             land on its listener; its output:\n{}",
            self.addrs.listen,
            self.addrs.connect,
            self.output
        );
    }

    /// Exit 95: its connection did not come back to its listener.
    #[track_caller]
    pub fn assert_failed(&self) {
        assert_eq!(
            self.code,
            Some(UNSUCCESSFUL_EXIT_CODE),
            "the network validator (listen {}, connect {}) was expected to fail with exit \
             95 (the connection not redirected); its output:\n{}",
            self.addrs.listen,
            self.addrs.connect,
            self.output
        );
    }
}

/// Runs the validator where its connection should come back, and asserts it passed.
#[track_caller]
pub fn assert_passes(topo: &Topology, addrs: Addrs) {
    run(topo, addrs, EVENTUALLY).assert_passed();
}

/// Runs the validator where its connection should go nowhere, and asserts it failed: after
/// the injector's [`TIMEOUT`].
#[track_caller]
pub fn assert_fails(topo: &Topology, addrs: Addrs) {
    run(topo, addrs, TIMEOUT).assert_failed();
}

/// Runs the validator in `topo`'s pod (its netns and cgroup) as uid/gid 65534, to the end or
/// `timeout`. Panics first unless the pod's namespace is sealed (see the module doc).
pub fn run(topo: &Topology, addrs: Addrs, timeout: Duration) -> Validation {
    topo.assert_no_route_out(&[addrs.connect.ip()]);
    let spec = format!("{} {} {}", addrs.listen, addrs.connect, timeout.as_millis());
    let out = Spawn::helper(HELPER_TEST)
        .env(VALIDATE_ENV, spec)
        .netns(&topo.pod)
        .cgroup(&topo.pod_cgroup)
        .user(NOBODY, NOBODY)
        .output();
    let validation = Validation {
        addrs,
        code: out.status.code(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    };
    // Shown with --nocapture (libtest keeps a passing test's output to itself).
    println!(
        "network validator (listen {}, connect {}): exit {:?}\n{}",
        addrs.listen,
        addrs.connect,
        validation.code,
        validation.output.trim()
    );
    validation
}

/// The helper test's body: with [`VALIDATE_ENV`] set, validates and exits 0 or 95; else
/// returns at once (a plain `--ignored` run).
pub fn validate_if_asked() {
    let Ok(spec) = std::env::var(VALIDATE_ENV) else {
        return;
    };
    let Some((listen, connect, timeout)) = parse_spec(&spec) else {
        panic!("{VALIDATE_ENV}={spec:?}: expected `<listen addr> <connect addr> <timeout ms>`");
    };
    // libtest has written `test <name> ... ` without a newline: end that line first.
    emit("");
    match validate(listen, connect, timeout) {
        Ok(line) => {
            emit(&format!("validated: {line}"));
            std::process::exit(0);
        }
        Err(error) => {
            emit(&format!("validation failed: {error}"));
            std::process::exit(UNSUCCESSFUL_EXIT_CODE);
        }
    }
}

/// [`VALIDATE_ENV`]'s `<listen addr> <connect addr> <timeout ms>`.
fn parse_spec(spec: &str) -> Option<(SocketAddr, SocketAddr, Duration)> {
    let [listen, connect, ms] = <[&str; 3]>::try_from(spec.split(' ').collect::<Vec<_>>()).ok()?;
    let timeout = Duration::from_millis(ms.parse().ok()?);
    Some((listen.parse().ok()?, connect.parse().ok()?, timeout))
}

/// Listens on `listen`, serves the token to every client, connects to `connect` and reads
/// the token back within `timeout`; the connection's two ends on success.
fn validate(listen: SocketAddr, connect: SocketAddr, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let listener = TcpListener::bind(listen).map_err(|e| format!("listening on {listen}: {e}"))?;
    let token = random_token()?;
    let served = token.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = (&stream).write_all(&served);
        }
    });
    let mut stream = TcpStream::connect_timeout(&connect, timeout)
        .map_err(|e| format!("connecting to {connect}: {e}"))?;
    let ends = format!(
        "connected to {connect} from {}",
        stream
            .local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string())
    );
    let left = deadline.saturating_duration_since(Instant::now());
    stream
        .set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .map_err(|e| format!("setting a read timeout: {e}"))?;
    let mut got = vec![0u8; token.len()];
    stream
        .read_exact(&mut got)
        .map_err(|e| format!("{ends}, reading the token: {e}"))?;
    if got != token {
        return Err(format!(
            "{ends}: expected the token {:?}, read {:?}",
            String::from_utf8_lossy(&token),
            String::from_utf8_lossy(&got)
        ));
    }
    Ok(ends)
}

/// 63 random alphanumerics and a newline, as the validator's token.
fn random_token() -> Result<Vec<u8>, String> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut random = [0u8; 63];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(|e| format!("reading /dev/urandom: {e}"))?;
    let mut token: Vec<u8> = random
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()])
        .collect();
    token.push(b'\n');
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unprivileged, loopback only: the validator passes when its connect address is its
    /// own listener, and fails when nothing listens there.
    #[test]
    fn passes_only_when_the_connection_reaches_its_own_listener() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let own: SocketAddr = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port);
        let line = validate(own, own, EVENTUALLY).unwrap();
        assert!(line.contains(&own.to_string()), "{line}");
        let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
        let other = elsewhere.local_addr().unwrap();
        let unused = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // A listener that is not the validator's: accepted but no token comes back.
        std::thread::spawn(move || {
            for stream in elsewhere.incoming().flatten() {
                let _ = (&stream).write_all(&[b'x'; 64]);
            }
        });
        let err = validate(unused, other, EVENTUALLY).unwrap_err();
        assert!(err.contains("expected the token"), "{err}");
    }

    #[test]
    fn tokens_are_alphanumeric_lines() {
        let token = random_token().unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(token.last(), Some(&b'\n'));
        assert!(token[..63].iter().all(u8::is_ascii_alphanumeric));
        assert_ne!(token, random_token().unwrap());
    }
}
